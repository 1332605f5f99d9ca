"""CAT's decoder attention without the S x S mask: ``per_chunk_attention`` and its
strategies (``merge``, ``copy``, ``split``), beside the plain form they all equal,
``masked_attention`` (softmax under ``masks.cat_mask``).

Layout: the interleaved slots of ``ops.cat_layout``, grouped W at a time. The model
(``models.cat.CATAttention``) trains through ``per_chunk_attention``; tests prove
every strategy equal to ``masked_attention``, forward and gradients (docs/PAPERS.md,
CAT paper vs kit).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from blockmem_lite.masks import cat_mask
from blockmem_lite.nn import reference_attention
from blockmem_lite.ops.cat_layout import group_width, n_slots


def _check_length(s: int, n_chunks: int, chunk_size: int, separator: bool) -> None:
    if s != n_slots(n_chunks, chunk_size, separator):
        raise ValueError(f"sequence of {s} slots is not allowed: n_chunks={n_chunks}, "
                         f"chunk_size={chunk_size} give {n_slots(n_chunks, chunk_size, separator)}")


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_chunks: int,
                     chunk_size: int, separator: bool = False) -> torch.Tensor:
    """The plain form: softmax over all S x S scores under ``masks.cat_mask``.

    q, k, v: (B, H, S, hd) in interleaved slot order -> (B, H, S, hd). O(S^2) work and
    memory (``nn.reference_attention``); what every strategy below must equal.
    """
    _check_length(q.shape[2], n_chunks, chunk_size, separator)
    out, _ = reference_attention(q, k, v, mask=cat_mask(n_chunks, chunk_size, separator,
                                                        device=q.device))
    return out


PER_CHUNK_STRATEGIES = ("auto", "merge", "copy", "split")
COPY_BUDGET_BYTES = 2 ** 29      # "auto" copies the chunk vectors per group below this size


def merge_available(q: torch.Tensor) -> bool:
    """Whether the ``merge`` strategy can run on ``q``: it needs the CPU flash-attention
    kernel that also returns the log-sum-exp (``torch.ops.aten``'s ``..._for_cpu``)."""
    return q.device.type == "cpu" and hasattr(torch.ops.aten,
                                              "_scaled_dot_product_flash_attention_for_cpu")


def per_chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_chunks: int,
                        chunk_size: int, separator: bool = False,
                        strategy: str = "auto") -> torch.Tensor:
    """Attention under ``masks.cat_mask`` without an S x S mask (the fast form training uses).

    q, k, v: (B, H, S, hd) in interleaved slot order -> (B, H, S, hd). Slots are
    grouped (the closing group padded to W). A query sees two key sets: its own
    group up to itself (causal over W slots; offset 0 is the group's own
    compressed slot) and the compressed slots of every *earlier* group (causal
    over the G groups): O(S (K + C)) work, not O(S^2).

    ``strategy``:

    * ``merge`` (CPU): each key set on its own by flash attention, which also
      returns each query's log-sum-exp (lse) of its scores: the own group causally,
      the earlier chunk vectors in slices of the groups under a small mask
      (``_MergedAttention``); the partial results are joined exactly,
      ``out = sum_i exp(lse_i - lse) out_i`` with ``lse = logaddexp(lse_1, lse_2)``.
      No copies, most of the masked triangle skipped; memory O(S hd).
    * ``copy`` gives every group its own key list (the chunk vectors copied per
      group) and runs one batched SDPA under a (W, G + W - 1) mask.
    * ``split`` scores the chunk vectors and the own group separately and joins
      them in one softmax, with no copies: O(S (K + C)) memory.

    ``auto``: ``merge`` where it runs, else ``copy`` while the copied keys and
    values fit in ``COPY_BUDGET_BYTES``, else ``split``. All agree to float
    rounding (tests), gradients included.
    """
    b, h, s, hd = q.shape
    width = group_width(chunk_size, separator)
    groups = n_chunks + 1
    _check_length(s, n_chunks, chunk_size, separator)
    if strategy not in PER_CHUNK_STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not allowed: expected one of "
                         f"{', '.join(PER_CHUNK_STRATEGIES)}")
    if strategy == "merge" and not merge_available(q):
        raise ValueError(f"strategy='merge' is not allowed on {q.device.type}: it needs the "
                         "CPU flash-attention kernel; use 'auto', 'copy' or 'split'")
    if strategy == "auto":
        copied = 2 * b * h * groups * (groups + width) * hd * q.element_size()
        strategy = ("merge" if merge_available(q)
                    else "copy" if copied <= COPY_BUDGET_BYTES else "split")
    pad = groups * width - s
    q, k, v = (F.pad(t, (0, 0, 0, pad)).view(b, h, groups, width, hd) for t in (q, k, v))
    if strategy == "merge":
        return _MergedAttention.apply(q, k, v).reshape(b, h, groups * width, hd)[:, :, :s]
    g = torch.arange(groups, device=q.device)
    offset = torch.arange(width, device=q.device)
    sees_vector = g[None, :] <= g[:, None]                                  # (G, G)
    sees_own = offset[1:][None, :] <= offset[:, None]                       # (W, W-1)
    if strategy == "copy":
        out = _attend_with_copies(q, k, v, sees_vector, sees_own)
    else:
        out = _attend_split(q, k, v, sees_vector, sees_own)
    return out.reshape(b, h, groups * width, hd)[:, :, :s]


