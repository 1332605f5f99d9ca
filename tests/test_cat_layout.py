"""CAT's interleaved layout: pack / readout round trip (c2; docs/PAPERS.md, CAT equations) and
the readout rule; the per-chunk attention strategies (``ops.cat_attention``) against their
plain form."""

import pytest
import torch

from blockmem_lite.masks import cat_mask
from blockmem_lite.nn import reference_attention
from blockmem_lite.ops.cat_attention import masked_attention, per_chunk_attention
from blockmem_lite.ops.cat_layout import (
    interleave,
    n_slots,
    readout_slots,
    slot_positions,
    token_slots,
)

CASES = [(k, c) for k in (1, 2, 3, 5) for c in (1, 2, 4, 8)]


def _features(n_chunks, chunk_size, separator):
    """Interleave with 'newest token visible' as the feature: a token slot carries its own
    id, the slot of f_k carries the last id of chunk k, the dummy and SEP carry -1."""
    ids = torch.arange(n_chunks * chunk_size, dtype=torch.float64)
    tokens = ids.view(1, n_chunks, chunk_size, 1)
    compressed = ids.view(1, n_chunks, chunk_size)[..., -1:]                # (1, K, 1)
    sep = torch.tensor([-1.0], dtype=torch.float64) if separator else None
    return interleave(tokens, compressed, torch.tensor([-1.0], dtype=torch.float64), sep)[0, :, 0]


@pytest.mark.parametrize("separator", [False, True])
@pytest.mark.parametrize("n_chunks, chunk_size", CASES)
def test_c2_pack_then_read_out_gives_every_token_once(n_chunks, chunk_size, separator):
    seq = _features(n_chunks, chunk_size, separator)
    assert seq.shape == (n_slots(n_chunks, chunk_size, separator),)
    tokens = seq[token_slots(n_chunks, chunk_size, separator)]
    assert torch.equal(tokens, torch.arange(n_chunks * chunk_size, dtype=torch.float64))
    if not separator:   # with SEP the readout slot is a SEP, which carries no feature itself
        read = seq[readout_slots(n_chunks, chunk_size, separator)]
        assert torch.equal(read, torch.arange(n_chunks * chunk_size, dtype=torch.float64))


@pytest.mark.parametrize("separator", [False, True])
@pytest.mark.parametrize("n_chunks, chunk_size", CASES)
def test_readout_sees_token_i_and_nothing_later(n_chunks, chunk_size, separator):
    """Dependency closure through the mask: from the readout slot of token i the newest
    visible token (directly, or inside a compressed slot) is exactly i."""
    seq = _features(n_chunks, chunk_size, separator)
    mask = cat_mask(n_chunks, chunk_size, separator)
    for i, slot in enumerate(readout_slots(n_chunks, chunk_size, separator).tolist()):
        assert seq[mask[slot]].max().item() == i


def test_compressed_slots_sit_at_rope_position_zero():
    pos = slot_positions(3, 4)                      # W = 5
    assert pos.tolist() == [0, 1, 2, 3, 4] * 3 + [0]
    assert slot_positions(2, 4, separator=True).tolist()[:8] == [0, 1, 2, 3, 4, 5, 0, 1]


@pytest.mark.parametrize("separator", [False, True])
def test_last_token_of_a_chunk_is_read_from_the_next_compressed_slot(separator):
    """Generation never feeds a chunk's last token to the decoder (it is compressed
    instead), so training must predict the next chunk's first token from f_k."""
    k, c = 3, 4
    width = c + (2 if separator else 1)
    slots = readout_slots(k, c, separator)
    expected_last = [(g + 1) * width + (1 if separator else 0) for g in range(k)]
    assert slots[c - 1::c].tolist() == expected_last
    raw = set(token_slots(k, c, separator).tolist())
    assert not raw & set(expected_last)
    assert torch.equal(slots.view(k, c)[:, :-1], token_slots(k, c, separator).view(k, c)[:, :-1])


@pytest.mark.parametrize("separator", [False, True])
@pytest.mark.parametrize("n_chunks, chunk_size", CASES)
def test_per_chunk_attention_equals_masked_attention(n_chunks, chunk_size, separator):
    s = n_slots(n_chunks, chunk_size, separator)
    q, k, v = torch.randn(3, 2, 3, s, 4, dtype=torch.float64).unbind(0)    # (B, H, S, hd)
    expected, _ = reference_attention(q, k, v, mask=cat_mask(n_chunks, chunk_size, separator))
    assert torch.equal(masked_attention(q, k, v, n_chunks, chunk_size, separator), expected)
    got = per_chunk_attention(q, k, v, n_chunks, chunk_size, separator)
    assert torch.allclose(got, expected, atol=1e-12)


