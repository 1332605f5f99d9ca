"""Plots and the live training dashboard.

* ``blockmem_lite.viz.figures``: plotly figure builders (masks, attention,
  loss curves, training summary, throughput / memory vs length). They return
  figures and never show them.
* ``blockmem_lite.viz.live``: ``LiveDashboard``, the trainer callback that
  draws a widget in notebooks and prints short lines in CI or scripts.

Importing this package is light: plotly and ipywidgets load only when a figure
or a widget is built.
"""

from __future__ import annotations

_LIVE_NAMES = ("LiveDashboard", "live_dashboard")


def __getattr__(name):
    if name in _LIVE_NAMES:
        from blockmem_lite.viz import live

        return getattr(live, name)
    if name in ("figures", "live"):
        import importlib

        return importlib.import_module(f"blockmem_lite.viz.{name}")
    raise AttributeError(f"module 'blockmem_lite.viz' has no attribute {name!r}")


__all__ = ["LiveDashboard", "figures", "live", "live_dashboard"]
