"""The checks of exercises/11_your_own_mechanism.ipynb (see ``exercise_checks``), and the
notebook's window model, which its checks build too."""

from __future__ import annotations

import types
import unittest.mock

import torch
import torch.nn.functional as F

from blockmem_lite import masks, registry
from blockmem_lite.checks import CheckFailed, check_causal, check_close, check_equal, check_true
from blockmem_lite.config import ModelConfig, preset
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.measure import metrics
from blockmem_lite.measure.flops import (
    dense_decode_layer_flops,
    dense_layer_flops,
    flop_ceiling,
    layer_matmul_flops,
    lm_head_flops,
)
from blockmem_lite.models.dense import DenseLM
from blockmem_lite.nn import Block, attention, reference_attention
from blockmem_lite.own_work import check_prediction
from blockmem_lite.runtime import seed_everything

# --- the notebook's window model --------------------------------------------------------------


class WindowBlock(Block):
    """A pre-norm block that attends through mask_fn(q_len, kv_len, window)."""

    def __init__(self, cfg, window, mask_fn):
        super().__init__(cfg.d_model, cfg.n_head, cfg.mlp_ratio, cfg.rope_base, cfg.norm_eps)
        self.window, self.mask_fn = window, mask_fn

    def forward(self, x, positions=None, cache=None, reference=False):
        kv_len = x.shape[1] + (cache.length if cache is not None else 0)
        mask = self.mask_fn(x.shape[1], kv_len, self.window).to(x.device)
        return super().forward(x, positions, cache, reference, mask=mask, causal=False)


def window_lm(model_cfg, mask_fn, window):
    """A DenseLM whose blocks attend through mask_fn; eval mode."""
    class WindowLM(DenseLM):
        def build_block(self, index):
            return WindowBlock(self.cfg, window, mask_fn)
    seed_everything(0)
    return WindowLM(model_cfg).eval()


def sliding(q_len, kv_len, window):
    return masks.sliding_window_mask(q_len, kv_len, window=window)


def swa_flops(cfg, seq_len, decode=False):
    """Notebook 11's FLOP model: n_layer * (24 d^2 + 4 d * keys) + 2 d V."""
    w = cfg.window
    if decode:
        layer = dense_decode_layer_flops(cfg.d_model, min(seq_len, w))
    else:
        keys = seq_len / 2 if seq_len <= w else w - w * w / (2 * seq_len)
        layer = layer_matmul_flops(cfg.d_model) + 4.0 * cfg.d_model * keys
    return cfg.n_layer * layer + lm_head_flops(cfg.d_model, cfg.vocab_size)


# --- exercise 1: a dilated window -------------------------------------------------------------


def brute_force_dilated(q_len, kv_len, window, dilation):
    allowed = torch.zeros(q_len, kv_len, dtype=torch.bool)
    for i in range(q_len):
        for n in range(window):
            key = kv_len - q_len + i - n * dilation
            if key >= 0:
                allowed[i, key] = True
    return allowed


@exercise_check("nb11-cell-8", own_work={"dilated_window_mask": (
    masks.sliding_window_mask, masks.causal_mask, brute_force_dilated)})
def dilated_window_check(t):
    """dilated_window_mask against a brute force on fixed sizes and sizes drawn anew."""
    dilated_window_mask = t.answer("dilated_window_mask")
    fresh = (t.fresh_int(1, 20), t.fresh_int(20, 40), t.fresh_int(1, 6), t.fresh_int(1, 5))
    for args in [(24, 24, 4, 3), (24, 24, 5, 1), (3, 30, 4, 2), (16, 16, 1, 4), (20, 20, 6, 2),
                 fresh]:
        check_equal(dilated_window_mask(*args), brute_force_dilated(*args),
                    f"dilated_window_mask(q_len, kv_len, W, r)={args} vs brute force")
    check_equal(dilated_window_mask(30, 30, 4, 3).sum(-1).max(), torch.tensor(4),
                "a row never holds more than W keys")


# --- exercise 2: attention sinks --------------------------------------------------------------

SINK_MODEL = preset("fast", arch="dense").model       # the model the sinks go into
SINK_WINDOW = SINK_MODEL.seq_len // 4


def brute_force_sinks(q_len, kv_len, window, sinks):
    allowed = sliding(q_len, kv_len, window).clone()
    for i in range(q_len):
        for key in range(min(sinks, kv_len - q_len + i + 1)):     # the sinks in query i's past
            allowed[i, key] = True
    return allowed


@exercise_check("nb11-cell-12", own_work={"sink_window_mask": (brute_force_sinks,),
                                          "sink_keys_per_query": (brute_force_sinks,)})
