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
   (stop-gradient), ``A += sum_i beta_i k_i (v_i - v_bar_i)^T``,
   ``z += sum_i gamma_i k_i``. The first write (empty memory) uses v_bar = 0, gamma = 1.

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
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from blockmem_lite.config import ModelConfig, _fail, check_int
from blockmem_lite.masks import causal_mask
from blockmem_lite.models.base import LanguageModel, State, build_model, check_tokens, register
from blockmem_lite.trace import record, scope

EPS = 1e-5                     # the eps of the read / write denominators (paper code)
DPFP_NU = 3                    # DPFP order: key width 2 * nu * d_mem
SUPPORTED_BACKBONES = ("dense", "hf")
BACKBONE_PARTS = ("embed", "blocks", "norm", "head", "cfg", "new_state")

Memory = tuple[torch.Tensor, torch.Tensor] | None   # (A (B, K, D), z (B, K)), None = empty


def validate_config(cfg) -> None:
    """ARMT fields of a ModelConfig (called by ``ModelConfig.validate`` for arch="armt")."""
    if cfg.backbone not in SUPPORTED_BACKBONES:
        _fail("backbone", cfg.backbone,
              f"ARMT wraps one of {', '.join(SUPPORTED_BACKBONES)} (the kit's DenseLM, or "
              "HFBackbone around a Hugging Face Llama model)")
    check_int("segment_size", cfg.segment_size, 1)
    if cfg.segment_size > cfg.seq_len:
        _fail("segment_size", cfg.segment_size,
              f"must be between 1 and seq_len={cfg.seq_len} (the training context)")
    if isinstance(cfg.n_mem_tokens, bool) or not isinstance(cfg.n_mem_tokens, int) \
            or cfg.n_mem_tokens < 1:
        _fail("n_mem_tokens", cfg.n_mem_tokens,
              "expected an integer >= 1 (ARMT writes its memory through the memory tokens)")
    check_int("d_mem", cfg.d_mem, 1)
    check_int("detach_every", cfg.detach_every, 0)
    if cfg.detach_every == 1:
        _fail("detach_every", 1, "expected 0 (full BPTT) or >= 2: detaching the memory before "
              "every segment cuts every gradient to the memory, so it would never learn")
    for name in ("normalize_phi", "correction", "grad_checkpoint"):
        if not isinstance(getattr(cfg, name), bool):
            _fail(name, getattr(cfg, name), "expected True or False")
    layers = cfg.memory_layers
    if layers is not None:
        if not isinstance(layers, tuple):
            _fail("memory_layers", layers, "expected None (all layers) or a tuple of layer "
                  "indices, () for none (the segmented backbone without memory)")
        in_range = all(not isinstance(i, bool) and isinstance(i, int) and 0 <= i < cfg.n_layer
                       for i in layers)
        if not in_range or len(set(layers)) != len(layers):
            _fail("memory_layers", layers,
                  f"expected None (all layers) or unique layer indices in 0..{cfg.n_layer - 1} "
                  f"(n_layer={cfg.n_layer})")


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


