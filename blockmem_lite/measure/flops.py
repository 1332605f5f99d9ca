"""The shared part of the analytic FLOP model (docs/MEASUREMENTS.md, The FLOP model).

Forward FLOPs per token; a multiply-add counts 2; training costs 3x the
forward. ``FlopCounterMode`` counts 0 for CPU SDPA, so the kit uses formulas:
the pieces every architecture shares live here (the layer matmuls, dense
attention, the LM head); each mechanism module adds its own formula and
registers ``flops(cfg, seq_len, decode)``; ``metrics.flops_per_token`` asks
the registry.
"""

from __future__ import annotations

from blockmem_lite.validation import check_positive

TRAIN_FLOP_FACTOR = 3  # forward + backward = 3 x forward (backward = 2 x forward)


def layer_matmul_flops(d_model: int) -> float:
    """``24·d²``: q/k/v/out projections (2·4·d²) + SwiGLU MLP (2·3·(8/3)·d²), per token."""
    check_positive("d_model", d_model)
    return 24.0 * d_model * d_model


def dense_layer_flops(d_model: int, seq_len: int) -> float:
    """Dense causal layer, training/prefill: ``24·d² + 2·T·d`` per token.

    ``2·T·d``: QKᵀ and AV cost 4·d per key, and causal attention (the kernel
    skips the masked half) sees T/2 keys on average.
    """
    check_positive("seq_len", seq_len)
    return layer_matmul_flops(d_model) + 2.0 * seq_len * d_model


def dense_decode_layer_flops(d_model: int, context_len: int) -> float:
    """Dense layer, one decoding step at context ``t``: ``24·d² + 4·t·d``.

    Derived like ``dense_layer_flops``: the single new query attends to all t
    cached keys (no causal half), 4·d per key.
    """
    check_positive("context_len", context_len)
    return layer_matmul_flops(d_model) + 4.0 * context_len * d_model


def lm_head_flops(d_model: int, vocab_size: int) -> float:
    """The LM head: ``2·d·V`` per token, for every architecture."""
    check_positive("d_model", d_model)
    check_positive("vocab_size", vocab_size)
    return 2.0 * d_model * vocab_size


def training_flops_per_token(forward_flops: float) -> float:
    """Forward + backward = 3 × forward (the backward pass costs twice the forward)."""
    if isinstance(forward_flops, bool) or not isinstance(forward_flops, (int, float)) \
            or forward_flops < 0:
        raise ValueError(f"forward_flops={forward_flops!r} is not allowed: expected a number >= 0")
    return TRAIN_FLOP_FACTOR * forward_flops


def flop_ceiling(dense_flops: float, variant_flops: float) -> float:
    """Best possible speed-up over dense if time were proportional to FLOPs: dense / variant."""
    check_positive("dense_flops", dense_flops)
    check_positive("variant_flops", variant_flops)
    return dense_flops / variant_flops
