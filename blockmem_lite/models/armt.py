"""ARMT: Associative Recurrent Memory Transformer (Rodkin, Kuratov, Bulatov, Burtsev; 2407.04841).

ARMT wraps a pretrained decoder. The sequence is cut into segments of S
tokens; each segment is followed by M learned memory tokens P and run through
the unchanged backbone. Every wrapped layer owns an associative matrix A and a
normaliser z (MECHANISMS.md 2.3; B batch, n segment length, D width,
K = 6 d_mem feature width):

1. READ, before the layer's own pre-norm, at every position (memory tokens too):
   ``q = phi(W_Q h)``, ``h <- h + (q A) / (q . z + eps)``; skipped for segment 1.
2. LAYER: the backbone block, plain causal attention over [segment ; P].
3. WRITE from the layer's memory-token outputs m_i, all M in parallel against
   the OLD state: ``k = phi(W_K m)``, ``v = W_V m``, ``beta = sigmoid(w_beta m)``,
   ``v_bar = (k A)/(k . z + eps)``, ``gamma = clip(1 - (k . z + eps)/|k|^2, 0, 1)``
   (stop-gradient; ``|k|^2 + eps`` with ``normalize_phi=False``),
   ``A += sum_i beta_i k_i (v_i - v_bar_i)^T``, ``z += sum_i gamma_i k_i``. The
   first write (empty memory) uses v_bar = 0, gamma = 1.

``phi`` is DPFP with nu = 3: ``r = [relu(u); relu(-u)]``,
``phi(u) = [r * roll(r, 1); r * roll(r, 2); r * roll(r, 3)]``, L2-normalised
by default (``normalize_phi``).

From the paper and its code: the segment loop with memory tokens *after* the
segment's tokens (segment tokens cannot see them); RoPE positions restarting at
0 in every segment (memory tokens at n..n+M-1); logits of real tokens only,
concatenated before the shifted cross-entropy; memory reset for every sequence;
DPFP-3 keys; W_V zero-initialised; the delta rule with the v_bar / gamma
correction, gamma under stop-gradient, the first segment writing with
v_bar = 0, gamma = 1 and reading nothing; A, z per layer, P and the backbone
shared; full BPTT (nothing detached) by default; curriculum over growing
numbers of segments; generation that writes complete segments and decodes the
partial one with a KV cache, reading from the fixed memory.

**[our design choice]** where the paper or its code leaves room:

* L2-normalised DPFP features by default (the newer code; ``normalize_phi=False``
  is the 2024 paper), one memory head (the code's default ``n_heads=1``), no
  gating, no sink token and no sliding window to the previous segment;
* ``correction=False`` sets gamma = 1 (as the code's flag does); v_bar is always
  subtracted (the delta rule);
* gamma follows each code version exactly: with ``normalize_phi=True`` (the
  newer code) ``1 - (k . z + eps) / |k|^2``; with ``normalize_phi=False`` (the
  2024 code) ``1 - (k . z + eps) / (|k|^2 + eps)``. The two differ only through
  that eps, which is negligible for unit keys but not for small raw keys;
* P ~ N(0, std of the token-embedding matrix) (the older code), W_Q and W_K ~
  N(0, init_std), w_beta ~ N(0, init_std) with bias 0 (beta = 0.5 at first);
* A and z in fp32 (fp64 when the model is fp64), also under bf16 autocast;
* ``memory_layers`` picks the wrapped layers (None = all, () = none: the
  segmented backbone, an ablation); unwrapped layers neither read nor write,
  memory tokens still flow through them;
* ``detach_every=k`` (k >= 2) detaches the memory entering segments k, 2k, ...
  (truncated BPTT: no gradient crosses those boundaries); ``grad_checkpoint``
  recomputes each segment in backward;
* the last segment of a training forward does not write (nothing would read
  it), so its memory tokens are not run at all;
* generation crosses segment boundaries: when a decoded segment fills, P runs
  once through the same KV cache (the M memory tokens attend to the cached
  segment, exactly as in training) to WRITE, then the cache starts afresh. The
  decoding state is one cache of S + M slots per layer plus A, z: constant in
  the total length. ``stream`` reads a long prompt into that state without
  keeping the prompt's logits (only the last token's), so inference memory
  stays constant to any length.

``trace`` names: ``segment{s}.layer{i}.`` + ``read_query`` (q features), ``read``
(what is added to h), ``write_key``, ``write_value``, ``beta``, ``gamma``, ``A``,
``z`` (the memory after the write). ``train_curriculum`` runs the 2 -> 4 -> 8
segment curriculum with the kit's Trainer.

The backbone must expose ``embed`` (token ids -> (B, T, D)), ``blocks`` (each
callable as ``block(x, positions, cache)``), ``norm``, ``head``, ``cfg`` (a
ModelConfig) and ``new_state(batch, capacity)`` with ``.caches`` (one
``nn.KVCache`` per block): the kit's ``DenseLM`` (``backbone="dense"``) or
``HFBackbone`` around a Hugging Face Llama model (``backbone="hf"``).

``reference_forward(model, tokens)`` writes the segment loop, READ and WRITE
out one equation per line (kit backbones); tests check that it equals the
fast forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from blockmem_lite.config import ModelConfig
from blockmem_lite.flops import layer_matmul_flops, lm_head_flops
from blockmem_lite.labdata import state_growth
from blockmem_lite.masks import causal_mask
from blockmem_lite.models.base import LanguageModel, State, build_model, check_tokens
from blockmem_lite.models.dense import DenseState
from blockmem_lite.nn import KVCache
from blockmem_lite.registry import (
    BASELINE,
    BenchOption,
    Claim,
    LabSpec,
    Mechanism,
    Options,
    SpecialBench,
    register,
)
from blockmem_lite.trace import is_tracing, record, scope
from blockmem_lite.units import fmt, human_bytes
from blockmem_lite.validation import (
    check_bool,
    check_int,
    check_non_negative,
    check_positive,
    fail,
    parse_int_list,
)

EPS = 1e-5                     # the eps of the read / write denominators (paper code)
DPFP_NU = 3                    # DPFP order: key width 2 * nu * d_mem
SUPPORTED_BACKBONES = ("dense", "hf")
BACKBONE_PARTS = ("embed", "blocks", "norm", "head", "cfg", "new_state")

Memory = tuple[torch.Tensor, torch.Tensor] | None   # (A (B, K, D), z (B, K)), None = empty


@dataclass
class ARMTOptions(Options):
    """ARMT's fields: the wrapped backbone, segments, memory tokens and the associative memory."""

    backbone: str = field(default="dense", metadata={
        "help": "arch of the wrapped model when ARMT is built from a config (dense; hf by wrap)"})
    segment_size: int = field(default=64, metadata={"help": "S: tokens per segment"})
    n_mem_tokens: int = field(default=8, metadata={
        "help": "M: memory (write) tokens appended to each segment"})
    d_mem: int = field(default=16, metadata={
        "help": "associative key width before DPFP (keep <= d_model / 4)"})
    normalize_phi: bool = field(default=True, metadata={
        "help": "L2-normalised DPFP features (False: the 2024 paper's form)"})
    correction: bool = field(default=True, metadata={
        "help": "delta rule with the v_bar / gamma correction"})
    detach_every: int = field(default=0, metadata={
        "help": "truncated BPTT: detach the memory every k segments (0 = full BPTT)"})
    grad_checkpoint: bool = field(default=False, metadata={
        "help": "recompute each segment in backward (less memory, more time)"})
    memory_layers: tuple | None = field(default=None, metadata={
        "help": "wrapped layers (None = all, () = none: the segmented backbone)"})

    def validate(self, cfg) -> None:
        if self.backbone not in SUPPORTED_BACKBONES:
            fail("backbone", self.backbone,
                 f"ARMT wraps one of {', '.join(SUPPORTED_BACKBONES)} (the kit's DenseLM, or "
                 "HFBackbone around a Hugging Face Llama model)")
        check_int("segment_size", self.segment_size, 1)
        if self.segment_size > cfg.seq_len:
            fail("segment_size", self.segment_size,
                 f"must be between 1 and seq_len={cfg.seq_len} (the training context)")
        if isinstance(self.n_mem_tokens, bool) or not isinstance(self.n_mem_tokens, int) \
                or self.n_mem_tokens < 1:
            fail("n_mem_tokens", self.n_mem_tokens,
                 "expected an integer >= 1 (ARMT writes its memory through the memory tokens)")
        check_int("d_mem", self.d_mem, 1)
        check_int("detach_every", self.detach_every, 0)
        if self.detach_every == 1:
            fail("detach_every", 1, "expected 0 (full BPTT) or >= 2: detaching the memory before "
                 "every segment cuts every gradient to the memory, so it would never learn")
        for name in ("normalize_phi", "correction", "grad_checkpoint"):
            check_bool(name, getattr(self, name))
        self._validate_layers(cfg.n_layer)

    def _validate_layers(self, n_layer: int) -> None:
        layers = self.memory_layers
        if layers is None:
            return
        if not isinstance(layers, tuple):
            fail("memory_layers", layers, "expected None (all layers) or a tuple of layer "
                 "indices, () for none (the segmented backbone without memory)")
        in_range = all(not isinstance(i, bool) and isinstance(i, int) and 0 <= i < n_layer
                       for i in layers)
        if not in_range or len(set(layers)) != len(layers):
            fail("memory_layers", layers,
                 f"expected None (all layers) or unique layer indices in 0..{n_layer - 1} "
                 f"(n_layer={n_layer})")


