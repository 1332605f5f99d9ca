"""The live training dashboard: a widget in notebooks, short text lines elsewhere.

    dash = LiveDashboard(total_steps=cfg.train.steps, title="dense")
    history = Trainer(model, cfg.train, train_data, val_data, callbacks=[dash]).fit()
    dash.figure()            # the static summary of the run (loss, tokens/s, memory)

Modes:

* ``widget``: an ipywidgets box with a status line (step, loss, val loss,
  tokens/s, peak memory and how it was read, elapsed, ETA) above a plotly
  ``FigureWidget`` of train and validation loss. Redrawn at most
  ``max_updates_per_s`` times a second (points are buffered in between) and
  always on evaluation and at the end.
* ``text``: one compact line at most every ``print_every_s`` seconds, plus a
  line per evaluation and a final summary line.
* ``auto`` (default): text when ``BLOCKMEM_HEADLESS=1`` (CI: kernels driven by
  nbval look exactly like a notebook, so only the variable can tell) or outside
  a Jupyter kernel; otherwise widget, falling back to text when the widget
  cannot be built (e.g. plotly >= 6 without ``anywidget``). The reason is kept
  in ``fallback_reason``.

A dashboard follows one run; use a fresh one (or a distinct ``title``) per run.
If it is fed a step not after its last one, it starts over as a new run.

``LiveMonitor`` is the generic version for anything else worth watching while a
model trains (routing, memory norms, recall): a ``probe(trainer, rec) -> data``
run every ``every`` steps and a ``figure(data) -> go.Figure`` builder (plus an
optional ``text(data) -> str`` for text mode). Both classes share one base,
``_LiveView``: the same mode rule, the same ``Throttle`` for redraws and prints.

    monitor = LiveMonitor(probe=lambda trainer, rec: {"norm": weight_norm(trainer.model)},
                          figure=lambda d: figures.bar_compare(d), every=10, title="norm")
"""

from __future__ import annotations

import html
import os
import sys
import time
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


# ----------------------------------------------------------------------------- dashboard


