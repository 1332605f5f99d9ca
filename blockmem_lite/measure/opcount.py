"""What one step asks of the machine, operator by operator (the roofline's three terms).

``count_step(fn)`` runs ``fn`` under a ``TorchDispatchMode``, which sees every aten operator
the step runs (after autograd, so the backward's too). Each operator that runs a kernel is
replayed right there, alone, on its own inputs (copies of the ones it writes into), the
fastest of a few calls; a call's signature (operator, shapes, strides, dtype, arguments)
keeps its fastest replay in the run's ``ReplayCache`` (and ``sweep`` replays a phase's
costliest calls once more, interleaved across its models). Operators are sorted:

* **heavy** (the matmul family and the attention kernels, ``HEAVY_OPS``): the compute
  term. Their FLOPs are counted by torch's formulas with the kit's two conventions
  (``flopcount.FLOP_FORMULAS``: the CPU flash-attention kernels counted, a causal
  kernel's skipped half not), so ``heavy_flops / heavy_s`` is the speed the step's own
  matmuls reach;
* **views** (``func.is_view``: reshape, transpose, slicing): no kernel, neither replayed
  nor counted as launches;
* **other** (elementwise, norms, copies, reductions, indexing): the memory term, with the
  bytes of their distinct input and output tensors (each read or written at least once).

**Warm or cold.** A replay right after the call finds the call's data in the nearest
cache; the step itself does not always. Before the counted call, ``fn`` runs once more
under a ``reuse.ReuseTracker``, which learns where the step last touched each block of
memory; the counted call then knows, for each operator and each cache level from L2 up
(``reuse.cache_levels``), how many of its bytes were touched longer ago than that level
holds, or never. A call with at least ``COLD_SHARE`` of its bytes, and ``MIN_COLD_BYTES``,
past a level is replayed past it: a buffer twice that level's size is read first,
then one call is timed, the fastest of a few counting. Measured on dense decoding at
t = 4096 (d=256; 1 MiB L2 a core, 32 MiB L3): the step reads its 32 MiB key/value cache
and 13 MiB of weights, so every matmul and attention call comes from DRAM. Its matmuls
took 1.44 ms a step in the step, 0.26 replayed warm, 1.36 past the L3; its attention
1.49, 0.49 and 1.21. Replayed warm, dense reached 48% of its bound and every mechanism,
whose state stays in the L3, decoded above its roofline ceiling (116-127%). At t = 1024
(d=128) the cache is 4 MiB and the weights 3 MiB: past the L2, in the L3, which warm
replays did not see either (dense at 62% of its bound against 66-67% for ARMT and HOnly:
106-108% of their ceilings). Where the cache sizes are unknown, or on an accelerator (a
single timed call there is mostly its launch, which the launch term already holds), every
replay is warm.

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
from blockmem_lite.measure.reuse import ReuseTracker, cache_levels
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
SWEEP_SHARE = 0.9                      # of a step's replayed time that ``sweep`` replays again,
SWEEP_ROUNDS = 1                       # in this many timed batches (a sample at another time)
COLD_SHARE = 0.5                       # a call whose far bytes reach this share is cold,
MIN_COLD_BYTES = 128 << 10             # and this many: below it a cold replay times the
                                       # flush's disturbance (code, TLB), not the data


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
    tally: tuple = ()        # (((signature, tier), calls, heavy), ...) over ``steps`` steps
    cold_launches: int = 0   # launches whose data lay past a cache level (module docstring)

    @property
    def other_launches(self) -> int:
        return self.launches - self.heavy_ops

    def costliest_calls(self, cache: ReplayCache, share: float = SWEEP_SHARE) -> list:
        """The signatures that make up ``share`` of the step's replayed time, costliest
        first (the ones ``sweep`` replays again: the rest, hundreds of small calls, sum to
        a few percent of a bound, and a cold one costs its flush each time)."""
        costs = sorted(((n * cache[key], key) for key, n, _ in self.tally),
                       key=lambda cost: cost[0], reverse=True)
        total, kept, out = sum(cost for cost, _ in costs), 0.0, []
        for cost, key in costs:
            if kept >= share * total:
                break
            out.append(key)
            kept += cost
        return out

    def priced(self, cache: ReplayCache) -> StepCount:
        """This count with ``heavy_s`` / ``other_s`` from ``cache``'s current times."""
        heavy = sum(n * cache[key] for key, n, is_heavy in self.tally if is_heavy)
        other = sum(n * cache[key] for key, n, is_heavy in self.tally if not is_heavy)
        return dataclasses.replace(self, heavy_s=heavy / self.steps, other_s=other / self.steps)


