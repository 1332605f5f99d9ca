"""The roofline: three measured limits of the machine, and the bound they set on a step.

A FLOP ceiling says what a mechanism could gain over dense if time followed FLOPs. The
roofline asks the machine. Three probes (``measure_peaks``, about 1.5 s a bench run):

* **compute**: a square matmul's FLOP/s in the run's dtype;
* **memory**: a large copy's bandwidth, bytes read + written per second;
* **launch**: the time to dispatch one tiny operator from Python.

One counting pass over a step (``count_step``) gives what they price: the FLOPs of its
matmuls and attention kernels (torch's formulas, ``flopcount.FLOP_FORMULAS``), the bytes
its other operators read and write, and the operators it launches. Each term is a count
over its probe. On a CPU one core runs an operator to its end before it issues the next,
so the terms add; on an accelerator the host queues launches while the device works, so
the bound is the larger of the launches and the work. The largest term *binds*; the
roofline ceiling vs dense is dense's bound over the mechanism's.

The model is deliberately plain: every matmul at one square matmul's speed, every byte at
a large copy's, every launch a bare dispatch. A measured ratio can therefore pass its
roofline ceiling; the bench's table says whether that is the machine's noise or which of
the three simplifications it points at (``bench_table.ceiling_notes``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from blockmem_lite.measure.flopcount import FLOP_FORMULAS
from blockmem_lite.runtime import AUTOCAST_DTYPES, synchronize
from blockmem_lite.validation import check_non_negative, check_positive

PROBE_SECONDS = 0.5                    # per probe (matmul, copy, launch): 1.5 s in all
LAUNCH_BATCH = 1000                    # launches per timed batch of the launch probe
TERMS = ("compute", "memory", "launch")
aten = torch.ops.aten
HEAVY_OPS = (                          # the compute term: matmuls and attention kernels
    aten.mm, aten.addmm, aten.bmm, aten.baddbmm,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention, aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_cudnn_attention_backward,
)


# --------------------------------------------------------------------------------------
# The probes
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Peaks:
    """The machine's measured limits (``measure_peaks``)."""

    flops_per_s: float                 # matmul FLOP/s in ``dtype``
    bytes_per_s: float                 # copy bandwidth (read + write)
    dtype: str                         # "fp32", "bf16" or "fp16": the matmul dtype
    matmul_n: int
    copy_bytes: int                    # size of the copied buffer
    seconds: float                     # wall time the probes took
    launch_s: float                    # seconds to launch one small operator