class LiveDashboard(_LiveView):
    """Trainer callback showing a run as it trains (see the module docstring)."""

    kind = "live dashboard"

    def __init__(self, total_steps: int | None = None, title: str = "", mode: str = "auto",
                 max_updates_per_s: float = 4.0, print_every_s: float = 2.0,
                 clock: Callable[[], float] | None = None):
        super().__init__(title, mode, max_updates_per_s, print_every_s, clock)
        if total_steps is not None and (isinstance(total_steps, bool)
                                        or not isinstance(total_steps, int) or total_steps < 1):
            raise ValueError(f"total_steps={total_steps!r} is not allowed: expected None or an "
                             "integer >= 1")
        self.total_steps = total_steps
        self._figure_widget = None
        self._status = None
        self._x_range = None
        self._reset_run()
        self._start()

    # ------------------------------------------------------------------ setup

    def _reset_run(self) -> None:
        """Forget the points of a previous run (the widget, if any, is kept)."""
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
        self._redraws.reset()
        self._prints.reset()

    def _build_widget(self) -> None:
        import ipywidgets
        import plotly.graph_objects as go

        from blockmem_lite.viz.figures import TEMPLATE, color

        fig = go.FigureWidget()
        fig.add_scatter(x=[], y=[], mode="lines", name="train loss",
                        line=dict(color=color(0), width=1.2))
        fig.add_scatter(x=[], y=[], mode="lines+markers", name="val loss",
                        line=dict(color=color(1), width=1, dash="dot"), cliponaxis=False,
                        marker=dict(color=color(1), size=8, symbol="diamond"))
        fig.update_layout(template=TEMPLATE, height=320, margin=dict(l=60, r=20, t=30, b=40),
                          xaxis_title="step", yaxis_title="loss",
                          legend=dict(orientation="h", y=1.12, x=0))
        self._figure_widget = fig
        self._status = ipywidgets.HTML(value=self._status_html())
        self.widget = ipywidgets.VBox([self._status, fig])

    # ------------------------------------------------------------------ callbacks

    def on_step(self, trainer, rec: dict) -> None:
        if self._starts_new_run(rec.get("step")):
            self._reset_run()
        self.finished = False
        self._record_step(rec)
        if self.mode == "widget":
            self._show_once()
            if self._redraws.due():
                self._refresh()
        elif self._prints.take():
            self._print(format_progress(rec))

    def on_eval(self, trainer, rec: dict) -> None:
        if rec.get("val_loss") is None:
            return
        if self.finished and self._starts_new_run(rec.get("step")):
            self._reset_run()
        self.val_steps.append(rec.get("step"))
        self.val_losses.append(rec["val_loss"])
        if self.mode == "widget":
            self._show_once()
            self._refresh()
        else:
            self._print("eval " + format_progress({"total_steps": self._total(), **rec}))

    def on_end(self, trainer, history) -> None:
        self.history = history
        self.finished = True
        if self.mode == "widget":
            self._show_once()
            self._refresh()
        else:
            self._print(self._final_line())

    # ------------------------------------------------------------------ state

    def _record_step(self, rec: dict) -> None:
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

    def _starts_new_run(self, step) -> bool:
        """A step not after the last one recorded means a new run is being fed."""
        return bool(self.steps) and step is not None and step <= self.steps[-1]

    def _total(self) -> int | None:
        """The trainer's step count when it sends one, else the one given at construction."""
        return self.last_step.get("total_steps") or self.total_steps

    def _interrupted(self) -> bool:
        return bool(self.history is not None and _value(self.history, "interrupted", False))

    def as_history(self) -> dict:
        """The points received so far, as a dict with ``train.History``'s keys."""
        return {"step": list(self.steps), "loss": list(self.losses),
                "tokens_per_s": list(self.tokens_per_s), "memory_bytes": list(self.memory_bytes),
                "elapsed_s": list(self.elapsed_s), "val_step": list(self.val_steps),
                "val_loss": list(self.val_losses), "memory_method": self.memory_method or "",
                "total_steps": self._total() or 0, "interrupted": False}

    def figure(self):
        """Static summary figure of the run (from the trainer's history once it ended)."""
        from blockmem_lite.viz.figures import training_summary

        history = self.history if self.history is not None else self.as_history()
        return training_summary(history, title=self.title or "Training run")

    # ------------------------------------------------------------------ text mode

    def _final_line(self) -> str:
        total = self._total()
        done = self.steps[-1] if self.steps else _last(_value(self.history, "step", []))
        elapsed = self.last_step.get("elapsed_s")
        head = "interrupted at" if self._interrupted() else "done:"
        parts = [f"{head} {_step_text(done, total)} in {human_duration(elapsed)}"]
        parts += self._summary_parts()
        return " | ".join(parts)

    def _summary_parts(self) -> list[str]:
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

    # ------------------------------------------------------------------ widget mode

    def _refresh(self) -> None:
        """Redraw the widget with every point buffered so far (one batched message)."""
        fig = self._figure_widget
        total = self._total()
        with fig.batch_update():
            train, val = fig.data
            train.x, train.y = tuple(self.steps), tuple(self.losses)
            val.x, val.y = tuple(self.val_steps), tuple(self.val_losses)
            if total and self._x_range != total:
                fig.layout.xaxis.range = [0, total]
                self._x_range = total
        self._status.value = self._status_html()
        self.n_updates += 1
        self._redraws.mark()

    def _status_html(self) -> str:
        rec, total = self.last_step, self._total()
        parts = []
        if self.title:
            parts.append(f"<b>{html.escape(self.title)}</b>")
        if not rec:
            parts.append("waiting for the first step…")
        else:
            parts.append(_step_text(rec.get("step"), total))
            parts += [html.escape(p) for p in self._summary_parts()]
            parts.append(f"{human_duration(rec.get('elapsed_s'))} elapsed")
            if self.finished:
                parts.append("<b>interrupted</b>" if self._interrupted() else "<b>done</b>")
            elif total:
                parts.append(f"ETA {human_duration(_eta_s(rec, total))}")
        return ('<div style="font-family: monospace; font-size: 13px">'
                + " · ".join(parts) + "</div>")


def _last(values):
    values = list(values or [])
    return values[-1] if values else 0


def _check_positive_number(name: str, value, allow_zero: bool) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (
        value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} is not allowed: expected a number {bound}")


def live_dashboard(cfg=None, **kwargs) -> LiveDashboard:
    """A ``LiveDashboard``; ``cfg`` (RunConfig or TrainConfig) supplies ``total_steps``."""
    if cfg is not None and "total_steps" not in kwargs:
        kwargs["total_steps"] = getattr(cfg, "train", cfg).steps
    return LiveDashboard(**kwargs)


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
