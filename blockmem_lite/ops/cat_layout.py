"""CAT's interleaved decoder sequence as slot arithmetic: group width, slot count, RoPE
positions, the slot of each token and of each prediction, and ``interleave``.

Group k of the sequence is ``[g_k, (SEP,) x_kC .. x_kC+C-1]`` (g_0 the dummy or the
chunk-size indicator, g_k = f_{k-1} the compressed chunk k-1, SEP in the multi-chunk
model only); a final ``[f_{K-1} (, SEP)]`` closes it. ``models.cat`` explains the
layout and the readout rule; the model and its attention kernels (``ops.cat_attention``)
both read it from here.
"""

from __future__ import annotations

import torch


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
