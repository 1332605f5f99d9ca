"""ARMT's associative memory (docs/PAPERS.md, ARMT equations), plain and fused forms.

* DPFP: ``dpfp(u)``, the plain feature map (``r = [relu(u); relu(-u)]``, nu rolls of r);
  ``signed_dpfp`` computes it from ``[u; -u]`` (one matmul with ``[W; -W]`` in the layer)
  and gathers the nu rolls at once, bit-identical.
* READ: ``associative_read``, ``(q A) / (q . z + eps)``; ``fused_read`` takes the memory as
  one ``[A | z]`` tensor and gets ``q A`` and ``q . z`` from one matmul.
* WRITE: ``associative_write``, the delta rule one equation per line (``v_bar``, gamma =
  ``novelty``, ``A += sum_i beta_i k_i (v_i - v_bar_i)^T``, ``z += sum_i gamma_i k_i``);
  ``fused_write`` gets v_bar and ``k . z`` from one matmul with ``[A | z]`` and both
  updates from one more.

``models.armt.AssociativeMemoryLayer`` runs the fused forms; the plain ones are what
notebook 06 teaches (as ``armt.dpfp`` ...) and checks against. tests/test_armt.py proves
each pair equal in forward and gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-5                     # the eps of the read / write denominators (paper code)
DPFP_NU = 3                    # DPFP order: key width 2 * nu * d_mem


# --- DPFP ----------------------------------------------------------------------------------

def dpfp(u: torch.Tensor, nu: int = DPFP_NU, normalize: bool = True) -> torch.Tensor:
    """DPFP-nu feature map. u: (..., d) -> (..., 2 * nu * d), non-negative.

    ``r = [relu(u); relu(-u)]``, ``phi = [r * roll(r, 1); ...; r * roll(r, nu)]``
    with ``roll(r, j)_i = r_(i-j mod 2d)``; ``normalize`` divides by the L2 norm.
    """
    if isinstance(nu, bool) or not isinstance(nu, int) or nu < 1:
        raise ValueError(f"nu={nu!r} is not allowed: expected an integer >= 1")
    r = torch.cat([F.relu(u), F.relu(-u)], dim=-1)                              # (..., 2d)
    phi = torch.cat([r * r.roll(j, dims=-1) for j in range(1, nu + 1)], dim=-1)
    return F.normalize(phi, dim=-1) if normalize else phi


def dpfp_roll_index(width: int, nu: int = DPFP_NU, device=None) -> torch.Tensor:
    """(nu, width) indices with ``roll(r, j) = r[..., index[j - 1]]``: the nu rolls as one gather."""
    steps = torch.arange(1, nu + 1, device=device)[:, None]
    return (torch.arange(width, device=device) - steps) % width


def signed_dpfp(signed: torch.Tensor, roll_index: torch.Tensor, normalize: bool = True,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """``dpfp(u)`` from ``signed = [u; -u]`` (..., 2 d) -> phi (..., 2 nu d), in ``dtype``.

    ``relu([u; -u]) = [relu(u); relu(-u)] = r`` exactly (negating a weight negates the
    dot product exactly); the nu rolls of r are one gather (``r[..., roll_index]``,
    ``dpfp_roll_index(2 d)``), so ``phi`` is bit-identical to ``dpfp(u)``.
    """
    r = F.relu(signed if dtype is None or signed.dtype == dtype else signed.to(dtype))
    phi = (r.unsqueeze(-2) * r[..., roll_index]).flatten(-2)                   # (..., K)
    return F.normalize(phi, dim=-1) if normalize else phi


# --- READ ----------------------------------------------------------------------------------

def associative_read(q_phi: torch.Tensor, A: torch.Tensor, z: torch.Tensor,
                     eps: float = EPS) -> torch.Tensor:
    """``(q A) / (q . z + eps)``. q_phi: (B, T, K), A: (B, K, D), z: (B, K) -> (B, T, D)."""
    num = torch.einsum("btk,bkd->btd", q_phi, A)
    den = torch.einsum("btk,bk->bt", q_phi, z)[..., None] + eps
    return num / den


def fused_read(q_phi: torch.Tensor, az: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``associative_read`` from ``az = [A | z]`` (B, K, D + 1): ``q A`` and ``q . z`` in one
    matmul. q_phi (B, T, K) -> (B, T, D)."""
    out = torch.matmul(q_phi, az)                                               # (B, T, D + 1)
    d = out.shape[-1] - 1
    return out[..., :d] / (out[..., d:] + eps)


