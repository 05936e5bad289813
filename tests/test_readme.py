"""README.md stays true: its config reference is RunConfig's, and CI runs exactly its test command."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _updater():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "tools" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_reference_matches_the_config_fields():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert _updater().updated(text) == text, "README's config reference is stale: run python tools/update_readme.py"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme.split("## Quick start", 1)[1].split("\n## ", 1)[0], re.S)
    assert len(blocks) == 2, "the quick start has exactly two commands: the demo and the tests"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == blocks[1], "the last line of .ci/run must be the README's test command"
    assert "hone demo" in blocks[0]
