"""A small GGUF reader for the export checks: metadata, tensor infos and tensor values, straight from the file.

Written from the GGUF specification (header, key/values, tensor infos, aligned data), independent of the `gguf`
package's writer that produced the file, so a check that reads back what was written compares two
implementations. It is also fast: the package's reader builds an object per array element, which takes seconds
for a 50k-token vocabulary; this one decodes only the keys asked for.

`gguf_damage` says whether a file is cut short (a download that stopped, a copy onto a full disk): its header must
read to the end and the file must hold every tensor the header lists. Model loading calls it before anything else
reads the file, so a damaged file is reported as damaged rather than as a model transformers cannot read. Counts
are checked against the bytes that could hold them before anything is built (a header claiming 2**60 key/values,
an array of more strings than the file has bytes for), and a vocabulary against the embedding table that must
hold one row per token: a 16 MB file listing 2 million empty tokens is refused in milliseconds, not after
transformers spends 3.5 GB building a tokenizer from it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Magic, version, tensor count and key/value count: the bytes every GGUF file starts with.
_HEADER_BYTES = 24
# The fewest bytes one key/value can take (key length, one-byte key... value type, a one-byte value), one tensor
# info (name length, dimension count, type, offset), and one array item of each type: a count that needs more
# bytes than the file has left is refused before anything is read or built.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
_MIN_STRING_BYTES = 8
_MIN_ARRAY_BYTES = 4 + 8
# Most tokens a vocabulary may list: the largest real ones have about 262,000 (Gemma 3); four times that is a file
# built to exhaust memory, not a model.
MAX_VOCAB_TOKENS = 1 << 20
VOCAB_KEY = "tokenizer.ggml.tokens"
EMBEDDING_TENSOR = "token_embd.weight"
# GGML type id -> (values per block, bytes per block), ggml's type traits as the GGUF specification lists them; a
# test keeps this equal to the gguf package's GGML_QUANT_SIZES. Written out so that checking a file's size does not
# import the gguf package (a few tenths of a second at every `hone train`).
TYPE_SIZES = {
    0: (1, 4),
    1: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    9: (32, 40),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
    15: (256, 292),
    16: (256, 66),
    17: (256, 74),
    18: (256, 98),
    19: (256, 50),
    20: (32, 18),
    21: (256, 110),
    22: (256, 82),
    23: (256, 136),
    24: (1, 1),
    25: (1, 2),
    26: (1, 4),
    27: (1, 8),
    28: (1, 8),
    29: (256, 56),
    30: (1, 2),
    34: (256, 54),
    35: (256, 66),
    39: (32, 17),
    40: (64, 36),
    41: (128, 18),
}


class GgufDamaged(ValueError):
    """The file is not a GGUF file, or it ends inside its header. `reason` says which, and where, in words."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry: `shape` in GGUF order (ne: innermost dimension first), GGML type id, data offset."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int


