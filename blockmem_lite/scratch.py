"""The previous chapters: what notebook 01 builds from torch ops, kept for the notebooks after it.

As in rasbt's ``previous_chapters.py``, a later notebook imports these pieces instead of
writing them again: notebook 01 writes each one in a cell and asserts its cell equals the
function here; notebook 02 on import them (``from blockmem_lite.scratch import ...``).
They use a library layer's weights, never its forward, and ``tests/test_scratch.py``
proves each equals the layer it mirrors (``nn.RMSNorm``, ``nn.MLP``,
``nn.reference_attention``, ``nn.SelfAttention``, a whole ``DenseLM``).
"""

import math

import torch
import torch.nn.functional as F

from blockmem_lite.masks import causal_mask


def split_heads(y: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, hd): one slice of width hd = D / H per head."""
    b, t, d = y.shape
    return y.view(b, t, n_head, d // n_head).transpose(1, 2)


def merge_heads(y: torch.Tensor) -> torch.Tensor:
    """(B, H, T, hd) -> (B, T, H * hd): the inverse of split_heads."""
    b, h, t, hd = y.shape
    return y.transpose(1, 2).reshape(b, t, h * hd)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / √hd, masked) v. q (B, H, Tq, hd), k/v (B, H, Tk, hd), mask (Tq, Tk)
    bool (True = may attend) -> (out (B, H, Tq, hd), weights (B, H, Tq, Tk))."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])             # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)                                # rows sum to 1
    return weights @ v, weights


def rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """x / rms(x) * gain with an ``nn.RMSNorm``'s eps and gain. (..., D) -> (..., D)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight


def swiglu(x: torch.Tensor, mlp) -> torch.Tensor:
    """W_down(silu(W_gate x) * W_up x) with an ``nn.MLP``'s weights. (..., D) -> (..., D)."""
    return (F.silu(x @ mlp.gate.weight.T) * (x @ mlp.up.weight.T)) @ mlp.down.weight.T


def attention_sublayer(x: torch.Tensor, attn) -> torch.Tensor:
    """Causal self-attention with RoPE from an ``nn.SelfAttention``'s weights. (B, T, D) ->
    (B, T, D)."""
    w_q, w_k, w_v = attn.qkv.weight.chunk(3)                               # each (D, D)
    positions = torch.arange(x.shape[1], device=x.device)
    q = attn.rope(split_heads(x @ w_q.T, attn.n_head), positions)          # (B, H, T, hd)
    k = attn.rope(split_heads(x @ w_k.T, attn.n_head), positions)
    v = split_heads(x @ w_v.T, attn.n_head)
    y, _ = attention(q, k, v, causal_mask(x.shape[1], device=x.device))
    return merge_heads(y) @ attn.out.weight.T


def gpt_logits(tokens: torch.Tensor, model) -> torch.Tensor:
    """A ``DenseLM``'s forward from torch ops and its weights. (B, T) -> (B, T, V)."""
    x = model.embed.weight[tokens]                                         # (B, T, D)
    for block in model.blocks:
        x = x + attention_sublayer(rms_norm(x, block.norm1), block.attn)
        x = x + swiglu(rms_norm(x, block.norm2), block.mlp)
    return rms_norm(x, model.norm) @ model.head.weight.T                  # (B, T, V)
