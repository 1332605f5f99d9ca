"""The live training dashboard: a widget in notebooks, short text lines elsewhere.

    dash = LiveDashboard(total_steps=cfg.train.steps, title="dense")
    history = Trainer(model, cfg.train, train_data, val_data, callbacks=[dash]).fit()
    dash.figure()            # the static summary of the run (loss, tokens/s, memory)

Modes:

* ``widget``: an ipywidgets box with a status line (step, loss, val loss,
  tokens/s, peak memory and how it was read, elapsed, ETA) above one plotly
  ``FigureWidget`` of three rows on a shared step axis: train and validation
  loss; tokens/s; memory in MiB with the reading method on the axis
  ("MiB (RSS)", "MiB (CUDA peak)"), the axis spanning the readings (not from
  zero, so growth shows) and the peak dotted. The title carries step/total and
  the ETA. Redrawn (one ``batch_update``) at most ``max_updates_per_s`` times a
  second (points are buffered in between) and always on evaluation and at the end.
* ``text``: one compact line at most every ``print_every_s`` seconds, plus a
  line per evaluation and a final summary line.
* ``auto`` (default): text when ``BLOCKMEM_HEADLESS=1`` (CI: kernels driven by
  nbval look exactly like a notebook, so only the variable can tell) or outside
  a Jupyter kernel; otherwise widget, falling back to text when the widget
  cannot be built (e.g. plotly >= 6 without ``anywidget``). The reason is kept
  in ``fallback_reason``.

A dashboard follows one run; use a fresh one (or a distinct ``title``) per run.
If it is fed a step not after its last one, it starts over as a new run.

``LiveComparison`` follows several runs trained one after another in one widget
(notebooks 03, 05, 09, 10): the same three rows, one colour and one legend entry
per run, the latest values of every run in a status table; in text mode each line
starts with its run's name. ``live.run(name)`` is the callback of one run:

    live = LiveComparison(runs=list(runs), total_steps=cfg.train.steps, title="dense vs BCMT")
    for name, run_cfg in runs.items():
        histories[name] = Trainer(..., callbacks=[live.run(name)]).fit()
    live.figure()            # the static overlay; live.loss_figure(): loss, one panel per family

``LiveMonitor`` is the generic version for anything else worth watching while a
model trains (routing, memory norms, recall): a ``probe(trainer, rec) -> data``
run every ``every`` steps and a ``figure(data) -> go.Figure`` builder (plus an
optional ``text(data) -> str`` for text mode). All three share one base,
``_LiveView``: the same mode rule, the same ``Throttle`` for redraws and prints.

    monitor = LiveMonitor(probe=lambda trainer, rec: {"norm": weight_norm(trainer.model)},
                          figure=lambda d: figures.bar_compare(d), every=10, title="norm")
"""

from __future__ import annotations

import html
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Callable

from blockmem_lite.units import format_progress, human_duration, human_memory, human_rate

MODES = ("auto", "widget", "text")
HEADLESS_ENV = "BLOCKMEM_HEADLESS"
_TRUTHY = ("1", "true", "yes", "on")


def headless() -> bool:
    """True when ``BLOCKMEM_HEADLESS`` is set to 1/true/yes/on (CI, scripts)."""
    return os.environ.get(HEADLESS_ENV, "").strip().lower() in _TRUTHY


def _in_notebook_kernel() -> bool:
    """True inside a Jupyter kernel (where widgets can render), without importing IPython."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


# ----------------------------------------------------------------------------- formatting


def _step_text(step, total) -> str:
    return f"step {step}/{total}" if total else f"step {step}"


def _eta_s(rec: dict, total) -> float | None:
    """The record's ETA, or one extrapolated from elapsed time and steps done."""
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


# ----------------------------------------------------------------------------- shared machinery