# --- the memory maths as pure functions (tests and notebooks use them) -------------------

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


def associative_read(q_phi: torch.Tensor, A: torch.Tensor, z: torch.Tensor,
                     eps: float = EPS) -> torch.Tensor:
    """``(q A) / (q . z + eps)``. q_phi: (B, T, K), A: (B, K, D), z: (B, K) -> (B, T, D)."""
    num = torch.einsum("btk,bkd->btd", q_phi, A)
    den = torch.einsum("btk,bk->bt", q_phi, z)[..., None] + eps
    return num / den


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
    """Write M (key, value) pairs in parallel; returns the new (A, z).

    k_phi: (B, M, K), v: (B, M, D), beta: (B, M) write strengths. A, z = None
    means an empty memory (the first segment): v_bar = 0 and gamma = 1. Both
    v_bar and gamma come from the OLD (A, z); ``normalized`` picks gamma's form
    (see ``novelty``).
    """
    A_new, z_new, _ = _write(A, z, k_phi, v, beta, correction, eps, normalized)
    return A_new, z_new


def _write(A, z, k_phi, v, beta, correction, eps, normalized=True):
    """``associative_write`` that also returns gamma (B, M) for the trace.

    In few operators, as training runs it once per segment and layer: the memory is one
    tensor ``[A | z]`` (B, K, D + 1), so ``k_phi [A | z]`` gives ``k A`` and ``k . z`` (v_bar
    and gamma) in one matmul, and ``[A | z] + k_phi^T [beta (v - v_bar) | gamma]`` both
    updates in one more. A and z come back as views of the new ``[A | z]``.
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


# --- one wrapped layer -------------------------------------------------------------------

@dataclass
class PreparedRead:
    """A memory made ready for fast reads (``AssociativeMemoryLayer.prepare_read``).

    ``memory``: (A, z) as views of ``az`` = [A | z] (B, K, D + 1); ``w_signed``:
    [W_Q; -W_Q] (2 d_mem, D); ``roll_index``: (nu, 2 d_mem), ``roll(r, j) = r[..., roll_index[j-1]]``.
    """

    memory: tuple[torch.Tensor, torch.Tensor]
    az: torch.Tensor
    w_signed: torch.Tensor
    roll_index: torch.Tensor


def _no_autocast(device_type: str):
    """Autocast off (the memory maths stays in fp32) -- a no-op context when it is off already."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _state_dtype(x: torch.Tensor) -> torch.dtype:
    """A and z live in fp32, or fp64 for fp64 models (never bf16)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class AssociativeMemoryLayer(nn.Module):
    """The associative memory of one wrapped layer: W_Q, W_K (d -> d_mem), W_V (d -> d), w_beta.

    ARMT uses it only through ``read(h, (A, z))`` and ``write(m, memory or None)``, so any
    module with those two methods (and these parameter names, for ``checks.swap_modules``) can
    stand in for it: notebook 06's capstone plugs in a learner's layer this way.
    """

    def __init__(self, d_model: int, d_mem: int, normalize_phi: bool = True,
                 correction: bool = True, init_std: float = 0.02, eps: float = EPS):
        super().__init__()
        self.normalize_phi = normalize_phi
        self.correction = correction
        self.eps = eps
        self.w_q = nn.Linear(d_model, d_mem, bias=False)
        self.w_k = nn.Linear(d_model, d_mem, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.w_beta = nn.Linear(d_model, 1)
        for linear in (self.w_q, self.w_k, self.w_beta):
            nn.init.normal_(linear.weight, std=init_std)
        nn.init.zeros_(self.w_beta.bias)
        nn.init.zeros_(self.w_v.weight)      # A stays 0 until W_V learns: a fresh ARMT = backbone

    @property
    def key_dim(self) -> int:
        """K = 2 * nu * d_mem, the width of the DPFP features (and of A's rows)."""
        return 2 * DPFP_NU * self.w_k.out_features

    def read(self, h: torch.Tensor, memory: Memory) -> torch.Tensor:
        """What the memory adds to the layer input h: (B, T, D) -> (B, T, D)."""
        return self.read_prepared(h, self.prepare_read(memory))

    def prepare_read(self, memory: tuple[torch.Tensor, torch.Tensor]) -> PreparedRead:
        """What ``read_prepared`` needs, built once per memory (once per segment when
        decoding), not once per token: ``[A | z]`` in one (B, K, D + 1) tensor, whose
        views (A, z) replace the memory (so the state holds them once), with the layer's
        signed query weights ``[W_Q; -W_Q]`` and DPFP roll indices."""
        A, z = memory
        az = torch.cat([A, z[..., None]], dim=-1)                               # (B, K, D + 1)
        d = A.shape[-1]
        w_signed, roll_index = self._fused_weights("read")
        return PreparedRead((az[..., :d], az[..., d]), az, w_signed, roll_index)

    def _fused_weights(self, use: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, the DPFP roll indices) of one matmul for ``use``: ``"read"``
        ``[W_Q; -W_Q]``; ``"write"`` ``[W_K; -W_K; W_V; w_beta]`` (b_beta added after: a
        fused bias rounds differently with and without autograd).

        Kept on the layer per weight version (built afresh while autograd tracks the
        weights); a re-layout of the weights, not decoding state.
        """
        if use == "read":
            params, parts = [self.w_q.weight], (self.w_q.weight, -self.w_q.weight)
        else:
            params = [self.w_k.weight, self.w_v.weight, self.w_beta.weight]
            parts = (self.w_k.weight, -self.w_k.weight, self.w_v.weight, self.w_beta.weight)
        track = torch.is_grad_enabled() and any(p.requires_grad for p in params)
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        cache = self.__dict__.setdefault("_fused_cache", {})
        cached = cache.get(use)
        if not track and cached is not None and cached[0] == key:
            return cached[1]
        w = params[0]
        r = 2 * w.shape[0]
        steps = torch.arange(1, DPFP_NU + 1, device=w.device)[:, None]
        roll_index = (torch.arange(r, device=w.device) - steps) % r                  # (nu, 2 d_mem)
        fused = (torch.cat(parts, dim=0), roll_index)
        cache[use] = None if track else (key, fused)
        return fused

    def _signed_features(self, signed: torch.Tensor, roll_index: torch.Tensor) -> torch.Tensor:
        """DPFP from ``signed = [u; -u]`` (..., 2 d_mem) -> phi (..., K), in the state dtype.

        ``relu([u; -u]) = [relu(u); relu(-u)] = r`` exactly (negating a weight negates the
        dot product exactly); the nu rolls of r are one gather (``r[..., roll_index]``), so
        ``phi`` is bit-identical to ``dpfp(u)``. Call with autocast off.
        """
        dtype = _state_dtype(signed)
        r = F.relu(signed if signed.dtype == dtype else signed.to(dtype))
        phi = (r.unsqueeze(-2) * r[..., roll_index]).flatten(-2)               # (..., K)
        return F.normalize(phi, dim=-1) if self.normalize_phi else phi

    def read_prepared(self, h: torch.Tensor, prepared: PreparedRead) -> torch.Tensor:
        """``read(h, memory)`` from ``prepare_read(memory)``: one matmul for ``[q; -q]``
        (``_signed_features``), one with ``[A | z]`` for ``q A`` and ``q . z`` together.
        h (B, T, D) -> (B, T, D)."""
        signed = F.linear(h, prepared.w_signed)                                 # (B, T, 2 d_mem)
        with _no_autocast(h.device.type):
            phi = self._signed_features(signed, prepared.roll_index)            # (B, T, K)
            out = torch.matmul(phi, prepared.az)                               # (B, T, D + 1)
            d = out.shape[-1] - 1
            read = out[..., :d] / (out[..., d:] + self.eps)
        record("read_query", phi)
        record("read", read)
        return read if read.dtype == h.dtype else read.to(h.dtype)

    def write(self, m: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the memory-token outputs m: (B, M, D); returns the new (A, z).

        ``[k; -k]``, v and the beta logit come from one matmul (``_fused_weights``).
        """
        weight, roll_index = self._fused_weights("write")
        r, d = roll_index.shape[-1], m.shape[-1]
        # contiguous: matmul treats a strided 3-D input differently when the weight needs
        # grad, so prefill (autograd on) and stream (off) would round differently
        k_signed, v, b = F.linear(m.contiguous(), weight).split([r, d, 1], dim=-1)
        b = b + self.w_beta.bias
        with _no_autocast(m.device.type):
            dtype = _state_dtype(m)
            k_phi = self._signed_features(k_signed, roll_index)                 # (B, M, K)
            beta = torch.sigmoid(b.to(dtype))[..., 0]                           # (B, M)
            A, z = memory if memory is not None else (None, None)
            A, z, gamma = _write(A, z, k_phi, v.to(dtype), beta, self.correction, self.eps,
                                 self.normalize_phi)
        record("write_key", k_phi)
        record("write_value", v)
        record("beta", beta)
        record("gamma", gamma)
        record("A", A)
        record("z", z)
        return A, z


# --- decoding state ----------------------------------------------------------------------

class ARMTState(State):
    """One KV cache of S + M slots per layer, the memory (A, z) per layer, tokens seen.

    ``memory[i]`` is None until the first segment is written, then (A, z) of
    fixed size: from the first complete segment on, ``nbytes`` never changes.
    """

    def __init__(self, caches: list, memory: list[Memory], position: int = 0):
        self.caches = caches
        self.memory = memory
        self.position = position
        self.prepared: dict[int, PreparedRead] = {}   # layer -> its memory made ready to read

    def tensors(self) -> list[torch.Tensor]:
        kv = [t for c in self.caches for t in (c.k, c.v)]
        return kv + [t for m in self.memory if m is not None for t in m]


# --- the model ---------------------------------------------------------------------------

def _detach(memory: list[Memory]) -> list[Memory]:
    return [None if m is None else (m[0].detach(), m[1].detach()) for m in memory]


def _backbone_name(backbone: nn.Module) -> str:
    return getattr(backbone, "backbone_arch", getattr(getattr(backbone, "cfg", None), "arch", "?"))


def check_backbone(backbone) -> None:
    """Clear error unless ``backbone`` offers what ARMT needs (see the module docstring)."""
    missing = [p for p in BACKBONE_PARTS if not hasattr(backbone, p)]
    name = type(backbone).__name__
    if missing or not isinstance(backbone, nn.Module):
        raise ValueError(
            f"backbone of type {name} is not allowed: ARMT needs a module with "
            f"{', '.join(BACKBONE_PARTS)} (missing: {', '.join(missing) or 'nn.Module'}); "
            "use a kit DenseLM or HFBackbone(hf_model)")
    arch = _backbone_name(backbone)
    if arch not in SUPPORTED_BACKBONES:
        raise ValueError(
            f"backbone of type {name} (arch={arch!r}) is not allowed: ARMT wraps "
            f"{', '.join(SUPPORTED_BACKBONES)} backbones, whose blocks are called as "
            "block(x, positions, cache)")


class ARMT(LanguageModel):
    """A backbone LM wrapped with ARMT's segment loop and per-layer associative memory.

    Three ways to get one:

    * ``build_model(ModelConfig(arch="armt", ...))``: a fresh dense backbone from
      the config, wrapped;
    * ``ARMT.wrap(backbone, segment_size=..., ...)``: wrap an existing (pretrained)
      model, its weights kept (``ARMT.wrap(train.load_model(path))`` wraps the
      model of a Trainer checkpoint).
    """

    def __init__(self, cfg, backbone: nn.Module | None = None):
        super().__init__(cfg)
        if backbone is None:
            backbone = _build_backbone(cfg)
        check_backbone(backbone)
        width = backbone.embed.weight.shape[1]
        if len(backbone.blocks) != cfg.n_layer or width != cfg.d_model:
            raise ValueError(f"n_layer={cfg.n_layer}, d_model={cfg.d_model} are not allowed: the "
                             f"backbone has {len(backbone.blocks)} blocks of width {width} "
                             "(ARMT.wrap takes both from the backbone)")
        self.backbone = backbone
        self.segment_size = cfg.segment_size
        self.detach_every = cfg.detach_every
        self.grad_checkpoint = cfg.grad_checkpoint
        embedding = backbone.embed.weight.detach()
        self.memory_tokens = nn.Parameter(                                       # P: (M, D)
            torch.randn(cfg.n_mem_tokens, cfg.d_model, device=embedding.device,
                        dtype=embedding.dtype) * embedding.float().std())   # works on "meta"
        wrapped = range(cfg.n_layer) if cfg.memory_layers is None else sorted(cfg.memory_layers)
        self.memory = nn.ModuleDict({
            str(i): AssociativeMemoryLayer(cfg.d_model, cfg.d_mem, cfg.normalize_phi,
                                           cfg.correction, cfg.init_std)
            for i in wrapped}).to(embedding)

    # --- construction ----------------------------------------------------------------------
    @classmethod
    def wrap(cls, backbone: nn.Module, **settings) -> ARMT:
        """Wrap ``backbone`` (weights kept). ``settings``: ModelConfig fields, e.g.
        segment_size, n_mem_tokens, d_mem, normalize_phi, correction, memory_layers,
        detach_every, grad_checkpoint, seq_len; unset ones keep the backbone config's
        values (for ARMT fields: the ModelConfig defaults)."""
        check_backbone(backbone)
        cfg = dataclasses.replace(backbone.cfg, arch="armt", backbone=_backbone_name(backbone),
                                  **settings)
        return cls(cfg, backbone)

    @property
    def n_mem_tokens(self) -> int:
        return self.memory_tokens.shape[0]

    def memory_layer(self, index: int) -> AssociativeMemoryLayer | None:
        """The memory of backbone layer ``index``, or None for an unwrapped layer."""
        key = str(index)
        return self.memory[key] if key in self.memory else None

    # --- training / full forward -----------------------------------------------------------
    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None):
        check_tokens(tokens, self.cfg.vocab_size)
        logits, _ = self.run_segments(tokens, write_last=False)
        return self.output(logits, targets)

    def run_segments(self, tokens: torch.Tensor, write_last: bool = True):
        """The segment loop from an empty memory. tokens (B, T) -> (logits (B, T, V), memory).

        ``write_last=False`` skips the last segment's write (a forward pass never
        reads it). Memory is per call: nothing leaks between batches. The final norm
        and head run once over every segment's hidden states (one large matmul).
        """
        b, t = tokens.shape
        if t == 0:
            raise ValueError("tokens with T=0 are not allowed: ARMT needs at least one token")
        memory: list[Memory] = [None] * len(self.backbone.blocks)
        pieces = []
        for s, start in enumerate(range(0, t, self.segment_size)):
            if self.detach_every and s and s % self.detach_every == 0:
                memory = _detach(memory)
            segment = tokens[:, start:start + self.segment_size]
            write = write_last or start + self.segment_size < t
            if self.grad_checkpoint and self.training and torch.is_grad_enabled():
                hidden, memory = checkpoint(self._segment, segment, memory, write, s,
                                            use_reentrant=False)
            else:
                hidden, memory = self._segment(segment, memory, write, s)
            pieces.append(hidden)
        return self.logits(torch.cat(pieces, dim=1)), memory

    def _segment(self, tokens: torch.Tensor, memory: list[Memory], write: bool, index: int):
        """One segment [x_s ; P]: READ, block, WRITE per layer. Returns (hidden (B, n, D), memory);
        ``logits`` turns the hidden states into logits."""
        b, n = tokens.shape
        x = self.backbone.embed(tokens)                                          # (B, n, D)
        if write:
            x = torch.cat([x, self.memory_tokens.expand(b, -1, -1).to(x.dtype)], dim=1)
        positions = torch.arange(x.shape[1], device=x.device)                   # restart at 0
        memory = list(memory)
        with scope(f"segment{index}"):
            for i, block in enumerate(self.backbone.blocks):
                with scope(f"layer{i}"):
                    layer = self.memory_layer(i)
                    if layer is not None and memory[i] is not None:
                        x = x + layer.read(x, memory[i])
                    x = block(x, positions, None)                                # (B, n+M, D)
                    if layer is not None and write:
                        memory[i] = layer.write(x[:, n:], memory[i])
        return x[:, :n], memory

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The backbone's final norm and head: hidden (B, n, D) -> logits (B, n, V)."""
        return self.backbone.head(self.backbone.norm(hidden))

    def run_layer_major(self, tokens: torch.Tensor) -> torch.Tensor:
        """The same maths in the other loop order (MECHANISMS.md 2.7, A3): layer by layer,
        each layer running every segment in turn with its own memory. tokens (B, T) ->
        logits (B, T, V), equal to ``forward``'s.

        Possible because a layer's memory depends only on that layer's inputs: this is
        the order of the "inner loop" variant, which puts the segment loop inside each
        wrapped layer of an unchanged model.
        """
        check_tokens(tokens, self.cfg.vocab_size)
        b = tokens.shape[0]
        segments = list(tokens.split(self.segment_size, dim=1))
        memory_tokens = self.memory_tokens.expand(b, -1, -1)
        xs = [torch.cat([self.backbone.embed(seg), memory_tokens.to(self.backbone.embed.weight.dtype)],
                        dim=1) for seg in segments]                          # (B, n_s + M, D)
        for i, block in enumerate(self.backbone.blocks):
            layer, memory = self.memory_layer(i), None
            for s, x in enumerate(xs):
                if layer is not None and memory is not None:
                    x = x + layer.read(x, memory)
                x = block(x, torch.arange(x.shape[1], device=x.device), None)
                if layer is not None:
                    memory = layer.write(x[:, -self.n_mem_tokens:], memory)
                xs[s] = x
        return self.logits(torch.cat([x[:, :seg.shape[1]]
                                      for x, seg in zip(xs, segments, strict=True)], dim=1))

    # --- generation ------------------------------------------------------------------------
    def new_state(self, batch: int) -> ARMTState:
        """Empty memory and one cache of segment_size + n_mem_tokens slots per layer."""
        caches = self.backbone.new_state(batch, self.segment_size + self.n_mem_tokens).caches
        return ARMTState(list(caches), [None] * len(self.backbone.blocks))

    def prefill(self, tokens: torch.Tensor, max_len: int | None = None):
        """Complete segments as in training (written), the rest into the cache.

        ``max_len`` is not needed: the state is O(segment_size) whatever the length.
        """
        check_tokens(tokens, self.cfg.vocab_size)
        state = self.new_state(tokens.shape[0])
        aligned = tokens.shape[1] // self.segment_size * self.segment_size
        pieces = []
        if aligned:
            logits, state.memory = self.run_segments(tokens[:, :aligned], write_last=True)
            pieces.append(logits)
            state.position = aligned
        if aligned < tokens.shape[1]:
            pieces.append(self._decode(tokens[:, aligned:], state))
        return torch.cat(pieces, dim=1), state

    @torch.no_grad()
    def stream(self, tokens: torch.Tensor, state: ARMTState | None = None):
        """Read a long prompt segment by segment in constant memory (no grad).

        tokens (B, T) -> (logits of the last token (B, V), state). The state is
        the one ``prefill`` returns (complete segments written, the rest in the
        cache), ready for ``step``; but nothing grows with T: each segment's
        logits are dropped once its last row is kept. ``state`` continues an
        earlier stream or prefill, so an input too long to hold at once can be
        fed in pieces of any size.
        """
        check_tokens(tokens, self.cfg.vocab_size)
        if tokens.shape[1] == 0:
            raise ValueError("tokens with T=0 are not allowed: stream needs at least one token")
        if state is None:
            state = self.new_state(tokens.shape[0])
        elif state.caches[0].k.shape[0] != tokens.shape[0]:
            raise ValueError(f"tokens with batch {tokens.shape[0]} are not allowed with a state "
                             f"of batch {state.caches[0].k.shape[0]}: expected the same batch")
        size, start, last = self.segment_size, 0, None
        pending = state.caches[0].length              # a partly read segment: finish it first
        if pending:
            start = min(size - pending, tokens.shape[1])
            last = self._decode(tokens[:, :start], state)[:, -1]
        while start + size <= tokens.shape[1]:
            index = state.position // size
            hidden, state.memory = self._segment(tokens[:, start:start + size], state.memory,
                                                 True, index)
            last = self.logits(hidden)[:, -1]            # (B, V); whole rows as prefill has them
            state.position += size
            start += size
        if start < tokens.shape[1]:
            last = self._decode(tokens[:, start:], state)[:, -1]
        return last, state

    def step(self, token: torch.Tensor, state: ARMTState):
        token = token.reshape(-1, 1)                                             # (B, 1)
        check_tokens(token, self.cfg.vocab_size)
        return self._decode(token, state)[:, -1], state

    def _decode(self, tokens: torch.Tensor, state: ARMTState) -> torch.Tensor:
        """Tokens (B, r) of the current segment through the caches -> logits (B, r, V).

        The memory is made ready to read once per segment (``prepare_reads``); the tokens
        go through ``decode_tokens``; when the segment is full, P runs through the same
        caches to write, and the caches start a fresh segment.
        """
        self.prepare_reads(state)
        logits = self.decode_tokens(tokens, state)
        if state.caches[0].length == self.segment_size:
            index = (state.position - 1) // self.segment_size
            memory_tokens = self.memory_tokens.expand(tokens.shape[0], -1, -1)
            self._cached_pass(memory_tokens.to(self.backbone.embed.weight.dtype), state, index,
                              write=True)
            for cache in state.caches:
                cache.reset()
        return logits

    def decode_tokens(self, tokens: torch.Tensor, state: ARMTState) -> torch.Tensor:
        """The per-token part of decoding (no segment boundary, memory already prepared):
        tokens (B, r) -> logits (B, r, V). What ``compiling.compile_decoding`` compiles."""
        x = self._cached_pass(self.backbone.embed(tokens), state, None, write=False)
        state.position += tokens.shape[1]
        return self.logits(x)

    def prepare_reads(self, state: ARMTState) -> None:
        """Make each kit memory layer's memory ready to read (``prepare_read``), once per
        memory: again only after a write (or a prefill / stream) replaced it."""
        for key, layer in self.memory.items():
            i = int(key)
            memory = state.memory[i]
            if memory is None or type(layer) is not AssociativeMemoryLayer:
                continue
            prepared = state.prepared.get(i)
            if prepared is None or prepared.memory is not memory:
                prepared = layer.prepare_read(memory)
                state.memory[i] = prepared.memory          # (A, z) as views of [A | z]
                state.prepared[i] = prepared

    def _cached_pass(self, x: torch.Tensor, state: ARMTState, index: int | None,
                     write: bool) -> torch.Tensor:
        """x (B, r, D) after the cached part of segment ``index`` (None: the segment of
        ``state.position``); reads, and writes if asked.

        Kit memory layers read from their prepared memory (``prepare_reads`` ran first and
        keeps it current); any other memory module (a learner's, a subclass with its own
        ``read``) reads as usual.
        """
        start = state.caches[0].length
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        # the segment's name only when a trace records it: a compiled decode_tokens would
        # otherwise specialise on the segment index and recompile at every segment
        named = contextlib.nullcontext()
        if is_tracing():
            named = scope(f"segment{state.position // self.segment_size if index is None else index}")
        with named:
            for i, block in enumerate(self.backbone.blocks):
                with scope(f"layer{i}"):
                    layer = self.memory_layer(i)
                    if layer is not None and state.memory[i] is not None:
                        prepared = state.prepared.get(i)
                        x = x + (layer.read(x, state.memory[i]) if prepared is None
                                 else layer.read_prepared(x, prepared))
                    x = block(x, positions, state.caches[i])
                    if layer is not None and write:
                        state.memory[i] = layer.write(x, state.memory[i])
                        state.prepared.pop(i, None)              # prepared again before a read
        return x


