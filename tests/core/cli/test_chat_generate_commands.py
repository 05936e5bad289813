"""`hone chat` and `hone generate` against a real run folder: a tiny random-init model trained a few steps on the CPU,
driven as users drive them (a `hone` subprocess, stdin a pipe), replies checked against plain transformers + peft
greedy decoding with the chat template the run saved."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from hone.core.inference.chat import CHAT_REPETITION_PENALTY
from hone.core.inference.prompts import read_prompts

# As in test_command_input_checks: a mistake found before torch loads answers in well under this.
FAST_S = 6.0
MAX_NEW = 12
# The run's own template (what `data.chat_template` would save with the adapter): ChatML without SmolLM2's default
# system message, so a prompt rendered with the base model's template differs from one rendered with the run's.
RUN_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
Q1, Q2, Q3 = "What is 7 + 5?", "And 2 + 2?", "Name a colour."


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, chat_files, tmp_path_factory):
    """A finished run folder (tiny Qwen3, 4 CPU steps at a high learning rate so the adapter changes greedy replies),
    its adapter's tokenizer given RUN_TEMPLATE."""
    from transformers import AutoTokenizer

    from hone.core import events
    from hone.core.config import RunConfig
    from hone.core.train.trainer import Trainer

    train, eval_file = chat_files
    runs = tmp_path_factory.mktemp("runs")
    config = RunConfig().with_overrides(
        [
            f"model.name_or_path={json.dumps(str(tiny_model_dir('tiny-dense')))}",
            f"data.train=[{json.dumps(str(train))}]",
            f"data.eval=[{json.dumps(str(eval_file))}]",
            f"output.runs_dir={json.dumps(str(runs))}",
            "output.name=r",
            "data.max_length=256",
            "train.batch_tokens=256",
            "train.max_steps=4",
            "train.lr=2e-2",
            "train.warmup_steps=1",
        ]
    )
    last = list(Trainer(config, device="cpu").run())[-1]
    assert isinstance(last, events.RunFinished), last
    adapter = runs / "r" / "adapter"
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    tokenizer.chat_template = RUN_TEMPLATE
    tokenizer.save_pretrained(adapter)
    return runs / "r"


@pytest.fixture(scope="module")
def reference(run_dir):
    """reference(messages, adapter=True, template=RUN_TEMPLATE, penalty=CHAT) -> the greedy reply of plain
    transformers + peft, with `hone chat`'s default repetition penalty (`hone eval` scores with none: penalty=1)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hone.core.config import RunConfig

    base_dir = RunConfig.load(run_dir / "config.toml").model.name_or_path
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), run_dir / "adapter"
    ).eval()
    stop = sorted(
        {
            tokenizer.eos_token_id,
            *(
                [base.generation_config.eos_token_id]
                if isinstance(base.generation_config.eos_token_id, int)
                else base.generation_config.eos_token_id or []
            ),
        }
    )

    def reply(messages, adapter=True, template=RUN_TEMPLATE, penalty=CHAT_REPETITION_PENALTY):
        model = tuned if adapter else base
        prompt = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=template
        )
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                repetition_penalty=penalty,
                eos_token_id=stop,
                pad_token_id=tokenizer.eos_token_id,
            )
        return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    reply.base_template = AutoTokenizer.from_pretrained(base_dir).chat_template
    return reply


def _hone(cwd, *argv, stdin: bytes = b""):
    """Run `python -m hone.core.cli ARGV` with `stdin` piped in; stdout as bytes (a reply may hold a bare \\r)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", *argv], input=stdin, capture_output=True, cwd=cwd, env=env, timeout=300
    )
    return out, time.monotonic() - start


def _user(*turns):
    """[user, assistant, user, ...] messages from alternating texts."""
    return [{"role": ("user", "assistant")[k % 2], "content": text} for k, text in enumerate(turns)]


@pytest.mark.slow
def test_chat_through_a_pipe_keeps_the_conversation_and_uses_the_runs_template(run_dir, reference, tmp_path):
    r1 = reference(_user(Q1))
    r2 = reference(_user(Q1, r1, Q2))
    # The run's template matters: the base's own template gives another reply (else this test could not tell).
    assert reference(_user(Q1), template=reference.base_template) != r1
    assert r2 != reference(_user(Q2)), "the second reply must depend on the first turn"
    lines = f"{Q1}\n\n{Q2}\n/reset\n{Q1}\n/exit\n{Q3}\n"
    out, _ = _hone(tmp_path, "chat", str(run_dir), "--max-new-tokens", str(MAX_NEW), stdin=lines.encode())
    assert out.returncode == 0, out.stderr.decode()
    # One reply per non-empty line, nothing else on stdout; /reset forgets Q1, /exit ends before Q3.
    assert out.stdout.decode("utf-8") == f"{r1}\n{r2}\n{r1}\n"
    assert b"Traceback" not in out.stderr