class Throttle:
    """Lets an action through at most once every ``min_interval_s`` seconds of ``clock``.

    ``due()`` asks without consuming; ``mark()`` records that the action ran now;
    ``take()`` is both (True and marked when due). The first call is always due.
    """

    def __init__(self, min_interval_s: float, clock: Callable[[], float]):
        self.min_interval_s = float(min_interval_s)
        self._clock = clock
        self.last: float | None = None

    def due(self) -> bool:
        return self.last is None or self._clock() - self.last >= self.min_interval_s

    def mark(self) -> None:
        self.last = self._clock()

    def take(self) -> bool:
        if not self.due():
            return False
        self.mark()
        return True

    def reset(self) -> None:
        self.last = None


def resolve_mode(mode: str, build_widget: Callable[[], None]) -> tuple[str, str | None, bool]:
    """The mode rule every live view follows: ``(mode, fallback_reason, announce)``.

    text when asked, when ``BLOCKMEM_HEADLESS`` is set (with mode="auto") or outside a
    kernel; otherwise ``build_widget()`` is tried and any failure means text (announced),
    except with mode="widget", where it raises.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not allowed: expected one of {', '.join(MODES)}")
    if mode == "text" or (mode == "auto" and headless()):
        return "text", None, False
    if mode == "auto" and not _in_notebook_kernel():
        return "text", "not running in a Jupyter kernel", False
    try:
        build_widget()
    except Exception as exc:  # any failure to build widgets means: use text
        reason = f"{type(exc).__name__}: {exc}"
        if mode == "widget":
            raise RuntimeError(f"mode='widget' is not possible here: {reason}; use "
                               "mode='auto' to fall back to text") from exc
        return "text", reason, True
    return "widget", None, False


class _LiveView:
    """What the dashboard and the monitors share: mode, throttles, printing, display."""

    kind = "live view"            # named in the fallback line

    def __init__(self, title: str, mode: str, max_updates_per_s: float, print_every_s: float,
                 clock: Callable[[], float] | None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not allowed: expected one of {', '.join(MODES)}")
        _check_positive_number("max_updates_per_s", max_updates_per_s, allow_zero=False)
        _check_positive_number("print_every_s", print_every_s, allow_zero=True)
        self.title = title
        self.requested_mode = mode
        self.max_updates_per_s = float(max_updates_per_s)
        self.print_every_s = float(print_every_s)
        self._clock = clock if clock is not None else time.monotonic
        self._redraws = Throttle(1.0 / self.max_updates_per_s, self._clock)
        self._prints = Throttle(self.print_every_s, self._clock)
        self.fallback_reason: str | None = None
        self.widget = None
        self._displayed = False
        self.n_updates = 0            # widget redraws
        self.n_printed = 0            # text lines printed

    def _start(self) -> None:
        """Pick the mode (building the widget if it is widget mode); say so on a fallback."""
        self.mode, self.fallback_reason, announce = resolve_mode(self.requested_mode,
                                                                 self._build_widget)
        if announce:
            self._print(f"{self.kind}: widgets unavailable ({self.fallback_reason}); "
                        "printing progress as text")

    def _build_widget(self) -> None:
        """Build ``self.widget``; each view (dashboard, monitor) defines its own."""
        raise TypeError(f"{type(self).__name__} defines no widget: a live view must override "
                        "_build_widget")

    def display(self) -> None:
        """Show the widget in the notebook (widget mode; text mode shows nothing)."""
        if self.mode != "widget":
            return
        from IPython.display import display

        display(self.widget)
        self._displayed = True

    def _show_once(self) -> None:
        if not self._displayed and _in_notebook_kernel():
            self.display()

    def _print(self, line: str) -> None:
        prefix = f"[{self.title}] " if self.title else ""
        print(prefix + line, flush=True)
        self.n_printed += 1


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
        """``step 120/600 · ETA 0:42 · 0:31 elapsed``, or how the run ended."""
        total = self.total
        if not self.started:
            return "waiting for the first step…"
        elapsed = human_duration(self.last_step.get("elapsed_s"))
        if self.finished:
            head = "interrupted at" if self.interrupted else "done:"
            return f"{head} {_step_text(self.steps[-1], total)} in {elapsed}"
        parts = [_step_text(self.steps[-1], total)]
        if total:
            parts.append(f"ETA {human_duration(self.eta_s())}")
        parts.append(f"{elapsed} elapsed")
        return " · ".join(parts)

    def final_line(self) -> str:
        total = self.total
        done = self.steps[-1] if self.steps else _last(_value(self.history, "step", []))
        head = "interrupted at" if self.interrupted else "done:"
        parts = [f"{head} {_step_text(done, total)} in "
                 f"{human_duration(self.last_step.get('elapsed_s'))}"]
        return " | ".join(parts + self.summary_parts())


# ----------------------------------------------------------------------------- training views


class _TrainingView(_LiveView):
    """What the dashboard and the comparison share: run records fed by trainer callbacks,
    one FigureWidget of ``figures.training_panels`` (loss, tokens/s, memory on one step
    axis) under a status line, redrawn through ``figures.update_training_panels``."""

    single = True                 # one run (its own colours per series) or several

    def __init__(self, title, mode, max_updates_per_s, print_every_s, clock):
        super().__init__(title, mode, max_updates_per_s, print_every_s, clock)
        self.records: dict[str, RunRecord] = {}
        self._figure_widget = None
        self.static_figure = None     # what the widget shows once every run has ended
        self._status = None

    def _build_widget(self) -> None:
        import ipywidgets
        import plotly.graph_objects as go

        from blockmem_lite.viz.figures import training_panels

        fig = go.FigureWidget(training_panels(list(self.records), single=self.single,
                                              title=self._figure_title()))
        self._figure_widget = fig
        self._status = ipywidgets.HTML(value=self._status_html())
        self.widget = ipywidgets.VBox([self._status, fig])

    # ------------------------------------------------------------------ freezing

    def _all_done(self) -> bool:
        """Every run the view knows has ended: the dashboard's one run, or each run a
        comparison was given up front (runs it only meets later count once they start)."""
        return all(r.finished for r in self.records.values())

    def _freeze(self) -> None:
        """Swap the live FigureWidget for the same figure drawn statically, and close it.

        A saved notebook keeps each live widget's state, and a plotly FigureWidget's holds
        plotly.js (about 5 MB): three dashboards made a 15 MB notebook. The static figure
        is a plain plotly output (kilobytes) that shows again when the notebook reopens.
        The next step of a new run brings a live widget back (``_thaw``).
        """
        import ipywidgets
        import plotly.graph_objects as go
        from IPython.display import display

        if self._figure_widget is None:
            return
        static = ipywidgets.Output()
        self.static_figure = go.Figure(self._figure_widget)
        if _in_notebook_kernel():     # elsewhere Output cannot capture: it would print
            with static:
                display(self.static_figure)
        live = self._figure_widget
        self._figure_widget = None
        self.widget.children = (self._status, static)
        _close_after_the_cell(live)

    def _thaw(self) -> None:
        import plotly.graph_objects as go

        from blockmem_lite.viz.figures import training_panels

        fig = go.FigureWidget(training_panels(list(self.records), single=self.single,
                                              title=self._figure_title()))
        self._figure_widget = fig
        self.widget.children = (self._status, fig)

    # ------------------------------------------------------------------ feeding

    def _step(self, record: RunRecord, rec: dict) -> None:
        if record.starts_new_run(rec.get("step")):
            self._new_run(record)
        record.add_step(rec)
        if self.mode == "widget":
            self._show_once()
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
            self._show_once()
            self._refresh()
        else:
            self._print_run(record, "eval " + format_progress({"total_steps": record.total,
                                                               **rec}))

    def _end(self, record: RunRecord, history) -> None:
        record.end(history)
        if self.mode == "widget":
            self._show_once()
            self._refresh()
            if self._all_done():
                self._freeze()
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
        """Redraw the widget with every point buffered so far (one batched message)."""
        from blockmem_lite.viz.figures import update_training_panels

        if self._figure_widget is None:
            self._thaw()
        fig = self._figure_widget
        with fig.batch_update():
            update_training_panels(fig, {name: r.as_history() for name, r in
                                         self.records.items()},
                                   title=self._figure_title(), subtitle=self._subtitle(),
                                   total_steps=self._x_total())
        self._status.value = self._status_html()
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
        from blockmem_lite.viz.figures import training_summary

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


def _close_after_the_cell(widget) -> None:
    """Close ``widget`` once the running cell has finished (at once outside a kernel).

    Closed at once, a widget whose view is still on the page makes the front end raise "no
    comm channel defined"; by the end of the cell the view has been taken off the page."""
    if not _in_notebook_kernel():       # no front end: nothing can still be drawing it
        widget.close()
        return
    shell = sys.modules["IPython"].get_ipython()

    def close_once(*_):
        shell.events.unregister("post_run_cell", close_once)
        widget.close()

    shell.events.register("post_run_cell", close_once)


