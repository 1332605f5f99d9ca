"""Config validation, presets and notebook_config."""

import copy
import dataclasses
import pickle

import pytest

from blockmem_lite import PRESET_NAMES, ModelConfig, TrainConfig, notebook_config, preset
from blockmem_lite.config import SHARED_FIELDS


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_builds(name):
    cfg = preset(name)
    assert cfg.preset == name
    assert cfg.model.d_model % cfg.model.n_head == 0


@pytest.mark.parametrize("kwargs, field, allowed", [
    (dict(n_head=3), "n_head=3", "must divide d_model=32"),
    (dict(arch="transformerxl"), "arch='transformerxl'", "known architectures are"),
    (dict(d_model=0), "d_model=0", "integer >= 2"),
    (dict(seq_len=-4), "seq_len=-4", "integer >= 1"),
    (dict(dropout=1.5), "dropout=1.5", r"\[0.0, 1.0\]"),
    (dict(lr=0), "lr=0", "number in"),
    (dict(device="tpu"), "device='tpu'", "'cuda'"),
    (dict(precision="fp8"), "precision='fp8'", "'bf16'"),
    (dict(batch_size=2.5), "batch_size=2.5", "integer"),
    (dict(no_such_field=1), "no_such_field=1", "unknown field"),
])
def test_invalid_values_name_field_value_and_allowed(kwargs, field, allowed):
    with pytest.raises(ValueError) as err:
        preset("tiny", **kwargs)
    assert field in str(err.value)
    assert __import__("re").search(allowed, str(err.value))


def test_unknown_preset():
    with pytest.raises(ValueError, match="preset='huge'.*tiny, fast, class, gpu"):
        preset("huge")


def test_dataclasses_validate_directly():
    with pytest.raises(ValueError, match="n_head"):
        ModelConfig(d_model=64, n_head=5)
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(warmup_steps=-1)


def test_notebook_config_honours_fast_env(monkeypatch):
    monkeypatch.delenv("BLOCKMEM_FAST", raising=False)
    slow = notebook_config("class", steps=123, fast=dict(steps=7))
    assert slow.preset == "class" and slow.train.steps == 123
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    quick = notebook_config("class", steps=123, fast=dict(steps=7))
    assert quick.preset == "fast" and quick.fast
    assert quick.train.steps == 7
    assert quick.model.d_model == preset("fast").model.d_model


def test_round_trip_through_dict():
    cfg = preset("fast", lr=1e-3)
    again = type(cfg).from_dict(cfg.to_dict())
    assert again == cfg


# --- mechanism options: declared by each mechanism, reached like fields ------------------------

def test_each_mechanism_owns_its_options():
    import dataclasses

    from blockmem_lite.models.bcmt import BCMTOptions

    cfg = ModelConfig(arch="bcmt", seq_len=64, block_size=16, alpha=0.5)
    assert isinstance(cfg.options, BCMTOptions) and cfg.block_size == 16 and cfg.alpha == 0.5
    assert cfg.option_names == ("block_size", "alpha", "memory", "learn_alpha",
                                "memory_lr_scale")
    assert not hasattr(ModelConfig(), "block_size")                 # dense has no blocks
    honly = dataclasses.replace(cfg, arch="honly")                  # shared names carry over
    assert honly.block_size == 16 and not hasattr(honly, "alpha")
    assert dataclasses.replace(cfg, arch="dense").option_names == ()
    cfg.block_size = 8                                              # writes reach the options
    assert cfg.options.block_size == 8 and cfg.to_dict()["block_size"] == 8


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_size=8), r"block_size=8 is not allowed: an option of bcmt, honly, not of "
                         r"arch='dense' \(set arch as well, e.g. arch='bcmt'\)"),
    (dict(arch="cat", segment_size=8), r"segment_size=8 is not allowed: an option of armt"),
    (dict(arch="moc", blok=1), r"blok=1 is not allowed: unknown field; shared fields are "
                               r"vocab_size.*moc options are n_chapters"),
])
def test_a_field_of_another_mechanism_names_its_owners(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


def test_presets_size_each_mechanism():
    assert preset("tiny", arch="bcmt").model.block_size == 8
    assert preset("gpu", arch="armt").model.segment_size == 256
    assert preset("class", arch="moc").model.n_chapters == 257
    # switching arch on a preset's RunConfig takes the new mechanism's sizes for that preset
    assert preset("fast").replace(arch="honly").model.block_size == 16
    assert preset("fast", arch="bcmt").replace(arch="honly", block_size=4).model.block_size == 4


def test_flat_dicts_round_trip_and_legacy_checkpoint_dicts_load():
    cfg = preset("tiny", arch="cat", chunk_sizes=(4, 8), chunk_size=8).model
    flat = cfg.to_dict()
    assert "options" not in flat and flat["chunk_sizes"] == (4, 8)
    assert ModelConfig.from_dict(flat) == cfg == ModelConfig(**flat)
    # earlier releases stored every mechanism's fields in one flat dict
    legacy = {**preset("tiny").model.to_dict(), "block_size": 8, "chunk_size": 16,
              "memory_layers": None, "routing": "block_causal"}
    assert ModelConfig.from_dict(legacy) == preset("tiny").model
    assert "block_size=8" in repr(preset("tiny", arch="bcmt").model)


def test_the_knobs_are_real_dataclass_fields():
    """dataclasses.fields and tab completion show a mechanism's options (no __getattr__)."""
    cfg = ModelConfig("bcmt", seq_len=64, block_size=16)
    names = [f.name for f in dataclasses.fields(cfg)]
    assert names[:2] == ["arch", "vocab_size"] and {"block_size", "alpha", "memory"} <= set(names)
    assert type(cfg).__name__ == "BCMTConfig" and isinstance(cfg, ModelConfig)
    assert "block_size" in vars(cfg) and "block_size" in dir(cfg)
    assert [f.name for f in dataclasses.fields(ModelConfig("dense"))] == ["arch", *SHARED_FIELDS]


def test_a_config_survives_pickle_copy_and_a_change_of_arch():
    cfg = ModelConfig("bcmt", seq_len=64, block_size=16, alpha=0.5)
    assert pickle.loads(pickle.dumps(cfg)) == cfg == copy.deepcopy(cfg)
    honly = dataclasses.replace(cfg, arch="honly")
    assert type(honly).__name__ == "HOnlyConfig" and honly.block_size == 16
    assert not hasattr(honly, "alpha")
    back = dataclasses.replace(honly, arch="bcmt")
    assert back.block_size == 16 and back.alpha == 0.8      # bcmt's default again
    with pytest.raises(ValueError, match="alpha=0.5 is not allowed: an option of bcmt"):
        ModelConfig("honly", alpha=0.5)
