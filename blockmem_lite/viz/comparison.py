"""Several training runs trained one after another, overlaid live in one widget.

``LiveComparison`` follows the runs (notebooks 03, 05, 09, 10): the dashboard's three
rows (``dashboard.LiveDashboard``), one colour and one legend entry per run, the latest values
of every run in a status table; in text mode each line starts with its run's name.
``live.run(name)`` is the callback of one run:

    live = LiveComparison(runs=list(runs), total_steps=cfg.train.steps, title="dense vs BCMT")
    for name, run_cfg in runs.items():
        histories[name] = Trainer(..., callbacks=[live.run(name)]).fit()
    live.figure()            # the static overlay; live.loss_figure(): loss, one panel per family
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Callable

from blockmem_lite.viz.dashboard import RunRecord, _TrainingView, time_left
from blockmem_lite.viz.live_base import _check_total_steps


class RunFeed:
    """The trainer callback of one run of a ``LiveComparison`` (``comparison.run(name)``)."""

    def __init__(self, comparison: LiveComparison, name: str):
        self.comparison, self.name = comparison, name

    @property
    def record(self) -> RunRecord:
        return self.comparison.records[self.name]

    def on_step(self, trainer, rec: dict) -> None:
        self.comparison._step(self.record, rec)

    def on_eval(self, trainer, rec: dict) -> None:
        self.comparison._eval(self.record, rec)

    def on_end(self, trainer, history) -> None:
        self.comparison._end(self.record, history)

    def __repr__(self) -> str:
        return f"RunFeed({self.name!r})"


class LiveComparison(_TrainingView):
    """Several runs trained one after another, overlaid live in one widget.

        live = LiveComparison(runs=["dense", "bcmt L=16"], total_steps=300, title="dense vs BCMT")
        for name, run_cfg in runs.items():
            histories[name] = Trainer(..., callbacks=[live.run(name)]).fit()
        live.figure()                 # the static overlay; live.histories: name -> History

    Widget mode: the three rows of the dashboard (loss with train line and val diamonds,
    tokens/s, memory with each run's peak dotted) on one step axis, one colour per run,
    one legend entry per run (click it to hide the whole run), the title naming the run
    in progress with the time it has left, and a status table with the latest values of
    every run.
    Text mode: the dashboard's lines, each prefixed with its run's name, ``[dense] step ...``.
    ``runs``: the names known up front (their colours and legend order; others are added
    when ``run(name)`` first sees them); ``total_steps``: one number, or a dict per run
    (the trainer's own count wins once a step arrives).
    """

    kind = "live comparison"
    single = False

    def __init__(self, runs: Sequence = (), total_steps: int | Mapping | None = None,
                 title: str = "", mode: str = "auto", max_updates_per_s: float = 4.0,
                 print_every_s: float = 2.0, clock: Callable[[], float] | None = None):
        super().__init__(title, mode, max_updates_per_s, print_every_s, clock)
        if isinstance(runs, (str, bytes)) or not isinstance(runs, (Sequence, Mapping)):
            raise ValueError(f"runs={runs!r} is not allowed: expected a list of run names")
        if isinstance(total_steps, Mapping):
            for name, steps in total_steps.items():
                _check_total_steps(steps, f"total_steps[{name!r}]")
        else:
            _check_total_steps(total_steps)
        self.total_steps = total_steps
        for name in runs:
            self._record(str(name))
        self._start()

    def _record(self, name: str) -> RunRecord:
        if name not in self.records:
            total = (self.total_steps.get(name) if isinstance(self.total_steps, Mapping)
                     else self.total_steps)
            self.records[name] = RunRecord(name, total)
        return self.records[name]

    def run(self, name: str) -> RunFeed:
        """The trainer callback for the run ``name`` (pass it in ``callbacks=[...]``)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name={name!r} is not allowed: expected a non-empty run name")
        self._record(name)
        return RunFeed(self, name)

    @property
    def histories(self) -> dict:
        """{run name: the trainer's History once it ended, else the points so far} for every
        run that has started."""
        return {name: r.current() for name, r in self.records.items() if r.started}

    def figure(self, **kwargs):
        """The static overlay of every run so far (``training.training_comparison``)."""
        from blockmem_lite.viz.training import training_comparison

        if not self.histories:
            raise ValueError("LiveComparison.figure() is not allowed before a run has sent a "
                             "step: train with live.run(name) as a callback")
        return training_comparison(self.histories, title=self.title or "Training runs",
                                   **kwargs)

    def loss_figure(self, **kwargs):
        """Loss only, one panel per family of runs (``training.loss_curves``)."""
        from blockmem_lite.viz.training import loss_curves

        return loss_curves(self.histories, title=self.title or "Loss", **kwargs)

    # ------------------------------------------------------------------ text mode

    def _print_run(self, record: RunRecord, line: str) -> None:
        print(f"[{record.name}] {line}", flush=True)
        self.n_printed += 1

    # ------------------------------------------------------------------ widget mode

    def _figure_title(self) -> str:
        return html.escape(self.title) if self.title else "Training runs"

    def _current(self) -> RunRecord | None:
        """The run being trained (the last one fed that has not ended)."""
        going = [r for r in self.records.values() if r.started and not r.finished]
        return going[-1] if going else None

    def _eta_all_s(self) -> float | None:
        """Time left for the run in progress and the runs not started, guessed from the
        mean wall time of the runs that ended."""
        ended = [r.last_step.get("elapsed_s") for r in self.records.values()
                 if r.finished and r.last_step.get("elapsed_s") is not None]
        current = self._current()
        waiting = sum(not r.started for r in self.records.values())
        left = current.eta_s() if current is not None else 0.0
        if left is None or (waiting and not ended):
            return None
        return left + waiting * (sum(ended) / len(ended) if ended else 0.0)

    def _subtitle(self) -> str:
        names = list(self.records)
        current = self._current()
        done = sum(r.finished for r in self.records.values())
        if current is None:
            text = f"{done} of {len(names)} runs done" if done else "waiting for the first step…"
        else:
            text = (f"run {names.index(current.name) + 1} of {len(names)}: {current.name}, "
                    f"{current.progress_text()}")
            eta_all = self._eta_all_s()
            if eta_all is not None and any(not r.started for r in self.records.values()):
                text += f" · all runs: {time_left(eta_all)}"
        return html.escape(text) + " · line: train loss · ◆ val loss · dotted: peak memory"

    def _status_html(self) -> str:
        from blockmem_lite.viz.common import color

        rows = []
        for i, (name, r) in enumerate(self.records.items()):
            swatch = f'<span style="color:{color(i)}">■</span>'
            cells = [swatch, f"<b>{html.escape(name)}</b>", html.escape(r.progress_text())]
            cells += [html.escape(p) for p in r.summary_parts()]
            rows.append("<tr>" + "".join(f"<td style='padding-right:1em'>{c}</td>"
                                         for c in cells) + "</tr>")
        head = f"<b>{html.escape(self.title)}</b>" if self.title else ""
        return ('<div style="font-family: monospace; font-size: 13px">' + head
                + "<table>" + "".join(rows) + "</table></div>")


def live_comparison(runs=(), **kwargs) -> LiveComparison:
    """A ``LiveComparison``; ``runs`` may be a dict name -> RunConfig (or TrainConfig), whose
    step counts become ``total_steps`` per run."""
    if isinstance(runs, Mapping):
        if "total_steps" not in kwargs and all(hasattr(getattr(c, "train", c), "steps")
                                               for c in runs.values()):
            kwargs["total_steps"] = {str(n): getattr(c, "train", c).steps
                                     for n, c in runs.items()}
        runs = list(runs)
    return LiveComparison(runs=runs, **kwargs)