def _flash(q, k, v, mask=None):
    """Flash attention on the CPU, causal or (``mask``, additive float) masked: (out, lse),
    lse (B, H, L) the log-sum-exp of each query's scaled scores (the public SDPA does not
    return it)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, mask is None, attn_mask=mask)


def _flash_backward(grad, q, k, v, out, lse, mask=None):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad, q, k, v, out, lse, 0.0, mask is None, attn_mask=mask)


VECTOR_PARTS = 8      # the earlier-vector attention runs in this many slices of the groups


@functools.lru_cache(maxsize=4)
def _vector_parts(n: int, width: int, dtype: torch.dtype, device: torch.device,
                  parts: int = VECTOR_PARTS) -> tuple:
    """The slices of ``_MergedAttention``'s part 2: ((lo, hi, mask), ...).

    Groups lo..hi-1 of the n querying groups (the queries of group i see the compressed
    slots 0..i) read the keys 0..hi-1 under an additive (W*(hi-lo), hi) mask: one call
    per slice skips the keys no query of the slice sees, most of the masked triangle.
    """
    count = min(parts, n)
    bounds = sorted({n * i // count for i in range(count + 1)})
    slices = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        group = lo + torch.arange((hi - lo) * width, device=device) // width
        hidden = torch.arange(hi, device=device)[None, :] > group[:, None]
        slices.append((lo, hi, torch.zeros(hidden.shape, dtype=dtype, device=device)
                      .masked_fill(hidden, float("-inf"))))
    return tuple(slices)


def _own_layout(x: torch.Tensor) -> torch.Tensor:
    """(B, H, G, W, hd) -> (B*H, G, W, hd): one causal sequence per group."""
    b, h, n, w, hd = x.shape
    return x.reshape(b * h, n, w, hd)


def _rows(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Groups 1+lo..hi of (B, H, G, W, hd) as one sequence of queries: (B*H, 1, (hi-lo)*W, hd)."""
    b, h, _, w, hd = x.shape
    return x[:, :, 1 + lo:1 + hi].reshape(b * h, 1, (hi - lo) * w, hd)


def _vector_keys(k: torch.Tensor, hi: int) -> torch.Tensor:
    """The compressed slots of groups 0..hi-1: (B*H, 1, hi, hd)."""
    b, h, _, _, hd = k.shape
    return k[:, :, :hi, 0].reshape(b * h, 1, hi, hd)


