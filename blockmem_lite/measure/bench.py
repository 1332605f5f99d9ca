"""The bench protocol core: throughput, memory and state bytes vs dense, same run.

The protocol (docs/MEASUREMENTS.md, The benchmark protocol): same width/depth/vocab/dtype;
dense is timed in the same process, interleaved with every variant (A B A B
…), so ``ratio_vs_dense`` is immune to the ±20% drift of a shared machine;
each ratio is shown next to its analytic FLOP ceiling (``metrics.flops_per_token``).

This module names no mechanism. It asks the registry for each one's bench
options, its variants (how a sweep value becomes a config and a label), its
FLOP model and its special benchmarks; ``python -m blockmem_lite bench``
(``tools/bench_command.py``) lists them all.

Phases:

* ``train``: forward + backward on (batch, T) with the LM loss; **no optimizer
  step** (it costs the same for every architecture of a size); gradients are
  cleared after every step. Default batch: ``max(1, 4096 // T)`` sequences, so
  every length does about the same work per step.
* ``decode``: after a prefill of t = T tokens, the time of ``model.step``
  (tokens/s of decoding, batch 1 by default). Each timed sample runs
  ``decode_burst`` steps; ``ms_per_step`` is per token step. The rounds run in
  ``DECODE_BLOCKS`` blocks, each from a fresh prefill (the same contexts, t = T on), so
  the median spans three times the machine's time (a decoding round lasts about 0.3 s,
  and a slow second of a shared machine would otherwise hold most rounds). ``state_bytes`` is
  ``state.nbytes()`` after a prefill of exactly t tokens.
* ``compile=True`` (``--compile``): every model of the train / decode phases is
  compiled first (``compiling.compile_training`` / ``compile_decoding``); compiled
  decode entries get extra untimed warm-up bursts covering one block / segment (the
  mechanism's ``boundary_fields``) so every recompilation happens before timing, and
  their records say ``compiled: True`` with ``compile_warmup_s`` (the wall time of
  that warm-up, compilation included). Off by default (see ``compiling.py``).
* a mechanism's special benchmarks (``registry.SpecialBench``, e.g. ARMT's
  inference sweep ``infer`` and MoC's memory read ``read``): run with that
  mechanism by default, each given a ``BenchContext``.

Memory (one ``memory_bytes`` + ``memory_method`` per record, the other figures
under extra keys):

* ``"cuda_max_allocated"`` on CUDA: peak allocated during one step (decode:
  prefill + steps), after ``reset_peak_memory_stats``;
* ``"rss_subprocess"`` on CPU when ``rss`` is requested: the peak RSS of a fresh
  subprocess running the phase, *including* the interpreter + torch baseline;
  ``rss_base_bytes`` is that process's peak right after import + model build,
  so ``rss_peak_bytes - rss_base_bytes`` is what the phase added;
* ``"saved_tensors"`` on CPU when only ``saved`` is requested (train only):
  bytes of activations saved for backward (parameters excluded), deterministic;
* ``"none"`` when nothing applies (``--memory none``; decode with ``saved`` only).

Extra record keys: ``saved_bytes``, ``rss_peak_bytes``, ``rss_base_bytes``
(None when not measured), ``flops_per_token`` (analytic; train = 3 × forward),
``step_times_ms`` (every timed sample; decode: per token step), ``machine``,
``d_model``, ``n_layer``, ``n_head``, ``vocab_size``, ``params``, ``overrides``,
``warmup``, ``repeats``, ``load_avg_1m`` (the machine's 1-minute load average:
a busy machine slows multi-threaded kernels a lot, which the same-run ratios
cancel but absolute tokens/s do not).

Roofline (``roofline.py``): each run first measures the machine (``peak_flops_per_s``: a
square matmul in the run's dtype; ``peak_bytes_per_s``: a large copy; ``peak_launch_s``:
one tiny operator), printed in the table's header and stored in every record. Each
entry's step then runs once more under the operator counter (decode: a burst of token
steps of its own). Records carry ``flops_per_step`` (the analytic FLOPs per token x tokens
per step: B·T for train, B for one decode step), what the counter saw
(``counted_flops_per_step`` by torch's formulas, ``launches_per_step``, ``bytes_per_step``
of the non-matmul operators, ``matmul_flops_per_s``: the speed the step's own matmuls and
attention kernels reached), the three terms (``compute_ms``, ``memory_ms``,
``launch_ms``), ``roofline_bound`` (the binding term), ``roofline_ms`` (the bound per
step), ``roofline_fraction`` (``roofline_ms / ms_per_step``), ``bound_ceiling`` (dense's
bound / this one's: the ratio vs dense the machine allows) and ``frac_of_bound_ceiling``
(``ratio_vs_dense / bound_ceiling``; the table's notes explain a record above 1). All
None where a figure is missing (no FLOP model, peaks not measured, dense itself for the
ceiling).
"""

