"""The analytic FLOP models checked against torch's own counter (docs/MEASUREMENTS.md).

``counted_flops(fn)`` runs ``fn`` under ``torch.utils.flop_counter.FlopCounterMode`` and
returns the FLOPs torch counts, with two conventions changed so they are the FLOPs the
kernels do, the ones the kit's models describe:

* torch has no formula for the CPU flash-attention kernels (it counts 0 for every CPU
  ``scaled_dot_product_attention``); they get the generic attention formulas;
* torch counts a causal attention as the full T x T square; a flash kernel skips the
  masked half, so a causal call counts half (the kit's models charge T/2 keys per query).

``flop_model_gap`` compares a mechanism's ``flops`` (``metrics.flops_per_token``) with that
count for training (forward + backward of one sequence, per token) or decoding (one
boundary period of token steps, per step: a block or chunk boundary runs a bigger step
once per span, which the analytic model spreads over every step).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch.utils import flop_counter

from blockmem_lite.config import ModelConfig
from blockmem_lite.measure import bench_steps, metrics
from blockmem_lite.measure.bench_compile import boundary_span
from blockmem_lite.measure.flops import training_flops_per_token
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import seed_everything
from blockmem_lite.validation import check_choice, check_positive

aten = torch.ops.aten
PHASES = ("train", "decode")


def _halved_when_causal(formula, causal_index: int):
    """``formula`` (a torch FLOP formula), halved when the positional argument
    ``causal_index`` (``is_causal``) is true."""
    def counted(*args, out_val=None, **kwargs):
        flops = formula(*args, out_val=out_val, **kwargs)
        causal = args[causal_index] if len(args) > causal_index else kwargs.get("is_causal")
        return flops // 2 if causal else flops
    counted._get_raw = True          # FlopCounterMode passes it the tensors, as torch's own
    return counted


# (query, key, value, dropout_p, is_causal, ...) and (grad_out, query, key, value, out,
# logsumexp, dropout_p, is_causal, ...)
FLOP_FORMULAS = {
    **flop_counter.flop_registry,
    aten._scaled_dot_product_flash_attention_for_cpu:
        _halved_when_causal(flop_counter.sdpa_flop, 4),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        _halved_when_causal(flop_counter.sdpa_backward_flop, 7),
}
CPU_KERNELS = {op: FLOP_FORMULAS[op] for op in (
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward)}


def counted_flops(fn: Callable[[], object]) -> float:
    """FLOPs torch counts while ``fn`` runs, with the module docstring's conventions."""
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_KERNELS) as counter:
        fn()
    return float(counter.get_total_flops())


@dataclasses.dataclass(frozen=True)
class FlopGap:
    """One comparison: FLOPs per token (train) or per step (decode)."""

    arch: str
    phase: str
    seq_len: int
    analytic: float
    counted: float

    @property
    def ratio(self) -> float:
        """counted / analytic (1.0: the model is exact)."""
        return self.counted / self.analytic


def flop_model_gap(cfg: ModelConfig, phase: str, seq_len: int | None = None) -> FlopGap | None:
    """The analytic FLOPs of ``cfg``'s mechanism against torch's count at ``seq_len``
    (default ``cfg.seq_len``); None where the mechanism has no FLOP model for ``phase``."""
    check_choice("phase", phase, PHASES)
    seq_len = seq_len or cfg.seq_len
    check_positive("seq_len", seq_len)
    decode = phase == "decode"
    analytic = metrics.flops_per_token(cfg, seq_len, decode=decode)
    if analytic is None:
        return None
    if decode:
        span = max(1, boundary_span(cfg))
        model = _built(dataclasses.replace(cfg, seq_len=max(cfg.seq_len, seq_len + span + 1)))
        step = bench_steps.make_decode_step(model, 1, seq_len, n_calls=1, burst=span)
        counted = counted_flops(step) / span
    else:
        model = _built(dataclasses.replace(cfg, seq_len=max(cfg.seq_len, seq_len)))
        forward = bench_steps.make_train_forward(model, 1, seq_len)
        counted = counted_flops(lambda: forward().backward()) / seq_len
        analytic = training_flops_per_token(analytic)
    return FlopGap(cfg.arch, phase, seq_len, analytic, counted)


def _built(cfg: ModelConfig):
    seed_everything(0)
    return build_model(cfg)