def _last(values):
    values = list(values or [])
    return values[-1] if values else 0


def _check_positive_number(name: str, value, allow_zero: bool) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (
        value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} is not allowed: expected a number {bound}")


def _check_total_steps(total_steps, name: str = "total_steps") -> None:
    if total_steps is not None and (isinstance(total_steps, bool)
                                    or not isinstance(total_steps, int) or total_steps < 1):
        raise ValueError(f"{name}={total_steps!r} is not allowed: expected None or an "
                         "integer >= 1")


def live_dashboard(cfg=None, **kwargs) -> LiveDashboard:
    """A ``LiveDashboard``; ``cfg`` (RunConfig or TrainConfig) supplies ``total_steps``."""
    if cfg is not None and "total_steps" not in kwargs:
        kwargs["total_steps"] = getattr(cfg, "train", cfg).steps
    return LiveDashboard(**kwargs)


# ----------------------------------------------------------------------------- comparison


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
    in progress with its ETA, and a status table with the latest values of every run.
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
        """The static overlay of every run so far (``figures.training_comparison``)."""
        from blockmem_lite.viz.figures import training_comparison

        if not self.histories:
            raise ValueError("LiveComparison.figure() is not allowed before a run has sent a "
                             "step: train with live.run(name) as a callback")
        return training_comparison(self.histories, title=self.title or "Training runs",
                                   **kwargs)

    def loss_figure(self, **kwargs):
        """Loss only, one panel per family of runs (``figures.loss_curves``)."""
        from blockmem_lite.viz.figures import loss_curves

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
                text += f" · all runs ETA {human_duration(eta_all)}"
        return html.escape(text) + " · line: train loss · ◆ val loss · dotted: peak memory"

    def _status_html(self) -> str:
        from blockmem_lite.viz.figures import color

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


