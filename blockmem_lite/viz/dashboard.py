"""The live training dashboard of one run: a widget in notebooks, short text lines elsewhere.

    dash = LiveDashboard(total_steps=cfg.train.steps, title="dense")
    history = Trainer(model, cfg, train_data, val_data, callbacks=[dash]).fit()
    dash.figure()            # the static summary of the run (loss, tokens/s, memory)

Modes (the rule every live view follows, ``live_base.resolve_mode``):

* ``widget``: an ipywidgets box, shown where the dashboard is made, with a status line
  (step, time left, elapsed, loss, val loss, tokens/s, peak memory and how it was read)
  above one plotly figure of three rows on a shared step axis: train and validation
  loss; tokens/s; memory in MiB with the reading method on the axis
  ("MiB (model tensors)" on a CPU, "MiB (CUDA peak)"), the axis spanning the readings (not from
  zero, so growth shows) and the peak dotted. The title carries step/total and
  the time left. Redrawn whole (``live_base.FigureArea``) at most ``max_updates_per_s``
  times a second (points are buffered in between) and always on evaluation and at
  the end, when the last figure stays as a plain output (it shows again when the
  notebook reopens).
* ``text``: one compact line at most every ``print_every_s`` seconds, plus a
  line per evaluation and a final summary line.
* ``auto`` (default): text when ``BLOCKMEM_HEADLESS=1`` or outside a Jupyter kernel;
  otherwise widget, falling back to text when the widget cannot be built.

A dashboard follows one run; use a fresh one (or a distinct ``title``) per run.
If it is fed a step not after its last one, it starts over as a new run.

``RunRecord`` holds one run's points and ``_TrainingView`` the widget both the dashboard
and ``comparison.LiveComparison`` (several runs in one widget) are drawn in: the
figure of ``training.training_panels``. ``monitor.LiveMonitor`` watches anything else.
"""

from __future__ import annotations

import html
from typing import Callable

from blockmem_lite.units import (
    duration_words,
    format_progress,
    human_memory,
    human_rate,
    time_left,
)
from blockmem_lite.viz.live_base import (
    FigureArea,
    StatusLine,
    _check_total_steps,
    _LiveView,
    _step_text,
)

# ----------------------------------------------------------------------------- formatting


def _eta_s(rec: dict, total) -> float | None:
    """The seconds left: the record's ``eta_s``, or extrapolated from elapsed time and
    steps done."""
    if rec.get("eta_s") is not None:
        return rec["eta_s"]
    step, elapsed = rec.get("step"), rec.get("elapsed_s")
    if not total or not step or elapsed is None:
        return None
    return elapsed / step * max(total - step, 0)


def _value(obj, key: str, default=None):
    """``obj.key`` or ``obj[key]`` (History objects and plain dicts alike)."""
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


# ----------------------------------------------------------------------------- one run's points


