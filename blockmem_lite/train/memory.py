"""The memory a training run needs, estimated before it starts, and the check that it fits.

A training step holds, by part:

* weights, and one gradient per trainable parameter (its dtype: fp32 in the kit);
* AdamW's state: two moments per trainable parameter (``exp_avg``, ``exp_avg_sq``), each
  in its parameter's dtype (fp32 in the kit);
* activations: the tensors autograd saves for the backward pass, which grow with the batch.

The activations are measured, not modelled (**kit design choice**): two dry runs, forward
only, of batch 1 and batch 2 at the run's sequence length and precision, on the run's own
device, record the bytes saved for backward (``runtime.SavedTensorCounter``, deduplicated by
storage). The line through the two splits them into a fixed part (autocast's half-precision
copies of the weights, masks shared by the batch) and a part per sequence, so batch B saves
``fixed + B * per_sequence``. Every mechanism is estimated alike, a plugin's included, and
nothing the size of the real batch is allocated. Each dry run starts from the same forked
random state, so a model that draws at random (CAT's multi-chunk size) draws alike in both
and the run's own random streams are untouched.

Not counted: transient buffers of the backward pass and of the optimizer step, the
allocator's fragmentation and the CUDA context (already outside the free memory); the check
keeps ``1 - FIT_FRACTION`` of the free memory as the margin for them. Gradient checkpointing
(ARMT's ``grad_checkpoint``) recomputes activations in the backward pass; only what its
forward keeps is counted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

import torch

from blockmem_lite.runtime import SavedTensorCounter, autocast_for, available_memory_bytes
from blockmem_lite.units import human_bytes
from blockmem_lite.validation import check_choice, check_int

FIT_FRACTION = 0.9             # a run may plan to use this share of the free memory
ADAMW_MOMENTS = 2              # exp_avg and exp_avg_sq, each the size of its parameter
RESOLVED = ("fp32", "bf16", "fp16")   # what runtime.resolve_precision returns


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training step needs, by part, at ``batch_size`` sequences of ``seq_len``."""

    weights: int
    gradients: int
    optimizer: int                 # AdamW's two moments
    fixed_activations: int         # saved for backward whatever the batch
    per_sequence: int              # saved for backward per sequence
    batch_size: int
    seq_len: int
    precision: str                 # the resolved one: fp32, bf16 or fp16

    @property
    def activations(self) -> int:
        return self.fixed_activations + self.batch_size * self.per_sequence

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def at_batch(self, batch_size: int) -> MemoryEstimate:
        """The same run at another batch size."""
        return dataclasses.replace(self, batch_size=batch_size)

    def largest_batch(self, budget: int) -> int:
        """The largest batch whose total stays within ``budget`` bytes (0: not even one)."""
        room = budget - (self.total - self.batch_size * self.per_sequence)
        if room < 0:
            return 0
        return room // self.per_sequence if self.per_sequence else self.batch_size

    def describe(self) -> str:
        """One line: the total and its parts."""
        return (f"about {human_bytes(self.total)} (weights {human_bytes(self.weights)} + "
                f"gradients {human_bytes(self.gradients)} + AdamW moments "
                f"{human_bytes(self.optimizer)} + activations {human_bytes(self.activations)}"
                f" = {human_bytes(self.fixed_activations)} + {self.batch_size} x "
                f"{human_bytes(self.per_sequence)} per sequence of {self.seq_len} tokens, "
                f"{self.precision})")


def parameter_bytes(model: torch.nn.Module) -> tuple[int, int, int]:
    """(weights incl. buffers, gradients, AdamW moments) in bytes; gradients and moments for
    the trainable parameters only."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    gradients = sum(p.numel() * p.element_size() for p in trainable)
    moments = ADAMW_MOMENTS * gradients          # each moment is zeros_like(parameter)
    return weights, gradients, moments


def estimate_training_memory(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                             batch_size: int, precision: str = "fp32",
                             forward: Callable | None = None) -> MemoryEstimate:
    """Estimate training memory from two dry runs (module docstring).

    ``x``, ``y``: (2, T) tokens and targets on the model's device (real ones from the
    data: the model's input contract holds); ``precision``: a resolved precision
    (``runtime.resolve_precision``); ``forward(x, y)``: how a step calls the model
    (default ``model(x, y)``). Nothing is kept; the model's mode is left as it was.
    """
    if x.dim() != 2 or x.shape[0] < 2 or x.shape != y.shape:
        raise ValueError(f"x of shape {tuple(x.shape)} is not allowed: expected (2, T) tokens "
                         "with targets y of the same shape")
    check_int("batch_size", batch_size, 1)
    check_choice("precision", precision, RESOLVED)
    call = forward or (lambda a, b: model(a, b))
    frozen = [*model.parameters(), *model.buffers()]
    saved = [_dry_run(model, lambda n=n: call(x[:n], y[:n]), frozen, precision, x.device)
             for n in (1, 2)]                                   # batches (1, T) and (2, T)
    per_sequence = max(saved[1] - saved[0], 0)
    weights, gradients, moments = parameter_bytes(model)
    return MemoryEstimate(weights, gradients, moments, max(saved[0] - per_sequence, 0),
                          per_sequence, batch_size, x.shape[1], precision)


def _dry_run(model: torch.nn.Module, fn: Callable, frozen: list, precision: str,
             device: torch.device) -> int:
    """Bytes saved for backward by ``fn()`` in training mode, from a forked random state."""
    was_training = model.training
    accelerators = [device] if device.type == "cuda" else []
    model.train()
    try:
        with torch.random.fork_rng(devices=accelerators), autocast_for(device, precision), \
                SavedTensorCounter(frozen) as saved:
            fn()
        return saved.bytes
    finally:
        model.train(was_training)


def memory_for_run(model: torch.nn.Module, device) -> int | None:
    """Bytes a run on ``device`` can plan with: the free memory (``runtime``), plus what this
    model's tensors already hold there, plus on CUDA the allocator's cached, unused blocks.
    None where the free memory is unknown."""
    device = torch.device(device)
    free = available_memory_bytes(device)
    if free is None:
        return None
    held = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())
               if t.device.type == device.type)
    cached = 0
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free + held + cached


def check_fits(estimate: MemoryEstimate, available: int | None, where: str,
               world_size: int = 1, alternative: str = "") -> None:
    """Refuse (ValueError, one line) a run whose estimate exceeds FIT_FRACTION of
    ``available``: its parts, the free memory and the largest batch that fits.

    ``estimate.batch_size`` is the per-process batch; the suggestion is the global
    ``batch_size`` (a multiple of ``world_size``). ``alternative``: more advice
    (e.g. "the 'class' preset"). Unknown ``available``: no check.
    """
    if available is None:
        return
    budget = math.floor(FIT_FRACTION * available)
    if estimate.total <= budget:
        return
    largest = estimate.largest_batch(budget) * world_size
    options = [f"batch_size <= {largest}" if largest else
               f"a shorter seq_len than {estimate.seq_len} or a smaller model (even one "
               "sequence does not fit)"]
    if alternative:
        options.append(alternative)
    options.append("check_memory=False to try anyway")
    raise ValueError(
        f"batch_size={estimate.batch_size * world_size} is not allowed on {where}: training "
        f"needs {estimate.describe()}, but {human_bytes(available)} is free there (planned "
        f"with {FIT_FRACTION:.0%}: {human_bytes(budget)}); expected {', or '.join(options)}")
