"""Ollama export: the Modelfile as written, its template rendered with Go semantics against the original Jinja
template, stop tokens, parameters, and templates it cannot express."""

from __future__ import annotations

import sys

import pytest
from export_helpers import LLAMA2, ZEPHYR, write_run

from hone.core.export import ExportError, export_run
from hone.core.export.go_template import render
from hone.core.export.modelfile import Command, parse

CHATML_MODELFILE = '''# Modelfile written by Hone Studio for run run.
# Create the model: ollama create run -f Modelfile
FROM ./run-q8_0.gguf
TEMPLATE """{{ range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}\
{{ if eq .Role "system" }}<|im_start|>system
{{ .Content }}<|im_end|>
{{ else if eq .Role "user" }}<|im_start|>user
{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ .Content }}{{ if not $last }}<|im_end|>
{{ end }}{{ end }}{{ if and $last (ne .Role "assistant") }}<|im_start|>assistant
{{ end }}{{ end }}"""
SYSTEM """You are a helpful assistant."""
PARAMETER stop "<|im_end|>"
PARAMETER stop "<|im_start|>"
PARAMETER num_ctx 4096
'''


def test_chatml_modelfile(make_run, tmp_path):
    from transformers import AutoTokenizer

    run = make_run("tiny-dense")
    result = export_run(run, "ollama", tmp_path / "ollama")
    assert result.passed, result.failures
    assert {p.name for p in result.files} == {"Modelfile", "run-q8_0.gguf", "export.json"}
    text = (result.path / "Modelfile").read_text()
    assert text == CHATML_MODELFILE
    template = next(c.args for c in parse(text) if c.name == "template")
    tokenizer = AutoTokenizer.from_pretrained(run / "adapter")
    talk = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi\nthere"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    go = render(template, {"Messages": [{"Role": m["role"], "Content": m["content"]} for m in talk]})
    assert go == tokenizer.apply_chat_template(talk, tokenize=False, add_generation_prompt=True)
    for check in ("ollama.commands", "ollama.template", "ollama.stop_tokens", "ollama.from", "gguf.tokenizer.encoding"):
        assert result.checks[check] == "ok"


def test_a_non_chatml_template_is_rewritten_too(base_model_dir, tmp_path):
    """Zephyr-style: roles as <|user|> tags, EOS ending each turn, no default system prompt."""
    from transformers import AutoTokenizer

    folder = base_model_dir("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = ZEPHYR
    run = tmp_path / "zephyr-run"
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    write_run(run, str(folder), model=model, tokenizer=tokenizer)
    result = export_run(run, "ollama:f16", tmp_path / "ollama")
    assert result.passed, result.failures
    commands = parse((result.path / "Modelfile").read_text())
    assert [c.name for c in commands] == ["model", "template", "stop", "num_ctx"]  # no SYSTEM
    assert '{{ else if eq .Role "user" }}<|user|>\n{{ .Content }}<|im_end|>\n' in commands[1].args
    assert commands[2:] == [Command("stop", "<|im_end|>"), Command("num_ctx", "4096")]


def test_a_template_ollama_cannot_express_is_refused_before_any_work(base_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = base_model_dir("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = LLAMA2
    run = write_run(
        tmp_path / "llama2-run",
        str(folder),
        tokenizer=tokenizer,
        model=AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
    )
    with pytest.raises(ExportError) as e:
        export_run(run, "ollama", tmp_path / "ollama")
    assert "message" in e.value.message and "fixed text" in e.value.advice
    assert not (tmp_path / "ollama").exists()


@pytest.mark.skipif(sys.platform == "win32", reason="Windows folder names cannot hold line ends")
def test_a_run_name_with_line_ends_adds_no_command_to_the_modelfile(make_run, tmp_path):
    """A run folder named "run\\nPARAMETER temperature 99\\nMESSAGE user hi" (one written before names were checked,
    or renamed by hand): the name stays inside its comment, and the Modelfile reads back as the plain run's does."""
    import shutil

    evil = shutil.copytree(make_run("tiny-dense"), tmp_path / "run\nPARAMETER temperature 99\nMESSAGE user hi")
    result = export_run(evil, "ollama", tmp_path / "ollama")
    assert result.passed, result.failures
    assert result.checks["ollama.commands"] == "ok"
    text = (result.path / "Modelfile").read_text()
    assert text.splitlines()[0] == (
        "# Modelfile written by Hone Studio for run run\\nPARAMETER temperature 99\\nMESSAGE user hi."
    )
    gguf = "run-PARAMETER-temperature-99-MESSAGE-user-hi-q8_0.gguf"
    assert parse(text) == parse(CHATML_MODELFILE.replace("run-q8_0.gguf", gguf))
