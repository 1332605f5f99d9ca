"""MoC: Mixture of Chapters (Tibrewal, Saha, Meda, Singh, Moturi; arXiv 2603.21096).

A learned memory bank of ``n_chapters x chapter_len`` latent tokens, shared by
a few memory layers. Each memory layer routes to the shared chapter 0 plus
``top_k`` chapters and reads them with one cross-attention (docs/PAPERS.md, MoC
equations):

* memory block (variant A): ``h = x + Attn(norm(x))``;
  ``h = h + MemRead(norm_m(h))``; ``y = h + MLP(norm(h))``;
* router: ``p = softmax(W_r r + b_r)`` over all C chapters, r a mean of the
  residual stream *entering* the block;
* weights: top-k of the routable probabilities renormalised to ŵ; shared
  weight 1, routed ``routed_scale * ŵ``; all divided by ``1 + routed_scale``
  (shared 1/3.5, routed 2.5/3.5 in total);
* read: gather the k+1 chapters, RMS-normalise each token (no gain), scale by
  its chapter weight (so the weight scales both K and V), then
  ``softmax(Q Kᵀ / sqrt(hd)) V`` over all gathered tokens at once (no RoPE,
  not causal over memory), ``h += O W_O``.

From the paper and its code: the shared bank N(0, 0.02); chapter 0 always
read; per-layer router (W_r ~ N(0, 0.02), b_r = 0) and W_Q / W_K / W_V / W_O;
W_O zero-initialised (so a fresh MoC computes exactly its backbone); the
weighting above; no gradient through the top-k choice (the router learns from
the weights and the auxiliary losses); load balance
``L_lb = C · Σ_i f_i P_i`` and z-loss ``L_z = mean (logsumexp logits)²``
(coefficients 0.01 and 0.001) averaged over the memory layers and added to the
loss; memory layers every 4th from layer 2 (2, 6, 10, 14 of 16); higher
learning rates for the bank and memory layers; sequence-level routing from
the mean over the *whole* sequence (``routing="sequence"``), which looks ahead.

**[our design choice]** where the paper is silent or the kit needs a rule:

* ``routing="block_causal"`` (default): windows of ``routing_window`` (R)
  tokens; window w is routed from the mean of the states of all tokens before
  it (window 0 from a learned start vector ``route_start``), so the model is
  causal and the decoding state is a running sum. ``"sequence"`` is kept for
  the look-ahead lesson (tests assert the leak);
* aux losses over every routing decision (batch x windows); C in L_lb and L_z
  is the total number of chapters, shared included (p is a softmax over all
  C; the shared chapter is never in the top-k set, so f_0 = 0). A uniform
  router gives L_lb = k and L_z = (ln C)². Faithful to the paper, and a
  loophole worth knowing: probability parked on the shared chapter lowers
  L_lb without balancing anything (notebook 08 shows it happen);
* ``memory_layers=None``: layers i with i % 4 == 2 (the paper's pattern), or the
  middle layer ``n_layer // 2`` when there is none (n_layer < 3);
* ``memory_lr_scale`` applies to the memory parts of memory layers (router,
  start vector, memory norm, W_Q / W_KV / W_O), not to their attention or MLP;
* generation with ``routing="sequence"``: the route comes from the prompt
  (prefill) and stays fixed, since the full-sequence mean does not exist yet;
* two ways to build the memory keys/values, equal up to rounding: gather the
  chapters then project (``"gather"``, cost independent of the bank size), or
  project the whole bank once then gather (``"project"``, cheaper when the
  batch gathers more rows than the bank holds); ``"auto"`` picks the cheaper;
* no padding mask in the routing mean (the kit trains on full windows).

With ``top_k = 1`` the renormalised ŵ is always 1, so the router then learns
from the auxiliary losses only.

``reference_forward(model, tokens)`` writes the routing, gather, normalise,
weight and joint-softmax read out one equation per line; tests check that it
equals the fast forward. The FLOP model, the bank-size bench and memory-read
timing, the claims and the registration of ``moc`` are in ``mechanisms/moc.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from blockmem_lite.models.base import check_tokens
from blockmem_lite.models.dense import DenseLM, DenseState
from blockmem_lite.nn import Block, KVCache, RMSNorm, attention, keyed_normal_, reference_attention
from blockmem_lite.registry import Options, knob
from blockmem_lite.trace import is_tracing, record, scope
from blockmem_lite.validation import check_bool, check_choice, check_float, check_int, fail

ROUTING_MODES = ("block_causal", "sequence")
KV_STRATEGIES = ("auto", "gather", "project")
MEMORY_PARTS = ("norm_m.", "router.", "route_start", "memory.")   # memory-layer lr group


# --- config ------------------------------------------------------------------------------

def default_memory_layers(n_layer: int) -> tuple[int, ...]:
    """Layers i with i % 4 == 2 (paper: 2, 6, 10, 14 of 16), else the middle layer."""
    layers = tuple(i for i in range(n_layer) if i % 4 == 2)
    return layers or (n_layer // 2,)


def memory_layers(cfg) -> tuple[int, ...]:
    """The memory layers of ``cfg``: its ``memory_layers`` or the default, sorted."""
    chosen = cfg.memory_layers if cfg.memory_layers is not None \
        else default_memory_layers(cfg.n_layer)
    return tuple(sorted(chosen))


@dataclass
class MoCOptions(Options):
    """MoC's fields: the bank (chapters x tokens), routing, auxiliary losses, learning rates."""

    n_chapters: int = knob(17, help="chapters in the bank; chapter 0 is always read (shared)",
                           presets={"class": 257, "gpu": 4097})
    chapter_len: int = knob(8, help="latent tokens per chapter", presets={"class": 16, "gpu": 64})
    top_k: int = knob(2, help="routed chapters read per routing decision", symbol="k",
                      sweep=(8,), presets={"class": 8, "gpu": 64})
    routing: str = field(default="block_causal", metadata={
        "help": "block_causal (causal, default) or sequence (the paper's; looks ahead)"})
    routing_window: int = knob(32, help="R: tokens per routing window (block_causal)",
                               boundary=True, presets={"tiny": 8, "fast": 16, "gpu": 128})
    routed_scale: float = field(default=2.5, metadata={
        "help": "routed_scaling_factor of the chapter weights"})
    lb_coef: float = field(default=0.01, metadata={"help": "load-balance loss coefficient"})
    z_coef: float = field(default=0.001, metadata={"help": "router z-loss coefficient"})
    freeze_bank: bool = field(default=False, metadata={
        "help": "keep the bank fixed (fine-tuning experiments)"})
    bank_lr_scale: float = field(default=2.0, metadata={
        "help": "bank lr = lr x this (the paper: 6e-4 vs 3e-4)"})
    memory_lr_scale: float = field(default=2.0, metadata={
        "help": "memory-layer lr = lr x this (the paper: 6e-4 vs 3e-4)"})
    memory_layers: tuple | None = field(default=None, metadata={
        "help": "layers with a memory read (None: every 4th from layer 2, or the middle one)"})

    def validate(self, cfg) -> None:
        check_choice("routing", self.routing, ROUTING_MODES)
        check_int("n_chapters", self.n_chapters, 2)
        check_int("chapter_len", self.chapter_len, 1)
        check_int("top_k", self.top_k, 1)
        if self.top_k > self.n_chapters - 1:
            fail("top_k", self.top_k, f"expected 1 <= top_k <= n_chapters - 1 = "
                                      f"{self.n_chapters - 1} (the routable chapters; chapter 0 "
                                      "is the shared one)")
        check_int("routing_window", self.routing_window, 1)
        for name in ("routed_scale", "lb_coef", "z_coef", "bank_lr_scale", "memory_lr_scale"):
            check_float(name, getattr(self, name), 0.0)
        check_bool("freeze_bank", self.freeze_bank)
        layers = self.memory_layers
        if layers is None:
            return
        valid = (isinstance(layers, tuple) and layers and len(set(layers)) == len(layers)
                 and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < cfg.n_layer
                         for i in layers))
        if not valid:
            fail("memory_layers", layers,
                 f"expected None (default {default_memory_layers(cfg.n_layer)}) or a non-empty "
                 f"tuple of distinct layer indices in [0, {cfg.n_layer - 1}] "
                 f"(n_layer={cfg.n_layer})")


