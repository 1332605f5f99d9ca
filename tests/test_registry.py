"""The registration record stays small and every knob is declared once: read from the
registry itself (built-ins and any plugin registered in this session)."""

import dataclasses

import pytest

from blockmem_lite import ModelConfig, registry
from blockmem_lite.models.base import LanguageModel


def test_the_mechanism_record_has_six_fields():
    assert [f.name for f in dataclasses.fields(registry.Mechanism)] == [
        "name", "model", "options", "flops", "state_bytes", "summary"]


@pytest.mark.parametrize("name", registry.names())
def test_no_knob_is_declared_twice(name):
    """A bench option of a mechanism's own never repeats one of its option fields (the knob
    gives that flag), each flag is declared once, and the variants, presets, boundaries and
    span name only real fields."""
    fields = set(registry.get(name).options.field_names())
    own = [opt.dest for opt in registry.bench_spec(name).options]
    assert not fields & set(own), f"{name}: {sorted(fields & set(own))} are knobs already"
    flags = [opt.flag for opt in registry.bench_options(name)]
    assert len(flags) == len(set(flags)), flags
    assert set(registry.preset_values(name, "class")) <= fields
    assert set(registry.boundary_fields(name)) <= fields
    assert registry.span_field(name) in fields | {None}
    for _, overrides in registry.bench_variants(name, registry.default_bench_options()):
        assert set(overrides) <= fields, overrides


@pytest.mark.parametrize("name", registry.names())
def test_the_lab_span_is_the_span_knob(name):
    spec, span = registry.lab_spec(name), registry.span_field(name)
    cfg = registry.get(name).options
    if span is None:
        return
    default = next(f.default for f in dataclasses.fields(cfg) if f.name == span)
    model_cfg = ModelConfig(name, seq_len=256)
    assert spec.local_span(model_cfg) == getattr(model_cfg, span) == default
    assert spec.local_span(spec.recall_span(model_cfg, 16)) == 16


def test_the_model_declares_its_trace_keys():
    for name in registry.names():
        model = registry.get(name).model
        if isinstance(model, type) and issubclass(model, LanguageModel) and name != "dense":
            assert model.trace_keys, name
    assert LanguageModel.trace_keys == ()


def test_variants_come_from_the_knobs_first_knob_fastest():
    assert registry.bench_variants("cat", {"chunk_size": [4, 8], "decoder_width": [1, 2]}) == [
        ("C=4 w=1", {"chunk_size": 4, "decoder_width": 1}),
        ("C=8 w=1", {"chunk_size": 8, "decoder_width": 1}),
        ("C=4 w=2", {"chunk_size": 4, "decoder_width": 2}),
        ("C=8 w=2", {"chunk_size": 8, "decoder_width": 2})]


@pytest.mark.parametrize("value, message", [
    ("16,32", "block_size='16,32' is not allowed: expected a list of values"),
    ([16, 0], r"block_size=\[16, 0\] is not allowed: expected a list of integers >= 1"),
    ([], r"block_size=\[\] is not allowed"),
])
def test_the_python_bench_api_takes_typed_values(value, message):
    with pytest.raises(ValueError, match=message):
        registry.checked_bench_options({"block_size": value})
    assert registry.checked_bench_options({"block_size": 16})["block_size"] == [16]


def test_the_kits_own_class_registered_by_a_test_is_not_built_in():
    """A name a test registers for DenseLM is of this session: unregister forgets it, so no
    later test (or lab run) sees it; the built-ins stay built in."""
    from blockmem_lite.models.dense import DenseLM

    registry.register(registry.Mechanism(name="dense_again", model=DenseLM, summary="x"))
    assert registry.source("dense_again") == "" and registry.source("dense") == registry.BUILTIN
    registry.unregister("dense_again")
    registry.unregister("dense")                             # a built-in is never forgotten
    assert "dense_again" not in registry.names() and "dense" in registry.names()
