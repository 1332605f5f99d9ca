"""Shared layers every mechanism reuses: RMSNorm, RoPE, SwiGLU MLP, attention, Block.

Shape legend: B batch, T time, H heads, hd head dim, D model width.

Two attention paths compute the same function:

* ``attention`` (default) calls ``F.scaled_dot_product_attention`` on 4-D
  tensors, the flash/fused kernel on CPU and CUDA: the strong dense baseline.
* ``reference_attention`` writes softmax(q k^T / sqrt(hd)) v out by hand and
  returns the weights too; tests and notebooks use it to check and to plot.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from blockmem_lite import masks
from blockmem_lite.trace import is_tracing, record


class RMSNorm(nn.Module):
    """x / rms(x) * gain, computed in fp32 for stability."""

    def __init__(self, dim: int, eps: float = 1e-5, learnable: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if learnable else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        return y * self.weight if self.weight is not None else y


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE), rotate-half convention.

    ``forward(x, positions)`` rotates x: (..., T, hd), e.g. (B, H, T, hd), by the
    angles of ``positions``: (T,) or (B, T). Angles are computed on the fly, so any
    position (also beyond the training length) works.

    Computed as ``x * cos + roll(x, hd/2) * sin_signed`` with ``sin_signed =
    [-sin, sin]``: ``roll(x, hd/2) = [x2, x1]``, so this is exactly
    ``x * cos + [-x2, x1] * [sin, sin]`` (a sign moved from x to sin), in 4 ops
    instead of 6. The cos / sin of one ``positions`` tensor are computed once
    and shared by every RoPE of the same (head_dim, base, dtype, device): all
    layers of a forward or a decoding step pass the same positions tensor, so
    a step pays for its angles once, not once per layer and per q / k.
    """

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim={head_dim} is not allowed: RoPE needs an even head dim")
        self.head_dim = head_dim
        self.base = base
        self._inv_freq: dict = {}                     # (dtype, device) -> (hd/2,), not state

    def inverse_frequencies(self, dtype: torch.dtype, device) -> torch.Tensor:
        """``base^(-2i/hd)``, i = 0..hd/2-1: (hd/2,), kept per (dtype, device)."""
        key = (dtype, torch.device(device))
        inv_freq = self._inv_freq.get(key)
        if inv_freq is None:
            exponents = torch.arange(0, self.head_dim, 2, device=device, dtype=dtype) / self.head_dim
            inv_freq = self.base ** -exponents
            if not torch.compiler.is_compiling():
                self._inv_freq[key] = inv_freq
        return inv_freq

    def cos_sin(self, positions: torch.Tensor, x: torch.Tensor):
        """(cos, sin_signed), each (T, hd) or (B, 1, T, hd), in x's dtype (memoised)."""
        # Angles in fp64 when x is fp64 (tests), else fp32; never in bf16.
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        key = (self.head_dim, self.base, x.dtype, x.device)
        memo = not torch.compiler.is_compiling() and not positions.is_inference()
        if memo:
            hit = _ROPE_MEMO.get(key)
            if hit is not None and hit[0] is positions and hit[1] == positions._version:
                return hit[2], hit[3]
        angles = positions.to(dtype)[..., None] * self.inverse_frequencies(dtype, x.device)
        if angles.dim() == 3:                                             # (B, T, hd/2)
            angles = angles[:, None]                                      # (B, 1, T, hd/2)
        cos, sin = angles.cos(), angles.sin()
        cos = torch.cat([cos, cos], dim=-1).to(x.dtype)
        sin = torch.cat([-sin, sin], dim=-1).to(x.dtype)
        if memo:
            _ROPE_MEMO[key] = (positions, positions._version, cos, sin)
        return cos, sin

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos_sin(positions, x)
        return x * cos + x.roll(self.head_dim // 2, dims=-1) * sin


# (head_dim, base, dtype, device) -> (positions, its version, cos, sin_signed): the last
# angles computed, so the layers of one forward / decoding step share them. Holding the
# positions tensor keeps its identity unique; its version counter catches in-place edits.
_ROPE_MEMO: dict = {}


class MLP(nn.Module):
    """SwiGLU feed-forward: W_down(silu(W_gate x) * W_up x), no biases."""

    def __init__(self, dim: int, ratio: float = 8 / 3, multiple_of: int = 8):
        super().__init__()
        hidden = int(multiple_of * math.ceil(ratio * dim / multiple_of))
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        mask: torch.Tensor | None = None, causal: bool = False):
    """Plain softmax attention; returns (out, weights).

    q: (B, H, Tq, hd), k/v: (B, H, Tk, hd), mask: (Tq, Tk) bool (True = may attend).
    ``causal`` uses the bottom-right aligned causal mask (correct with a cache).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if causal:
        causal_m = masks.causal_mask(q.shape[-2], k.shape[-2], device=q.device)
        mask = causal_m if mask is None else (mask & causal_m)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None = None, causal: bool = False,
              dropout_p: float = 0.0) -> torch.Tensor:
    """Fast attention on SDPA. q: (B, H, Tq, hd), k/v: (B, H, Tk, hd) -> (B, H, Tq, hd).

    ``causal`` means bottom-right aligned: the queries are the last Tq of the Tk
    positions. SDPA's own ``is_causal`` is top-left aligned, which is only right
    when Tq == Tk, so other cases get an explicit mask (one query needs none).
    """
    tq, tk = q.shape[-2], k.shape[-2]
    if causal and mask is None:
        if tq == tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        if tq == 1:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    if causal:
        causal_m = masks.causal_mask(tq, tk, device=q.device)
        mask = causal_m if mask is None else (mask & causal_m)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


class KVCache:
    """A preallocated key/value cache for one attention layer.

    Tensors are (B, H, capacity, hd) and written by slicing (much faster than
    growing with ``torch.cat``). ``length`` is the number of filled slots.
    """

    def __init__(self, batch: int, n_head: int, capacity: int, head_dim: int,
                 device=None, dtype=torch.float32):
        self.k = torch.zeros(batch, n_head, capacity, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k/v: (B, H, t, hd) after the filled slots; return all filled k, v."""
        t = k.shape[2]
        if self.length + t > self.capacity:
            raise ValueError(
                f"KV cache is full: capacity={self.capacity}, holding {self.length}, "
                f"asked to add {t}; allocate a larger cache (max_len) or shorten the sequence")
        self.k[:, :, self.length:self.length + t] = k
        self.v[:, :, self.length:self.length + t] = v
        self.length += t
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def reset(self) -> None:
        self.length = 0

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` slots; later appends overwrite the rest (CAT drops
        a finished chunk's token slots this way)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length={length} is not allowed: expected 0..{self.length} "
                             "(the filled slots)")
        self.length = length

    def nbytes(self) -> int:
        """Bytes held by the cache (allocated capacity, as memory really held)."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class SelfAttention(nn.Module):
    """Multi-head self-attention with RoPE and no biases.

    Mechanisms reuse the pieces: ``project_qkv`` (with RoPE applied),
    ``attention``/``reference_attention`` on whatever reshaped view they need,
    then ``merge_heads`` + ``out``.
    """

    def __init__(self, dim: int, n_head: int, rope_base: float = 10000.0, dropout: float = 0.0):
        super().__init__()
        if dim % n_head:
            raise ValueError(f"n_head={n_head} is not allowed: must divide dim={dim}")
        self.n_head = n_head
        self.head_dim = dim // n_head
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.rope = RotaryEmbedding(self.head_dim, rope_base)

    def project_qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x: (B, T, D) -> q, k, v each (B, H, T, hd), RoPE applied to q and k."""
        b, t, _ = x.shape
        qk, v = self.qkv(x).view(b, t, 3, self.n_head, self.head_dim).permute(
            2, 0, 3, 1, 4).split([2, 1])    # split, not slices: its backward is one cat,
        q, k = self.rope(qk, positions)     # each slice's zero-fills all of qkv's gradient
        return q, k, v[0]                   # (B, H, T, hd) each; q and k rotated in one go

    @staticmethod
    def merge_heads(y: torch.Tensor) -> torch.Tensor:
        """(B, H, T, hd) -> (B, T, H*hd)."""
        b, h, t, hd = y.shape
        return y.transpose(1, 2).reshape(b, t, h * hd)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, reference: bool = False,
                mask: torch.Tensor | None = None, causal: bool = True) -> torch.Tensor:
        """Self-attention. x: (B, T, D) -> (B, T, D).

        ``causal`` (default) is bottom-right aligned, so with ``cache`` the new
        keys/values are appended and the queries attend to everything cached so
        far. ``mask`` (Tq, Tk) bool, True = may attend, restricts further (e.g.
        CAT's interleaved mask); ``causal=False`` without a mask is bidirectional.
        """
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + x.shape[1], device=x.device)
        q, k, v = self.project_qkv(x, positions)
        if cache is not None:
            k, v = cache.append(k, v)
        if reference or is_tracing("attn_weights"):
            y, weights = reference_attention(q, k, v, mask=mask, causal=causal)
            record("attn_weights", weights)
        else:
            p = self.dropout if self.training else 0.0
            y = attention(q, k, v, mask=mask, causal=causal, dropout_p=p)
        return self.out(self.merge_heads(y))


class Block(nn.Module):
    """Pre-norm Transformer block: h = x + Attn(Norm(x)); y = h + MLP(Norm(h))."""

    def __init__(self, dim: int, n_head: int, mlp_ratio: float = 8 / 3,
                 rope_base: float = 10000.0, norm_eps: float = 1e-5, dropout: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(dim, norm_eps)
        self.attn = SelfAttention(dim, n_head, rope_base, dropout)
        self.norm2 = RMSNorm(dim, norm_eps)
        self.mlp = MLP(dim, mlp_ratio)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, reference: bool = False,
                mask: torch.Tensor | None = None, causal: bool = True) -> torch.Tensor:
        h = self.attn(self.norm1(x), positions, cache, reference, mask, causal)
        x = x + self.drop(h)                                                    # (B, T, D)
        return x + self.drop(self.mlp(self.norm2(x)))


def keyed_normal_(param: torch.Tensor, std: float, key: str) -> torch.Tensor:
    """Fill ``param`` with N(0, std) from a generator keyed by torch's seed and ``key``.

    The values depend on ``torch.initial_seed()`` (what ``seed_everything`` set) and the key
    only, not on what was built or drawn before: two models built under one seed share every
    parameter they both name, so a mechanism and its memory-less twin start from the same
    backbone, bit for bit, on any device. Drawn on the CPU in fp32, then copied in.
    """
    if param.is_meta:
        return param
    digest = hashlib.sha256(f"{torch.initial_seed()}/{key}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    values = torch.randn(param.shape, generator=generator, device="cpu") * std
    with torch.no_grad():
        param.copy_(values)
    return param


def init_weights(module: nn.Module, std: float, n_layer: int, prefix: str = "") -> None:
    """GPT-2 style init: every matrix N(0, std), residual outputs scaled by 1/sqrt(2L), every
    bias zero; norms keep their ones. Each matrix is drawn by ``keyed_normal_`` under its
    name (``prefix`` + the name in ``module``)."""
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() >= 2:
            residual = name.endswith(("attn.out.weight", "mlp.down.weight"))
            keyed_normal_(p, std / math.sqrt(2 * n_layer) if residual else std, prefix + name)
