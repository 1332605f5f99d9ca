"""Generic charts for the notebooks' own numbers: lines, panels of lines, bars, points and
a labelled heatmap.

Every builder returns a ``plotly.graph_objects.Figure`` and never shows it, so notebooks
decide (``fig.show()`` or leaving ``fig`` as the cell's value) and tests can inspect the
traces. A name keeps one colour of the kit's palette (``common.color``) across a chart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from blockmem_lite.viz.common import (
    ALLOWED_COLOR,
    BLOCKED_COLOR,
    LABEL_PX,
    MARGIN_BOTTOM,
    MARGIN_TOP,
    PHASE_DASHES,
    PLOT_WIDTH_PX,
    _axis_name,
    _check_mapping,
    _check_ndim,
    _finish,
    _heatmap_height,
    _mask_style,
    _mask_trace,
    _panel_px,
    _thinned,
    _to_array,
    _x_label_px,
    color,
    go,
    make_subplots,
)


def _xy(pair, name: str) -> tuple[list, list]:
    """An (x, y) pair of equal-length sequences (tensors, arrays or lists) as lists."""
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ValueError(f"{name} is not allowed: expected an (x, y) pair of sequences, got "
                         f"{type(pair).__name__}")
    x, y = (_to_array(v, name).astype(float if i else object).ravel().tolist()
            for i, v in enumerate(pair))
    if len(x) != len(y):
        raise ValueError(f"{name} is not allowed: x has {len(x)} values and y {len(y)}")
    return x, y


def _flat_series(series: Mapping, name: str) -> list[tuple[str, str, int, int, list, list]]:
    """(label, group, colour index, dash index, x, y) per line: a value is an (x, y) pair, or a
    dict of them (one colour for the group, one dash per inner key)."""
    _check_mapping(series, name, "a name to an (x, y) pair")
    lines = []
    for i, (group, value) in enumerate(series.items()):
        if isinstance(value, Mapping):
            for j, (sub, pair) in enumerate(value.items()):
                x, y = _xy(pair, f"{name}[{group!r}][{sub!r}]")
                lines.append((f"{group}: {sub}", str(group), i, j, x, y))
        else:
            x, y = _xy(value, f"{name}[{group!r}]")
            lines.append((str(group), str(group), i, 0, x, y))
    return lines


def _add_lines(fig: go.Figure, series: Mapping, name: str, mode: str, dashed: Sequence,
               row=None, col=None, legend: set | None = None, colors: dict | None = None) -> None:
    """One trace per line; ``colors`` (group -> colour) and ``legend`` (labels shown) carry
    over between panels so a name keeps its colour and appears once in the legend."""
    where = dict(row=row, col=col) if row is not None else {}
    colors = {} if colors is None else colors
    legend = set() if legend is None else legend
    for label, group, _, j, x, y in _flat_series(series, name):
        c = colors.setdefault(group, color(len(colors)))
        dash = "dash" if label in dashed else PHASE_DASHES[j % len(PHASE_DASHES)]
        fig.add_trace(go.Scatter(x=x, y=y, name=label, legendgroup=label, mode=mode,
                                 showlegend=label not in legend, line=dict(color=c, dash=dash)),
                      **where)
        legend.add(label)


def _add_references(fig: go.Figure, hlines=None, vlines=None, spans=None, **where) -> None:
    """Dotted reference lines ({label: y} / {label: x}) and shaded spans ({label: (x0, x1)})."""
    for label, y in (hlines or {}).items():
        fig.add_hline(y=y, line_dash="dot", line_color="#555555", annotation_text=label, **where)
    for label, x in (vlines or {}).items():
        fig.add_vline(x=x, line_dash="dash", line_color="#555555", annotation_text=label, **where)
    for i, (label, (x0, x1)) in enumerate((spans or {}).items()):
        fig.add_vrect(x0=x0, x1=x1, fillcolor=color(2 + i), opacity=0.12, line_width=0,
                      annotation_text=label, annotation_position="top left", **where)


def _log_ticks(fig: go.Figure, xs: list, **where) -> None:
    """Plain integer tick labels at the data's x values on a log axis (few values only)."""
    values = sorted({v for v in xs if isinstance(v, (int, float)) and v > 0})
    fig.update_xaxes(type="log", **where)
    if 0 < len(values) <= 12:
        fig.update_xaxes(tickmode="array", tickvals=values,
                         ticktext=[f"{v:g}" for v in values], **where)


