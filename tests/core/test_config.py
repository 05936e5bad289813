from __future__ import annotations

import pytest

from hone.core.config import RunConfig, field_help
from hone.core.errors import ConfigError


def test_defaults_are_valid_and_round_trip_through_toml(tmp_path):
    config = RunConfig()
    config.data.columns = {"messages": "dialog", "prompt": "a \"quoted\" name"}
    config.lora.targets = ["q_proj", "v_proj"]
    path = tmp_path / "run.toml"
    config.save(path)
    assert RunConfig.load(path) == config


def test_non_default_values_round_trip(tmp_path):
    config = RunConfig().with_overrides(["train.lr=3e-5", "speed.checkpoint=offload-double",
                                         'data.train=["a b.jsonl", "c\\"d.csv"]', "lora.rslora=true",
                                         "train.max_steps=7", "model.name_or_path=C:\\models\\x"])
    path = tmp_path / "run.toml"
    config.save(path)
    loaded = RunConfig.load(path)
    assert loaded == config
    assert loaded.train.lr == 3e-5 and loaded.train.max_steps == 7
    assert loaded.data.train == ["a b.jsonl", 'c"d.csv']
    assert loaded.model.name_or_path == "C:\\models\\x"


def test_overrides_parse_by_field_type():
    config = RunConfig().with_overrides(["speed.packing=false", "train.batch_tokens=4096", "data.train=a,b"])
    assert config.speed.packing is False
    assert config.train.batch_tokens == 4096
    assert config.data.train == ["a", "b"]


@pytest.mark.parametrize("assignment, words", [
    ("train.lr=-1", ["train.lr", "minimum"]),
    ("speed.checkpoint=fast", ["speed.checkpoint", "offload-double"]),
    ("train.batch_tokens=many", ["train.batch_tokens", "int"]),
    ("train.warmup_step=1", ["train.warmup_step", "did you mean 'warmup_steps'"]),
    ("trian.lr=1", ["trian", "did you mean 'train'"]),
    ("lr=1", ["section.key=value"]),
    ("train.max_steps=0", ["both 0"]),
])
def test_bad_values_name_the_field_and_what_to_do(assignment, words):
    base = RunConfig().with_overrides(["train.epochs=0", "train.max_steps=3"])
    with pytest.raises(ConfigError) as info:
        base.with_overrides([assignment])
    text = str(info.value)
    for word in words:
        assert word in text
    assert info.value.advice


def test_invalid_toml_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nlr = = 1\n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        RunConfig.load(path)


def test_every_field_has_help():
    for section, values in RunConfig().to_dict().items():
        for name in values:
            assert len(field_help(section, name)["help"]) > 10, f"{section}.{name}"


def test_a_renamed_setting_still_loads_under_its_former_name(tmp_path):
    """A run folder's config.toml written before `speed.layer_tile_tokens` became `layer_group_tokens` resumes."""
    old = tmp_path / "config.toml"
    old.write_text("[speed]\nlayer_tile_tokens = 4096\n", encoding="utf-8")
    assert RunConfig.load(old).speed.layer_group_tokens == 4096
    assert "layer_tile_tokens" not in RunConfig.load(old).to_dict()["speed"]
    both = tmp_path / "both.toml"
    both.write_text("[speed]\nlayer_tile_tokens = 4096\nlayer_group_tokens = 2048\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="same setting"):
        RunConfig.load(both)


def test_max_length_over_batch_tokens_is_refused_with_both_fixes():
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"data": {"max_length": 4096}, "train": {"batch_tokens": 2048}})
    assert "data.max_length (4096)" in e.value.message and "train.batch_tokens (2048)" in e.value.message
    assert "at least 4096" in e.value.advice and "at most 2048" in e.value.advice
    # Without packing each row is its own micro-batch, so the budget does not bound the row length.
    RunConfig.from_dict({"data": {"max_length": 4096}, "train": {"batch_tokens": 2048}, "speed": {"packing": False}})


def test_column_names_are_the_ones_the_formats_read():
    from hone.core.config import COLUMN_NAMES
    from hone.core.data.formats import OPTIONAL, REQUIRED

    read = {c for fmt in REQUIRED for c in (*REQUIRED[fmt], *OPTIONAL[fmt])} | {"role", "content"}
    assert set(COLUMN_NAMES) == read
