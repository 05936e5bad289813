"""The Export page: the type picker follows the format, the chosen type reaches the file, the button comes back,
and the result reads as checks passed or failed, files with sizes and the command to use them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hone.app.pages.export import CheckRow, check_rows
from hone.core.export.formats import FORMAT_TYPES


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run folder with a random LoRA on a tiny base (the export tests' own builders)."""
    from tests.core.export.export_helpers import tiny_dense_run

    return tiny_dense_run(tmp_path_factory.mktemp("export-page"))


def _types(page) -> list[str]:
    return [page.type_box.itemData(i) for i in range(page.type_box.count())]


def test_the_type_picker_follows_the_chosen_format(window):
    page = window.page("export")
    for fmt, types in FORMAT_TYPES.items():
        page.format_buttons[fmt].click()
        assert page.type_box.isVisibleTo(page) == bool(types), fmt
        if types:  # each format starts on its own default type: GGUF and Ollama on q8_0, as the CLI, not f32
            want = {"gguf": "q8_0", "ollama": "q8_0"}.get(fmt, next(iter(types)))
            assert page.type_box.currentData() == want, fmt
        assert _types(page) == list(types), fmt
        if types:
            last = list(types)[-1]
            page.type_box.setCurrentIndex(page.type_box.findData(last))
            assert page.selected_format() == f"{fmt}:{last}"
        else:
            assert page.selected_format() == fmt


@pytest.mark.parametrize(("fmt", "kind", "gguf_type"), [("gguf-lora", "f16", "F16"), ("ollama", "q4_0", "Q4_0")])
def test_the_chosen_type_reaches_the_exported_file(qtbot, window, tiny_run, fmt, kind, gguf_type):
    from gguf import GGUFReader

    page = window.page("export")
    page.set_run(str(tiny_run))
    page.format_buttons[fmt].click()
    page.type_box.setCurrentIndex(page.type_box.findData(kind))
    assert page.selected_format() == f"{fmt}:{kind}"
    page.force_box.setChecked(True)
    with qtbot.waitSignal(page.exported, timeout=60_000) as done:
        page.export_button.click()
    result = done.args[0]
    assert result.passed, result.failures
    ggufs = [f for f in result.files if f.suffix == ".gguf"]
    matrices = [t for t in GGUFReader(ggufs[0]).tensors if len(t.shape) > 1]
    assert matrices and {t.tensor_type.name for t in matrices} <= {gguf_type, "Q8_0", "F32"}
    assert gguf_type in {t.tensor_type.name for t in matrices}, "the type picked on the page is the file's type"
    qtbot.waitUntil(page.export_button.isEnabled, timeout=5000)  # usable again for the next export

    text = page.status.text()
    rows = check_rows(result.checks, result.failures)
    assert f"{len(rows)} of {len(rows)} checks passed" in text
    assert text.count("✓") == len(rows) and "✗" not in text
    assert "max_rel_diff" not in text and "=" not in text.split("Next:")[0], "checks in words, not a raw dump"
    for f in result.files:
        assert f"{f.name} (" in text
    if fmt == "ollama":
        assert f'ollama create my-run -f "{Path(result.path) / "Modelfile"}"' in text
    else:
        assert "--lora" in text


def test_checks_become_pass_and_fail_rows():
    checks = {
        "gguf.logits.max_abs_diff": 0.2,
        "gguf.logits.max_rel_diff": 0.5,
        "gguf.logits.tolerance": 0.03,
        "gguf.tokenizer.encoding": "ok",
        "gguf.metadata": "FAILED: the file has no general.name",
        "gguf.tensors.q4_0.max_rel_error": 0.09,
        "gguf.tensors.q4_0.tolerance": 0.14,
        "gguf.vocab.pre_tokenizer": "gpt-2",
    }
    failures = [
        "logits of the GGUF: 0.5 exceeds the tolerance 0.03 (gguf.logits.max_rel_diff)",
        "the file has no general.name",
    ]
    assert check_rows(checks, failures) == [
        CheckRow(False, "gguf › logits", "max rel diff 0.5 > tolerance 0.03"),
        CheckRow(True, "gguf › tokenizer › encoding"),
        CheckRow(False, "gguf › metadata", "the file has no general.name"),
        CheckRow(True, "gguf › tensors › q4_0", "max rel error 0.09 ≤ tolerance 0.14"),
    ]


def test_an_empty_export_page_says_what_to_do(window, tmp_path):
    from hone.app.pages.export import EMPTY_RUN

    page = window.page("export")
    window.show_page("export")
    assert page.run_dir() == "" and page.run_box.count() == 0  # no runs yet
    assert page.run_hint.isVisibleTo(page) and page.run_hint.text() == EMPTY_RUN
    assert "Train a run or pick one under Runs" in EMPTY_RUN
    assert not page.export_button.isEnabled() and EMPTY_RUN in page.export_button.toolTip()
    page.set_run(str(tmp_path / "a-run"))
    assert not page.run_hint.isVisibleTo(page) and page.export_button.isEnabled()
    assert page.export_button.toolTip() == ""


def test_refreshing_keeps_the_chosen_run_whole(window, tiny_run, tmp_path):
    """Listing the runs again (a run ended) keeps the chosen run, by its folder, not by its bare name."""
    import shutil

    runs = Path(window.state.config.output.runs_dir)
    runs.mkdir(parents=True, exist_ok=True)
    for name in ("older", "newer"):
        shutil.copytree(tiny_run, runs / name)
    page = window.page("export")
    page.refresh_runs()
    assert page.run_box.count() == 2
    other = next(page.run_box.itemData(i) for i in range(2) if page.run_box.itemData(i) != page.run_dir())
    page.set_run(other)
    page.refresh_runs()
    assert page.run_dir() == other
