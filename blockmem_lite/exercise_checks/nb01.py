"""The checks of exercises/01_dense_attention_from_scratch.ipynb (see ``exercise_checks``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from blockmem_lite import registry
from blockmem_lite.checks import (
    CheckFailed,
    check_causal,
    check_close,
    check_equal,
    check_shape,
    check_true,
    failure,
)
from blockmem_lite.config import ModelConfig
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.masks import causal_mask, sliding_window_mask
from blockmem_lite.models import build_model
from blockmem_lite.nn import KVCache, SelfAttention, attention, reference_attention
from blockmem_lite.own_work import check_prediction
from blockmem_lite.runtime import seed_everything

D, H = 64, 4                      # the layer the checks build: hd = 16
HD = D // H


@exercise_check("nb01-05", own_work={"my_causal_mask": (causal_mask, sliding_window_mask)})
def causal_mask_check(t):
    """my_causal_mask against causal_mask, on fixed sizes and two drawn anew."""
    my_causal_mask = t.answer("my_causal_mask")
    fresh = [(q_len, t.fresh_int(q_len, 40)) for q_len in (t.fresh_int(1, 12), t.fresh_int(1, 12))]
    for q_len, kv_len in [(6, 6), (3, 8), (1, 5)] + fresh:
        check_equal(my_causal_mask(q_len, kv_len), causal_mask(q_len, kv_len),
                    f"my_causal_mask({q_len}, {kv_len}) vs causal_mask")


@exercise_check("nb01-08", own_work={"masked_attention": (
    reference_attention, attention, F.scaled_dot_product_attention)})
def masked_attention_check(t):
    """masked_attention on four kinds of per-sequence mask, a row with no key among them."""
    masked_attention = t.answer("masked_attention")
    gen = t.fresh_generator()
    q, k, v = torch.randn(3, 2, H, 7, HD, dtype=torch.float64, generator=gen).unbind(0)
    real = torch.arange(7)[None, :] >= torch.tensor([0, 3])[:, None]       # sequence 1: 3 pads
    random_mask = torch.rand(2, 7, 7, generator=gen) < 0.4
    random_mask[:, 2] = False                                              # row 2: no key at all
    cases = {"causal, no padding": (q, causal_mask(7).expand(2, 7, 7)),
             "cached, 3 queries x 7 keys": (q[:, :, -3:], causal_mask(3, 7).expand(2, 3, 7)),
             "left-padded batch, causal": (q, causal_mask(7) & real[:, None, :]),
             "random per-sequence mask": (q, random_mask)}
    for name, (queries, mask) in cases.items():
        out, weights = masked_attention(queries, k, v, mask)
        empty = ~mask.any(-1)[:, None, :, None]                            # (B, 1, Tq, 1)
        ref = [reference_attention(queries[b:b + 1], k[b:b + 1], v[b:b + 1], mask[b])
               for b in range(2)]                                          # one mask per sequence
        ref_out, ref_weights = (torch.cat([r[i] for r in ref]) for i in (0, 1))
        check_close(out, torch.where(empty, 0.0, ref_out), f"{name}: output")
        check_close(weights, torch.where(empty, 0.0, ref_weights), f"{name}: weights")


def decode_all(t, weights: dict, xs: torch.Tensor) -> tuple:
    """In the student's notebook: decode_step over every position of ``xs`` (B, T, D) with a
    layer holding ``weights``; returns (the outputs (B, T, D), the cache after each step:
    (T, 2, B, H, T, hd), keys then values)."""
    decode_step = t.answer("decode_step")
    layer = SelfAttention(D, H).double().eval()
    layer.load_state_dict(weights)
    steps = xs.shape[1]
    cache_k = torch.zeros(xs.shape[0], H, steps, HD, dtype=torch.float64)
    cache_v = torch.zeros_like(cache_k)
    outputs, caches = [], []
    with torch.no_grad():
        for i in range(steps):
            outputs.append(decode_step(layer, xs[:, i:i + 1], cache_k, cache_v, i))
            caches.append(torch.stack([cache_k, cache_v]).clone())
    return torch.cat(outputs, dim=1), torch.stack(caches)


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-7, atol=1e-7)


def first_wrong_step(stepped: torch.Tensor, caches: torch.Tensor, full: torch.Tensor,
                     keys_values: torch.Tensor) -> tuple[str, str] | None:
    """What goes wrong first, step by step, as (problem, what to look at): the row the step
    writes, the rows it must leave alone, then its output. None: every step is right."""
    before = torch.zeros_like(caches[0])                                 # (2, B, H, T, hd)
    for i, after in enumerate(caches):
        for j, what in enumerate(("key", "value")):
            if not _close(after[j, :, :, i], keys_values[j, :, :, i]):
                return (f"after step {i} the {what} cache's row {i} does not hold the {what} of "
                        f"position {i}", f"a step writes its own {what} (from attn.project_qkv "
                        "at position t) into row t of the cache, in place, before it reads")
        others = [r for r in range(after.shape[3])
                  if r != i and not torch.equal(after[:, :, :, r], before[:, :, :, r])]
        if others:
            return (f"step {i} changed cache row(s) {others}, not only its own row {i}",
                    "a step writes row t only: the rows before it hold the earlier positions, "
                    "the later rows stay empty until their own step")
        if not _close(stepped[:, i], full[:, i]):
            return (f"step {i}: the output differs from the full causal forward's at position "
                    f"{i}, though the cache holds the right keys and values",
                    "look at the attention of the one query over the cache: which rows it "
                    "reads (0..t), the 1/sqrt(hd) scale, the softmax over the keys")
        before = after
    return None


@exercise_check("nb01-11", own_work={"decode_step": (
    attention, reference_attention, KVCache, SelfAttention.forward,
    F.scaled_dot_product_attention)}, writes={"decode_step": (2, 3)})
def decode_step_check(t):
    """Step-by-step decoding with the cache equals the full causal forward: step by step, the
    row it writes, the rows it leaves alone and its output."""
    steps = t.fresh_int(6, 12)
    layer = SelfAttention(D, H).double().eval()
    xs = torch.randn(2, steps, D, dtype=torch.float64)                   # (B, T, D)
    stepped, caches = t.remote(decode_all, layer.state_dict(), xs)
    with torch.no_grad():
        full = layer(xs)
        _, all_keys, all_values = layer.project_qkv(xs, torch.arange(steps))
    keys_values = torch.stack([all_keys, all_values])                   # (2, B, H, T, hd)
    check_shape(stepped, full.shape, f"the outputs of {steps} decode steps")
    check_shape(caches, (steps, *keys_values.shape), f"the cache after each of {steps} steps")
    wrong = first_wrong_step(stepped, caches, full, keys_values)
    if wrong is not None:
        raise failure(f"{steps} decode steps", *wrong)
    check_close(stepped, full, f"{steps} decode steps vs the full causal forward")
    check_close(caches[-1], keys_values, "the cache holds every key and value after the last step")


@exercise_check("nb01-14", own_work={"kv_cache_bytes": (registry.get("dense").state_bytes,
                                                        KVCache.nbytes)})
def kv_cache_bytes_check(t):
    """kv_cache_bytes against what a dense model's cache really holds."""
    kv_cache_bytes = t.answer("kv_cache_bytes")
    heads = t.fresh_int(1, 4)
    cases = [(ModelConfig(d_model=64, n_layer=2, n_head=4, seq_len=64), 1, 300, torch.float32),
             (ModelConfig(d_model=16 * heads, n_layer=t.fresh_int(1, 4), n_head=heads,
                          seq_len=32), t.fresh_int(2, 4), t.fresh_int(20, 120), torch.float64)]
    for model_cfg, batch, length, dtype in cases:
        model = build_model(model_cfg).to(dtype).eval()
        with torch.no_grad():
            _, state = model.prefill(torch.zeros(batch, 1, dtype=torch.long), max_len=length)
        bytes_per_number = torch.finfo(dtype).bits // 8
        check_equal(kv_cache_bytes(batch, length, model_cfg.d_model, model_cfg.n_layer,
                                   bytes_per_number), state.nbytes(),
                    f"kv_cache_bytes(batch={batch}, t={length}, d={model_cfg.d_model}, "
                    f"layers={model_cfg.n_layer}, {bytes_per_number} B) vs state.nbytes()")


