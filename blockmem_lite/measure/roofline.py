"""The roofline: the machine's measured limits, and the bound they set on each step.

A FLOP ceiling says what a mechanism could gain over dense; the roofline says how close
a step comes to the machine at hand, and what the machine allows a mechanism to gain
(docs/MEASUREMENTS.md, Roofline). Three terms, from one counted step (``opcount.count_step``):

* **compute**: the step's matmuls and attention kernels, each replayed alone at its own
  shapes: its FLOPs at the speed this machine gives those shapes;
* **memory**: its other operators (elementwise, norms, copies, reductions), each replayed
  alone: bytes moved at the speed the machine gives those sizes;
* **launch**: issuing the operators. On a CPU the replays already hold each operator's
  dispatch, so this is the Python around them (``opcount.host_share`` x the measured step
  time: the model's own code, which no machine probe can know); on an accelerator it is
  that plus the step's operators x the launch probe.

On a CPU the host runs each operator to its end before it dispatches the next, so the
terms add up: ``bound = compute + memory + launch``. On an accelerator the host queues
launches while the device works: ``bound = max(launch, compute + memory)``. The record
names the largest term as its binding one; the fraction reached is bound / measured time
(1.0 = at the machine's limit), and the roofline ceiling vs dense is dense's bound over
the mechanism's.

**Departures from the plain roofline** ``max(FLOPs / matmul peak, bytes / bandwidth,
launches x t_launch)``, each found by a record above 105% of its ceiling:

1. *Each operator at its own shapes*, not one square-matmul peak and one copy bandwidth.
   With the peak, the class report's CAT trained at 126-156% of its ceiling: its 256-wide
   matmuls run at about 210 GFLOP/s where dense's 128-wide ones reach 120, so dense sat
   further below a shared peak than CAT (why a bigger model is not slower here). A 64 MiB
   copy's bandwidth likewise under-rates operators on tensors that stay in cache.
2. *The terms add on a CPU*: an operator's dispatch and its arithmetic run one after the
   other on the same core, so their maximum is a looser floor than the machine allows.
3. *The Python around the operators is measured*: the kit's decoding step spends about
   9 us per operator where the dispatch probe costs 2.5; without it the class report's
   MoC and HOnly decoded at 107-145% of their ceilings.
4. *An operator that meets its data past a cache level is replayed past it* (``opcount``'s
   docstring: the reuse distance of each block of memory against each level). Replayed warm,
   dense decoding at t = 4096 reached 48% of its bound, since its 32 MiB key/value cache
   and its weights come from DRAM every step, and every mechanism decoded at 116-127% of
   its ceiling; replayed cold, 51-62%.

The step itself is kept from page-faulting (``runtime.keep_freed_memory``): glibc handed
large freed tensors back to the system, so the next step's tensors faulted on every page
they wrote, 1,300-32,000 times a training step, by an amount that changed from step to
step and was in no replay. Dense's training step at T=256 swung between 220 and 250 ms
with it and reached 72-81% of its bound in the class report, against 84-88% for CAT's,
whose wider matmuls hide more of it.

Replays are floors measured in the run; a call recurring in the step, or in another
model of the run, is replayed again and priced at its fastest (``opcount.ReplayCache``),
and once every model of a phase is counted, the calls that make up 90% of each step are
replayed once more in a mixed order (``opcount.sweep``), so a slow moment of a shared
machine does not stay in one model's bound. Its speed still drifts by 10-20% between
seconds, which is why the bench names records above 105% rather than any test asserting
it on a live run (tests never assert wall-clock times).

**Why a narrow model sits further below its bound.** A replay prices a call at its
fastest; a step pays each call's typical time, and the gap is wider for short calls. On
the class machine dense's 1.8 ms matmuls typically ran 13-26% above their fastest call,
CAT's 11 ms ones 5%, so models whose steps are mostly small matmuls reach a smaller share
of their bounds, and a wide model's ratio to dense can pass its ceiling by a few percent
(docs/MEASUREMENTS.md, "Where the training records' spread comes from").

**The probes** (``measure_peaks``, about 1.5 s, once per bench run, with the run's threads
pinned; shown in the bench's header, and what each step's own speed is compared with):

* matmul FLOP/s: square n x n matmuls in the run's compute dtype (bf16 or fp16 under
  autocast, else fp32; n = 8192 on CUDA, 1024 elsewhere), 2·n³ FLOPs each, the
  fastest call of those timed;
* bandwidth: ``dst.copy_(src)`` of a large fp32 buffer (512 MiB on CUDA, 64 MiB
  elsewhere), read + write = 2 x its bytes, the fastest call. On a CPU whose
  last-level cache holds the buffer this is the cache's bandwidth, not DRAM's;
* launch: ``torch.add`` of two one-element tensors into a third, in batches of 1000, the
  fastest batch's mean: what dispatching one operator costs from Python.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from blockmem_lite.measure.opcount import StepCount
from blockmem_lite.runtime import AUTOCAST_DTYPES, synchronize
from blockmem_lite.validation import check_non_negative, check_positive

PROBE_SECONDS = 0.5                    # per probe (matmul, copy, launch): 1.5 s in all
LAUNCH_BATCH = 1000                    # launches per timed batch of the launch probe
TERMS = ("compute", "memory", "launch")
CEILING_TOLERANCE = 1.05     # a ratio vs dense above this x its roofline ceiling is named


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


def _fastest(fn, device: torch.device, seconds: float, min_calls: int = 3) -> float:
    """Seconds of the fastest of the timed calls of ``fn`` (one untimed call first), run
    until ``seconds`` have passed and at least ``min_calls`` were timed."""
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


def measure_peaks(device, precision: str = "fp32", seconds: float = PROBE_SECONDS, *,
                  matmul_n: int | None = None, copy_bytes: int | None = None) -> Peaks:
    """Measure matmul FLOP/s, copy bandwidth and the launch cost on ``device`` for about
    3 x ``seconds``.

    ``precision``: "bf16" / "fp16" measure matmuls in that dtype (what autocast runs),
    anything else fp32. ``matmul_n`` / ``copy_bytes`` override the sizes (tests use small ones).
    """
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
        matmul_s = _matmul_seconds(n, dtype, device, seconds)
        copy_s = _copy_seconds(size // 4, device, seconds)
        launch_s = _launch_seconds(device, seconds)
    return Peaks(flops_per_s=2.0 * n ** 3 / matmul_s, bytes_per_s=2.0 * (size // 4) * 4 / copy_s,
                 dtype=precision if precision in AUTOCAST_DTYPES else "fp32", matmul_n=n,
                 copy_bytes=size, seconds=time.perf_counter() - start, launch_s=launch_s)


def _matmul_seconds(n: int, dtype: torch.dtype, device: torch.device, seconds: float) -> float:
    """Fastest ``(n, n) @ (n, n)`` in ``dtype`` (the buffers are freed on return)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return _fastest(lambda: torch.mm(a, b, out=out), device, seconds)


