"""Every built-in mechanism's analytic FLOP model against torch's own counter.

``FlopCounterMode`` (with the conventions of ``measure/flopcount.py``) counts what the kernels
do; each mechanism's ``flops`` must agree within 10% at two lengths, in training and in
decoding. The test plugin checks its own model in ``test_plugin_mechanism.py``.
"""

import dataclasses

import pytest
import torch

from blockmem_lite import preset, registry
from blockmem_lite.measure import flopcount

BUILT_IN = ("armt", "bcmt", "cat", "dense", "honly", "moc")
LENGTHS = (128, 512)
TOLERANCE = 0.10


def small(arch: str, seq_len: int):
    return dataclasses.replace(preset("fast").model, arch=arch, seq_len=seq_len, d_model=64,
                               n_layer=2, n_head=4, vocab_size=256)


def test_every_built_in_mechanism_is_checked():
    assert set(BUILT_IN) <= set(registry.names())


@pytest.mark.parametrize("phase", flopcount.PHASES)
@pytest.mark.parametrize("seq_len", LENGTHS)
@pytest.mark.parametrize("arch", BUILT_IN)
def test_the_analytic_flops_agree_with_torchs_count(arch, seq_len, phase):
    gap = flopcount.flop_model_gap(small(arch, seq_len), phase)
    assert gap is not None, f"{arch} has no {phase} FLOP model"
    assert gap.ratio == pytest.approx(1.0, abs=TOLERANCE), gap


def test_the_count_adds_the_cpu_attention_kernels_and_halves_causal_ones():
    q = torch.randn(1, 2, 16, 8)
    full = flopcount.counted_flops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    causal = flopcount.counted_flops(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))
    assert full == 2 * (2 * 2 * 16 * 16 * 8)              # QK^T and AV: 2 FLOPs a multiply-add
    assert causal == full / 2


@pytest.mark.parametrize("phase", flopcount.PHASES)
def test_a_model_that_forgets_a_term_is_caught(monkeypatch, phase):
    cfg = small("dense", 512)
    honest = flopcount.flop_model_gap(cfg, phase)
    attention = 4.0 * 512 * cfg.d_model * cfg.n_layer            # decode: every cached key
    attention /= 1 if phase == "decode" else 2                   # train: causal, T/2 keys
    forgetful = flopcount.metrics.flops_per_token
    monkeypatch.setattr(flopcount.metrics, "flops_per_token",
                        lambda c, t, decode=False: forgetful(c, t, decode) - attention)
    wrong = flopcount.flop_model_gap(cfg, phase)
    assert abs(honest.ratio - 1) < TOLERANCE < abs(wrong.ratio - 1), (honest, wrong)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="phase='prefill'"):
        flopcount.flop_model_gap(small("dense", 64), "prefill")
    with pytest.raises(ValueError, match="seq_len=-1"):
        flopcount.flop_model_gap(small("dense", 64), "train", seq_len=-1)
