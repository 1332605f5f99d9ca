"""BCMT: Blockwise Causal Memory Transformer (Arezki, 2026), and the HOnly ablation.

Each layer (docs/PAPERS.md, BCMT equations; B batch, N blocks, L block size, D width):

1. local attention: ``U = X + LocalAttn(RMSNorm(X))``, causal *inside* each block
   of L tokens, by reshaping (B, H, T, hd) -> (B, H*N, L, hd) for SDPA;
2. adaptive summary: ``a_t = RMSNorm_s(U)_t . w_s + b_s``,
   ``pi = softmax over the block``, ``S_j = sum_t pi_t RMSNorm_s(U)_t``;
3. normalised exponential memory: ``M_i = sum_{j<=i} a^(i-j) S_j / sum_{j<=i} a^(i-j)``
   (alpha = 0.8, fixed), computed as ``W @ S`` with the N x N row-normalised matrix W;
4. shift by one block: block i reads M_{i-1} (block 0 reads zeros);
5. ``P = M_shifted W_p``, copied to every token of the block;
6. gated fusion: ``G = sigmoid([U ; P] W_g + b_g)``, ``V = U + G * P``;
7. ``Y = V + MLP(RMSNorm(V))``.

``memory=False`` (or ``arch="honly"``) drops steps 2-6: a purely block-local model.

What the paper states (abstract, a published summary, one third-party review):
dense causal attention inside local blocks; adaptive block summaries from a
linear score and a softmax over the block's tokens; a normalised causal
exponential memory with fixed alpha = 0.8; projected, shifted by one block,
broadcast to the block and fused by a learned gate; HOnly = no memory.

Our design choices (the paper is silent; docs/PAPERS.md, BCMT paper vs kit):
memory in every layer, from that layer's own states; RMSNorm before
summarising; zero memory for the first block; the additive gated residual
``V = U + G * P`` (so one block, L = T, is exactly a dense Transformer); RoPE
with absolute positions (relative, so equal to within-block positions);
SwiGLU MLP; padding the tail to a multiple of L with the padded tokens masked
out of the summary softmax; W_p initialised to zero, so a fresh BCMT computes
exactly what HOnly of the same seed computes (every weight is drawn by its name,
``nn.keyed_normal_``, so both hold one backbone) and the memory is learned in (with
the usual N(0, 0.02) init the injected G * P is larger than the token states at step
0). Tests and notebooks that must exercise the memory path re-randomise W_p first.
The memory path learns at a tenth of the model's learning rate (``memory_lr_scale``):
W_p starts at zero and gets the same gradient direction from every token of a block,
so Adam, which moves each entry by about the learning rate whatever the gradient's
size, grows P = M W_p coherently; at the backbone's rate P outgrows the token states
within the warm-up (a loss spike, then a model worse than HOnly).

Generation keeps, per layer, a KV cache of at most one block, the (num, den)
memory state and the open block's U (B, L, D), so the decoding state is constant
in the context length. It does not stream the summary (running max, normaliser,
weighted sum), which would store no tokens: the streaming softmax
costs about ten small operators per token and layer, and at batch 1 a CPU decoding
step is bound by operator dispatch, so streaming would cost BCMT a visible share of its
decoding speed against HOnly. Keeping U instead costs L*D more state
per layer (1.0 -> 1.5 MiB at L=128, d=256) and the summary is then computed when
the block closes by the training formula itself (``BCMTLayer.summarise``).

``reference_forward(model, tokens)`` writes steps 1-7 out one equation per
line (RMSNorm_s(U) materialised, the concatenated gate); tests check that it
equals the fast forward. The FLOP model, bench variants, claims and the
registration of ``bcmt`` and ``honly`` are in ``mechanisms/bcmt.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from blockmem_lite.masks import block_causal_mask
from blockmem_lite.models.base import State, check_tokens
from blockmem_lite.models.dense import DenseLM
from blockmem_lite.nn import MLP, KVCache, RMSNorm, SelfAttention, attention, reference_attention
from blockmem_lite.registry import Options, knob
from blockmem_lite.trace import is_tracing, record, scope
from blockmem_lite.validation import check_bool, check_float, check_int, fail

MEMORY_PARTS = ("summary_norm.", "score.", "memory_proj.", "gate.")   # a layer's memory path

# --- options ---------------------------------------------------------------------------

def _block_size(recall_sweep=()):
    """The block-size knob (BCMT adds the memory-size sweep's values)."""
    return knob(64, help="L: tokens per block (the tail is padded)", symbol="L",
                sweep=(64, 128), span=True, recall_sweep=recall_sweep,
                presets={"tiny": 8, "fast": 16, "class": 64, "gpu": 128})


@dataclass
class HOnlyOptions(Options):
    """The block-local model: dense causal attention inside blocks, nothing between them."""

    block_size: int = _block_size()

    def validate(self, cfg) -> None:
        check_int("block_size", self.block_size, 1)
        if self.block_size > cfg.seq_len:
            fail("block_size", self.block_size,
                 f"must be between 1 and seq_len={cfg.seq_len} (the context)")


@dataclass
class BCMTOptions(HOnlyOptions):
    """HOnly's blocks plus the normalised exponential-decay block memory."""

    block_size: int = _block_size(recall_sweep=(8, 16))
    alpha: float = knob(0.8, help="decay of the exponential block memory (the paper fixes 0.8)",
                        recall_sweep=(0.2, 0.8, 0.95))
    memory: bool = field(default=True, metadata={
        "help": "False = the HOnly ablation inside a BCMT model (no block memory)"})
    learn_alpha: bool = field(default=False, metadata={
        "help": "exercises only: make alpha a learned parameter"})
    memory_lr_scale: float = field(default=0.1, metadata={
        "help": "memory-path lr = lr x this (W_p, the gate, the summary's score and norm)"})

    def validate(self, cfg) -> None:
        super().validate(cfg)
        check_float("alpha", self.alpha, 0.0, 1.0)
        check_float("memory_lr_scale", self.memory_lr_scale, 0.0)
        check_bool("memory", self.memory)
        check_bool("learn_alpha", self.learn_alpha)


# --- the memory maths as pure functions (tests and notebooks use them) -------------------

def decay_weights(n_blocks: int, alpha, dtype=torch.float32, device=None) -> torch.Tensor:
    """Row-normalised causal decay matrix W: (N, N), ``W_ij ∝ alpha^(i-j)`` for j <= i.

    Exponents are i - j >= 0, so nothing overflows (unlike alpha^-j tricks);
    ``alpha`` may be a float or a 0-d tensor (learnable for exercises).
    """
    i = torch.arange(n_blocks, device=device)[:, None]
    j = torch.arange(n_blocks, device=device)[None, :]
    lag = (i - j).clamp(min=0).to(dtype)                                   # (N, N)
    alpha = torch.as_tensor(alpha, dtype=dtype, device=device)
    w = torch.pow(alpha, lag) * (j <= i).to(dtype)
    return w / w.sum(dim=-1, keepdim=True)


def memory_matrix_form(summaries: torch.Tensor, alpha) -> torch.Tensor:
    """M = W S. summaries: (B, N, D) -> memories (B, N, D), M_i over blocks 0..i."""
    w = decay_weights(summaries.shape[1], alpha, summaries.dtype, summaries.device)
    return w @ summaries


def memory_scan_form(summaries: torch.Tensor, alpha) -> torch.Tensor:
    """The same memory by the recurrence num = a*num + S_j, den = a*den + 1, M_j = num/den."""
    num = torch.zeros_like(summaries[:, 0])                                # (B, D)
    den = 0.0
    out = []
    for j in range(summaries.shape[1]):
        num = alpha * num + summaries[:, j]
        den = alpha * den + 1.0
        out.append(num / den)
    return torch.stack(out, dim=1)                                         # (B, N, D)


def shift_one_block(memories: torch.Tensor) -> torch.Tensor:
    """Block i gets M_{i-1}; block 0 gets zeros. (B, N, D) -> (B, N, D)."""
    return torch.cat([torch.zeros_like(memories[:, :1]), memories[:, :-1]], dim=1)


def block_summaries(states: torch.Tensor, scores: torch.Tensor, block_size: int,
                    n_valid: int | None = None, state_scale: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax-weighted summary per block.

    states: (B, N*L, D), scores: (B, N*L); tokens at index >= n_valid are padding
    and get weight 0. ``state_scale`` (B, N*L), if given, multiplies each state
    inside the sum (a per-token normalisation folded into the weights).
    Returns (summaries (B, N, D), weights pi (B, N, L)).
    """
    b, t, d = states.shape
    n = t // block_size
    scores = scores.view(b, n, block_size)
    if n_valid is not None and n_valid < t:
        pad = torch.arange(t, device=states.device).view(n, block_size) >= n_valid
        scores = scores.masked_fill(pad, float("-inf"))
    weights = scores.softmax(dim=-1)                                       # (B, N, L)
    mix = weights if state_scale is None else weights * state_scale.view(b, n, block_size)
    summaries = torch.einsum("bnl,bnld->bnd", mix, states.view(b, n, block_size, d))
    return summaries, weights


# --- one layer -------------------------------------------------------------------------

class BCMTLayerState:
    """Per-layer decoding state: one block of KV, the open block's U, the memory.

    ``block_u`` (B, L, D) keeps U_t (after attention, before the gate) of the open block's
    tokens; the block's summary is computed from them when it closes, by the parallel
    form's own formula (``BCMTLayer.summarise``), so a decoding step does no summary work.
    ``memory_out`` is P of the current block and ``gate_bias`` the gate's P half
    ``P W_g,P + b_g``: both change only when a block opens, so they are computed once per
    block, not once per token. HOnly layers (``memory=False``) keep no ``block_u``.
    """

    def __init__(self, cache: KVCache, dim: int, batch: int, device, dtype,
                 block_size: int = 0, memory: bool = False):
        self.cache = cache
        zeros = dict(device=device, dtype=dtype)
        self.num = torch.zeros(batch, 1, dim, **zeros)         # sum_j alpha^(i-j) S_j
        self.den = torch.zeros(batch, 1, 1, **zeros)           # sum_j alpha^(i-j)
        self.memory_out = torch.zeros(batch, 1, dim, **zeros)  # P of the current block (B, 1, D)
        self.gate_bias = torch.zeros(batch, 1, dim, **zeros)   # P W_g,P + b_g (B, 1, D)
        self.block_u = torch.zeros(batch, block_size, dim, **zeros) if memory else None

    def tensors(self) -> list[torch.Tensor]:
        kept = [self.cache.k, self.cache.v, self.num, self.den, self.memory_out, self.gate_bias]
        return kept if self.block_u is None else [*kept, self.block_u]


class BCMTLayer(nn.Module):
    """Local causal attention + (optionally) the gated block memory + MLP."""

    def __init__(self, cfg, memory: bool, memory_form=memory_matrix_form,
                 shift=shift_one_block):
        super().__init__()
        d = cfg.d_model
        self.block_size = cfg.block_size
        self.has_memory = memory
        self.memory_form, self.shift = memory_form, shift     # steps 3 and 4 (see BCMTLM)
        self.norm1 = RMSNorm(d, cfg.norm_eps)
        self.attn = SelfAttention(d, cfg.n_head, cfg.rope_base, cfg.dropout)
        self.norm2 = RMSNorm(d, cfg.norm_eps)
        self.mlp = MLP(d, cfg.mlp_ratio)
        self.drop = nn.Dropout(cfg.dropout)
        if memory:
            self.summary_norm = RMSNorm(d, cfg.norm_eps)
            self.score = nn.Linear(d, 1)                  # w_s, b_s
            self.memory_proj = nn.Linear(d, d, bias=False)  # W_p (no bias: P_0 = 0)
            self.gate = nn.Linear(2 * d, d)               # W_g, b_g
            alpha = torch.tensor(float(cfg.alpha))
            if cfg.learn_alpha:
                self.alpha = nn.Parameter(alpha)
            else:
                self.register_buffer("alpha", alpha)

    # parallel (training) form ------------------------------------------------------
    def local_attention(self, x: torch.Tensor, positions: torch.Tensor,
                        reference: bool = False) -> torch.Tensor:
        """Causal attention inside blocks. x: (B, N*L, D) -> (B, N*L, D)."""
        q, k, v = self.attn.project_qkv(x, positions)                      # (B, H, T, hd)
        b, h, t, hd = q.shape
        if reference or is_tracing("attn_weights"):
            y, w = reference_attention(q, k, v, mask=block_causal_mask(t, self.block_size, x.device))
            record("attn_weights", w)
        else:
            n = t // self.block_size
            blocks = [z.reshape(b, h * n, self.block_size, hd) for z in (q, k, v)]  # 4-D for SDPA
            p = self.attn.dropout if self.training else 0.0
            y = attention(*blocks, causal=True, dropout_p=p).reshape(b, h, t, hd)
        return self.attn.out(self.attn.merge_heads(y))

    def block_memory(self, u: torch.Tensor, n_valid: int,
                     summaries_out: list | None = None) -> torch.Tensor:
        """Steps 2-5: one memory projection per block. u: (B, N*L, D) -> P (B, N, D).

        ``summaries_out`` (prefill) receives this layer's block summaries S: (B, N, D).
        """
        summaries, weights = self.summarise(u, n_valid)                      # (B, N, D)
        if summaries_out is not None:
            summaries_out.append(summaries)
        memories = self.memory_form(summaries, self.alpha)
        shifted = self.shift(memories)
        if is_tracing():
            record("decay_weights", decay_weights(summaries.shape[1], self.alpha, u.dtype))
            record("summary_weights", weights)
            record("memory", shifted)
        return self.memory_proj(shifted)                                     # (B, N, D)

    def summarise(self, u: torch.Tensor, n_valid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 2, the block summaries: u (B, N*L, D) -> (S (B, N, D), weights pi (B, N, L)).

        RMSNorm_s(U)_t = g * U_t / rms(U_t): 1/rms is folded into the scores and the
        summary weights rather than the normalised (B, T, D) tensor materialised.
        """
        wide = u.float() if u.dtype in (torch.float16, torch.bfloat16) else u
        inv_rms = torch.rsqrt(wide.pow(2).mean(-1) + self.summary_norm.eps).to(u.dtype)  # (B, T)
        gain = self.summary_norm.weight                                      # (D,)
        scores = F.linear(u, self.score.weight * gain)[..., 0] * inv_rms + self.score.bias
        summaries, weights = block_summaries(u, scores, self.block_size, n_valid,
                                             state_scale=inv_rms)            # (B, N, D)
        return summaries * gain, weights

    def fuse(self, u: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Step 6: V = U + sigmoid([U ; P] W_g + b_g) * P.

        u: (B, N, L, D) tokens grouped by block, p: (B, N, D) one memory per block.
        [U ; P] W_g is split as U W_u + P W_p: the P half is computed once per
        block instead of once per token (same result, a third of the gate cost).
        """
        w_u, w_p = self.gate.weight.split(u.shape[-1], dim=1)             # (D, D) each
        gate_from_p = F.linear(p, w_p, self.gate.bias)[:, :, None]          # (B, N, 1, D)
        g = torch.sigmoid(F.linear(u, w_u) + gate_from_p)                   # (B, N, L, D)
        record("gate", g.flatten(1, 2))
        return torch.addcmul(u, g, p[:, :, None])                            # u + g * p
    def forward(self, x: torch.Tensor, positions: torch.Tensor, n_valid: int,
                reference: bool = False, summaries_out: list | None = None) -> torch.Tensor:
        """x: (B, N*L, D), the last N*L - n_valid positions are padding."""
        u = x + self.drop(self.local_attention(self.norm1(x), positions, reference))
        if self.has_memory:
            b, t, d = u.shape
            p = self.block_memory(u, n_valid, summaries_out)                 # (B, N, D)
            u = self.fuse(u.view(b, -1, self.block_size, d), p).view(b, t, d)
        return u + self.drop(self.mlp(self.norm2(u)))

    # recurrent (generation) form ---------------------------------------------------
    def decode(self, x: torch.Tensor, positions: torch.Tensor, st: BCMTLayerState) -> torch.Tensor:
        """One token inside the open block. x: (B, 1, D) -> (B, 1, D); ``close_block`` ends
        the block after its last token."""
        u = x + self.attn(self.norm1(x), positions, cache=st.cache)           # (B, 1, D)
        if self.has_memory:
            u = self._gate_step(u, st)
        return u + self.mlp(self.norm2(u))

    def start(self, st: BCMTLayerState) -> None:
        """A fresh state's memory: P = 0, so the gate's P half is b_g."""
        if self.has_memory:
            st.gate_bias.copy_(self.gate.bias.expand_as(st.gate_bias))

    def _gate_step(self, u: torch.Tensor, st: BCMTLayerState) -> torch.Tensor:
        """Step 6 for one token u (B, 1, D): ``V = U + sigmoid(U W_g,U + P W_g,P + b_g) * P``
        with P and its half of the gate fixed for the block; U is kept in ``st.block_u``
        for the block's summary (``close_block``). One matmul, two elementwise ops."""
        b, _, d = u.shape
        n = st.cache.length                          # this token's slot + 1 (a slice, not an
        st.block_u[:, n - 1:n].copy_(u)              # int index: compiled, it stays symbolic)
        pre = torch.addmm(st.gate_bias.view(b, d), u.view(b, d), self.gate.weight[:, :d].t())
        g = torch.sigmoid(pre).view(b, 1, d)                                 # (B, 1, D)
        record("gate", g)
        return torch.addcmul(u, g, st.memory_out)                            # u + g * p

    def _refresh_memory(self, st: BCMTLayerState) -> None:
        """P = (num / den) W_p for the next block, and the gate's P half from it."""
        p = self.memory_proj(st.num / st.den)                                # (B, 1, D)
        st.memory_out.copy_(p)
        st.gate_bias.copy_(F.linear(p, self.gate.weight[:, p.shape[-1]:], self.gate.bias))

    def load_memory(self, summaries: torch.Tensor, st: BCMTLayerState) -> None:
        """Set (num, den) and P from the summaries (B, N, D) of N completed blocks."""
        for j in range(summaries.shape[1]):
            st.num.copy_(self.alpha * st.num + summaries[:, j:j + 1])
            st.den.copy_(self.alpha * st.den + 1.0)
        self._refresh_memory(st)

    def close_block(self, st: BCMTLayerState) -> None:
        """A block ended: its summary (from the kept U, as in training) into (num, den),
        P refreshed, the cache cleared."""
        if self.has_memory:
            summary, _ = self.summarise(st.block_u, self.block_size)          # (B, 1, D)
            st.num.copy_(self.alpha * st.num + summary)
            st.den.copy_(self.alpha * st.den + 1.0)
            self._refresh_memory(st)
        st.cache.reset()


# --- the model -------------------------------------------------------------------------

class BCMTState(State):
    def __init__(self, layers: list[BCMTLayerState], position: int = 0):
        self.layers = layers
        self.position = position

    def tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for t in layer.tensors()]


class BCMTLM(DenseLM):
    """The dense stack with BCMT layers; ``memory=False`` (or ``HOnlyLM``) = HOnly."""

    trace_keys = ("layer*.attn_weights", "layer*.decay_weights", "layer*.summary_weights",
                  "layer*.memory", "layer*.gate")
    # The memory's steps 3 and 4, handed to every layer: a notebook plants a bug by swapping
    # one in a subclass (``class NoShift(BCMTLM): shift = staticmethod(...)``).
    memory_form = staticmethod(memory_matrix_form)
    shift = staticmethod(shift_one_block)

    def __init__(self, cfg):
        super().__init__(cfg)
        for layer in self.blocks:
            if layer.has_memory:
                nn.init.zeros_(layer.memory_proj.weight)   # a fresh BCMT == HOnly

    @property
    def uses_memory(self) -> bool:
        return self.cfg.memory

    def lr_scales(self) -> dict[str, float]:
        """{parameter name: lr factor}: the memory path learns at ``memory_lr_scale`` x lr."""
        return {name: float(self.cfg.memory_lr_scale) for name, _ in self.named_parameters()
                if name.split(".", 2)[-1].startswith(MEMORY_PARTS)}

    def build_block(self, index: int) -> nn.Module:
        return BCMTLayer(self.cfg, memory=self.uses_memory, memory_form=self.memory_form,
                         shift=self.shift)

    def _run_blocks(self, tokens: torch.Tensor, reference: bool = False,
                    summaries_out: list | None = None) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V); pads to a multiple of L internally."""
        b, t = tokens.shape
        block = self.cfg.block_size
        padded = -(-t // block) * block
        x = self.embed(tokens)                                              # (B, T, D)
        x = F.pad(x, (0, 0, 0, padded - t))                                 # (B, N*L, D)
        positions = torch.arange(padded, device=tokens.device)
        for i, layer in enumerate(self.blocks):
            with scope(f"layer{i}"):
                x = layer(x, positions, t, reference, summaries_out)
        return self.head(self.norm(x[:, :t]))

    def forward(self, tokens, targets=None, reference: bool = False):
        check_tokens(tokens, self.cfg.vocab_size)
        return self.output(self._run_blocks(tokens, reference), targets)

    def new_state(self, batch: int) -> BCMTState:
        p = next(self.parameters())
        cfg = self.cfg
        layers = [BCMTLayerState(KVCache(batch, cfg.n_head, cfg.block_size, cfg.head_dim,
                                         p.device, p.dtype), cfg.d_model, batch, p.device, p.dtype,
                                 cfg.block_size, self.uses_memory)
                  for _ in range(cfg.n_layer)]
        for layer, layer_state in zip(self.blocks, layers, strict=True):
            layer.start(layer_state)
        return BCMTState(layers)

    def prefill(self, tokens: torch.Tensor, max_len: int | None = None):
        """Whole blocks of the prompt in parallel, the partial last block token by token.

        The state after whole blocks is an empty KV cache and (num, den) folded
        from each layer's block summaries; ``max_len`` is not needed (state is O(L)).
        """
        check_tokens(tokens, self.cfg.vocab_size)
        state = self.new_state(tokens.shape[0])
        aligned = tokens.shape[1] // self.cfg.block_size * self.cfg.block_size
        logits = []
        if aligned:
            summaries: list[torch.Tensor] = []
            logits.append(self._run_blocks(tokens[:, :aligned], summaries_out=summaries))
            if summaries:  # HOnly layers have no memory to load
                for layer, layer_state, s in zip(self.blocks, state.layers, summaries, strict=True):
                    layer.load_memory(s, layer_state)
            state.position = aligned
        for i in range(aligned, tokens.shape[1]):
            logits.append(self.step(tokens[:, i], state)[0][:, None])
        return torch.cat(logits, dim=1), state

    def step(self, token: torch.Tensor, state: BCMTState):
        """One token: ``decode_tokens``, then close the block when it is full (all per-block
        work stays out of the per-token part)."""
        token = token.reshape(-1, 1)
        check_tokens(token, self.cfg.vocab_size)
        logits = self.decode_tokens(token, state)[:, -1]
        if state.position % self.cfg.block_size == 0:                       # the block is full
            for layer, layer_state in zip(self.blocks, state.layers, strict=True):
                layer.close_block(layer_state)
        return logits, state

    def decode_tokens(self, token: torch.Tensor, state: BCMTState) -> torch.Tensor:
        """The per-token part of ``step`` (no checks, no block boundary): token (B, 1) ->
        logits (B, 1, V). What ``compiling.compile_decoding`` compiles."""
        x = self.embed(token)                                               # (B, 1, D)
        positions = torch.arange(state.position, state.position + 1, device=x.device)
        for layer, layer_state in zip(self.blocks, state.layers, strict=True):
            x = layer.decode(x, positions, layer_state)                     # one for every layer
        state.position += 1
        return self.head(self.norm(x))


class HOnlyLM(BCMTLM):
    """The HOnly ablation (``arch="honly"``): BCMT's blocks without the memory."""

    trace_keys = ("layer*.attn_weights",)

    @property
    def uses_memory(self) -> bool:
        return False


# --- the reference forward: docs/PAPERS.md, BCMT equations, step by step, no tricks -----

def reference_forward(model: BCMTLM, tokens: torch.Tensor) -> torch.Tensor:
    """BCMT (or HOnly) logits written out equation by equation. tokens (B, T) -> (B, T, V).

    Uses the model's own parameters, plain torch ops and ``reference_attention``
    under ``block_causal_mask``: RMSNorm_s(U) materialised, the N x N decay
    matrix built here, the gate on the concatenation [U ; P]. Eval-mode
    maths (no dropout). Tests check it equals ``model(tokens).logits``.
    """
    b, t = tokens.shape
    block = model.cfg.block_size
    padded = -(-t // block) * block                         # pad the tail to N * L
    x = F.pad(model.embed(tokens), (0, 0, 0, padded - t))   # (B, N*L, D)
    positions = torch.arange(padded, device=tokens.device)
    for layer in model.blocks:
        x = _reference_layer(layer, x, positions, t)
    return model.head(model.norm(x[:, :t]))                 # (B, T, V)


def _reference_layer(layer: BCMTLayer, x: torch.Tensor, positions: torch.Tensor,
                     n_valid: int) -> torch.Tensor:
    """One BCMT layer, steps 1-7 in order. x: (B, N*L, D) -> (B, N*L, D)."""
    b, t, d = x.shape
    size = layer.block_size
    n = t // size
    attn = layer.attn
    # (B, H, T, hd)  q, k, v of RMSNorm(X), RoPE on q and k                     (step 1)
    q, k, v = attn.project_qkv(layer.norm1(x), positions)
    # (B, H, T, hd)  causal attention inside each block only                   (step 1)
    y, _ = reference_attention(q, k, v, mask=block_causal_mask(t, size, x.device))
    u = x + attn.out(attn.merge_heads(y))                    # (B, T, D)  U = X + LocalAttn
    if not layer.has_memory:                                 # HOnly: steps 2-6 dropped
        return u + layer.mlp(layer.norm2(u))                 # (step 7)
    u_bar = layer.summary_norm(u)                            # (B, T, D)  Ū = RMSNorm_s(U) (step 2)
    a = u_bar @ layer.score.weight[0] + layer.score.bias     # (B, T)     a_t = Ū_t . w_s + b_s
    is_pad = torch.arange(t, device=x.device) >= n_valid
    a = a.masked_fill(is_pad, float("-inf"))                 # padded tail: weight 0
    pi = a.view(b, n, size).softmax(dim=-1)                  # (B, N, L)  pi = softmax over block
    s = (pi[..., None] * u_bar.view(b, n, size, d)).sum(2)   # (B, N, D)  S_j = sum_t pi_t Ū_t
    i = torch.arange(n, device=x.device)[:, None]
    j = torch.arange(n, device=x.device)[None, :]
    decay = torch.where(j <= i, layer.alpha ** (i - j).clamp(min=0), 0.0)  # (N, N) a^(i-j), j<=i
    w = decay / decay.sum(dim=1, keepdim=True)               # (N, N)  rows sum to 1   (step 3)
    m = torch.einsum("ij,bjd->bid", w.to(s.dtype), s)        # (B, N, D)  M = W S
    m_prev = torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], dim=1)  # M~_i = M_(i-1), M~_1 = 0
    p = m_prev @ layer.memory_proj.weight.T                  # (B, N, D)  P = M~ W_p   (step 5)
    p_tok = p.repeat_interleave(size, dim=1)                 # (B, T, D)  P_b(t) per token
    gate_in = torch.cat([u, p_tok], dim=-1)                  # (B, T, 2D) [U ; P]      (step 6)
    g = torch.sigmoid(gate_in @ layer.gate.weight.T + layer.gate.bias)  # G = sigma([U;P] W_g + b_g)
    v_fused = u + g * p_tok                                  # (B, T, D)  V = U + G * P
    return v_fused + layer.mlp(layer.norm2(v_fused))         # (B, T, D)  Y = V + MLP(RMSNorm(V))
