"""What one step asks of the machine, operator by operator (the roofline's three terms).

``count_step(fn)`` runs ``fn`` under a ``TorchDispatchMode``, which sees every aten operator
the step runs (after autograd, so the backward's too). Each operator that runs a kernel is
replayed right there, alone, on its own inputs (copies of the ones it writes into), the
fastest of a few calls; a call's signature (operator, shapes, strides, dtype, arguments)
keeps its fastest replay in the run's ``ReplayCache``. Operators are sorted:

* **heavy** (the matmul family and the attention kernels, ``HEAVY_OPS``): the compute
  term. Their FLOPs are counted by torch's formulas with the kit's two conventions
  (``flopcount.FLOP_FORMULAS``: the CPU flash-attention kernels counted, a causal
  kernel's skipped half not), so ``heavy_flops / heavy_s`` is the speed the step's own
  matmuls reach;
* **views** (``func.is_view``: reshape, transpose, slicing): no kernel, neither replayed
  nor counted as launches;
* **other** (elementwise, norms, copies, reductions, indexing): the memory term, with the
  bytes of their distinct input and output tensors (each read or written at least once).

Before that, ``fn`` runs once under ``torch.profiler``: ``host_share`` is the share of that
call's wall time spent *outside* every operator, the Python that issues them (module
calls, the mechanism's own code, building the state). On a CPU at batch 1 it is most of a
decoding step: about 60% for the kit's small models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from blockmem_lite.measure.flopcount import FLOP_FORMULAS
from blockmem_lite.runtime import synchronize

aten = torch.ops.aten

HEAVY_OPS = (
    aten.mm, aten.addmm, aten.bmm, aten.baddbmm,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_cudnn_attention_backward,
)
REPLAY_TARGET_S = 5e-4                 # a timed replay batch lasts at least about this long
REPLAY_ROUNDS = 3                      # timed batches per replay (the fastest counts)
MAX_REPLAY_BATCH = 64
MAX_REPLAYS = 4                        # replays per call signature and run; later: the cache


@dataclass(frozen=True)
class StepCount:
    """One step's operators, by kind (module docstring). ``heavy_s`` / ``other_s`` are the
    replayed times as priced when the count was made; ``priced`` re-prices them from the
    run's cache, whose times only fall as more replays of the same call are seen."""

    launches: int            # operators that run a kernel: heavy + other (views excluded)
    heavy_ops: int
    views: int
    heavy_s: float           # the heavy operators' replayed time, summed
    heavy_flops: float       # their FLOPs by torch's formulas
    other_bytes: float       # bytes the other operators read and write
    other_s: float = 0.0     # the other operators' replayed time, summed
    host_share: float = 0.0  # share of the step's time outside any operator (profiler)
    steps: int = 1           # steps the count covers (its figures are per step)
    tally: tuple = ()        # ((signature, calls, heavy), ...) over ``steps`` steps

    @property
    def other_launches(self) -> int:
        return self.launches - self.heavy_ops

    def priced(self, cache: ReplayCache) -> StepCount:
        """This count with ``heavy_s`` / ``other_s`` from ``cache``'s current times."""
        heavy = sum(n * cache[key] for key, n, is_heavy in self.tally if is_heavy)
        other = sum(n * cache[key] for key, n, is_heavy in self.tally if not is_heavy)
        return dataclasses.replace(self, heavy_s=heavy / self.steps, other_s=other / self.steps)


class ReplayCache(dict):
    """The fastest replayed seconds seen per call signature, shared by every model of one
    bench run: a call is replayed again where it recurs (the next layer, the next model),
    up to ``MAX_REPLAYS`` times, so a slow moment of the machine does not stay in the
    bound."""

    def __init__(self):
        super().__init__()
        self.replays: dict = {}                    # signature -> replays made
        self.call_overhead_s: float | None = None  # set by the first replay (below)

    def wants(self, key) -> bool:
        """Whether ``key`` is still to be replayed (fewer than ``MAX_REPLAYS`` so far)."""
        return self.replays.get(key, 0) < MAX_REPLAYS

    def record(self, key, seconds: float) -> None:
        self[key] = min(seconds, self.get(key, math.inf))
        self.replays[key] = self.replays.get(key, 0) + 1


def count_step(fn: Callable[[], object], device, cache: ReplayCache | None = None,
               steps: int = 1) -> StepCount:
    """Run ``fn`` twice: under the profiler (``host_share``), then under the counter;
    ``steps``: how many steps one call runs (the figures are per step)."""
    device = torch.device(device)
    cache = ReplayCache() if cache is None else cache
    share = host_share(fn, device)
    counter = _Counter(device, cache)
    with counter:
        fn()
    synchronize(device)
    c = counter
    per = 1.0 / steps
    return StepCount(round(c.launches * per), round(c.heavy_ops * per), round(c.views * per),
                     0.0, c.heavy_flops * per, c.other_bytes * per, 0.0, share, steps,
                     tuple((key, n, heavy) for (key, heavy), n in c.tally.items())
                     ).priced(cache)


