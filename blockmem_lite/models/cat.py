"""CAT: Compress & Attend Transformer (Prakash, Puli, Ranganath) — the interleaved layout.

The decoder reads one interleaved sequence (MECHANISMS.md 3.4, 3.5). With K
chunks of C tokens, group k is ``[g_k, (SEP,) x_kC .. x_kC+C-1]``: g_0 is a
learned dummy (the chunk-size indicator in the multi-chunk model), g_k = f_{k-1}
is chunk k-1 compressed to one vector, SEP a learned separator (multi-chunk
model only). A final ``[f_{K-1} (, SEP)]`` closes the sequence. Group width
W = C + 1 (C + 2 with SEP); the decoder's RoPE position of slot n is n mod W.

Readout (the #1 off-by-one): the prediction of token i+1 is read where token i
is the newest thing visible. For token i = kC + j that is its own slot when
j < C-1, and for the chunk's last token (j = C-1) the compressed slot f_k that
opens group k+1 (its SEP slot in the multi-chunk model): the first token of a
chunk is predicted from compressed history only.

This module holds the layout as pure functions (shared by the model, tests and
notebooks) and the compressor; the mask itself is ``masks.cat_mask``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from blockmem_lite.nn import Block, RMSNorm


def group_width(chunk_size: int, separator: bool = False) -> int:
    """W: slots per group, the compressed slot (+ SEP) and the chunk's C tokens."""
    return chunk_size + (2 if separator else 1)


def n_slots(n_chunks: int, chunk_size: int, separator: bool = False) -> int:
    """Length of the interleaved sequence: K groups plus the closing [f_{K-1} (, SEP)]."""
    return n_chunks * group_width(chunk_size, separator) + (2 if separator else 1)


def slot_positions(n_chunks: int, chunk_size: int, separator: bool = False,
                   device=None) -> torch.Tensor:
    """Decoder RoPE positions, n mod W: every compressed slot sits at position 0. (S,)"""
    width = group_width(chunk_size, separator)
    return torch.arange(n_slots(n_chunks, chunk_size, separator), device=device) % width


def token_slots(n_chunks: int, chunk_size: int, separator: bool = False,
                device=None) -> torch.Tensor:
    """Slot of token i = kC + j in the interleaved sequence. (K*C,)"""
    width, offset = group_width(chunk_size, separator), 2 if separator else 1
    i = torch.arange(n_chunks * chunk_size, device=device)
    return (i // chunk_size) * width + offset + i % chunk_size


def readout_slots(n_chunks: int, chunk_size: int, separator: bool = False,
                  device=None) -> torch.Tensor:
    """Slot whose output predicts token i+1, for every token i. (K*C,)"""
    width = group_width(chunk_size, separator)
    i = torch.arange(n_chunks * chunk_size, device=device)
    k, j = i // chunk_size, i % chunk_size
    last = (k + 1) * width + (1 if separator else 0)        # f_k (or its SEP) opens group k+1
    return torch.where(j == chunk_size - 1, last, token_slots(n_chunks, chunk_size,
                                                             separator, device))


def interleave(tokens: torch.Tensor, compressed: torch.Tensor, head: torch.Tensor,
               separator: torch.Tensor | None = None) -> torch.Tensor:
    """Build the decoder input.

    tokens: (B, K, C, D) token embeddings by chunk; compressed: (B, K, D), f_0..f_{K-1};
    head: (D,) or (B, D), the dummy / chunk-size indicator g_0; separator: (D,) or None.
    Returns (B, S, D) with S = n_slots(K, C, separator is not None).
    """
    b, k, c, d = tokens.shape
    head = head.expand(b, d)
    openers = torch.cat([head[:, None], compressed], dim=1)                # (B, K+1, D)
    parts = [openers[:, :, None]]                                          # (B, K+1, 1, D)
    if separator is not None:
        parts.append(separator.expand(b, k + 1, 1, d))
    groups = torch.cat(parts, dim=2)                                       # (B, K+1, 1|2, D)
    body = torch.cat([groups[:, :k], tokens], dim=2).reshape(b, -1, d)     # (B, K*W, D)
    return torch.cat([body, groups[:, k]], dim=1)                          # (B, S, D)


def per_chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_chunks: int,
                        chunk_size: int, separator: bool = False) -> torch.Tensor:
    """Attention under ``masks.cat_mask`` without an S x S mask (PERFORMANCE.md's fast form).

    q, k, v: (B, H, S, hd) in interleaved slot order -> (B, H, S, hd). Slots are
    grouped (the closing group is padded to W); each group's queries attend to
    the compressed slots of all groups (those after their own masked) and to the
    other slots of their own group, causally: keys per group G + W - 1 instead of
    S, so the work is O(S * (K + C)) rather than O(S^2), and SDPA stays 4-D.
    """
    b, h, s, hd = q.shape
    width = group_width(chunk_size, separator)
    groups = n_chunks + 1
    if s != n_slots(n_chunks, chunk_size, separator):
        raise ValueError(f"sequence of {s} slots is not allowed: n_chunks={n_chunks}, "
                         f"chunk_size={chunk_size} give {n_slots(n_chunks, chunk_size, separator)}")
    pad = groups * width - s
    q, k, v = (F.pad(t, (0, 0, 0, pad)).view(b, h, groups, width, hd) for t in (q, k, v))
    # keys of group g: every compressed slot (g_0 .. g_K), then its own other W - 1 slots
    keys = torch.cat([k[:, :, None, :, 0].expand(b, h, groups, groups, hd), k[:, :, :, 1:]], 3)
    values = torch.cat([v[:, :, None, :, 0].expand(b, h, groups, groups, hd), v[:, :, :, 1:]], 3)
    g = torch.arange(groups, device=q.device)
    offset = torch.arange(width, device=q.device)
    sees_compressed = (g[None, :] <= g[:, None])[:, None, :].expand(groups, width, groups)
    sees_own = offset[1:][None, :] <= offset[:, None]                       # (W, W-1)
    mask = torch.cat([sees_compressed, sees_own.expand(groups, width, width - 1)], 2)
    out = F.scaled_dot_product_attention(
        q.reshape(b, h * groups, width, hd), keys.reshape(b, h * groups, -1, hd),
        values.reshape(b, h * groups, -1, hd),
        attn_mask=mask.repeat(h, 1, 1))                                     # (B, H*G, W, hd)
    return out.view(b, h, groups * width, hd)[:, :, :s]


