"""CAT's interleaved decoder sequence as slot arithmetic: group width, slot count, RoPE
positions, the slot of each token and of each prediction, ``interleave``, and which keys
each slot of a prefill block sees (``prefill_mask``).

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


def prefill_mask(first: int, n_chunks: int, chunk_size: int, separator: bool,
                 device=None) -> torch.Tensor:
    """Which keys each slot of a prefill block sees: (R*width, held + R*width) bool.

    Keys: the cached ``[g_0, f_0..f_{first-1}, (SEP_first)]`` (held = first + 1 (+1)),
    then the block, chunk r = 0..R-1 as ``[x_0..x_{C-2}, f_{first+r}, (SEP)]`` (width
    = C (+1)). ``masks.cat_mask``'s rule: a token sees every compressed slot of earlier
    chunks, the SEP of its own group and its own chunk up to itself; a compressed slot
    sees the compressed slots up to itself; a SEP sees those and itself.
    """
    c, r = chunk_size, n_chunks
    width = c + (1 if separator else 0)
    slot = torch.arange(r * width, device=device)
    chunk, offset = slot // width, slot % width
    is_token, is_vector, is_sep = offset < c - 1, offset == c - 1, offset == c
    q_chunk, q_offset = chunk[:, None], offset[:, None]
    q_token, q_sep = is_token[:, None], is_sep[:, None]
    block = ((is_vector & torch.where(q_token, chunk < q_chunk, chunk <= q_chunk))
             | (is_sep & ((q_token & (chunk + 1 == q_chunk)) | (q_sep & (chunk == q_chunk))))
             | (is_token & q_token & (chunk == q_chunk) & (offset <= q_offset)))
    held = [torch.ones(r * width, first + 1, dtype=torch.bool, device=device)]
    if separator:                                   # SEP_first: the first chunk's group only
        held.append((is_token & (chunk == 0))[:, None])
    return torch.cat([*held, block], dim=1)
