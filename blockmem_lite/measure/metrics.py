"""Measuring speed and memory honestly, and the analytic FLOP model behind every ceiling.

Everything here follows docs/MEASUREMENTS.md (The benchmark protocol, The FLOP model):

* **FLOP model** (forward, per token; a multiply-add counts 2):
  ``flops_per_token(cfg)`` asks the registry for the mechanism's own formula
  (each mechanism module holds one; ``flops.py`` the shared dense pieces).
  Training costs 3× the forward. ``iso_flop_dense_config`` matches a dense
  model's depth to any mechanism's FLOPs.
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
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from blockmem_lite import registry
from blockmem_lite.compiling import is_decoding_compiled
from blockmem_lite.config import ModelConfig
from blockmem_lite.measure.flops import dense_layer_flops
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import (
    SavedTensorCounter,
    autocast_context,
    keep_freed_memory,
    seed_everything,
    synchronize,
)
from blockmem_lite.validation import check_positive

# --------------------------------------------------------------------------------------
# FLOP model: each mechanism registers its own formula (``flops.py`` holds the shared parts)
# --------------------------------------------------------------------------------------

def flops_per_token(cfg: ModelConfig, seq_len: int | None = None,
                    decode: bool = False) -> float | None:
    """Forward FLOPs per token of the model ``cfg`` describes, LM head included.

    ``seq_len``: the context (default ``cfg.seq_len``); ``decode=True``: one
    decoding step at that context. None where the mechanism has no FLOP model
    (or none for decoding). Training costs ``flops.training_flops_per_token``.
    """
    cfg = getattr(cfg, "model", cfg)
    mechanism = registry.get(cfg.arch)
    if mechanism.flops is None:
        return None
    return mechanism.flops(cfg, seq_len or cfg.seq_len, decode)


def iso_flop_dense_config(cfg: ModelConfig) -> ModelConfig:
    """A dense config with more layers and (nearly) the forward FLOPs per token of ``cfg``.

    Dense layers n = n_layer + (what ``cfg`` costs beyond a dense model of its depth)
    / (one dense layer's FLOPs), rounded to the nearest integer (halves up); width,
    heads, seq_len and vocabulary are kept. Works for any mechanism with a FLOP model.
    """
    cfg = getattr(cfg, "model", cfg)
    dense = dataclasses.replace(cfg, arch=registry.BASELINE)
    extra = flops_per_token(cfg) - flops_per_token(dense)
    n_layer = cfg.n_layer + math.floor(extra / dense_layer_flops(cfg.d_model, cfg.seq_len) + 0.5)
    return dataclasses.replace(dense, n_layer=max(1, n_layer))


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


# --------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------

def saved_tensor_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs.

    ``runtime.SavedTensorCounter``: tensors deduplicated by storage (views of one buffer
    count once), storages of ``exclude`` (e.g. ``model.parameters()``) skipped, so the
    figure is the activation memory a backward pass keeps. Deterministic for a given fn.
    """
    with SavedTensorCounter(exclude) as counter:
        fn()
    return counter.bytes


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


PROC_SELF_STATUS = Path("/proc/self/status")   # Linux: VmHWM, this program's peak RSS


def max_rss_bytes() -> int:
    """Peak RSS of this process so far, in bytes.

    Linux: ``VmHWM`` from /proc/self/status, the high-water mark of the running
    program only (``ru_maxrss`` keeps the *parent's* peak across fork + exec,
    which would hide the child's own figure). Other Unixes: ``ru_maxrss``, in
    bytes on macOS, KiB elsewhere. Windows (no ``resource``): psutil's peak
    working set.
    """
    try:
        for line in PROC_SELF_STATUS.read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024                        # reported in kB
    except OSError:                                                      # no /proc
        pass
    try:
        import resource
    except ImportError:                                                  # Windows
        return _peak_working_set_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _peak_working_set_bytes() -> int:
    """psutil's ``peak_wset`` (Windows' peak RSS); where psutil has no peak field, the
    current RSS (a lower bound of the peak)."""
    import psutil

    info = psutil.Process().memory_info()
    return int(getattr(info, "peak_wset", info.rss))


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
_CHILD_CODE = "from blockmem_lite.measure.metrics import _rss_child_main; _rss_child_main()"


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

    ``spec``: ``model`` (``ModelConfig.to_dict()``), ``plugins`` (files the child
    loads first, for plugin mechanisms; optional), ``phase`` ("train":
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
    env["PYTHONIOENCODING"] = "utf-8"          # its errors read whatever the code page
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD_CODE], input=json.dumps(spec),
                              capture_output=True, encoding="utf-8", errors="replace",
                              timeout=timeout, env=env)
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
    spec = json.loads(sys.stdin.read())
    keep_freed_memory()                        # as the timed process (runtime.py)
    for path in spec.get("plugins", []):
        registry.load_plugin(path)
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    seed = int(spec.get("seed", 0))
    steps = int(spec.get("steps", 2))
    seed_everything(seed)
    cfg = ModelConfig.from_dict(spec["model"])
    model = prepared_for_bench(build_model(cfg), cfg)
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

