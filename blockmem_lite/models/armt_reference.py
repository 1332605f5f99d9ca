"""ARMT's reference forward: docs/PAPERS.md, ARMT equations, step by step, no fast-path tricks.

``reference_forward(model, tokens)`` writes the segment loop, READ and WRITE of an
``models.armt.ARMT`` out one equation per line (kit backbones only); tests check that it
equals the fast forward (tests/test_reference_forwards.py).
"""

from __future__ import annotations

import torch

from blockmem_lite.models.armt import ARMT, AssociativeMemoryLayer, backbone_name
from blockmem_lite.ops.armt_memory import DPFP_NU, dpfp


def reference_forward(model: ARMT, tokens: torch.Tensor) -> torch.Tensor:
    """ARMT logits written out equation by equation. tokens (B, T) -> (B, T, V).

    The segment loop with the READ and WRITE (docs/PAPERS.md, ARMT equations) spelled out
    per wrapped layer; the backbone blocks run with the hand-written attention.
    Every segment, the last one too, gets its memory tokens and writes (the
    fast path skips that unread last write; the segment's logits cannot see
    it). Kit backbones only (a ``DenseLM``); eval-mode maths (no dropout).
    Tests check it equals ``model(tokens).logits``.
    """
    backbone = model.backbone
    if backbone_name(backbone) != "dense":
        raise ValueError(f"backbone {backbone_name(backbone)!r} is not allowed: the reference "
                         "forward runs kit blocks (a DenseLM backbone) with reference attention")
    b = tokens.shape[0]
    memory: dict[int, tuple] = {}                          # layer -> (A (B, K, D), z (B, K))
    logits = []
    for segment in tokens.split(model.segment_size, dim=1):              # x_1 .. x_S
        n = segment.shape[1]
        p = model.memory_tokens.expand(b, -1, -1)                         # (B, M, D)  P
        h = torch.cat([backbone.embed(segment), p], dim=1)                # (B, n+M, D) [E(x_s); P]
        positions = torch.arange(h.shape[1], device=h.device)             # RoPE restarts at 0
        for i, block in enumerate(backbone.blocks):
            layer = model.memory_layer(i)
            if layer is not None and i in memory:                         # 1. READ (not at s = 1)
                h = h + _reference_read(layer, h, *memory[i])
            h = block(h, positions, reference=True)                       # 2. LAYER, causal
            if layer is not None:                                         # 3. WRITE from m = h[n:]
                memory[i] = _reference_write(layer, h[:, n:], memory.get(i))
        logits.append(backbone.head(backbone.norm(h[:, :n])))             # real tokens only
    return torch.cat(logits, dim=1)                                       # (B, T, V)


def _reference_read(layer: AssociativeMemoryLayer, h: torch.Tensor, A: torch.Tensor,
                    z: torch.Tensor) -> torch.Tensor:
    """r_t = (q_t A) / (q_t . z + eps) with q_t = phi(W_Q h_t). h (B, T, D) -> (B, T, D)."""
    q = dpfp(h @ layer.w_q.weight.T, DPFP_NU, layer.normalize_phi)       # (B, T, K)
    return (q @ A) / ((q @ z[..., None]) + layer.eps)                     # (B, T, D)


def _reference_write(layer: AssociativeMemoryLayer, m: torch.Tensor, old: tuple | None):
    """The delta-rule write of the memory-token outputs m (B, M, D) -> the new (A, z)."""
    k = dpfp(m @ layer.w_k.weight.T, DPFP_NU, layer.normalize_phi)       # (B, M, K)  k = phi(W_K m)
    v = m @ layer.w_v.weight.T                                            # (B, M, D)  v = W_V m
    beta = torch.sigmoid(m @ layer.w_beta.weight.T + layer.w_beta.bias)  # (B, M, 1)  beta
    if old is None:                                                       # empty memory (s = 1)
        A = torch.zeros(m.shape[0], k.shape[-1], m.shape[-1], dtype=m.dtype, device=m.device)
        z = torch.zeros(m.shape[0], k.shape[-1], dtype=m.dtype, device=m.device)
        v_bar, gamma = torch.zeros_like(v), torch.ones_like(beta)         # v_bar = 0, gamma = 1
    else:
        A, z = old                                                        # the OLD state
        k_dot_z = k @ z[..., None]                                        # (B, M, 1)  k . z
        v_bar = (k @ A) / (k_dot_z + layer.eps)                           # (B, M, D)  stored value
        key_norm2 = (k * k).sum(-1, keepdim=True)                         # (B, M, 1)  |k|^2
        if not layer.normalize_phi:                                       # the 2024 code's form
            key_norm2 = key_norm2 + layer.eps
        gamma = (1 - (k_dot_z + layer.eps) / key_norm2).clamp(0, 1).detach()  # novelty
        if not layer.correction:
            gamma = torch.ones_like(gamma)
    # (B, K, D)  A += sum_i beta_i k_i (v_i - v_bar_i)^T   (delta rule, all M in parallel)
    A = A + k.transpose(1, 2) @ (beta * (v - v_bar))
    z = z + (gamma * k).sum(dim=1)                          # (B, K)  z += sum_i gamma_i k_i
    return A, z
