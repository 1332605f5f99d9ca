"""Config validation, presets and notebook_config."""

import pytest

from blockmem_lite import PRESET_NAMES, ModelConfig, TrainConfig, notebook_config, preset


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
