"""Search the Hub for models by name, and list the files one model would download.

A search is one request, not retried (`/api/models?search=...&sort=downloads&expand=...`); what it gives for each
model is enough for a table row: downloads, likes, license, gated or not, and the size of its weights from the
safetensors parameter counts the Hub keeps per dtype. The exact bytes to download come from `model_files`, one more
request, for the model the user picks.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from datetime import datetime

from hone.core.hub.connection import TIMEOUT_S, HubError, check_online, endpoint, hub_errors
from hone.core.hub.token import hub_token

# What a search asks the Hub to include for each model.
SEARCH_FIELDS = ["downloads", "likes", "gated", "lastModified", "pipeline_tag", "tags", "safetensors", "library_name"]
MAX_RESULTS = 100  # a search is a table to read, not a crawl
# Bytes per value of each safetensors dtype the Hub counts parameters in (the weights' size on disk, near enough:
# the headers add a few KB per file).
DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "BF16": 2,
    "F16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
# Files a transformers model does not need when the repo has safetensors weights, or never: other frameworks'
# weights, exports and the original (pre-conversion) checkpoints some repos carry beside the transformers ones.
NOT_NEEDED = [
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.onnx",
    "*.onnx_data",
    "*.tflite",
    "*.mlmodel",
    "*.gguf",
    "*.nemo",
    "onnx/*",
    "openvino/*",
    "coreml/*",
    "original/*",
    "tf_model*",
    "flax_model*",
    "rust_model*",
]
PICKLE_WEIGHTS = ["*.bin", "*.pt", "*.pth", "*.ckpt"]  # skipped when the same repo has *.safetensors
_QUERY = re.compile(r"^[\w .\-/]*$")


@dataclass(frozen=True)
class HubModel:
    """One search result.

    Attributes:
        id: the repo id, "owner/name".
        downloads: downloads in the last 30 days, as the Hub counts them.
        likes: the Hub's likes.
        license: the license tag ("apache-2.0"), "" when the card names none.
        gated: "" when anyone can download it, else how access is granted ("auto", "manual").
        parameters: parameters in its safetensors weights, None when the Hub does not know.
        weight_bytes: bytes of those weights in their stored dtypes, None when unknown.
        pipeline_tag: the task ("text-generation", "image-text-to-text"), "" when none.
        last_modified: the last commit's time, None when not given.
    """

    id: str
    downloads: int = 0
    likes: int = 0
    license: str = ""
    gated: str = ""
    parameters: int | None = None
    weight_bytes: int | None = None
    pipeline_tag: str = ""
    last_modified: datetime | None = None

    @property
    def is_gated(self) -> bool:
        return bool(self.gated)


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int


@dataclass(frozen=True)
class HubFiles:
    """The files of one model at one commit, and which of them a download takes (`wanted`)."""

    repo_id: str
    commit: str
    files: tuple[HubFile, ...]
    wanted: tuple[HubFile, ...]
    gated: str = ""

    @property
    def total_bytes(self) -> int:
        """Bytes a download of `wanted` transfers (what is already in the cache included)."""
        return sum(f.size for f in self.wanted)


def search_models(text: str, limit: int = 20) -> list[HubModel]:
    """Models whose id contains `text`, most downloaded first.

    Raises:
        HubError: an empty or odd query, HF_HUB_OFFLINE set, or the Hub cannot be reached.
    """
    from huggingface_hub import ModelInfo, get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    text = text.strip()
    if not text:
        raise HubError("type part of a model's name to search for", "for example: qwen3, smollm2, llama")
    if not _QUERY.match(text):
        raise HubError(
            f"{text!r} is not something a model id contains",
            "model ids hold letters, digits, '-', '_', '.' and one '/'",
        )
    check_online()
    token, _ = hub_token()
    params = [("search", text), ("sort", "downloads"), ("limit", str(max(1, min(limit, MAX_RESULTS))))]
    params += [("expand", field) for field in SEARCH_FIELDS]
    # HfApi.list_models asks the same, but retries an unreachable Hub for half a minute before saying so.
    with hub_errors(with_token=bool(token)):
        response = get_session().get(
            f"{endpoint()}/api/models", params=params, timeout=TIMEOUT_S, headers=build_hf_headers(token=token or False)
        )
        hf_raise_for_status(response)
        found = response.json()
    return [_model(ModelInfo(**{"siblings": None, **item})) for item in found]


def model_files(repo_id: str, revision: str = "") -> HubFiles:
    """The files of `repo_id` at `revision` (newest when ""), with their sizes and the commit they belong to.

    Raises:
        HubError: no such model or revision, or the Hub cannot be reached.
    """
    from huggingface_hub import HfApi

    check_online()
    token, _ = hub_token()
    api = HfApi(endpoint=endpoint(), token=token or False)
    with hub_errors(repo_id, revision, with_token=bool(token)):
        info = api.model_info(repo_id, revision=revision or None, files_metadata=True, timeout=TIMEOUT_S)
    files = tuple(HubFile(s.rfilename, int(s.size or 0)) for s in (info.siblings or []))
    return HubFiles(repo_id, str(info.sha), files, wanted_files(files), _gated(info.gated))


def wanted_files(files: tuple[HubFile, ...]) -> tuple[HubFile, ...]:
    """What transformers needs of a repo's files: everything but NOT_NEEDED, and no pickled weights beside
    safetensors ones (a repo with only .bin weights keeps them)."""
    names = [f.name for f in files]
    skip = list(NOT_NEEDED)
    if any(n.endswith(".safetensors") for n in names):
        skip += PICKLE_WEIGHTS
    return tuple(f for f in files if not any(fnmatch.fnmatch(f.name, pattern) for pattern in skip))


def _model(info) -> HubModel:
    """A HubModel from huggingface_hub's ModelInfo."""
    parameters = weight_bytes = None
    safetensors = getattr(info, "safetensors", None)
    if safetensors is not None and safetensors.parameters:
        parameters = int(safetensors.total or sum(safetensors.parameters.values()))
        weight_bytes = sum(
            int(count) * DTYPE_BYTES.get(dtype.upper(), 2) for dtype, count in safetensors.parameters.items()
        )
    return HubModel(
        id=info.id,
        downloads=int(info.downloads or 0),
        likes=int(info.likes or 0),
        license=_license(info),
        gated=_gated(info.gated),
        parameters=parameters,
        weight_bytes=weight_bytes,
        pipeline_tag=info.pipeline_tag or "",
        last_modified=info.last_modified,
    )


def _license(info) -> str:
    for tag in info.tags or []:
        if tag.startswith("license:"):
            return tag.removeprefix("license:")
    card = getattr(info, "card_data", None)
    value = getattr(card, "license", None) if card is not None else None
    return str(value) if value else ""


def _gated(value) -> str:
    """The Hub says False, True, "auto" or "manual"."""
    if not value:
        return ""
    return value if isinstance(value, str) else "yes"
