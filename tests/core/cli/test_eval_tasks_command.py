"""`hone eval RUN --task ...` as a user meets its mistakes: lm-eval not installed, options that do not go together, a
task name with a typo, task data that is neither cached nor reachable, --chat-template on a run whose tokenizer has no
chat template (or one that refuses a system message); each one line with advice (exit 2), before any model loads.

The run folder here is a config.toml and an adapter_config.json: every mistake is caught before a model would load.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from hone.core.cli import main
from tests.core.conftest import make_tiny_config

needs_lm_eval = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None,
    reason='lm-evaluation-harness is not installed (pip install "hone-studio[eval]")',
)


@pytest.fixture
def run_dir(tmp_path, tiny_model_dir, chat_files):
    """A run folder as `hone eval` checks it: its config (the tiny model) and an adapter's config."""
    config = make_tiny_config(tiny_model_dir("tiny-dense"), chat_files, tmp_path / "runs", "output.name=r")
    folder = tmp_path / "runs" / "r"
    (folder / "adapter").mkdir(parents=True)
    config.save(folder / "config.toml")
    (folder / "adapter" / "adapter_config.json").write_text("{}", encoding="utf-8")
    return folder


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_without_lm_eval_the_error_names_the_extra_to_install(run_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # makes `import lm_eval` fail, installed or not
    assert main(["eval", str(run_dir), "--task", "gsm8k", "--limit", "5"]) == 2
    err = _error(capsys)
    assert "lm-evaluation-harness is not installed" in err
    assert 'hone: advice: install it with Hone\'s eval extra: pip install "hone-studio[eval]"' in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--checkpoints", "all"], "--checkpoints goes with the held-out rows' scores, not with --task"),
        (["--rows", "5"], "--rows goes with the held-out rows' scores"),
        (["--by", "f1"], "--by goes with the held-out rows' scores"),
        (["--limit", "0"], "--limit is 0"),
        (["--num-fewshot", "-1"], "--num-fewshot is -1"),
        (["--batch-size", "0"], "--batch-size is 0"),
        pytest.param(
            ["--system-instruction", "Be brief."], "--system-instruction goes with --chat-template", marks=needs_lm_eval
        ),
        pytest.param(
            ["--chat-template", "--system-instruction", " "], "--system-instruction is empty", marks=needs_lm_eval
        ),
    ],
)
def test_options_that_do_not_go_with_task_are_refused(run_dir, capsys, extra, message):
    assert main(["eval", str(run_dir), "--task", "gsm8k", *extra]) == 2
    assert message in _error(capsys)


@pytest.mark.parametrize(
    "option",
    [
        ["--limit", "5"],
        ["--num-fewshot", "2"],
        ["--task-dir", "."],
        ["--batch-size", "4"],
        ["--chat-template"],
        ["--system-instruction", "Be brief."],
    ],
)
def test_task_options_without_task_say_so(run_dir, capsys, option):
    assert main(["eval", str(run_dir), *option]) == 2
    assert f"{option[0]} goes with --task" in _error(capsys)


def _local_task(folder, name: str, dataset: str, data_files: str | None = None, extra: str = ""):
    folder.mkdir(exist_ok=True)
    files = f"dataset_kwargs:\n  data_files:\n    test: {data_files}\n  cache_dir: {folder / 'cache'}\n"
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: {dataset}\n{files if data_files else ''}test_split: test\n"
        'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        f"metric_list:\n  - metric: exact_match\n{extra}",
        encoding="utf-8",
    )


@needs_lm_eval
def test_misspelt_task_names_are_answered_with_close_ones(run_dir, tmp_path, capsys):
    """Every unknown name at once: one of the --task-dir folder's (offered first) and one of lm-eval's own."""
    tasks = tmp_path / "tasks"
    _local_task(tasks, "hone_arithmetic", "json", str(tmp_path / "rows.jsonl"))
    assert main(["eval", str(run_dir), "--task", "hone_arithmetc,gsm8kk", "--task-dir", str(tasks)]) == 2
    err = _error(capsys)
    assert "there is no task 'hone_arithmetc' or 'gsm8kk' among lm-eval's" in err and str(tasks) in err
    advice = err.split("hone: advice:", 1)[1]
    assert "for hone_arithmetc: did you mean hone_arithmetic," in advice
    assert "for gsm8kk: did you mean gsm8k" in advice and "`lm-eval ls tasks` lists them all" in advice


