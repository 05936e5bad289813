"""A small GGUF reader for the export checks: metadata, tensor infos and tensor values, straight from the file.

Written from the GGUF specification (header, key/values, tensor infos, aligned data), independent of the `gguf`
package's writer that produced the file, so a check that reads back what was written compares two
implementations. It is also fast: the package's reader builds an object per array element, which takes seconds
for a 50k-token vocabulary; this one decodes only the keys asked for.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32


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
    """Read a GGUF file's header. `keys`: the metadata values to decode (None = all; big arrays cost time)."""
    path = Path(path)

    def string(data, pos):
        (length,) = struct.unpack_from("<Q", data, pos)
        return bytes(data[pos + 8:pos + 8 + length]).decode("utf-8"), pos + 8 + length

    def value(data, pos, vtype, keep):
        if vtype == _STRING:
            return string(data, pos)
        if vtype == _ARRAY:
            etype, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if etype in _SCALARS and not keep:
                return None, pos + count * struct.calcsize(_SCALARS[etype])
            items = []
            for _ in range(count):
                item, pos = value(data, pos, etype, keep)
                items.append(item)
            return (items if keep else None), pos
        fmt = "<" + _SCALARS[vtype]
        return struct.unpack_from(fmt, data, pos)[0], pos + struct.calcsize(fmt)

    metadata, types, tensors = {}, {}, {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", data, 4)
        pos = 24
        for _ in range(kv_count):
            key, pos = string(data, pos)
            (vtype,) = struct.unpack_from("<I", data, pos)
            keep = keys is None or key in keys or key == "general.alignment"
            item, pos = value(data, pos + 4, vtype, keep)
            types[key] = vtype
            if keep:
                metadata[key] = item
        for _ in range(tensor_count):
            name, pos = string(data, pos)
            (dims,) = struct.unpack_from("<I", data, pos)
            shape = struct.unpack_from(f"<{dims}Q", data, pos + 4)
            ggml_type, offset = struct.unpack_from("<IQ", data, pos + 4 + 8 * dims)
            pos += 4 + 8 * dims + 12
            tensors[name] = TensorInfo(name, tuple(shape), ggml_type, offset)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        data_start = (pos + alignment - 1) // alignment * alignment
    return GgufFile(path=path, version=version, metadata=metadata, value_types=types, tensors=tensors,
                    data_start=data_start)
