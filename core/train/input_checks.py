"""Checks of a run's inputs that take well under a second and load nothing: the model and every data file exist.

`hone train` calls `check_inputs` before it imports torch or creates the run folder, so a wrong path, a `bundled:`
typo or an unknown Hub id on an offline machine is one line of error and advice (exit 2), with nothing left on
disk. `hone demo`, `hone data` and `hone export` call `check_model` and `check_data_files` the same way, with
advice in their own words (`--model`, the file arguments). Cross-field config checks live in hone.core.config
(RunConfig.check), where the desktop app's form sees them too. Stdlib and numpy only.
"""

from __future__ import annotations

from hone.core.config import ModelConfig, RunConfig
from hone.core.data.loaders import SourceError, resolve_sources
from hone.core.data.template import NAMED_TEMPLATES, check_template_file
from hone.core.errors import DataError, ModelError
from hone.core.models.load import check_hub_model, resolve_source
from hone.core.resources import BUNDLED_PREFIX, resolve_bundled

MODEL_SETTING = "model.name_or_path"


def check_inputs(config: RunConfig) -> None:
    """Raise a HoneError (ModelError, DataError) naming the setting to fix when an input cannot be found.

    Hugging Face dataset ids are not checked here (their loader reports them); Hub model ids are (see
    `check_hub_model`).
    """
    check_model(config.model)
    template = config.data.chat_template
    if template and template not in NAMED_TEMPLATES:
        try:
            check_template_file(template)  # exists, a regular file (a FIFO would hang a reader), not huge
        except DataError as e:
            raise DataError(e.message, f"{e.advice} (--set data.chat_template=...)") from None
    for setting, entries in (("data.train", config.data.train), ("data.eval", config.data.eval)):
        check_data_files(
            entries,
            "train" if setting == "data.train" else "eval",
            f"fix {setting} in the config (or --set {setting}=[...]): give a data file, a folder, a "
            "bundled: name or a Hugging Face dataset id",
        )


def check_model(model: ModelConfig, given_as: str = MODEL_SETTING) -> None:
    """Raise ModelError when `model` names no model that could load: a missing folder or .gguf, a `bundled:` typo,
    a Hub id that is neither cached nor reachable (one request at most).

    Args:
        model: the model settings (name_or_path, gguf_file, revision).
        given_as: where the user gave the name, as the advice should say it: a config key, or a command-line
            option such as "--model".
    """
    try:
        source = resolve_source(model.name_or_path, model.gguf_file)
        if source.kind == "hub":
            check_hub_model(source.name, model.revision, model.gguf_file or "config.json")
    except ModelError as e:
        if given_as == MODEL_SETTING:
            raise
        raise ModelError(e.message, e.advice.replace(f"set {MODEL_SETTING} to", f"give {given_as}")) from None


def check_data_files(entries: list, side: str, advice: str) -> None:
    """Raise DataError (or the HoneError listing the bundled files) when a data entry names nothing readable.

    Args:
        entries: data files, folders, `bundled:` names or Hugging Face dataset ids.
        side: "train" or "eval" (which split a dataset id without one reads).
        advice: what to change, in the words of the command or config the entries came from.
    """
    for entry in entries:
        if str(entry).startswith(BUNDLED_PREFIX):
            resolve_bundled(str(entry))  # its HoneError lists the bundled names
    try:
        resolve_sources(entries, side=side)
    except SourceError as e:
        raise DataError(e.message, advice) from None
