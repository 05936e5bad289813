"""The Modelfile as Ollama reads it: the parser against Ollama's own test cases, values written so that they read
back unchanged (or refused), run names that cannot add commands, and the export check that compares every command
read back with the one meant."""

from __future__ import annotations

import pytest

from hone.core.export import ExportError
from hone.core.export.checks import CheckLog
from hone.core.export.modelfile import Command, ModelfileSyntaxError, differences, parse, quoted, render

C = Command
LLAMA3_TEMPLATE = "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
# Inputs and the commands Ollama's parser reads from them, from ollama/parser/parser_test.go (TestParseFileFile,
# TestParseFileTrimSpace, TestParseFileFrom, TestParseFileMessages, TestParseFileQuoted, TestParseFileParameters).
OLLAMA_CASES = [
    (
        '\nFROM model1\nADAPTER adapter1\nLICENSE MIT\nPARAMETER param1 value1\nTEMPLATE """'
        + LLAMA3_TEMPLATE
        + '"""    \n',
        [
            C("model", "model1"),
            C("adapter", "adapter1"),
            C("license", "MIT"),
            C("param1", "value1"),
            C("template", LLAMA3_TEMPLATE),
        ],
    ),
    (
        '\nFROM "     model 1"\nADAPTER      adapter3\nLICENSE "MIT       "\nPARAMETER param1        value1\n',
        [C("model", "     model 1"), C("adapter", "adapter3"), C("license", "MIT       "), C("param1", "value1")],
    ),
    ('FROM "FOO  BAR  "', [C("model", "FOO  BAR  ")]),
    ("FROM     FOOO BAR    ", [C("model", "FOOO BAR")]),
    ("FROM /what/is/the path ", [C("model", "/what/is/the path")]),
    ("PARAMETER what the \nFROM lemons make lemonade ", [C("what", "the"), C("model", "lemons make lemonade")]),
    (
        '\nFROM foo\nMESSAGE system """\nYou are a multiline file parser. Always parse things.\n"""\n\t\t\t',
        [C("model", "foo"), C("message", "system: \nYou are a multiline file parser. Always parse things.\n")],
    ),
    (
        '\nFROM foo\nSYSTEM """\nThis is a\nmultiline system."""\n\t\t\t',
        [C("model", "foo"), C("system", "\nThis is a\nmultiline system.")],
    ),
    (
        '\nFROM foo\nSYSTEM """\nThis is a multiline system with "quotes".\n"""\n',
        [C("model", "foo"), C("system", '\nThis is a multiline system with "quotes".\n')],
    ),
    ('\nFROM foo\nSYSTEM """"""\n', [C("model", "foo"), C("system", "")]),
    ('\nFROM foo\nSYSTEM ""\n', [C("model", "foo"), C("system", "")]),
    (
        '\nFROM foo\nSYSTEM """\'\'"\'""\'""\'"\'\'\'\'\'""\'""\'"""\n',
        [C("model", "foo"), C("system", "''\"'\"\"'\"\"'\"'''''\"\"'\"\"'")],
    ),
    ("FROM foo\nPARAMETER stop ### User: \n", [C("model", "foo"), C("stop", "### User:")]),
    ('FROM foo\nPARAMETER stop "### User: "\n', [C("model", "foo"), C("stop", "### User: ")]),
    ('FROM foo\nPARAMETER stop """### User:\n"""\n', [C("model", "foo"), C("stop", "### User:\n")]),
]
OLLAMA_ERRORS = [
    "",
    "PARAMETER param1 value1",
    "\nFROM foo\nPARAMETER param1\n",
    "\nFROM foo\nBADCOMMAND param1 value1\n",
    "\nFROM foo\nMESSAGE badguy I'm a bad guy!\n",
    "\nFROM foo\nMESSAGE system\n",
    "\nFROM foo\nMESSAGE system",
    '\nFROM foo\nSYSTEM """This is a multiline system.""\n\t\t\t',
    '\nFROM foo\nSYSTEM "\n\t\t\t',
]


@pytest.mark.parametrize("text, commands", OLLAMA_CASES)
def test_the_parser_reads_what_ollamas_parser_reads(text, commands):
    assert parse(text) == commands


@pytest.mark.parametrize("text", OLLAMA_ERRORS, ids=repr)
def test_the_parser_refuses_what_ollamas_parser_refuses(text):
    with pytest.raises(ModelfileSyntaxError):
        parse(text)