@pytest.mark.slow
def test_chat_base_answers_without_the_adapter_until_end_of_input(run_dir, reference, tmp_path):
    base = reference(_user(Q3), adapter=False)
    assert base != reference(_user(Q3)), "the trained adapter must change the reply, else --base is untested"
    out, _ = _hone(
        tmp_path, "chat", str(run_dir), "--base", "--max-new-tokens", str(MAX_NEW), stdin=f"{Q3}\n".encode()
    )  # no /exit: end of input ends the chat
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode("utf-8") == f"{base}\n"


@pytest.mark.slow
def test_generate_answers_jsonl_prompts_in_order_and_counts_skipped_rows(run_dir, reference, tmp_path):
    rows = [
        json.dumps({"prompt": Q1}),
        json.dumps({"messages": [*_user(Q1, "12", Q2), {"role": "assistant", "content": "4"}]}),
        "{not json",
        json.dumps({"question": Q3}),
        "",
        json.dumps({"prompt": Q3, "completion": "red"}),
        json.dumps({"messages": _user(Q1, "12")[1:]}),
    ]  # an assistant turn only: nothing to answer
    (tmp_path / "prompts.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out, _ = _hone(
        tmp_path,
        "generate",
        str(run_dir),
        "--prompts",
        "prompts.jsonl",
        "--out",
        "out.jsonl",
        "--max-new-tokens",
        str(MAX_NEW),
    )
    err = out.stderr.decode()
    assert out.returncode == 0, err
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert got == [
        {"row": 1, "prompt": Q1, "completion": reference(_user(Q1))},
        {"row": 2, "messages": _user(Q1, "12", Q2), "completion": reference(_user(Q1, "12", Q2)), "reference": "4"},
        {"row": 6, "prompt": Q3, "completion": reference(_user(Q3)), "reference": "red"},
    ]
    assert "hone: skipped prompts.jsonl:3: invalid JSON" in err
    assert 'hone: skipped prompts.jsonl:4: no "prompt" or "messages" field (found: question)' in err
    assert "hone: skipped prompts.jsonl:7: messages has no user turn to answer" in err
    assert "wrote 3 rows to out.jsonl" in err and "3 of 6 rows of prompts.jsonl skipped" in err


@pytest.mark.slow
def test_generate_base_with_plain_text_prompts(run_dir, reference, tmp_path):
    (tmp_path / "prompts.txt").write_text(f"{Q1}\n\n{Q3}\n", encoding="utf-8")
    out, _ = _hone(
        tmp_path,
        "generate",
        str(run_dir),
        "--base",
        "--prompts",
        "prompts.txt",
        "--out",
        "base.jsonl",
        "--max-new-tokens",
        str(MAX_NEW),
        "--system",
        "Be brief.",
        "--repetition-penalty",
        "1",  # off, as `hone eval` scores
    )
    assert out.returncode == 0, out.stderr.decode()
    got = [json.loads(line) for line in (tmp_path / "base.jsonl").read_text(encoding="utf-8").splitlines()]
    system = [{"role": "system", "content": "Be brief."}]
    assert got == [
        {"row": 1, "prompt": Q1, "completion": reference(system + _user(Q1), adapter=False, penalty=1.0)},
        {"row": 3, "prompt": Q3, "completion": reference(system + _user(Q3), adapter=False, penalty=1.0)},
    ]


