"""Files from the Hub (or a user) built to hang or exhaust memory without running code: a tokenizer.json whose
pre-tokenizer regex backtracks, chat templates that loop or multiply strings, a GGUF listing 2 million empty tokens,
and a FIFO or a device where a file belongs. Each costs seconds and little memory: a bad row is skipped with its
reason, a bad template or file stops the check once with a message naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from hone.core.config import DataConfig, RunConfig
from hone.core.data import check_data
from hone.core.data.template import ChatTemplate, template_setting_source
from hone.core.errors import DataError
from tests.core.data.conftest import LLAMA3_TEMPLATE

GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
PANICS = "a" * 40 + "b"  # 41 characters: past Onig's retry limit for (a+)+$
# 300 words of 22 a's and a b (6,899 characters): each word stays under the retry limit but costs ~0.1 s.
SLOW = " ".join("a" * 22 + "b" for _ in range(300))
# Probes run in a child process under this address-space limit: transformers and jinja2 fit in well under 1.5 GB,
# while the faults before the fix peaked at 3.5-6.6 GB.
MEMORY_LIMIT = 3 << 30


def _row(answer: str) -> dict:
    return {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer}]}


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HONE_CACHE", str(tmp_path / "hone-cache"))


@pytest.fixture
def hostile_tokenizer_dir(tmp_path):
    """A real tokenizers WordLevel tokenizer whose pre-tokenizer splits on whitespace and then on `(a+)+$`, saved
    as transformers saves any fast tokenizer, with a plain chat template."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>", "user", "assistant", ":", "Hi", "Hello", "a", "b"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("(a+)+$"), behavior="isolated")]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos>\n{% endfor %}"
    folder = tmp_path / "hostile-tokenizer"
    fast.save_pretrained(folder)
    return folder


def test_rows_the_tokenizer_panics_or_crawls_on_are_skipped_in_seconds(tmp_path, hostile_tokenizer_dir):
    """Before: the 41-character row raised PanicException out of the check; the 7 KB row took 34 s."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hostile_tokenizer_dir)
    path = _write_rows(tmp_path / "d.jsonl", [GOOD, _row(PANICS), _row(SLOW), _row("Hello a b")])
    start = time.monotonic()
    report, data = check_data(DataConfig(train=[str(path)]), tokenizer)
    elapsed = time.monotonic() - start

    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert (report.rows_read, report.rows_kept) == (4, 2)
    assert report.skipped == {"tokenizer error": 1, "too slow to tokenize": 1}
    limit = 3.0 + 1e-5 * len(SLOW)  # ROW_TIME_BASE_S + ROW_TIME_PER_CHAR_S per character of the row
    assert report.skipped_examples == [
        f"{path}:2: the tokenizer failed on this row (Onig: Regex search error: retry-limit-in-match over)",
        f"{path}:3: took over {limit:.1f} s to tokenize (the tokenizer's rules are too slow on its text); it was "
        "skipped: shorten or remove it",
    ]
    # The kept rows are tokenized as the tokenizer itself tokenizes their rendered text.
    expected = [
        tokenizer(tokenizer.apply_chat_template(r["messages"], tokenize=False), add_special_tokens=False)["input_ids"]
        for r in (GOOD, _row("Hello a b"))
    ]
    assert (
        [list(map(int, row.input_ids)) for row in data]
        == expected
        == [[2, 4, 5, 1, 3, 4, 6, 1], [*[2, 4, 5, 1], *[3, 4, 6, 7, 8, 1]]]
    )


def test_hone_data_check_lists_the_panicking_row_instead_of_crashing(tmp_path, hostile_tokenizer_dir):
    path = _write_rows(tmp_path / "d.jsonl", [GOOD, _row(PANICS)])
    out = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", "data", "check", str(path), "--model", str(hostile_tokenizer_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "RUST_BACKTRACE": "0"},
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr and "PanicException" not in out.stdout + out.stderr
    assert f"{path}:2: the tokenizer failed on this row (Onig: Regex search error" in out.stdout


# Runs check_data on a template under an address-space limit and prints what it ended with, and how fast.
_TEMPLATE_PROBE = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[4]), int(sys.argv[4])))
    from transformers import AutoTokenizer
    from hone.core.config import DataConfig
    from hone.core.data import check_data
    from hone.core.errors import DataError

    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    tokenizer.chat_template = open(sys.argv[2]).read()
    start = time.monotonic()
    try:
        check_data(DataConfig(train=[sys.argv[3]]), tokenizer)
        result = {"ended": "finished"}
    except DataError as e:
        result = {"ended": "DataError", "message": e.message, "advice": e.advice}
    result["seconds"] = time.monotonic() - start
    print(json.dumps(result))
""")


