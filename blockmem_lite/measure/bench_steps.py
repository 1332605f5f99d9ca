"""The bench's timing protocol and the workloads it times.

* **Timing**: threads pinned, at least 3 warm-up steps, the median of at least 5 timed
  steps, the device synchronised before each clock reading; several workloads are timed
  interleaved (A B A B ...) so that the machine's drift hits them all alike.
* **Workloads**: a training step (forward + backward), a prefill, decoding steps after a
  prefill, and streamed inference, each on fixed random tokens. The bench, the RSS
  subprocess (``metrics.peak_rss_subprocess``) and the FLOP checks (``flopcount``) run
  the same ones.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from blockmem_lite import registry
from blockmem_lite.compiling import is_decoding_compiled
from blockmem_lite.runtime import autocast_context, synchronize
from blockmem_lite.validation import check_positive


def prepared_for_bench(model, cfg):
    """``model`` after its mechanism's ``BenchSpec.prepare`` (if any) ran on it."""
    prepare = registry.bench_spec(cfg.arch).prepare
    if prepare is not None:
        prepare(model, cfg)
    return model


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
    check_positive("tokens_per_step", tokens_per_step)
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

    The state is sized for ``n_calls * burst`` further tokens (a compiled decoding step
    gets one spare slot: a dense cache filled exactly is a case it would recompile for),
    so the timed steps run at contexts ``context_len .. context_len + n_calls·burst``.
    """
    check_positive("n_calls", n_calls)
    check_positive("burst", burst)
    device = model.device
    spare = 1 if is_decoding_compiled(model) else 0
    state = prefill_state(model, batch, context_len,
                          capacity=context_len + n_calls * burst + spare,
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

    ``model.stream(prompt)``: by default a prefill into a state of exactly seq_len slots
    (dense: a KV cache that size); ARMT's reads segment by segment in constant memory.
    """
    device = model.device
    prompt = random_tokens(batch, seq_len, model.cfg.vocab_size, device, seed)

    def step():
        model.eval()
        with torch.no_grad(), autocast_context(device, precision):
            return model.stream(prompt)[1]

    return step
