"""`hone export`: the command prints the checks, returns 0 when they pass and 2 for user mistakes."""

from __future__ import annotations

import pytest

from hone.core.cli import main


def test_hone_export_gguf_lora(make_run, tmp_path, capsys):
    out = tmp_path / "lora"
    assert main(["export", str(make_run("tiny-llama")), "--format", "gguf-lora", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "gguf_lora.delta.max_rel_diff" in err and "all checks passed" in err
    assert (out / "run-lora-f32.gguf").is_file()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--format", "gguf:q4_k_m"], "llama-quantize"),
        (["--format", "onnx"], "unknown export format"),
    ],
)
def test_hone_export_mistakes_are_one_line(make_run, capsys, args, words):
    assert main(["export", str(make_run("tiny-llama")), *args]) == 2
    assert words in capsys.readouterr().err


def test_hone_export_help_lists_formats_and_types(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = capsys.readouterr().out
    assert all(w in out for w in ("adapter", "merged", "gguf-lora", "ollama", "q8_0", "--force"))
