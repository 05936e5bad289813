"""The Hugging Face Hub: search models by name (`search_models`, `model_files`), download one into the Hub's cache
(`download_model`), keep the access token in the OS keyring (`save_token`, `forget_token`), push an export
(`push_folder`, `hub_user`), and the memory planner's verdict on a Hub model (`fits_this_machine`).

Light to import; huggingface_hub loads when the Hub is asked.
"""

from __future__ import annotations

from hone.core.hub.download import download_model
from hone.core.hub.machine_fit import fits_this_machine
from hone.core.hub.push import hub_user, push_folder
from hone.core.hub.search import model_files, search_models
from hone.core.hub.token import forget_token, save_token

__all__ = [
    "download_model",
    "fits_this_machine",
    "forget_token",
    "hub_user",
    "model_files",
    "push_folder",
    "save_token",
    "search_models",
]
