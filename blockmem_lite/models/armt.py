"""ARMT: Associative Recurrent Memory Transformer (Rodkin, Kuratov, Bulatov, Burtsev; 2407.04841).

ARMT wraps a pretrained decoder. The sequence is cut into segments of S
tokens; each segment is followed by M learned memory tokens P and run through
the unchanged backbone. Every wrapped layer owns an associative matrix A and a
normaliser z (docs/PAPERS.md, ARMT equations; B batch, n segment length, D width,
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
``models.armt_hf.HFBackbone`` around a Hugging Face Llama model (``backbone="hf"``).

The memory maths (DPFP, READ, WRITE) lives in ``ops/armt_memory.py``, each piece in a
plain form (``dpfp``, ``associative_read``, ``associative_write``, ``novelty``: names of
this module too) and the fused form the layer runs. ``models/armt_reference.py`` writes
the segment loop, READ and WRITE out one equation per line; tests check it equals the
fast forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from blockmem_lite.models.base import LanguageModel, State, build_model, check_tokens
from blockmem_lite.nn import keyed_normal_
from blockmem_lite.ops.armt_memory import (
    DPFP_NU,
    EPS,
    dpfp_roll_index,
    fused_read,
    fused_write,
    signed_dpfp,
)

# the plain forms, names of this module too: notebook 06 teaches them as armt.dpfp, ...
from blockmem_lite.ops.armt_memory import associative_read as associative_read
from blockmem_lite.ops.armt_memory import associative_write as associative_write
from blockmem_lite.ops.armt_memory import dpfp as dpfp
from blockmem_lite.ops.armt_memory import novelty as novelty
from blockmem_lite.registry import Options, knob
from blockmem_lite.trace import is_tracing, record, scope
from blockmem_lite.validation import check_bool, check_int, fail

SUPPORTED_BACKBONES = ("dense", "hf")
BACKBONE_PARTS = ("embed", "blocks", "norm", "head", "cfg", "new_state")

Memory = tuple[torch.Tensor, torch.Tensor] | None   # (A (B, K, D), z (B, K)), None = empty


@dataclass
class ARMTOptions(Options):
    """ARMT's fields: the wrapped backbone, segments, memory tokens and the associative memory."""

    backbone: str = field(default="dense", metadata={
        "help": "arch of the wrapped model when ARMT is built from a config (dense; hf by wrap)"})
    segment_size: int = knob(64, help="S: tokens per segment", symbol="S", sweep=(128, 256),
                             span=True, presets={"tiny": 8, "fast": 16, "class": 64, "gpu": 256})
    n_mem_tokens: int = knob(8, help="M: memory (write) tokens appended to each segment",
                             recall_sweep=(1, 2, 4, 8))          # the slots
    d_mem: int = knob(16, help="associative key width before DPFP (keep <= d_model / 4)",
                      recall_sweep=(1, 2, 16))     # K = 6 d_mem DPFP keys: room for 6 ... 96
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
    module with those two methods (and these parameter names, for ``plugged_in.swap_modules``) can
    stand in for it: notebook 06's capstone plugs in a learner's layer this way.
    """

    def __init__(self, d_model: int, d_mem: int, normalize_phi: bool = True,
                 correction: bool = True, init_std: float = 0.02, eps: float = EPS,
                 key: str = "memory"):
        super().__init__()
        self.normalize_phi = normalize_phi
        self.correction = correction
        self.eps = eps
        self.w_q = nn.Linear(d_model, d_mem, bias=False)
        self.w_k = nn.Linear(d_model, d_mem, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        self.w_beta = nn.Linear(d_model, 1)
        for name in ("w_q", "w_k", "w_beta"):          # ``key``: its name in the model
            keyed_normal_(getattr(self, name).weight, init_std, f"{key}.{name}.weight")
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
        fused = (torch.cat(parts, dim=0), dpfp_roll_index(2 * w.shape[0], DPFP_NU, w.device))
        cache[use] = None if track else (key, fused)
        return fused

    def read_prepared(self, h: torch.Tensor, prepared: PreparedRead) -> torch.Tensor:
        """``read(h, memory)`` from ``prepare_read(memory)``: one matmul for ``[q; -q]``
        (``ops.armt_memory.signed_dpfp``), one with ``[A | z]`` for ``q A`` and ``q . z``
        together (``fused_read``). h (B, T, D) -> (B, T, D)."""
        signed = F.linear(h, prepared.w_signed)                                 # (B, T, 2 d_mem)
        with _no_autocast(h.device.type):
            phi = signed_dpfp(signed, prepared.roll_index, self.normalize_phi,
                              _state_dtype(signed))                             # (B, T, K)
            read = fused_read(phi, prepared.az, self.eps)                       # (B, T, D)
        record("read_query", phi)
        record("read", read)
        return read if read.dtype == h.dtype else read.to(h.dtype)

    def write(self, m: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the memory-token outputs m: (B, M, D); returns the new (A, z).

        ``[k; -k]``, v and the beta logit come from one matmul (``_fused_weights``); the
        write itself is ``ops.armt_memory.fused_write``.
        """
        weight, roll_index = self._fused_weights("write")
        r, d = roll_index.shape[-1], m.shape[-1]
        # contiguous: matmul treats a strided 3-D input differently when the weight needs
        # grad, so prefill (autograd on) and stream (off) would round differently
        k_signed, v, b = F.linear(m.contiguous(), weight).split([r, d, 1], dim=-1)
        b = b + self.w_beta.bias
        with _no_autocast(m.device.type):
            dtype = _state_dtype(m)
            k_phi = signed_dpfp(k_signed, roll_index, self.normalize_phi,
                                _state_dtype(k_signed))                         # (B, M, K)
            beta = torch.sigmoid(b.to(dtype))[..., 0]                           # (B, M)
            A, z = memory if memory is not None else (None, None)
            A, z, gamma = fused_write(A, z, k_phi, v.to(dtype), beta, self.correction,
                                      self.eps, self.normalize_phi)
        for name, value in (("write_key", k_phi), ("write_value", v), ("beta", beta),
                            ("gamma", gamma), ("A", A), ("z", z)):
            record(name, value)
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


