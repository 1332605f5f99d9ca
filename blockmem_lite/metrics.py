"""Measuring speed and memory honestly, and the analytic FLOP model behind every ceiling.

Everything here follows the protocol in ``PERFORMANCE.md``:

* **FLOP model** (forward, per token, per layer; a multiply-add counts 2).
  ``FlopCounterMode`` counts 0 for CPU SDPA, so the kit uses formulas:
  dense ``24·d² + 2·T·d`` (``24·d²`` = the q/k/v/out projections, 8·d², plus
  the SwiGLU MLP, 16·d²; ``2·T·d`` = QKᵀ and AV over the causal half), and
  one function per mechanism. Training costs 3× the forward.
* **Timing**: threads pinned, ≥ 3 warm-up steps, median of ≥ 5 timed steps,
  the device synchronised before each clock reading; several workloads are
  timed interleaved (A B A B …) so machine drift hits them all alike.
* **Memory**: on CUDA ``max_memory_allocated`` after ``reset_peak_memory_stats``
  (method ``"cuda_max_allocated"``); on CPU the bytes of tensors saved for
  backward, deduplicated by storage (``"saved_tensors"``, deterministic), and
  the peak RSS of a *fresh* Python subprocess (``"rss_subprocess"``, the real
  figure, which includes the interpreter + torch baseline).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from blockmem_lite.runtime import autocast_context, synchronize

# --------------------------------------------------------------------------------------
# FLOP model (PERFORMANCE.md, "FLOP model"): forward FLOPs per token per layer.
# --------------------------------------------------------------------------------------

FLOP_ARCHS = ("dense", "block_local", "bcmt", "cat", "armt", "moc")
DECODE_FLOP_ARCHS = ("dense", "block_local", "bcmt", "cat", "armt")   # with decode=True
TRAIN_FLOP_FACTOR = 3  # forward + backward = 3 x forward (backward = 2 x forward)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name}={value!r} is not allowed: expected a positive number")


def _non_negative(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name}={value!r} is not allowed: expected a number >= 0")


def layer_matmul_flops(d_model: int) -> float:
    """``24·d²``: q/k/v/out projections (2·4·d²) + SwiGLU MLP (2·3·(8/3)·d²), per token."""
    _positive("d_model", d_model)
    return 24.0 * d_model * d_model


def dense_layer_flops(d_model: int, seq_len: int) -> float:
    """Dense causal layer, training/prefill: ``24·d² + 2·T·d`` per token.

    ``2·T·d``: QKᵀ and AV cost 4·d per key, and causal attention (the kernel
    skips the masked half) sees T/2 keys on average.
    """
    _positive("seq_len", seq_len)
    return layer_matmul_flops(d_model) + 2.0 * seq_len * d_model


def dense_decode_layer_flops(d_model: int, context_len: int) -> float:
    """Dense layer, one decoding step at context ``t``: ``24·d² + 4·t·d``.

    Not in PERFORMANCE.md's list but derived the same way: the single new
    query attends to all t cached keys (no causal half), 4·d per key.
    """
    _positive("context_len", context_len)
    return layer_matmul_flops(d_model) + 4.0 * context_len * d_model


def block_local_layer_flops(d_model: int, block_len: int) -> float:
    """Block-local causal layer (BCMT, HOnly): ``24·d² + 2·L·d`` per token.

    The summary/decay term is negligible and left out, as in PERFORMANCE.md.
    Per token this is also the average cost of decoding inside a block.
    """
    _positive("block_len", block_len)
    return layer_matmul_flops(d_model) + 2.0 * block_len * d_model


def bcmt_layer_flops(d_model: int, block_len: int, seq_len: int) -> float:
    """BCMT layer: block-local attention plus the memory path, per token.

    ``24·d² + 2·L·d`` (block-local) ``+ 2·d²`` (gate on U; the gate's P half, the
    memory projection W_p and the summary pooling cost ``4·d²/L + 4·d`` per token)
    ``+ 2·N·d/L`` (the N x N decay mix over N = T/L summaries). The gate is not
    negligible: it is the kit's design choice (MECHANISMS.md 1.2 step 6) and
    costs about 8% of the layer, which lowers BCMT's ceiling below block-local's.
    """
    _positive("block_len", block_len)
    _positive("seq_len", seq_len)
    n_blocks = -(-seq_len // block_len)
    memory_path = (2.0 * d_model ** 2 + 4.0 * d_model ** 2 / block_len + 4.0 * d_model
                   + 2.0 * n_blocks * d_model / block_len)
    return block_local_layer_flops(d_model, block_len) + memory_path


def cat_decoder_layer_flops(d_decoder: int, chunk_size: int, seq_len: int) -> float:
    """CAT decoder layer of width D: ``(1 + 1/C)·[24·D² + 2·D·(C + T/C)]`` per token.

    (1 + 1/C): one compressed slot per chunk of C tokens; each query sees its
    own chunk (C) and the T/C chunk vectors.
    """
    _positive("chunk_size", chunk_size)
    _positive("seq_len", seq_len)
    return (1.0 + 1.0 / chunk_size) * (
        layer_matmul_flops(d_decoder) + 2.0 * d_decoder * (chunk_size + seq_len / chunk_size))


def cat_decode_layer_flops(d_decoder: int, chunk_size: int, context_len: int) -> float:
    """CAT decoder layer, one decoding step at context ``t``:
    ``(1 + 1/C)·[24·D² + 4·D·(t/C + C/2)]``.

    Derived like ``dense_decode_layer_flops``: the new query sees every cached
    chunk vector (t/C) and on average half of its own chunk, 4·D per key; the
    compressed slot written once per chunk adds the 1/C.
    """
    _positive("chunk_size", chunk_size)
    _positive("context_len", context_len)
    return (1.0 + 1.0 / chunk_size) * (
        layer_matmul_flops(d_decoder)
        + 4.0 * d_decoder * (context_len / chunk_size + chunk_size / 2.0))


def cat_compressor_flops(d_compressor: int, chunk_size: int, depth_ratio: float) -> float:
    """CAT compressor, per token per decoder layer: ``ρ·[24·d² + 4·d·(C+1)]``.

    ρ = compressor depth / decoder depth; attention is bidirectional over the
    C + 1 slots of a chunk (no causal half, hence 4·d per key).
    """
    _positive("chunk_size", chunk_size)
    _non_negative("depth_ratio", depth_ratio)
    return depth_ratio * (layer_matmul_flops(d_compressor) + 4.0 * d_compressor * (chunk_size + 1))


def cat_projection_flops(d_compressor: int, d_decoder: int) -> float:
    """CAT projection W_f (D × C·d_f, once per chunk of C tokens): ``2·D·d_f`` per token.

    Paid once per model, not per layer.
    """
    _positive("d_compressor", d_compressor)
    _positive("d_decoder", d_decoder)
    return 2.0 * d_decoder * d_compressor


def cat_layer_flops(d_model: int, chunk_size: int, seq_len: int, *,
                    d_decoder: int | None = None, depth_ratio: float = 0.25) -> float:
    """CAT per decoder layer: decoder + compressor (projection excluded, see above).

    ``d_decoder`` defaults to ``d_model`` (same-width CAT); ``depth_ratio`` ρ
    defaults to 1/4 (compressor depth = decoder depth / 4).
    """
    width = d_model if d_decoder is None else d_decoder
    return (cat_decoder_layer_flops(width, chunk_size, seq_len)
            + cat_compressor_flops(d_model, chunk_size, depth_ratio))


def armt_layer_flops(d_model: int, segment_len: int, n_mem_tokens: int, d_mem: int) -> float:
    """ARMT layer, per token:
    ``(1 + m/S)·[24·d² + 2·d·(S + m)] + 14·d·d_mem + (m/S)·(2·d² + 26·d·d_mem)``.

    m memory tokens per segment of S tokens; the read (W_Q, qᵀA with DPFP ν=3,
    so d_key = 6·d_mem) runs for every token, the write once per memory token.
    """
    _positive("segment_len", segment_len)
    _non_negative("n_mem_tokens", n_mem_tokens)
    _positive("d_mem", d_mem)
    extra = n_mem_tokens / segment_len
    layer = (1.0 + extra) * (layer_matmul_flops(d_model)
                             + 2.0 * d_model * (segment_len + n_mem_tokens))
    read = 14.0 * d_model * d_mem
    write = extra * (2.0 * d_model * d_model + 26.0 * d_model * d_mem)
    return layer + read + write


def armt_decode_layer_flops(d_model: int, segment_len: int, n_mem_tokens: int,
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
    _positive("d_model", d_model)
    _positive("segment_len", segment_len)
    _non_negative("n_mem_tokens", n_mem_tokens)
    _positive("d_mem", d_mem)
    d, s, m = d_model, segment_len, n_mem_tokens
    token = layer_matmul_flops(d) + 2.0 * d * (s + 1) + 14.0 * d * d_mem
    write = 26.0 * d * d + 2.0 * d * (2 * s + m + 1) + 40.0 * d * d_mem
    return token + (m / s) * write


def armt_memory_flops(d_model: int, segment_len: int, n_mem_tokens: int, d_mem: int,
                      decode: bool = False) -> float:
    """The memory path inside ``armt_layer_flops`` (or ``armt_decode_layer_flops``), per token:
    ``14·d·d_mem + (m/S)·(2·d² + 26·d·d_mem)`` (decode: ``40·d·d_mem`` in the write term,
    since the m memory tokens also read). An unwrapped layer costs the ARMT layer minus this.
    """
    _positive("d_model", d_model)
    _positive("segment_len", segment_len)
    _non_negative("n_mem_tokens", n_mem_tokens)
    _positive("d_mem", d_mem)
    d, per_write = d_model, (40.0 if decode else 26.0) * d_model * d_mem
    return 14.0 * d * d_mem + (n_mem_tokens / segment_len) * (2.0 * d * d + per_write)


def moc_extra_flops(d_model: int, n_chapters: int, top_k: int, chapter_len: int,
                    route_every: int = 1) -> float:
    """What a MoC memory layer adds per token:
    ``4·d² + 4·d·(k+1)·T_ch + [2·d·n_chapters + 4·d²·(k+1)·T_ch] / route_every``.

    W_Q and W_O on every token (4·d²), the non-causal read over the shared + k
    routed chapters of ``chapter_len`` tokens (4·d per key), and, once per
    routing decision of ``route_every`` tokens (the routing window R, or T for
    the paper's per-sequence routing; 1 = per-token routing), the router and the
    K/V projection of the (k+1)·T_ch gathered memory tokens. PERFORMANCE.md's
    shorter formula charges the router per token and omits that projection,
    which dominates at kit scale when routes are short (R = 32).
    """
    _positive("d_model", d_model)
    _positive("n_chapters", n_chapters)
    _positive("top_k", top_k)
    _positive("chapter_len", chapter_len)
    _positive("route_every", route_every)
    read_tokens = (top_k + 1) * chapter_len
    per_route = 2.0 * d_model * n_chapters + 4.0 * d_model * d_model * read_tokens
    return 4.0 * d_model * d_model + 4.0 * d_model * read_tokens + per_route / route_every


def lm_head_flops(d_model: int, vocab_size: int) -> float:
    """The LM head: ``2·d·V`` per token, for every architecture."""
    _positive("d_model", d_model)
    _positive("vocab_size", vocab_size)
    return 2.0 * d_model * vocab_size


def _require(arch: str, **params) -> None:
    for name, value in params.items():
        if value is None:
            raise ValueError(f"{name}=None is not allowed for arch={arch!r}: "
                             f"the {arch} FLOP model needs {', '.join(params)}")


def model_flops_per_token(arch: str, *, d_model: int, n_layer: int, seq_len: int,
                          vocab_size: int = 256, include_head: bool = True,
                          decode: bool = False,
                          block_len: int | None = None,
                          chunk_size: int | None = None, d_decoder: int | None = None,
                          compressor_layers: int | None = None,
                          segment_len: int | None = None, n_mem_tokens: int | None = None,
                          d_mem: int | None = None,
                          n_chapters: int | None = None, top_k: int | None = None,
                          chapter_len: int | None = None, n_memory_layers: int | None = None,
                          route_every: int = 1) -> float:
    """Forward FLOPs per token of a whole model: ``n_layer · layer (+ extras) + head``.

    ``arch`` is a FLOP-model family (``FLOP_ARCHS``), not a registry name:
    dense; block_local (``block_len``); cat (``chunk_size``, optional
    ``d_decoder`` and ``compressor_layers``, default max(1, n_layer // 4); the
    W_f projection is added once and the head is at decoder width); armt
    (``segment_len``, ``n_mem_tokens``, ``d_mem``; ``n_memory_layers`` wrapped
    layers, default all, the others pay no read or write); moc (dense layers plus
    ``n_memory_layers`` × ``moc_extra_flops``, one route per ``route_every``
    tokens). ``decode=True`` gives one decoding step at context ``seq_len`` (the ``DECODE_FLOP_ARCHS``).
    Window sizes are capped at ``seq_len`` (a block longer than the sequence
    is the whole sequence).
    """
    if arch not in FLOP_ARCHS:
        raise ValueError(f"arch={arch!r} is not allowed: FLOP models exist for "
                         f"{', '.join(FLOP_ARCHS)}")
    _positive("n_layer", n_layer)
    _positive("seq_len", seq_len)
    if decode and arch not in DECODE_FLOP_ARCHS:
        raise ValueError(f"decode=True is not allowed for arch={arch!r}: a decoding FLOP "
                         f"model exists for {', '.join(DECODE_FLOP_ARCHS)} only")
    head_width = d_model
    if arch == "dense":
        layer = (dense_decode_layer_flops(d_model, seq_len) if decode
                 else dense_layer_flops(d_model, seq_len))
        total = n_layer * layer
    elif arch == "block_local":
        _require(arch, block_len=block_len)
        total = n_layer * block_local_layer_flops(d_model, min(block_len, seq_len))
    elif arch == "bcmt":
        _require(arch, block_len=block_len)
        total = n_layer * bcmt_layer_flops(d_model, min(block_len, seq_len), seq_len)
    elif arch == "cat":
        _require(arch, chunk_size=chunk_size)
        head_width = d_model if d_decoder is None else d_decoder
        depth = max(1, n_layer // 4) if compressor_layers is None else compressor_layers
        decoder = (cat_decode_layer_flops(head_width, chunk_size, seq_len) if decode
                   else cat_decoder_layer_flops(head_width, chunk_size, seq_len))
        total = (n_layer * decoder + depth * cat_compressor_flops(d_model, chunk_size, 1.0)
                 + cat_projection_flops(d_model, head_width))
    elif arch == "armt":
        _require(arch, segment_len=segment_len, n_mem_tokens=n_mem_tokens, d_mem=d_mem)
        segment = segment_len if decode else min(segment_len, seq_len)
        layer = (armt_decode_layer_flops(d_model, segment, n_mem_tokens, d_mem) if decode
                 else armt_layer_flops(d_model, segment, n_mem_tokens, d_mem))
        wrapped = n_layer if n_memory_layers is None else n_memory_layers
        if isinstance(wrapped, bool) or not isinstance(wrapped, int) or not 0 <= wrapped <= n_layer:
            raise ValueError(f"n_memory_layers={n_memory_layers!r} is not allowed for arch='armt':"
                             f" expected None (all layers) or 0..n_layer={n_layer}")
        total = n_layer * layer - (n_layer - wrapped) * armt_memory_flops(
            d_model, segment, n_mem_tokens, d_mem, decode=decode)
    else:
        _require(arch, n_chapters=n_chapters, top_k=top_k, chapter_len=chapter_len,
                 n_memory_layers=n_memory_layers)
        total = (n_layer * dense_layer_flops(d_model, seq_len)
                 + n_memory_layers * moc_extra_flops(d_model, n_chapters, top_k, chapter_len,
                                                     min(route_every, seq_len)))
    if include_head:
        total += lm_head_flops(head_width, vocab_size)
    return total


def training_flops_per_token(forward_flops: float) -> float:
    """Forward + backward = 3 × forward (the backward pass costs twice the forward)."""
    _non_negative("forward_flops", forward_flops)
    return TRAIN_FLOP_FACTOR * forward_flops


def flop_ceiling(dense_flops: float, variant_flops: float) -> float:
    """Best possible speed-up over dense if time were proportional to FLOPs: dense / variant."""
    _positive("dense_flops", dense_flops)
    _positive("variant_flops", variant_flops)
    return dense_flops / variant_flops


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------

@contextlib.contextmanager
def pinned_threads(threads: int | None):
    """Run the block with ``torch.set_num_threads(threads)``; restore afterwards."""
    if threads is None:
        yield torch.get_num_threads()
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads={threads!r} is not allowed: expected an integer >= 1 or None")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def check_timing_counts(warmup: int, repeats: int) -> None:
    """ValueError unless warmup >= 0 and repeats >= 1 (the protocol itself uses 3 and 5)."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} is not allowed: expected an integer >= 0 "
                         "(the protocol uses >= 3)")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} is not allowed: expected an integer >= 1 "
                         "(the protocol uses >= 5)")


