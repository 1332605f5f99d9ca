"""Capstone checks: the student's class plugged into a kit model, trained beside the kit's.

A capstone module registers how its model is made and how the student's class goes in
(``capstone``); ``check_capstone(t, batches, name)`` then judges it with
``plugged_in.judge_plugged_in``. The student's model is built, run and trained where the
answers live (``Trial.remote``: in the notebook, or in the graded kernel); the kit's model,
the comparison and the verdict are the check's. A capstone's ``Probe`` (optional) lets a
failure name the part of the student's class that goes wrong: the student's side sends only
the values of the probe's parts; their labels, and what a difference means, are the kit's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from blockmem_lite.plugged_in import Plugged, Probe, judge_plugged_in, plug


@dataclass(frozen=True)
class Capstone:
    """``make_model()``: the kit's model, seeded; ``plug_in(trial, model)``: the student's
    class put in (returns how many places); training with AdamW at ``lr`` from ``seed``;
    ``probe``: how a failure names the part that goes wrong (None: positions only)."""

    make_model: Callable[[], torch.nn.Module]
    plug_in: Callable
    lr: float = 3e-3
    seed: int = 0
    probe: Probe | None = None


_CAPSTONES: dict[str, Capstone] = {}


def capstone(grade_id: str, make_model: Callable, plug_in: Callable, lr: float = 3e-3,
             seed: int = 0, probe: Probe | None = None) -> None:
    """Register the capstone of the check ``grade_id``."""
    _CAPSTONES[grade_id] = Capstone(make_model, plug_in, lr, seed, probe)


def _plugged(t) -> Plugged:
    spec = _CAPSTONES[t.check.grade_id]
    return plug(spec.make_model, lambda model: spec.plug_in(t, model), spec.lr, spec.seed,
                spec.probe)


def summary(t) -> dict:
    """Where the answers live: how many places the class went in, the first weight apart."""
    plugged = _plugged(t)
    return {"replaced": plugged.replaced, "apart": plugged.apart}


def logits(t, tokens: torch.Tensor) -> torch.Tensor:
    """Where the answers live: the plugged model's logits for ``tokens``."""
    return _plugged(t).logits(tokens)


def curve(t, batches: list) -> list[float]:
    """Where the answers live: the plugged model's loss curve on ``batches``."""
    return _plugged(t).curve(batches)


def parts(t, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Where the answers live: the values of the capstone probe's parts for ``tokens``."""
    return _plugged(t).parts(tokens)


def check_capstone(t, batches: list, name: str, **tolerances) -> tuple[list[float], list[float]]:
    """Judge the capstone of ``t``'s check; returns (the kit's curve, the student's)."""
    spec = _CAPSTONES[t.check.grade_id]
    found = t.remote(summary)
    probed = spec.probe is not None and spec.probe.parts is not None
    yours = Plugged(found["replaced"], found["apart"], lambda tokens: t.remote(logits, tokens),
                    lambda data: t.remote(curve, data),
                    (lambda tokens: t.remote(parts, tokens)) if probed else None)
    return judge_plugged_in(yours, spec.make_model, batches, name, spec.lr, spec.seed,
                            probe=spec.probe, **tolerances)