def backbone_name(backbone: nn.Module) -> str:
    """The arch a backbone reports: ``backbone_arch`` (``HFBackbone``: "hf"), else its cfg's."""
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
    arch = backbone_name(backbone)
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

    trace_keys = ("segment*.layer*.read_query", "segment*.layer*.read",
                  "segment*.layer*.write_key", "segment*.layer*.write_value",
                  "segment*.layer*.beta", "segment*.layer*.gamma", "segment*.layer*.A",
                  "segment*.layer*.z")

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
        self.memory_tokens = nn.Parameter(torch.empty(                           # P: (M, D)
            cfg.n_mem_tokens, cfg.d_model, device=embedding.device, dtype=embedding.dtype))
        scale = embedding.std().item() if not embedding.is_meta else 1.0
        keyed_normal_(self.memory_tokens, scale, "memory_tokens")   # the embeddings' scale
        wrapped = range(cfg.n_layer) if cfg.memory_layers is None else sorted(cfg.memory_layers)
        self.memory = nn.ModuleDict({
            str(i): AssociativeMemoryLayer(cfg.d_model, cfg.d_mem, cfg.normalize_phi,
                                           cfg.correction, cfg.init_std, key=f"memory.{i}")
            for i in wrapped}).to(embedding)

    # --- construction ----------------------------------------------------------------------
    @classmethod
    def wrap(cls, backbone: nn.Module, **settings) -> ARMT:
        """Wrap ``backbone`` (weights kept). ``settings``: ModelConfig fields, e.g.
        segment_size, n_mem_tokens, d_mem, normalize_phi, correction, memory_layers,
        detach_every, grad_checkpoint, seq_len; unset ones keep the backbone config's
        values (for ARMT fields: the ModelConfig defaults)."""
        check_backbone(backbone)
        cfg = dataclasses.replace(backbone.cfg, arch="armt", backbone=backbone_name(backbone),
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
        """The same maths in the other loop order (docs/PAPERS.md, ARMT paper vs kit): layer
        by layer, each layer running every segment in turn with its own memory. tokens (B, T) ->
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