@exercise_check("nb01-19", own_work={"attention_without_mask": (
    attention, reference_attention, F.scaled_dot_product_attention)})
def without_mask_check(t):
    """Attention without a mask, and which positions a changed token moves, with and without."""
    attention_without_mask = t.answer("attention_without_mask")
    predicted_changed_positions = t.answer("predicted_changed_positions")
    seed_everything(2)
    seq_len, changed_at = 12, t.fresh_int(2, 9)
    layer = SelfAttention(D, H).double().eval()
    embed = torch.nn.Embedding(256, D).double()

    def one_layer(tokens, causal):
        """Embedding + one attention layer, with or without the mask. (B, T) -> (B, T, D)."""
        q, k, v = layer.project_qkv(embed(tokens), torch.arange(tokens.shape[1]))
        y = attention(q, k, v, causal=True) if causal else attention_without_mask(q, k, v)
        return layer.out(layer.merge_heads(y))

    tokens = torch.randint(0, 256, (1, seq_len))
    changed = tokens.clone()
    changed[0, changed_at] = (tokens[0, changed_at] + 1) % 256
    with torch.no_grad():
        q, k, v = layer.project_qkv(embed(tokens), torch.arange(seq_len))
        check_close(attention_without_mask(q, k, v), reference_attention(q, k, v)[0],
                    "attention_without_mask vs reference_attention with no mask")
        for causal in (True, False):
            moved = (one_layer(changed, causal) - one_layer(tokens, causal)).abs().amax(-1)[0]
            actual = [i for i in range(seq_len) if moved[i] > 1e-9]
            check_prediction(list(predicted_changed_positions(seq_len, changed_at, causal)),
                             actual, f"positions that change {'with' if causal else 'without'} "
                             f"the mask (token {changed_at} of {seq_len} replaced)",
                             hint="an output moves when anything it reads changes: which "
                                  "queries can read the token at changed_at, with and without "
                                  "the mask?")
        try:
            check_causal(lambda tok: one_layer(tok, causal=False), tokens)
            leak_found = False
        except CheckFailed as err:
            leak_found = True
            print(f"check_causal on the unmasked layer says:\n{err}")
    check_true(leak_found, "check_causal flags the layer without a mask")
