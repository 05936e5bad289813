from __future__ import annotations

import math

import pytest

from hone.core.config import RunConfig, field_help
from hone.core.errors import ConfigError


def test_defaults_are_valid_and_round_trip_through_toml(tmp_path):
    config = RunConfig()
    config.data.columns = {"messages": "dialog", "prompt": 'a "quoted" name'}
    config.lora.targets = ["q_proj", "v_proj"]
    path = tmp_path / "run.toml"
    config.save(path)
    assert RunConfig.load(path) == config


def test_non_default_values_round_trip(tmp_path):
    config = RunConfig().with_overrides(
        [
            "train.lr=3e-5",
            "speed.checkpoint=offload-double",
            'data.train=["a b.jsonl", "c\\"d.csv"]',
            "lora.rslora=true",
            "train.max_steps=7",
            "model.name_or_path=C:\\models\\x",
        ]
    )
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


@pytest.mark.parametrize(
    "assignment, words",
    [
        ("train.lr=-1", ["train.lr", "minimum"]),
        ("speed.checkpoint=fast", ["speed.checkpoint", "offload-double"]),
        ("train.batch_tokens=many", ["train.batch_tokens", "int"]),
        ("train.warmup_step=1", ["train.warmup_step", "did you mean 'warmup_steps'"]),
        ("trian.lr=1", ["trian", "did you mean 'train'"]),
        ("lr=1", ["section.key=value"]),
        ("train.max_steps=0", ["both 0"]),
    ],
)
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
    from hone.core.data.preference import PREFERENCE_COLUMNS

    read = {c for fmt in REQUIRED for c in (*REQUIRED[fmt], *OPTIONAL[fmt])} | {"role", "content"}
    read |= set(PREFERENCE_COLUMNS)
    assert set(COLUMN_NAMES) == read


# (section, field, value as TOML or --set hands it over, words the message must hold)
BAD_NUMBERS = [
    ("train", "epochs", math.inf, "not a finite number"),
    ("train", "epochs", math.nan, "not a finite number"),
    ("train", "epochs", -1.0, "below its minimum 0.0"),
    ("train", "epochs", 1e6, "above its maximum 1000.0"),
    ("train", "seed", 2**64, "above its maximum 2147483647"),
    ("train", "seed", -1, "below its minimum 0"),
    ("train", "seed", 1.5, "not a valid int"),
    ("train", "max_steps", 1e23, "1e+23, above its maximum 10000000"),
    ("train", "max_steps", math.inf, "not a valid int"),
    ("train", "max_steps", 2.5, "not a valid int"),
    ("train", "batch_tokens", 1e12, "above its maximum 4194304"),
    ("train", "batch_tokens", 8, "below its minimum 16"),
    ("train", "lr", math.nan, "not a finite number"),
    ("train", "lr", math.inf, "not a finite number"),
    ("train", "lr", 0.0, "not above its minimum 0.0"),
    ("train", "warmup_steps", 1e9, "above its maximum"),
    ("train", "warmup_ratio", math.nan, "not a finite number"),
    ("train", "grad_accum", 0, "below its minimum 1"),
    ("train", "grad_accum", 10**6, "above its maximum 65536"),
    ("train", "max_grad_norm", math.inf, "not a finite number"),
    ("train", "max_grad_norm", -1.0, "below its minimum"),
    ("train", "weight_decay", 5.0, "above its maximum 1.0"),
    ("train", "eval_every", 10**9, "above its maximum"),
    ("lora", "alpha", math.inf, "not a finite number"),
    ("lora", "alpha", 0.0, "not above its minimum 0.0"),
    ("lora", "alpha", -16.0, "not above its minimum 0.0"),
    ("lora", "alpha", 1e6, "above its maximum 4096.0"),
    ("lora", "r", 0, "below its minimum 1"),
    ("lora", "dropout", math.nan, "not a finite number"),
    ("data", "max_length", 10**9, "above its maximum 1048576"),
    ("data", "eval_fraction", math.nan, "not a finite number"),
    ("data", "image_max_side", 10**6, "above its maximum 8192"),
    ("output", "checkpoint_every", -1, "below its minimum 0"),
    ("output", "keep_checkpoints", 0, "below its minimum 1"),
    ("output", "keep_checkpoints", 10**6, "above its maximum 1000"),
    ("speed", "layer_group_tokens", -2, "below its minimum -1"),
    ("speed", "layer_group_tokens", 10**9, "above its maximum"),
]


