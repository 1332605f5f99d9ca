"""check_* helpers: one OK line on success, precise messages on failure, causality with teeth."""

import math
from types import SimpleNamespace

import pytest
import torch

from blockmem_lite import build_model, preset
from blockmem_lite.checks import (
    CheckFailed,
    check_causal,
    check_close,
    check_equal,
    check_shape,
    check_true,
    default_probes,
)
from blockmem_lite.masks import causal_mask
from blockmem_lite.nn import reference_attention


def _one_ok_line(capsys) -> str:
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("OK "), lines
    return lines[0]


def test_check_failed_is_an_assertion_error():
    assert issubclass(CheckFailed, AssertionError)


# --- check_shape ----------------------------------------------------------------------------


def test_check_shape_passes_with_wildcards(capsys):
    check_shape(torch.zeros(2, 5, 8), (2, None, -1), "q")
    assert _one_ok_line(capsys) == "OK q: shape (2, 5, 8)"


def test_check_shape_names_the_wrong_dim():
    with pytest.raises(CheckFailed) as err:
        check_shape(torch.zeros(2, 5, 4), (2, None, 8), "q")
    text = str(err.value)
    assert text.startswith("q: wrong shape")
    assert "expected (2, *, 8)" in text and "got      (2, 5, 4)" in text
    assert "dim 2: expected 8, got 4" in text


def test_check_shape_reports_wrong_rank_and_missing_values():
    with pytest.raises(CheckFailed, match="wrong number of dimensions"):
        check_shape(torch.zeros(2, 5), (2, 5, 1))
    with pytest.raises(CheckFailed, match="got None"):
        check_shape(None, (2,))
    with pytest.raises(CheckFailed, match="type list, which has no shape"):
        check_shape([1, 2], (2,))


def test_check_shape_rejects_bad_expected():
    with pytest.raises(ValueError, match="expected="):
        check_shape(torch.zeros(2), ("2",))


# --- check_close ----------------------------------------------------------------------------


def test_check_close_passes_and_prints_one_line(capsys):
    x = torch.randn(3, 4)
    check_close(x + 1e-7, x.double(), "out")
    line = _one_ok_line(capsys)
    assert line.startswith("OK out: close, max abs diff") and "shape (3, 4)" in line


def test_check_close_reports_max_diff_index_values_and_dtypes():
    expected = torch.zeros(2, 3, dtype=torch.float64)
    got = torch.zeros(2, 3)
    got[1, 2], got[0, 0] = 0.5, 1e-3
    with pytest.raises(CheckFailed) as err:
        check_close(got, expected, "attention")
    text = str(err.value)
    assert text.startswith("attention: 2 of 6 values differ")
    assert "max abs diff 0.5 at index (1, 2): got 0.5, expected 0" in text
    assert "got float32, expected float64" in text


def test_check_close_shape_mismatch_is_clear():
    with pytest.raises(CheckFailed, match=r"shapes differ(.|\n)*expected shape \(3,\)"):
        check_close(torch.zeros(1, 3), torch.zeros(3))


def test_check_close_nan_only_matches_nan(capsys):
    nan = float("nan")
    check_close(torch.tensor([1.0, nan]), torch.tensor([1.0, nan]))
    _one_ok_line(capsys)
    with pytest.raises(CheckFailed, match=r"max abs diff nan at index \(1,\)"):
        check_close(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0]))


def test_check_close_uses_rtol_and_accepts_numbers(capsys):
    check_close(torch.tensor(1000.05), 1000.0, "loss", atol=0.0, rtol=1e-4)
    _one_ok_line(capsys)
    with pytest.raises(CheckFailed):
        check_close(torch.tensor(1000.2), 1000.0, "loss", atol=0.0, rtol=1e-4)
    check_close([0.5, 0.25], torch.tensor([0.5, 0.25]))
    _one_ok_line(capsys)


def test_check_close_none_says_what_to_do():
    with pytest.raises(CheckFailed, match="forget to return"):
        check_close(None, torch.zeros(2))


# --- check_equal / check_true ---------------------------------------------------------------


def test_check_equal_tensors_and_values(capsys):
    check_equal(torch.arange(4), torch.arange(4), "ids")
    assert _one_ok_line(capsys) == "OK ids: equal, shape (4,)"
    with pytest.raises(CheckFailed, match=r"1 of 4 elements differ\n  first at index \(2,\)"):
        check_equal(torch.tensor([0, 1, 5, 3]), torch.arange(4), "ids")
    check_equal("dense", "dense", "arch")
    _one_ok_line(capsys)
    with pytest.raises(CheckFailed, match="expected 'bcmt'"):
        check_equal("dense", "bcmt", "arch")