def host_share(fn: Callable[[], object], device) -> float:
    """The share of one call of ``fn``'s wall time spent outside every operator: the wall
    time minus the operators that no other operator called (an autograd node's operators
    count as top level), over the wall time, by ``torch.profiler``."""
    device = torch.device(device)
    prof = profile(activities=[ProfilerActivity.CPU])
    with _quiet_stderr():
        prof.start()
    start = time.perf_counter()
    fn()
    synchronize(device)
    wall_us = 1e6 * (time.perf_counter() - start)
    with _quiet_stderr():
        prof.stop()
    inside_us = sum(event.time_range.elapsed_us() for event in prof.events()
                    if _is_operator(event) and not _inside_operator(event))
    return min(1.0, max(0.0, 1.0 - inside_us / wall_us)) if wall_us > 0 else 0.0


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to the null device: the profiler's C++ side prints a line as
    it starts and as it stops, which the bench's output does not need."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _is_operator(event) -> bool:
    return event.name.startswith("aten::")


def _inside_operator(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if _is_operator(parent):
            return True
        parent = parent.cpu_parent
    return False


class _Counter(TorchDispatchMode):
    def __init__(self, device: torch.device, cache: ReplayCache):
        super().__init__()
        self.device, self.cache = device, cache
        self.launches = self.heavy_ops = self.views = 0
        self.heavy_flops = self.other_bytes = 0.0
        self.tally: dict[tuple, int] = {}              # (signature, heavy) -> calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.is_view:
            self.views += 1
            return func(*args, **kwargs)
        self.launches += 1
        key = _signature(func, args, kwargs)
        if self.cache.wants(key):
            if self.cache.call_overhead_s is None:
                self.cache.call_overhead_s = _call_overhead_seconds(self.device)
            replay_args, replay_kwargs = _copies_of_written(func, args, kwargs)
            seconds = _replay_seconds(lambda: func(*replay_args, **replay_kwargs), self.device)
            self.cache.record(key, max(0.0, seconds - self.cache.call_overhead_s))
        out = func(*args, **kwargs)
        heavy = func.overloadpacket in HEAVY_OPS and not func._schema.is_mutable
        self.tally[(key, heavy)] = self.tally.get((key, heavy), 0) + 1
        if heavy:
            self.heavy_ops += 1
            formula = FLOP_FORMULAS.get(func.overloadpacket)
            if formula is not None:
                self.heavy_flops += formula(*args, **kwargs, out_val=out)
        else:
            self.other_bytes += _distinct_bytes(args, kwargs, out)
        return out


def _call_overhead_seconds(device: torch.device) -> float:
    """What the replay loop itself costs per call: calling an operator from Python (an
    ``OpOverload``, its arguments unpacked), measured on ``aten.alias``, which does no work.
    In the step that Python cost is the model's own (the launch term), so every replay
    subtracts it."""
    x = torch.ones(1, device=device)
    alias = torch.ops.aten.alias.default
    return _replay_seconds(lambda: alias(*(x,), **{}), device)


def _replay_seconds(call: Callable[[], object], device: torch.device) -> float:
    """Seconds of one ``call``: batches of calls lasting about ``REPLAY_TARGET_S`` (on an
    accelerator, so its queue hides the launch latency), the fastest batch's mean."""
    start = time.perf_counter()
    call()
    synchronize(device)
    first = time.perf_counter() - start
    batch = max(1, min(MAX_REPLAY_BATCH, math.ceil(REPLAY_TARGET_S / max(first, 1e-9))))
    best = math.inf
    for _ in range(REPLAY_ROUNDS):
        start = time.perf_counter()
        for _ in range(batch):
            call()
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / batch)
    return best


def _copies_of_written(func, args, kwargs) -> tuple[tuple, dict]:
    """``args`` / ``kwargs`` with a clone of every tensor ``func``'s schema says it writes."""
    if not func._schema.is_mutable:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if argument.kwarg_only or i >= len(args):
            if isinstance(kwargs.get(argument.name), torch.Tensor):
                kwargs[argument.name] = kwargs[argument.name].clone()
        elif isinstance(args[i], torch.Tensor):
            args[i] = args[i].clone()
    return tuple(args), kwargs


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _distinct_bytes(args, kwargs, out) -> int:
    """Bytes of the distinct tensors among the inputs and outputs (a tensor passed twice,
    or an in-place op's input that is also its output, counts once)."""
    seen, total = set(), 0
    for tensor in _tensors((args, kwargs, out)):
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def _signature(func, args, kwargs) -> tuple:
    """What a replay's time depends on: the operator, every tensor's shape, strides, dtype
    and device, and the other arguments."""
    def describe(value):
        if isinstance(value, torch.Tensor):
            return ("T", tuple(value.shape), tuple(value.stride()), value.dtype, str(value.device))
        if isinstance(value, (list, tuple)):
            return tuple(describe(v) for v in value)
        return value
    return (str(func), describe(args), tuple(sorted((k, describe(v)) for k, v in kwargs.items())))