def _fake_run(
    tmp_path,
    name: str,
    *,
    model_exists: bool = True,
    adapter: bool = True,
    status: str = "finished",
    live: bool = False,
):
    """A run folder as `hone train` leaves it, whose files the checks never read past: config.toml naming a model
    folder (with config.json, or gone), run.json, and adapter/ once the run saved one; `live`: run.lock names a
    process that is alive (this one), as while `hone train` runs."""
    run, model = tmp_path / name, tmp_path / f"{name}-model"
    (run / "adapter").mkdir(parents=True)
    if model_exists:
        model.mkdir()
        (model / "config.json").write_text("{}", encoding="utf-8")
    (run / "config.toml").write_text(f"[model]\nname_or_path = {json.dumps(str(model))}\n", encoding="utf-8")
    (run / "run.json").write_text(
        json.dumps({"run_dir": str(run), "name": name, "model": str(model), "status": status}), encoding="utf-8"
    )
    if live:
        (run / "run.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
    if adapter:
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            (run / "adapter" / file).write_text("{}", encoding="utf-8")
    return run


@pytest.mark.parametrize("command", ["chat", "generate"])
@pytest.mark.parametrize(
    "case, make, message, advice",
    [
        ("not a run", lambda tmp: tmp, "is not a run folder", "give the folder `hone train` wrote"),
        ("missing folder", lambda tmp: tmp / "runs" / "nope", "does not exist", "give the folder of a run"),
        (
            "no adapter yet",
            lambda tmp: _fake_run(tmp, "r", adapter=False, status="running", live=True),
            "has no adapter yet",
            "still training",
        ),
        (
            "killed before its adapter",
            lambda tmp: _fake_run(tmp, "r", adapter=False, status="running"),
            "has no adapter yet",
            "the run was interrupted at step 0",
        ),
        (
            "base model gone",
            lambda tmp: _fake_run(tmp, "r", model_exists=False),
            "r-model does not exist",
            "model.name_or_path in",
        ),
    ],
)
def test_run_folder_mistakes_exit_2_before_loading(command, case, make, message, advice, tmp_path):
    (tmp_path / "p.txt").write_text("hi\n", encoding="utf-8")
    folder = make(tmp_path)
    argv = (
        ["chat", str(folder)]
        if command == "chat"
        else ["generate", str(folder), "--prompts", "p.txt", "--out", "o.jsonl"]
    )
    out, took = _hone(tmp_path, *argv, stdin=b"hi\n")
    err = out.stderr.decode()
    assert out.returncode == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("hone: error: ") and message in lines[0], err
    assert lines[1].startswith("hone: advice: ") and advice in lines[1], err
    assert out.stdout == b"" and took < FAST_S and not (tmp_path / "o.jsonl").exists()


def test_generate_input_mistakes_exit_2_and_write_nothing(tmp_path):
    run = _fake_run(tmp_path, "r")
    (tmp_path / "bad.jsonl").write_text('{"prompt": ""}\n[1, 2]\n', encoding="utf-8")
    (tmp_path / "taken.jsonl").write_text('{"row": 1}\n', encoding="utf-8")
    for argv, message in [
        (["--prompts", "bad.jsonl", "--out", "o.jsonl"], "bad.jsonl holds no usable prompt (2 rows skipped"),
        (["--prompts", "none.txt", "--out", "o.jsonl"], "prompts file none.txt does not exist"),
        (["--prompts", "bad.jsonl", "--out", "o.jsonl", "--temperature", "-1"], "temperature is -1"),
        (["--prompts", "bad.jsonl", "--out", "bad.jsonl"], "is the prompts file"),
    ]:
        out, took = _hone(tmp_path, "generate", str(run), *argv)
        err = out.stderr.decode()
        assert out.returncode == 2 and message in err and "hone: advice:" in err and took < FAST_S, err
        assert not (tmp_path / "o.jsonl").exists()
    out, _ = _hone(tmp_path, "generate", str(run), "--prompts", "bad.jsonl", "--out", "o.jsonl")
    assert "hone: skipped bad.jsonl:1: prompt is empty" in out.stderr.decode()
    assert "hone: skipped bad.jsonl:2: a list, not an object" in out.stderr.decode()
    (tmp_path / "good.txt").write_text("hi\n", encoding="utf-8")
    out, _ = _hone(tmp_path, "generate", str(run), "--prompts", "good.txt", "--out", "taken.jsonl")
    assert out.returncode == 2 and "taken.jsonl already exists" in out.stderr.decode()
    assert (tmp_path / "taken.jsonl").read_text(encoding="utf-8") == '{"row": 1}\n'


def test_read_prompts_formats_and_reasons(tmp_path):
    text = tmp_path / "p.txt"
    text.write_bytes(b"\xef\xbb\xbffirst line\n\n  second  \n\xff\xfe bad bytes\n{looks like json}\n")
    prompts, skipped = read_prompts(text, system="S")
    assert [(p.row, p.given) for p in prompts] == [(1, "first line"), (3, "second"), (5, "{looks like json}")]
    assert prompts[0].messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "first line"}]
    assert skipped == [f"{text}:4: not UTF-8 text (byte 1)"]

    rows = tmp_path / "p.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}]},
                {"messages": [{"role": "system", "content": "own"}, {"role": "user", "content": "q"}]},
                {"messages": [{"role": "robot", "content": "q"}]},
                {"messages": [{"role": "user", "content": 3}]},
                {"prompt": 5},
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    prompts, skipped = read_prompts(rows, system="S")
    assert [(p.row, p.reference) for p in prompts] == [(1, "yo"), (2, None)]
    assert prompts[1].messages[0] == {"role": "system", "content": "own"}  # a row's own system message stays
    assert [line.split(": ", 1)[1] for line in skipped] == [
        "messages[1].role is 'robot'; use one of system, user, assistant",
        "messages[1].content is not a string",
        "prompt is a number, not a string",
    ]


