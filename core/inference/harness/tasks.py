"""Which lm-evaluation-harness tasks a run is scored on, settled before any model loads: each name checked against
lm-eval's list (or a --task-dir folder's), a typo answered with the names it is close to, each task built and its
data read (the Hub's datasets are downloaded on first use, then read from the datasets cache).

    require_lm_eval() -> version          lm-eval is importable and of a version this code knows, or a HoneError
    select_tasks(specs, task_dir) -> TaskSelection

A spec is a task, group or tag name, or the path of a task's YAML file. No model is needed here; lm-eval itself is
imported inside the functions, so importing this module stays light.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.core.errors import HoneError

LM_EVAL_INSTALL = 'pip install "hone-studio[eval]"'
# The lm-eval releases this code was written against: 0.4.13 takes a model object and Task objects as it is used
# here; 0.5 may not.
LM_EVAL_RANGE = ((0, 4, 13), (0, 5))
YAML_SUFFIXES = (".yaml", ".yml")
# Names offered for a typo: lm-eval lists about 15,000, so only the closest few.
CLOSE_MATCHES = 6
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
# The tasks users ask for most: offered first when a misspelt name is near one of them.
POPULAR = ("gsm8k", "mmlu", "hellaswag", "arc_challenge", "arc_easy", "ifeval")


def require_lm_eval() -> str:
    """The installed lm-eval's version.

    Raises:
        HoneError: lm-eval is not installed, cannot be imported, or is a version outside LM_EVAL_RANGE.
    """
    try:
        import lm_eval
    except ImportError as e:
        raise HoneError(
            f"lm-evaluation-harness is not installed, and --task runs its tasks ({e})",
            f"install it with Hone's eval extra: {LM_EVAL_INSTALL}",
        ) from None
    try:
        version = importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        version = str(getattr(lm_eval, "__version__", "unknown"))
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:3])
    low, high = LM_EVAL_RANGE
    if not low <= parts < high:
        raise HoneError(
            f"lm-eval {version} is installed; Hone runs lm-eval {'.'.join(map(str, low))} up to (not with) "
            f"{'.'.join(map(str, high))}",
            f"install a version Hone knows: {LM_EVAL_INSTALL}",
        )
    return version


@dataclass(frozen=True)
class SelectedTask:
    """One spec the user gave, built.

    Attributes:
        spec: as given (a name, or a YAML file's path).
        names: what lm-eval reports its results under: the task, the group (its tasks are inside it), or a tag's
            tasks.
        objects: lm-eval's Task and Group objects to evaluate.
    """

    spec: str
    names: tuple[str, ...]
    objects: tuple[Any, ...]


@dataclass(frozen=True)
class TaskSelection:
    """The tasks to run, in the order given, and lm-eval's TaskManager that built them."""

    manager: Any
    tasks: tuple[SelectedTask, ...]

    @property
    def names(self) -> list[str]:
        return [name for task in self.tasks for name in task.names]

    @property
    def objects(self) -> list[Any]:
        return [obj for task in self.tasks for obj in task.objects]


def split_specs(text: str) -> list[str]:
    """`--task a,b, c` -> ["a", "b", "c"], each once, in order.

    Raises:
        HoneError: no name in it.
    """
    specs = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not specs:
        raise HoneError(f"--task {text!r} names no task", "give lm-eval task names separated by commas, e.g. gsm8k")
    return specs


def is_task_file(spec: str) -> bool:
    return spec.lower().endswith(YAML_SUFFIXES)


def select_tasks(specs: list[str], task_dir: str | Path | None = None) -> TaskSelection:
    """Build the tasks `specs` name: lm-eval's own, those of the YAML files in `task_dir`, and YAML files given by
    path. Each task's data is read here (downloaded from the Hub on first use).

    Raises:
        HoneError: lm-eval is missing; `task_dir` or a task file does not exist; a name is unknown (with the close
            ones); two specs hold the same task; a task runs the model's code or needs images; a task's data cannot
            be read (offline and not cached, not on the Hub, a missing local file) or its YAML is broken.
    """
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    folder = _task_folder(task_dir)
    for spec in specs:
        if is_task_file(spec) and not Path(spec).expanduser().is_file():
            raise HoneError(f"task file {spec} does not exist", "give the path of a task's YAML file, or a task name")
    names = [s for s in specs if not is_task_file(s)]
    include = str(folder) if folder is not None else None
    manager = TaskManager(include_path=include, include_defaults=False)
    own = list(manager.all_tasks)
    if any(name not in own for name in names):
        # lm-eval's own list is indexed only when a name needs it: reading its ~15,000 task files takes seconds.
        manager = TaskManager(include_path=include)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        raise _unknown(unknown, own, manager.all_tasks, folder)
    tasks = tuple(_build(manager, spec) for spec in specs)
    _check_leaves(tasks)
    return TaskSelection(manager, tasks)


def _task_folder(task_dir: str | Path | None) -> Path | None:
    if task_dir is None:
        return None
    folder = Path(task_dir).expanduser()
    if not folder.is_dir():
        raise HoneError(
            f"--task-dir {folder} is not a folder", "give the folder holding your tasks' YAML files (lm-eval's format)"
        )
    return folder.resolve()


def _unknown(names: list[str], own: list[str], known: list[str], folder: Path | None) -> HoneError:
    """Every unknown name at once, each with the names it is close to: the folder's first, then lm-eval's."""
    where = f"lm-eval's {len(known) - len(own):,} tasks, groups and tags" + (f" or in {folder}" if folder else "")
    what = f"there is no task {' or '.join(repr(n) for n in names)} among {where}"
    hints = []
    for name in names:
        offer = _close(name, own) + _close(name, [k for k in known if k not in own])
        if offer:
            hints.append(f"{f'for {name}: ' if len(names) > 1 else ''}did you mean {_either(offer[:CLOSE_MATCHES])}?")
    listing = "`lm-eval ls tasks` lists them all" + (f" (add --include_path {folder} for yours)" if folder else "")
    local = "; lm-eval leaves out a YAML file it cannot read, so check the file that defines it" if folder else ""
    return HoneError(what, " ".join([*hints, f"{listing}{local}"]))


def _close(name: str, candidates: list[str]) -> list[str]:
    """The candidates most like `name` (case aside), then those that start with it (arc -> arc_easy), the tasks
    users ask for most first."""
    name = name.lower()
    close = difflib.get_close_matches(name, candidates, n=CLOSE_MATCHES, cutoff=0.6)
    found = close + [c for c in candidates if c.startswith(name) and c not in close]
    popular = [p for p in POPULAR if p in found]
    return popular + [f for f in found if f not in popular]


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _build(manager, spec: str) -> SelectedTask:
    """The task, group or tag `spec` names, built by lm-eval (its data read); errors in words."""
    target = str(Path(spec).expanduser().resolve()) if is_task_file(spec) else spec
    try:
        loaded = manager.load([target])
    except Exception as e:  # lm-eval and datasets raise many kinds; each known one is put in words below
        raise _load_error(spec, e) from None
    children = {child for kids in loaded["group_map"].values() for child in kids}
    groups = [g for g in loaded["groups"] if g not in children]
    names = groups + [t for t in loaded["tasks"] if t not in children]
    objects = [loaded["groups"][g] for g in groups] + [loaded["tasks"][t] for t in loaded["tasks"] if t not in children]
    return SelectedTask(spec, tuple(names), tuple(objects))


def _check_leaves(tasks: tuple[SelectedTask, ...]) -> None:
    """Refuse what lm-eval would refuse only after the model loaded: a task given twice (itself and in a group, or in
    two groups: lm-eval runs each once), a task that runs code the model writes, a task with images or audio."""
    seen: dict[str, str] = {}
    for task in tasks:
        for obj in task.objects:
            for leaf in obj.get_all_tasks() if hasattr(obj, "get_all_tasks") else [obj]:
                name = leaf.task_name
                if name in seen and seen[name] != task.spec:
                    raise HoneError(
                        f"task {name} is in both {seen[name]} and {task.spec}", "give each task once: leave one out"
                    )
                seen[name] = task.spec
                if getattr(leaf, "UNSAFE_CODE", False):
                    raise HoneError(
                        f"lm-eval task {name} runs code the model writes (lm-eval marks it unsafe); hone eval does "
                        "not run such code",
                        "run it with lm-eval's own command line, in a sandbox, where --confirm_run_unsafe_code "
                        "accepts the risk",
                    )
                if getattr(leaf, "MULTIMODAL", False):
                    raise HoneError(
                        f"lm-eval task {name} gives the model images or audio; hone eval scores text tasks",
                        "choose a text task",
                    )


def _chain(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return found


def _load_error(spec: str, error: Exception) -> HoneError:
    """A task's build failure in words: no network for data that is not cached, a dataset the Hub does not have (or
    gates), a local file that is missing, a YAML file lm-eval cannot read."""
    chain = _chain(error)
    if any(_is_unreachable(e) for e in chain):
        return _offline_error(spec, chain)
    kinds = {type(e).__name__ for e in chain}
    if "DatasetNotFoundError" in kinds:
        return HoneError(
            f"the data of lm-eval task {spec} is not on the Hugging Face Hub, or needs a login ({error})",
            "for a gated dataset, accept its terms on its Hub page and log in (`hone models login`)",
        )
    if isinstance(error, FileNotFoundError) or "DataFilesNotFoundError" in kinds:
        return HoneError(
            f"lm-eval task {spec} reads a file that is not there: {error}",
            "fix the data_files paths in the task's YAML (absolute, or relative to where you run hone)",
        )
    if any(type(e).__module__.startswith("yaml") for e in chain):
        return HoneError(f"lm-eval cannot read the task file {spec}: {error}", "fix the YAML at the line it names")
    return HoneError(
        f"lm-eval could not build task {spec}: {type(error).__name__}: {error}",
        "check the task's YAML against lm-eval's task guide (docs/task_guide.md in lm-evaluation-harness)",
    )


def _is_unreachable(error: BaseException) -> bool:
    """The Hub could not be asked: offline mode on, or no network (datasets raises ConnectionError for both)."""
    return isinstance(error, ConnectionError) or type(error).__name__ in (
        "OfflineModeIsEnabled",
        "LocalEntryNotFoundError",
        "ConnectError",
        "ConnectTimeout",
    )


def _offline_error(spec: str, chain: list[BaseException]) -> HoneError:
    named = next((m.group(1) for e in chain if (m := re.search(r"reach '([^']+)'", str(e)))), None)
    data = f"dataset {named}" if named else "its dataset"
    offline = [v for v in OFFLINE_VARIABLES if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")]
    why = (
        f"offline mode is on ({', '.join(f'{v}={os.environ[v]}' for v in offline)})"
        if offline
        else "the Hugging Face Hub cannot be reached"
    )
    unset = f"unset {' and '.join(offline)}" if offline else "connect to the network"
    return HoneError(
        f"lm-eval task {spec} needs {data}, which is not in the datasets cache on this machine, and {why}",
        f"{unset} and run once to download it (into HF_DATASETS_CACHE, ~/.cache/huggingface/datasets by default; "
        "offline runs read it from there after), or give a task of your own over local files with --task-dir",
    )
