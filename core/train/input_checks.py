"""Checks of a run's inputs that take well under a second and load nothing: the model and every data file exist.

`hone train` calls `check_inputs` before it imports torch or creates the run folder, so a wrong path, a `bundled:`
typo or an unknown Hub id on an offline machine is one line of error and advice (exit 2), with nothing left on
disk. Cross-field config checks live in hone.core.config (RunConfig.check), where the desktop app's form sees them
too. Stdlib and numpy only.
"""

from __future__ import annotations

from hone.core.config import RunConfig
from hone.core.data.loaders import SourceError, resolve_sources
from hone.core.errors import DataError
from hone.core.models.load import check_hub_model, resolve_source
from hone.core.resources import BUNDLED_PREFIX, resolve_bundled


def check_inputs(config: RunConfig) -> None:
    """Raise a HoneError (ModelError, DataError) naming the setting to fix when an input cannot be found.

    Hugging Face dataset ids are not checked here (their loader reports them); Hub model ids are (see
    `check_hub_model`).
    """
    model = config.model
    source = resolve_source(model.name_or_path, model.gguf_file)
    if source.kind == "hub":
        check_hub_model(source.name, model.revision, model.gguf_file or "config.json")
    for setting, entries in (("data.train", config.data.train), ("data.eval", config.data.eval)):
        for entry in entries:
            if str(entry).startswith(BUNDLED_PREFIX):
                resolve_bundled(str(entry))  # its HoneError lists the bundled names
        try:
            resolve_sources(entries, side="train" if setting == "data.train" else "eval")
        except SourceError as e:
            raise DataError(e.message, f"fix {setting} in the config (or --set {setting}=[...]): give a data file, "
                            "a folder, a bundled: name or a Hugging Face dataset id") from None