@pytest.mark.parametrize(
    "command, words",
    [
        ("chat", ["--base", "--system", "--max-new-tokens", "--temperature", "/reset", "/exit", "pipe"]),
        (
            "generate",
            [
                "--prompts",
                "--out",
                "--base",
                "--temperature",
                '{"prompt": "..."}',
                '{"messages"',
                "reference",
                "skipped",
            ],
        ),
    ],
)
def test_help_says_how_to_use_it(command, words, tmp_path):
    out, _ = _hone(tmp_path, command, "--help")
    text = out.stdout.decode()
    assert out.returncode == 0 and all(w in text for w in words), text


def test_eval_answers_with_both_models_and_scores_them(run_dir, reference, tmp_path, capsys):
    """`hone eval` on the run's own eval file: each answer is plain transformers + peft's greedy reply (which, at
    MAX_NEW tokens, begins it), and the scores are the answers' against the references."""
    from hone.core.cli import main
    from hone.core.inference.evaluate import word_f1

    out = tmp_path / "eval.jsonl"
    assert main(["eval", str(run_dir), "--rows", "2", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "exact match" in table and "word F1" in table and "fine-tuned" in table
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["row"] for r in rows] == [1, 2]
    from pathlib import Path

    from hone.core.config import RunConfig

    prompts, _ = read_prompts(Path(RunConfig.load(run_dir / "config.toml").data.eval[0]))
    for row, prompt in zip(rows, prompts, strict=False):
        assert row["reference"] == prompt.reference and row["question"] == prompt.messages[-1]["content"]
        assert row["tuned"].startswith(reference(prompt.messages, adapter=True, penalty=1.0))
        assert row["base"].startswith(reference(prompt.messages, adapter=False, penalty=1.0))
        assert row["tuned_f1"] == pytest.approx(word_f1(row["tuned"], row["reference"]), abs=1e-4)
        assert row["tuned_exact"] == (row["tuned"].strip() == row["reference"].strip())


def test_eval_stops_between_prompts_and_needs_references(run_dir, tmp_path, capsys):
    import threading

    from hone.core.cli import main
    from hone.core.inference.chat import ChatModels
    from hone.core.inference.evaluate import compare, with_references

    no_references = tmp_path / "questions.txt"
    no_references.write_text("What is 2 + 2?\nName a colour.\n")
    assert main(["eval", str(run_dir), "--data", str(no_references)]) == 2
    assert "no row of the file holds a reference reply" in capsys.readouterr().err

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": q, "completion": "4"}) + "\n" for q in (Q1, Q2, Q3)))
    prompts = with_references(read_prompts(rows)[0])
    stop = threading.Event()
    result = compare(
        ChatModels.for_run(run_dir, device="cpu"), prompts, progress=lambda done, total: stop.set(), stop=stop
    )
    assert not result.complete and len(result.answered) == 1 and result.asked == 3
    assert "stopped after 1 of 3" in result.summary()


def test_word_f1_counts_shared_words():
    from hone.core.inference.evaluate import word_f1

    assert word_f1("The cat sat", "the cat sat") == 1.0
    assert word_f1("a b c", "a b d") == pytest.approx(2 / 3)
    assert word_f1("yes", "no") == 0.0 and word_f1("", "") == 1.0 and word_f1("", "x") == 0.0
