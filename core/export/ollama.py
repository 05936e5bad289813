"""`ollama`: a GGUF of the merged model plus a Modelfile (`ollama create NAME -f Modelfile`).

The Modelfile's TEMPLATE is the run's chat template rewritten in Ollama's Go template syntax, from the per-role
wrappers Hone learns by rendering the template (chat_layout.py). Templates that are not fixed per-message wrappers
(ChatML, Llama 3, Zephyr and most others are) get a clear error rather than a guess; a written TEMPLATE is rendered
back the way Ollama does and must produce exactly the original template's text. The Modelfile is written and read
back through modelfile.py (Ollama's quoting rules): every command read back must be the one meant, so nothing in a
run name, template or system prompt can add a command.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from hone.core.export.chat_layout import ROLES, ChatLayout, infer_layout, verify_layout
from hone.core.export.checks import CheckLog, quiet_transformers
from hone.core.export.formats import DEFAULT_GGUF_TYPE, ExportError, ExportResult, ExportSpec
from hone.core.export.gguf_model import gguf_steps, prepare, write_checked_gguf
from hone.core.export.go_template import GoTemplateError
from hone.core.export.go_template import render as render_go
from hone.core.export.modelfile import Command, ModelfileSyntaxError, differences, parse, render
from hone.core.export.source import Progress, Steps, finish, open_run, output_folder, staged

MODELFILE = "Modelfile"
# Ollama's context window when the Modelfile sets none is small; 4096 tokens fits a normal chat and keeps the KV
# cache modest on laptops. Capped at the model's own context length; edit num_ctx for long documents.
NUM_CTX = 4096
# generation_config.json field -> Ollama PARAMETER name
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "repetition_penalty": "repeat_penalty",
    "min_p": "min_p",
}


def go_template(layout: ChatLayout) -> str:
    """The layout as an Ollama template over .Messages (the last assistant message stays open, as Ollama's own
    templates do, so a partial answer can be continued)."""
    texts = [t for role in ROLES for t in layout.wrap[role]] + [layout.generation_prompt]
    if any("{{" in t or "}}" in t for t in texts):
        raise ExportError(
            "the chat template's text contains '{{' or '}}', which Ollama templates cannot hold",
            "export gguf and write the Ollama TEMPLATE by hand",
        )
    (sp, ss), (up, us), (ap, asuf) = (layout.wrap[r] for r in ROLES)
    return (
        "{{ range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}"
        f'{{{{ if eq .Role "system" }}}}{sp}{{{{ .Content }}}}{ss}'
        f'{{{{ else if eq .Role "user" }}}}{up}{{{{ .Content }}}}{us}'
        f'{{{{ else if eq .Role "assistant" }}}}{ap}{{{{ .Content }}}}{{{{ if not $last }}}}{asuf}{{{{ end }}}}'
        f'{{{{ end }}}}{{{{ if and $last (ne .Role "assistant") }}}}{layout.generation_prompt}{{{{ end }}}}'
        "{{ end }}"
    )


def stop_strings(layout: ChatLayout, tokenizer) -> list[str]:
    """Strings that end the assistant's turn: the turn-end token, special tokens that open a turn, EOS."""
    special = set(tokenizer.all_special_tokens) | {
        t.content for t in tokenizer.added_tokens_decoder.values() if t.special
    }
    stops = []
    if layout.turn_end:
        stops.append(layout.turn_end)
    for role in ROLES:
        prefix = layout.wrap[role][0]
        stops += sorted((t for t in special if t and t in prefix), key=prefix.index)
    if tokenizer.eos_token:
        stops.append(tokenizer.eos_token)
    return list(dict.fromkeys(s for s in stops if s.strip()))


