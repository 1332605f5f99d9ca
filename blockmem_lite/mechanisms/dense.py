"""The dense baseline's registration: its FLOP model and KV-cache size.

``models/dense.py`` holds the model; every ratio the kit reports is measured against
the mechanism registered here (``registry.BASELINE``).
"""

from __future__ import annotations

from blockmem_lite.measure.flops import dense_decode_layer_flops, dense_layer_flops, lm_head_flops
from blockmem_lite.models.dense import DenseLM
from blockmem_lite.registry import Mechanism, register


def flops_per_token(cfg, seq_len: int, decode: bool = False) -> float:
    """``n_layer·(24·d² + 2·T·d) + 2·d·V`` (decode: ``4·t·d`` per layer at context t)."""
    layer = (dense_decode_layer_flops(cfg.d_model, seq_len) if decode
             else dense_layer_flops(cfg.d_model, seq_len))
    return cfg.n_layer * layer + lm_head_flops(cfg.d_model, cfg.vocab_size)


def state_bytes(cfg, t: int) -> float:
    """The KV cache: ``2·t·d`` numbers per layer (fp32)."""
    return 4.0 * cfg.n_layer * 2 * t * cfg.d_model


register(Mechanism(
    name="dense", model=DenseLM, state_bytes=state_bytes,
    summary="the GPT baseline: full causal attention (every ratio is measured against it)",
    flops=flops_per_token))
