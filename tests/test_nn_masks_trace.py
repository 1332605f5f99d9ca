"""Shared layers, masks and trace: the pieces every mechanism reuses."""

import subprocess
import sys

import pytest
import torch

from blockmem_lite import masks
from blockmem_lite.nn import MLP, KVCache, RMSNorm, RotaryEmbedding, SelfAttention
from blockmem_lite.trace import record, scope, trace


def test_causal_mask_square_and_bottom_right():
    m = masks.causal_mask(4)
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())
    m2 = masks.causal_mask(2, 5)  # the last 2 of 5 positions
    assert m2.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_block_causal_mask_is_causal_and_block_local():
    m = masks.block_causal_mask(6, 2)
    for q in range(6):
        for k in range(6):
            assert m[q, k] == (k <= q and q // 2 == k // 2)
    assert masks.mask_density(m) == pytest.approx(9 / 36)
    # one block spanning everything is the plain causal mask
    assert torch.equal(masks.block_causal_mask(5, 5), masks.causal_mask(5))


@pytest.mark.parametrize("fn, args, name", [
    (masks.causal_mask, (0,), "q_len"),
    (masks.causal_mask, (3, 2), "q_len=3"),
    (masks.block_causal_mask, (8, 0), "block_size"),
])
def test_mask_errors_name_the_parameter(fn, args, name):
    with pytest.raises(ValueError, match=name):
        fn(*args)


def test_sliding_window_mask_matches_brute_force_and_bottom_right():
    for q_len, kv_len, window in [(7, 7, 3), (2, 9, 4), (5, 5, 1), (6, 6, 10)]:
        got = masks.sliding_window_mask(q_len, kv_len, window=window)
        expected = torch.tensor([[0 <= (kv_len - q_len + i) - k < window for k in range(kv_len)]
                                 for i in range(q_len)])
        assert torch.equal(got, expected), (q_len, kv_len, window)
    assert torch.equal(masks.sliding_window_mask(6, window=6), masks.causal_mask(6))
    with pytest.raises(ValueError, match="window=0 is not allowed"):
        masks.sliding_window_mask(4, window=0)


def test_rmsnorm_unit_rms_and_keeps_fp64():
    x = torch.randn(3, 7, 16, dtype=torch.float64) * 5
    y = RMSNorm(16).double()(x)
    assert y.dtype == torch.float64
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(3, 7, dtype=torch.float64), atol=1e-4)


def test_rope_scores_depend_only_on_relative_offset():
    rope = RotaryEmbedding(8)
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 8, dtype=torch.float64)

    def score(pq, pk):
        return (rope(q, torch.tensor([pq])) * rope(k, torch.tensor([pk]))).sum()

    assert torch.allclose(score(5, 2), score(105, 102), atol=1e-9)
    assert not torch.allclose(score(5, 2), score(5, 4), atol=1e-6)
    # rotation keeps the norm
    assert torch.allclose(rope(q, torch.tensor([37])).norm(), q.norm())


def test_rope_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="head_dim=5"):
        RotaryEmbedding(5)


def test_mlp_shape_and_hidden_multiple():
    mlp = MLP(30)
    assert mlp.gate.out_features % 8 == 0
    assert mlp(torch.randn(2, 3, 30)).shape == (2, 3, 30)


def test_kv_cache_append_and_bytes():
    cache = KVCache(2, 3, 10, 4)
    k, v = cache.append(torch.ones(2, 3, 4, 4), torch.ones(2, 3, 4, 4))
    assert k.shape == (2, 3, 4, 4) and cache.length == 4
    assert cache.nbytes() == 2 * 2 * 3 * 10 * 4 * 4
    cache.reset()
    assert cache.length == 0


def test_chunked_prefill_through_a_cache_matches_full_attention():
    attn = SelfAttention(16, 2).double()
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    full = attn(x)
    cache = KVCache(1, 2, 9, 8, dtype=torch.float64)
    parts = [attn(x[:, :4], cache=cache), attn(x[:, 4:7], cache=cache), attn(x[:, 7:], cache=cache)]
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-12)


def test_trace_is_free_outside_and_scoped_inside():
    record("ignored", torch.ones(1))  # no active trace: nothing happens, nothing raises
    with trace() as t:
        with scope("layer0"):
            record("x", torch.ones(2))
            record("x", torch.zeros(2))
    assert t.keys() == ["layer0.x"]
    assert torch.equal(t["layer0.x"], torch.zeros(2))
    assert len(t.all("layer0.x")) == 2
    with trace(names=["*.y"]) as t2:
        with scope("a"):
            record("x", torch.ones(1))
            record("y", torch.ones(1))
    assert t2.keys() == ["a.y"]


def test_trace_stores_detached_copies():
    v = torch.ones(2, requires_grad=True)
    with trace() as t:
        record("v", v * 2)
    assert not t["v"].requires_grad


def test_import_is_light():
    code = ("import sys, blockmem_lite; heavy = [m for m in ('plotly', 'ipywidgets', 'datasets', "
            "'nbformat', 'pandas') if m in sys.modules]; print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_self_attention_masks_bidirectional_and_custom():
    attn = SelfAttention(16, 2).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    bidirectional = attn(x, causal=False)
    assert torch.allclose(bidirectional, attn(x, causal=False, reference=True), atol=1e-12)
    # the first position sees the future without the causal mask
    assert not torch.allclose(bidirectional[:, 0], attn(x)[:, 0], atol=1e-6)
    custom = masks.block_causal_mask(7, 3)
    assert torch.allclose(attn(x, mask=custom, causal=False),
                          attn(x, mask=custom, causal=False, reference=True), atol=1e-12)
    # a block-causal mask equals attending within each block alone
    assert torch.allclose(attn(x, mask=custom, causal=False)[:, 3:6],
                          attn(x[:, 3:6], positions=torch.arange(3, 6)), atol=1e-12)