@needs_lm_eval
def test_task_data_neither_cached_nor_reachable_is_said_plainly(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # as tests/conftest.py sets it: nothing is downloaded
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = tmp_path / "tasks"
    _local_task(tasks, "hone_hub_only", "hone-tests/no-such-dataset")
    assert main(["eval", str(run_dir), "--task", "hone_hub_only", "--task-dir", str(tasks)]) == 2
    err = _error(capsys)
    assert "lm-eval task hone_hub_only needs dataset hone-tests/no-such-dataset" in err
    assert "not in the datasets cache on this machine" in err and "offline mode is on (HF_HUB_OFFLINE=1" in err
    assert "unset HF_HUB_OFFLINE and HF_DATASETS_OFFLINE" in err and "--task-dir" in err


@needs_lm_eval
def test_a_local_data_file_that_is_gone_is_named(run_dir, tmp_path, capsys):
    tasks = tmp_path / "tasks"
    missing = tmp_path / "gone.jsonl"
    _local_task(tasks, "hone_gone", "json", str(missing))
    assert main(["eval", str(run_dir), "--task", "hone_gone", "--task-dir", str(tasks)]) == 2
    err = _error(capsys)
    assert "lm-eval task hone_gone reads a file that is not there" in err and str(missing) in err


@needs_lm_eval
def test_tasks_lm_eval_would_refuse_after_loading_the_model_are_refused_before(run_dir, tmp_path, capsys):
    tasks = tmp_path / "tasks"
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1", "answer": "2"}\n', encoding="utf-8")
    _local_task(tasks, "hone_code", "json", str(rows), extra="unsafe_code: true\n")
    _local_task(tasks, "hone_sums", "json", str(rows))
    (tasks / "group.yaml").write_text("group: hone_all\ntask:\n  - hone_sums\n", encoding="utf-8")
    assert main(["eval", str(run_dir), "--task", "hone_code", "--task-dir", str(tasks)]) == 2
    assert "lm-eval task hone_code runs code the model writes" in _error(capsys)
    assert main(["eval", str(run_dir), "--task", "hone_all,hone_sums", "--task-dir", str(tasks)]) == 2
    assert "task hone_sums is in both hone_all and hone_sums" in _error(capsys)


def _adapter_tokenizer(run_dir, tiny_model_dir, template: str | None) -> None:
    """The tiny model's tokenizer saved in the run's adapter/ folder, as a run saves it, with `template` as its chat
    template (None: none)."""
    import json
    import shutil

    adapter = run_dir / "adapter"
    for f in tiny_model_dir("tiny-dense").iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, adapter / f.name)
    config = json.loads((adapter / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    (adapter / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if template is not None:
        (adapter / "chat_template.jinja").write_text(template, encoding="utf-8")


@pytest.fixture
def no_model_loads(monkeypatch):
    """Loading the run's models fails the test: the error must come before."""
    from hone.core.api import ChatModels

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ChatModels, "load", load)


@needs_lm_eval
def test_chat_template_on_a_run_without_one_is_refused_before_any_model_loads(
    run_dir, tiny_model_dir, capsys, no_model_loads
):
    from transformers import AutoTokenizer

    _adapter_tokenizer(run_dir, tiny_model_dir, None)
    assert not AutoTokenizer.from_pretrained(run_dir / "adapter").chat_template  # as the run's models would have it
    assert main(["eval", str(run_dir), "--task", "gsm8k", "--chat-template"]) == 2
    err = _error(capsys)
    assert "run r's tokenizer has no chat template to give lm-eval's prompts" in err
    assert "leave --chat-template out: lm-eval then gives the models raw text" in err


@needs_lm_eval
def test_a_system_instruction_the_chat_template_refuses_is_said_before_any_model_loads(
    run_dir, tiny_model_dir, capsys, no_model_loads
):
    refuses = (  # as Gemma's template does
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    _adapter_tokenizer(run_dir, tiny_model_dir, refuses)
    argv = ["eval", str(run_dir), "--task", "gsm8k", "--chat-template", "--system-instruction", "Be brief."]
    assert main(argv) == 2
    err = _error(capsys)
    assert "--system-instruction cannot reach run r's models: this model's chat template takes no system message" in err
    assert "leave --system-instruction out" in err
