"""Load a model and its tokenizer from a Hugging Face id, a local folder, a .gguf file or the bundled demo model.

GGUF files are converted once (transformers dequantizes them on load) into a safetensors folder under the user
cache (`hone.core.resources.cache_root("models")`), keyed by the file's path, size and modification time, so the second
load is fast. `tokenizer_for` gives the tokenizer a run would use without reading weights (data checks). Errors say
what to do: an offline machine without the model cached is told to point at a local folder or file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.core.config import ModelConfig
from hone.core.errors import INSTALL_BITSANDBYTES, ModelError
from hone.core.model_info import EXPERT_COUNT_KEYS, EXPERTS_PER_TOKEN_KEYS, ModelInfo, config_value
from hone.core.models.hub_kernels import from_pretrained_options, guard_bitsandbytes_import
from hone.core.resources import BUNDLED_MODELS, BUNDLED_PREFIX, cache_root, resolve_bundled, writable_cache

# A Hugging Face repo id: "name" or "owner/name" with letters, digits, '-', '_', '.'.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# GGUF conversions at or under this many bytes of float32 weights stay float32 (exactly the dequantized values);
# larger ones are stored as bfloat16 so a 7B conversion does not need 28 GB of disk.
_FP32_CONVERSION_LIMIT = 2 * 1024**3
# Part of the conversion cache key: bump it when a conversion changes, so old cached folders are not reused.
_CONVERSION_VERSION = 2
# Seconds the one Hub request of `check_hub_model` may take: long enough for a slow link, short enough that a
# machine without one is told at once.
_HUB_CHECK_TIMEOUT_S = 10


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from. `path` is a folder, a .gguf file, or a hub id (kind == "hub")."""

    kind: str  # bundled | gguf | folder | hub
    path: str
    name: str  # what the user gave


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel (peft wraps it later)
    tokenizer: Any  # tokenizer, or processor for vision models
    info: ModelInfo
    source: ModelSource
    folder: str  # what from_pretrained read: a folder (converted GGUF included) or a hub id