def line_chart(series: Mapping, title: str = "", x_title: str = "", y_title: str = "",
               log_x: bool = False, log_y: bool = False, y_range=None,
               y_tickformat: str | None = None, hlines: Mapping | None = None,
               vlines: Mapping | None = None, spans: Mapping | None = None,
               dashed: Sequence = (), mode: str = "lines+markers") -> go.Figure:
    """Lines against a shared x axis, one colour per series.

    ``series``: name -> (x, y), or name -> {sub: (x, y)} (one colour per name, one dash
    per sub, e.g. run -> {"old facts": ..., "new facts": ...}). ``dashed``: names drawn
    dashed. ``hlines`` {label: y}, ``vlines`` {label: x}: reference lines; ``spans``
    {label: (x0, x1)}: shaded x ranges. ``y_tickformat`` e.g. ".0%".
    """
    fig = go.Figure()
    _add_lines(fig, series, "series", mode, dashed)
    _add_references(fig, hlines, vlines, spans)
    if log_x:
        _log_ticks(fig, [v for d in fig.data for v in d.x])
        # plotly draws a span or a vline in data units on a log axis, but places its label
        # in log10 units: a label at x = 128 would stretch the axis to 1e128
        for note in fig.layout.annotations:
            if note.xref == "x" and note.x is not None and note.x > 0:
                note.x = math.log10(note.x)
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title, type="log" if log_y else "linear", range=y_range,
                     tickformat=y_tickformat)
    return _finish(fig, title, hovermode="x unified")


def line_panels(panels: Mapping, title: str = "", x_title: str | Sequence = "",
                y_title: str | Sequence = "", log_x: bool = False, log_y: bool = False,
                hlines: Mapping | None = None, shared_y: bool = False, dashed: Sequence = (),
                mode: str = "lines+markers", height: int = 400,
                vlines: Mapping | None = None) -> go.Figure:
    """Several line charts side by side: ``panels`` is panel title -> series (name -> (x, y)).

    A name keeps its colour in every panel and appears once in the legend.
    ``x_title`` / ``y_title``: one string for all panels or one per panel;
    ``hlines`` / ``vlines``: panel title -> {label: y} / {label: x}.
    """
    _check_mapping(panels, "panels", "a panel title to a dict of (x, y) series")
    n = len(panels)
    x_titles, y_titles = (_per_panel(t, n, name) for t, name in ((x_title, "x_title"),
                                                                  (y_title, "y_title")))
    fig = make_subplots(rows=1, cols=n, subplot_titles=[str(p) for p in panels],
                        shared_yaxes=shared_y, horizontal_spacing=0.08)
    legend, colors = set(), {}
    for col, (panel, series) in enumerate(panels.items(), start=1):
        _add_lines(fig, series, f"panels[{panel!r}]", mode, dashed, row=1, col=col,
                   legend=legend, colors=colors)
        _add_references(fig, (hlines or {}).get(panel), (vlines or {}).get(panel), row=1,
                        col=col)
        if log_x:
            _log_ticks(fig, [v for d in fig.data if d.xaxis == _axis_name("x", col)
                             for v in d.x], row=1, col=col)
        fig.update_xaxes(title=x_titles[col - 1], row=1, col=col)
        if not shared_y or col == 1:
            fig.update_yaxes(title=y_titles[col - 1], row=1, col=col)
    fig.update_yaxes(type="log" if log_y else "linear")
    return _finish(fig, title, height=height)


def _per_panel(value, n: int, name: str) -> list[str]:
    if isinstance(value, str):
        return [value] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries, which is not allowed: expected "
                         f"one string or one per panel ({n})")
    return values


def grouped_bars(groups: Mapping, title: str = "", x_title: str = "", y_title: str = "",
                 log_y: bool = False, y_range=None, y_tickformat: str | None = None,
                 hlines: Mapping | None = None, text_format: str | None = None) -> go.Figure:
    """Grouped bars: ``groups`` is series name -> {category: value} (one colour per series).

    ``text_format`` (e.g. ".0%") prints each value above its bar; ``hlines`` {label: y}.
    """
    _check_mapping(groups, "groups", "a series name to a dict {category: value}")
    fig = go.Figure()
    for i, (name, values) in enumerate(groups.items()):
        _check_mapping(values, f"groups[{name!r}]", "a category to a number")
        text = dict(texttemplate=f"%{{y:{text_format}}}", textposition="outside") \
            if text_format else {}
        fig.add_trace(go.Bar(x=[str(k) for k in values], y=[float(v) for v in values.values()],
                             name=str(name), marker_color=color(i), **text))
    _add_references(fig, hlines)
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title, type="log" if log_y else "linear", range=y_range,
                     tickformat=y_tickformat)
    return _finish(fig, title, barmode="group")


