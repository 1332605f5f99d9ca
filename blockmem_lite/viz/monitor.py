"""A live view of anything worth watching while a model trains (routing, memory, recall).

``LiveMonitor`` runs a ``probe(trainer, rec) -> data`` every ``every`` steps and draws it
with a ``figure(data) -> go.Figure`` builder (plus an optional ``text(data) -> str`` for
text mode), in the mode every live view follows (``live_base.resolve_mode``):

    monitor = LiveMonitor(probe=lambda trainer, rec: {"norm": weight_norm(trainer.model)},
                          figure=lambda d: charts.bar_compare(d), every=10, title="norm")
"""

from __future__ import annotations

from typing import Callable

from blockmem_lite.viz.live_base import FigureArea, _LiveView, _step_text


class LiveMonitor(_LiveView):
    """Trainer callback: probe something every ``every`` steps and show it as it changes.

    ``probe(trainer, rec) -> data`` runs at step 1, every ``every`` steps and at the last
    step (``rec["total_steps"]``); each result is kept in ``snapshots`` as ``(step, data)``.
    ``figure(data) -> go.Figure`` draws one snapshot: in widget mode (shown where the
    monitor is made) the figure it returns is drawn whole at most ``max_updates_per_s``
    times a second (always at the last step and at the end, when it stays as a plain
    output; ``live_figure`` is the last one drawn); in text mode ``text(data) -> str``
    (default: a short repr)
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
        self._area = FigureArea()
        self.widget = self._area.widget
        self._parts = [self._area]

    @property
    def live_figure(self):
        """The figure the widget shows (None before the first drawing, and in text mode)."""
        return self._area.figure if self.mode == "widget" else None

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
        if self.mode == "widget":
            self._area.settle()

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
            if force or self._redraws.due():
                self._area.draw(self._titled(self._figure_fn(self._arg()), step))
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


def _short_repr(data, limit: int = 100) -> str:
    """A default text line for a snapshot: ``k v`` pairs for a dict of numbers, else repr."""
    if isinstance(data, dict) and all(isinstance(v, (int, float)) for v in data.values()):
        text = ", ".join(f"{k} {v:.4g}" for k, v in data.items())
    else:
        text = repr(data)
    return text if len(text) <= limit else text[:limit - 1] + "…"