# ----------------------------------------------------------------------------- generic monitor


class LiveMonitor(_LiveView):
    """Trainer callback: probe something every ``every`` steps and show it as it changes.

    ``probe(trainer, rec) -> data`` runs at step 1, every ``every`` steps and at the last
    step (``rec["total_steps"]``); each result is kept in ``snapshots`` as ``(step, data)``.
    ``figure(data) -> go.Figure`` draws one snapshot: in widget mode a ``FigureWidget`` is
    redrawn with it at most ``max_updates_per_s`` times a second (always at the last
    step and at the end); in text mode ``text(data) -> str`` (default: a short repr)
    is printed at most every ``print_every_s`` seconds, and always for the last step.
    ``record(step, data)`` adds a snapshot taken outside the trainer (e.g. step 0).
    ``series=True``: ``figure`` and ``text`` get every snapshot so far, ``[(step, data),
    ...]``, instead of the last data, to draw a curve over training.
    """

    kind = "live monitor"

    def __init__(self, probe: Callable, figure: Callable, text: Callable | None = None,
                 every: int = 10, title: str = "", series: bool = False, mode: str = "auto",
                 max_updates_per_s: float = 4.0, print_every_s: float = 2.0,
                 clock: Callable[[], float] | None = None):
        super().__init__(title, mode, max_updates_per_s, print_every_s, clock)
        self.series = bool(series)
        for name, fn in (("probe", probe), ("figure", figure)):
            if not callable(fn):
                raise ValueError(f"{name}={fn!r} is not allowed: expected a function")
        if text is not None and not callable(text):
            raise ValueError(f"text={text!r} is not allowed: expected None or a function "
                             "data -> str")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every={every!r} is not allowed: expected an integer >= 1")
        self.probe, self.every = probe, every
        self._figure_fn, self._text_fn = figure, text or _short_repr
        self.snapshots: list[tuple[int, object]] = []
        self.total_steps: int | None = None
        self._shown_step = None       # the snapshot last drawn or printed
        self._start()

    @property
    def steps(self) -> list[int]:
        return [step for step, _ in self.snapshots]

    @property
    def data(self) -> list:
        return [data for _, data in self.snapshots]

    def _build_widget(self) -> None:
        import plotly.graph_objects as go

        self.widget = go.FigureWidget()

    # ------------------------------------------------------------------ callbacks

    def on_step(self, trainer, rec: dict) -> None:
        step, total = rec.get("step"), rec.get("total_steps")
        final = bool(total) and step == total
        if step is None or not (final or step == 1 or step % self.every == 0):
            return
        self._add(step, self.probe(trainer, rec), total, final)

    def on_eval(self, trainer, rec: dict) -> None:
        """Evaluations do not trigger a probe (the monitor follows steps)."""

    def on_end(self, trainer, history) -> None:
        if self.snapshots and self._shown_step != self.snapshots[-1][0]:
            self._show(force=True)

    def record(self, step: int, data, total_steps: int | None = None) -> None:
        """Add a snapshot taken outside the trainer (e.g. the model before training)."""
        self._add(step, data, total_steps, final=False)

    # ------------------------------------------------------------------ drawing

    def _add(self, step: int, data, total, final: bool) -> None:
        if self.snapshots and step <= self.snapshots[-1][0]:     # fed a new run: start over
            self.snapshots = []
            self._redraws.reset()
            self._prints.reset()
        self.total_steps = total or self.total_steps
        self.snapshots.append((step, data))
        self._show(force=final)

    def _arg(self):
        """What figure() and text() get: the last data, or every snapshot (series=True)."""
        return list(self.snapshots) if self.series else self.snapshots[-1][1]

    def _show(self, force: bool) -> None:
        step = self.snapshots[-1][0]
        if self.mode == "widget":
            self._show_once()
            if force or self._redraws.due():
                _copy_into(self.widget, self._titled(self._figure_fn(self._arg()), step))
                self.n_updates += 1
                self._redraws.mark()
                self._shown_step = step
        elif self._prints.take() or force:
            self._print(f"{_step_text(step, self.total_steps)}: {self._text_fn(self._arg())}")
            self._shown_step = step

    def _titled(self, fig, step):
        if self.title:
            fig.update_layout(title_text=f"{self.title}: {_step_text(step, self.total_steps)}")
        return fig

    def figure(self):
        """The last snapshot as a static figure (ValueError before the first probe)."""
        if not self.snapshots:
            raise ValueError("LiveMonitor.figure() is not allowed before the first snapshot: "
                             "train with the monitor as a callback, or call record()")
        return self._titled(self._figure_fn(self._arg()), self.snapshots[-1][0])


def _copy_into(widget, fig) -> None:
    """Make the FigureWidget show ``fig``: traces updated in place when they line up."""
    same = len(widget.data) == len(fig.data) and all(
        a.type == b.type for a, b in zip(widget.data, fig.data, strict=True))
    if not same:
        widget.data = ()
        widget.add_traces(list(fig.data))
    with widget.batch_update():
        if same:
            for old, new in zip(widget.data, fig.data, strict=True):
                props = new.to_plotly_json()
                props.pop("type", None)
                props.pop("uid", None)
                old.update(props)
        widget.layout.shapes = ()
        widget.layout.annotations = ()
        widget.update_layout(fig.layout.to_plotly_json())


def _short_repr(data, limit: int = 100) -> str:
    """A default text line for a snapshot: ``k v`` pairs for a dict of numbers, else repr."""
    if isinstance(data, dict) and all(isinstance(v, (int, float)) for v in data.values()):
        text = ", ".join(f"{k} {v:.4g}" for k, v in data.items())
    else:
        text = repr(data)
    return text if len(text) <= limit else text[:limit - 1] + "…"
