"""Format strings: what is accepted, and the errors that list what is supported."""

from __future__ import annotations

import pytest

from hone.core.export import (
    FORMAT_TYPES,
    GGUF_TYPES,
    SUPPORTED_FORMATS,
    ExportError,
    ExportSpec,
    export_run,
    parse_format,
)


@pytest.mark.parametrize(
    "text, spec",
    [
        ("adapter", ExportSpec("adapter")),
        ("merged", ExportSpec("merged")),
        ("merged:f16", ExportSpec("merged", "f16")),
        ("GGUF:Q8_0", ExportSpec("gguf", "q8_0")),
        ("gguf", ExportSpec("gguf")),
        ("gguf-lora:bf16", ExportSpec("gguf-lora", "bf16")),
        ("ollama:q4_0", ExportSpec("ollama", "q4_0")),
    ],
)
def test_accepted_formats(text, spec):
    assert parse_format(text) == spec


def test_every_format_and_type_is_described():
    assert set(SUPPORTED_FORMATS) == set(FORMAT_TYPES) == {"adapter", "merged", "gguf", "gguf-lora", "ollama"}
    assert {"f32", "f16", "bf16", "q8_0", "q4_0"} <= set(GGUF_TYPES)
    assert all(text for types in FORMAT_TYPES.values() for text in types.values())


@pytest.mark.parametrize(
    "text, words",
    [
        ("safetensors", ["unknown export format", "adapter, merged, gguf, gguf-lora, ollama"]),
        ("gguf:q4_k_m", ["cannot be written as 'q4_k_m'", "q8_0", "llama-quantize"]),
        ("gguf:q3", ["cannot be written as 'q3'", "f32, f16, bf16, q8_0"]),
        ("adapter:f16", ["takes no type"]),
        ("merged:q8_0", ["bf16, f16"]),
    ],
)
def test_bad_formats_say_what_is_supported(text, words):
    with pytest.raises(ExportError) as e:
        parse_format(text)
    message = str(e.value)
    assert all(w in message for w in words), message


def test_export_run_rejects_a_bad_format_before_touching_the_run(tmp_path):
    with pytest.raises(ExportError, match="unknown export format"):
        export_run(tmp_path / "does-not-exist", "onnx")
