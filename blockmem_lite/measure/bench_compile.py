"""The bench's compiled entries (``--compile``): which models are compiled, and the untimed
warm-up that makes every recompilation happen before timing (``bench.py``'s docstring).

``ctx`` is the run's ``bench.BenchContext`` and ``entries`` its ``bench.Entry`` list; they are
not imported here, which would make the two modules import each other."""

from __future__ import annotations

import time

from blockmem_lite import registry
from blockmem_lite.compiling import compile_decoding, compile_training
from blockmem_lite.config import ModelConfig
from blockmem_lite.runtime import synchronize


def boundary_span(cfg: ModelConfig) -> int:
    """Tokens between the mechanism's boundaries (block, segment: its ``boundary`` knobs), 0
    for none: decoding runs another code path once per span."""
    values = []
    for name in registry.boundary_fields(cfg.arch):
        value = getattr(cfg, name)                      # an int, or a tuple (CAT's chunk_sizes)
        values.extend(value if isinstance(value, (tuple, list)) else [value])
    return max((int(v) for v in values if v is not None), default=0)


def compile_warmup_calls(ctx, entries: list) -> int:
    """Extra untimed decode calls (bursts) for compiled models: enough to cross the longest
    boundary span of ``entries`` once, plus one burst, so recompiles happen before timing."""
    if not ctx.compile:
        return 0
    span = max(boundary_span(e.cfg) for e in entries)
    return -(-(span + ctx.burst) // ctx.burst)


def compiled(ctx, model, phase: str):
    if not ctx.compile:
        return model
    return compile_training(model) if phase == "train" else compile_decoding(model)


def timed_warmup(ctx, entries: list, steps, phase: str) -> list:
    """Compiled models: run each step fn untimed (train: once; decode: the extra bursts) and
    return the wall seconds per entry (compilation included); None each when not compiling."""
    if not ctx.compile:
        return [None] * len(entries)
    calls = 1 if phase == "train" else compile_warmup_calls(ctx, entries)
    seconds = []
    for entry, step in zip(entries, steps, strict=True):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        synchronize(ctx.device)
        seconds.append(time.perf_counter() - start)
        ctx.log(f"{phase} {entry.arch} {entry.variant}".rstrip()
                + f": compiled, {calls} warm-up call(s) took {seconds[-1]:.1f} s")
    return seconds
