"""Sliders next to a figure: interactive in JupyterLab, harmless headless.

    slider_figure(lambda alpha: viz.decay_heatmap(decay_weights(16, alpha)),
                  alpha=slider(0.8, 0.0, 1.0, 0.05, label="decay α"))

``build(**values)`` returns what to show (a plotly figure, any displayable object)
or None when it prints instead. Modes follow the rule of every live view
(``live_base.resolve_mode``): widget mode in a Jupyter kernel unless
``BLOCKMEM_HEADLESS=1``; text mode otherwise, or when ipywidgets cannot be built.
Text mode calls ``build`` once at the default values, shows the result when a
kernel is there to show it, and prints one line naming the values.

Slider specs: ``slider(value, min, max, step=None, label=None)`` (an integer slider
when every number is an int), ``choice(options, value=None, label=None)``; a plain
tuple ``(value, min, max[, step])`` or a list of options works too.

Labels are never cut off: each one is its own HTML widget beside its slider (text that
does not wrap, in a column as wide as the longest label), not the slider's
``description``, whose fixed 80 px box (``temperat…``, ``routed_sc…``) needs a style
model that not every front end applies.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blockmem_lite.viz import live_base

SLIDER_WIDTH = "60%"
SLIDER_MIN_WIDTH = "360px"
LABEL_EM_PER_CHAR = 0.6       # the label column: 0.6 em per character of the longest label


@dataclass(frozen=True)
class Slider:
    """One slider: a number range (``min``/``max``/``step``) or a list of ``options``."""

    value: object
    min: float | None = None
    max: float | None = None
    step: float | None = None
    options: tuple | None = None
    label: str | None = None

    @property
    def is_int(self) -> bool:
        numbers = [self.value, self.min, self.max] + ([self.step] if self.step is not None else [])
        return all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r} is not allowed: expected a number")
    return value


def slider(value, min, max, step=None, label: str | None = None) -> Slider:  # noqa: A002
    """A numeric slider starting at ``value``; ``min <= value <= max``."""
    for name, v in (("value", value), ("min", min), ("max", max)):
        _number(name, v)
    if step is not None and _number("step", step) <= 0:
        raise ValueError(f"step={step!r} is not allowed: expected a number > 0")
    if not min <= value <= max:
        raise ValueError(f"value={value!r} is not allowed: expected min <= value <= max "
                         f"({min} .. {max})")
    return Slider(value=value, min=min, max=max, step=step, label=label)


def choice(options: Sequence, value=None, label: str | None = None) -> Slider:
    """A slider over a list of options (the first one unless ``value`` is given)."""
    options = tuple(options)
    if not options:
        raise ValueError("options=() is not allowed: expected at least one option")
    value = options[0] if value is None else value
    if value not in options:
        raise ValueError(f"value={value!r} is not allowed: expected one of {list(options)}")
    return Slider(value=value, options=options, label=label)


def _as_slider(name: str, spec) -> Slider:
    if isinstance(spec, Slider):
        return spec
    if isinstance(spec, tuple) and len(spec) in (3, 4):
        return slider(*spec)
    if isinstance(spec, list):
        return choice(spec)
    raise ValueError(f"{name}={spec!r} is not allowed: expected slider(...), choice(...), a "
                     "tuple (value, min, max[, step]) or a list of options")


def _make_widget(spec: Slider):
    """The slider itself, without a description (its label is a separate widget)."""
    import ipywidgets

    common = dict(description="", layout=ipywidgets.Layout(width=SLIDER_WIDTH,
                                                           min_width=SLIDER_MIN_WIDTH),
                  continuous_update=False)
    if spec.options is not None:
        return ipywidgets.SelectionSlider(options=list(spec.options), value=spec.value, **common)
    cls = ipywidgets.IntSlider if spec.is_int else ipywidgets.FloatSlider
    step = spec.step if spec.step is not None else (1 if spec.is_int else (spec.max - spec.min) / 100)
    return cls(value=spec.value, min=spec.min, max=spec.max, step=step, **common)


def label_html(text: str, width_em: float) -> str:
    """A slider's label as HTML that is never cut: no wrapping, at least ``width_em`` wide
    (so the sliders of one figure line up), right-aligned next to its slider."""
    return (f'<div style="min-width: {width_em:.1f}em; padding-right: 0.6em; '
            f'text-align: right; white-space: nowrap">{html.escape(str(text))}</div>')


class SliderView:
    """What ``slider_figure`` made: ``mode``, the default ``values``, the ``widget``
    (widget mode: one row per slider, ``labels[name]`` beside ``controls[name]``, the
    figure under them) or the default ``result`` (text mode). Already shown: displaying
    the view again shows nothing."""

    def __init__(self, build: Callable, sliders: dict, title: str, mode: str):
        self.build, self.sliders, self.title = build, sliders, title
        self.values = {name: spec.value for name, spec in sliders.items()}
        self.widget = None
        self.controls: dict = {}
        self.labels: dict = {}
        self.result = None
        self.mode, self.fallback_reason, self._announce = live_base.resolve_mode(
            mode, self._build_widget)

    def _build_widget(self) -> None:
        import ipywidgets

        texts = {name: spec.label or name for name, spec in self.sliders.items()}
        width = LABEL_EM_PER_CHAR * max(len(t) for t in texts.values()) + 0.5
        self.controls = {name: _make_widget(spec) for name, spec in self.sliders.items()}
        self.labels = {name: ipywidgets.HTML(value=label_html(texts[name], width))
                       for name in self.sliders}
        output = ipywidgets.interactive_output(self._run, self.controls)
        rows = [ipywidgets.HBox([self.labels[name], self.controls[name]],
                                layout=ipywidgets.Layout(align_items="center"))
                for name in self.sliders]
        self.widget = ipywidgets.VBox(rows + [output])

    def _run(self, **values):
        from IPython.display import display

        self.values = dict(values)
        shown = self.build(**values)
        if shown is not None:
            display(shown)

    def show_text(self) -> None:
        """Text mode: build once at the defaults; show it when a kernel can; one line."""
        self.result = self.build(**self.values)
        if self.result is not None and live_base._in_notebook_kernel():
            from IPython.display import display

            display(self.result)
        settings = ", ".join(f"{name}={value!r}" for name, value in self.values.items())
        why = f" ({self.fallback_reason})" if self._announce else ""
        print(f"{self.title}: shown at {settings}; the sliders need a Jupyter front end{why}",
              flush=True)

    def _ipython_display_(self) -> None:
        """Shown when made; a cell ending with the call does not show it twice."""

    def __repr__(self) -> str:
        return f"SliderView({self.title!r}, mode={self.mode!r}, values={self.values!r})"


def slider_figure(build: Callable, title: str = "", mode: str = "auto", **sliders) -> SliderView:
    """Show ``build(**values)`` under one slider per keyword (see the module docstring)."""
    if not callable(build):
        raise ValueError(f"build={build!r} is not allowed: expected a function of the sliders")
    if not sliders:
        raise ValueError("slider_figure() needs at least one slider keyword, e.g. "
                         "alpha=slider(0.8, 0.0, 1.0, 0.05)")
    specs = {name: _as_slider(name, spec) for name, spec in sliders.items()}
    view = SliderView(build, specs, title or getattr(build, "__name__", "figure"), mode)
    if view.mode == "widget":
        if live_base._in_notebook_kernel():
            from IPython.display import display

            display(view.widget)
    else:
        view.show_text()
    return view
