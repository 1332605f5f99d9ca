"""Plots and the live training dashboard.

* ``blockmem_lite.viz.figures``: plotly figure builders (masks, attention,
  loss curves, training summary, throughput / memory vs length). They return
  figures and never show them.
* ``blockmem_lite.viz.live``: ``LiveDashboard``, the trainer callback that
  draws a widget in notebooks and prints short lines in CI or scripts, and
  ``LiveComparison``, several runs overlaid in one widget (``live.run(name)`` is each
  run's callback), and ``LiveMonitor``, the same for any probe + figure builder
  (routing, memory, recall).
* ``blockmem_lite.viz.widgets``: ``slider_figure``, sliders next to a figure that
  do nothing harmful headless.

Importing this package is light: plotly and ipywidgets load only when a figure
or a widget is built.
"""

from __future__ import annotations

_LIVE_NAMES = ("LiveComparison", "LiveDashboard", "LiveMonitor", "live_comparison",
               "live_dashboard")
_WIDGET_NAMES = ("slider_figure", "slider", "choice")


def __getattr__(name):
    if name in _LIVE_NAMES:
        from blockmem_lite.viz import live

        return getattr(live, name)
    if name in _WIDGET_NAMES:
        from blockmem_lite.viz import widgets

        return getattr(widgets, name)
    if name in ("figures", "live", "widgets"):
        import importlib

        return importlib.import_module(f"blockmem_lite.viz.{name}")
    raise AttributeError(f"module 'blockmem_lite.viz' has no attribute {name!r}")


__all__ = ["LiveComparison", "LiveDashboard", "LiveMonitor", "choice", "figures", "live",
           "live_comparison", "live_dashboard", "slider", "slider_figure", "widgets"]
