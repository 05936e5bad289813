"""The Train page's MoE backends card: shown for an MoE model, measuring times each backend on the model's own
expert shapes off the GUI thread (here on the CPU, through the real core path, on a tiny model folder), and
"Use …" sets speed.moe_backend to the fastest. Without an NVIDIA GPU the button says why it is off."""

from __future__ import annotations

import functools

from hone.app.pages import train
from hone.core.api import MachineFacts
from hone.core.bench.moe_backends import measure_model_backends
from hone.core.models.load import count_params, info_from_config
from hone.core.models.shapes import build_model


def _moe_folder(tmp_path):
    model = build_model("tiny-moe-qwen3", vocab_size=512)
    model.save_pretrained(tmp_path / "moe")
    return tmp_path / "moe", info_from_config(model.config, "tiny-moe", "folder", count_params(model))


def test_measuring_shows_each_backend_and_keeps_the_fastest(qtbot, make_window, tmp_path, monkeypatch):
    folder, info = _moe_folder(tmp_path)
    on_cpu = functools.partial(measure_model_backends, device="cpu", tokens=64, steps=1, warmup=0)
    monkeypatch.setattr(
        train, "measure_backends", lambda model_cfg, progress=None: on_cpu(model_cfg, progress=progress)
    )
    window = make_window(machine=MachineFacts(gpu="Test GPU"))
    window.state.set_model(str(folder), info)
    page = window.page("train")
    page.show_form("advanced")  # the backends are an Advanced setting; Basic leaves them on auto
    assert not page.moe_card.isHidden() and page.measure_button.isEnabled()
    page.measure_button.click()
    qtbot.waitUntil(lambda: "Fastest here" in page.moe_results.text(), timeout=120_000)
    text = page.moe_results.text()
    assert "grouped_mm:" in text and "torch:" in text and "tokens/s" in text
    assert page.fastest_backend in ("grouped_mm", "torch") and page.measure_button.isEnabled()
    page.use_fastest_button.click()
    assert window.state.config.speed.moe_backend == page.fastest_backend


def test_the_card_hides_for_dense_models_and_needs_a_gpu(make_window, tmp_path):
    folder, info = _moe_folder(tmp_path)
    window = make_window(machine=MachineFacts(gpu="", reason="no NVIDIA GPU"))
    page = window.page("train")
    window.state.set_model(str(folder), info)
    page.show_form("basic")
    assert page.moe_card.isHidden(), "Basic leaves the experts backend on auto"
    page.show_form("advanced")
    assert not page.moe_card.isHidden()
    assert not page.measure_button.isEnabled() and "NVIDIA GPU" in page.measure_button.toolTip()
    window.state.set_model(str(folder), {"is_moe": False})
    assert page.moe_card.isHidden()