@pytest.mark.parametrize(
    "template, words",
    [
        ("{{ 'A' * 2**31 }}", "repeats a value of 1 characters or items 2,147,483,648 times, over the"),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "took over 1 s to render one conversation",
        ),
        ("{{ '%2000000000s' % 'a' }}", "formats with a width of 2000000000"),
        ("{{ 'a'|center(2000000000) }}", "asked for a size of 2,000,000,000"),
        (
            "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
            "made a value of 2,097,152 characters or items",
        ),
    ],
)
def test_a_template_over_its_limits_stops_the_check_once_in_bounded_time_and_memory(
    tmp_path, smollm2_tokenizer_dir, template, words
):
    """Before: the nested loops hung the check; 'A' * 2**31 peaked at 6.6 GB."""
    data = _write_rows(tmp_path / "d.jsonl", [GOOD] * 50)
    (tmp_path / "t.jinja").write_text(template, encoding="utf-8")
    (tmp_path / "probe.py").write_text(_TEMPLATE_PROBE, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "probe.py", str(smollm2_tokenizer_dir), "t.jinja", str(data), str(MEMORY_LIMIT)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ended"] == "DataError", result
    assert result["message"].startswith(f"the chat template {words}"), result
    assert result["message"].endswith(
        f"(on {data}:1); a template over Hone's limits is stopped rather than run on every row"
    )
    assert "set data.chat_template to a template file you trust" in result["advice"]
    assert result["seconds"] < 5, result


# A Qwen3-style template, written here after the published one: a namespace, a reversed scan for the last user
# query, reasoning split off earlier turns, tojson of tool calls.
QWEN3_STYLE = (
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{%- set content = message.content %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- if message.tool_calls %}{{- '\\n<tool_call>\\n' + message.tool_calls|tojson + '\\n</tool_call>' }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize("which", ["smollm2", "llama3", "qwen3"])
def test_bounded_rendering_is_transformers_rendering_byte_for_byte(smollm2_tokenizer_dir, which):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    if which != "smollm2":
        tokenizer.chat_template = LLAMA3_TEMPLATE if which == "llama3" else QWEN3_STYLE
    conversation = [
        {"role": "system", "content": "You are terse. 100% sure, {braces} and %s stay as they are."},
        {"role": "user", "content": "  Résumé of 'A' * 3?  "},
        {"role": "assistant", "content": "<think>\nlong\n</think>\n\nAAA"},
        {"role": "user", "content": "And " * 500},
        {"role": "assistant", "content": "Done.\n"},
    ]
    template = ChatTemplate.for_tokenizer(tokenizer)
    for n in range(1, len(conversation) + 1):
        for prompt in (False, True):
            expected = tokenizer.apply_chat_template(conversation[:n], tokenize=False, add_generation_prompt=prompt)
            assert template.render(conversation[:n], add_generation_prompt=prompt) == expected


_GGUF_PROBE = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
    start = time.monotonic()
    from hone.core.models.load import check_gguf_whole
    from hone.core.errors import ModelError
    try:
        check_gguf_whole(__import__("pathlib").Path(sys.argv[1]))
        result = {"ended": "accepted"}
    except ModelError as e:
        result = {"ended": "ModelError", "message": e.message}
    result["seconds"] = time.monotonic() - start
    print(json.dumps(result))
""")


def _gguf(path, tokens: int, *, kv_count: int | None = None, array_count: int | None = None):
    """A GGUF v3 file written by hand: no tensors, an architecture, and a vocabulary of `tokens` empty strings
    (with the header's counts replaceable by lies)."""
    import struct

    def string(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    kvs = [
        string(b"general.architecture") + struct.pack("<I", 8) + string(b"llama"),
        string(b"tokenizer.ggml.model") + struct.pack("<I", 8) + string(b"llama"),
        string(b"tokenizer.ggml.tokens")
        + struct.pack("<IIQ", 9, 8, tokens if array_count is None else array_count)
        + b"\0" * 8 * tokens,
    ]
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs) if kv_count is None else kv_count)
    path.write_bytes(header + b"".join(kvs))
    return path


@pytest.mark.parametrize(
    "tokens, lies, words",
    [
        (
            2_000_000,
            {},
            "its tokenizer.ggml.tokens lists 2,000,000 tokens, more than any model's vocabulary (Hone reads up to "
            "1,048,576",
        ),
        (1000, {}, "its tokenizer.ggml.tokens lists 1,000 tokens but it holds no tensors (no token_embd.weight"),
        (
            1000,
            {"kv_count": 1 << 60},
            f"the header says it has {1 << 60:,} key/values, which need at least {13 << 60:,} bytes, but only",
        ),
        (
            1000,
            {"array_count": 1 << 40},
            f"says it has {1 << 40:,} items, which need at least {8 << 40:,} bytes, but only",
        ),
    ],
)
def test_a_gguf_whose_counts_cannot_be_true_is_refused_in_milliseconds(tmp_path, tokens, lies, words):
    """Before: 2 million empty tokens (a 16 MB file) took 54-80 s and 3.45 GB before failing in transformers."""
    path = _gguf(tmp_path / "vocab.gguf", tokens, **lies)
    (tmp_path / "probe.py").write_text(_GGUF_PROBE, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "probe.py", str(path), str(1 << 30)], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ended"] == "ModelError" and result["message"].startswith(f"{path} is damaged: "), result
    assert words in result["message"], result
    assert result["seconds"] < 2, result


@pytest.fixture
def odd_files(tmp_path):
    fifo = tmp_path / "template.fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.jinja"
    big.write_text("x" * ((1 << 20) + 1), encoding="utf-8")
    return fifo, big


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")
def test_a_fifo_a_device_or_a_huge_file_as_chat_template_is_refused_without_reading_it(tmp_path, odd_files):
    """Before: a FIFO hung the check (waiting for a writer); /dev/zero ended in a MemoryError traceback."""
    from hone.core.train.input_checks import check_inputs

    fifo, big = odd_files
    expected = {
        str(fifo): f"data.chat_template: {str(fifo)!r} is a FIFO (named pipe), not a template file",
        "/dev/zero": "data.chat_template: '/dev/zero' is a character device, not a template file",
        str(tmp_path): f"data.chat_template: {str(tmp_path)!r} is a folder, not a template file",
        str(big): f"data.chat_template: {str(big)!r} has 1,048,577 bytes; a chat template has a few KB (Hone reads "
        "up to 1,048,576)",
        str(tmp_path / "none.jinja"): f"data.chat_template: no file {str(tmp_path / 'none.jinja')!r}",
    }
    data = _write_rows(tmp_path / "d.jsonl", [GOOD])
    for setting, message in expected.items():
        start = time.monotonic()
        with pytest.raises(DataError) as e:
            template_setting_source(setting)
        missing = f"data.chat_template: cannot read {setting!r} (No such file or directory)"
        assert e.value.message == (missing if setting.endswith("none.jinja") else message)
        config = RunConfig()
        config.model.name_or_path = "bundled:smollm2-135m-instruct"
        config.data.train, config.data.chat_template = [str(data)], setting
        with pytest.raises(DataError) as e:
            check_inputs(config)
        assert e.value.message == message and e.value.advice.endswith("(--set data.chat_template=...)")
        assert time.monotonic() - start < 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")
def test_a_fifo_or_a_device_as_data_file_is_refused_by_what_it_is(tmp_path):
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    for entry, what in ((fifo, "a FIFO (named pipe)"), ("/dev/zero", "a character device")):
        report, _ = check_data(DataConfig(train=[str(entry)]))
        assert report.problems == [f"{entry} is {what}, not a data file or a folder"]


def test_resource_limit_in_probes_is_real():
    """The probes' RLIMIT_AS bound is what makes their memory assertions mean something: a child asking for more
    than the limit fails."""
    code = (
        f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT})); b'A' * (4 << 30)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "MemoryError" in out.stderr
