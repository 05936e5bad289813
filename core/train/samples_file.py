"""RUN_DIR/samples.jsonl: the answers to train.sample_prompts, one line per evaluation (sample_answers.py writes them).

    {"step": 20, "samples": [{"prompt": "What is 2 + 2?", "answer": "4"}, ...]}

Written as metrics.jsonl is (safe_writes.LineFile): a line whole or not at all, a partial last line from a kill cut
when the file is opened again, and on resume the lines of steps after the checkpoint, trained again, dropped
(`SamplesFile.forget_steps_after`). Read back bounded (`read_samples`: the file's last MAX_READ_BYTES), every field
checked, for the Monitor's Samples panel. Stdlib only: the Studio reads it without torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hone.core.train.safe_writes import LineFile, disk_full_error, is_disk_full, replace_with

SAMPLES_FILE = "samples.jsonl"
# A line holds at most 64 prompts of MAX_TEXT_CHARS each, answer and prompt: ~1 MB. The reader takes the file's last
# 8 MB, the newest evaluations of any run (a long run's first ones drop out of the panel, not out of the file).
MAX_READ_BYTES = 8 << 20
# Characters of a prompt or an answer kept on a line: a few paragraphs, enough to read how an answer changes.
MAX_TEXT_CHARS = 4000


@dataclass(frozen=True)
class SampleStep:
    """The answers of one evaluation: `step` and (prompt, answer) pairs in the prompts' order."""

    step: int
    samples: tuple[tuple[str, str], ...]


def sample_line(step: int, samples: list[tuple[str, str]]) -> str:
    """One line of samples.jsonl (with its newline), each text cut at MAX_TEXT_CHARS."""
    cut = [{"prompt": p[:MAX_TEXT_CHARS], "answer": a[:MAX_TEXT_CHARS]} for p, a in samples]
    return json.dumps({"step": int(step), "samples": cut}, ensure_ascii=False) + "\n"


def parse_line(line: bytes | str) -> SampleStep | None:
    """The SampleStep a line holds, or None for a line that is not one (damaged, cut, another shape)."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or type(data.get("step")) is not int or not isinstance(data.get("samples"), list):
        return None
    pairs = []
    for item in data["samples"]:
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            return None
        answer = item.get("answer")
        if not isinstance(answer, str):
            return None
        pairs.append((item["prompt"][:MAX_TEXT_CHARS], answer[:MAX_TEXT_CHARS]))
    return SampleStep(data["step"], tuple(pairs))


def read_samples(run_dir: str | Path, max_bytes: int = MAX_READ_BYTES) -> list[SampleStep]:
    """The evaluations' answers of a run folder, oldest first, from the last `max_bytes` of its samples.jsonl (a line
    cut by that start, or damaged, is passed over); [] when the run has none. A step written again by a resumed
    run keeps its newest line only."""
    path = Path(run_dir) / SAMPLES_FILE
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            start = max(0, size - max_bytes)
            f.seek(start)
            lines = f.read(size - start).split(b"\n")
    except OSError:
        return []
    if start:
        lines = lines[1:]  # begins mid-line
    by_step: dict[int, SampleStep] = {}
    for line in lines:
        parsed = parse_line(line) if line.strip() else None
        if parsed is not None:
            by_step.pop(parsed.step, None)
            by_step[parsed.step] = parsed
    return sorted(by_step.values(), key=lambda s: s.step)


class SamplesFile:
    """samples.jsonl of a run being trained: lines appended whole (`append`), later steps dropped on resume.

    Args:
        run_dir: the run folder (it exists: RunWriter made it).
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / SAMPLES_FILE
        self.run_dir = Path(run_dir)
        try:
            self._file = LineFile(self.path, cut_partial=True)
        except OSError as e:
            raise self._error(e) from e

    def append(self, step: int, samples: list[tuple[str, str]]) -> None:
        try:
            self._file.append(sample_line(step, samples))
        except OSError as e:
            raise self._error(e) from e

    def forget_steps_after(self, step: int) -> None:
        """A resume from the checkpoint of `step`: drop the lines of later steps (they are trained again); a line
        that holds no samples is dropped too."""
        text = self.path.read_bytes()
        kept = [line for line in text.splitlines(keepends=True) if (s := parse_line(line)) and s.step <= step]
        data = b"".join(kept)
        if data == text:
            return
        self._file.close()  # Windows renames over no open file
        try:
            replace_with(self.path, data)
        except OSError as e:
            raise self._error(e) from e
        finally:
            self._file = LineFile(self.path, cut_partial=False)

    def close(self) -> None:
        self._file.close()

    def _error(self, e: OSError) -> Exception:
        return disk_full_error(e, SAMPLES_FILE, self.run_dir) if is_disk_full(e) else e
