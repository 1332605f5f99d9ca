"""What a Trainer reports while it runs: the ``History`` it fills, the callback protocol
(``on_step`` / ``on_eval`` / ``on_end``) and the default progress printer.

Callbacks receive the Trainer itself as ``trainer`` (not annotated here: this module sits
below ``train.loop``, which imports it). Under torchrun they run on rank 0 only.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from blockmem_lite.checkpoints import atomic_write_bytes
from blockmem_lite.units import format_progress

PRINT_INTERVAL_S = 2.0           # the default progress printer writes at most one line per 2 s

STEP_KEYS = ("step", "total_steps", "loss", "ce_loss", "aux_loss", "lr", "grad_norm",
             "tokens_per_s", "memory_bytes", "memory_method", "elapsed_s", "eta_s", "extras")
EVAL_KEYS = ("step", "total_steps", "val_loss", "elapsed_s")
CALLBACK_METHODS = ("on_step", "on_eval", "on_end")


@dataclass
class History:
    """Everything a run measured, one list entry per step (and per evaluation)."""

    step: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    ce_loss: list = field(default_factory=list)
    aux_loss: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    grad_norm: list = field(default_factory=list)      # global norm before clipping
    tokens_per_s: list = field(default_factory=list)
    memory_bytes: list = field(default_factory=list)
    elapsed_s: list = field(default_factory=list)
    val_step: list = field(default_factory=list)
    val_loss: list = field(default_factory=list)
    extras: dict = field(default_factory=dict)         # name -> per-step values (ModelOutput.extras)
    memory_method: str = ""
    total_steps: int = 0
    interrupted: bool = False
    stopped_by: str = ""                               # the signal that stopped the run, if any

    def append_step(self, rec: dict) -> None:
        for name in ("step", "loss", "ce_loss", "aux_loss", "lr", "grad_norm", "tokens_per_s",
                     "memory_bytes", "elapsed_s"):
            getattr(self, name).append(rec[name])
        for name, value in rec.get("extras", {}).items():
            self.extras.setdefault(name, []).append(value)
        self.memory_method = rec["memory_method"]

    def append_eval(self, rec: dict) -> None:
        self.val_step.append(rec["step"])
        self.val_loss.append(rec["val_loss"])

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {k: list(v) for k, v in value.items()}
            out[f.name] = list(value) if isinstance(value, list) else value
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> History:
        """Inverse of ``to_dict``; missing keys take their defaults, unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: (list(v) if isinstance(v, (list, tuple)) else v)
                      for k, v in d.items() if k in names})

    def save_json(self, path) -> Path:
        path = Path(path)
        atomic_write_bytes(path, json.dumps(self.to_dict(), indent=1).encode("utf-8"))
        return path


class Callback:
    """Base class for Trainer callbacks; override what you need.

    Any object with some of these methods works too (duck typing).
    """

    def on_step(self, trainer, rec: dict) -> None:
        """After every optimizer step; ``rec`` has the keys in ``STEP_KEYS``."""

    def on_eval(self, trainer, rec: dict) -> None:
        """After every evaluation; ``rec`` has the keys in ``EVAL_KEYS``."""

    def on_end(self, trainer, history: History) -> None:
        """Once when ``fit`` ends (finished, or stopped by an interrupt)."""


class PrintProgress(Callback):
    """Default callback: throttled text lines (the first step of each fit, every log_every
    steps at most once per PRINT_INTERVAL_S, and the final step)."""

    def __init__(self, log_every: int, min_interval_s: float = PRINT_INTERVAL_S):
        self.log_every = log_every
        self.min_interval_s = min_interval_s
        self._last = None          # time of the last line; None: nothing printed in this fit

    def _print(self, rec: dict, periodic: bool) -> None:
        now = time.monotonic()
        final = rec["step"] >= rec["total_steps"]
        due = periodic and (self._last is None or now - self._last >= self.min_interval_s)
        if final or self._last is None or due:
            print(format_progress(rec), flush=True)
            self._last = now

    def on_step(self, trainer, rec):
        self._print(rec, periodic=rec["step"] % self.log_every == 0)

    def on_eval(self, trainer, rec):
        self._print(rec, periodic=True)

    def on_end(self, trainer, history):
        self._last = None


class GradientGroups(Callback):
    """Each step's gradient norm before clipping, per parameter group: a parameter's name
    without its layer numbers and its stack's prefix (``blocks.3.gate.bias`` -> ``gate.bias``,
    ``backbone.blocks.0.attn.qkv.weight`` -> ``attn.qkv.weight``), so a spike names the
    parameters it came from. ``norms``: {group: [one norm per step]}."""

    def __init__(self, model, grad_clip: float):
        self.grad_clip = grad_clip
        self.groups: dict[str, list] = {}
        for name, p in model.named_parameters():
            self.groups.setdefault(parameter_group(name), []).append(p)
        self.norms: dict[str, list] = {group: [] for group in self.groups}

    def on_step(self, trainer, rec: dict) -> None:
        undo = max(1.0, rec["grad_norm"] / self.grad_clip) if self.grad_clip > 0 else 1.0
        squares = []
        for params in self.groups.values():
            grads = [p.grad.float().pow(2).sum() for p in params if p.grad is not None]
            squares.append(torch.stack(grads).sum() if grads
                           else torch.zeros((), device=params[0].device))
        for group, square in zip(self.groups, torch.stack(squares).tolist(), strict=True):
            self.norms[group].append(square ** 0.5 * undo)     # the step's clip scaled all


def parameter_group(name: str) -> str:
    """``name`` without layer numbers and the ``blocks`` / ``backbone`` prefix around them."""
    parts = [part for part in name.split(".") if not part.isdigit()]
    while len(parts) > 2 and parts[0] in ("backbone", "blocks"):
        parts = parts[1:]
    return ".".join(parts)


def check_callbacks(callbacks) -> list:
    """``callbacks`` as a list (one callback alone, a sequence, or None); a ValueError for an
    entry with none of the callback methods."""
    if callbacks is None:
        return []
    if any(hasattr(callbacks, name) for name in CALLBACK_METHODS):
        callbacks = [callbacks]
    out = list(callbacks)
    for cb in out:
        if not any(callable(getattr(cb, name, None)) for name in CALLBACK_METHODS):
            raise ValueError(f"callbacks entry {cb!r} is not allowed: a callback needs at least one "
                             "of the methods on_step, on_eval, on_end")
    return out


def emit(callbacks: list, trainer, event: str, payload) -> None:
    """Call ``event`` (``on_step``, ``on_eval`` or ``on_end``) on every callback that has it."""
    for cb in callbacks:
        method = getattr(cb, event, None)
        if callable(method):
            method(trainer, payload)
