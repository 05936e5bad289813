"""Models named for people: a bundled model by the name it is known by, not by its `bundled:` id (which stays in
tooltips, where people who write configs look for it)."""

from __future__ import annotations

from hone.core.resources import BUNDLED_MODELS, BUNDLED_PREFIX


def model_name(name_or_path: str) -> str:
    """What the Studio calls a model: "bundled:smollm2-135m-instruct" -> "SmolLM2-135M-Instruct (bundled)"; any other
    name (a Hub id, a folder, a .gguf file) as it was given."""
    if not name_or_path.startswith(BUNDLED_PREFIX):
        return name_or_path
    key = name_or_path.removeprefix(BUNDLED_PREFIX)
    hub_id = BUNDLED_MODELS.get(key, key)
    return f"{hub_id.rsplit('/', 1)[-1]} (bundled)"