def _copy_seconds(numel: int, device: torch.device, seconds: float) -> float:
    """Fastest copy of ``numel`` fp32 values into another buffer (freed on return)."""
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    return _fastest(lambda: dst.copy_(src), device, seconds)




def _launch_seconds(device: torch.device, seconds: float) -> float:
    """Seconds per launch of ``torch.add`` on one-element tensors (the fastest batch of
    ``LAUNCH_BATCH`` launches, divided by it; the device synchronised once per batch)."""
    a = torch.ones(1, device=device)
    out = torch.empty_like(a)

    def batch():
        for _ in range(LAUNCH_BATCH):
            torch.add(a, a, out=out)
    return _fastest(batch, device, seconds) / LAUNCH_BATCH


# --------------------------------------------------------------------------------------
# The bound
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bound:
    """A step's three terms and the bound they set (module docstring), in seconds."""

    compute_s: float
    memory_s: float
    launch_s: float
    seconds: float

    @property
    def binding(self) -> str:
        """The largest term: "compute", "memory" or "launch"."""
        terms = dict(zip(TERMS, (self.compute_s, self.memory_s, self.launch_s), strict=True))
        return max(terms, key=terms.get)


def bound(count: StepCount | None, peaks: Peaks | None, device_type: str,
          step_s: float | None) -> Bound | None:
    """The bound of one counted step on the machine ``peaks`` describes, whose measured
    time is ``step_s`` (None when anything is missing). ``device_type``: "cpu" adds the
    terms, any other takes the slower of the host's launches and the device's work."""
    if count is None or peaks is None or not step_s:
        return None
    compute_s, memory_s = count.heavy_s, count.other_s
    host_s = count.host_share * step_s                        # the Python around the operators
    if device_type == "cpu":                                  # dispatch: inside the replays
        return Bound(compute_s, memory_s, host_s, compute_s + memory_s + host_s)
    launch_s = host_s + count.launches * peaks.launch_s
    return Bound(compute_s, memory_s, launch_s, max(launch_s, compute_s + memory_s))