def time_interleaved(step_fns: list[Callable[[], object]], *, warmup: int = 3, repeats: int = 5,
                     device: torch.device | str = "cpu") -> list[list[float]]:
    """Seconds per call of each function, timed interleaved: A B A B ...

    Each function first gets ``warmup`` untimed calls (in turn), then
    ``repeats`` rounds time every function once. The device is synchronised
    before each clock reading. Returns one list of ``repeats`` durations per fn.
    """
    check_timing_counts(warmup, repeats)
    for _ in range(warmup):
        for fn in step_fns:
            fn()
    synchronize(device)
    times: list[list[float]] = [[] for _ in step_fns]
    for _ in range(repeats):
        for i, fn in enumerate(step_fns):
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[i].append(time.perf_counter() - start)
    return times


@dataclass
class Timing:
    """A timing summary: median-based throughput and the raw durations (seconds)."""

    tokens_per_s: float
    ms_per_step: float
    times_s: list[float]


def summarize_times(times_s: list[float], tokens_per_step: int) -> Timing:
    """Median step time -> tokens/s and ms/step."""
    median = statistics.median(times_s)
    return Timing(tokens_per_s=tokens_per_step / median, ms_per_step=1000.0 * median,
                  times_s=list(times_s))


def measure_tokens_per_s(step_fn: Callable[[], object], tokens_per_step: int, *,
                         warmup: int = 3, repeats: int = 5, device: torch.device | str = "cpu",
                         threads: int | None = None) -> Timing:
    """Throughput of one workload: threads pinned, warm-up, median of timed steps."""
    _positive("tokens_per_step", tokens_per_step)
    with pinned_threads(threads):
        (times,) = time_interleaved([step_fn], warmup=warmup, repeats=repeats, device=device)
    return summarize_times(times, tokens_per_step)


