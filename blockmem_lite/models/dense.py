"""The dense GPT baseline every mechanism is measured against.

Token embedding -> n_layer pre-norm Blocks (causal SDPA, RoPE, SwiGLU) ->
RMSNorm -> untied LM head. Full causal attention costs O(T^2 d) per layer
and its KV cache grows as 2 * t * d per layer: the costs the mechanisms
attack. Kept strong on purpose (flash SDPA, preallocated cache), so every
speed-up the kit reports is against a fair baseline (docs/MEASUREMENTS.md, The
benchmark protocol). Its FLOP
model, KV-cache size and registration as ``dense`` are in ``mechanisms/dense.py``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from blockmem_lite.models.base import LanguageModel, ModelOutput, State, check_tokens
from blockmem_lite.nn import Block, KVCache, RMSNorm, init_weights
from blockmem_lite.trace import record, scope


class DenseState(State):
    """Per-layer KV caches; ``position`` is the number of tokens seen."""

    def __init__(self, caches: list[KVCache]):
        self.caches = caches

    @property
    def position(self) -> int:
        return self.caches[0].length

    def tensors(self) -> list[torch.Tensor]:
        return [t for c in self.caches for t in (c.k, c.v)]


class DenseLM(LanguageModel):
    """Decoder-only Transformer with full causal attention."""

    trace_keys = ("layer*.hidden", "layer*.attn_weights")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(self.build_block(i) for i in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.init_std, cfg.n_layer)

    def build_block(self, index: int) -> nn.Module:
        """Layer ``index`` of the stack; mechanisms that change the layer override this."""
        cfg = self.cfg
        return Block(cfg.d_model, cfg.n_head, cfg.mlp_ratio, cfg.rope_base, cfg.norm_eps,
                     cfg.dropout)

    def _run(self, tokens: torch.Tensor, caches: list[KVCache] | None = None,
             reference: bool = False) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V); appends to ``caches`` when given."""
        start = caches[0].length if caches else 0
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.embed(tokens)                                             # (B, T, D)
        for i, block in enumerate(self.blocks):
            with scope(f"layer{i}"):
                x = block(x, positions, caches[i] if caches else None, reference)
                record("hidden", x)
        return self.head(self.norm(x))                                     # (B, T, V)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                reference: bool = False) -> ModelOutput:
        """``reference=True`` uses the hand-written attention (for checks)."""
        check_tokens(tokens, self.cfg.vocab_size)
        return self.output(self._run(tokens, reference=reference), targets)

    def new_state(self, batch: int, max_len: int) -> DenseState:
        p = next(self.parameters())
        caches = [KVCache(batch, self.cfg.n_head, max_len, self.cfg.head_dim, p.device, p.dtype)
                  for _ in range(self.cfg.n_layer)]
        return DenseState(caches)

    def prefill(self, tokens: torch.Tensor, max_len: int | None = None):
        check_tokens(tokens, self.cfg.vocab_size)
        max_len = max(max_len or self.cfg.seq_len, tokens.shape[1])
        state = self.new_state(tokens.shape[0], max_len)
        return self._run(tokens, state.caches), state

    def step(self, token: torch.Tensor, state: DenseState):
        token = token.reshape(-1, 1)                                       # (B, 1)
        check_tokens(token, self.cfg.vocab_size)
        return self.decode_tokens(token, state)[:, -1], state

    def decode_tokens(self, tokens: torch.Tensor, state: DenseState) -> torch.Tensor:
        """The per-token part of ``step`` (no checks): tokens (B, r) -> logits (B, r, V)
        through the caches. What ``compiling.compile_decoding`` compiles."""
        return self._run(tokens, state.caches)