def test_check_true(capsys):
    check_true(torch.tensor(True), "loss went down")
    assert _one_ok_line(capsys) == "OK loss went down"
    with pytest.raises(CheckFailed, match="expected: loss went down\n  first 5.0, last 6.0"):
        check_true(False, "loss went down", detail="first 5.0, last 6.0")
    with pytest.raises(ValueError, match="one-element"):
        check_true(torch.tensor([True, False]), "ambiguous")


# --- check_causal ---------------------------------------------------------------------------


@pytest.fixture
def tokens():
    return torch.randint(0, 256, (2, 32))


def test_dense_model_is_causal_in_eval_mode_and_training_flag_restored(capsys, tokens):
    model = build_model(preset("tiny", dropout=0.5))  # dropout would move every output in train
    model.train()
    check_causal(model, tokens)
    line = _one_ok_line(capsys)
    assert line.startswith("OK causal:") and "probes [0, " in line and ", 16, 30]" in line
    assert model.training
    assert all(p.grad is None for p in model.parameters())


def _shifted_view(offset: int):
    """Output i = embedding of token i + embedding of token i + offset: sees the future."""
    table = torch.randn(256, 4)

    def fn(t):
        e = table[t]                                     # (B, T, 4)
        return e + torch.roll(e, -offset, dims=1)

    return fn


def test_leak_names_the_earliest_leaking_position_and_probe(tokens):
    with pytest.raises(CheckFailed) as err:
        check_causal(_shifted_view(3), tokens, positions=[10])
    text = str(err.value)
    assert "output at position 8 changed by" in text
    assert "after position 10" in text
    assert "3 of these 11 positions changed; the earliest is 8" in text


def test_no_teeth_when_the_output_ignores_the_input(capsys, tokens):
    constant = lambda t: torch.zeros(*t.shape, 5)
    with pytest.raises(CheckFailed, match="no teeth"):
        check_causal(constant, tokens)
    check_causal(constant, tokens, require_teeth=False)
    _one_ok_line(capsys)


def test_float_inputs_causal_attention_passes_and_full_attention_fails(capsys):
    x = torch.randn(2, 12, 8, dtype=torch.float64)

    def attend(x, mask=None):
        q = x[:, None]                                   # (B, 1, T, D)
        out, _ = reference_attention(q, q, q, mask=mask)
        return out[:, 0]                                 # (B, T, D)

    check_causal(lambda x: attend(x, causal_mask(12)), x)
    _one_ok_line(capsys)
    with pytest.raises(CheckFailed, match="output at position 0 changed"):
        check_causal(attend, x)


def test_block_boundaries_are_probed():
    assert default_probes(64, [16]) == [0, 15, 16, 31, 32, 62]
    assert default_probes(8) == [0, 2, 4, 6]


def test_block_size_is_read_from_the_model_config():
    """A leak only across the first block boundary (position 16) is found by the L-1 probe."""

    class BoundaryLeak:
        cfg = SimpleNamespace(vocab_size=256, block_size=16)

        def __call__(self, t):
            out = t.float()[..., None].clone()           # (B, T, 1)
            out[:, 15] += t[:, 16, None]                 # the last token of block 0 sees block 1
            return out

    t = torch.randint(0, 256, (1, 64))
    check_causal(BoundaryLeak(), t, positions=[0, 32, 62])  # misses the leak
    with pytest.raises(CheckFailed, match="output at position 15 changed"):
        check_causal(BoundaryLeak(), t)


def test_causal_rejects_bad_arguments(tokens):
    fn = _shifted_view(0)
    with pytest.raises(ValueError, match="positions="):
        check_causal(fn, tokens, positions=[31])
    with pytest.raises(ValueError, match="T >= 2"):
        check_causal(fn, tokens[:, :1])
    with pytest.raises(ValueError, match="time on dim 1"):
        check_causal(lambda t: torch.zeros(t.shape[1], 3), tokens)


def test_perturbation_changes_every_future_token(tokens):
    seen = []

    def record(t):
        seen.append(t.clone())
        return t.float()[..., None]

    check_causal(record, tokens, positions=[5], vocab_size=256)
    base, changed = seen
    assert torch.equal(base[:, :6], changed[:, :6])
    assert bool((base[:, 6:] != changed[:, 6:]).all())
    assert int(changed.max()) < 256 and not math.isnan(float(changed.float().mean()))