@pytest.mark.parametrize("attention", [per_chunk_attention, masked_attention])
def test_cat_attention_checks_the_length(attention):
    q = torch.randn(1, 1, 7, 4)
    with pytest.raises(ValueError, match="slots is not allowed"):
        attention(q, q, q, 2, 4)


def test_per_chunk_strategies_agree_with_the_masked_reference():
    for k, c, sep in [(1, 1, False), (3, 4, False), (5, 2, True), (4, 8, True)]:
        s = n_slots(k, c, sep)
        q, key, v = torch.randn(3, 2, 3, s, 8, dtype=torch.float64).unbind(0)
        expected = masked_attention(q, key, v, k, c, sep)
        for strategy in ("merge", "copy", "split", "auto"):
            got = per_chunk_attention(q, key, v, k, c, sep, strategy=strategy)
            assert torch.allclose(got, expected, atol=1e-12), (k, c, sep, strategy)
    with pytest.raises(ValueError, match="strategy='flash' is not allowed"):
        per_chunk_attention(q, key, v, 4, 8, True, strategy="flash")


@pytest.mark.parametrize("strategy", ["merge", "copy", "split"])
@pytest.mark.parametrize("k, c, sep", [(1, 1, False), (1, 4, True), (3, 4, False),
                                       (5, 2, True), (9, 4, False)])
def test_per_chunk_strategies_give_the_reference_gradients(strategy, k, c, sep):
    """Backward too: ``merge`` writes its own (two flash backwards given the joined output
    and log-sum-exp); inputs laid out (B, S, H, hd) in memory, as the projection gives."""
    gen = torch.Generator().manual_seed(k * 10 + c)
    s = n_slots(k, c, sep)
    q, key, v = (torch.randn(2, s, 3, 8, generator=gen, dtype=torch.float64).transpose(1, 2)
                 .requires_grad_() for _ in range(3))
    weights = torch.randn(2, 3, s, 8, generator=gen, dtype=torch.float64)
    expected = masked_attention(q, key, v, k, c, sep)
    want = torch.autograd.grad((expected * weights).sum(), (q, key, v))
    got = per_chunk_attention(q, key, v, k, c, sep, strategy=strategy)
    assert torch.allclose(got, expected, atol=1e-12)
    for a, b in zip(torch.autograd.grad((got * weights).sum(), (q, key, v)), want, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def test_auto_strategy_merges_on_the_cpu_and_falls_back_elsewhere(monkeypatch):
    from blockmem_lite.ops import cat_attention

    picked = []
    monkeypatch.setattr(cat_attention._MergedAttention, "apply",
                        lambda *a: picked.append("merge") or a[0])
    q = torch.randn(1, 1, n_slots(2, 4), 4)
    cat_attention.per_chunk_attention(q, q, q, 2, 4)
    assert picked == ["merge"]
    monkeypatch.setattr(cat_attention, "merge_available", lambda t: False)
    cat_attention.per_chunk_attention(q, q, q, 2, 4)        # copy / split, no merge
    assert picked == ["merge"]
    with pytest.raises(ValueError, match="strategy='merge' is not allowed"):
        cat_attention.per_chunk_attention(q, q, q, 2, 4, strategy="merge")


def test_merge_strategy_runs_in_bfloat16_close_to_the_fp64_reference():
    """Under bf16 (autocast's dtype) the CPU flash kernel returns fp32 log-sum-exps next to
    a bf16 output; the join casts the share, and forward and backward stay near fp64."""
    k, c = 9, 4
    s = n_slots(k, c)
    exact = torch.randn(3, 2, 3, s, 16, dtype=torch.float64)
    expected = masked_attention(*exact.unbind(0), k, c)
    q, key, v = (t.to(torch.bfloat16).requires_grad_() for t in exact.unbind(0))
    got = per_chunk_attention(q, key, v, k, c, strategy="merge")
    assert got.dtype == torch.bfloat16
    assert (got.double() - expected).abs().max() < 0.05
    got.float().square().sum().backward()
    assert all(bool(torch.isfinite(t.grad).all()) and t.grad.abs().sum() > 0 for t in (q, key, v))
