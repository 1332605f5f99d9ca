"""Boolean attention masks as pure functions.

Convention everywhere in the kit: ``mask[q, k] == True`` means query ``q`` MAY
attend to key ``k`` (the same convention as ``F.scaled_dot_product_attention``
boolean masks). Masks are for teaching, tests, plots and the few places where
no fast kernel exists; hot paths use ``is_causal`` or reshapes instead
(a T x T mask is slower than dense attention; docs/MEASUREMENTS.md, The benchmark
protocol).
"""

from __future__ import annotations

import torch


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not allowed: expected an integer >= 1")


def causal_mask(q_len: int, kv_len: int | None = None, device=None) -> torch.Tensor:
    """Causal mask aligned to the bottom-right: (q_len, kv_len).

    With a KV cache the ``q_len`` queries are the *last* ``q_len`` positions of
    the ``kv_len`` keys, so query i sits at absolute position ``kv_len - q_len + i``
    and may see keys ``0 .. kv_len - q_len + i``. For ``q_len == kv_len`` this
    is the usual lower triangle.
    """
    kv_len = q_len if kv_len is None else kv_len
    _check_positive("q_len", q_len)
    _check_positive("kv_len", kv_len)
    if q_len > kv_len:
        raise ValueError(f"q_len={q_len} is not allowed: must be <= kv_len={kv_len}")
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # (q, 1)
    k_pos = torch.arange(kv_len, device=device)[None, :]                  # (1, k)
    return k_pos <= q_pos


def block_causal_mask(seq_len: int, block_size: int, device=None) -> torch.Tensor:
    """Block-local causal mask: (T, T); token t sees s iff same block and s <= t.

    This is what BCMT / HOnly's local attention computes; the fast path reshapes
    (B, H, T, hd) to (B, H*T/L, L, hd) instead of building this mask.
    """
    _check_positive("seq_len", seq_len)
    _check_positive("block_size", block_size)
    pos = torch.arange(seq_len, device=device)
    same_block = (pos[:, None] // block_size) == (pos[None, :] // block_size)
    return same_block & causal_mask(seq_len, device=device)


def sliding_window_mask(q_len: int, kv_len: int | None = None, *, window: int,
                        device=None) -> torch.Tensor:
    """Sliding-window causal mask, bottom-right aligned: (q_len, kv_len).

    Query i sits at absolute position ``kv_len - q_len + i`` and sees the ``window``
    newest keys up to itself: key k iff ``0 <= q - k < window``. ``window >= kv_len``
    is the causal mask. Notebook 11 builds a mechanism on it (kit decision: the kit
    ships the mask, not a sliding-window mechanism; tests register one as a plugin).
    """
    kv_len = q_len if kv_len is None else kv_len
    _check_positive("window", window)
    allowed = causal_mask(q_len, kv_len, device=device)             # checks q_len, kv_len
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # (q, 1)
    k_pos = torch.arange(kv_len, device=device)[None, :]                  # (1, k)
    return allowed & (q_pos - k_pos < window)


def mask_density(mask: torch.Tensor) -> float:
    """Fraction of allowed (query, key) pairs: the share of attention work done."""
    return mask.float().mean().item()


def cat_mask(n_chunks: int, chunk_size: int, separator: bool = False,
             device=None) -> torch.Tensor:
    """CAT's decoder mask over the interleaved sequence (docs/PAPERS.md, CAT equations).

    Group k holds ``[g_k, (SEP,) x_kC .. x_kC+C-1]`` with g_0 the dummy (or the
    chunk-size indicator) and g_k = f_{k-1}, the compressed chunk k-1; a final
    ``[f_{K-1} (, SEP)]`` closes the sequence. With group width W = C + 1
    (C + 2 with ``separator``), slot q may see slot n iff
    ``n <= q and (q // W == n // W or n % W == 0)``: causal inside its own group,
    every earlier compressed slot, never an earlier chunk's raw tokens.
    Shape (S, S), S = K * W + 1 (+ 1 with ``separator``).
    """
    _check_positive("n_chunks", n_chunks)
    _check_positive("chunk_size", chunk_size)
    width = chunk_size + (2 if separator else 1)
    slots = n_chunks * width + (2 if separator else 1)
    pos = torch.arange(slots, device=device)
    same_group = (pos[:, None] // width) == (pos[None, :] // width)
    compressed = (pos[None, :] % width) == 0
    return (pos[None, :] <= pos[:, None]) & (same_group | compressed)


def cat_pair_count(n_chunks: int, chunk_size: int, separator: bool = False) -> int:
    """The (query, key) pairs ``cat_mask`` allows, counted query slot by query slot from its
    rule without building the (S, S) mask: slot q sees the compressed slot of every earlier
    group (q // W of them) and the slots of its own group up to itself (q % W + 1).

    About ``T (C/2 + K/2)`` for T = K * C tokens (a token of chunk k sees k + 1 vectors and
    its own chunk up to itself), against ``T (T + 1) / 2`` for dense causal attention."""
    _check_positive("n_chunks", n_chunks)
    _check_positive("chunk_size", chunk_size)
    width = chunk_size + (2 if separator else 1)
    slots = torch.arange(n_chunks * width + (2 if separator else 1))           # (S,)
    return int((slots // width + slots % width + 1).sum())