# --- WRITE ---------------------------------------------------------------------------------


def novelty(k_phi: torch.Tensor, z: torch.Tensor, eps: float = EPS,
            normalized: bool = True) -> torch.Tensor:
    """gamma, clipped to [0, 1], under stop-gradient. (B, M, K) -> (B, M).

    ``normalized`` (L2-normalised keys, the newer code): ``1 - (k . z + eps) / |k|^2``.
    ``normalized=False`` (raw DPFP keys, the 2024 code): ``1 - (k . z + eps) / (|k|^2 + eps)``,
    the eps in the key norm too, which matters for small raw keys.
    0 for a key already fully counted in z, 1 for a key orthogonal to every
    stored one; z only grows along new directions.
    """
    return _novelty_of(torch.einsum("bmk,bk->bm", k_phi, z) + eps, k_phi, eps, normalized)


def _novelty_of(seen: torch.Tensor, k_phi: torch.Tensor, eps: float, normalized: bool):
    """gamma from ``seen = k . z + eps`` (B, M) and the keys (B, M, K)."""
    norm2 = k_phi.pow(2).sum(-1) + (0.0 if normalized else eps)
    return (1 - seen / norm2).clamp(0, 1).detach()


def associative_write(A: torch.Tensor | None, z: torch.Tensor | None, k_phi: torch.Tensor,
                      v: torch.Tensor, beta: torch.Tensor, correction: bool = True,
                      eps: float = EPS, normalized: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Write M (key, value) pairs in parallel; returns the new (A, z). The plain form.

    k_phi: (B, M, K), v: (B, M, D), beta: (B, M) write strengths. A, z = None
    means an empty memory (the first segment): v_bar = 0 and gamma = 1. Both
    v_bar and gamma come from the OLD (A, z); ``normalized`` picks gamma's form
    (see ``novelty``); ``correction=False`` sets gamma = 1.
    """
    ones = torch.ones_like(k_phi[..., 0])                                       # (B, M)
    if A is None:                                             # empty memory (s = 1)
        A = k_phi.new_zeros(k_phi.shape[0], k_phi.shape[-1], v.shape[-1])       # (B, K, D)
        z = k_phi.new_zeros(k_phi.shape[0], k_phi.shape[-1])                    # (B, K)
        v_bar, gamma = torch.zeros_like(v), ones
    else:
        k_dot_z = torch.einsum("bmk,bk->bm", k_phi, z)                          # (B, M)
        v_bar = torch.einsum("bmk,bkd->bmd", k_phi, A) / (k_dot_z[..., None] + eps)
        gamma = novelty(k_phi, z, eps, normalized) if correction else ones
    A = A + torch.einsum("bmk,bmd->bkd", k_phi, beta[..., None] * (v - v_bar))  # delta rule
    z = z + torch.einsum("bmk,bm->bk", k_phi, gamma)                            # (B, K)
    return A, z


def fused_write(A: torch.Tensor | None, z: torch.Tensor | None, k_phi: torch.Tensor,
                v: torch.Tensor, beta: torch.Tensor, correction: bool = True,
                eps: float = EPS, normalized: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``associative_write`` in few operators; also returns gamma (B, M) for the trace.

    The memory is one tensor ``[A | z]`` (B, K, D + 1), so ``k_phi [A | z]`` gives ``k A``
    and ``k . z`` (v_bar and gamma) in one matmul, and ``[A | z] + k_phi^T [beta (v - v_bar)
    | gamma]`` both updates in one more. A and z come back as views of the new ``[A | z]``.
    """
    d = v.shape[-1]
    ones = torch.ones_like(k_phi[..., :1])                                       # (B, M, 1)
    if A is None:
        gamma = ones[..., 0]
        delta = torch.cat([beta[..., None] * v, ones], dim=-1)                 # (B, M, D + 1)
        joined = k_phi.transpose(1, 2) @ delta                                  # (B, K, D + 1)
    else:
        old = torch.cat([A, z[..., None]], dim=-1)                              # (B, K, D + 1)
        read = k_phi @ old                                                       # (B, M, D + 1)
        seen = read[..., d:] + eps                                               # k . z + eps
        v_bar = read[..., :d] / seen
        gamma = (_novelty_of(seen[..., 0], k_phi, eps, normalized) if correction
                 else ones[..., 0])
        delta = torch.cat([beta[..., None] * (v - v_bar), gamma[..., None]], dim=-1)
        joined = torch.baddbmm(old, k_phi.transpose(1, 2), delta)
    return joined[..., :d], joined[..., d], gamma