# --- the routing and memory maths as pure functions (tests and notebooks use them) ---------

def chapter_weights(probs: torch.Tensor, top_k: int,
                    routed_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Selected chapters and their combined weights, shared chapter first.

    probs: (..., C) router probabilities over all chapters (chapter 0 shared).
    Returns ids (..., k+1) = [0, top-k routable chapters by falling probability]
    and weights (..., k+1) = [1, routed_scale * ŵ] / (1 + routed_scale), where ŵ
    are the top-k probabilities renormalised to sum to 1. The top-k choice
    carries no gradient; ŵ does.
    """
    top_p, top_i = probs[..., 1:].topk(top_k, dim=-1)                  # (..., k)
    routed = routed_scale * top_p / top_p.sum(dim=-1, keepdim=True)
    shared = torch.ones_like(top_p[..., :1])
    weights = torch.cat([shared, routed], dim=-1) / (1.0 + routed_scale)
    ids = torch.cat([torch.zeros_like(top_i[..., :1]), top_i + 1], dim=-1)
    return ids, weights


def gather_chapters(bank: torch.Tensor, chapter_ids: torch.Tensor,
                    chapter_len: int) -> torch.Tensor:
    """Rows of the chapters ``chapter_ids`` (..., n), in order: (..., n * chapter_len, D).

    Chapter c is bank rows c * chapter_len ... c * chapter_len + chapter_len - 1.
    """
    table = bank.view(-1, chapter_len, bank.shape[-1])                   # (C, L, D)
    # index_select, not table[chapter_ids]: its backward sums repeated rows in a fixed
    # order, so multi-threaded CPU training is reproducible (advanced indexing is not)
    chapters = torch.index_select(table, 0, chapter_ids.reshape(-1))
    return chapters.view(*chapter_ids.shape[:-1], -1, bank.shape[-1])   # (..., n*L, D)


def token_weights(weights: torch.Tensor, chapter_len: int) -> torch.Tensor:
    """Chapter weights (..., n) -> one weight per gathered token (..., n * L, 1)."""
    return weights.repeat_interleave(chapter_len, dim=-1)[..., None]


def load_balance_loss(probs: torch.Tensor, routed_ids: torch.Tensor) -> torch.Tensor:
    """Switch-style ``C · Σ_i f_i P_i`` over all routing decisions.

    probs: (..., C) over all chapters; routed_ids: (..., k) the top-k chosen
    chapters. f_i = fraction of decisions whose top-k holds i (Σ f = k),
    P_i = mean probability of i. A uniform router gives exactly k.
    """
    n_chapters = probs.shape[-1]
    probs = probs.reshape(-1, n_chapters)                               # (N, C)
    routed_ids = routed_ids.reshape(probs.shape[0], -1)                 # (N, k)
    counts = torch.zeros(n_chapters, dtype=probs.dtype, device=probs.device)
    counts.scatter_add_(0, routed_ids.flatten(), torch.ones_like(routed_ids.flatten(),
                                                                 dtype=probs.dtype))
    fraction = counts / probs.shape[0]                                  # f: (C,)
    return n_chapters * (fraction * probs.mean(dim=0)).sum()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Router z-loss ``mean (logsumexp_i logits_i)²`` over all decisions. logits: (..., C)."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def prefix_means(hidden: torch.Tensor, window: int) -> torch.Tensor:
    """Mean of the states before each window: (B, T, D) -> (B, W, D), W = ceil(T / R).

    Row w averages tokens 0 .. wR-1; row 0 (nothing before it) is zeros, the
    caller puts the learned start vector there.
    """
    b, t, d = hidden.shape
    n_windows = -(-t // window)
    padded = F.pad(hidden, (0, 0, 0, n_windows * window - t))          # (B, W*R, D)
    window_sums = padded.view(b, n_windows, window, d).sum(dim=2)        # (B, W, D)
    # exclusive prefix, summed from earlier windows only (cumsum - own sum would carry
    # rounding from the window's own, later tokens: a tiny causality leak)
    before = F.pad(torch.cumsum(window_sums, dim=1)[:, :-1], (0, 0, 1, 0))
    counts = torch.arange(n_windows, device=hidden.device, dtype=hidden.dtype) * window
    return before / counts.clamp(min=1)[:, None]


# --- the memory read ------------------------------------------------------------------------

@dataclass
class Routing:
    """One memory layer's routing decisions, one per (sequence, window)."""

    logits: torch.Tensor        # (B, W, C)
    probs: torch.Tensor         # (B, W, C)
    chapter_ids: torch.Tensor   # (B, W, k+1), shared chapter 0 first
    weights: torch.Tensor       # (B, W, k+1), sum to 1


class MemoryRead(nn.Module):
    """Cross-attention from the tokens to their routed chapters (W_Q, W_K|W_V, W_O)."""

    def __init__(self, dim: int, n_head: int, chapter_len: int, norm_eps: float,
                 dropout: float = 0.0):
        super().__init__()
        self.n_head = n_head
        self.head_dim = dim // n_head
        self.chapter_len = chapter_len
        self.dropout = dropout
        self.unit_norm = RMSNorm(dim, norm_eps, learnable=False)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(N, S, D) -> (N, H, S, hd)."""
        n, s, _ = x.shape
        return x.view(n, s, self.n_head, self.head_dim).transpose(1, 2)

    def keys_values(self, bank: torch.Tensor, chapter_ids: torch.Tensor, weights: torch.Tensor,
                    strategy: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of the weighted chapters: ids, weights (N, k+1) -> (N, H, M, hd) each.

        ``"gather"``: gather, normalise, weight, project (cost ∝ N·M rows);
        ``"project"``: normalise and project the whole bank, then gather and
        weight (cost ∝ bank rows); ``"auto"``: whichever projects fewer rows.
        """
        if strategy not in KV_STRATEGIES:
            raise ValueError(f"strategy={strategy!r} is not allowed: expected one of "
                             f"{', '.join(KV_STRATEGIES)}")
        if strategy == "auto":
            gathered_rows = chapter_ids.numel() * self.chapter_len
            strategy = "project" if gathered_rows > bank.shape[0] else "gather"
        w = token_weights(weights, self.chapter_len)                        # (N, M, 1)
        if strategy == "gather":
            memory = self.unit_norm(gather_chapters(bank, chapter_ids, self.chapter_len))
            kv = self.kv(memory * w.to(memory.dtype))                        # (N, M, 2D)
        else:
            projected = self.kv(self.unit_norm(bank))                         # (bank, 2D)
            kv = gather_chapters(projected, chapter_ids, self.chapter_len) * w.to(projected.dtype)
        k, v = kv.chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def attend(self, queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               reference: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """queries (N, S, D) normalised states; k, v (N, H, M, hd) -> (N, S, D) and weights.

        The weights (N, H, S, M) are returned only on the reference path.
        """
        q = self._heads(self.q(queries))                                    # (N, H, S, hd)
        if reference:
            y, attn = reference_attention(q, k, v)
        else:
            p = self.dropout if self.training else 0.0
            y, attn = attention(q, k, v, dropout_p=p), None
        n, h, s, hd = y.shape
        return self.out(y.transpose(1, 2).reshape(n, s, h * hd)), attn

    def forward(self, queries: torch.Tensor, bank: torch.Tensor, chapter_ids: torch.Tensor,
                weights: torch.Tensor, window: int, strategy: str = "auto",
                reference: bool = False):
        """Each window's tokens read its chapters; the windows are the batch of one SDPA.

        queries: (B, T, D) normalised states; chapter_ids, weights: (B, W, k+1)
        with W = ceil(T / window). Returns (out (B, T, D), k, v (B*W, H, M, hd),
        attention weights (B*W, H, window, M) on the reference path, else None).
        """
        b, t, d = queries.shape
        n_windows = chapter_ids.shape[1]
        k, v = self.keys_values(bank, chapter_ids.flatten(0, 1), weights.flatten(0, 1), strategy)
        padded = F.pad(queries, (0, 0, 0, n_windows * window - t))           # (B, W*R, D)
        out, attn = self.attend(padded.reshape(b * n_windows, window, d), k, v, reference)
        return out.reshape(b, n_windows * window, d)[:, :t], k, v, attn

    def read_whole_bank(self, queries: torch.Tensor, bank: torch.Tensor) -> torch.Tensor:
        """What routing avoids: every query attends to every bank token. (B, S, D) -> (B, S, D)."""
        k, v = self.kv(self.unit_norm(bank)).chunk(2, dim=-1)              # (bank, D) each
        b = queries.shape[0]
        k, v = (self._heads(z[None]).expand(b, -1, -1, -1) for z in (k, v))
        return self.attend(queries, k, v)[0]


# --- one memory layer -----------------------------------------------------------------------

class MoCLayerState:
    """Decoding state of one memory layer: the running sum and the current route."""

    def __init__(self, batch: int, dim: int, n_read: int, device, dtype):
        zeros = dict(device=device, dtype=dtype)
        self.prefix_sum = torch.zeros(batch, dim, **zeros)                  # Σ states so far
        self.chapter_ids = torch.zeros(batch, n_read, dtype=torch.long, device=device)
        self.weights = torch.zeros(batch, n_read, **zeros)
        self.keys: torch.Tensor | None = None                                # (B, H, M, hd)
        self.values: torch.Tensor | None = None

    def set_route(self, chapter_ids: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor) -> None:
        """Hold the current route; copies, so no larger (e.g. all-window) storage stays alive."""
        self.chapter_ids, self.weights, self.keys, self.values = (
            z.clone() for z in (chapter_ids, weights, keys, values))

    def tensors(self) -> list[torch.Tensor]:
        extra = [self.keys, self.values] if self.keys is not None else []
        return [self.prefix_sum, self.chapter_ids, self.weights, *extra]


def _wide(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 (router softmax and losses); fp32/fp64 unchanged."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class MoCBlock(Block):
    """Block variant A: attention, then the routed memory read, then the MLP."""

    def __init__(self, cfg):
        super().__init__(cfg.d_model, cfg.n_head, cfg.mlp_ratio, cfg.rope_base, cfg.norm_eps,
                         cfg.dropout)
        self.routing = cfg.routing
        self.window = cfg.routing_window
        self.top_k = cfg.top_k
        self.routed_scale = cfg.routed_scale
        self.norm_m = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.router = nn.Linear(cfg.d_model, cfg.n_chapters)                 # W_r, b_r
        self.route_start = nn.Parameter(torch.zeros(cfg.d_model))           # window 0's input
        self.memory = MemoryRead(cfg.d_model, cfg.n_head, cfg.chapter_len, cfg.norm_eps,
                                 cfg.dropout)

    def route(self, inputs: torch.Tensor) -> Routing:
        """Router inputs (B, W, D) -> one routing decision per (sequence, window)."""
        logits = _wide(self.router(inputs))                                 # (B, W, C)
        probs = logits.softmax(dim=-1)
        ids, weights = chapter_weights(probs, self.top_k, self.routed_scale)
        return Routing(logits, probs, ids, weights)

    def router_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The state means the windows are routed from: (B, W, D), and the window length."""
        if self.routing == "sequence":
            return x.mean(dim=1, keepdim=True), x.shape[1]                  # looks ahead
        means = prefix_means(x, self.window)
        start = self.route_start.to(x.dtype).expand(x.shape[0], 1, -1)
        return torch.cat([start, means[:, 1:]], dim=1), self.window

    # parallel (training) form ------------------------------------------------------------
    def forward(self, x: torch.Tensor, positions: torch.Tensor, bank: torch.Tensor,
                cache: KVCache | None = None, reference: bool = False,
                layer_state: MoCLayerState | None = None) -> tuple[torch.Tensor, Routing]:
        """x: (B, T, D) -> (B, T, D) and the routing; ``layer_state`` (prefill) is filled."""
        inputs, window = self.router_inputs(x)
        routing = self.route(inputs)
        h = x + self.drop(self.attn(self.norm1(x), positions, cache, reference))
        h = h + self.drop(self.read(self.norm_m(h), bank, routing, window, reference,
                                    layer_state))
        if layer_state is not None:
            layer_state.prefix_sum.copy_(x.sum(dim=1))
        return h + self.drop(self.mlp(self.norm2(h))), routing

    def read(self, queries: torch.Tensor, bank: torch.Tensor, routing: Routing, window: int,
             reference: bool = False, layer_state: MoCLayerState | None = None) -> torch.Tensor:
        """The memory read of the routed windows. queries: (B, T, D) normalised -> (B, T, D)."""
        need_weights = reference or is_tracing("chapter_attention")
        out, k, v, attn = self.memory(queries, bank, routing.chapter_ids, routing.weights, window,
                                      reference=need_weights)
        if is_tracing():
            self._record_routing(routing, attn, queries.shape[1])
        if layer_state is not None:          # prefill: keep the last window's route
            b, n_windows = routing.chapter_ids.shape[:2]
            last = [z.unflatten(0, (b, n_windows))[:, -1] for z in (k, v)]
            layer_state.set_route(routing.chapter_ids[:, -1], routing.weights[:, -1], *last)
        return out

    def _record_routing(self, routing: Routing, attn: torch.Tensor | None, seq_len: int) -> None:
        """Trace: router probabilities, chapters, weights, attention mass per chapter."""
        record("router_probs", routing.probs)
        record("chapters", routing.chapter_ids)
        record("chapter_weights", routing.weights)
        if attn is None:
            return
        n, h, s, m = attn.shape
        n_read = routing.chapter_ids.shape[-1]
        mass = attn.view(n, h, s, n_read, m // n_read).sum(-1).mean(1)     # (B*W, S, k+1)
        batch = routing.chapter_ids.shape[0]
        record("chapter_attention", mass.reshape(batch, -1, n_read)[:, :seq_len])

    # recurrent (generation) form ---------------------------------------------------------
    def step(self, x: torch.Tensor, position: int, bank: torch.Tensor, cache: KVCache,
             st: MoCLayerState) -> torch.Tensor:
        """One token x: (B, 1, D) at ``position``; re-routes at window boundaries."""
        if self.routing == "block_causal" and position % self.window == 0:
            self.set_route_from_prefix(bank, position, st)
        st.prefix_sum.add_(x[:, 0])
        pos = torch.tensor([position], device=x.device)
        h = x + self.attn(self.norm1(x), pos, cache)
        h = h + self.memory.attend(self.norm_m(h), st.keys, st.values)[0]
        return h + self.mlp(self.norm2(h))

    def set_route_from_prefix(self, bank: torch.Tensor, position: int,
                              st: MoCLayerState) -> None:
        """Route the window starting at ``position`` from the mean of the states before it."""
        if position:
            inputs = (st.prefix_sum / position)[:, None]                     # (B, 1, D)
        else:
            inputs = self.route_start.to(st.prefix_sum.dtype).expand(st.prefix_sum.shape[0], 1, -1)
        routing = self.route(inputs)
        ids, weights = routing.chapter_ids[:, 0], routing.weights[:, 0]       # (B, k+1)
        st.set_route(ids, weights, *self.memory.keys_values(bank, ids, weights))


# --- the model ------------------------------------------------------------------------------

class MoCState(DenseState):
    """Per-layer KV caches plus, per memory layer, the running sum and current route."""

    def __init__(self, caches: list[KVCache], memory: dict[int, MoCLayerState]):
        super().__init__(caches)
        self.memory = memory

    def tensors(self) -> list[torch.Tensor]:
        return super().tensors() + [t for st in self.memory.values() for t in st.tensors()]


def _block_options(cache, reference: bool, layer_state) -> dict:
    """The keywords a memory block is called with beyond ``(x, positions, bank)``: only those
    in use. So training calls ``block(x, positions, bank)``, and any module with that forward,
    MoCBlock's parameter names and a ``(y, Routing)`` result can stand in for a MoCBlock
    (``plugged_in.swap_modules``; notebook 08's capstone plugs the learner's block in this way)."""
    options = {"cache": cache, "layer_state": layer_state, "reference": reference or None}
    return {k: v for k, v in options.items() if v is not None}


class MoCLM(DenseLM):
    """The dense stack with MoC memory layers reading one shared chapter bank."""

    trace_keys = ("layer*.hidden", "layer*.router_probs", "layer*.chapters",
                  "layer*.chapter_weights", "layer*.chapter_attention", "layer*.attn_weights")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.memory_layers = memory_layers(cfg)
        self.bank = nn.Parameter(torch.empty(cfg.n_chapters * cfg.chapter_len, cfg.d_model))
        keyed_normal_(self.bank, cfg.init_std, "bank")
        for i in self.memory_layers:
            block = self.blocks[i]
            nn.init.zeros_(block.memory.out.weight)    # a fresh MoC == its backbone
            keyed_normal_(block.route_start, cfg.init_std, f"blocks.{i}.route_start")
        self.bank.requires_grad_(not cfg.freeze_bank)

    def build_block(self, index: int) -> nn.Module:
        return MoCBlock(self.cfg) if index in memory_layers(self.cfg) else super().build_block(index)

    def lr_scales(self) -> dict[str, float]:
        """{parameter name: lr factor}: the bank and the memory parts of memory layers."""
        scales = {"bank": float(self.cfg.bank_lr_scale)}
        for i in self.memory_layers:
            for name, _ in self.blocks[i].named_parameters():
                if name.startswith(MEMORY_PARTS):
                    scales[f"blocks.{i}.{name}"] = float(self.cfg.memory_lr_scale)
        return scales

    def _run_layers(self, tokens: torch.Tensor, caches: list[KVCache] | None = None,
                    reference: bool = False, state: MoCState | None = None):
        """tokens (B, T) -> (logits (B, T, V), [Routing per memory layer])."""
        start = caches[0].length if caches else 0
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)                                             # (B, T, D)
        routings = []
        for i, block in enumerate(self.blocks):
            cache = caches[i] if caches else None
            with scope(f"layer{i}"):
                if i in self.memory_layers:
                    layer_state = state.memory[i] if state is not None else None
                    x, routing = block(x, positions, self.bank,
                                       **_block_options(cache, reference, layer_state))
                    routings.append(routing)
                else:
                    x = block(x, positions, cache, reference)
                record("hidden", x)
        return self.head(self.norm(x)), routings

    def aux_losses(self, routings: list[Routing]) -> tuple[torch.Tensor, dict]:
        """(lb_coef·L_lb + z_coef·L_z) averaged over memory layers; the raw means as extras."""
        lb = torch.stack([load_balance_loss(r.probs, r.chapter_ids[..., 1:]) for r in routings])
        z = torch.stack([z_loss(r.logits) for r in routings])
        aux = (self.cfg.lb_coef * lb + self.cfg.z_coef * z).mean()
        return aux, {"lb_loss": lb.mean().detach(), "z_loss": z.mean().detach()}

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                reference: bool = False):
        check_tokens(tokens, self.cfg.vocab_size)
        logits, routings = self._run_layers(tokens, reference=reference)
        aux, extras = self.aux_losses(routings)
        out = self.output(logits, targets, aux.to(logits.dtype))
        out.extras = extras
        return out

    def new_state(self, batch: int, max_len: int) -> MoCState:
        p = self.embed.weight
        cfg = self.cfg
        caches = super().new_state(batch, max_len).caches
        memory = {i: MoCLayerState(batch, cfg.d_model, cfg.top_k + 1, p.device, p.dtype)
                  for i in self.memory_layers}
        return MoCState(caches, memory)

    def prefill(self, tokens: torch.Tensor, max_len: int | None = None):
        """The prompt in parallel; the state keeps each memory layer's sum and last route."""
        check_tokens(tokens, self.cfg.vocab_size)
        max_len = max(max_len or self.cfg.seq_len, tokens.shape[1])
        state = self.new_state(tokens.shape[0], max_len)
        return self._run_layers(tokens, state.caches, state=state)[0], state

    def step(self, token: torch.Tensor, state: MoCState):
        token = token.reshape(-1, 1)                                       # (B, 1)
        check_tokens(token, self.cfg.vocab_size)
        position = state.position
        x = self.embed(token)
        for i, block in enumerate(self.blocks):
            if i in self.memory_layers:
                x = block.step(x, position, self.bank, state.caches[i], state.memory[i])
            else:
                x = block(x, torch.tensor([position], device=x.device), state.caches[i])
        return self.head(self.norm(x))[:, -1], state


# --- the reference forward: docs/PAPERS.md, MoC equations, step by step, no tricks ----

def reference_forward(model: MoCLM, tokens: torch.Tensor) -> torch.Tensor:
    """MoC logits written out equation by equation. tokens (B, T) -> (B, T, V).

    Dense blocks run with the hand-written attention; each memory block routes,
    gathers, normalises, weights and reads its chapters window by window with
    plain softmax (``reference_attention``). Uses the model's own parameters;
    eval-mode maths (no dropout). Tests check it equals ``model(tokens).logits``.
    """
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    x = model.embed(tokens)                                                 # (B, T, D)
    for i, block in enumerate(model.blocks):
        if i in model.memory_layers:
            x = _reference_memory_block(block, x, positions, model.bank)
        else:
            x = block(x, positions, reference=True)
    return model.head(model.norm(x))                                        # (B, T, V)


def _reference_route(block: MoCBlock, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Router input -> (chapter ids (B, W, k+1), weights (B, W, k+1), window length)."""
    b, t, d = x.shape
    if block.routing == "sequence":
        r, window = x.mean(dim=1, keepdim=True), t                          # (B, 1, D) looks ahead
    else:
        window = block.window                                               # R
        starts = range(window, t, window)                                   # windows 1, 2, ...
        means = [x[:, :start].mean(dim=1) for start in starts]              # mean of tokens < wR
        r = torch.stack([block.route_start.expand(b, d), *means], dim=1)    # (B, W, D)
    # (B, W, C)  p = softmax(W_r r + b_r) over all chapters
    p = (r @ block.router.weight.T + block.router.bias).softmax(dim=-1)
    top_p, top_i = p[..., 1:].topk(block.top_k, dim=-1)                     # (B, W, k) routable
    w_hat = top_p / top_p.sum(dim=-1, keepdim=True)                         # renormalised top-k
    shared = torch.ones_like(w_hat[..., :1])
    weights = torch.cat([shared, block.routed_scale * w_hat], -1) / (1 + block.routed_scale)
    ids = torch.cat([torch.zeros_like(top_i[..., :1]), top_i + 1], dim=-1)  # [shared 0, routed]
    return ids, weights, window


def _reference_memory_block(block: MoCBlock, x: torch.Tensor, positions: torch.Tensor,
                            bank: torch.Tensor) -> torch.Tensor:
    """Variant A: h = x + Attn(norm(x)); h += MemRead(norm_m(h)); y = h + MLP(norm(h))."""
    ids, weights, window = _reference_route(block, x)                       # from x entering
    h = x + block.attn(block.norm1(x), positions, reference=True)           # (B, T, D)
    queries = block.norm_m(h)                                               # (B, T, D)
    read = block.memory
    d, n_len = h.shape[-1], read.chapter_len
    w_k, w_v = read.kv.weight.split(d, dim=0)                               # (D, D) each
    chapters = bank.view(-1, n_len, d)                                      # (C, L_ch, D)
    out = []
    for w, start in enumerate(range(0, h.shape[1], window)):
        mem = chapters[ids[:, w]]                                # (B, k+1, L_ch, D)  gather
        rms = mem.pow(2).mean(-1, keepdim=True) + read.unit_norm.eps
        mem = mem * torch.rsqrt(rms)                             # RMS-normalise, no gain
        mem = (mem * weights[:, w, :, None, None]).flatten(1, 2)  # (B, M, D)  x chapter weight
        q = _heads(queries[:, start:start + window] @ read.q.weight.T, read.n_head)  # (B,H,n,hd)
        k = _heads(mem @ w_k.T, read.n_head)                     # (B, H, M, hd)  K, no RoPE
        v = _heads(mem @ w_v.T, read.n_head)                     # (B, H, M, hd)  V = M~ W_V
        o, _ = reference_attention(q, k, v)                      # one joint softmax, not causal
        out.append(o.transpose(1, 2).flatten(2) @ read.out.weight.T)        # (B, n, D)  O W_O
    h = h + torch.cat(out, dim=1)                                           # (B, T, D)
    return h + block.mlp(block.norm2(h))


def _heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, S, D) -> (B, H, S, hd)."""
    return x.unflatten(-1, (n_head, -1)).transpose(1, 2)