class ReplayCache(dict):
    """The fastest replayed seconds seen per call signature, shared by every model of one
    bench run: a call is replayed again where it recurs (the next layer, the next model),
    up to ``MAX_REPLAYS`` times, and once more in ``sweep``, so a slow moment of the
    machine does not stay in the bound."""

    def __init__(self):
        super().__init__()
        self.replays: dict = {}                    # signature -> replays made
        self.call_overhead_s: float | None = None  # set by the first replay (below)
        self.flush: dict[int, torch.Tensor] = {}   # cache size -> the buffer read first
        self.calls: dict = {}                      # signature -> _Call (what ``sweep`` replays)

    def wants(self, key) -> bool:
        """Whether ``key`` is still to be replayed (fewer than ``MAX_REPLAYS`` so far)."""
        return self.replays.get(key, 0) < MAX_REPLAYS

    def record(self, key, seconds: float) -> None:
        self[key] = min(seconds, self.get(key, math.inf))
        self.replays[key] = self.replays.get(key, 0) + 1


def count_step(fn: Callable[[], object], device, cache: ReplayCache | None = None,
               steps: int = 1, caches: tuple[int, ...] | None = None) -> StepCount:
    """Run ``fn`` under the profiler (``host_share``), then once to learn where every
    block of memory was last touched, then under the counter (three calls; two without
    cache levels); ``steps``: how many steps one call runs (the figures are per step).
    ``caches``: the cache sizes the reuse distances are measured against, smallest first
    (None: the device's, ``reuse.cache_levels``; (): every replay warm)."""
    device = torch.device(device)
    cache = ReplayCache() if cache is None else cache
    caches = cache_levels(device) if caches is None else tuple(sorted(caches))
    share = host_share(fn, device)
    counter = _Counter(device, cache, caches)
    if caches:
        with counter.tracking():                  # where each block was last touched
            fn()
    with counter:
        fn()
    synchronize(device)
    c = counter
    per = 1.0 / steps
    return StepCount(round(c.launches * per), round(c.heavy_ops * per), round(c.views * per),
                     0.0, c.heavy_flops * per, c.other_bytes * per, 0.0, share, steps,
                     tuple((key, n, heavy) for (key, heavy), n in c.tally.items()),
                     round(c.cold_launches * per)).priced(cache)


def host_share(fn: Callable[[], object], device) -> float:
    """The share of one call of ``fn``'s wall time spent outside every operator: the wall
    time minus the operators that no other operator called (an autograd node's operators
    count as top level), over the wall time, by ``torch.profiler``. It can run high for a
    step of many small operators: part of the profiler's own cost lies outside the
    operators and counts here (ARMT's training step at T = 1024: a share of 0.21, 87 ms of
    a 416 ms step, where the plain step minus the profiled operators leaves 66 ms;
    docs/MEASUREMENTS.md, "A record above its own bound")."""
    device = torch.device(device)
    prof = profile(activities=[ProfilerActivity.CPU])
    with _quiet_stderr():
        prof.start()
    start = time.perf_counter()
    fn()
    synchronize(device)
    wall_ns = 1e9 * (time.perf_counter() - start)
    with _quiet_stderr():
        prof.stop()
    inside_ns = _top_level_operator_ns(prof.profiler.kineto_results.events())
    return min(1.0, max(0.0, 1.0 - inside_ns / wall_ns)) if wall_ns > 0 else 0.0