class Compressor(nn.Module):
    """f: one chunk of C tokens -> one vector of the decoder width (MECHANISMS.md 3.3).

    Every chunk is compressed on its own, all chunks in parallel as a batch:
    ``[ChunkPos[k] ; E_f(chunk k)]`` through ``depth`` pre-norm blocks with
    bidirectional attention (RoPE positions 0..C), a final RMSNorm, the
    chunk-index row dropped, the C outputs flattened and projected by W_f to
    ``out_dim``. Bidirectional is legal only because f_k is read strictly after
    chunk k ends. ChunkPos is the decoder's only source of chunk order.
    """

    def __init__(self, vocab_size: int, d_model: int, n_head: int, depth: int, chunk_size: int,
                 max_chunks: int, out_dim: int, mlp_ratio: float = 8 / 3,
                 rope_base: float = 10000.0, norm_eps: float = 1e-5):
        super().__init__()
        self.chunk_size = chunk_size
        self.embed = nn.Embedding(vocab_size, d_model)
        self.chunk_pos = nn.Embedding(max_chunks, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, mlp_ratio, rope_base, norm_eps)
                                    for _ in range(depth))
        self.norm = RMSNorm(d_model, norm_eps)
        self.proj = nn.Linear(chunk_size * d_model, out_dim, bias=False)    # W_f

    @property
    def max_chunks(self) -> int:
        return self.chunk_pos.num_embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, K*C) -> compressed chunks (B, K, out_dim)."""
        b, n = tokens.shape
        c = self.chunk_size
        if n % c:
            raise ValueError(f"tokens of length {n} are not allowed: the compressor needs a "
                             f"multiple of chunk_size={c} (pad the tail first)")
        k = n // c
        if k > self.max_chunks:
            raise ValueError(f"{k} chunks are not allowed: this compressor knows at most "
                             f"max_chunks={self.max_chunks} chunk positions")
        x = self.embed(tokens).view(b * k, c, -1)                            # (B*K, C, d)
        index = torch.arange(k, device=tokens.device).repeat(b)             # (B*K,)
        z = torch.cat([self.chunk_pos(index)[:, None], x], dim=1)          # (B*K, 1+C, d)
        positions = torch.arange(c + 1, device=tokens.device)
        for block in self.blocks:
            z = block(z, positions, causal=False)
        z = self.norm(z)[:, 1:]                                              # (B*K, C, d)
        return self.proj(z.reshape(b, k, -1))                               # (B, K, D)