def resolve_source(name_or_path: str, gguf_file: str = "") -> ModelSource:
    """Decide what kind of source `name_or_path` is, or raise ModelError saying why it cannot be used."""
    name = name_or_path.strip()
    if not name:
        raise ModelError(
            "no model chosen (model.name_or_path is empty)",
            "give a Hugging Face id, a local model folder or a .gguf file",
        )
    if name.startswith(BUNDLED_PREFIX):
        if name[len(BUNDLED_PREFIX) :] not in BUNDLED_MODELS:
            raise ModelError(
                f"{name} is not a bundled model",
                f"bundled models: {', '.join(BUNDLED_PREFIX + m for m in BUNDLED_MODELS)}",
            )
        return ModelSource("bundled", str(check_gguf_whole(resolve_bundled(name))), name)
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(
                f"{path} is a file but not a .gguf model",
                "pick a .gguf file or the folder that holds config.json and the weights",
            )
        return ModelSource("gguf", str(check_gguf_whole(path).resolve()), name)
    if path.is_dir():
        if gguf_file:
            file = path / gguf_file
            if not file.is_file():
                raise ModelError(f"{file} does not exist", "check model.gguf_file")
            return ModelSource("gguf", str(check_gguf_whole(file).resolve()), name)
        if (path / "config.json").is_file():
            return ModelSource("folder", str(path.resolve()), name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", str(check_gguf_whole(ggufs[0]).resolve()), name)
        if ggufs:
            raise ModelError(
                f"{path} holds several .gguf files ({', '.join(g.name for g in ggufs[:4])})",
                "set model.gguf_file to the one to use",
            )
        raise ModelError(
            f"{path} holds neither config.json nor a .gguf file",
            "pick the folder a model was saved to (with config.json and *.safetensors)",
        )
    looks_local = (
        name.startswith((".", "~", "/", "\\"))
        or name.lower().endswith(".gguf")
        or (len(name) > 1 and name[1] == ":")
        or name.count("/") > 1
        or "\\" in name
    )
    if looks_local or not _HUB_ID.match(name):
        raise ModelError(
            f"{name} does not exist",
            "check the path, or set model.name_or_path to a local model "
            "folder, a .gguf file, or a Hugging Face id like Qwen/Qwen3-0.6B",
        )
    return ModelSource("hub", name, name)


def check_gguf_whole(path: Path) -> Path:
    """`path`, after making sure it is a whole GGUF file: a download that stopped early or a copy onto a full disk
    is reported as damaged here (reading the header takes milliseconds), not later as a model transformers cannot
    read.

    Raises:
        ModelError: the file is not GGUF, or shorter than its header says (expected and actual size given).
    """
    from hone.core.models.gguf_read import gguf_damage

    reason = gguf_damage(path)
    if reason:
        raise ModelError(
            f"{path} is damaged: {reason}",
            "download or copy the file again (a transfer that stopped early leaves a short file); "
            "it cannot be used as it is",
        )
    return path


def check_hub_model(name: str, revision: str = "", filename: str = "config.json") -> None:
    """Make sure a Hub model can be loaded before anything is: it is in the local Hugging Face cache, or the Hub
    answers that it exists. One connection probe and one request at most, no retries, so a wrong id or an offline
    machine is one line within seconds.

    Raises:
        ModelError: offline (HF_HUB_OFFLINE) and not cached, no such model, or the Hub cannot be reached.
    """
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from hone.core.data.hub_datasets import probe

    if isinstance(try_to_load_from_cache(name, filename, revision=revision or None), str):
        return
    local = "set model.name_or_path to a local model folder or .gguf file"
    if constants.HF_HUB_OFFLINE:
        raise ModelError(
            f"{name} is not in the local Hugging Face cache, and HF_HUB_OFFLINE is set, so it cannot be downloaded",
            f"unset HF_HUB_OFFLINE to download it once, or {local}",
        )
    # One TCP connection first (1.5 s at most): an unreachable Hub is known at once, not after the request's timeout
    unreachable = probe(constants.ENDPOINT)
    if unreachable:
        raise ModelError(
            f"{name} is not in the local Hugging Face cache, and {unreachable}",
            f"connect to the internet once to download it, or {local}",
        )
    try:
        HfApi().model_info(name, revision=revision or None, timeout=_HUB_CHECK_TIMEOUT_S)
    except GatedRepoError:
        raise ModelError(
            f"{name} is gated: its license must be accepted on huggingface.co",
            "accept it on the model's page, then run `hf auth login`",
        ) from None
    except RepositoryNotFoundError:
        raise ModelError(
            f"there is no model named {name!r} on the Hugging Face Hub (or it is private)",
            "check the spelling; for a private model run `hf auth login`",
        ) from None
    except Exception as e:  # whatever the HTTP client raises when the Hub cannot be reached
        raise ModelError(
            f"{name} is not in the local Hugging Face cache and the Hub cannot be reached ({type(e).__name__})",
            f"connect to the internet once to download it, or {local}",
        ) from None


def needs_own_code(name: str) -> ModelError:
    """The ModelError for a model whose config names code of its own (`auto_map`, a `model_type` transformers does
    not know): Hone runs such code only when the run config asks for it."""
    return ModelError(
        f"{name} needs its own Python code to load (its config.json names classes of its own, `auto_map`, for a "
        "model type transformers does not know); Hone does not run a model's own code unless asked",
        "if you trust that repository, set model.trust_remote_code = true in the run config (`--set "
        "model.trust_remote_code=true`, or the same field among the Train page's model settings); otherwise "
        "choose a model that transformers supports",
    )


@contextlib.contextmanager
def custom_code_errors(name: str):
    """Turn transformers' "pass trust_remote_code=True" ValueError into `needs_own_code(name)`."""
    try:
        yield
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise needs_own_code(name) from None
        raise


@contextlib.contextmanager
def _hub_errors(name: str):
    """Turn the hub client's exceptions into one clear ModelError."""
    try:
        yield
    except ModelError:
        raise
    except (OSError, ValueError) as e:
        text = str(e)
        kind = type(e).__name__
        if isinstance(e, ValueError) and "trust_remote_code" in text:
            raise needs_own_code(name) from None
        if "RepositoryNotFound" in kind or "404" in text or "is not a valid model identifier" in text:
            raise ModelError(
                f"there is no model named {name!r} on the Hugging Face Hub (or it is private)",
                "check the spelling; for a private or gated model run `hf auth login`",
            ) from None
        if "GatedRepo" in kind or "gated" in text.lower():
            raise ModelError(
                f"{name} is gated: its license must be accepted on huggingface.co",
                "accept it on the model's page, then run `hf auth login`",
            ) from None
        if (
            "LocalEntryNotFound" in kind
            or "offline" in text.lower()
            or "connect" in text.lower()
            or "cached files" in text.lower()
        ):
            raise ModelError(
                f"{name} is not in the local Hugging Face cache and the Hub cannot be reached",
                "connect to the internet once to download it, or set model.name_or_path to a "
                "local model folder or .gguf file",
            ) from None
        raise


def resolve_dtype(name: str, device: str):
    """auto -> bfloat16 on GPUs that support it, float16 on older GPUs, float32 on CPU."""
    import torch

    if name != "auto":
        return getattr(torch, name)
    if str(device).startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def gguf_conversion_folder(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha1(f"{_CONVERSION_VERSION}|{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    key = key.hexdigest()[:16]
    return cache_root("models", f"{gguf.stem}-{key}")


def gguf_folder(gguf: Path) -> Path:
    """A safetensors folder equivalent to `gguf`, converting it on first use (atomic: temp folder + rename)."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM

    target = gguf_conversion_folder(gguf)
    if (target / "config.json").is_file():
        return target
    writable_cache("models")  # checked before the conversion, not found out after it
    try:
        tokenizer = gguf_tokenizer(gguf)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **from_pretrained_options()
        )
    except (ValueError, KeyError, RuntimeError) as e:
        raise ModelError(
            f"{gguf} could not be read as a GGUF model: {e}",
            "transformers reads GGUF files of llama, mistral, qwen2/qwen3, phi3, gemma and a few "
            "more architectures; convert others to safetensors",
        ) from None
    size = sum(p.numel() for p in model.parameters()) * 4
    if size > _FP32_CONVERSION_LIMIT:
        model = model.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
    # The weights are plain tensors now; without this entry the next load reads them as such. transformers
    # refuses save_pretrained on a GGUF-loaded model, so weights and config are written directly
    # (save_model keeps one copy of tied tensors).
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config

    def write(tmp: Path) -> None:
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "hone_source.json").write_text(json.dumps({"gguf": str(gguf.resolve())}))

    return publish_folder(target, write)


def publish_folder(target: Path, write) -> Path:
    """Fill `target` through `write(tmp)` on a temporary sibling folder, then rename it into place, so a reader never
    sees a half-written folder. Another process that finished the same folder first wins; its copy is kept."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        write(tmp)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():  # not another process's finished copy: a real failure
            raise
    return target


def gguf_tokenizer(gguf: Path):
    """The tokenizer transformers builds from a GGUF file's metadata (no tensor is read), with BOS / EOS / padding set
    to the ids the file states. The conversion saves exactly this tokenizer next to the weights.

    Raises:
        OSError, ValueError, KeyError, RuntimeError: the file cannot be read, or transformers cannot build its
            tokenizer.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _special_tokens_from_gguf(tokenizer, gguf)
    return tokenizer


def _special_tokens_from_gguf(tokenizer, gguf: Path) -> None:
    """Set BOS / EOS / padding tokens to the ids the GGUF file states. transformers 5.17 mixes them up when it
    rebuilds a GPT-2 style tokenizer from GGUF (SmolLM2 came out with EOS = <|im_start|>)."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf).fields
    for key, attr in (("bos", "bos_token"), ("eos", "eos_token"), ("padding", "pad_token")):
        field = fields.get(f"tokenizer.ggml.{key}_token_id")
        if field is None:
            continue
        token_id = int(field.parts[field.data[0]][0])
        token = tokenizer.convert_ids_to_tokens(token_id)
        if token is not None and getattr(tokenizer, attr) != token:
            setattr(tokenizer, attr, token)


def pending_conversion(model_cfg: ModelConfig) -> Path | None:
    """The .gguf file that loading this model will convert first (a slow, one-time step), or None."""
    try:
        source = resolve_source(model_cfg.name_or_path, model_cfg.gguf_file)
    except ModelError:
        return None  # loading reports it
    if source.kind not in ("bundled", "gguf"):
        return None
    gguf = Path(source.path)
    return None if (gguf_conversion_folder(gguf) / "config.json").is_file() else gguf


def source_folder(source: ModelSource) -> str:
    """What `from_pretrained` should read for this source."""
    if source.kind in ("bundled", "gguf"):
        return str(gguf_folder(Path(source.path)))
    return source.path


def load_config(model_cfg: ModelConfig):
    """(source, folder, transformers config) for a ModelConfig."""
    from transformers import AutoConfig

    source = resolve_source(model_cfg.name_or_path, model_cfg.gguf_file)
    folder = source_folder(source)
    with _hub_errors(source.name):
        config = AutoConfig.from_pretrained(
            folder, revision=model_cfg.revision or None, trust_remote_code=model_cfg.trust_remote_code
        )
    return source, folder, config


def is_vision_config(config) -> bool:
    return getattr(config, "vision_config", None) is not None


def info_from_config(config, name: str, source_kind: str, params: int) -> ModelInfo:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    experts = config_value(text, EXPERT_COUNT_KEYS)
    top_k = config_value(text, EXPERTS_PER_TOKEN_KEYS)
    architectures = getattr(config, "architectures", None) or [type(config).__name__.replace("Config", "")]
    return ModelInfo(
        name=name,
        source_kind=source_kind,
        architecture=architectures[0],
        model_type=config.model_type,
        params=int(params),
        layers=int(text.num_hidden_layers),
        hidden_size=int(text.hidden_size),
        vocab_size=int(text.vocab_size),
        context_length=int(getattr(text, "max_position_embeddings", 0) or 0),
        is_moe=bool(experts),
        num_experts=int(experts or 0),
        experts_per_token=int(top_k or 0),
        is_vision=is_vision_config(config),
    )


def _auto_model_class(config):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_config(config) else AutoModelForCausalLM


def logical_numel(p) -> int:
    """Values a parameter stands for: a bitsandbytes 4-bit weight counts its unpacked shape, whatever dtype packs
    it (Hone stores nf4 in bf16 storage, 4 values per element; uint8 storage holds 2)."""
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    if type(p).__name__ == "Params4bit" and shape is not None:
        return math.prod(shape)
    return p.numel()


def count_params(model) -> int:
    """Parameters as the user thinks of them (4-bit packed weights count their unpacked size)."""
    return sum(logical_numel(p) for p in model.parameters())


def inspect_model(name_or_path: str, gguf_file: str = "") -> ModelInfo:
    """ModelInfo from the config alone; parameters counted on the meta device (no weights read)."""
    import torch

    source, _folder, config = load_config(ModelConfig(name_or_path=name_or_path, gguf_file=gguf_file))
    with torch.device("meta"):
        model = _auto_model_class(config).from_config(config)
    return info_from_config(config, name_or_path, source.kind, count_params(model))


def model_skeleton(model_cfg: ModelConfig) -> LoadedModel:
    """The model's structure on the meta device, with its tokenizer: no weight is read, no memory is taken. What
    needs only the modules' names and shapes (a LoRA laid out to take a checkpoint's tensors) uses it."""
    import torch

    source, folder, config = load_config(model_cfg)
    with torch.device("meta"):
        model = _auto_model_class(config).from_config(config, trust_remote_code=model_cfg.trust_remote_code)
    model.eval().requires_grad_(False)
    tokenizer = load_tokenizer(folder, config, model_cfg)
    info = info_from_config(model.config, source.name, source.kind, count_params(model))
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, source=source, folder=folder)


def _qlora_config(dtype, device: str):
    if not str(device).startswith("cuda"):
        raise ModelError(
            "QLoRA (lora.qlora = true) needs an NVIDIA GPU; this run is on the CPU",
            "turn lora.qlora off, or run on a machine with a CUDA GPU",
        )
    guard_bitsandbytes_import()
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError:
        raise ModelError(
            "QLoRA needs the bitsandbytes package, which is not installed",
            f"{INSTALL_BITSANDBYTES}, or turn lora.qlora off",
        ) from None
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_quant_storage=dtype,
    )


def _load_processor(folder: str, config, kwargs: dict):
    """transformers' processor; where it cannot be built because it needs torchvision (the Qwen-VL processors hold
    a video processor), Hone's image-and-text stand-in for the families it has a placeholder rule for."""
    from transformers import AutoProcessor

    from hone.core.vision.processor import PLACEHOLDER_RULES, build_fallback_processor

    try:
        return AutoProcessor.from_pretrained(folder, **kwargs)
    except (ImportError, TypeError) as e:
        if "torchvision" not in str(e).lower() and "video" not in str(e).lower():
            raise
        if config.model_type in PLACEHOLDER_RULES:
            return build_fallback_processor(folder, config.model_type, **kwargs)
        raise ModelError(
            f"the image processor of this {config.model_type} model needs torchvision, which is not installed",
            "pip install torchvision (the build that matches your torch)",
        ) from None


def load_tokenizer(folder: str, config=None, model_cfg: ModelConfig | None = None):
    """The tokenizer (or, for vision models, the processor), with a pad token set."""
    from transformers import AutoTokenizer

    model_cfg = model_cfg or ModelConfig()
    kwargs = dict(revision=model_cfg.revision or None, trust_remote_code=model_cfg.trust_remote_code)
    with _hub_errors(model_cfg.name_or_path):
        if config is not None and is_vision_config(config):
            tokenizer = _load_processor(folder, config, kwargs)
        else:
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    return _with_pad_token(tokenizer)


def _with_pad_token(tokenizer):
    """Pad with EOS where the tokenizer names no padding token (collation pads batches)."""
    text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    if text_tokenizer.pad_token is None:
        text_tokenizer.pad_token = text_tokenizer.eos_token
    return tokenizer


def tokenizer_for(model_cfg: ModelConfig):
    """The tokenizer (or, for vision models, the processor) a run with `model_cfg` would train with, read without any
    weights: what `hone data check --model` and the Studio's Data page tokenize rows with.

    `model_cfg.name_or_path` may be anything a run accepts (a model folder, a .gguf file or a folder holding one, a
    `bundled:` name, a Hugging Face id) or a folder holding only tokenizer files. A GGUF's tokenizer comes from its
    conversion when a run made one, else from its metadata exactly as the conversion builds it (`gguf_tokenizer`): a
    data check never converts a model. Other models read their config (vision models pick a processor) and tokenizer
    files.

    Raises:
        ModelError: the name is no model, or its tokenizer cannot be read; the message says which and what to do.
    """
    name = model_cfg.name_or_path.strip()
    folder = Path(name).expanduser()
    if name and not model_cfg.gguf_file and _holds_only_a_tokenizer(folder):
        try:
            return load_tokenizer(str(folder), None, model_cfg)
        except (OSError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ModelError(
                f"cannot load the tokenizer in {folder}: {first}",
                "give a model folder, a .gguf file, or a folder with tokenizer.json or tokenizer_config.json",
            ) from None
    source = resolve_source(name, model_cfg.gguf_file)
    if source.kind in ("bundled", "gguf"):
        gguf = Path(source.path)
        converted = gguf_conversion_folder(gguf)
        if (converted / "config.json").is_file():  # a run converted it already: the very files runs read (and fast)
            return load_tokenizer(str(converted), None, model_cfg)
        try:
            return _with_pad_token(gguf_tokenizer(gguf))
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise ModelError(
                f"the tokenizer of {gguf} could not be read: {e}",
                "transformers reads the tokenizers of llama, mistral, qwen2/qwen3, phi3, gemma and a few "
                "more GGUF architectures; convert others to safetensors",
            ) from None
    _source, folder_or_id, config = load_config(model_cfg)
    return load_tokenizer(folder_or_id, config, model_cfg)


def _holds_only_a_tokenizer(folder: Path) -> bool:
    """A folder with tokenizer files but neither config.json nor a .gguf file (which `resolve_source` would take)."""
    return (
        folder.is_dir()
        and not (folder / "config.json").is_file()
        and not any(folder.glob("*.gguf"))
        and any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    )


def load_model(
    model_cfg: ModelConfig,
    *,
    device: str | None = None,
    for_training: bool = True,
    qlora: bool = False,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load weights and tokenizer onto `device` in the configured dtype (QLoRA: 4-bit nf4 base).

    `attn_implementation` None lets transformers pick its default (SDPA where the architecture has it); the
    run's packed-attention backend is set afterwards by hone.core.speed.attention."""
    device = device or pick_device()
    dtype = resolve_dtype(model_cfg.dtype, device)
    source, folder, config = load_config(model_cfg)
    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        revision=model_cfg.revision or None,
        trust_remote_code=model_cfg.trust_remote_code,
        attn_implementation=attn_implementation,
    )
    if qlora:
        kwargs["quantization_config"] = _qlora_config(dtype, device)
        kwargs["device_map"] = {"": device}
    with _hub_errors(source.name):
        model = _auto_model_class(config).from_pretrained(folder, **kwargs, **from_pretrained_options())
    if not qlora:
        model.to(device)
    model.train(for_training)
    if not for_training:
        model.requires_grad_(False)
    tokenizer = load_tokenizer(folder, config, model_cfg)
    info = info_from_config(model.config, source.name, source.kind, count_params(model))
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, source=source, folder=folder)