def scatter_points(points: Mapping, title: str = "", x_title: str = "",
                   y_title: str = "") -> go.Figure:
    """One labelled marker per name: ``points`` is name -> (x, y) numbers (e.g. speed, loss)."""
    _check_mapping(points, "points", "a name to an (x, y) pair of numbers")
    fig = go.Figure()
    for i, (name, pair) in enumerate(points.items()):
        x, y = _xy(([pair[0]], [pair[1]]) if isinstance(pair, (tuple, list)) and len(pair) == 2
                   else pair, f"points[{name!r}]")
        fig.add_trace(go.Scatter(x=x, y=y, name=str(name), mode="markers+text", text=[str(name)],
                                 textposition="top center",
                                 marker=dict(size=14, color=color(i))))
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title)
    return _finish(fig, title, showlegend=False)


def bar_compare(values: Mapping, title: str = "", y_title: str = "",
                reference: float | None = None, reference_label: str = "") -> go.Figure:
    """One bar per name (e.g. final val loss per mechanism), with an optional reference line."""
    if not isinstance(values, Mapping) or not values:
        raise ValueError(f"values={type(values).__name__} is not allowed: expected a non-empty "
                         "dict mapping a name to a number")
    names = [str(n) for n in values]
    fig = go.Figure(go.Bar(x=names, y=list(values.values()),
                           marker_color=[color(i) for i in range(len(names))],
                           texttemplate="%{y:.3g}", textposition="outside"))
    if reference is not None:
        fig.add_hline(y=reference, line_dash="dash", line_color="#555555",
                      annotation_text=reference_label)
    fig.update_yaxes(title=y_title)
    return _finish(fig, title, showlegend=False)


def heatmap(z, x: Sequence | None = None, y: Sequence | None = None, title: str = "",
            x_title: str = "", y_title: str = "", colorscale="Blues",
            zmin: float | None = None, zmax: float | None = None, zmid: float | None = None,
            colorbar_title: str = "", height: int | None = None,
            labels: Sequence = ("False", "True")) -> go.Figure:
    """A matrix ``z`` (rows, cols) as a heatmap, row 0 on top; ``x``/``y`` label the columns
    and rows (one label each, thinned when too many to read).

    The colour scale and colour-bar title are the caller's (set on the trace, so
    ``fig.update_traces(colorscale=...)`` also wins). A boolean ``z`` is drawn in two
    colours with a colour-bar legend (``labels``: what False and True mean). Without a
    ``height``, the figure grows with the rows (``CELL_PX`` per row, up to a cap).
    """
    raw = _to_array(z, "z")
    _check_ndim(raw, "z", (2,), "a 2-D (rows, columns) matrix")
    n_rows, n_cols = raw.shape
    for names, n, name in ((x, n_cols, "x"), (y, n_rows, "y")):
        if names is not None and len(names) != n:
            raise ValueError(f"{name} has {len(names)} labels, which is not allowed: expected "
                             f"one per {'column' if name == 'x' else 'row'} ({n})")
    x_labels = None if x is None else list(x)
    y_labels = None if y is None else [str(v) for v in y]
    if raw.dtype == bool:
        _, labels = _mask_style(None, labels)
        trace = _mask_trace(raw, True, (BLOCKED_COLOR, ALLOWED_COLOR), labels)
        trace.update(x=x_labels, y=y_labels, hovertemplate="%{y}, %{x}: %{text}<extra></extra>")
    else:
        trace = go.Heatmap(z=raw.astype(float), x=x_labels, y=y_labels, colorscale=colorscale,
                           zmin=zmin, zmax=zmax, zmid=zmid,
                           colorbar=dict(title=dict(text=colorbar_title)))
    fig = go.Figure(trace)
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title, autorange="reversed")
    panel = _panel_px(n_rows) if height is None else max(height - MARGIN_TOP - MARGIN_BOTTOM, 60)
    if y_labels is not None:
        fig.update_yaxes(**_thinned(y_labels, panel, LABEL_PX, values=y_labels))
    if x_labels is not None:
        fig.update_xaxes(**_thinned([str(v) for v in x_labels], PLOT_WIDTH_PX,
                                    _x_label_px(x_labels), values=x_labels))
    return _finish(fig, title, height=height or _heatmap_height(n_rows),
                   margin=dict(t=MARGIN_TOP if title else 50, b=MARGIN_BOTTOM))
