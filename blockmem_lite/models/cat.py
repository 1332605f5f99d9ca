"""CAT: Compress & Attend Transformer (Prakash, Puli, Ranganath; arXiv 2511.05313).

A compressor turns each chunk of C tokens into one vector; a decoder reads its own chunk's
tokens plus every earlier chunk vector, never earlier raw tokens. Attention work falls from
O(T^2) to O(T (C + T/C)), the decoding cache from t slots to t/C + C (at decoder width).

The decoder reads one interleaved sequence (docs/PAPERS.md, CAT equations). With K
chunks of C tokens, group k is ``[g_k, (SEP,) x_kC .. x_kC+C-1]``: g_0 is a
learned dummy (the chunk-size indicator in the multi-chunk model), g_k = f_{k-1}
is chunk k-1 compressed to one vector, SEP a learned separator (multi-chunk
model only). A final ``[f_{K-1} (, SEP)]`` closes the sequence. Group width
W = C + 1 (C + 2 with SEP); the decoder's RoPE position of slot n is n mod W
(the slot arithmetic: ``ops.cat_layout``).

Readout (the #1 off-by-one): the prediction of token i+1 is read where token i
is the newest thing visible. For token i = kC + j that is its own slot when
j < C-1, and for the chunk's last token (j = C-1) the compressed slot f_k that
opens group k+1 (its SEP slot in the multi-chunk model): the first token of a
chunk is predicted from compressed history only.

From the paper and its code: the bidirectional compressor with a learned
chunk-index token (ChunkPos) and flatten + W_f projection to the decoder width;
separate compressor / decoder embeddings, untied head; the layout, mask, RoPE
positions and readout above; the multi-chunk model's chunk-size token, indicator,
separator and bilinear resize of W_f; generation keeping only compressed past
(``cache_slots``: K_max + C per layer).

**[our design choice]** where the paper is silent or the kit needs a rule:

* one chunk size sampled uniformly per forward call in training (= per optimisation
  step with the kit's trainer), the same for the whole batch (the bench pins it);
* decoder width = ``decoder_width`` x d_model with heads scaled by the same factor, so
  the head dimension stays that of the backbone;
* training uses the per-chunk attention (``ops.cat_attention``, the fast form), proved
  equal to the interleaved sequence under ``masks.cat_mask``; no attention dropout;
* prompts not aligned to C: the complete chunks go in as compressed slots (RoPE 0), the
  leftover tokens after them;
* the compressor learns at a quarter of the learning rate (``compressor_lr_scale``). Every
  later token reads the chunk vectors, and Adam moves every compressor weight by about
  the learning rate at each step, so at the backbone's rate one step could turn them by
  45 degrees (cosine 0.70 measured, class preset, lr 1.2e-3 in the warm-up) and the
  decoder, tuned to the old ones, fell above an untrained model's loss (7.2 nats against
  5.5) until it re-learned them. Per-part learning rates are common practice (e.g.
  muP's per-layer rates); the paper trains larger models at lr 8e-4 and says nothing of
  it. Measured over seeds 0-2, the first 100 steps: the largest jump of the loss against
  the same chunk size's last steps fell from 0.64-2.79 nats to 0.25-0.39, and the mean
  loss of steps 50-100 from 2.52-2.73 to 2.41-2.46;
* the chunk-index table covers ``ceil(seq_len / min C)`` chunks; generation stops past them.

The decoder's attention is a module, ``CATAttention`` (SelfAttention's weights, CAT's
pattern), so a learner's version can be swapped in (``plugged_in.swap_modules``).

``reference_forward(model, tokens, chunk_size)`` builds it chunk by chunk, slot by slot and
token by token (fixed-C and multi-chunk); tests check that it equals the fast forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from blockmem_lite.masks import cat_mask
from blockmem_lite.models.base import LanguageModel, ModelOutput, State, check_tokens
from blockmem_lite.nn import (
    Block,
    KVCache,
    RMSNorm,
    SelfAttention,
    init_weights,
    keyed_normal_,
    reference_attention,
)
from blockmem_lite.ops.cat_attention import per_chunk_attention
from blockmem_lite.ops.cat_layout import interleave, prefill_mask, readout_slots, slot_positions
from blockmem_lite.registry import Options, knob
from blockmem_lite.trace import is_tracing, record, scope
from blockmem_lite.validation import check_bool, check_float, check_int, fail


class CATAttention(SelfAttention):
    """The decoder's attention: SelfAttention's weights (``qkv``, ``out``), CAT's pattern.

    Called with the layout, ``forward(x, positions, n_chunks=K, chunk_size=C,
    separator=...)``: x (B, S, D) the normalised interleaved slots at RoPE ``positions``
    (S,) -> (B, S, D). Every slot sees the slots of its own group up to itself and every
    earlier compressed slot (``masks.cat_mask``): a token reads its own chunk causally and
    the chunk vectors of earlier chunks, never its own chunk's vector, which opens the next
    group. ``path`` picks how: ``per_chunk_attention`` (default), SDPA under the S x S
    ``mask`` (``"masked"``) or plain softmax (``"reference"``, records the weights and the
    share on compressed slots).

    Called without ``n_chunks`` it is SelfAttention's forward: cached generation appends
    slots causally, ``reference_forward`` passes its S x S mask.

    The seam of notebook 05's capstone: ``plugged_in.swap_modules(model, CATAttention, ...)``
    puts a learner's module with the same weights in its place; the model calls it with
    keywords, ``(x, positions, n_chunks=, chunk_size=, separator=)``, adding ``path=`` and
    ``mask=`` only for the other paths (and when tracing the attention weights).
    """

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None, reference: bool = False,
                mask: torch.Tensor | None = None, causal: bool = True, *,
                n_chunks: int | None = None, chunk_size: int | None = None,
                separator: bool = False, path: str = "per_chunk") -> torch.Tensor:
        if n_chunks is None:
            return super().forward(x, positions, cache, reference, mask, causal)
        q, k, v = self.project_qkv(x, positions)                           # (B, H, S, hd)
        if path == "per_chunk":
            y = per_chunk_attention(q, k, v, n_chunks, chunk_size, separator)
        elif path == "masked":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y, weights = reference_attention(q, k, v, mask=mask)           # (B, H, S, S)
            record("attn_weights", weights)
            is_compressed = positions == 0                                  # slot n % W == 0
            record("compressed_share", weights[..., is_compressed].sum(-1))  # (B, H, S)
        return self.out(self.merge_heads(y))


def _decoder_block(dim: int, n_head: int, mlp_ratio: float, rope_base: float, norm_eps: float,
                   dropout: float) -> Block:
    """A pre-norm Block whose attention is a CATAttention (same parameter names and shapes,
    so ``init_weights`` draws it the same weights as a plain Block's)."""
    block = Block(dim, n_head, mlp_ratio, rope_base, norm_eps, dropout)
    block.attn = CATAttention(dim, n_head, rope_base, dropout)
    return block


class Compressor(nn.Module):
    """f: one chunk of C tokens -> one vector of the decoder width (docs/PAPERS.md, CAT equations).

    Every chunk is compressed on its own, all chunks in parallel as a batch:
    ``[(a_p ;) ChunkPos[k] ; E_f(chunk k)]`` through ``depth`` pre-norm blocks with
    bidirectional attention (RoPE positions from 0), a final RMSNorm, the prefix
    rows dropped, the C outputs flattened and projected by W_f to ``out_dim``.
    Bidirectional is legal only because f_k is read strictly after chunk k ends.
    ChunkPos is the decoder's only source of chunk order.

    ``chunk_sizes`` (multi-chunk model): a learned chunk-size token a_p is
    prepended too, W_f is sized for the largest chunk and bilinearly resized to
    (out_dim, C * d) for a smaller C. Without it the compressor serves
    ``chunk_size`` only.
    """

    def __init__(self, vocab_size: int, d_model: int, n_head: int, depth: int, chunk_size: int,
                 max_chunks: int, out_dim: int, mlp_ratio: float = 8 / 3,
                 rope_base: float = 10000.0, norm_eps: float = 1e-5,
                 chunk_sizes: tuple[int, ...] = ()):
        super().__init__()
        self.chunk_sizes = tuple(sorted(chunk_sizes)) or (chunk_size,)
        self.chunk_size = max(self.chunk_sizes)                 # the size W_f is stored for
        self.embed = nn.Embedding(vocab_size, d_model)
        self.chunk_pos = nn.Embedding(max_chunks, d_model)
        self.size_token = (nn.Embedding(int(math.log2(self.chunk_size)) + 1, d_model)
                           if chunk_sizes else None)
        self.blocks = nn.ModuleList(Block(d_model, n_head, mlp_ratio, rope_base, norm_eps)
                                    for _ in range(depth))
        self.norm = RMSNorm(d_model, norm_eps)
        self.proj = nn.Linear(self.chunk_size * d_model, out_dim, bias=False)    # W_f

    @property
    def max_chunks(self) -> int:
        return self.chunk_pos.num_embeddings

    def projection(self, chunk_size: int) -> torch.Tensor:
        """W_f for ``chunk_size``: the stored weight, bilinearly resized for a smaller C."""
        weight = self.proj.weight                                           # (D, C_max * d)
        if chunk_size == self.chunk_size:
            return weight
        d_out, d_in = weight.shape[0], chunk_size * self.embed.embedding_dim
        return F.interpolate(weight[None, None], size=(d_out, d_in), mode="bilinear",
                             align_corners=False)[0, 0]

    def forward(self, tokens: torch.Tensor, chunk_size: int | None = None,
                first_chunk: int = 0) -> torch.Tensor:
        """tokens (B, K*C) -> compressed chunks (B, K, out_dim).

        ``first_chunk`` is the chunk index of the first chunk (decoding compresses
        one finished chunk at a time).
        """
        c = self.chunk_size if chunk_size is None else chunk_size
        if c not in self.chunk_sizes:
            raise ValueError(f"chunk_size={c} is not allowed: this compressor serves "
                             f"{', '.join(map(str, self.chunk_sizes))}")
        b, n = tokens.shape
        if n % c:
            raise ValueError(f"tokens of length {n} are not allowed: the compressor needs a "
                             f"multiple of chunk_size={c} (pad the tail first)")
        k = n // c
        if first_chunk + k > self.max_chunks:
            raise ValueError(f"{first_chunk + k} chunks are not allowed: this compressor knows "
                             f"at most max_chunks={self.max_chunks} chunk positions")
        x = self.embed(tokens).view(b * k, c, -1)                            # (B*K, C, d)
        index = torch.arange(first_chunk, first_chunk + k, device=tokens.device).repeat(b)
        prefix = [self.chunk_pos(index)[:, None]]                           # (B*K, 1, d)
        if self.size_token is not None:
            p = torch.full_like(index, int(math.log2(c)))
            prefix.insert(0, self.size_token(p)[:, None])
        z = torch.cat([*prefix, x], dim=1)                                  # (B*K, P+C, d)
        positions = torch.arange(z.shape[1], device=tokens.device)
        for block in self.blocks:
            z = block(z, positions, causal=False)
        z = self.norm(z)[:, len(prefix):]                                   # (B*K, C, d)
        return F.linear(z.reshape(b, k, -1), self.projection(c))           # (B, K, D)


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------

def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


@dataclass
class CATOptions(Options):
    """CAT's fields: the chunk size knob, the multi-chunk sizes, decoder width, compressor depth."""

    chunk_size: int = knob(16, help="C: tokens per compressed chunk (the multi-chunk model's "
                           "default)", symbol="C", sweep=(4, 8, 16, 32), span=True,
                           recall_sweep=(4, 8, 16))
    chunk_sizes: tuple = knob((), help="() = a fixed-C model; else the multi-chunk model's "
                              "sizes, e.g. 4,8,16,32", boundary=True)
    decoder_width: int = knob(2, help="decoder width = decoder_width x d_model (the paper: 2)",
                              symbol="w", sweep=(1, 2))
    compressor_layers: int = field(default=0, metadata={
        "help": "compressor depth; 0 = max(1, n_layer // 4)"})
    memory: bool = field(default=True, metadata={
        "help": "False = the memory-less twin: every chunk vector is zero, so a token sees "
                "only its own chunk"})
    compressor_lr_scale: float = field(default=0.25, metadata={
        "help": "the compressor's lr = lr x this (every chunk vector moves with it)"})

    def validate(self, cfg) -> None:
        check_int("chunk_size", self.chunk_size, 1)
        if self.chunk_size > cfg.seq_len:
            fail("chunk_size", self.chunk_size, f"must be between 1 and seq_len={cfg.seq_len}")
        sizes = self.chunk_sizes
        if not isinstance(sizes, tuple):
            fail("chunk_sizes", sizes, "expected a tuple of chunk sizes, e.g. (4, 8, 16, 32)")
        for c in sizes:
            if isinstance(c, bool) or not isinstance(c, int) or not _is_power_of_two(c) \
                    or c > cfg.seq_len:
                fail("chunk_sizes", sizes, f"expected powers of two between 1 and "
                                           f"seq_len={cfg.seq_len} (the paper uses 4, 8, 16, 32)")
        if len(set(sizes)) != len(sizes):
            fail("chunk_sizes", sizes, "expected each chunk size once")
        if sizes and self.chunk_size not in sizes:
            fail("chunk_size", self.chunk_size,
                 f"the multi-chunk model serves chunk_sizes={sizes}; pick one of them")
        check_int("decoder_width", self.decoder_width, 1)
        check_int("compressor_layers", self.compressor_layers, 0)
        check_bool("memory", self.memory)
        check_float("compressor_lr_scale", self.compressor_lr_scale, 0.0)


# --------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------

PATHS = ("per_chunk", "masked", "reference")


PREFILL_BLOCK_TOKENS = 256        # prompt tokens ``prefill`` reads per block (whole chunks)


class CATState(State):
    """Decoding state: per-layer KV caches of compressed slots + the current chunk.

    Cache layout: ``[g_0, f_0 .. f_{m-1}, (SEP,) tokens of chunk m fed so far]``.
    ``pending`` holds chunk m's tokens (B, j); they are compressed when it fills.
    """

    def __init__(self, caches: list[KVCache], chunk_size: int, pending: torch.Tensor,
                 n_chunks: int):
        self.caches = caches
        self.chunk_size = chunk_size
        self.pending = pending
        self.n_chunks = n_chunks

    @property
    def slots(self) -> int:
        """Filled KV slots per layer."""
        return self.caches[0].length

    def tensors(self) -> list[torch.Tensor]:
        return [t for c in self.caches for t in (c.k, c.v)] + [self.pending]


class CATLM(LanguageModel):
    """Compress & Attend Transformer (fixed chunk size, or multi-chunk with ``chunk_sizes``).

    ``forward(tokens, targets, chunk_size=None, path="per_chunk")``: the chunk
    size is the test-time knob (default ``model.chunk_size``; in training mode
    the multi-chunk model samples one per call, i.e. per optimisation step).
    ``path`` picks the decoder attention: ``per_chunk`` (fast, default),
    ``masked`` (interleaved sequence + the S x S mask on SDPA) or ``reference``
    (the same with plain softmax; records attention weights). All three agree.
    """

    trace_keys = ("compressed", "mask", "layer*.attn_weights", "layer*.compressed_share")
    # The slot layout's two pieces: a notebook plants a bug by swapping one in a subclass
    # (``class LateReadout(CATLM): readout_slots = staticmethod(...)``).
    interleave = staticmethod(interleave)
    readout_slots = staticmethod(readout_slots)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.chunk_sizes = tuple(sorted(cfg.chunk_sizes)) or (cfg.chunk_size,)
        self.multi_chunk = bool(cfg.chunk_sizes)
        self.width = cfg.d_model * cfg.decoder_width                       # D
        heads = cfg.n_head * cfg.decoder_width                             # same head dim
        depth = cfg.compressor_layers or max(1, cfg.n_layer // 4)
        max_chunks = math.ceil(cfg.seq_len / self.chunk_sizes[0])
        self.compressor = Compressor(cfg.vocab_size, cfg.d_model, cfg.n_head, depth,
                                     cfg.chunk_size, max_chunks, self.width, cfg.mlp_ratio,
                                     cfg.rope_base, cfg.norm_eps, chunk_sizes=cfg.chunk_sizes)
        self.embed = nn.Embedding(cfg.vocab_size, self.width)              # E_d
        self.blocks = nn.ModuleList(                                       # attn: CATAttention
            _decoder_block(self.width, heads, cfg.mlp_ratio, cfg.rope_base, cfg.norm_eps,
                           cfg.dropout)
            for _ in range(cfg.n_layer))
        self.norm = RMSNorm(self.width, cfg.norm_eps)
        self.head = nn.Linear(self.width, cfg.vocab_size, bias=False)
        # g_0: the dummy (fixed C) or the chunk-size indicator, one row per log2(C)
        rows = int(math.log2(self.chunk_sizes[-1])) + 1 if self.multi_chunk else 1
        self.opener = nn.Parameter(torch.empty(rows, self.width))
        self.separator = nn.Parameter(torch.empty(self.width)) if self.multi_chunk else None
        init_weights(self, cfg.init_std, cfg.n_layer)
        if self.separator is not None:
            keyed_normal_(self.separator, cfg.init_std, "separator")
        self._chunk_size = cfg.chunk_size
        self.training_chunk_size: int | None = None    # pin_training_chunk_size

    # --- the knob ------------------------------------------------------------------
    @property
    def chunk_size(self) -> int:
        """The chunk size used when none is passed (evaluation, generation)."""
        return self._chunk_size

    @chunk_size.setter
    def chunk_size(self, value: int) -> None:
        self._chunk_size = self._checked_chunk_size(value)

    def _checked_chunk_size(self, value) -> int:
        if value not in self.chunk_sizes or isinstance(value, bool):
            raise ValueError(f"chunk_size={value!r} is not allowed: this model serves "
                             f"{', '.join(map(str, self.chunk_sizes))}")
        return value

    def lr_scales(self) -> dict[str, float]:
        """{parameter name: lr factor}: the compressor learns at ``compressor_lr_scale`` x lr."""
        return {name: float(self.cfg.compressor_lr_scale)
                for name, _ in self.compressor.named_parameters(prefix="compressor")}

    def pin_training_chunk_size(self, value: int | None) -> None:
        """Train at ``value`` only (the bench's records); None: sample per call (the paper)."""
        self.training_chunk_size = None if value is None else self._checked_chunk_size(value)

    def _pick_chunk_size(self, chunk_size: int | None) -> int:
        """Explicit > training the multi-chunk model: pinned, else uniform per call > knob."""
        if chunk_size is not None:
            return self._checked_chunk_size(chunk_size)
        if self.training and self.multi_chunk:
            return self.training_chunk_size or \
                self.chunk_sizes[int(torch.randint(len(self.chunk_sizes), ()))]
        return self._chunk_size

    @property
    def separator_slots(self) -> int:
        return 1 if self.multi_chunk else 0

    def _opener(self, chunk_size: int) -> torch.Tensor:
        """g_0 for this chunk size: (D,)."""
        return self.opener[int(math.log2(chunk_size))] if self.multi_chunk else self.opener[0]

    def _compress(self, tokens: torch.Tensor, c: int, first_chunk: int = 0) -> torch.Tensor:
        """tokens (B, K*C) -> chunk vectors (B, K, D); all zero for the memory-less twin
        (``memory=False``). A zero slot stays zero through every layer (no biases, and it
        sees only zero slots), so it adds nothing to any token's attention. The product
        keeps the compressor in the graph, so DDP finds no unused parameter."""
        f = self.compressor(tokens, c, first_chunk=first_chunk)
        return f if self.cfg.memory else f * 0.0

    def max_tokens(self, chunk_size: int) -> int:
        """Longest sequence the chunk-index table covers at this chunk size."""
        return self.compressor.max_chunks * chunk_size

    # --- parallel forward ----------------------------------------------------------
    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                chunk_size: int | None = None, path: str = "per_chunk") -> ModelOutput:
        check_tokens(tokens, self.cfg.vocab_size, max_len=self.cfg.seq_len)
        if path not in PATHS:
            raise ValueError(f"path={path!r} is not allowed: expected one of {', '.join(PATHS)}")
        c = self._pick_chunk_size(chunk_size)
        return self.output(self._parallel(tokens, c, path), targets)

    def _parallel(self, tokens: torch.Tensor, c: int, path: str) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V) through the interleaved sequence."""
        b, t = tokens.shape
        k = math.ceil(t / c)
        padded = F.pad(tokens, (0, k * c - t))                               # (B, K*C)
        compressed = self._compress(padded, c)                              # (B, K, D)
        record("compressed", compressed)
        x = self.interleave(self.embed(padded).view(b, k, c, -1), compressed,
                            self._opener(c), self.separator)                # (B, S, D)
        sep = self.multi_chunk
        positions = slot_positions(k, c, sep, device=tokens.device)
        mask = None
        if path != "per_chunk" or is_tracing():
            mask = cat_mask(k, c, sep, device=tokens.device)                # (S, S)
            record("mask", mask)
        for i, block in enumerate(self.blocks):
            with scope(f"layer{i}"):
                wanted = is_tracing("attn_weights") or is_tracing("compressed_share")
                x = self._decoder_block(block, x, positions, k, c, mask,
                                        "reference" if wanted else path)
        h = x[:, self.readout_slots(k, c, sep, device=tokens.device)[:t]]   # (B, T, D)
        return self.head(self.norm(h))                                      # (B, T, V)

    def _decoder_block(self, block: Block, x: torch.Tensor, positions: torch.Tensor, k: int,
                       c: int, mask: torch.Tensor | None, path: str) -> torch.Tensor:
        """One pre-norm decoder block; its attention (``block.attn``, a CATAttention or a
        module swapped in for it) gets the layout. x: (B, S, D)."""
        options = {} if path == "per_chunk" else {"path": path, "mask": mask}
        h = block.attn(block.norm1(x), positions, n_chunks=k, chunk_size=c,
                       separator=self.multi_chunk, **options)
        x = x + block.drop(h)
        return x + block.drop(block.mlp(block.norm2(x)))

    # --- cached generation (docs/PAPERS.md, CAT equations) -------------------------
    def cache_slots(self, max_len: int, chunk_size: int) -> int:
        """KV slots per layer a state needs for ``max_len`` tokens: K_max + C (+1 with SEP).

        g_0, one compressed slot per finished chunk (K_max = max_len // C), the
        SEP, and at most C - 1 fed tokens of the current chunk (its last token is
        never fed: its prediction is read from the next compressed slot).
        """
        return 1 + max_len // chunk_size + self.separator_slots + chunk_size - 1

    def new_state(self, batch: int, max_len: int, chunk_size: int) -> CATState:
        p = next(self.parameters())
        n_head = self.blocks[0].attn.n_head
        slots = self.cache_slots(max_len, chunk_size)
        caches = [KVCache(batch, n_head, slots, self.width // n_head, p.device, p.dtype)
                  for _ in self.blocks]
        pending = torch.zeros(batch, 0, dtype=torch.long, device=p.device)
        return CATState(caches, chunk_size, pending, 0)

    def _decode(self, x: torch.Tensor, positions: torch.Tensor,
                caches: list[KVCache]) -> torch.Tensor:
        """Append slots x (B, n, D) at RoPE ``positions``; causal over everything cached."""
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block(x, positions, cache)
        return x

    def prefill(self, tokens: torch.Tensor, max_len: int | None = None,
                chunk_size: int | None = None, block_tokens: int = PREFILL_BLOCK_TOKENS):
        """Read the prompt into a state, ``block_tokens`` tokens (whole chunks) at a time.

        Returns the prompt's logits (B, T, V), equal to the parallel forward's, and a state
        holding g_0, f_0..f_{m-1} for the m complete chunks (RoPE 0), (SEP,) and the r
        leftover tokens. Each block of chunks is compressed, run through the decoder next
        to the cached compressed slots (``_prefill_chunks``) and leaves only its compressed
        slots in the cache, so memory stays near weights + state + one block's activations
        at any prompt length; ``block_tokens >= T`` reads the prompt in one go.
        """
        check_tokens(tokens, self.cfg.vocab_size, max_len=self.cfg.seq_len)
        check_int("block_tokens", block_tokens, 1)
        c = self._checked_chunk_size(chunk_size) if chunk_size is not None else self._chunk_size
        b, t = tokens.shape
        max_len = max(max_len or self.cfg.seq_len, t)
        if max_len > self.max_tokens(c):
            raise ValueError(f"max_len={max_len} is not allowed at chunk_size={c}: the "
                             f"chunk-index table covers {self.max_tokens(c)} tokens")
        state = self.new_state(b, max_len, c)
        opening, positions = [self._opener(c).expand(b, 1, -1)], [0]       # g_0 (, SEP_0)
        if self.multi_chunk:
            opening.append(self.separator.expand(b, 1, -1))
            positions.append(1)
        self._decode(torch.cat(opening, 1), torch.tensor(positions, device=tokens.device),
                     state.caches)
        m = t // c
        per_block = max(1, block_tokens // c)                                # chunks per block
        slot_width = c + self.separator_slots                                # per chunk, below
        caches = state.caches
        scratch = [KVCache(b, cache.k.shape[1], 1 + m + self.separator_slots
                           + min(per_block, m) * slot_width, cache.k.shape[3],
                           cache.k.device, cache.k.dtype) for cache in caches] if m else []
        logits = [self._prefill_chunks(tokens[:, first * c:min(first + per_block, m) * c],
                                       first, c, caches, scratch)
                  for first in range(0, m, per_block)]
        tail = tokens[:, m * c:]                                             # (B, r), r < C
        if tail.shape[1]:
            offset = 1 + self.separator_slots
            out = self._decode(self.embed(tail), torch.arange(
                tail.shape[1], device=tokens.device) + offset, caches)
            logits.append(self.head(self.norm(out)))
        state.pending, state.n_chunks = tail.clone(), m                     # no view of the prompt
        return torch.cat(logits, 1), state

    def _prefill_chunks(self, tokens: torch.Tensor, first: int, c: int, caches: list[KVCache],
                        scratch: list[KVCache]) -> torch.Tensor:
        """Chunks ``first..first+R-1`` of a prompt (tokens (B, R*C)) -> their logits (B, R*C, V).

        The cache holds ``[g_0, f_0..f_{first-1}, (SEP)]``. The block's slots are, chunk by
        chunk, ``[x_0..x_{C-2}, f_k, (SEP)]``: the last token of a chunk is not needed (its
        prediction is read at f_k or its SEP, and no other slot sees it), and f_k comes
        from the compressor, which reads raw tokens only. Each layer attends over the
        cached slots + the block under ``prefill_mask`` (CAT's visibility rule), working
        in ``scratch``; then the layer's cache keeps only the block's compressed slots
        (and the last SEP), as decoding would have left it.
        """
        b, n = tokens.shape
        r, sep = n // c, self.separator_slots
        width, device = c + sep, tokens.device                           # slots per chunk
        parts = [self.embed(tokens).view(b, r, c, -1)[:, :, :c - 1],
                 self._compress(tokens, c, first_chunk=first)[:, :, None]]
        if sep:
            parts.append(self.separator.expand(b, r, 1, -1))
        x = torch.cat(parts, 2).flatten(1, 2)                               # (B, R*width, D)
        offset = torch.arange(width, device=device)
        within = torch.where(offset < c - 1, offset + 1 + sep, offset - (c - 1))  # 0 f, 1 SEP
        positions = within.repeat(r)
        held = 1 + first + sep                                              # cached slots
        mask = prefill_mask(first, r, c, bool(sep), device)                # (R*width, held + .)
        keep = held + torch.cat([torch.arange(r, device=device) * width + c - 1,
                                 torch.tensor([r * width - 1] if sep else [], device=device,
                                              dtype=torch.long)])
        for block, cache, work in zip(self.blocks, caches, scratch, strict=True):
            work.reset()
            work.append(cache.k[:, :, :held], cache.v[:, :, :held])
            x = block(x, positions, work, mask=mask)
            cache.truncate(1 + first)                                       # drops the old SEP
            cache.append(work.k[:, :, keep], work.v[:, :, keep])
        read = torch.cat([torch.arange(c - 1, device=device),
                          torch.tensor([c - 1 + sep], device=device)])      # token j's slot
        h = x.view(b, r, width, -1)[:, :, read].flatten(1, 2)               # (B, R*C, D)
        return self.head(self.norm(h))

    def step(self, token: torch.Tensor, state: CATState):
        """Feed one token. Inside a chunk it takes the next slot; the chunk's last token
        is not fed: the chunk is compressed, its token slots (and SEP) are dropped and
        f (and SEP) are appended, whose output predicts the next chunk's first token."""
        token = token.reshape(-1, 1)                                         # (B, 1)
        check_tokens(token, self.cfg.vocab_size)
        c = state.chunk_size
        pending = torch.cat([state.pending, token], 1)                      # (B, j)
        offset = 1 + self.separator_slots
        if pending.shape[1] < c:
            position = torch.tensor([pending.shape[1] - 1 + offset], device=token.device)
            out = self._decode(self.embed(token), position, state.caches)
            state.pending = pending
        else:
            if state.n_chunks >= self.compressor.max_chunks:
                raise ValueError(f"generation past {self.max_tokens(c)} tokens is not allowed "
                                 f"at chunk_size={c}: the chunk-index table ends there")
            f = self._compress(pending, c, first_chunk=state.n_chunks)      # (B, 1, D)
            for cache in state.caches:
                cache.truncate(1 + state.n_chunks)
            parts, positions = [f], [0]
            if self.multi_chunk:
                parts.append(self.separator.expand(f.shape[0], 1, -1))
                positions.append(1)
            out = self._decode(torch.cat(parts, 1), torch.tensor(positions, device=f.device),
                               state.caches)
            state.n_chunks += 1
            state.pending = pending.new_zeros(pending.shape[0], 0)
        return self.head(self.norm(out[:, -1])), state


# --------------------------------------------------------------------------------------
# The reference forward: docs/PAPERS.md, CAT equations, step by step, no fast-path tricks
# --------------------------------------------------------------------------------------

def reference_forward(model: CATLM, tokens: torch.Tensor,
                      chunk_size: int | None = None) -> torch.Tensor:
    """CAT logits written out step by step. tokens (B, T) -> (B, T, V).

    Fixed-C and multi-chunk models: the compressor runs chunk by chunk, the
    interleaved sequence is built slot by slot, the decoder attends under the
    S x S ``masks.cat_mask`` with plain softmax (``reference_attention``), and
    the readout slot of each token follows the readout rule above. Uses the
    model's own parameters; eval-mode maths (no dropout). ``chunk_size``
    defaults to the model's knob. Tests check it equals ``model(tokens).logits``.
    """
    c = model._checked_chunk_size(model.chunk_size if chunk_size is None else chunk_size)
    b, t = tokens.shape
    k = math.ceil(t / c)
    padded = F.pad(tokens, (0, k * c - t))                  # (B, K*C)  tail padded with token 0
    f = _reference_compress(model.compressor, padded.view(b, k, c), c)     # (B, K, D)  f_0..f_K-1
    sep = model.separator                                   # (D,) multi-chunk only, else None
    width = c + (1 if sep is None else 2)                   # W: opener (+ SEP) + C tokens
    tokens_by_chunk = model.embed(padded).view(b, k, c, -1)  # (B, K, C, D)  E_d(x)
    openers = [model._opener(c).expand(b, -1)] + [f[:, i] for i in range(k)]  # g_0, g_k = f_k-1
    slots = []
    for group in range(k + 1):                              # group k: [g_k, (SEP,) chunk k]
        slots.append(openers[group][:, None])
        if sep is not None:
            slots.append(sep.expand(b, 1, -1))
        if group < k:                                       # the last group is [f_K-1 (, SEP)]
            slots.append(tokens_by_chunk[:, group])
    x = torch.cat(slots, dim=1)                             # (B, S, D)  S = K*W + 1 (+1)
    positions = torch.arange(x.shape[1], device=x.device) % width          # RoPE: n mod W
    mask = cat_mask(k, c, sep is not None, device=x.device)                # (S, S)
    for block in model.blocks:                              # plain softmax under the CAT mask
        x = block(x, positions, reference=True, mask=mask, causal=False)
    lead = width - c                                        # slots before a group's tokens
    rows = [i // c * width + lead + i % c if i % c < c - 1  # own slot,
            else (i // c + 1) * width + lead - 1            # last of a chunk: f_k (or its SEP)
            for i in range(t)]
    return model.head(model.norm(x[:, rows]))               # (B, T, V)


def _reference_compress(compressor: Compressor, chunks: torch.Tensor, c: int) -> torch.Tensor:
    """Each chunk on its own (``Compressor``). chunks (B, K, C) token ids -> f (B, K, D)."""
    b, k, _ = chunks.shape
    d = compressor.embed.embedding_dim
    w_f = compressor.proj.weight                            # (D, C_max * d)
    if c != compressor.chunk_size:                          # multi-chunk: bilinear resize of W_f
        w_f = F.interpolate(w_f[None, None], size=(w_f.shape[0], c * d), mode="bilinear",
                            align_corners=False)[0, 0]      # (D, C * d)
    out = []
    for index in range(k):
        prefix = [compressor.chunk_pos.weight[index].expand(b, 1, d)]      # p_k = ChunkPos[k]
        if compressor.size_token is not None:               # a_p, the chunk-size token, first
            prefix.insert(0, compressor.size_token.weight[int(math.log2(c))].expand(b, 1, d))
        z = torch.cat([*prefix, compressor.embed(chunks[:, index])], dim=1)  # (B, P+C, d)
        positions = torch.arange(z.shape[1], device=z.device)              # RoPE 0..P+C-1
        for block in compressor.blocks:                     # bidirectional attention
            z = block(z, positions, reference=True, causal=False)
        z = compressor.norm(z)[:, len(prefix):]             # (B, C, d)  prefix rows dropped
        out.append(z.reshape(b, c * d) @ w_f.T)             # (B, D)  f_k = W_f vec(Z)
    return torch.stack(out, dim=1)                          # (B, K, D)
