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


# ----------------------------------------------------------------------------- dashboard


class LiveDashboard:
    """Trainer callback showing a run as it trains (see the module docstring)."""

    def __init__(self, total_steps: int | None = None, title: str = "", mode: str = "auto",
                 max_updates_per_s: float = 4.0, print_every_s: float = 2.0,
                 clock: Callable[[], float] | None = None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is not allowed: expected one of {', '.join(MODES)}")
        if total_steps is not None and (isinstance(total_steps, bool)
                                        or not isinstance(total_steps, int) or total_steps < 1):
            raise ValueError(f"total_steps={total_steps!r} is not allowed: expected None or an "
                             "integer >= 1")
        _check_positive_number("max_updates_per_s", max_updates_per_s, allow_zero=False)
        _check_positive_number("print_every_s", print_every_s, allow_zero=True)
        self.total_steps = total_steps
        self.title = title
        self.requested_mode = mode
        self.max_updates_per_s = float(max_updates_per_s)
        self.print_every_s = float(print_every_s)
        self._clock = clock if clock is not None else time.monotonic
        self.fallback_reason: str | None = None
        self.widget = None            # ipywidgets.VBox in widget mode
        self._figure_widget = None
        self._status = None
        self._displayed = False
        self._x_range = None
        self.n_updates = 0            # widget redraws
        self.n_printed = 0            # text lines printed
        self._reset_run()
        self.mode = self._resolve_mode(mode)
        if self.fallback_reason and self.mode == "text" and self._announce_fallback:
            self._print(f"live dashboard: widgets unavailable ({self.fallback_reason}); "
                        "printing progress as text")

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
        self._last_refresh: float | None = None
        self._last_print: float | None = None

    def _resolve_mode(self, mode: str) -> str:
        self._announce_fallback = False
        if mode == "text" or (mode == "auto" and headless()):
            return "text"
        if mode == "auto" and not _in_notebook_kernel():
            self.fallback_reason = "not running in a Jupyter kernel"
            return "text"
        try:
            self._build_widget()
        except Exception as exc:  # any failure to build widgets means: use text
            reason = f"{type(exc).__name__}: {exc}"
            if mode == "widget":
                raise RuntimeError(f"mode='widget' is not possible here: {reason}; use "
                                   "mode='auto' to fall back to text") from exc
            self.fallback_reason = reason
            self._announce_fallback = True
            return "text"
        return "widget"

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

    def display(self) -> None:
        """Show the widget in the notebook (widget mode; text mode shows nothing)."""
        if self.mode != "widget":
            return
        from IPython.display import display

        display(self.widget)
        self._displayed = True

    # ------------------------------------------------------------------ callbacks

    def on_step(self, trainer, rec: dict) -> None:
        if self._starts_new_run(rec.get("step")):
            self._reset_run()
        self.finished = False
        self._record_step(rec)
        if self.mode == "widget":
            self._show_once()
            if self._refresh_due():
                self._refresh()
        elif self._print_due():
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

    def _print_due(self) -> bool:
        now = self._clock()
        if self._last_print is not None and now - self._last_print < self.print_every_s:
            return False
        self._last_print = now
        return True

    def _print(self, line: str) -> None:
        prefix = f"[{self.title}] " if self.title else ""
        print(prefix + line, flush=True)
        self.n_printed += 1

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

    def _show_once(self) -> None:
        if not self._displayed and _in_notebook_kernel():
            self.display()

    def _refresh_due(self) -> bool:
        if self._last_refresh is None:
            return True
        return self._clock() - self._last_refresh >= 1.0 / self.max_updates_per_s

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
        self._last_refresh = self._clock()

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