class RunRecord:
    """The points of one training run as the trainer sends them: a dashboard's data model.

    ``add_step(rec)`` / ``add_eval(rec)`` / ``end(history)`` fill it; ``as_history()`` gives
    the points with ``train.History``'s keys; ``current()`` is the trainer's own history
    once the run ended, else those points. A step not after the last one means a new run
    is being fed: ``starts_new_run(step)`` says so, and the owner calls ``reset()``.
    """

    FIELDS = ("steps", "losses", "tokens_per_s", "memory_bytes", "elapsed_s", "val_steps",
              "val_losses", "memory_method", "peak_memory_bytes", "last_step", "history",
              "finished")

    def __init__(self, name: str = "", total_steps: int | None = None):
        self.name = name
        self.total_steps = total_steps
        self.reset()

    def reset(self) -> None:
        """Forget every point (a new run starts)."""
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.tokens_per_s: list[float | None] = []
        self.memory_bytes: list[float | None] = []
        self.elapsed_s: list[float | None] = []
        self.val_steps: list[int] = []
        self.val_losses: list[float] = []
        self.memory_method: str | None = None
        self.peak_memory_bytes: float | None = None
        self.last_step: dict = {}
        self.history = None
        self.finished = False

    def starts_new_run(self, step) -> bool:
        return bool(self.steps) and step is not None and step <= self.steps[-1]

    def add_step(self, rec: dict) -> None:
        self.finished = False
        self.last_step = dict(rec)
        self.steps.append(rec.get("step"))
        self.losses.append(rec.get("loss"))
        self.tokens_per_s.append(rec.get("tokens_per_s"))
        self.elapsed_s.append(rec.get("elapsed_s"))
        memory = rec.get("memory_bytes")
        self.memory_bytes.append(memory)
        if memory is not None:
            self.peak_memory_bytes = max(memory, self.peak_memory_bytes or 0)
        self.memory_method = rec.get("memory_method") or self.memory_method

    def add_eval(self, rec: dict) -> None:
        self.val_steps.append(rec.get("step"))
        self.val_losses.append(rec["val_loss"])

    def end(self, history) -> None:
        self.history = history
        self.finished = True

    @property
    def total(self) -> int | None:
        """The trainer's step count when it sends one, else the one given at construction."""
        return self.last_step.get("total_steps") or self.total_steps

    @property
    def started(self) -> bool:
        return bool(self.steps)

    @property
    def interrupted(self) -> bool:
        return bool(self.history is not None and _value(self.history, "interrupted", False))

    def eta_s(self) -> float | None:
        return None if self.finished or not self.last_step else _eta_s(self.last_step,
                                                                       self.total)

    def as_history(self) -> dict:
        """The points received so far, as a dict with ``train.History``'s keys."""
        return {"step": list(self.steps), "loss": list(self.losses),
                "tokens_per_s": list(self.tokens_per_s), "memory_bytes": list(self.memory_bytes),
                "elapsed_s": list(self.elapsed_s), "val_step": list(self.val_steps),
                "val_loss": list(self.val_losses), "memory_method": self.memory_method or "",
                "total_steps": self.total or 0, "interrupted": self.interrupted}

    def current(self):
        return self.history if self.history is not None else self.as_history()

    def summary_parts(self) -> list[str]:
        """loss, val loss, tokens/s and peak memory, as far as known."""
        parts = []
        if self.losses and self.losses[-1] is not None:
            parts.append(f"loss {self.losses[-1]:.4f}")
        if self.val_losses:
            parts.append(f"val loss {self.val_losses[-1]:.4f}")
        if self.last_step.get("tokens_per_s") is not None:
            parts.append(human_rate(self.last_step["tokens_per_s"]))
        if self.peak_memory_bytes is not None:
            parts.append("peak " + human_memory(self.peak_memory_bytes, self.memory_method))
        return parts

    def progress_text(self) -> str:
        """``step 120/600 · about 42 s left · 31 s elapsed``, or how the run ended."""
        total = self.total
        if not self.started:
            return "waiting for the first step…"
        elapsed = duration_words(self.last_step.get("elapsed_s"))
        if self.finished:
            head = "interrupted at" if self.interrupted else "done:"
            return f"{head} {_step_text(self.steps[-1], total)} in {elapsed}"
        parts = [_step_text(self.steps[-1], total)]
        if total:
            parts.append(time_left(self.eta_s()))
        parts.append(f"{elapsed} elapsed")
        return " · ".join(parts)

    def final_line(self) -> str:
        total = self.total
        done = self.steps[-1] if self.steps else _last(_value(self.history, "step", []))
        head = "interrupted at" if self.interrupted else "done:"
        parts = [f"{head} {_step_text(done, total)} in "
                 f"{duration_words(self.last_step.get('elapsed_s'))}"]
        return " | ".join(parts + self.summary_parts())


# ----------------------------------------------------------------------------- training views


