"""What every live view shares: the mode rule, the throttles, printing and display.

The live views (``live.LiveDashboard``, ``comparison.LiveComparison``,
``monitor.LiveMonitor``, and ``widgets.slider_figure``) draw a widget in notebooks and
print short text lines in CI or scripts. Modes:

* ``widget``: a chart (and a status line), shown where the view is made, redrawn at most
  ``max_updates_per_s`` times a second (``Throttle``; points are buffered in between);
* ``text``: one compact line at most every ``print_every_s`` seconds;
* ``auto`` (default): text when ``BLOCKMEM_HEADLESS=1`` (CI: kernels driven by
  nbval look exactly like a notebook, so only the variable can tell) or outside
  a Jupyter kernel; otherwise widget, falling back to text when the widget
  cannot be built (e.g. ipywidgets is not installed). The reason is kept in
  ``fallback_reason``.

``resolve_mode`` is that rule; ``_LiveView`` the base class the views build on.

A live chart is a plain plotly figure drawn whole, each redraw, into an ipywidgets
``Output`` (``FigureArea``), not a plotly ``FigureWidget``: a FigureWidget carries its own
copy of plotly.js (5 MB) to the browser and into the notebook's saved widget state, draws
nothing until the browser has compiled it (seconds on a busy machine, longer than a fast
run), and plotly.js refuses some of its layout edits (a subplot axis and its parts set at
once). A plain figure is drawn by JupyterLab's own plotly renderer, loaded once per page.
When the run ends, the last figure replaces the widget as a plain output (``settle``), and
the status line above it is one from the start (``StatusLine``): a saved notebook shows
both when it reopens, without widget state and without a kernel.
Nothing here imports plotly, ipywidgets or IPython at import time.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

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


def _step_text(step, total) -> str:
    return f"step {step}/{total}" if total else f"step {step}"


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


STATUS_CLASS = "blockmem-live-status"     # the status line's HTML, for tests and styles


def _display(obj):
    """Show ``obj`` as an output that can be replaced later: its display handle."""
    from IPython.display import display

    return display(obj, display_id=True)


class StatusLine:
    """A line of HTML above a live chart: a plain output, replaced in place on ``update``
    (``value`` is its HTML). Outside a kernel nothing is shown."""

    def __init__(self, value: str = ""):
        self.value = value
        self._handle = None

    def show(self) -> None:
        if _in_notebook_kernel():
            self._handle = _display(self._html())

    def update(self, value: str) -> None:
        if value != self.value:
            self.value = value
            if self._handle is not None:
                self._handle.update(self._html())

    def _html(self):
        from IPython.display import HTML

        return HTML(f'<div class="{STATUS_CLASS}">{self.value}</div>')


class FigureArea:
    """Where a live view draws: an ipywidgets ``Output`` showing one plotly figure.

    ``draw(fig)`` replaces the figure shown by ``fig`` (``clear_output(wait=True)``: the
    old one stays until the new one arrives, so nothing flickers); the area keeps the
    figure's height while it redraws. ``settle()`` swaps the widget for the last figure as
    a plain output (a run ended) and empties it; the next ``draw`` brings it back.
    ``figure`` is the figure last drawn. Outside a kernel nothing is shown (an Output
    there would print), only ``figure`` is kept.
    """

    def __init__(self):
        import ipywidgets

        self.widget = ipywidgets.Output()
        self.figure = None
        self.settled = False
        self._handle = None

    def show(self) -> None:
        if _in_notebook_kernel():
            self._handle = _display(self.widget)

    def draw(self, fig) -> None:
        self.figure = fig
        height = fig.layout.height
        if height:
            self.widget.layout.min_height = f"{int(height)}px"
        if self._handle is None:
            return
        if self.settled:
            self._handle.update(self.widget)
            self.settled = False
        from IPython.display import display

        with self.widget:
            self.widget.clear_output(wait=True)
            display(fig)

    def settle(self) -> None:
        if self._handle is not None and self.figure is not None and not self.settled:
            # the figure's own bundle: display(fig) would ignore the display id
            self._handle.update(self.figure._repr_mimebundle_(), raw=True)
            with self.widget:                 # off the page: keep no copy in widget state
                self.widget.clear_output()
            self.settled = True


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
        self._parts: list = []        # what the widget mode shows, top to bottom
        self._displayed = False
        self.n_updates = 0            # widget redraws
        self.n_printed = 0            # text lines printed

    def _start(self) -> None:
        """Pick the mode (building the widget if it is widget mode) and show the widget
        where the view is made; say so on a fallback."""
        self.mode, self.fallback_reason, announce = resolve_mode(self.requested_mode,
                                                                 self._build_widget)
        if announce:
            self._print(f"{self.kind}: widgets unavailable ({self.fallback_reason}); "
                        "printing progress as text")
        self._show_once()

    def _build_widget(self) -> None:
        """Build ``self.widget`` and ``self._parts`` (a ``StatusLine``, a ``FigureArea``);
        each view (dashboard, monitor) defines its own."""
        raise TypeError(f"{type(self).__name__} defines no widget: a live view must override "
                        "_build_widget")

    def _show_once(self) -> None:
        """Show the view's parts in the notebook, once (widget mode, in a kernel)."""
        if self.mode == "widget" and not self._displayed and _in_notebook_kernel():
            for part in self._parts:
                part.show()
            self._displayed = True

    def _print(self, line: str) -> None:
        prefix = f"[{self.title}] " if self.title else ""
        print(prefix + line, flush=True)
        self.n_printed += 1