def sampling_parameters(folder) -> dict[str, float]:
    """Sampling settings the base model ships in generation_config.json (only those it sets)."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(folder)
    except OSError:
        return {}
    diff = config.to_diff_dict()
    return {
        ollama: diff[hf]
        for hf, ollama in _SAMPLING.items()
        if isinstance(diff.get(hf), (int, float)) and not isinstance(diff[hf], bool) and math.isfinite(diff[hf])
    }


def modelfile_commands(gguf_name: str, layout: ChatLayout, stops: list[str], parameters: dict) -> list[Command]:
    """The commands the Modelfile is meant to hold: FROM the GGUF beside it, TEMPLATE (`go_template`), the
    template's default system prompt as SYSTEM (Ollama inserts it when a conversation has none), one stop PARAMETER
    per stop string (the text that ends an assistant turn, the special tokens that open a turn, EOS), then
    `parameters` (the context length and the base model's sampling defaults from generation_config.json)."""
    commands = [Command("model", f"./{gguf_name}"), Command("template", go_template(layout))]
    if layout.default_system is not None:
        commands.append(Command("system", layout.default_system))
    commands += [Command("stop", stop) for stop in stops]
    commands += [
        Command(name, repr(value) if isinstance(value, float) else str(value)) for name, value in parameters.items()
    ]
    return commands


def ollama_model_name(run_name: str) -> str:
    """A name `ollama create` takes for the run: lower-case letters, digits, '.', '_' and '-'."""
    return re.sub(r"[^a-z0-9._-]+", "-", run_name.lower()).strip("-._") or "hone-model"


def write_modelfile(path: Path, commands: list[Command], run_name: str) -> None:
    """Write `commands` with Ollama's quoting rules (modelfile.render) under two comment lines naming the run.

    Raises:
        ExportError: a value Ollama could not read back unchanged (one holding \"\"\", a character it drops).
    """
    comments = [
        f"Modelfile written by Hone Studio for run {run_name}.",
        f"Create the model: ollama create {ollama_model_name(run_name)} -f {MODELFILE}",
    ]
    path.write_text(render(commands, comments), encoding="utf-8")


def check_modelfile(
    folder: Path, gguf_path: Path, layout: ChatLayout, tokenizer, log: CheckLog, meant: list[Command]
) -> None:
    """Read the Modelfile back as Ollama does (modelfile.parse) and check it: the commands are exactly `meant`, in
    order (nothing added, dropped or changed); FROM names the GGUF beside it; the TEMPLATE, rendered the way Ollama
    does (Go text/template semantics, default system inserted, BOS added by llama.cpp), produces exactly the text
    the original template produces for several conversations; every stop string is one token of the vocabulary."""
    try:
        commands = parse((folder / MODELFILE).read_text(encoding="utf-8"))
        mismatches = differences(commands, meant)
    except ModelfileSyntaxError as e:
        commands, mismatches = [], [f"Ollama's parser refuses it {e}"]
    log.require(
        "ollama.commands", not mismatches, f"the Modelfile does not read back as written: {'; '.join(mismatches[:3])}"
    )

    def first(name: str, default=None):
        return next((c.args for c in commands if c.name == name), default)

    source = first("model", "")
    log.require(
        "ollama.from",
        (folder / source).resolve() == gguf_path.resolve() and gguf_path.is_file(),
        f"the Modelfile's FROM {source!r} does not name the GGUF beside it",
    )
    template = first("template", "")
    system = first("system")

    def ollama_render(messages):
        if system is not None and messages[0]["role"] != "system":  # what Ollama does with SYSTEM
            messages = [{"role": "system", "content": system}, *messages]
        data = {"Messages": [{"Role": m["role"], "Content": m["content"]} for m in messages], "System": system or ""}
        return layout.bos + render_go(template, data)  # llama.cpp adds BOS itself (add_bos_token)

    try:
        mismatches = verify_layout(layout, tokenizer, ollama_render)
    except GoTemplateError as e:
        mismatches = [f"the template does not render: {e}"]
    log.require(
        "ollama.template",
        not mismatches,
        f"the Ollama TEMPLATE renders differently from the chat template: {mismatches[:1]}",
    )
    stops = [c.args for c in commands if c.name == "stop"]
    vocab = tokenizer.get_vocab()
    log.require(
        "ollama.stop_tokens",
        bool(stops) and all(s in vocab for s in stops),
        f"stop strings that are not single tokens of the vocabulary: {[s for s in stops if s not in vocab]}",
    )
    log.note("ollama.stops", ", ".join(stops))


def export_ollama(
    run_dir, out=None, *, qtype: str | None = None, force: bool = False, progress: Progress | None = None
) -> ExportResult:
    """Write a GGUF of the merged model and an Ollama Modelfile beside it.

    Args:
        run_dir: a run folder with an adapter.
        out: output folder; default RUN_DIR/exports/ollama-<qtype>.
        qtype: GGUF type (see GGUF_TYPES); default q8_0.
        force: replace an existing output folder written by an earlier export.
        progress: called as progress(stage, fraction done).
    """
    spec = ExportSpec("ollama", qtype or DEFAULT_GGUF_TYPE)
    run = open_run(run_dir)
    out = output_folder(run, spec, out, force)
    prepared = prepare(run)
    tokenizer = prepared.tokenizer
    # Before anything loads: templates that cannot be rewritten, and texts a Modelfile cannot hold unchanged, raise.
    layout = infer_layout(tokenizer)
    render(modelfile_commands("model.gguf", layout, stop_strings(layout, tokenizer), {}))
    steps = Steps(progress, gguf_steps(run, spec.type, {"writing the Modelfile": 1}))
    log = CheckLog()
    with staged(out, run.run_dir) as folder, quiet_transformers():
        path, merged = write_checked_gguf(run, prepared, folder, spec.type, log, steps)
        steps.start("writing the Modelfile")
        parameters = sampling_parameters(merged.loaded.folder)
        context = int(getattr(merged.model.config, "max_position_embeddings", NUM_CTX) or NUM_CTX)
        parameters["num_ctx"] = min(NUM_CTX, context)
        commands = modelfile_commands(path.name, layout, stop_strings(layout, tokenizer), parameters)
        write_modelfile(folder / MODELFILE, commands, run.name)
        log.require(
            "ollama.bos",
            prepared.vocab.add_bos or not layout.bos,
            "the template writes BOS but the GGUF does not ask llama.cpp to add it",
        )
        check_modelfile(folder, path, layout, tokenizer, log, commands)
        result = finish(folder, out, run, spec, log)
    steps.done()
    return result