def _top_level_operator_ns(events) -> int:
    """Nanoseconds spent inside ``aten::`` operators, an operator called by another counted
    once: per thread, the length of the union of the operators' spans (a nested call lies
    within its caller's span). Read from the profiler's raw events: ``prof.events()``
    builds a Python object and a parent link for each of them, which cost a class bench
    about a minute (1-3 s per counted training step) for the same figure to the ns."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for event in events:
        if event.name().startswith("aten::"):
            spans.setdefault(event.start_thread_id(), []).append(
                (event.start_ns(), event.start_ns() + event.duration_ns()))
    inside = 0
    for thread_spans in spans.values():
        covered_to = -1
        for begin, end in sorted(thread_spans):
            inside += max(0, end - max(begin, covered_to))
            covered_to = max(covered_to, end)
    return inside


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



class _Counter(TorchDispatchMode):
    def __init__(self, device: torch.device, cache: ReplayCache, caches: tuple[int, ...]):
        super().__init__()
        self.device, self.cache, self.caches = device, cache, caches
        self.launches = self.heavy_ops = self.views = self.cold_launches = 0
        self.heavy_flops = self.other_bytes = 0.0
        self.tally: dict[tuple, int] = {}              # ((signature, tier), heavy) -> calls
        self.reuse = ReuseTracker() if caches else None
        self.pricing = True                            # False: only touches are tracked

    @contextlib.contextmanager
    def tracking(self):
        """Within: the operators only mark what they touch (nothing counted or replayed)."""
        self.pricing = False
        try:
            with self:
                yield
        finally:
            self.pricing = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.pricing:
            out = func(*args, **kwargs)
            if not func.is_view:
                self.reuse.touch(list(_distinct_tensors((args, kwargs, out))))
            return out
        if func.is_view:
            self.views += 1
            return func(*args, **kwargs)
        self.launches += 1
        signature = _signature(func, args, kwargs)
        out = func(*args, **kwargs)
        tensors = list(_distinct_tensors((args, kwargs, out)))
        tier = self._tier(tensors)
        self.cold_launches += tier > 0
        key = (signature, tier)
        if self.cache.wants(key):
            self._replay(key, func, args, kwargs, out)
        heavy = func.overloadpacket in HEAVY_OPS and not func._schema.is_mutable
        self.tally[(key, heavy)] = self.tally.get((key, heavy), 0) + 1
        if heavy:
            self.heavy_ops += 1
            formula = FLOP_FORMULAS.get(func.overloadpacket)
            if formula is not None:
                self.heavy_flops += formula(*args, **kwargs, out_val=out)
        else:
            self.other_bytes += _nbytes(tensors)
        return out

    def _replay(self, key: tuple, func, args, kwargs, out) -> None:
        """Time ``func`` on copies of what it writes, warm or past the cache levels ``key``
        says (``_tier``); the first time, keep what ``sweep`` needs to replay it later."""
        if self.cache.call_overhead_s is None:
            self.cache.call_overhead_s = _call_overhead_seconds(self.device)
        replay_args, replay_kwargs = _copies_of_written(func, args, kwargs)
        tier = key[1]
        flush_size = self.caches[tier - 1] if tier else None
        if key not in self.cache.calls:
            self.cache.calls[key] = _Call(func, _template(args), _template(kwargs),
                                          _shapes(out), flush_size)
        _time_replay(self.cache, key, lambda: func(*replay_args, **replay_kwargs),
                     self.device, flush_size)

    def _tier(self, tensors: list[torch.Tensor]) -> int:
        """How many cache levels the call's data lay beyond: the levels past which at least
        ``COLD_SHARE`` of the bytes it read and wrote, and ``MIN_COLD_BYTES``, were last
        touched (0: warm; 1: past the smallest level, so from the next; ...). The call's
        blocks are marked touched now."""
        if self.reuse is None:
            return 0
        enough = max(MIN_COLD_BYTES, COLD_SHARE * _nbytes(tensors))
        return sum(far >= enough for far in self.reuse.visit(tensors, self.caches))


def _time_replay(cache: ReplayCache, key: tuple, call: Callable[[], object],
                 device: torch.device, flush_size: int | None,
                 rounds: int = REPLAY_ROUNDS, first_s: float | None = None) -> None:
    """Time ``call`` warm, or after a read of twice ``flush_size`` bytes, the fastest of
    ``rounds``, and record it under ``key`` (less the replay loop's own cost per call).
    ``first_s``: the seconds of a call just made (the sweep's check), which then stands
    for the untimed first call."""
    if flush_size:
        if flush_size not in cache.flush:
            cache.flush[flush_size] = torch.zeros(2 * flush_size // 4, device=device)
        seconds = _cold_replay_seconds(call, device, cache.flush[flush_size], rounds,
                                       warmed=first_s is not None)
    else:
        seconds = _replay_seconds(call, device, rounds, first_s)
    cache.record(key, max(0.0, seconds - cache.call_overhead_s))


# --------------------------------------------------------------------------------------
# The sweep: a phase's costliest calls replayed once more, the models' calls mixed
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _TensorTemplate:
    """A tensor argument, by what a replay's time depends on (not its values)."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: str


@dataclass(frozen=True)
class _Call:
    """What ``sweep`` needs to replay a call without the step's tensors."""

    func: object
    args: object                         # the arguments, tensors as ``_TensorTemplate``
    kwargs: object
    out_shapes: object                   # the step's output shapes, to check the replay's
    flush_size: int | None               # the cache level it is replayed past (None: warm)


def sweep(cache: ReplayCache, keys, device, seed: int = 0) -> int:
    """Replay each of ``keys`` (signatures ``cache`` has a call for) once more, on fresh
    tensors of the same shapes, strides and types, in a shuffled order; returns how many
    were replayed.

    A count replays a call where the step runs it, up to ``MAX_REPLAYS`` times, so a call
    that recurs in every layer is priced within one second of one model's count: a slow
    second stays in that model's bound alone, and moved dense's training bound at T = 256
    from 215-222 ms to 247 in one class run. Swept once all the models of a phase are
    counted, in an order that mixes their calls, every model's bound is priced over the
    same stretch of time, as its step is timed interleaved with the others'.

    A call whose replay on such tensors fails or gives other output shapes (its work
    depends on the values: a boolean mask, ``nonzero``) keeps the prices of its count."""
    device = torch.device(device)
    wanted = set(keys)
    order = [k for k in cache.calls if k in wanted]         # first replayed first
    generator = torch.Generator().manual_seed(seed)
    order = [order[i] for i in torch.randperm(len(order), generator=generator).tolist()]
    replayed = 0
    for key in order:
        call = cache.calls[key]
        args, kwargs = _materialise(call.args, generator), _materialise(call.kwargs, generator)
        start = time.perf_counter()
        try:
            matches = _shapes(call.func(*args, **kwargs)) == call.out_shapes
        except (RuntimeError, ValueError, IndexError):
            matches = False
        synchronize(device)
        if matches:                             # the check was the replay's first call
            _time_replay(cache, key, lambda c=call, a=args, kw=kwargs: c.func(*a, **kw),
                         device, call.flush_size, SWEEP_ROUNDS, time.perf_counter() - start)
            replayed += 1
        else:
            del cache.calls[key]                # not again
    return replayed


def _template(value):
    """``value`` with every tensor replaced by its ``_TensorTemplate``."""
    if isinstance(value, torch.Tensor):
        return _TensorTemplate(tuple(value.shape), tuple(value.stride()), value.dtype,
                               str(value.device))
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v) for v in value)
    if isinstance(value, dict):
        return {k: _template(v) for k, v in value.items()}
    return value