def _build_backbone(cfg) -> nn.Module:
    if cfg.backbone == "hf":
        raise ValueError("backbone='hf' is not allowed when building from a config: a Hugging "
                         "Face model cannot be rebuilt from a ModelConfig; load it and use "
                         "ARMT.wrap(HFBackbone(hf_model), ...) (or pass model= to "
                         "Trainer.from_checkpoint)")
    return build_model(dataclasses.replace(cfg, arch=cfg.backbone))


# --- the reference forward: MECHANISMS.md 2.2-2.3, step by step, no fast-path tricks -----

def reference_forward(model: ARMT, tokens: torch.Tensor) -> torch.Tensor:
    """ARMT logits written out equation by equation. tokens (B, T) -> (B, T, V).

    The segment loop of 2.2 with the READ and WRITE of 2.3 spelled out per
    wrapped layer; the backbone blocks run with the hand-written attention.
    Every segment, the last one too, gets its memory tokens and writes (the
    fast path skips that unread last write; the segment's logits cannot see
    it). Kit backbones only (a ``DenseLM``); eval-mode maths (no dropout).
    Tests check it equals ``model(tokens).logits``.
    """
    backbone = model.backbone
    if _backbone_name(backbone) != "dense":
        raise ValueError(f"backbone {_backbone_name(backbone)!r} is not allowed: the reference "
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


# --- Hugging Face adapter (optional: the ``hf`` extra) ------------------------------------

class _HFCacheView:
    """The one Cache method an HF Llama attention calls, backed by a kit ``nn.KVCache``."""

    def __init__(self, cache):
        self.cache = cache

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.cache.append(key_states, value_states)


# The decoder layer's name for its KV cache argument: ``cache`` from transformers 5.2x on
# (``past_key_values`` there is deprecated, to be removed in 5.40), ``past_key_values``
# from 4.56, ``past_key_value`` before that.
_HF_CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value")


def _hf_cache_keyword(layer: nn.Module) -> str:
    """The keyword this HF decoder layer takes its cache by (read off its signature)."""
    parameters = inspect.signature(layer.forward).parameters
    for name in _HF_CACHE_KEYWORDS:
        if name in parameters:
            return name
    raise ValueError(f"hf_model's decoder layer {type(layer).__name__} takes none of "
                     f"{_HF_CACHE_KEYWORDS} as its cache argument: this transformers version "
                     "is not supported (see the README for the tested ones)")


class _HFBlock(nn.Module):
    """An HF decoder layer callable as ``block(x, positions, cache)`` like a kit Block."""

    def __init__(self, layer: nn.Module, rotary: nn.Module):
        super().__init__()
        self.layer = layer
        self.rotary = rotary
        self.cache_keyword = _hf_cache_keyword(layer)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache=None) -> torch.Tensor:
        position_ids = positions[None]                                          # (1, T)
        cos_sin = self.rotary(x, position_ids)
        q_len = x.shape[1]
        kv_len = q_len + (cache.length if cache is not None else 0)
        mask = None
        if q_len > 1:      # explicit, bottom-right: HF's own causal shortcut assumes no cache
            allowed = causal_mask(q_len, kv_len, device=x.device)
            mask = torch.zeros(q_len, kv_len, device=x.device, dtype=x.dtype)
            mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]
        past = {self.cache_keyword: _HFCacheView(cache) if cache is not None else None}
        out = self.layer(x, attention_mask=mask, position_ids=position_ids,
                         position_embeddings=cos_sin, **past)
        return out[0] if isinstance(out, tuple) else out