from __future__ import annotations

import itertools
import os
import platform
import sys
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from blockmem_lite import registry
from blockmem_lite.config import ModelConfig, check_backbone_fits
from blockmem_lite.measure import bench_steps, bench_table, metrics, roofline
from blockmem_lite.measure.bench_compile import (
    boundary_span,
    compile_warmup_calls,
    compiled,
    timed_warmup,
)
from blockmem_lite.measure.bench_table import (  # noqa: F401  (the output, read through here)
    format_records,
    rss_delta,
    text_table,
    write_json,
)
from blockmem_lite.measure.flops import flop_ceiling, training_flops_per_token
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import (
    AUTOCAST_DTYPES,
    PRECISIONS,
    pick_device,
    resolve_precision,
    seed_everything,
)
from blockmem_lite.validation import check_int, fail

PHASES = ("train", "decode")
MEMORY_CHOICES = ("saved", "rss", "none")
DTYPES = PRECISIONS               # auto: runtime.resolve_precision's choice for the card
TRAIN_TOKENS_PER_STEP = 4096     # default train batch = max(1, this // T)
DEFAULT_SEQ_LENS = (256, 1024, 4096)
RECORD_KEYS = ("arch", "variant", "phase", "seq_len", "batch", "tokens_per_s", "ms_per_step",
               "ratio_vs_dense", "flop_ceiling", "frac_of_ceiling", "memory_bytes",
               "memory_method", "state_bytes", "device", "dtype", "threads", "torch_version")
COUNTED_CALLS = 1    # calls of a decoding step fn the roofline's count makes
DECODE_BLOCKS = 3    # decoding is timed in this many blocks of rounds, each from the prefill
MAX_TIMED_STEPS = 1000   # most warm-up steps, timed steps or decoding burst a run takes
NO_MEMORY = {"memory_bytes": None, "memory_method": "none", "saved_bytes": None,
             "rss_peak_bytes": None, "rss_base_bytes": None}


# --------------------------------------------------------------------------------------
# What the registry contributes
# --------------------------------------------------------------------------------------

def resolve_archs(names) -> list[str]:
    """Validate architecture names against the registry; dense-first order is kept."""
    names = [names] if isinstance(names, str) else list(names)
    resolved = []
    for name in names:
        registry.get(name)                                   # clear error for unknown names
        if name not in resolved:
            resolved.append(name)
    if not resolved:
        fail("arch", names, f"give at least one of {', '.join(registry.names())}")
    return resolved


def special_benches(archs) -> dict[str, tuple[str, registry.SpecialBench]]:
    """phase name -> (arch, SpecialBench) for the special benchmarks of ``archs``."""
    return {special.name: (arch, special) for arch in archs
            for special in registry.bench_spec(arch).specials}


def resolve_phases(phases, archs: list[str]) -> tuple[str, ...]:
    """None: train, decode and every special bench of ``archs``; else each name checked."""
    specials = special_benches(archs)
    if phases is None:
        return PHASES + tuple(specials)
    phases = tuple([phases] if isinstance(phases, str) else phases)
    allowed = PHASES + tuple(specials)
    bad = [p for p in phases if p not in allowed]
    if bad or not phases:
        fail("phases", phases, f"expected one or more of {', '.join(allowed)} (special phases "
                               "come with their mechanism's --arch)")
    return phases


def format_table(records: list[dict]) -> str:
    """Every record as readable tables (``bench_table.format_records``)."""
    return format_records(records, PHASES, special_benches)


