"""`check_prompts` (the Train page's check and `hone data check --method grpo`): GRPO's prompts read as a run reads
them, every row without a prompt listed by file and row."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hone.core.config import DataConfig
from hone.core.data.prompts import check_prompts, load_prompt_data
from hone.core.data.text_only import IMAGE_IN_TEXT_ONLY_ROW

pytestmark = pytest.mark.core

ROWS = [
    {"prompt": "What is 2 + 2?", "answer": "4"},
    {"messages": [{"role": "user", "content": "Name a colour."}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]},  # ends on an answer
    {"question": "no prompt here"},
]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def test_without_a_tokenizer_every_row_is_read_and_the_bad_ones_named(prompts_file):
    report = check_prompts(DataConfig(train=[str(prompts_file)]))
    assert (report.rows_read, report.rows_kept) == (4, 2)
    assert sorted(m.split(":")[1] for m in report.skipped_examples) == ["3", "4"]
    assert all("prompts.jsonl" in m for m in report.skipped_examples)


def test_with_a_tokenizer_the_counts_are_the_run_s(prompts_file, smollm2_tokenizer):
    cfg = DataConfig(train=[str(prompts_file)])
    report = check_prompts(cfg, smollm2_tokenizer)
    run = load_prompt_data(cfg, smollm2_tokenizer, group=1, max_completion=0)
    assert report.rows_kept == len(run.train) == 2
    assert report.tokens == sum(len(row.input_ids) for row in run.train)


def test_hone_data_check_reads_prompts_for_grpo(prompts_file):
    got = subprocess.run(
        [sys.executable, "-m", "hone.core.cli", "data", "check", str(prompts_file), "--method", "grpo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["rows_kept"] == 2


def test_prompts_with_images_are_refused_with_the_image_named(tmp_path):
    """GRPO samples from text: a prompt's image is never dropped silently."""
    image = {"type": "image", "image": "cat.png"}
    rows = [
        {"prompt": "What is it?", "images": ["cat.png"]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}]},
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [image]}]},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    report = check_prompts(DataConfig(train=[str(path)]))
    assert (report.rows_read, report.rows_kept) == (3, 0)
    assert report.skipped == {IMAGE_IN_TEXT_ONLY_ROW: 3}
    fields = [m.split(": ")[1] for m in report.skipped_examples]
    assert fields == ["images", "messages[0].content[1]", "prompt[1].content[0]"], report.skipped_examples