# --------------------------------------------------------------------------------------
# The bench's records
# --------------------------------------------------------------------------------------

def record_fields(count: StepCount | None, peaks: Peaks | None, device_type: str,
                  flops_per_step, ms_per_step: float) -> dict:
    """A bench record's roofline keys (``bench.py``'s docstring); None where a figure is
    missing."""
    limit = bound(count, peaks, device_type, ms_per_step / 1000.0 if ms_per_step else None)
    ms = None if limit is None else 1000.0 * limit.seconds
    return {"peak_flops_per_s": peaks.flops_per_s if peaks else None,
            "peak_bytes_per_s": peaks.bytes_per_s if peaks else None,
            "peak_launch_s": peaks.launch_s if peaks else None,
            "flops_per_step": flops_per_step,
            "counted_flops_per_step": count.heavy_flops if count else None,
            "launches_per_step": count.launches if count else None,
            "bytes_per_step": count.other_bytes if count else None,
            "matmul_flops_per_s": count.heavy_flops / count.heavy_s
            if count and count.heavy_s else None,
            **{f"{term}_ms": None if limit is None else 1000.0 * getattr(limit, f"{term}_s")
               for term in TERMS},
            "roofline_bound": None if limit is None else limit.binding, "roofline_ms": ms,
            "roofline_fraction": None if ms is None or not ms_per_step else ms / ms_per_step}


def bound_ceiling_fields(ratio, baseline_roofline_ms, roofline_ms) -> dict:
    """``bound_ceiling``: dense's bound / this record's (the same tokens per step), the
    ratio vs dense the machine allows; ``frac_of_bound_ceiling``: ``ratio`` / that. None
    for dense and where a bound is missing."""
    if ratio is None or not baseline_roofline_ms or not roofline_ms:
        return {"bound_ceiling": None, "frac_of_bound_ceiling": None}
    ceiling = baseline_roofline_ms / roofline_ms
    return {"bound_ceiling": ceiling, "frac_of_bound_ceiling": ratio / ceiling}


def ceiling_breaches(records: list[dict]) -> list[dict]:
    """The records above ``CEILING_TOLERANCE`` of their roofline ceiling vs dense."""
    return [r for r in records if (r.get("frac_of_bound_ceiling") or 0) > CEILING_TOLERANCE]


def breach_lines(records: list[dict]) -> list[str]:
    """A warning naming every record above its roofline ceiling ([] when none)."""
    breaches = ceiling_breaches(records)
    if not breaches:
        return []
    names = ", ".join(f"{r['arch']} {r['variant'] or ''} {r['phase']} T={r['seq_len']} "
                      f"({100 * r['frac_of_bound_ceiling']:.0f}%)".replace("  ", " ")
                      for r in breaches)
    return [f"above {100 * CEILING_TOLERANCE:.0f}% of the roofline ceiling (a term is missing, "
            f"a model is wrong, or the machine changed speed mid-run): {names}"]