def default_batch(phase: str, seq_len: int) -> int:
    """Train: ``max(1, 4096 // T)`` (the same tokens per step at every T); decode: 1."""
    return max(1, TRAIN_TOKENS_PER_STEP // seq_len) if phase == "train" else 1


# --------------------------------------------------------------------------------------
# The context every phase (and every special benchmark) measures through
# --------------------------------------------------------------------------------------

@dataclass
class Entry:
    """One model under test at one length: dense or a variant."""

    arch: str
    variant: str
    overrides: dict
    cfg: ModelConfig


@dataclass
class BenchContext:
    """The settings of one bench run and the measuring tools, handed to special benches.

    ``base``: d_model, n_layer, n_head, vocab_size shared by every model;
    ``batch``: as given (None = the phase's default).
    """

    base: dict
    seq_lens: list[int]
    batch: int | None
    device: torch.device
    precision: str
    threads: int
    warmup: int
    repeats: int
    burst: int
    memory: tuple[str, ...]
    progress: bool
    peaks: roofline.Peaks | None = None     # the machine's measured limits (None: not measured)
    compile: bool = False

    # --- models ---------------------------------------------------------------------------
    def entry(self, arch: str, seq_len: int, variant: str = "",
              overrides: dict | None = None) -> Entry:
        """One model under test: ``arch`` at ``seq_len`` with the run's shared sizes."""
        overrides = dict(overrides or {})
        return Entry(arch, variant, overrides,
                     ModelConfig(arch, **{**self.base, "seq_len": seq_len, **overrides}))

    def entries(self, archs: list[str], seq_len: int, options: dict) -> list[Entry]:
        """Dense first (the baseline, always measured), then every variant of every arch."""
        entries = [self.entry(registry.BASELINE, seq_len)]
        for arch in archs:
            if arch == registry.BASELINE:
                continue
            for label, overrides in registry.bench_variants(arch, options):
                entries.append(self.entry(arch, seq_len, label, overrides))
        return entries

    def build(self, cfg: ModelConfig):
        seed_everything(0)
        return bench_steps.prepared_for_bench(build_model(cfg), cfg).to(self.device)

    # --- timing, memory, FLOPs ------------------------------------------------------------
    def time(self, step_fns: list[Callable[[], object]], tokens_per_call,
             blocks: Iterable[list[Callable[[], object]]] = ()) -> list[bench_steps.Timing]:
        """Time the functions interleaved (A B A B …); ``tokens_per_call``: int or one per fn.
        ``blocks``: further sets of the same functions (fresh ones: a decoding step's
        state restarts at its prefill), each timed interleaved in turn after ``step_fns``;
        the median runs over every block's rounds."""
        counts = tokens_per_call if isinstance(tokens_per_call, list) \
            else [tokens_per_call] * len(step_fns)
        times: list[list[float]] = [[] for _ in step_fns]
        for fns in itertools.chain([step_fns], blocks):
            block = bench_steps.time_interleaved(fns, warmup=self.warmup, repeats=self.repeats,
                                             device=self.device)
            for seconds, more in zip(times, block, strict=True):
                seconds += more
        return [bench_steps.summarize_times(t, n) for t, n in zip(times, counts, strict=True)]

    def rss(self, cfg: ModelConfig, phase: str, batch: int, seq_len: int, steps: int = 2) -> dict:
        """Peak RSS of a fresh process running ``phase`` (memory fields of a record)."""
        plugin = registry.plugin_file(cfg.arch)
        spec = {"model": cfg.to_dict(), "phase": phase, "batch": batch, "seq_len": seq_len,
                "steps": steps, "burst": self.burst, "threads": self.threads,
                "plugins": [plugin] if plugin else []}
        reading = metrics.peak_rss_subprocess(spec)
        return {"memory_bytes": reading.peak_bytes, "memory_method": "rss_subprocess",
                "rss_peak_bytes": reading.peak_bytes, "rss_base_bytes": reading.base_bytes}

    def infer_memory(self, cfg: ModelConfig, batch: int, seq_len: int) -> dict:
        """Peak memory of one inference call (``bench_steps.make_infer_step``), no other model built."""
        if "none" in self.memory:
            return dict(NO_MEMORY)
        if self.device.type == "cuda":
            model = self.build(cfg)
            step = bench_steps.make_infer_step(model, batch, seq_len, precision=self.precision)
            return {**NO_MEMORY, "memory_bytes": metrics.cuda_peak_bytes(step, self.device),
                    "memory_method": "cuda_max_allocated"}
        if "rss" in self.memory:
            return {**NO_MEMORY, **self.rss(cfg, "infer", batch, seq_len, steps=1)}
        return dict(NO_MEMORY)

    def infer_step(self, model, batch: int, seq_len: int) -> Callable[[], object]:
        return bench_steps.make_infer_step(model, batch, seq_len, precision=self.precision)

    def flops(self, cfg: ModelConfig, seq_len: int, decode: bool = False) -> float | None:
        return metrics.flops_per_token(cfg, seq_len, decode=decode)

    def ceiling(self, dense_flops, flops) -> float | None:
        return flop_ceiling(dense_flops, flops) if dense_flops and flops else None

    def step_cost(self, step_fn: Callable[[], object], *, tokens: int,
                  flops_per_token: float | None, steps: int = 1) -> dict:
        """The roofline inputs of one step, keyword arguments for ``record``:
        ``flops_per_step`` (the analytic FLOPs per token x ``tokens``, the tokens one step
        processes; train: 3 x the forward, as recorded) and ``count`` (``step_fn`` run once
        under ``roofline.count_step``, ``steps`` steps per call; None without peaks)."""
        count = None if self.peaks is None else \
            roofline.count_step(step_fn, self.device, steps)
        return {"flops_per_step": None if flops_per_token is None else flops_per_token * tokens,
                "count": count}

    def roofline_fields(self, flops_per_step, count: roofline.StepCount | None,
                        ms_per_step: float) -> dict:
        """The roofline keys of a record (module docstring); None where a figure is missing."""
        return bench_table.record_fields(count, self.peaks, self.device.type, flops_per_step,
                                      ms_per_step)

    # --- records --------------------------------------------------------------------------
    def record(self, *, arch: str, variant: str, phase: str, seq_len: int, batch: int,
               timing: bench_steps.Timing, ratio, ceiling, flops, memory: dict,
               state_bytes, model_fields: dict, params: int, overrides: dict,
               per_call: int = 1, flops_per_step: float | None = None,
               count: roofline.StepCount | None = None,
               baseline_roofline_ms: float | None = None, **extra) -> dict:
        """One record with every ``RECORD_KEYS`` key, the run's settings and ``extra`` keys.

        ``flops_per_step`` / ``count`` (from ``step_cost``) give the roofline keys; without
        them those keys are None. ``baseline_roofline_ms``: dense's bound at the same tokens
        per step, for the bound ceiling (None for dense itself).
        """
        ms_per_step = timing.ms_per_step / per_call
        roof = self.roofline_fields(flops_per_step, count, ms_per_step)
        return {
            "arch": arch, "variant": variant, "phase": phase, "seq_len": seq_len, "batch": batch,
            "tokens_per_s": timing.tokens_per_s, "ms_per_step": ms_per_step,
            "ratio_vs_dense": ratio, "flop_ceiling": ceiling,
            "frac_of_ceiling": ratio / ceiling if ratio is not None and ceiling else None,
            **{**NO_MEMORY, **memory}, "state_bytes": state_bytes,
            "device": self.device.type, "dtype": self.precision, "threads": self.threads,
            "torch_version": torch.__version__, "machine": machine(self.device),
            "flops_per_token": flops, **roof,
            **bench_table.bound_ceiling_fields(ratio, baseline_roofline_ms, roof["roofline_ms"]),
            "step_times_ms": [1000.0 * t / per_call for t in timing.times_s],
            **model_fields, "params": params, "overrides": overrides,
            "warmup": self.warmup, "repeats": self.repeats, "load_avg_1m": load_average(),
            **extra,
        }

    def log(self, message: str) -> None:
        if self.progress:
            print(f"[bench] {message}", file=sys.stderr, flush=True)


def model_fields(cfg: ModelConfig) -> dict:
    return {"d_model": cfg.d_model, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "vocab_size": cfg.vocab_size}


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"


def load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


# --------------------------------------------------------------------------------------
# The train and decode phases
# --------------------------------------------------------------------------------------

def _memory(ctx: BenchContext, entry: Entry, model, phase: str, batch: int,
            seq_len: int) -> dict:
    """The memory figures of one entry: primary bytes + method, and the extra keys."""
    out = dict(NO_MEMORY)
    if "none" in ctx.memory:
        return out
    if "saved" in ctx.memory and phase == "train":
        forward = bench_steps.make_train_forward(model, batch, seq_len, precision=ctx.precision)
        out["saved_bytes"] = metrics.saved_tensor_bytes(forward, exclude=model.parameters())
    if ctx.device.type == "cuda":
        if phase == "train":
            fn = bench_steps.make_train_step(model, batch, seq_len, precision=ctx.precision)
        else:
            def fn():
                bench_steps.make_decode_step(model, batch, seq_len, n_calls=1, burst=ctx.burst,
                                         precision=ctx.precision)()
        out.update(memory_bytes=metrics.cuda_peak_bytes(fn, ctx.device),
                   memory_method="cuda_max_allocated")
    elif "rss" in ctx.memory:
        out.update(ctx.rss(entry.cfg, phase, batch, seq_len))
    elif out["saved_bytes"] is not None:
        out.update(memory_bytes=out["saved_bytes"], memory_method="saved_tensors")
    return out


def _state_bytes(model, batch: int, seq_len: int, precision: str) -> int:
    """``state.nbytes()`` after a prefill of exactly ``seq_len`` tokens."""
    return int(bench_steps.prefill_state(model, batch, seq_len, precision=precision).nbytes())


def bench_phase(ctx: BenchContext, entries: list[Entry], phase: str, seq_len: int,
                batch: int) -> list[dict]:
    """Time every entry interleaved at one (phase, length); then memory; then records.

    ``entries[0]`` is the baseline (dense) every ratio is taken against.
    """
    if ctx.compile:
        torch._dynamo.reset()        # drop the graphs of earlier phases' (freed) models
    models = [ctx.build(e.cfg) for e in entries]
    extra = compile_warmup_calls(ctx, entries) if phase == "decode" else 0
    runners = [compiled(ctx, m, phase) for m in models]     # compiled once (if at all)
    if phase == "train":
        steps = [bench_steps.make_train_step(runner, batch, seq_len, precision=ctx.precision)
                 for runner in runners]
        tokens_per_call, per_call = batch * seq_len, 1
    else:
        def decode_steps():
            return [bench_steps.make_decode_step(runner, batch, seq_len,
                                             n_calls=ctx.warmup + ctx.repeats + extra,
                                             burst=ctx.burst, precision=ctx.precision)
                    for runner in runners]
        steps = decode_steps()
        tokens_per_call, per_call = batch * ctx.burst, ctx.burst
    warmup_s = timed_warmup(ctx, entries, steps, phase)
    blocks = 1 if phase == "train" else DECODE_BLOCKS
    ctx.log(f"T={seq_len} {phase} batch={batch}: timing {len(entries)} model(s) interleaved, "
            f"{blocks} x ({ctx.warmup} warm-up + {ctx.repeats} timed) round(s)")
    timings = ctx.time(steps, tokens_per_call,
                       blocks=(decode_steps() for _ in range(blocks - 1)))
    decode = phase == "decode"
    dense_flops = ctx.flops(entries[0].cfg, seq_len, decode)
    flops = [ctx.flops(entry.cfg, seq_len, decode) for entry in entries]
    recorded_flops = [training_flops_per_token(f) if f is not None and not decode else f
                      for f in flops]
    costs = [_step_cost(ctx, entry.cfg, model, phase, batch, seq_len, train_step, f)
             for entry, model, train_step, f in zip(entries, models, steps, recorded_flops,
                                                    strict=True)]
    del steps
    baseline_ms = ctx.roofline_fields(costs[0]["flops_per_step"], costs[0]["count"],
                                      timings[0].ms_per_step / per_call)["roofline_ms"]
    records = []
    for i, (entry, model, timing) in enumerate(zip(entries, models, timings, strict=True)):
        ctx.log(f"T={seq_len} {phase} {entry.arch} {entry.variant}".rstrip()
                + f": {timing.tokens_per_s:,.0f} tok/s; memory")
        baseline = i == 0                                   # the first entry is dense
        state_bytes = _state_bytes(model, batch, seq_len, ctx.precision) if decode else None
        records.append(ctx.record(
            arch=entry.arch, variant=entry.variant, phase=phase, seq_len=seq_len, batch=batch,
            timing=timing,
            ratio=None if baseline else timing.tokens_per_s / timings[0].tokens_per_s,
            ceiling=ctx.ceiling(dense_flops, flops[i]), flops=recorded_flops[i],
            memory=_memory(ctx, entry, model, phase, batch, seq_len), state_bytes=state_bytes,
            model_fields=model_fields(entry.cfg), params=model.num_params(),
            overrides=entry.overrides, per_call=per_call, compiled=ctx.compile,
            compile_warmup_s=warmup_s[i], baseline_roofline_ms=None if baseline else baseline_ms,
            **costs[i]))
    return records


def counted_decode_steps(ctx: BenchContext, cfg: ModelConfig) -> int:
    """Decoding steps the roofline counts per call: a burst or one boundary span."""
    return max(ctx.burst, boundary_span(cfg))


def counted_decode_tokens(ctx: BenchContext, entries: list[Entry]) -> int:
    """Tokens past t = T the roofline's count decodes (``COUNTED_CALLS`` calls)."""
    return COUNTED_CALLS * max(counted_decode_steps(ctx, e.cfg) for e in entries)


def _step_cost(ctx: BenchContext, cfg: ModelConfig, model, phase: str, batch: int,
               seq_len: int, train_step, flops_per_token) -> dict:
    """``ctx.step_cost`` of one entry: the timed train step itself, or decoding steps after
    a prefill of ``seq_len`` (a step fn of its own: the timed one's state is sized for the
    timed calls only), as many as a burst or one boundary span, whichever is longer, so a
    block / chunk / segment boundary counts as often as it comes."""
    if phase == "train":
        return ctx.step_cost(train_step, tokens=batch * seq_len, flops_per_token=flops_per_token)
    steps = counted_decode_steps(ctx, cfg)
    step = bench_steps.make_decode_step(model, batch, seq_len, n_calls=COUNTED_CALLS, burst=steps,
                                    precision=ctx.precision) if ctx.peaks is not None else None
    return ctx.step_cost(step, tokens=batch, flops_per_token=flops_per_token, steps=steps)


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------

def resolve_dtype(dtype: str, device: torch.device) -> str:
    """``runtime.resolve_precision`` with the bench's flag name in its errors."""
    if dtype not in DTYPES:
        fail("dtype", dtype, f"expected one of {', '.join(DTYPES)}")
    if dtype in AUTOCAST_DTYPES and device.type != "cuda":
        fail("dtype", dtype, f"{dtype} autocast is used only on CUDA, not on {device.type}; "
                             "use 'auto' or 'fp32'")
    return resolve_precision(device, dtype)


def _check_choices(name: str, values, allowed) -> tuple[str, ...]:
    values = tuple([values] if isinstance(values, str) else values)
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        fail(name, values, f"expected one or more of {', '.join(allowed)}")
    return values


def _check_run(seq_lens, batch, warmup: int, repeats: int, decode_burst: int) -> list[int]:
    seq_lens = list(seq_lens)
    if not seq_lens or any(isinstance(t, bool) or not isinstance(t, int) or t < 1
                           for t in seq_lens):
        fail("seq_lens", seq_lens, "expected integers >= 1")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        fail("batch", batch, "expected an integer >= 1 or None")
    bench_steps.check_timing_counts(warmup, repeats)
    check_int("warmup", warmup, 0, MAX_TIMED_STEPS)
    check_int("repeats", repeats, 1, MAX_TIMED_STEPS)
    check_int("decode_burst", decode_burst, 1, MAX_TIMED_STEPS)
    return seq_lens


def run_bench(archs=("dense",), seq_lens=DEFAULT_SEQ_LENS, *, batch: int | None = None,
              d_model: int = 256, n_layer: int = 4, n_head: int = 4, vocab_size: int = 256,
              threads: int | None = None, device: str = "auto", dtype: str = "auto",
              phases=None, warmup: int = 3, repeats: int = 5, decode_burst: int = 32,
              memory=("saved", "rss"), options: dict | None = None,
              progress: bool = True, compile: bool = False,
              roofline_seconds: float | None = None) -> list[dict]:
    """Benchmark dense and every variant of ``archs``; one record per (arch, variant, phase, T).

    ``phases``: None = train, decode and the special benches of ``archs``. ``batch``
    None: train ``max(1, 4096 // T)``, decode 1. ``memory``: any of "saved", "rss",
    or "none" (see the module docstring). ``options``: mechanism bench options by
    ``dest``, typed (``{"block_size": [64, 128]}``; defaults from the registry). ``compile``: torch.compile every model of
    the train / decode phases first (module docstring). ``roofline_seconds``: how long
    each of the three machine probes runs (``roofline.measure_peaks``; the command's
    default is ``roofline.PROBE_SECONDS``); None, the default here: no probes and no
    operator count, the roofline keys are None (a notebook's bench shows no roofline). Every argument is checked before any timing starts. Progress
    goes to stderr.
    """
    archs = resolve_archs(archs)
    seq_lens = _check_run(seq_lens, batch, warmup, repeats, decode_burst)
    phases = resolve_phases(phases, archs)
    memory = _check_choices("memory", memory, MEMORY_CHOICES)
    if not isinstance(compile, bool):
        fail("compile", compile, "expected True or False")
    dev = pick_device(device)
    precision = resolve_dtype(dtype, dev)
    opts = registry.checked_bench_options(options)
    base = dict(d_model=d_model, n_layer=n_layer, n_head=n_head, vocab_size=vocab_size)
    check_backbone_fits(ModelConfig(**base), dev, copies=1, what="weights")
    with bench_steps.pinned_threads(threads) as n_threads:
        ctx = BenchContext(base, seq_lens, batch, dev, precision, n_threads, warmup, repeats,
                           decode_burst, memory, progress, compile=compile)
        plan = _plan(ctx, archs, phases, opts)          # configs built (and checked) up front
        if roofline_seconds is not None:
            ctx.peaks = roofline.measure_peaks(dev, precision, roofline_seconds)
            ctx.log(f"machine: matmul {ctx.peaks.flops_per_s / 1e9:,.1f} GFLOP/s "
                    f"({ctx.peaks.dtype}), copy {ctx.peaks.bytes_per_s / 1e9:,.1f} GB/s "
                    f"({ctx.peaks.seconds:.1f} s)")
        records: list[dict] = []
        for phase, seq_len, entries in plan:
            records += bench_phase(ctx, entries, phase, seq_len,
                                   batch or default_batch(phase, seq_len))
        for name, (_, special) in special_benches(archs).items():
            if name in phases:
                records += special.run(opts, ctx)
    return records


def _plan(ctx: BenchContext, archs: list[str], phases, options: dict) -> list:
    """[(phase, T, entries)] for train/decode; raises for bad configs before any timing."""
    plan = []
    for seq_len in ctx.seq_lens:
        for phase in (p for p in PHASES if p in phases):
            # decoding runs past t = seq_len by the timed steps: configs must cover that
            extra = (ctx.warmup + ctx.repeats) * ctx.burst if phase == "decode" else 0
            entries = ctx.entries(archs, seq_len + extra, options)
            if phase == "decode" and counted_decode_tokens(ctx, entries) > extra:
                extra = counted_decode_tokens(ctx, entries)     # and the roofline's count
                entries = ctx.entries(archs, seq_len + extra, options)
            if phase == "decode" and ctx.compile:           # and the compiled warm-up's bursts
                extra += compile_warmup_calls(ctx, entries) * ctx.burst + 1   # + a spare slot
                entries = ctx.entries(archs, seq_len + extra, options)
            plan.append((phase, seq_len, entries))
    if "rss" in ctx.memory and ctx.device.type != "cuda":
        for arch in archs:
            registry.plugin_file(arch)                  # session-only mechanisms: say so now
    return plan