class _TrainingView(_LiveView):
    """What the dashboard and the comparison share: run records fed by trainer callbacks,
    one figure of ``training.training_panels`` (loss, tokens/s, memory on one step axis)
    under a status line, filled by ``training.update_training_panels`` and redrawn whole
    into a ``live_base.FigureArea``, which settles as a plain figure once every run ended."""

    single = True                 # one run (its own colours per series) or several

    def __init__(self, title, mode, max_updates_per_s, print_every_s, clock):
        super().__init__(title, mode, max_updates_per_s, print_every_s, clock)
        self.records: dict[str, RunRecord] = {}
        self.live_figure = None       # the figure the widget shows, filled in place
        self._area = None
        self._status = None

    def _build_widget(self) -> None:
        from blockmem_lite.viz.training import training_panels

        self.live_figure = training_panels(list(self.records), single=self.single,
                                           title=self._figure_title())
        self._area = FigureArea()
        self._status = StatusLine(self._status_html())
        self.widget = self._area.widget
        self._parts = [self._status, self._area]

    def _all_done(self) -> bool:
        """Every run the view knows has ended: the dashboard's one run, or each run a
        comparison was given up front (runs it only meets later count once they start)."""
        return all(r.finished for r in self.records.values())

    # ------------------------------------------------------------------ feeding

    def _step(self, record: RunRecord, rec: dict) -> None:
        if record.starts_new_run(rec.get("step")):
            self._new_run(record)
        record.add_step(rec)
        if self.mode == "widget":
            if self._redraws.due():
                self._refresh()
        elif self._prints.take():
            self._print_run(record, format_progress(rec))

    def _eval(self, record: RunRecord, rec: dict) -> None:
        if rec.get("val_loss") is None:
            return
        if record.finished and record.starts_new_run(rec.get("step")):
            self._new_run(record)
        record.add_eval(rec)
        if self.mode == "widget":
            self._refresh()
        else:
            self._print_run(record, "eval " + format_progress({"total_steps": record.total,
                                                               **rec}))

    def _end(self, record: RunRecord, history) -> None:
        record.end(history)
        if self.mode == "widget":
            self._refresh()
            if self._all_done():
                self._area.settle()
        else:
            self._print_run(record, record.final_line())

    def _new_run(self, record: RunRecord) -> None:
        record.reset()
        self._redraws.reset()
        self._prints.reset()

    def _print_run(self, record: RunRecord, line: str) -> None:
        self._print(line)

    # ------------------------------------------------------------------ drawing

    def _x_total(self) -> int | None:
        totals = [r.total for r in self.records.values() if r.total]
        return max(totals) if totals else None

    def _refresh(self) -> None:
        """Redraw the widget with every point buffered so far."""
        from blockmem_lite.viz.training import update_training_panels

        update_training_panels(self.live_figure, {name: r.as_history() for name, r in
                                                  self.records.items()},
                               title=self._figure_title(), subtitle=self._subtitle(),
                               total_steps=self._x_total())
        self._status.update(self._status_html())
        self._area.draw(self.live_figure)
        self.n_updates += 1
        self._redraws.mark()

    def _figure_title(self) -> str:
        return html.escape(self.title) if self.title else "Training run"

    def _subtitle(self) -> str:
        raise TypeError(f"{type(self).__name__} must define _subtitle")

    def _status_html(self) -> str:
        raise TypeError(f"{type(self).__name__} must define _status_html")


# ----------------------------------------------------------------------------- dashboard


class LiveDashboard(_TrainingView):
    """Trainer callback showing a run as it trains (see the module docstring).

    The points are in ``record`` (a ``RunRecord``); its fields (``steps``, ``losses``,
    ``val_losses``, ``peak_memory_bytes``, ``history``, ...) read through the dashboard too.
    """

    kind = "live dashboard"

    def __init__(self, total_steps: int | None = None, title: str = "", mode: str = "auto",
                 max_updates_per_s: float = 4.0, print_every_s: float = 2.0,
                 clock: Callable[[], float] | None = None):
        super().__init__(title, mode, max_updates_per_s, print_every_s, clock)
        _check_total_steps(total_steps)
        self.total_steps = total_steps
        self.record = RunRecord(title, total_steps)
        self.records = {"run": self.record}
        self._start()

    def __getattr__(self, name):
        """The record's fields read as the dashboard's own (``dash.steps``, ``dash.history``)."""
        record = self.__dict__.get("record")
        if record is not None and name in RunRecord.FIELDS:
            return getattr(record, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ callbacks

    def on_step(self, trainer, rec: dict) -> None:
        self._step(self.record, rec)

    def on_eval(self, trainer, rec: dict) -> None:
        self._eval(self.record, rec)

    def on_end(self, trainer, history) -> None:
        self._end(self.record, history)

    # ------------------------------------------------------------------ results

    def _total(self) -> int | None:
        return self.record.total

    def as_history(self) -> dict:
        """The points received so far, as a dict with ``train.History``'s keys."""
        return self.record.as_history()

    def figure(self):
        """Static summary figure of the run (from the trainer's history once it ended)."""
        from blockmem_lite.viz.training import training_summary

        return training_summary(self.record.current(), title=self.title or "Training run")

    # ------------------------------------------------------------------ widget mode

    def _subtitle(self) -> str:
        return html.escape(self.record.progress_text())

    def _status_html(self) -> str:
        record = self.record
        parts = [f"<b>{html.escape(self.title)}</b>"] if self.title else []
        parts.append(html.escape(record.progress_text()))
        parts += [html.escape(p) for p in record.summary_parts()]
        if record.finished:
            parts.append("<b>interrupted</b>" if record.interrupted else "<b>done</b>")
        return ('<div style="font-family: monospace; font-size: 13px">'
                + " · ".join(parts) + "</div>")


def _last(values):
    values = list(values or [])
    return values[-1] if values else 0


def live_dashboard(cfg=None, **kwargs) -> LiveDashboard:
    """A ``LiveDashboard``; ``cfg`` (RunConfig or TrainConfig) supplies ``total_steps``."""
    if cfg is not None and "total_steps" not in kwargs:
        kwargs["total_steps"] = getattr(cfg, "train", cfg).steps
    return LiveDashboard(**kwargs)