class _MergedAttention(torch.autograd.Function):
    """``per_chunk_attention``'s ``merge`` strategy. q, k, v: (B, H, G, W, hd), the groups
    of slots (the closing one padded; its padding sits after every real slot, so causal
    attention never shows it to a real query).

    * Part 1, the own group: causal flash attention over the W slots of each group
      (offset 0 is the group's compressed slot).
    * Part 2, earlier groups' compressed slots: the queries of group g see the
      compressed slots of groups 0..g-1 (group 0 sees none), flash attention under a
      mask, in slices of the groups (``_vector_parts``).

    The parts are joined by their log-sum-exps: with w = sigmoid(lse_2 - lse_1)
    (the softmax mass on part 2), out = out_1 + w (out_2 - out_1) and
    lse = logaddexp(lse_1, lse_2). Backward: each part's flash backward, given the
    *joined* output and lse, yields that part's share of the exact gradient (the
    weights it recomputes, exp(score - lse), are the joined softmax's), and the
    shares add up.
    """

    @staticmethod
    def forward(ctx, q, k, v):
        b, h, n, w, hd = q.shape
        out, lse = _flash(_own_layout(q), _own_layout(k), _own_layout(v))
        out, lse = out.view(b, h, n, w, hd), lse.reshape(b, h, n, w).contiguous()  # fresh
        for lo, hi, mask in _vector_parts(n - 1, w, q.dtype, q.device, VECTOR_PARTS):
            vec, vec_lse = _flash(_rows(q, lo, hi), _vector_keys(k, hi), _vector_keys(v, hi), mask)
            own, own_lse = out[:, :, 1 + lo:1 + hi], lse[:, :, 1 + lo:1 + hi]
            vec_lse = vec_lse.view(own_lse.shape)
            share = torch.sigmoid(vec_lse - own_lse)[..., None]         # fp32 lse under bf16
            own.lerp_(vec.view(own.shape), share.to(own.dtype))
            torch.logaddexp(own_lse, vec_lse, out=own_lse)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        b, h, n, w, hd = q.shape
        grad = grad.contiguous()
        dq, dk, dv = (t.view(b, h, n, w, hd) for t in _flash_backward(
            *(_own_layout(t) for t in (grad, q, k, v, out)), lse.view(b * h, n, w)))
        for lo, hi, mask in _vector_parts(n - 1, w, q.dtype, q.device, VECTOR_PARTS):
            dq_vec, dk_vec, dv_vec = _flash_backward(
                _rows(grad, lo, hi), _rows(q, lo, hi), _vector_keys(k, hi),
                _vector_keys(v, hi), _rows(out, lo, hi),
                lse[:, :, 1 + lo:1 + hi].reshape(b * h, 1, (hi - lo) * w), mask)
            dq[:, :, 1 + lo:1 + hi] += dq_vec.view(b, h, hi - lo, w, hd)
            dk[:, :, :hi, 0] += dk_vec.view(b, h, hi, hd)
            dv[:, :, :hi, 0] += dv_vec.view(b, h, hi, hd)
        return dq, dk, dv


def _attend_with_copies(q, k, v, sees_vector, sees_own) -> torch.Tensor:
    """Each group's keys = all chunk vectors ++ its own slots; one SDPA. (B, H, G, W, hd)"""
    b, h, groups, width, hd = q.shape
    keys = torch.cat([k[:, :, None, :, 0].expand(b, h, groups, groups, hd), k[:, :, :, 1:]], 3)
    values = torch.cat([v[:, :, None, :, 0].expand(b, h, groups, groups, hd), v[:, :, :, 1:]], 3)
    mask = torch.cat([sees_vector[:, None, :].expand(groups, width, groups),
                      sees_own.expand(groups, width, width - 1)], 2)        # (G, W, G+W-1)
    out = F.scaled_dot_product_attention(
        q.reshape(b, h * groups, width, hd), keys.reshape(b, h * groups, -1, hd),
        values.reshape(b, h * groups, -1, hd), attn_mask=mask.repeat(h, 1, 1))
    return out.view(b, h, groups, width, hd)


def _attend_split(q, k, v, sees_vector, sees_own) -> torch.Tensor:
    """Scores to the chunk vectors and to the own group, one softmax over both. (B,H,G,W,hd)

    The chunk-vector products run on (B, H, G*W, .) views: a broadcast batched
    matmul against (B, H, 1, G, hd) would copy the vectors once per group.
    """
    b, h, groups, width, hd = q.shape
    q = q * hd ** -0.5
    k_vec, v_vec = k[:, :, :, 0], v[:, :, :, 0]                            # (B, H, G, hd)
    to_vectors = (q.reshape(b, h, groups * width, hd) @ k_vec.transpose(-2, -1)).view(
        b, h, groups, width, groups).masked_fill(~sees_vector[:, None, :], float("-inf"))
    to_own = (q @ k[..., 1:, :].transpose(-2, -1)).masked_fill(
        ~sees_own, float("-inf"))                                           # (B, H, G, W, W-1)
    weights = torch.cat([to_vectors, to_own], dim=-1).softmax(dim=-1)
    from_vectors = weights[..., :groups].reshape(b, h, groups * width, groups) @ v_vec
    return from_vectors.view(b, h, groups, width, hd) + weights[..., groups:] @ v[..., 1:, :]

