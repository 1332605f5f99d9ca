"""The roofline: the machine's measured peaks, and each step's FLOPs and bytes moved.

A FLOP ceiling says what a mechanism could gain over dense; the roofline says how
close a step comes to the machine at hand (PERFORMANCE.md, "Roofline"). A step
that does F FLOPs and moves Q bytes cannot take less than

    bound time = max(F / peak FLOP/s, Q / bandwidth)

and it is *compute*-bound or *memory*-bound by whichever term is larger. The
fraction reached is bound time / measured time (1.0 = at the machine's limit).

**The peaks** (``measure_peaks``, about a second, once per bench run, with the run's
threads pinned: what its steps get):

* matmul FLOP/s: square n x n matmuls in the run's compute dtype (bf16 under bf16
  autocast, else fp32; n = 8192 on CUDA, 1024 elsewhere), 2·n³ FLOPs each, the
  fastest call of those timed;
* bandwidth: ``dst.copy_(src)`` of a large fp32 buffer (512 MiB on CUDA, 64 MiB
  elsewhere), read + write = 2 x its bytes, the fastest call. On a CPU whose
  last-level cache holds the buffer this is the cache's bandwidth, not DRAM's.

**The traffic model** (``step_bytes``; kit design, an analytic estimate of what a
well-fused implementation must move, so the bound is a floor on the time):

* ``P`` parameters at their storage size ``w`` (fp32: 4 B; the bf16 copies that
  autocast makes are not counted); activations at the compute dtype's size ``a``
  (bf16: 2 B, fp32: 4 B); ``S`` the decoding state's bytes (``State.nbytes()``).
* ``E`` activation elements one token writes in one forward, from the shared
  backbone's shape (``activation_elements``): per layer ``13·d + 4·h`` (h = the
  SwiGLU hidden width), plus ``2·d`` (embedding, final norm) and ``V`` (logits).
  A mechanism's own extra tensors are not counted (its bound is then a floor).
* **train** (forward + backward of B·T tokens): ``3·P·w + 3·(2·B·T·E·a)`` —
  weights read in the forward and in the backward, gradients written; each
  activation written and read once in the forward, and the backward moves twice
  that (it reads them back with the incoming gradients and writes gradients of
  the same shapes), like the 3x rule of the FLOP model.
* **prefill** (one no-grad forward of B·T tokens): ``P·w + 2·B·T·E·a + S``
  (the state written once).
* **decode** (one token step of B sequences): ``P·w + S + 2·B·E·a`` — every
  weight read once per step, the whole state read once (attention reads every
  cached key and value; a recurrent state is read once, its small updates not
  counted).

Parameters a mechanism reads sparsely (embedding rows, a memory bank) count
whole: an overestimate of the bytes where such a table is large.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from blockmem_lite.config import ModelConfig
from blockmem_lite.runtime import synchronize
from blockmem_lite.validation import check_non_negative, check_positive, fail

TRAFFIC_MODELS = ("train", "prefill", "decode")
PROBE_SECONDS = 0.5                    # per probe (matmul, copy): about a second in all
BACKBONE_LAYER_D = 13                  # d-wide tensors one block writes per token (see below)
BACKBONE_LAYER_H = 4                   # h-wide tensors (SwiGLU: gate, up, silu, product)
PARAM_BYTES = 4                        # parameters are stored in fp32


@dataclass(frozen=True)
class Peaks:
    """The machine's measured limits (``measure_peaks``)."""

    flops_per_s: float                 # matmul FLOP/s in ``dtype``
    bytes_per_s: float                 # copy bandwidth (read + write)
    dtype: str                         # "fp32" or "bf16": the matmul dtype
    matmul_n: int
    copy_bytes: int                    # size of the copied buffer
    seconds: float                     # wall time the probes took


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
    """Measure matmul FLOP/s and copy bandwidth on ``device`` for about 2 x ``seconds``.

    ``precision``: "bf16" measures bf16 matmuls (what bf16 autocast runs), anything
    else fp32. ``matmul_n`` / ``copy_bytes`` override the sizes (tests use small ones).
    """
    device = torch.device(device)
    check_non_negative("seconds", seconds)
    cuda = device.type == "cuda"
    n = matmul_n or (8192 if cuda else 1024)
    size = copy_bytes or ((512 if cuda else 64) << 20)
    check_positive("matmul_n", n)
    check_positive("copy_bytes", size)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    start = time.perf_counter()
    with torch.no_grad():
        matmul_s = _matmul_seconds(n, dtype, device, seconds)
        copy_s = _copy_seconds(size // 4, device, seconds)
    return Peaks(flops_per_s=2.0 * n ** 3 / matmul_s, bytes_per_s=2.0 * (size // 4) * 4 / copy_s,
                 dtype="bf16" if dtype == torch.bfloat16 else "fp32", matmul_n=n,
                 copy_bytes=size, seconds=time.perf_counter() - start)


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


# --------------------------------------------------------------------------------------
# The traffic model
# --------------------------------------------------------------------------------------

def mlp_hidden(cfg: ModelConfig) -> int:
    """The SwiGLU hidden width of the shared backbone (``nn.MLP``: ratio·d rounded up to 8)."""
    return int(8 * math.ceil(cfg.mlp_ratio * cfg.d_model / 8))


def activation_elements(cfg: ModelConfig) -> float:
    """``E``: activation elements one token writes in one forward of the shared backbone.

    Per block (``nn.Block``), d wide: norm1, q k v (3), RoPE'd q and k (2), the attention
    output, its merged heads, the out projection, the residual, norm2, the MLP's down
    projection, the residual = 13; h wide: gate, up, silu(gate), their product = 4.
    Plus the embedding and the final norm (2·d) and the logits (V).
    """
    cfg = getattr(cfg, "model", cfg)
    d, h = cfg.d_model, mlp_hidden(cfg)
    per_layer = BACKBONE_LAYER_D * d + BACKBONE_LAYER_H * h
    return float(cfg.n_layer * per_layer + 2 * d + cfg.vocab_size)


def activation_bytes(precision: str) -> int:
    """``a``: bytes of one activation element: 2 under bf16 autocast, else 4."""
    return 2 if precision == "bf16" else 4


def tokens_per_step(traffic: str, batch: int, seq_len: int) -> int:
    """Tokens one step processes: B·T for train and prefill, B for a decode step."""
    _check_traffic(traffic)
    return batch if traffic == "decode" else batch * seq_len


def step_bytes(cfg: ModelConfig, traffic: str, *, batch: int, seq_len: int, params: int,
               precision: str = "fp32", state_bytes: int | None = None) -> float:
    """Bytes one step moves by the traffic model (module docstring); ``traffic`` is one of
    train, prefill, decode; ``state_bytes`` (S) counts for prefill and decode (None: 0)."""
    _check_traffic(traffic)
    check_positive("batch", batch)
    check_positive("seq_len", seq_len)
    check_non_negative("params", params)
    weights = params * PARAM_BYTES
    forward_acts = 2.0 * tokens_per_step(traffic, batch, seq_len) * activation_elements(cfg) \
        * activation_bytes(precision)
    state = float(state_bytes or 0)
    if traffic == "train":
        return 3.0 * weights + 3.0 * forward_acts
    return weights + forward_acts + state


def bound(flops_per_step: float | None, bytes_per_step: float | None,
          peaks: Peaks | None) -> tuple[str | None, float | None]:
    """(``"compute"`` or ``"memory"``, the bound time in seconds) = the larger of
    flops / peak FLOP/s and bytes / bandwidth; (None, None) when anything is missing."""
    if peaks is None or flops_per_step is None or bytes_per_step is None:
        return None, None
    compute_s = flops_per_step / peaks.flops_per_s
    memory_s = bytes_per_step / peaks.bytes_per_s
    return ("compute", compute_s) if compute_s >= memory_s else ("memory", memory_s)


def _check_traffic(traffic: str) -> None:
    if traffic not in TRAFFIC_MODELS:
        fail("traffic", traffic, f"expected one of {', '.join(TRAFFIC_MODELS)}")