def _materialise(value, generator: torch.Generator):
    """``value`` with every ``_TensorTemplate`` made a tensor of its layout (zeros for
    integers and booleans, so an index is always in range; uniform in [0.5, 1) for
    floating point, away from a logarithm's or a division's zero)."""
    if isinstance(value, _TensorTemplate):
        span = 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride, strict=True)) \
            if all(value.shape) else 0
        base = torch.zeros(span, dtype=value.dtype)
        if value.dtype.is_floating_point:
            base.uniform_(0.5, 1.0, generator=generator)
        return base.to(value.device).as_strided(value.shape, value.stride)
    if isinstance(value, (list, tuple)):
        return type(value)(_materialise(v, generator) for v in value)
    if isinstance(value, dict):
        return {k: _materialise(v, generator) for k, v in value.items()}
    return value


def _shapes(value):
    """The shapes of the tensors in ``value``, nested as it is."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (list, tuple)):
        return tuple(_shapes(v) for v in value)
    return None


def _call_overhead_seconds(device: torch.device) -> float:
    """What the replay loop itself costs per call: calling an operator from Python (an
    ``OpOverload``, its arguments unpacked), measured on ``aten.alias``, which does no work.
    In the step that Python cost is the model's own (the launch term), so every replay
    subtracts it."""
    x = torch.ones(1, device=device)
    alias = torch.ops.aten.alias.default
    return _replay_seconds(lambda: alias(*(x,), **{}), device)


def _replay_seconds(call: Callable[[], object], device: torch.device,
                    rounds: int = REPLAY_ROUNDS, first_s: float | None = None) -> float:
    """Seconds of one ``call``: batches of calls lasting about ``REPLAY_TARGET_S`` (on an
    accelerator, so its queue hides the launch latency), the fastest batch's mean. The
    batch is sized by an untimed first call, or by ``first_s``, one made by the caller."""
    first = first_s
    if first is None:
        start = time.perf_counter()
        call()
        synchronize(device)
        first = time.perf_counter() - start
    batch = max(1, min(MAX_REPLAY_BATCH, math.ceil(REPLAY_TARGET_S / max(first, 1e-9))))
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batch):
            call()
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / batch)
    return best


def _cold_replay_seconds(call: Callable[[], object], device: torch.device,
                         flush: torch.Tensor, rounds: int = REPLAY_ROUNDS,
                         warmed: bool = False) -> float:
    """Seconds of one ``call`` after ``flush`` (twice a cache level) is read, evicting the
    call's inputs: the fastest of ``rounds`` such calls (one untimed call first, unless
    ``warmed``: the caller just made one)."""
    if not warmed:
        call()
    times = []
    for _ in range(rounds):
        flush.sum()                      # read: evicts without leaving lines to write back
        synchronize(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


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


def _distinct_tensors(values):
    """The tensors in ``values``, each once (a tensor passed twice, or an in-place op's
    input that is also its output, comes once)."""
    seen = set()
    for tensor in _tensors(values):
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        if key not in seen:
            seen.add(key)
            yield tensor


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


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
