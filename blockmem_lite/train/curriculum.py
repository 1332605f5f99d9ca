"""Staged training: ``train_curriculum`` runs one model through stages of growing data
(ARMT's 2 -> 4 -> 8 segments), a fresh Trainer per stage."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Sequence

import torch

from blockmem_lite.train.loop import Trainer


def train_curriculum(model: torch.nn.Module, stages: Sequence[int] = (2, 4, 8), *,
                     make_data: Callable[[int], tuple], train_cfg,
                     steps_per_stage: int | Sequence[int], callbacks=(),
                     checkpoint_dir: str | Path | None = None) -> list:
    """Train in stages of growing data (e.g. ARMT's 2 -> 4 -> 8 segments), each stage starting
    from the last one's weights.

    ``make_data(n_segments) -> (train_data, val_data)`` (val may be None) builds a
    stage's data, e.g. sequences of n_segments * segment_size tokens.
    ``train_cfg``: a TrainConfig (or RunConfig) whose steps / checkpoint_dir are
    replaced per stage.
    ``steps_per_stage``: one count for all stages or one per stage. Each stage
    gets a fresh optimiser and LR schedule (a new ``train.Trainer``); with
    ``checkpoint_dir`` stage k is saved to ``<dir>/stage{k}_{n}seg/checkpoint.pt``.
    An interrupted stage ends the curriculum. Returns one History per stage run.
    """
    train_cfg = getattr(train_cfg, "train", train_cfg)          # a RunConfig's TrainConfig
    stages = list(stages)
    if not stages or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in stages):
        raise ValueError(f"stages={stages!r} is not allowed: expected a non-empty list of "
                         "segment counts >= 1, e.g. (2, 4, 8)")
    steps = [steps_per_stage] * len(stages) if isinstance(steps_per_stage, int) \
        else list(steps_per_stage)
    if len(steps) != len(stages) or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                        for s in steps):
        raise ValueError(f"steps_per_stage={steps_per_stage!r} is not allowed: expected an "
                         f"integer >= 1 or one per stage ({len(stages)} stages)")
    if not callable(make_data):
        raise ValueError(f"make_data={make_data!r} is not allowed: expected a function "
                         "n_segments -> (train_data, val_data)")
    histories = []
    for k, (n_segments, n_steps) in enumerate(zip(stages, steps, strict=True)):
        folder = (str(Path(checkpoint_dir) / f"stage{k}_{n_segments}seg")
                  if checkpoint_dir is not None else None)
        cfg = dataclasses.replace(train_cfg, steps=n_steps, checkpoint_dir=folder)
        train_data, val_data = make_data(n_segments)
        history = Trainer(model, cfg, train_data, val_data, callbacks).fit(n_steps)
        histories.append(history)
        if history.interrupted:
            break
    return histories