@pytest.mark.parametrize(
    "section, name, value, words", BAD_NUMBERS, ids=[f"{s}.{n}={v!r}" for s, n, v, _ in BAD_NUMBERS]
)
def test_each_bad_number_is_refused_naming_the_field(section, name, value, words):
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({section: {name: value}})
    assert e.value.message.startswith(f"{section}.{name} is "), e.value.message
    assert words in e.value.message
    assert f"{section}.{name}" in e.value.advice


def _numeric_fields():
    import dataclasses
    import typing

    from hone.core.config import SECTIONS

    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] in (int, float):
                yield section, cls, f, hints[f.name]


def test_every_numeric_field_has_both_bounds_and_they_hold_at_the_edges():
    fields = list(_numeric_fields())
    assert len(fields) >= 20
    for section, cls, f, kind in fields:
        low, high = f.metadata["min"], f.metadata["max"]
        assert low is not None and high is not None, f"{section}.{f.name} has no bounds"
        if kind is int:
            assert high <= 2**31 - 1, f"{section}.{f.name}: the Studio's number box holds 32-bit ints"
        others = {"max_steps": 1} if f.name == "epochs" else {}  # epochs = 0 needs steps
        assert getattr(cls(**{f.name: kind(high)}), f.name) == high
        if not f.metadata["above_min"]:
            assert getattr(cls(**{f.name: kind(low), **others}), f.name) == low
        step = 1 if kind is int else high * 1e-9
        with pytest.raises(ConfigError, match="above its maximum"):
            cls(**{f.name: kind(high + step)})


def test_values_from_the_studio_form_and_the_command_line_are_checked_the_same():
    for assignment in ("train.epochs=inf", "train.epochs=nan", "train.epochs='inf'", "lora.alpha='nan'"):
        with pytest.raises(ConfigError, match="not a finite number"):
            RunConfig().with_overrides([assignment])


def test_a_config_that_is_not_utf8_names_the_file_line_and_byte(tmp_path):
    path = tmp_path / "latin1.toml"
    raw = "[train]\nlr = 1e-4\n# Café\n".encode("latin-1")
    path.write_bytes(raw)
    with pytest.raises(ConfigError) as e:
        RunConfig.load(path)
    offset = raw.index(b"\xe9")
    assert str(path) in e.value.message and f"offset {offset} (line 3)" in e.value.message
    assert "0xe9" in e.value.message and "UTF-8" in e.value.advice


def test_a_utf8_config_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[train]\nlr = 3e-5\n")
    assert RunConfig.load(path).train.lr == 3e-5


def test_a_folder_given_as_the_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        RunConfig.load(tmp_path)


BAD_NAMES = [
    "../../x",
    "..",
    ".",
    "a/b",
    "a\\b",
    "/abs",
    "run\nPARAMETER temperature 99",
    "tab\tname",
    "nul\x00",
    "line\u2028sep",
    "x" * 101,
    "é" * 51,
    "   ",
    ".hidden",
    "name.",
    "name ",
    "a:b",
    'say"hi"',
    "what?",
]


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_a_run_name_that_is_not_one_plain_folder_name_is_refused(name):
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"output": {"name": name}})
    assert e.value.message.startswith("output.name is ")
    assert "output.name" in e.value.advice and "leave it empty" in e.value.advice


@pytest.mark.parametrize("name", ["", "my-run_1.2", "Fine tune 3", "日本語の実行", "x" * 100, "a..b"])
def test_plain_run_names_are_kept(name):
    assert RunConfig.from_dict({"output": {"name": name}}).output.name == name


def test_a_preference_pair_must_fit_one_micro_batch():
    RunConfig.from_dict({"data": {"max_length": 1024}, "train": {"batch_tokens": 2048, "method": "dpo"}})
    with pytest.raises(ConfigError) as error:
        RunConfig.from_dict({"data": {"max_length": 1024}, "train": {"batch_tokens": 1536, "method": "simpo"}})
    assert "two rows of up to data.max_length (1024)" in error.value.message
    assert "at least 2048" in error.value.advice and "at most 768" in error.value.advice
