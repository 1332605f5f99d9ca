"""Training curves: loss curves of several runs (faceted by family), and the three-row
figure of loss, tokens/s and memory on one step axis that the live dashboards fill.

Runs are ``train.History`` objects or plain dicts with the same keys (``step``, ``loss``,
``val_step``, ``val_loss``, ``tokens_per_s``, ``memory_bytes``, ``memory_method``, ...).
Every builder returns a ``plotly.graph_objects.Figure`` and never shows it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

from blockmem_lite.units import human_memory, human_rate
from blockmem_lite.viz.common import (
    LEGEND_BELOW,
    TEMPLATE,
    _axis_name,
    _check_mapping,
    _finish,
    color,
    go,
    make_subplots,
    memory_method_label,
)

X_AXES = ("step", "tokens", "time")


# ----------------------------------------------------------------------------- histories


def _series(history, key: str) -> list:
    """``history.key`` or ``history[key]`` as a list; [] when the run has none."""
    value = history.get(key) if isinstance(history, Mapping) else getattr(history, key, None)
    return list(value) if value is not None else []


def _scalar(history, key: str, default=None):
    if isinstance(history, Mapping):
        return history.get(key, default)
    return getattr(history, key, default)


def _x_values(history, steps: list, x: str, tokens_per_step) -> list:
    """The x coordinate of training points ``steps`` in the unit ``x``."""
    if x == "step":
        return list(steps)
    if x == "time":
        return _interp(steps, _series(history, "step"), _series(history, "elapsed_s"))
    tokens = _series(history, "tokens")
    if tokens:
        return _interp(steps, _series(history, "step"), tokens)
    if tokens_per_step is None:
        raise ValueError("x='tokens' is not allowed for a history without a 'tokens' series "
                         "unless tokens_per_step is given (batch_size * seq_len)")
    return [s * tokens_per_step for s in steps]


def _interp(points: list, xp: list, fp: list) -> list:
    """Values of the series (xp -> fp) at ``points`` (linear, clamped at the ends)."""
    if not points:
        return []
    if not xp or len(xp) != len(fp):
        raise ValueError("history is not allowed: its 'step' series and the series used for "
                         f"the x axis differ in length ({len(xp)} vs {len(fp)})")
    return np.interp(points, xp, fp).tolist()


# ----------------------------------------------------------------------------- loss curves

FACET_AUTO_RUNS = 4                       # facet="auto" splits charts of more runs than this
REFERENCE_COLOR = "#9A9A9A"


def run_family(name) -> str:
    """The family of a run name, for facets: its first word, ``"bcmt L=8"`` -> ``"bcmt"``,
    ``"MoC, frozen bank"`` -> ``"MoC"``, ``"dense (iso-FLOP)"`` -> ``"dense"``."""
    words = re.split(r"[\s,;:(/]+", str(name).strip(), maxsplit=1)
    return words[0] or str(name)


def _facets(names: list, facet, max_overlaid: int) -> dict:
    """{panel title: [run names]} in first-seen order (one panel "" when not faceted)."""
    if facet is None or facet is False:
        return {"": list(names)}
    if facet == "auto":
        families = [run_family(n) for n in names]
        if len(names) <= max_overlaid or len(set(families)) < 2:
            return {"": list(names)}
        facet = "family"
    if facet == "family":
        key = run_family
    elif isinstance(facet, Mapping):
        missing = [n for n in names if n not in facet]
        if missing:
            raise ValueError(f"facet is not allowed: it names no panel for {missing}")
        key = facet.__getitem__
    elif callable(facet):
        key = facet
    else:
        raise ValueError(f"facet={facet!r} is not allowed: expected 'auto', 'family', None, a "
                         "dict run -> panel or a function run name -> panel")
    panels: dict[str, list] = {}
    for n in names:
        panels.setdefault(str(key(n)), []).append(n)
    return panels


def _reference_run(panels: dict, reference) -> str | None:
    """The run drawn grey in the other panels: ``reference``, or with "auto" a run named
    "dense" that has a panel to itself."""
    if reference is None or len(panels) < 2:
        return None
    if reference == "auto":
        alone = [runs[0] for runs in panels.values() if len(runs) == 1]
        return next((n for n in alone if run_family(n) == "dense"), None)
    if not any(reference in runs for runs in panels.values()):
        raise ValueError(f"reference={reference!r} is not allowed: it is none of the runs")
    return reference


def loss_curves(histories: Mapping, x: str = "step", title: str = "Loss",
                tokens_per_step: int | Mapping | None = None, log_y: bool = False,
                facet="auto", reference="auto",
                max_overlaid: int = FACET_AUTO_RUNS) -> go.Figure:
    """Train loss (thin line) and validation loss (diamonds) for several runs.

    ``histories``: run name -> ``train.History`` or a dict with the same keys.
    ``x``: "step", "tokens" (needs a ``tokens`` series or ``tokens_per_step``,
    a number or a dict per run) or "time" (elapsed seconds).

    Many runs on one chart are a tangle, so ``facet`` splits them into panels sharing both
    axes: "auto" (the default) gives one panel per family (``run_family``: dense / bcmt /
    honly ...) once more than ``max_overlaid`` runs of two or more families are drawn;
    "family" always; None never; or a dict run -> panel, or a function name -> panel.
    ``reference``: a run drawn thin and grey in every other panel so the panels still
    compare ("auto": a run named "dense" alone in its panel; None: none).
    One legend entry per run (its train and val traces toggle together), laid out in rows
    under the chart: it wraps, and never scrolls a run out of sight.
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is not allowed: expected one of {', '.join(X_AXES)}")
    if not isinstance(histories, Mapping) or not histories:
        raise ValueError(f"histories={type(histories).__name__} is not allowed: expected a "
                         "non-empty dict mapping a run name to a History or dict")
    names = list(histories)
    panels = _facets(names, facet, max_overlaid)
    ref = _reference_run(panels, reference)
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    titles = list(panels) if len(panels) > 1 else None
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_xaxes="all",
                        shared_yaxes="all", horizontal_spacing=0.04,
                        vertical_spacing=0.12 if rows > 1 else 0.0)

    def per_step(name):
        return (tokens_per_step.get(name) if isinstance(tokens_per_step, Mapping)
                else tokens_per_step)

    for p, runs in enumerate(panels.values()):
        where = dict(row=p // cols + 1, col=p % cols + 1)
        if ref is not None and ref not in runs:
            h = histories[ref]
            fig.add_trace(go.Scatter(
                x=_x_values(h, _series(h, "step"), x, per_step(ref)), y=_series(h, "loss"),
                mode="lines", name=f"{ref} (reference)", legendgroup=str(ref),
                showlegend=False, hoverinfo="skip", opacity=0.8,
                line=dict(color=REFERENCE_COLOR, width=1)), **where)
        for name in runs:
            _add_loss_traces(fig, str(name), histories[name], color(names.index(name)), x,
                             per_step(name), **where)
    x_titles = {"step": "step", "tokens": "tokens seen", "time": "elapsed (s)"}
    fig.update_xaxes(title=x_titles[x], row=rows)
    fig.update_yaxes(title="loss (nats/token)", col=1)
    fig.update_yaxes(type="log" if log_y else "linear")
    key = "line: train loss · ◆ val loss" + (f" · grey: {ref}" if ref is not None else "")
    return _finish(fig, f"{title}<br><sup>{key}</sup>", hovermode="closest",
                   height=(420 if rows == 1 else 330 * rows) + 24 * math.ceil(len(names) / 4),
                   legend=LEGEND_BELOW, margin=dict(t=90, b=60))


def _add_loss_traces(fig: go.Figure, name: str, history, line_color: str, x: str,
                     tokens_per_step, row: int | None = None, col: int | None = None) -> None:
    """Train loss (thin line, the run's legend entry) and val loss (diamonds, same group)."""
    steps, losses = _series(history, "step"), _series(history, "loss")
    val_steps, val_losses = _series(history, "val_step"), _series(history, "val_loss")
    where = dict(row=row, col=col) if row is not None else {}
    fig.add_trace(go.Scatter(x=_x_values(history, steps, x, tokens_per_step), y=losses,
                             mode="lines", name=name, legendgroup=name,
                             hovertemplate=f"{name} train %{{y:.4f}}<extra></extra>",
                             line=dict(color=line_color, width=1.2)), **where)
    if val_steps:
        fig.add_trace(go.Scatter(x=_x_values(history, val_steps, x, tokens_per_step),
                                 y=val_losses, mode="lines+markers", name=f"{name} val",
                                 legendgroup=name, showlegend=False, cliponaxis=False,
                                 hovertemplate=f"{name} val %{{y:.4f}}<extra></extra>",
                                 line=dict(color=line_color, width=1, dash="dot"),
                                 marker=dict(color=line_color, size=8, symbol="diamond")),
                      **where)


# ----------------------------------------------------------------------------- training panels
# Loss, tokens/s and memory of one or several runs, stacked on one step axis: the static
# summaries (training_summary, training_comparison) and the live widgets (viz.dashboard,
# viz.comparison) are the same figure, filled by update_training_panels.

TRAINING_SLOTS = ("train", "val", "tokens/s", "memory", "peak")    # traces per run, in order
_SLOT_ROW = {"train": 1, "val": 1, "tokens/s": 2, "memory": 3, "peak": 3}
_SINGLE_COLORS = {"train": 0, "val": 1, "tokens/s": 2, "memory": 3, "peak": 3}
_SINGLE_NAMES = {"train": "train loss", "val": "val loss", "tokens/s": "tokens/s",
                 "memory": "memory", "peak": "peak memory"}
MEMORY_MIN_SPAN = 0.01      # the memory axis spans at least 1% of the peak (and 1 MiB)


def _slot_traces(name: str, index: int, single: bool) -> list[go.Scatter]:
    """The five empty traces of one run, on the axes of their row (x/y, x2/y2, x3/y3).

    ``single``: one run, each series its own colour and legend entry; otherwise one colour
    per run and one legend entry per run (the others in its group, toggled with it).
    """
    traces = []
    for slot in TRAINING_SLOTS:
        c = color(_SINGLE_COLORS[slot] if single else index)
        row = _SLOT_ROW[slot]
        common = dict(x=[], y=[], xaxis=_axis_name("x", row), yaxis=_axis_name("y", row),
                      name=_SINGLE_NAMES[slot] if single else (
                          name if slot == "train" else f"{name} {slot}"),
                      legendgroup=slot if single else name,
                      showlegend=slot in ("train", "val", "peak") if single else slot == "train",
                      hovertemplate=("" if single else f"{name} ") + f"{slot} %{{y:.4g}}"
                                    "<extra></extra>")
        if slot == "val":
            style = dict(mode="lines+markers", cliponaxis=False,
                         line=dict(color=c, width=1, dash="dot"),
                         marker=dict(color=c, size=8, symbol="diamond"))
        elif slot == "peak":
            style = dict(mode="lines", line=dict(color=c, width=1, dash="dot"))
        else:
            style = dict(mode="lines", line=dict(color=c, width=1.4 if slot == "train" else 1.2))
        traces.append(go.Scatter(**common, **style))
    return traces


def training_panels(names: Sequence = ("run",), single: bool = True,
                    title: str = "") -> go.Figure:
    """The empty three-row training figure (loss; tokens/s; memory, on one step axis) with
    five trace slots per run in ``names``, for ``update_training_panels`` to fill: what
    the live widgets start from. ``single``: one run, a colour per series; otherwise a
    colour per run and one legend entry per run."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        row_heights=[0.5, 0.25, 0.25])
    for i, name in enumerate(names):
        fig.add_traces(_slot_traces(str(name), i, single))
    fig.update_yaxes(title="loss (nats/token)", row=1, col=1)
    fig.update_yaxes(title="tokens/s", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title="MiB", row=3, col=1)
    fig.update_xaxes(title="step", row=3, col=1)
    legend_rows = 1 if single else math.ceil(len(names) / 4)
    fig.update_layout(template=TEMPLATE, height=640 + 24 * legend_rows, legend=LEGEND_BELOW,
                      margin=dict(l=70, r=30, t=90, b=60), hovermode="x unified",
                      meta=dict(single=bool(single)), title=dict(text=title, x=0.02))
    return fig


def _memory_range(values_mib: list) -> list[float] | None:
    """A memory axis that shows how readings move without inventing motion: the data's
    span plus 8%, at least ``MEMORY_MIN_SPAN`` of the peak (and 1 MiB), not from zero
    (412 MiB that grew from 400 would be a flat line on 0..412)."""
    vals = [v for v in values_mib if v is not None and math.isfinite(v)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    half = max(hi - lo, MEMORY_MIN_SPAN * abs(hi), 1.0) * 1.08 / 2
    mid = (lo + hi) / 2
    return [max(mid - half, 0.0), max(mid - half, 0.0) + 2 * half]


def update_training_panels(fig, histories: Mapping, title: str = "", subtitle: str = "",
                           total_steps: int | None = None) -> None:
    """Write ``histories`` (run name -> History or dict) into a figure made by
    ``training_summary`` / ``training_comparison`` (or ``training_panels``), in place:
    every trace's points, the peak-memory line, the memory axis (range and reading
    method), the step range (0..``total_steps`` when given) and the title. Runs the figure
    has no slots for get new ones."""
    names = list(histories)
    have = len(fig.data) // len(TRAINING_SLOTS)
    single = bool((fig.layout.meta or {}).get("single", False))
    for i in range(have, len(names)):
        fig.add_traces(_slot_traces(str(names[i]), i, single))
    all_mib, methods = [], []
    for i, name in enumerate(names):
        h = histories[name]
        train, val, speed, memory, peak = fig.data[i * 5:(i + 1) * 5]
        steps = _series(h, "step")
        mib = [None if b is None else b / 2**20 for b in _series(h, "memory_bytes")]
        train.x, train.y = tuple(steps), tuple(_series(h, "loss"))
        val.x, val.y = tuple(_series(h, "val_step")), tuple(_series(h, "val_loss"))
        speed.x, speed.y = tuple(steps), tuple(_series(h, "tokens_per_s"))
        memory.x, memory.y = tuple(steps), tuple(mib)
        known = [v for v in mib if v is not None]
        if known:
            top = max(known)
            peak.x, peak.y = (steps[0], steps[-1]), (top, top)
            peak.name = (f"peak {top:.0f} MiB" if single else f"{name} peak {top:.0f} MiB")
            all_mib += known
        else:
            peak.x, peak.y = (), ()
        method = memory_method_label(_scalar(h, "memory_method") or None)
        if known and method not in methods:
            methods.append(method)
    fig.layout.yaxis3.title.text = f"MiB ({', '.join(methods) or 'no reading'})"
    span = _memory_range(all_mib)
    fig.layout.yaxis3.range = span
    fig.layout.yaxis3.autorange = span is None
    x_range = [0, total_steps] if total_steps else None
    for axis in ("xaxis", "xaxis2", "xaxis3"):
        fig.layout[axis].range = x_range
        fig.layout[axis].autorange = x_range is None
    fig.layout.title = dict(text=f"{title}<br><sup>{subtitle}</sup>" if subtitle else title,
                            x=0.02)


def training_summary(history, title: str = "Training run") -> go.Figure:
    """The static picture of one run: loss, throughput and memory against step.

    Three stacked panels sharing the step axis: train + validation loss, tokens/s, and
    memory in MiB, the reading method (model tensors, CUDA peak) named on the axis. The memory axis
    spans the readings (not from zero, so growth shows) with the peak as a dotted line;
    the subtitle gives steps, final val loss, median tokens/s and the peak, and says
    when the run was interrupted.
    """
    fig = training_panels([title], single=True)
    update_training_panels(fig, {title: history}, title=title,
                           subtitle=_run_subtitle(history, _series(history, "step")))
    return fig


def training_comparison(histories: Mapping, title: str = "Training runs",
                        total_steps: int | None = None) -> go.Figure:
    """Several runs overlaid on the three panels of ``training_summary``: loss (train line,
    val diamonds), tokens/s and memory (with each run's peak dotted), one colour per run,
    one legend entry per run (toggles all its traces), under the chart."""
    _check_mapping(histories, "histories", "a run name to a History or dict")
    fig = training_panels(list(histories), single=False)
    update_training_panels(fig, histories, title=title, total_steps=total_steps,
                           subtitle="line: train loss · ◆ val loss · dotted: peak memory")
    return fig


def _run_subtitle(history, steps: list) -> str:
    total = _scalar(history, "total_steps")
    done = steps[-1] if steps else 0
    parts = [f"{done}/{total} steps" if total else f"{done} steps"]
    val_losses = _series(history, "val_loss")
    if val_losses:
        parts.append(f"final val loss {val_losses[-1]:.3f}")
    speeds = [v for v in _series(history, "tokens_per_s") if v is not None]
    if speeds:
        parts.append(f"median {human_rate(float(np.median(speeds)))}")
    memory = [b for b in _series(history, "memory_bytes") if b is not None]
    if memory:
        parts.append("peak " + human_memory(max(memory), _scalar(history, "memory_method")))
    if _scalar(history, "interrupted", False):
        parts.append("interrupted")
    return " · ".join(parts)