@dataclass
class GgufFile:
    path: Path
    version: int
    metadata: dict[str, Any]  # the keys asked for (all of them when read with keys=None)
    value_types: dict[str, int]  # every key -> its GGUF value type (arrays: 9)
    tensors: dict[str, TensorInfo]
    data_start: int
    header_end: int = 0  # where the tensor infos end; data_start is the next multiple of the alignment
    array_lengths: dict[str, int] = field(default_factory=dict)  # every array key -> its item count

    def array(self, name: str):
        """The tensor's values as float32 numpy, shape in numpy order (outermost first)."""
        import numpy as np
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import dequantize

        info = self.tensors[name]
        qtype = GGMLQuantizationType(info.type)
        block, size = GGML_QUANT_SIZES[qtype]
        count = int(np.prod(info.shape))
        nbytes = count // block * size
        with open(self.path, "rb") as f:
            f.seek(self.data_start + info.offset)
            raw = np.frombuffer(f.read(nbytes), dtype=np.uint8)
        numpy_shape = tuple(reversed(info.shape))
        if qtype == GGMLQuantizationType.F32:
            return raw.view(np.float32).reshape(numpy_shape).copy()
        if qtype == GGMLQuantizationType.F16:
            return raw.view(np.float16).astype(np.float32).reshape(numpy_shape)
        bytes_shape = (*numpy_shape[:-1], numpy_shape[-1] // block * size)
        return dequantize(raw.reshape(bytes_shape), qtype).reshape(numpy_shape)


def read_gguf(path: str | Path, keys: set[str] | None = None) -> GgufFile:
    """Read a GGUF file's header. `keys`: the metadata values to decode (None = all; big arrays cost time).

    Raises:
        GgufDamaged: the file does not start with the GGUF magic, or it ends before its header does.
    """
    path = Path(path)
    try:
        return _read_header(path, keys)
    except (struct.error, UnicodeDecodeError, OverflowError, MemoryError) as e:
        size = path.stat().st_size
        raise GgufDamaged(path, f"it ends inside its GGUF header (the file has {size:,} bytes; {e})") from None


def _string(data, pos: int, size: int) -> tuple[str, int]:
    """The GGUF string at `pos` (a little-endian u64 length, then UTF-8 bytes) and the position after it.

    Raises:
        struct.error: the string runs past the end of the file (`size` bytes).
    """
    (length,) = struct.unpack_from("<Q", data, pos)
    if pos + 8 + length > size:
        raise struct.error(f"a string of {length:,} bytes at offset {pos:,} runs past the end")
    return bytes(data[pos + 8 : pos + 8 + length]).decode("utf-8"), pos + 8 + length


def _skip_strings(data, pos: int, count: int) -> int:
    """The position after `count` GGUF strings from `pos`, without decoding them."""
    for _ in range(count):
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + length
    return pos


def _value(data, pos: int, vtype: int, keep: bool, size: int) -> tuple[Any, int]:
    """The metadata value of type `vtype` at `pos` (None when not `keep`: it is only stepped over) and the
    position after it."""
    if vtype == _STRING:
        return _string(data, pos, size)
    if vtype == _ARRAY:
        etype, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        _check_count(count, _item_bytes(etype), size - pos, f"an array at offset {pos - 12:,}", "items")
        if etype in _SCALARS and not keep:
            return None, pos + count * struct.calcsize(_SCALARS[etype])
        if etype == _STRING and not keep:  # a vocabulary: step over the strings without decoding them
            return None, _skip_strings(data, pos, count)
        items = []
        for _ in range(count):
            item, pos = _value(data, pos, etype, keep, size)
            items.append(item)
        return (items if keep else None), pos
    fmt = "<" + _SCALARS[vtype]
    return struct.unpack_from(fmt, data, pos)[0], pos + struct.calcsize(fmt)


def _item_bytes(vtype: int) -> int:
    """The fewest bytes one value of GGUF type `vtype` takes."""
    if vtype in _SCALARS:
        return struct.calcsize(_SCALARS[vtype])
    return _MIN_STRING_BYTES if vtype == _STRING else _MIN_ARRAY_BYTES


def _check_count(count: int, each: int, left: int, what: str, items: str) -> None:
    """Refuse a count of things of at least `each` bytes that the `left` bytes of the file cannot hold.

    Raises:
        struct.error: read_gguf's signal that the header runs past the end of the file.
    """
    if count * each > left:
        raise struct.error(
            f"{what} says it has {count:,} {items}, which need at least {count * each:,} bytes, "
            f"but only {left:,} are left"
        )


def _read_header(path: Path, keys: set[str] | None) -> GgufFile:
    size = path.stat().st_size
    if size < _HEADER_BYTES:
        raise GgufDamaged(path, f"it has {size:,} bytes, fewer than a GGUF header's first {_HEADER_BYTES}")

    metadata, types, tensors = {}, {}, {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != GGUF_MAGIC:
            raise GgufDamaged(path, "it is not a GGUF file (it does not start with the GGUF magic bytes)")
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", data, 4)
        pos = 24
        _check_count(kv_count, _MIN_KV_BYTES, size - pos, "the header", "key/values")
        _check_count(tensor_count, _MIN_TENSOR_INFO_BYTES, size - pos, "the header", "tensors")
        lengths = {}
        for _ in range(kv_count):
            key, pos = _string(data, pos, size)
            (vtype,) = struct.unpack_from("<I", data, pos)
            if vtype == _ARRAY:
                lengths[key] = struct.unpack_from("<Q", data, pos + 8)[0]
            keep = keys is None or key in keys or key == "general.alignment"
            item, pos = _value(data, pos + 4, vtype, keep, size)
            types[key] = vtype
            if keep:
                metadata[key] = item
        for _ in range(tensor_count):
            name, pos = _string(data, pos, size)
            (dims,) = struct.unpack_from("<I", data, pos)
            _check_count(dims, 8, size - pos - 4, f"tensor {name!r}", "dimensions")
            shape = struct.unpack_from(f"<{dims}Q", data, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * dims)
            pos += 4 + 8 * dims + 12
            tensors[name] = TensorInfo(name, tuple(shape), ggml_type, offset)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        data_start = (pos + alignment - 1) // alignment * alignment
    return GgufFile(
        path=path,
        version=version,
        metadata=metadata,
        value_types=types,
        tensors=tensors,
        data_start=data_start,
        header_end=pos,
        array_lengths=lengths,
    )


def tensor_bytes(info: TensorInfo) -> int | None:
    """Bytes of one tensor's data, or None for a type this reader does not know."""
    if info.type not in TYPE_SIZES:
        return None
    block, size = TYPE_SIZES[info.type]
    count = 1
    for n in info.shape:
        count *= n
    return count // block * size


def gguf_damage(path: str | Path) -> str | None:
    """Why `path` cannot be a whole GGUF file, as a sentence about "it", or None when it can.

    Damaged: not GGUF at all, the file ends inside its header, or it is shorter than the data of the tensors the
    header lists (expected and actual size given). Tensors of a type this reader does not know are left out of
    the expected size, so a newer type never makes a good file look damaged.
    """
    path = Path(path)
    try:
        file = read_gguf(path, keys=set())
    except GgufDamaged as e:
        return e.reason
    vocabulary = _vocabulary_damage(file)
    if vocabulary:
        return vocabulary
    ends = [
        file.data_start + info.offset + n for info in file.tensors.values() if (n := tensor_bytes(info)) is not None
    ]
    expected, actual = max(ends, default=file.header_end), path.stat().st_size
    if actual < expected:
        return (
            f"it is cut short: it should have {expected:,} bytes (to the end of the last of the "
            f"{len(file.tensors)} tensors its header lists) but has {actual:,} ({expected - actual:,} missing)"
        )
    return None


def _vocabulary_damage(file: GgufFile) -> str | None:
    """Why the file's vocabulary cannot be a model's (too many tokens, or not one embedding row per token)."""
    tokens = file.array_lengths.get(VOCAB_KEY)
    if tokens is None:
        return None
    if tokens > MAX_VOCAB_TOKENS:
        return (
            f"its {VOCAB_KEY} lists {tokens:,} tokens, more than any model's vocabulary (Hone reads up to "
            f"{MAX_VOCAB_TOKENS:,}; the largest real ones have about 262,000)"
        )
    embedding = file.tensors.get(EMBEDDING_TENSOR)
    if embedding is None:
        if file.tensors:  # a file of tensors that embeds its tokens elsewhere is left to the loader
            return None
        return f"its {VOCAB_KEY} lists {tokens:,} tokens but it holds no tensors (no {EMBEDDING_TENSOR} to embed them)"
    rows = embedding.shape[1] if len(embedding.shape) > 1 else 0
    if tokens > rows:  # fewer tokens than rows is a padded table; more cannot be embedded
        return (
            f"its {VOCAB_KEY} lists {tokens:,} tokens but its {EMBEDDING_TENSOR} has {rows:,} rows (shape "
            f"{list(embedding.shape)}); a model has one row per token"
        )
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        count = file.array_lengths.get(key)
        if count is not None and count != tokens:
            return f"its {key} has {count:,} entries for the {tokens:,} tokens of its {VOCAB_KEY}"
    return None