INJECTION = "Be brief.\nPARAMETER temperature 99\nMESSAGE user hi\nFROM ./evil.gguf\n# not a comment"
HOSTILE_VALUES = [
    INJECTION,
    '"quoted at both ends"',
    '"',
    '""',
    'ends with two quotes ""',
    "  leading and trailing  ",
    "tabs\tand\r\nwindows line ends",
    "# looks like a comment",
    "",
    "日本語 and émojis 🎉",
    'a "quote" then\n" after a line end',
    'x""\nafter two quotes',
]


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=repr)
def test_every_text_value_reads_back_exactly_as_written(value):
    commands = [
        C("model", "./run-q8_0.gguf"),
        C("template", value),
        C("system", value),
        C("stop", value),
        C("message", f"user: {value}"),
        C("num_ctx", "4096"),
    ]
    assert parse(render(commands)) == commands


def test_a_run_name_with_line_ends_stays_inside_its_comment():
    commands = [C("model", "./run.gguf"), C("stop", "<|im_end|>")]
    name = "evil\nPARAMETER temperature 99\rMESSAGE user hi\u2028SYSTEM x"
    text = render(commands, [f"Modelfile written for run {name}."])
    assert parse(text) == commands
    assert (
        text.splitlines()[0] == "# Modelfile written for run evil\\nPARAMETER temperature 99\\rMESSAGE user hi"
        "\\u2028SYSTEM x."
    )


@pytest.mark.parametrize(
    "value, words",
    [
        ('ends """ early', '"""'),
        ("zero\u200bwidth", "U+200B"),
        ("nul\x00", "U+0000"),
        ("escape\x1b[31m", "U+001B"),
    ],
)
def test_a_value_ollama_would_read_differently_is_refused(value, words):
    with pytest.raises(ExportError) as e:
        quoted(value, "the system prompt", block=True)
    assert "the system prompt" in e.value.message and words in e.value.message
    assert "by hand" in e.value.advice


def test_differences_name_the_injected_dropped_and_changed_commands():
    meant = [C("model", "./a.gguf"), C("stop", "<|im_end|>"), C("num_ctx", "4096")]
    assert differences(meant, meant) == []
    injected = parse("FROM ./a.gguf\nPARAMETER stop <|im_end|>\nPARAMETER temperature 99\nPARAMETER num_ctx 4096\n")
    assert differences(injected, meant) == [
        "command 3 reads as PARAMETER temperature '99', meant PARAMETER num_ctx '4096'",
        "command 4 is an extra PARAMETER num_ctx '4096'",
    ]
    assert differences(meant[:2], meant) == ["command 3 (PARAMETER num_ctx) is missing"]


@pytest.fixture
def chatml(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from hone.core.export.chat_layout import infer_layout

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    return tokenizer, infer_layout(tokenizer)


def test_the_export_check_fails_when_the_modelfile_holds_other_commands(chatml, tmp_path):
    from hone.core.export.ollama import MODELFILE, check_modelfile, modelfile_commands, stop_strings, write_modelfile

    tokenizer, layout = chatml
    gguf = tmp_path / "run-q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    meant = modelfile_commands(gguf.name, layout, stop_strings(layout, tokenizer), {"num_ctx": 4096})
    write_modelfile(tmp_path / MODELFILE, meant, "run\nPARAMETER temperature 99\nMESSAGE user hi")
    log = CheckLog()
    check_modelfile(tmp_path, gguf, layout, tokenizer, log, meant)
    assert log.passed, log.failures
    assert log.checks["ollama.commands"] == "ok"
    assert "temperature" not in [c.name for c in parse((tmp_path / MODELFILE).read_text())]

    text = (tmp_path / MODELFILE).read_text()
    (tmp_path / MODELFILE).write_text(text + "PARAMETER temperature 99\n")
    log = CheckLog()
    check_modelfile(tmp_path, gguf, layout, tokenizer, log, meant)
    assert not log.passed
    assert log.checks["ollama.commands"] == (
        "FAILED: the Modelfile does not read back as written: "
        f"command {len(meant) + 1} is an extra PARAMETER temperature '99'"
    )

    (tmp_path / MODELFILE).write_text(text.replace('"<|im_start|>"', '"<|im_start|>x"'))
    log = CheckLog()
    check_modelfile(tmp_path, gguf, layout, tokenizer, log, meant)
    assert "meant PARAMETER stop '<|im_start|>'" in log.checks["ollama.commands"]