def sinks_check(t):
    """sink_window_mask and sink_keys_per_query against a brute force (fixed sizes and sizes
    drawn anew), then a window model with 4 sinks: causal, and its last token reads token 0."""
    sink_window_mask = t.answer("sink_window_mask")
    sink_keys_per_query = t.answer("sink_keys_per_query")
    fresh = (t.fresh_int(1, 20), t.fresh_int(20, 30), t.fresh_int(1, 8), t.fresh_int(1, 4))
    for args in [(20, 20, 4, 1), (3, 25, 6, 2), (8, 8, 8, 1), (12, 12, 1, 4), (10, 10, 3, 4),
                 fresh]:
        check_equal(sink_window_mask(*args), brute_force_sinks(*args),
                    f"sink_window_mask(q_len, kv_len, W, sinks)={args} vs brute force")
    for window, sinks in ((4, 1), (2, 3), (SINK_WINDOW, 4), (t.fresh_int(1, 12),
                                                              t.fresh_int(1, 6))):
        length = 3 * window + sinks
        check_equal([sink_keys_per_query(pos, window, sinks) for pos in range(length)],
                    brute_force_sinks(length, length, window, sinks).sum(-1).tolist(),
                    f"keys per query vs the brute-force mask's row sums, W={window}, "
                    f"sinks={sinks}")
    T, V = SINK_MODEL.seq_len, SINK_MODEL.vocab_size
    sink_model = window_lm(SINK_MODEL, lambda q_len, kv_len, w: sink_window_mask(q_len, kv_len,
                                                                                 w, 4),
                           SINK_WINDOW)
    tokens = torch.randint(0, V, (2, T), generator=t.fresh_generator())
    check_causal(sink_model, tokens, block_sizes=SINK_WINDOW)
    changed = tokens.clone()
    changed[:, 0] = (tokens[:, 0] + 1) % V
    with torch.no_grad():
        far = (sink_model(changed).logits - sink_model(tokens).logits)[:, -1].abs().max()
    check_true(far > 1e-6, f"the last token (position {T - 1}) now depends on token 0 "
                           f"(moved {far:.2g})")


# --- exercise 3: the FLOP ceiling -------------------------------------------------------------


def not_allowed(*args, **kwargs):
    raise CheckFailed("predicted_ceiling: predict from the formula; metrics.flops_per_token "
                      "is switched off in this check")


@exercise_check("nb11-cell-16", own_work={"predicted_ceiling": (
    metrics.flops_per_token, swa_flops, flop_ceiling, dense_layer_flops,
    registry.get("dense").flops)})                          # every route to a FLOP model
def ceiling_check(t):
    """predicted_ceiling against dense's FLOP model over swa_flops, on fixed sizes (the fast
    and class windows) and sizes drawn anew."""
    predicted_ceiling = t.answer("predicted_ceiling")
    cases = [(w // 2, 32, 2, 256, w) for w in (16, 64)] + \
        [(4 * w, 128, 4, 256, w) for w in (16, 64)] + \
        [(1024, 384, 8, 50257, 256),
         (t.fresh_int(8, 4096), 16 * t.fresh_int(1, 32), t.fresh_int(1, 12),
          t.fresh_int(2, 60000), t.fresh_int(1, 512))]
    for seq_len, d, n_layer, vocab, window in cases:
        with unittest.mock.patch.object(metrics, "flops_per_token", not_allowed):
            got = predicted_ceiling(seq_len, d, n_layer, vocab, window)
        sizes = dict(d_model=d, n_layer=n_layer, vocab_size=vocab)
        expected = metrics.flops_per_token(ModelConfig(n_head=4, seq_len=seq_len, **sizes),
                                           seq_len) / \
            swa_flops(types.SimpleNamespace(window=window, **sizes), seq_len)
        check_prediction(got, torch.tensor(expected, dtype=torch.float64),  # within rtol
                         f"ceiling at T={seq_len}, d={d}, {n_layer} layers, V={vocab}, "
                         f"W={window}",
                         hint="which terms do the two costs share, and which case of k-bar "
                              "holds at this T and W?", atol=0, rtol=1e-9)


# --- exercise 4: chunked window attention -----------------------------------------------------


def chunked_counted(t, q, k, v, window) -> tuple:
    """Where the answers live: chunked_window_attention(q, k, v, window), and the number of
    keys each call of F.scaled_dot_product_attention was given."""
    chunked_window_attention = t.answer("chunked_window_attention")
    real_sdpa, key_lengths = F.scaled_dot_product_attention, []

    def counting_sdpa(q, k, v, *args, **kwargs):
        key_lengths.append(k.shape[-2])                    # the keys each query is given
        return real_sdpa(q, k, v, *args, **kwargs)

    with unittest.mock.patch.object(F, "scaled_dot_product_attention", counting_sdpa):
        got = chunked_window_attention(q, k, v, window)
    return got, key_lengths


@exercise_check("nb11-cell-22", own_work={"chunked_window_attention": (
    reference_attention, attention)})
def chunked_check(t):
    """chunked_window_attention against masked reference attention, with 2W keys per SDPA
    call, on fixed sizes and one drawn anew."""
    t.answer("chunked_window_attention")
    gen = t.fresh_generator()
    drawn = t.fresh_int(2, 12)
    for length, window in [(32, 8), (24, 4), (16, 16), (40, 1), (drawn * t.fresh_int(2, 6), drawn)]:
        q, k, v = torch.randn(3, 2, 3, length, 8, dtype=torch.float64, generator=gen).unbind(0)
        expected, _ = reference_attention(q, k, v, mask=sliding(length, length, window))
        got, key_lengths = t.remote(chunked_counted, q, k, v, window)
        check_close(got, expected, f"chunked vs masked window attention, T={length}, "
                    f"W={window}", atol=1e-10)
        check_true(bool(key_lengths) and set(key_lengths) == {2 * window},
                   f"T={length}, W={window}: SDPA sees 2W = {2 * window} keys per query, not "
                   f"T (key lengths given: {key_lengths})")