# --------------------------------------------------------------------------------------
# Workloads: the measured phases, shared by bench and the RSS subprocess
# --------------------------------------------------------------------------------------

def random_tokens(batch: int, seq_len: int, vocab_size: int, device, seed: int = 0) -> torch.Tensor:
    """Deterministic random token ids (B, T)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=gen).to(device)


def make_train_forward(model, batch: int, seq_len: int, *, precision: str = "fp32",
                       seed: int = 0) -> Callable[[], torch.Tensor]:
    """The forward half of a training step on fixed random (batch, seq_len) data: the loss."""
    device = model.device
    tokens = random_tokens(batch, seq_len + 1, model.cfg.vocab_size, device, seed)
    x, y = tokens[:, :-1], tokens[:, 1:]                                   # (B, T) each

    def forward() -> torch.Tensor:
        model.train()
        with autocast_context(device, precision):
            return model(x, y).loss

    return forward


def make_train_step(model, batch: int, seq_len: int, *, precision: str = "fp32",
                    seed: int = 0) -> Callable[[], None]:
    """One training step: forward + backward on (batch, seq_len), no optimizer.

    Gradients are cleared (``set_to_none``) after each backward, so every step
    allocates them afresh; the optimizer update is left out on purpose (it
    costs the same for every architecture of the same size).
    """
    forward = make_train_forward(model, batch, seq_len, precision=precision, seed=seed)

    def step() -> None:
        forward().backward()
        model.zero_grad(set_to_none=True)

    return step


def prefill_state(model, batch: int, context_len: int, *, capacity: int | None = None,
                  precision: str = "fp32", seed: int = 0):
    """Prefill ``context_len`` random tokens (no grad, eval mode); return the state.

    ``capacity`` is the total length the state must hold (``max_len``).
    """
    device = model.device
    prompt = random_tokens(batch, context_len, model.cfg.vocab_size, device, seed)
    model.eval()
    with torch.no_grad(), autocast_context(device, precision):
        _, state = model.prefill(prompt, max_len=capacity or context_len)
    return state


def make_decode_step(model, batch: int, context_len: int, *, n_calls: int, burst: int = 1,
                     precision: str = "fp32", seed: int = 0) -> Callable[[], None]:
    """Decoding after a prefill of ``context_len`` tokens: each call runs ``burst`` steps.

    The state is sized for ``n_calls * burst`` further tokens, so the timed
    steps run at contexts ``context_len .. context_len + n_calls·burst``.
    """
    _positive("n_calls", n_calls)
    _positive("burst", burst)
    device = model.device
    state = prefill_state(model, batch, context_len, capacity=context_len + n_calls * burst,
                          precision=precision, seed=seed)
    feed = random_tokens(batch, n_calls * burst, model.cfg.vocab_size, device, seed + 1)
    position = 0

    def step() -> None:
        nonlocal state, position
        with torch.no_grad(), autocast_context(device, precision):
            for _ in range(burst):
                _, state = model.step(feed[:, position % feed.shape[1]], state)
                position += 1

    return step


def make_infer_step(model, batch: int, seq_len: int, *, precision: str = "fp32",
                    seed: int = 0) -> Callable[[], object]:
    """Inference over a (batch, seq_len) random prompt, no grad; each call returns the state.

    ``model.stream(prompt)`` where the model has one (ARMT: constant memory,
    last logits only), else ``model.prefill(prompt, max_len=seq_len)`` (dense:
    a KV cache of exactly seq_len slots, and the prompt's logits).
    """
    device = model.device
    prompt = random_tokens(batch, seq_len, model.cfg.vocab_size, device, seed)
    stream = getattr(model, "stream", None)

    def step():
        model.eval()
        with torch.no_grad(), autocast_context(device, precision):
            return stream(prompt)[1] if stream else model.prefill(prompt, max_len=seq_len)[1]

    return step


# --------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------

def saved_tensor_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs.

    Uses ``torch.autograd.graph.saved_tensors_hooks``; tensors are
    deduplicated by storage (views of one buffer count once) and storages of
    ``exclude`` (e.g. ``model.parameters()``) are skipped, so the figure is the
    activation memory a backward pass keeps. Deterministic for a given fn.
    """
    skipped = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[tuple[int, str], int] = {}
    keep_alive: list[torch.Tensor] = []   # so freed buffers cannot reuse a counted address

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        # A detached alias: returning ``tensor`` itself would tie each saved output to
        # its own graph node, a reference cycle that keeps every activation alive
        # after fn() returns (no backward runs here to break it).
        alias = tensor.detach()
        storage = alias.untyped_storage()
        if storage.data_ptr() not in skipped:
            storages.setdefault((storage.data_ptr(), str(alias.device)), storage.nbytes())
            keep_alive.append(alias)
        return alias

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    keep_alive.clear()
    return sum(storages.values())


def cuda_peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """``torch.cuda.max_memory_allocated`` over ``fn()``, after resetting the peak."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device={str(device)!r} is not allowed: cuda_peak_bytes needs CUDA")
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def max_rss_bytes() -> int:
    """Peak RSS of this process so far, in bytes.

    Linux: ``VmHWM`` from /proc/self/status, the high-water mark of the running
    program only (``ru_maxrss`` keeps the *parent's* peak across fork + exec,
    which would hide the child's own figure). Elsewhere ``ru_maxrss``: bytes
    on macOS, KiB on other Unixes.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024                        # reported in kB
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


@dataclass
class RssReading:
    """Peak RSS of a fresh subprocess, before and after the measured phase.

    ``base_bytes``: after importing torch + blockmem_lite and building the
    model (interpreter, libraries, weights). ``peak_bytes``: at the end, the
    lifetime peak including the baseline. ``delta_bytes`` = the phase's growth.
    """

    peak_bytes: int
    base_bytes: int

    @property
    def delta_bytes(self) -> int:
        return self.peak_bytes - self.base_bytes


RSS_PHASES = ("train", "decode", "infer")
_CHILD_CODE = "from blockmem_lite.metrics import _rss_child_main; _rss_child_main()"


def _check_rss_spec(spec: dict) -> None:
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        raise ValueError(f"spec={spec!r} is not allowed: expected a dict with a 'model' dict "
                         "(ModelConfig fields), 'phase', 'batch' and 'seq_len'")
    if spec.get("phase") not in RSS_PHASES:
        raise ValueError(f"spec['phase']={spec.get('phase')!r} is not allowed: expected one of "
                         f"{', '.join(RSS_PHASES)}")
    for key in ("batch", "seq_len"):
        value = spec.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"spec[{key!r}]={value!r} is not allowed: expected an integer >= 1")


def peak_rss_subprocess(spec: dict, timeout: float = 600.0) -> RssReading:
    """Run one measured phase in a fresh Python process and read its peak RSS.

    ``spec``: ``model`` (ModelConfig fields as a dict), ``phase`` ("train":
    forward+backward steps; "decode": prefill of ``seq_len`` tokens then
    decoding steps; "infer": ``make_infer_step`` calls), ``batch``,
    ``seq_len``, and optionally ``steps`` (2), ``burst`` (decode steps per
    call, 1), ``threads``, ``seed`` (0). The child runs on the CPU in fp32.
    The peak includes the interpreter + torch baseline (hundreds of MiB);
    ``RssReading.delta_bytes`` removes it.
    """
    _check_rss_spec(spec)
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD_CODE], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"RSS subprocess timed out after {timeout:.0f} s for "
                           f"phase={spec['phase']!r}, seq_len={spec['seq_len']}, "
                           f"batch={spec['batch']}; lower seq_len/batch or raise timeout") from err
    if done.returncode != 0:
        raise RuntimeError(f"RSS subprocess failed (exit code {done.returncode}) for "
                           f"phase={spec['phase']!r}, seq_len={spec['seq_len']}:\n"
                           f"{done.stderr.strip()[-2000:]}")
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return RssReading(peak_bytes=int(result["peak_bytes"]),
                          base_bytes=int(result["base_bytes"]))
    except (IndexError, ValueError, KeyError) as err:
        raise RuntimeError(f"RSS subprocess printed no reading; stdout was {done.stdout!r}, "
                           f"stderr was {done.stderr.strip()[-2000:]!r}") from err


def _rss_child_main() -> None:
    """Child side of ``peak_rss_subprocess``: spec JSON on stdin, reading JSON on stdout."""
    from blockmem_lite.config import ModelConfig
    from blockmem_lite.models import build_model
    from blockmem_lite.runtime import seed_everything

    spec = json.loads(sys.stdin.read())
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    seed = int(spec.get("seed", 0))
    steps = int(spec.get("steps", 2))
    seed_everything(seed)
    model = build_model(ModelConfig(**spec["model"]))
    base = max_rss_bytes()
    if spec["phase"] == "train":
        step = make_train_step(model, spec["batch"], spec["seq_len"], seed=seed)
    elif spec["phase"] == "infer":
        step = make_infer_step(model, spec["batch"], spec["seq_len"], seed=seed)
    else:
        step = make_decode_step(model, spec["batch"], spec["seq_len"], n_calls=steps,
                                burst=int(spec.get("burst", 1)), seed=seed)
    for _ in range(steps):
        step()
    print(json.dumps({"peak_bytes": max_rss_bytes(), "base_bytes": base}))