class HFBackbone(nn.Module):
    """A Hugging Face Llama causal LM seen through the kit's embed / blocks / norm / head.

    ``ARMT.wrap(HFBackbone(hf_model), segment_size=...)`` wraps it; the HF
    weights are shared, not copied. Only ``model_type == "llama"`` is accepted:
    other families differ in ways an adapter would silently get wrong (scaled
    embeddings, sliding windows, learned positions). Decoding uses kit
    ``KVCache`` objects (``num_key_value_heads`` heads) through the one Cache
    method the attention calls, ``update``; masks are passed explicitly
    (additive, bottom-right causal), so eager and SDPA attention both work.
    ``cfg`` is a ModelConfig describing the shapes (arch "dense" of the same
    width, depth and vocabulary); ``backbone_arch`` is "hf".
    """

    backbone_arch = "hf"

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        config = getattr(hf_model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type != "llama" or not hasattr(hf_model, "model"):
            raise ValueError(f"hf_model with model_type={model_type!r} is not allowed: "
                             "HFBackbone supports Hugging Face Llama causal LMs "
                             "(LlamaForCausalLM) only")
        inner = hf_model.model
        self.embed = inner.embed_tokens
        self.blocks = nn.ModuleList(_HFBlock(layer, inner.rotary_emb) for layer in inner.layers)
        self.norm = inner.norm
        self.head = hf_model.lm_head
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or \
            config.hidden_size // config.num_attention_heads
        self.cfg = ModelConfig(arch="dense", vocab_size=config.vocab_size,
                               d_model=config.hidden_size, n_layer=len(self.blocks),
                               n_head=config.num_attention_heads,
                               seq_len=config.max_position_embeddings,
                               mlp_ratio=config.intermediate_size / config.hidden_size,
                               norm_eps=config.rms_norm_eps, init_std=config.initializer_range)

    def new_state(self, batch: int, max_len: int):
        """Empty KV caches of ``max_len`` slots, one per layer (``.caches``)."""
        p = self.embed.weight
        return DenseState([KVCache(batch, self.n_kv_heads, max_len, self.head_dim, p.device,
                                   p.dtype) for _ in self.blocks])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V) through the adapter (equals the HF model's)."""
        x = self.embed(tokens)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        for block in self.blocks:
            x = block(x, positions, None)
        return self.head(self.norm(x))


# --- FLOP model ---------------------------------------------------------------------------

def armt_layer_flops(d_model: int, segment_size: int, n_mem_tokens: int, d_mem: int) -> float:
    """ARMT layer, per token:
    ``(1 + m/S)·[24·d² + 2·d·(S + m)] + 14·d·d_mem + (m/S)·(2·d² + 26·d·d_mem)``.

    m memory tokens per segment of S tokens; the read (W_Q, qᵀA with DPFP ν=3,
    so d_key = 6·d_mem) runs for every token, the write once per memory token.
    """
    check_positive("segment_size", segment_size)
    check_non_negative("n_mem_tokens", n_mem_tokens)
    check_positive("d_mem", d_mem)
    extra = n_mem_tokens / segment_size
    layer = (1.0 + extra) * (layer_matmul_flops(d_model)
                             + 2.0 * d_model * (segment_size + n_mem_tokens))
    read = 14.0 * d_model * d_mem
    write = extra * (2.0 * d_model * d_model + 26.0 * d_model * d_mem)
    return layer + read + write


def armt_decode_layer_flops(d_model: int, segment_size: int, n_mem_tokens: int,
                            d_mem: int) -> float:
    """ARMT layer, one decoding step, averaged over a segment of S tokens:
    ``24·d² + 2·d·(S + 1) + 14·d·d_mem + (m/S)·[26·d² + 2·d·(2S + m + 1) + 40·d·d_mem]``.

    A segment token at in-segment position p attends to p + 1 cached keys
    (4·d each; the mean over p = 0..S-1 is 2·d·(S + 1)) and reads the memory
    (14·d·d_mem). Once per segment the m memory tokens run through the cache
    to write: token j sees S + j + 1 keys (mean 4·d·S + 2·d·(m + 1)), reads,
    and writes (2·d² + 26·d·d_mem), amortised over the S tokens. This is the
    steady state past the first segment: it does not depend on the context.
    """
    check_positive("d_model", d_model)
    check_positive("segment_size", segment_size)
    check_non_negative("n_mem_tokens", n_mem_tokens)
    check_positive("d_mem", d_mem)
    d, s, m = d_model, segment_size, n_mem_tokens
    token = layer_matmul_flops(d) + 2.0 * d * (s + 1) + 14.0 * d * d_mem
    write = 26.0 * d * d + 2.0 * d * (2 * s + m + 1) + 40.0 * d * d_mem
    return token + (m / s) * write


def armt_memory_flops(d_model: int, segment_size: int, n_mem_tokens: int, d_mem: int,
                      decode: bool = False) -> float:
    """The memory path inside ``armt_layer_flops`` (or ``armt_decode_layer_flops``), per token:
    ``14·d·d_mem + (m/S)·(2·d² + 26·d·d_mem)`` (decode: ``40·d·d_mem`` in the write term,
    since the m memory tokens also read). An unwrapped layer costs the ARMT layer minus this.
    """
    check_positive("d_model", d_model)
    check_positive("segment_size", segment_size)
    check_non_negative("n_mem_tokens", n_mem_tokens)
    check_positive("d_mem", d_mem)
    d, per_write = d_model, (40.0 if decode else 26.0) * d_model * d_mem
    return 14.0 * d * d_mem + (n_mem_tokens / segment_size) * (2.0 * d * d + per_write)


def flops_per_token(cfg, seq_len: int, decode: bool = False) -> float:
    """Forward FLOPs per token: ARMT layers where memory is, plain segmented layers elsewhere
    (no read or write), plus the head. A segment longer than the sequence is the sequence."""
    segment = cfg.segment_size if decode else min(cfg.segment_size, seq_len)
    args = (cfg.d_model, segment, cfg.n_mem_tokens, cfg.d_mem)
    layer = armt_decode_layer_flops(*args) if decode else armt_layer_flops(*args)
    wrapped = cfg.n_layer if cfg.memory_layers is None else len(cfg.memory_layers)
    unwrapped = cfg.n_layer - wrapped
    return (cfg.n_layer * layer - unwrapped * armt_memory_flops(*args, decode=decode)
            + lm_head_flops(cfg.d_model, cfg.vocab_size))


# --- bench: segment sizes, and the inference sweep over total length ------------------------

SEGMENT_SIZE_OPTION = BenchOption("--segment-size", "128,256",
                                  "segment sizes S for armt (comma-separated)")
INFER_LEN_OPTION = BenchOption(
    "--infer-len", "2048,8192,65536",
    "ARMT inference sweep: prompt lengths read by ARMT.stream (constant memory) next to dense's "
    "prefill (comma-separated; 'none' skips the sweep)")
INFER_DENSE_MAX_OPTION = BenchOption(
    "--infer-dense-max", "auto",
    "longest prompt dense reads in the ARMT inference sweep (auto: every length on CUDA, "
    "16384 elsewhere: a 65,536-token dense prefill takes minutes on a laptop CPU)")
CPU_DENSE_INFER_MAX = 16384      # --infer-dense-max auto off CUDA


def parse_infer_lengths(text: str) -> list[int]:
    """'--infer-len' value -> lengths; 'none' -> [] (no sweep)."""
    if str(text).strip().lower() == "none":
        return []
    return parse_int_list("--infer-len", text)


def dense_infer_limit(text: str, device) -> int | None:
    """'--infer-dense-max' value -> the longest dense prompt (None: no limit)."""
    if str(text).strip().lower() == "auto":
        return None if torch.device(device).type == "cuda" else CPU_DENSE_INFER_MAX
    values = parse_int_list("--infer-dense-max", text)
    if len(values) != 1:
        fail("--infer-dense-max", text, "expected 'auto' or one integer >= 1")
    return values[0]


def bench_variants(options: dict) -> list[tuple[str, dict]]:
    """``--segment-size 128,256`` -> [("S=128", {"segment_size": 128}), ...]; the sweep's own
    options are checked here too, so they fail before any timing."""
    parse_infer_lengths(options["infer_len"])
    dense_infer_limit(options["infer_dense_max"], "cpu")
    return [(f"S={n}", {"segment_size": n})
            for n in parse_int_list("--segment-size", options["segment_size"])]


def bench_inference(options: dict, bench) -> list[dict]:
    """Read prompts of growing total length: ARMT (``stream``) vs dense (``prefill``).

    Forward only, no grad, random (batch, T) prompts; one call = one whole prompt
    (``metrics.make_infer_step``). Dense (while T <= ``--infer-dense-max``) and
    ARMT with every segment size, at every length, are timed interleaved in one
    loop, so ratios across models *and lengths* are same-run ratios. Memory per
    entry: on CUDA the peak allocated over one call with only that model built
    (weights included); on CPU, with the "rss" memory method, the peak RSS of a
    fresh process reading one prompt.

    Records (by increasing T): phase ``"infer"``, ``ratio_vs_dense`` (tokens/s
    over dense's at the same T, None where dense was not run), ``state_bytes``
    (what is kept to continue: ARMT's constant state, dense's KV cache) and
    extra keys ``memory_vs_shortest`` / ``tokens_per_s_vs_shortest`` (this entry
    over the same entry at the shortest length: the constant-memory and
    flat-throughput targets), ``note`` (why dense is missing, or None) and the roofline
    keys by the prefill traffic model (one call reads one whole prompt).
    """
    lengths = sorted(set(parse_infer_lengths(options["infer_len"])))
    if not lengths:
        return []
    sizes = parse_int_list("--segment-size", options["segment_size"])
    dense_max = dense_infer_limit(options["infer_dense_max"], bench.device)
    batch = bench.batch or 1
    runs = [(seq_len, entry) for seq_len in lengths
            for entry in _infer_entries(bench, seq_len, sizes, dense_max)]
    memories = [bench.infer_memory(entry.cfg, batch, seq_len) for seq_len, entry in runs]
    models = [bench.build(entry.cfg) for _, entry in runs]
    state_bytes: dict[int, int] = {}
    steps = [_keeping_state_bytes(bench.infer_step(model, batch, seq_len), state_bytes, i)
             for i, (model, (seq_len, _)) in enumerate(zip(models, runs, strict=True))]
    bench.log(f"infer T={lengths} batch={batch}: timing {len(runs)} (model, length) pairs "
              f"interleaved, {bench.warmup} warm-up + {bench.repeats} timed pass(es)")
    timings = bench.time(steps, [batch * seq_len for seq_len, _ in runs])
    dense_tps = {seq_len: timing.tokens_per_s
                 for (seq_len, entry), timing in zip(runs, timings, strict=True)
                 if entry.arch == BASELINE}
    records = []
    for i, (seq_len, entry) in enumerate(runs):
        baseline = entry.arch == BASELINE
        flops = bench.flops(entry.cfg, seq_len)
        dense_flops = bench.flops(dataclasses.replace(entry.cfg, arch=BASELINE), seq_len)
        ratio = timings[i].tokens_per_s / dense_tps[seq_len] \
            if seq_len in dense_tps and not baseline else None
        records.append(bench.record(
            arch=entry.arch, variant=entry.variant, phase="infer", seq_len=seq_len, batch=batch,
            timing=timings[i], ratio=ratio,
            ceiling=None if baseline else bench.ceiling(dense_flops, flops), flops=flops,
            memory=memories[i], state_bytes=state_bytes[i],
            model_fields={k: getattr(entry.cfg, k) for k in ("d_model", "n_layer", "n_head",
                                                              "vocab_size")},
            params=models[i].num_params(), overrides=entry.overrides,
            note=None if baseline else _dense_skipped_note(bench, batch, seq_len, dense_max),
            **bench.step_cost(entry.cfg, "prefill", batch=batch, seq_len=seq_len,
                              params=models[i].num_params(), flops_per_token=flops,
                              state_bytes=state_bytes[i])))
    _add_growth(records)
    return records


def _infer_entries(bench, seq_len: int, segment_sizes, dense_max) -> list:
    entries = []
    if dense_max is None or seq_len <= dense_max:
        entries.append(bench.entry(BASELINE, seq_len))
    for size in segment_sizes:
        entry = bench.entry("armt", max(seq_len, size), f"S={size}", {"segment_size": size})
        entries.append(entry)
    return entries


def _dense_skipped_note(bench, batch: int, seq_len: int, dense_max) -> str | None:
    if dense_max is None or seq_len <= dense_max:
        return None
    width = 2 if bench.precision == "bf16" else 4
    kv = 2 * bench.base["n_layer"] * batch * seq_len * bench.base["d_model"] * width
    return (f"dense not run at T={seq_len} on {bench.device.type}: above --infer-dense-max="
            f"{dense_max} (its quadratic prefill takes minutes per pass here); its KV cache "
            f"alone would hold {human_bytes(kv)}")


def _keeping_state_bytes(step, sizes: dict, index: int):
    """``step`` that stores the returned state's bytes in ``sizes[index]`` (state then freed)."""
    def run() -> None:
        sizes[index] = step().nbytes()
    return run


def _add_growth(records: list[dict]) -> None:
    """``memory_vs_shortest`` and ``tokens_per_s_vs_shortest`` per (arch, variant)."""
    shortest: dict[tuple[str, str], dict] = {}
    for r in records:                                      # records come by increasing length
        first = shortest.setdefault((r["arch"], r["variant"]), r)
        r["shortest_len"] = first["seq_len"]
        r["tokens_per_s_vs_shortest"] = r["tokens_per_s"] / first["tokens_per_s"]
        r["memory_vs_shortest"] = (r["memory_bytes"] / first["memory_bytes"]
                                   if r["memory_bytes"] and first["memory_bytes"] else None)


INFER_COLUMNS = (
    ("arch", lambda r: r["arch"]), ("variant", lambda r: r["variant"] or "-"),
    ("T", lambda r: str(r["seq_len"])), ("tok/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
    ("x dense", lambda r: fmt(r["ratio_vs_dense"], ".2f")),
    ("tok/s vs shortest", lambda r: f"{r['tokens_per_s_vs_shortest']:.2f}"),
    ("peak memory", lambda r: human_bytes(r["memory_bytes"])),
    ("peak vs shortest", lambda r: fmt(r["memory_vs_shortest"], ".3f")),
    ("rss delta", lambda r: human_bytes(r["rss_peak_bytes"] - r["rss_base_bytes"]
                                        if r.get("rss_peak_bytes") is not None else None)),
    ("state", lambda r: human_bytes(r["state_bytes"])), ("method", lambda r: r["memory_method"]),
)


def _infer_title(records: list[dict]) -> str:
    return (f"ARMT inference sweep (forward, no grad, batch={records[0]['batch']}): ARMT reads "
            "the prompt with stream() (segment by segment), dense with prefill()")


def _infer_footer(records: list[dict]) -> list[str]:
    longest = {(r["arch"], r["variant"]): r for r in records}        # by increasing length
    lines = [f"ARMT {r['variant']}: peak({r['seq_len']}) / peak({r['shortest_len']}) = "
             f"{fmt(r['memory_vs_shortest'], '.3f')} (target <= 1.1); tok/s({r['seq_len']}) / "
             f"tok/s({r['shortest_len']}) = {r['tokens_per_s_vs_shortest']:.2f} (target: flat)"
             for r in longest.values() if r["arch"] == "armt" and r["seq_len"] > r["shortest_len"]]
    notes = sorted({r["note"] for r in records if r.get("note")})
    return [*lines, *notes,
            "peak memory: rss_subprocess = peak RSS of a fresh process incl. the interpreter+torch "
            "baseline (rss delta = growth after import + model build); cuda_max_allocated = CUDA "
            "peak incl. weights. state = what is kept to continue (ARMT: KV of one segment + A, z;"
            " dense: KV cache)."]


def state_bytes(cfg, t: int) -> float:
    """Per wrapped layer: one cache of S + M slots (``2·(S+M)·d``) and A, z (``K·d + K``,
    K = 6·d_mem); unwrapped layers keep the cache only (fp32). Constant in t."""
    wrapped = cfg.n_layer if cfg.memory_layers is None else len(cfg.memory_layers)
    key = 2 * DPFP_NU * cfg.d_mem
    cache = 2 * (cfg.segment_size + cfg.n_mem_tokens) * cfg.d_model
    return 4.0 * (cfg.n_layer * cache + wrapped * (key * cfg.d_model + key))


def lab_start(cfg, trained: dict):
    """ARMT wraps a pretrained model: the lab's trained dense model when there is one."""
    backbone = trained.get(BASELINE)
    if backbone is None:
        return ARMT(cfg)
    settings = {name: getattr(cfg, name) for name in ARMTOptions.field_names()
                if name != "backbone"}
    return ARMT.wrap(backbone, seq_len=cfg.seq_len, **settings)


def flop_saving_of_a_layer_subset() -> float:
    """1 - FLOPs(memory in 20% of the layers) / FLOPs(memory in all), on the follow-up's public
    config (Llama-3.2-1B: d 2048, 16 layers, vocab 128,256; segment 1024, 32 memory tokens,
    d_mem 64); the FLOP model is the kit's."""
    shape = dict(d_model=2048, n_layer=16, n_head=32, seq_len=1024, vocab_size=128256,
                 segment_size=1024, n_mem_tokens=32, d_mem=64)
    every = flops_per_token(ModelConfig("armt", **shape), 1024)
    some = flops_per_token(ModelConfig("armt", **shape, memory_layers=(6, 7, 8)), 1024)
    return 1.0 - some / every


PAPER = "ARMT: Associative Recurrent Memory Transformer (Rodkin, Kuratov, Bulatov, Burtsev)"
CLAIMS = (
    Claim("armt.babilong", PAPER, "2407.04841", "abstract",
          "BABILong QA1 accuracy over 50M tokens", 79.9, "%", "GPT-2 backbone, segment 512, "
          "curriculum to 32 segments", "single-fact QA over 50M tokens", comparable=False,
          note="needs a pretrained LM and 50M-token contexts; the lab's MQAR beyond the "
               "segment, at up to 8x the trained length (the memory-pays table), is the "
               "nearest probe at kit scale"),
    Claim("armt.constant_memory", PAPER, "OpenReview cWVbffpjs7", "follow-up, per the paper "
          "summary (not verified)", "decoding state, longest over shortest length", 1.0,
          "x", "up to 64k tokens", "a constant state (within 10%)",
          kit=lambda r: state_growth(r, "armt"), holds=lambda growth: growth <= 1.1,
          note="kit: the measured decoding state over the lab's lengths"),
    Claim("armt.flop_saving", PAPER, "OpenReview cWVbffpjs7", "follow-up, per the paper "
          "summary (not verified)", "FLOP saving with memory in ~20% of the layers", 30.0,
          "%", "Llama-3.2-1B wrapped", "about 30% fewer FLOPs",
          kit=lambda r: 100 * flop_saving_of_a_layer_subset(), holds=lambda saving: saving >= 25,
          note="the kit's FLOP model on the public 1B config (memory in 3 of 16 layers)"),
)


def memory_slots(cfg, n_pairs: int) -> int:
    """The slot model of the associative memory: each of a segment's M memory tokens writes
    one key-value association, a query reads by its DPFP key, and at most K = 2 nu d_mem
    keys stay apart (independent rows of A); so min(M, K) slots (0 with no memory layer)."""
    if cfg.memory_layers == ():
        return 0
    return min(cfg.n_mem_tokens, 2 * DPFP_NU * cfg.d_mem)


register(Mechanism(
    name="armt", model=ARMT, options=ARMTOptions, flops=flops_per_token,
    state_bytes=state_bytes, claims=CLAIMS,
    lab=LabSpec(start=lab_start, local_span=lambda cfg: cfg.segment_size,
                recall_span=lambda cfg, span: dataclasses.replace(cfg, segment_size=span),
                twin=lambda cfg: dataclasses.replace(cfg, memory_layers=()),
                memory_slots=memory_slots, recall_curriculum=True),
    summary="associative recurrent memory: segments, a per-layer delta-rule memory matrix "
            "carried across them, around a (pretrained) backbone",
    presets={"tiny": {"segment_size": 8}, "fast": {"segment_size": 16},
             "class": {"segment_size": 64}, "gpu": {"segment_size": 256}},
    bench_options=(SEGMENT_SIZE_OPTION, INFER_LEN_OPTION, INFER_DENSE_MAX_OPTION),
    bench_variants=bench_variants,
    trace_keys=("segment*.layer*.read_query", "segment*.layer*.read", "segment*.layer*.write_key",
                "segment*.layer*.write_value", "segment*.layer*.beta", "segment*.layer*.gamma",
                "segment*.layer*.A", "segment*.layer*.z"),
    boundary_fields=("segment_size",),
    special_benches=(SpecialBench("infer", bench_inference, INFER_COLUMNS, _infer_title,
                                  _infer_footer),)))