def novelty(k_phi: torch.Tensor, z: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """gamma = clip(1 - (k . z + eps) / |k|^2, 0, 1) under stop-gradient. (B, M, K) -> (B, M).

    0 for a key already fully counted in z, 1 for a key orthogonal to every
    stored one; z only grows along new directions.
    """
    seen = torch.einsum("bmk,bk->bm", k_phi, z) + eps
    return (1 - seen / k_phi.pow(2).sum(-1)).clamp(0, 1).detach()


def associative_write(A: torch.Tensor | None, z: torch.Tensor | None, k_phi: torch.Tensor,
                      v: torch.Tensor, beta: torch.Tensor, correction: bool = True,
                      eps: float = EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Write M (key, value) pairs in parallel; returns the new (A, z).

    k_phi: (B, M, K), v: (B, M, D), beta: (B, M) write strengths. A, z = None
    means an empty memory (the first segment): v_bar = 0 and gamma = 1. Both
    v_bar and gamma come from the OLD (A, z).
    """
    A_new, z_new, _ = _write(A, z, k_phi, v, beta, correction, eps)
    return A_new, z_new


def _write(A, z, k_phi, v, beta, correction, eps):
    """``associative_write`` that also returns gamma (B, M) for the trace."""
    if A is None:
        v_bar = torch.zeros_like(v)
        gamma = torch.ones_like(k_phi[..., 0])
    else:
        v_bar = associative_read(k_phi, A, z, eps)                           # (B, M, D)
        gamma = novelty(k_phi, z, eps) if correction else torch.ones_like(k_phi[..., 0])
    update = torch.einsum("bmk,bmd->bkd", k_phi, beta[..., None] * (v - v_bar))  # (B, K, D)
    grow = torch.einsum("bmk,bm->bk", k_phi, gamma)                              # (B, K)
    if A is None:
        return update, grow, gamma
    return A + update, z + grow, gamma


# --- one wrapped layer -------------------------------------------------------------------

def _state_dtype(x: torch.Tensor) -> torch.dtype:
    """A and z live in fp32, or fp64 for fp64 models (never bf16)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class AssociativeMemoryLayer(nn.Module):
    """The associative memory of one wrapped layer: W_Q, W_K (d -> d_mem), W_V (d -> d), w_beta."""

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

    def features(self, u: torch.Tensor) -> torch.Tensor:
        return dpfp(u.to(_state_dtype(u)), DPFP_NU, self.normalize_phi)

    def read(self, h: torch.Tensor, memory: Memory) -> torch.Tensor:
        """What the memory adds to the layer input h: (B, T, D) -> (B, T, D)."""
        A, z = memory
        q = self.w_q(h)
        with torch.autocast(h.device.type, enabled=False):
            q_phi = self.features(q)                                            # (B, T, K)
            r = associative_read(q_phi, A, z, self.eps)
        record("read_query", q_phi)
        record("read", r)
        return r.to(h.dtype)

    def write(self, m: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the memory-token outputs m: (B, M, D); returns the new (A, z)."""
        k, v, b = self.w_k(m), self.w_v(m), self.w_beta(m)
        with torch.autocast(m.device.type, enabled=False):
            dtype = _state_dtype(m)
            k_phi = self.features(k)                                            # (B, M, K)
            beta = torch.sigmoid(b.to(dtype))[..., 0]                           # (B, M)
            A, z = memory if memory is not None else (None, None)
            A, z, gamma = _write(A, z, k_phi, v.to(dtype), beta, self.correction, self.eps)
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


@register("armt")
class ARMT(LanguageModel):
    """A backbone LM wrapped with ARMT's segment loop and per-layer associative memory.

    Three ways to get one:

    * ``build_model(ModelConfig(arch="armt", ...))``: a fresh dense backbone from
      the config, wrapped;
    * ``ARMT.wrap(backbone, segment_size=..., ...)``: wrap an existing (pretrained)
      model, its weights kept;
    * ``ARMT.wrap_checkpoint(path, ...)``: wrap the model of a Trainer checkpoint.
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
                        dtype=embedding.dtype) * embedding.float().std().item())
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

    @classmethod
    def wrap_checkpoint(cls, path, **settings) -> ARMT:
        """Wrap the (dense) model stored in a Trainer checkpoint at ``path``."""
        from blockmem_lite.train import load_checkpoint_file

        ckpt = load_checkpoint_file(path)
        run = ckpt.get("run_config")
        if run is None:
            raise ValueError(f"checkpoint {path} stores no run config, so its model cannot be "
                             "rebuilt: build the backbone yourself, load_state_dict, then "
                             "ARMT.wrap(backbone)")
        model_cfg = ModelConfig(**run["model"])
        if model_cfg.arch not in SUPPORTED_BACKBONES:
            raise ValueError(f"checkpoint {path} holds arch={model_cfg.arch!r}, which is not "
                             f"allowed as a backbone: expected {', '.join(SUPPORTED_BACKBONES)} "
                             "(an ARMT checkpoint resumes with Trainer.from_checkpoint)")
        backbone = build_model(model_cfg)
        backbone.load_state_dict(ckpt["model"])
        return cls.wrap(backbone, **settings)

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
        reads it). Memory is per call: nothing leaks between batches.
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
                logits, memory = checkpoint(self._segment, segment, memory, write, s,
                                            use_reentrant=False)
            else:
                logits, memory = self._segment(segment, memory, write, s)
            pieces.append(logits)
        return torch.cat(pieces, dim=1), memory

    def _segment(self, tokens: torch.Tensor, memory: list[Memory], write: bool, index: int):
        """One segment [x_s ; P]: READ, block, WRITE per layer. Returns (logits (B, n, V), memory)."""
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
        return self.backbone.head(self.backbone.norm(x[:, :n])), memory

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
        return torch.cat([self.backbone.head(self.backbone.norm(x[:, :seg.shape[1]]))
                          for x, seg in zip(xs, segments, strict=True)], dim=1)

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
            logits, state.memory = self._segment(tokens[:, start:start + size], state.memory,
                                                 True, index)
            last = logits[:, -1]                                                 # (B, V)
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

        When the segment is full, P runs through the same caches to write, and
        the caches start a fresh segment.
        """
        index = state.position // self.segment_size
        x = self._cached_pass(self.backbone.embed(tokens), state, index, write=False)
        state.position += tokens.shape[1]
        if state.caches[0].length == self.segment_size:
            memory_tokens = self.memory_tokens.expand(tokens.shape[0], -1, -1).to(x.dtype)
            self._cached_pass(memory_tokens, state, index, write=True)
            for cache in state.caches:
                cache.reset()
        return self.backbone.head(self.backbone.norm(x))

    def _cached_pass(self, x: torch.Tensor, state: ARMTState, index: int,
                     write: bool) -> torch.Tensor:
        """x (B, r, D) after the cached part of segment ``index``; reads, and writes if asked."""
        start = state.caches[0].length
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        with scope(f"segment{index}"):
            for i, block in enumerate(self.backbone.blocks):
                with scope(f"layer{i}"):
                    layer = self.memory_layer(i)
                    if layer is not None and state.memory[i] is not None:
                        x = x + layer.read(x, state.memory[i])
                    x = block(x, positions, state.caches[i])
                    if layer is not None and write:
                        state.memory[i] = layer.write(x, state.memory[i])
        return x


def _build_backbone(cfg) -> nn.Module:
    if cfg.backbone == "hf":
        raise ValueError("backbone='hf' is not allowed when building from a config: a Hugging "
                         "Face model cannot be rebuilt from a ModelConfig; load it and use "
                         "ARMT.wrap(HFBackbone(hf_model), ...) (or pass model= to "
                         "Trainer.from_checkpoint)")
    return build_model(dataclasses.replace(cfg, arch=cfg.backbone))


# --- Hugging Face adapter (optional: the ``hf`` extra) ------------------------------------

class _HFCacheView:
    """The one Cache method an HF Llama attention calls, backed by a kit ``nn.KVCache``."""

    def __init__(self, cache):
        self.cache = cache

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.cache.append(key_states, value_states)


class _HFBlock(nn.Module):
    """An HF decoder layer callable as ``block(x, positions, cache)`` like a kit Block."""

    def __init__(self, layer: nn.Module, rotary: nn.Module):
        super().__init__()
        self.layer = layer
        self.rotary = rotary

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
        past = _HFCacheView(cache) if cache is not None else None
        out = self.layer(x, attention_mask=mask, position_ids=position_ids,
                         past_key_values=past, position_embeddings=cos_sin)
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
        from blockmem_lite.models.dense import DenseState
        from blockmem_lite.nn import KVCache

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


# --- curriculum --------------------------------------------------------------------------

def train_curriculum(model: nn.Module, stages: Sequence[int] = (2, 4, 8), *,
                     make_data: Callable[[int], tuple], train_cfg,
                     steps_per_stage: int | Sequence[int], callbacks=(),
                     checkpoint_dir: str | Path | None = None) -> list:
    """Train on growing numbers of segments, each stage starting from the last one's weights.

    ``make_data(n_segments) -> (train_data, val_data)`` (val may be None) builds a
    stage's data, e.g. sequences of n_segments * segment_size tokens.
    ``train_cfg``: a TrainConfig (or RunConfig) whose steps / checkpoint_dir are
    replaced per stage.
    ``steps_per_stage``: one count for all stages or one per stage. Each stage
    gets a fresh optimiser and LR schedule (a new ``train.Trainer``); with
    ``checkpoint_dir`` stage k is saved to ``<dir>/stage{k}_{n}seg/checkpoint.pt``.
    An interrupted stage ends the curriculum. Returns one History per stage run.
    """
    from blockmem_lite.train import Trainer

    train_cfg = getattr(train_cfg, "train", train_cfg)          # a RunConfig's TrainConfig
    stages = list(stages)
    if not stages or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in stages):
        raise ValueError(f"stages={stages!r} is not allowed: expected a non-empty list of "
                         "segment counts >= 1, e.g. (2, 4, 8)")
    steps = [steps_per_stage] * len(stages) if isinstance(steps_per_stage, int) \
        else list(steps_per_stage)
    if len(steps) != len(stages) or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                        for s in steps):
        raise ValueError(f"steps_per_stage={steps_per_stage!r} is not allowed: expected an "
                         f"integer >= 1 or one per stage ({len(stages)} stages)")
    if not callable(make_data):
        raise ValueError(f"make_data={make_data!r} is not allowed: expected a function "
                         "n_segments -> (train_data, val_data)")
    histories = []
    for k, (n_segments, n_steps) in enumerate(zip(stages, steps, strict=True)):
        folder = (str(Path(checkpoint_dir) / f"stage{k}_{n_segments}seg")
                  if checkpoint_dir is not None else None)
        cfg = dataclasses.replace(train_cfg, steps=n_steps, checkpoint_dir=folder)
        train_data, val_data = make_data(n_segments)
        history = Trainer(model, cfg, train_data, val_data, callbacks).fit(n_steps)
        histories.append(history)
        if history.interrupted:
            break
    return histories