def measure_peaks(device, precision: str = "fp32", seconds: float = PROBE_SECONDS, *,
                  matmul_n: int | None = None, copy_bytes: int | None = None) -> Peaks:
    """Matmul FLOP/s, copy bandwidth and the launch cost on ``device``, about 3 x
    ``seconds``. ``precision`` "bf16" / "fp16": matmuls in that dtype (what autocast runs),
    else fp32. ``matmul_n`` / ``copy_bytes`` override the sizes (tests use small ones)."""
    device = torch.device(device)
    check_non_negative("seconds", seconds)
    cuda = device.type == "cuda"
    n = matmul_n or (8192 if cuda else 1024)
    size = copy_bytes or ((512 if cuda else 64) << 20)
    check_positive("matmul_n", n)
    check_positive("copy_bytes", size)
    dtype = AUTOCAST_DTYPES.get(precision, torch.float32)
    start = time.perf_counter()
    with torch.no_grad():
        a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
        product = torch.empty(n, n, device=device, dtype=dtype)
        matmul_s = _fastest(lambda: torch.mm(a, b, out=product), device, seconds)
        src = torch.ones(size // 4, device=device)
        dst = torch.empty_like(src)
        copy_s = _fastest(lambda: dst.copy_(src), device, seconds)
        one, out = torch.ones(1, device=device), torch.empty(1, device=device)

        def launches():                 # a plain loop: nothing but the dispatches is timed
            for _ in range(LAUNCH_BATCH):
                torch.add(one, one, out=out)

        launch_s = _fastest(launches, device, seconds) / LAUNCH_BATCH
    return Peaks(flops_per_s=2.0 * n ** 3 / matmul_s, bytes_per_s=2.0 * src.nbytes / copy_s,
                 dtype=precision if precision in AUTOCAST_DTYPES else "fp32", matmul_n=n,
                 copy_bytes=size, seconds=time.perf_counter() - start, launch_s=launch_s)


def _fastest(fn, device: torch.device, seconds: float, min_calls: int = 3) -> float:
    """Seconds of the fastest timed call of ``fn`` (one untimed call first), timed until
    ``seconds`` have passed and at least ``min_calls`` calls were made."""
    fn()
    synchronize(device)
    best, calls, start = math.inf, 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
        calls += 1
    return best


# --------------------------------------------------------------------------------------
# The count and the bound
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepCount:
    """What one step asks of the machine (``count_step``), per step."""

    launches: int            # operators that run a kernel (views excluded)
    flops: float             # FLOPs of the matmuls and attention kernels
    bytes: float             # bytes the other operators read and write
    matmul_s: float          # wall time of the matmuls and attention kernels in the pass


class _Counter(TorchDispatchMode):
    """Counts every aten operator a step runs (after autograd: the backward's too)."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.launches, self.flops, self.bytes, self.matmul_s = 0, 0.0, 0.0, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.is_view:                                   # reshape, slicing: no kernel
            return func(*args, **kwargs)
        self.launches += 1
        if func.overloadpacket not in HEAVY_OPS:
            out = func(*args, **kwargs)
            self.bytes += sum(t.nbytes for t in _distinct_tensors((args, kwargs, out)))
            return out
        synchronize(self.device)
        start = time.perf_counter()
        out = func(*args, **kwargs)
        synchronize(self.device)
        self.matmul_s += time.perf_counter() - start
        formula = FLOP_FORMULAS.get(func.overloadpacket)
        self.flops += 0.0 if formula is None else formula(*args, **kwargs, out_val=out)
        return out


def count_step(fn, device, steps: int = 1) -> StepCount:
    """One call of ``fn`` counted operator by operator; ``steps``: how many steps the call
    runs (the figures are per step)."""
    counter = _Counter(torch.device(device))
    with counter:
        fn()
    synchronize(counter.device)
    return StepCount(round(counter.launches / steps), counter.flops / steps,
                     counter.bytes / steps, counter.matmul_s / steps)


def _distinct_tensors(value, seen=None):
    """The tensors in ``value`` (nested lists, tuples, dicts), each storage span once."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        key = (value.data_ptr(), value.numel(), value.dtype)
        if key not in seen:
            seen.add(key)
            yield value
    elif isinstance(value, (list, tuple, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _distinct_tensors(item, seen)


@dataclass(frozen=True)
class Bound:
    """A step's three terms and the bound they set, in seconds."""

    compute_s: float
    memory_s: float
    launch_s: float
    seconds: float

    @property
    def binding(self) -> str:
        """The largest term: "compute", "memory" or "launch"."""
        terms = dict(zip(TERMS, (self.compute_s, self.memory_s, self.launch_s), strict=True))
        return max(terms, key=terms.get)


def bound(count: StepCount | None, peaks: Peaks | None, device_type: str) -> Bound | None:
    """The bound ``peaks`` set on the counted step (None when either is missing).
    ``device_type`` "cpu": the terms add; any other: the larger of launches and work."""
    if count is None or peaks is None:
        return None
    compute = count.flops / peaks.flops_per_s
    memory = count.bytes / peaks.bytes_per_s
    launch = count.launches * peaks.launch_s
    work = compute + memory
    return Bound(compute, memory, launch, work + launch if device_type == "cpu"
                 else max(launch, work))
