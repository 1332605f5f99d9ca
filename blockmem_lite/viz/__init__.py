"""Plots and the live training dashboard: ``from blockmem_lite import viz``, then ``viz.<name>``.

Every figure builder returns a plotly figure and never shows it. By topic:

* ``viz.mechanisms``: what the notebooks draw for each mechanism: masks and attention
  (``mask_heatmap``, ``attention_heatmap``), BCMT's decay and summary weights and gates,
  ARMT's memory matrices, MoC's routing.
* ``viz.training``: ``loss_curves`` and the three-row training figure (loss, tokens/s,
  memory: ``training_summary``, ``training_comparison``).
* ``viz.bench``: ``throughput_vs_length``, ``memory_vs_length`` from bench records.
* ``viz.charts``: generic charts for the notebooks' own numbers (``line_chart``,
  ``line_panels``, ``grouped_bars``, ``scatter_points``, ``bar_compare``, ``heatmap``).
* ``viz.common``: what they share (plotly, the palette ``color``, sizing).

Live views, a widget in notebooks and short text lines in CI or scripts (the mode rule
and the base they share are in ``viz.live_base``):

* ``viz.dashboard``: ``LiveDashboard``, the trainer callback that follows one run;
* ``viz.comparison``: ``LiveComparison``, several runs overlaid in one widget
  (``live.run(name)`` is each run's callback);
* ``viz.monitor``: ``LiveMonitor``, the same for any probe + figure builder (routing,
  memory, recall);
* ``viz.widgets``: ``slider_figure``, sliders next to a figure that do nothing harmful
  headless.

Importing this package is light: each name loads its module (and plotly, ipywidgets)
only when it is first used.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "charts": ("bar_compare", "grouped_bars", "heatmap", "line_chart", "line_panels",
               "scatter_points"),
    "common": ("color", "memory_method_label"),
    "mechanisms": ("attention_heatmap", "chapter_weights_bar", "decay_heatmap",
                   "gate_histogram", "mask_grid", "mask_heatmap", "memory_matrices",
                   "routing_decisions", "routing_heatmap", "summary_weights_heatmap"),
    "training": ("loss_curves", "run_family", "training_comparison", "training_panels",
                 "training_summary", "update_training_panels"),
    "bench": ("memory_vs_length", "throughput_vs_length"),
    "dashboard": ("LiveDashboard", "live_dashboard"),
    "comparison": ("LiveComparison", "live_comparison"),
    "monitor": ("LiveMonitor",),
    "widgets": ("choice", "slider", "slider_figure"),
}
_MODULES = ("bench", "charts", "common", "comparison", "dashboard", "live_base", "mechanisms",
            "monitor", "training", "widgets")
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name):
    if name in _HOME_OF:
        module = importlib.import_module(f"blockmem_lite.viz.{_HOME_OF[name]}")
        return getattr(module, name)
    if name in _MODULES:
        return importlib.import_module(f"blockmem_lite.viz.{name}")
    raise AttributeError(f"module 'blockmem_lite.viz' has no attribute {name!r}")


def __dir__():
    return __all__


__all__ = sorted([*_HOME_OF, *_MODULES])
