"""The notebooks' repeated cells as functions: train a model live, train several side by side
on the same data, and check that a run learned.

Notebook 01 writes the first of each by hand (its own loop, then the Trainer with a live
dashboard); the later notebooks call these instead of repeating the cells::

    history, dashboard = train_live(model, cfg, train_loader, val_loader, title="BCMT")
    check_learned(history, cfg.model.vocab_size, drop=1.0)

    runs = {"dense": cfg, "bcmt": cfg.replace(arch="bcmt")}
    histories, models, live = compare_live(runs, train_loader, val_loader, title="...")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

from blockmem_lite.checks import check_true
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import seed_everything
from blockmem_lite.train import History, Trainer
from blockmem_lite.viz.comparison import LiveComparison, live_comparison
from blockmem_lite.viz.dashboard import LiveDashboard


def train_live(model, cfg, train_data, val_data=None, *, title: str = "",
               callbacks=()) -> tuple[History, LiveDashboard]:
    """Train ``model`` with ``cfg`` (a RunConfig) and a live dashboard; (history, dashboard).

    ``dashboard.figure()`` then draws the finished run. An interrupt stops the run cleanly
    and keeps its history."""
    dashboard = LiveDashboard(total_steps=cfg.train.steps, title=title)
    history = Trainer(model, cfg, train_data, val_data, callbacks=[dashboard, *callbacks]).fit()
    return history, dashboard


class Comparison(NamedTuple):
    """What ``compare_live`` trained: name -> History, name -> model, and the live chart."""

    histories: dict
    models: dict
    live: LiveComparison


def compare_live(runs: Mapping, train_data, val_data=None, *, title: str = "",
                 build: Callable = build_model, callbacks: Callable | None = None) -> Comparison:
    """Train each of ``runs`` (name -> RunConfig) on the same data in the same batch order.

    Each model is built by ``build(run_cfg)`` right after ``seed_everything`` with its seed,
    so equal configs give equal models; ``callbacks(name, model)`` may add callbacks to a
    run. One live chart follows every run. An interrupt stops the current run (its history
    is kept) and skips the runs after it."""
    if not isinstance(runs, Mapping) or not runs:
        raise ValueError(f"runs={runs!r} is not allowed: expected a non-empty dict "
                         "name -> RunConfig")
    live = live_comparison(runs, title=title)
    histories, models = {}, {}
    for name, run_cfg in runs.items():
        seed_everything(run_cfg.train.seed)
        models[name] = build(run_cfg)
        extra = callbacks(name, models[name]) if callbacks is not None else ()
        histories[name] = Trainer(models[name], run_cfg, train_data, val_data,
                                  callbacks=[live.run(name), *extra]).fit()
        if histories[name].interrupted:
            print(f"{name} was interrupted: the runs after it were skipped")
            break
    return Comparison(histories, models, live)


def check_learned(history: History, vocab_size: int, *, drop: float = 0.5,
                  margin: float = 0.5, name: str = "the run") -> None:
    """A run learned: every loss is finite, the training loss (mean of the first and the last
    tenth of the steps) fell by more than ``drop`` nats, and the last validation loss (if
    any) beats uniform guessing, ln(vocab_size), by more than ``margin`` nats."""
    check_true(len(history.loss) > 0, f"{name} trained at least one step")
    check_true(all(math.isfinite(x) for x in history.loss + history.val_loss),
               f"{name}: every loss is finite")
    k = max(1, len(history.loss) // 10)
    first, last = sum(history.loss[:k]) / k, sum(history.loss[-k:]) / k
    check_true(last < first - drop,
               f"{name}: training loss fell by more than {drop} nats: {first:.2f} -> {last:.2f}")
    if history.val_loss:
        check_true(history.val_loss[-1] < math.log(vocab_size) - margin,
                   f"{name}: validation loss {history.val_loss[-1]:.3f} beats uniform guessing "
                   f"(ln {vocab_size} = {math.log(vocab_size):.2f}) by more than {margin} nats")
