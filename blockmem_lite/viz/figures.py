"""Plotly figure builders for the notebooks: masks, attention, training, benchmarks.

Every builder returns a ``plotly.graph_objects.Figure`` and never shows it, so
notebooks decide (``fig.show()`` or leaving ``fig`` as the cell's value) and
tests can inspect the traces. All figures share one colour-blind-friendly
palette (Okabe & Ito) and the ``plotly_white`` template.

Inputs are forgiving: tensors, NumPy arrays or nested lists for matrices;
``train.History`` objects or plain dicts with the same keys for training runs;
lists of bench record dicts for the benchmark plots.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np

from blockmem_lite.units import human_memory, human_rate, memory_label

try:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("blockmem_lite.viz.figures needs plotly: "
                      "pip install 'blockmem_lite[notebooks]'") from exc

# Okabe & Ito: distinguishable for the common colour-vision deficiencies.
# Yellow is last because it is faint on white.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000",
           "#F0E442")
TEMPLATE = "plotly_white"
ALLOWED_COLOR = "#0072B2"
BLOCKED_COLOR = "#EDEDED"
ATTENTION_COLORSCALE = "Viridis"
MAX_CELL_GAPS = 64          # draw grid lines between cells up to this many rows/columns
X_AXES = ("step", "tokens", "time")
PHASE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash")


def color(i: int) -> str:
    """The i-th colour of the kit's palette (cycles)."""
    return PALETTE[i % len(PALETTE)]


def memory_method_label(method: str | None) -> str:
    """Axis-title name of a memory reading method: ``units.memory_label`` (``process_rss``
    -> ``RSS``), or ``unknown method`` when the records name none."""
    return memory_label(method) or "unknown method"


# ----------------------------------------------------------------------------- helpers


def _to_array(x, name: str) -> np.ndarray:
    """A tensor / array / nested list as a NumPy array (on CPU, detached)."""
    if hasattr(x, "detach"):                                      # a torch tensor
        x = x.detach().cpu()
        x = (x.float() if x.dtype.is_floating_point else x).numpy()  # bf16 has no NumPy dtype
    arr = np.asarray(x)
    if arr.dtype == object:
        raise ValueError(f"{name} is not allowed: expected a tensor, array or nested list of "
                         f"numbers, got {type(x).__name__}")
    return arr


def _check_ndim(arr: np.ndarray, name: str, allowed: tuple[int, ...], meaning: str) -> None:
    if arr.ndim not in allowed:
        raise ValueError(f"{name} with shape {tuple(arr.shape)} is not allowed: expected "
                         f"{meaning}")


def _series(history, key: str) -> list:
    """``history.key`` or ``history[key]`` as a list; [] when the run has none."""
    value = history.get(key) if isinstance(history, Mapping) else getattr(history, key, None)
    return list(value) if value is not None else []


def _scalar(history, key: str, default=None):
    if isinstance(history, Mapping):
        return history.get(key, default)
    return getattr(history, key, default)


def _finish(fig: go.Figure, title: str, **layout) -> go.Figure:
    fig.update_layout(template=TEMPLATE, title=dict(text=title, x=0.02), **layout)
    return fig


def _token_label(token) -> str:
    """Make whitespace and control characters visible in tick labels."""
    text = str(token)
    visible = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}
    return "".join(visible.get(ch, ch if ch.isprintable() else f"\\x{ord(ch):02x}")
                   for ch in text) or "∅"


def _density_text(mask: np.ndarray) -> str:
    return f"{mask.mean():.0%} of pairs allowed" if mask.size else "empty"


# ----------------------------------------------------------------------------- heatmap sizing
# A heatmap row gets CELL_PX pixels (a readable cell, a 12 px label beside it) until its
# panel reaches PANEL_MAX_PX; past that the rows shrink and the tick labels are thinned so
# they never overlap (every k-th label, k chosen from the room a label needs).

CELL_PX = 18
PANEL_MIN_PX = 180
PANEL_MAX_PX = 720
LABEL_PX = 15               # the height one tick label needs
CHAR_PX = 7.5               # the width one character of a tick label needs
PLOT_WIDTH_PX = 640         # the plot width assumed for x labels (a JupyterLab cell)
MARGIN_TOP, MARGIN_BOTTOM = 100, 70
PANEL_GAP_PX = 60


def _panel_px(n_rows: int) -> int:
    """Plot-area height of one heatmap panel of ``n_rows`` rows."""
    return int(min(max(n_rows * CELL_PX, PANEL_MIN_PX), PANEL_MAX_PX))


def _heatmap_height(n_rows: int, panel_rows: int = 1) -> int:
    """Figure height for ``panel_rows`` rows of panels of ``n_rows`` rows each."""
    return (MARGIN_TOP + MARGIN_BOTTOM + panel_rows * _panel_px(n_rows)
            + (panel_rows - 1) * PANEL_GAP_PX)


def _thinned(labels: list, room_px: float, need_px: float, values: list | None = None) -> dict:
    """Axis settings showing every k-th label, k so that each shown one has ``need_px``
    of ``room_px``; ``values``: the tick positions (default 0..n-1)."""
    values = list(range(len(labels))) if values is None else list(values)
    step = max(1, math.ceil(len(labels) * need_px / max(room_px, 1.0)))
    keep = range(0, len(labels), step)
    return dict(tickmode="array", tickvals=[values[i] for i in keep],
                ticktext=[labels[i] for i in keep])


def _x_label_px(labels: list) -> float:
    return max((len(str(t)) for t in labels), default=1) * CHAR_PX + 6


# ----------------------------------------------------------------------------- two colours

MASK_LABELS = ("blocked", "may attend")            # (False, True) in legends and hovers
COLOR_NAMES = {ALLOWED_COLOR: "blue", BLOCKED_COLOR: "grey"}


def _two_colour_scale(off: str, on: str) -> list:
    """A discrete scale for 0/1 cells: ``off`` below 0.5, ``on`` above (no blend)."""
    return [[0.0, off], [0.5, off], [0.5, on], [1.0, on]]


def _check_pair(value, name: str, meaning: str) -> tuple[str, str]:
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or not all(isinstance(v, str) for v in value)):
        raise ValueError(f"{name}={value!r} is not allowed: expected a pair of strings "
                         f"({meaning})")
    return tuple(value)


def _mask_style(colors, labels) -> tuple[tuple[str, str], tuple[str, str]]:
    colors = _check_pair(colors if colors is not None else (BLOCKED_COLOR, ALLOWED_COLOR),
                         "colors", "the colour of blocked cells, then of allowed ones")
    labels = _check_pair(labels, "labels", "what blocked cells mean, then allowed ones")
    return colors, labels


def _mask_legend_text(colors: tuple[str, str], labels: tuple[str, str]) -> str:
    """``blue = may attend, grey = blocked`` when the colours have names, else ""."""
    names = [COLOR_NAMES.get(c.upper()) for c in colors]
    if None in names:
        return ""
    return f"{names[1]} = {labels[1]}, {names[0]} = {labels[0]}"


def _mask_subtitle(mask: np.ndarray, colors, labels) -> str:
    legend = _mask_legend_text(colors, labels)
    return " · ".join(p for p in (legend, _density_text(mask)) if p)


def _mask_trace(mask: np.ndarray, showscale: bool, colors=(BLOCKED_COLOR, ALLOWED_COLOR),
                labels=MASK_LABELS) -> go.Heatmap:
    """One boolean mask as a two-colour heatmap, its colour bar a legend of the two."""
    q_len, k_len = mask.shape
    gap = 1 if max(q_len, k_len) <= MAX_CELL_GAPS else 0
    return go.Heatmap(
        z=mask.astype(np.int8),                                   # (Tq, Tk) 0/1
        text=np.where(mask, labels[1], labels[0]),
        colorscale=_two_colour_scale(*colors), zmin=0, zmax=1, xgap=gap, ygap=gap,
        showscale=showscale,
        colorbar=dict(tickvals=[0.25, 0.75], ticktext=[labels[0], labels[1]], len=0.35,
                      thickness=16, y=1.0, yanchor="top", outlinewidth=1),
        hovertemplate="query %{y} → key %{x}: %{text}<extra></extra>",
    )


def _as_mask(mask, name: str) -> np.ndarray:
    arr = _to_array(mask, name)
    _check_ndim(arr, name, (2,), "a 2-D (query, key) boolean mask")
    return arr.astype(bool)


# ----------------------------------------------------------------------------- masks


def mask_heatmap(mask, title: str = "Attention mask", x_title: str = "key position",
                 y_title: str = "query position", tokens: Sequence | None = None,
                 colors: Sequence | None = None, labels: Sequence = MASK_LABELS) -> go.Figure:
    """A boolean mask (Tq, Tk) drawn in two colours: allowed (blue) vs blocked (grey).

    Queries run down the y axis (row 0 on top, like the matrix), keys along x. The colour
    bar is the legend of the two colours; the subtitle says it in words ("blue = may
    attend, grey = blocked") and notes the share of allowed pairs (the attention work
    done). ``tokens``: the Tk key labels (queries are the last Tq), thinned when many.
    ``colors``: (blocked, allowed); ``labels``: what the two colours mean.
    Cells are square and at least ``CELL_PX`` tall up to a cap (height grows with Tq).
    """
    arr = _as_mask(mask, "mask")                                  # (Tq, Tk)
    colors, labels = _mask_style(colors, labels)
    q_len, k_len = arr.shape
    fig = go.Figure(_mask_trace(arr, True, colors, labels))
    fig.update_xaxes(title=x_title, constrain="domain")
    fig.update_yaxes(title=y_title, autorange="reversed", scaleanchor="x", constrain="domain")
    if tokens is not None:
        cell = _panel_px(q_len) / max(q_len, 1)                   # square cells
        _label_token_axes(fig, tokens, q_len, k_len, x_room=min(PLOT_WIDTH_PX, cell * k_len),
                          y_room=_panel_px(q_len))
    return _finish(fig, f"{title}<br><sup>{_mask_subtitle(arr, colors, labels)}</sup>",
                   height=_heatmap_height(q_len),
                   margin=dict(t=MARGIN_TOP, b=MARGIN_BOTTOM))


def mask_grid(masks: Mapping, title: str = "Attention masks", x_title: str = "key position",
              y_title: str = "query position", colors: Sequence | None = None,
              labels: Sequence = MASK_LABELS) -> go.Figure:
    """Several masks side by side (e.g. dense causal vs block-causal), one per subplot,
    in the same two colours (one legend, and the title says which colour is which)."""
    if not isinstance(masks, Mapping) or not masks:
        raise ValueError(f"masks={type(masks).__name__} is not allowed: expected a non-empty "
                         "dict mapping a name to a (query, key) mask")
    colors, labels = _mask_style(colors, labels)
    arrays = {name: _as_mask(m, f"masks[{name!r}]") for name, m in masks.items()}
    titles = [f"{name}<br><sup>{_density_text(a)}</sup>" for name, a in arrays.items()]
    fig = make_subplots(rows=1, cols=len(arrays), subplot_titles=titles,
                        horizontal_spacing=0.06)
    for col, arr in enumerate(arrays.values(), start=1):
        fig.add_trace(_mask_trace(arr, col == len(arrays), colors, labels), row=1, col=col)
    fig.update_xaxes(title=x_title, constrain="domain")
    fig.update_yaxes(autorange="reversed", constrain="domain")
    fig.update_yaxes(title=y_title, row=1, col=1)
    rows = max(a.shape[0] for a in arrays.values())
    legend = _mask_legend_text(colors, labels)
    return _finish(fig, f"{title}<br><sup>{legend}</sup>" if legend else title,
                   height=_heatmap_height(rows) + 40, margin=dict(t=MARGIN_TOP + 40,
                                                                  b=MARGIN_BOTTOM))


# ----------------------------------------------------------------------------- attention


def attention_heatmap(weights, title: str = "Attention weights", tokens: Sequence | None = None,
                      max_heads: int = 8, batch_index: int = 0, colorscale=None,
                      colorbar_title: str | None = None, zmin: float | None = None,
                      zmax: float | None = None, discrete: bool | None = None,
                      colors: Sequence | None = None,
                      labels: Sequence = MASK_LABELS) -> go.Figure:
    """Attention weights as heatmaps, one subplot per head.

    ``weights``: (Tq, Tk), (H, Tq, Tk) or (B, H, Tq, Tk) (``batch_index`` picks the
    sequence). Up to ``max_heads`` heads are drawn, four per row, on one colour scale
    (``zmin``..``zmax``, default 0..the largest weight shown). ``tokens``: the Tk key
    tokens (strings or ids) used as tick labels; queries are the last Tq of them.

    Colours are set on each trace, so the caller's choice wins: ``colorscale`` (default
    Viridis) and ``colorbar_title`` (default "weight") here, or ``fig.update_traces(
    colorscale=...)`` afterwards. A boolean input (or ``discrete=True``) is a mask: two
    colours, ``colors`` = (blocked, allowed), with a colour-bar legend saying which is
    which (``labels``, default "blocked" / "may attend") and the subtitle in words.
    Each panel is at least ``CELL_PX`` pixels per row up to a cap; labels are thinned.
    """
    raw = _to_array(weights, "weights")
    _check_ndim(raw, "weights", (2, 3, 4), "(Tq, Tk), (H, Tq, Tk) or (B, H, Tq, Tk)")
    if isinstance(max_heads, bool) or not isinstance(max_heads, int) or max_heads < 1:
        raise ValueError(f"max_heads={max_heads!r} is not allowed: expected an integer >= 1")
    discrete = raw.dtype == bool if discrete is None else bool(discrete)
    arr = raw.astype(float)
    if arr.ndim == 4:
        if not 0 <= batch_index < arr.shape[0]:
            raise ValueError(f"batch_index={batch_index!r} is not allowed: weights hold "
                             f"{arr.shape[0]} sequences (0..{arr.shape[0] - 1})")
        arr = arr[batch_index]                                    # (H, Tq, Tk)
    heads = arr[None] if arr.ndim == 2 else arr                   # (H, Tq, Tk)
    n_heads, q_len, k_len = heads.shape
    shown = min(n_heads, max_heads)
    cols = min(shown, 4)
    rows = math.ceil(shown / cols)
    panel = _panel_px(q_len)
    subtitles = [f"head {h}" for h in range(shown)] if arr.ndim > 2 else None
    spacing = PANEL_GAP_PX / (rows * panel + (rows - 1) * PANEL_GAP_PX) if rows > 1 else 0.0
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=subtitles,
                        horizontal_spacing=0.05, vertical_spacing=spacing)
    if discrete:
        colors, labels = _mask_style(colors, labels)
        traces = [_mask_trace(heads[h] > 0.5, h == shown - 1, colors, labels)
                  for h in range(shown)]
        subtitle = _mask_subtitle(heads[:shown] > 0.5, colors, labels)
    else:
        lo = 0.0 if zmin is None else float(zmin)
        hi = float(heads[:shown].max()) if zmax is None else float(zmax)
        traces = [go.Heatmap(z=heads[h], colorscale=colorscale or ATTENTION_COLORSCALE,
                             zmin=lo, zmax=max(hi, lo + 1e-12), showscale=h == shown - 1,
                             colorbar=dict(title=dict(
                                 text="weight" if colorbar_title is None else colorbar_title)),
                             hovertemplate="query %{y} → key %{x}: %{z:.3f}<extra></extra>")
                  for h in range(shown)]
        subtitle = ""
    for h, trace in enumerate(traces):
        fig.add_trace(trace, row=h // cols + 1, col=h % cols + 1)
    fig.update_yaxes(autorange="reversed")
    if tokens is not None:
        _label_token_axes(fig, tokens, q_len, k_len, x_room=PLOT_WIDTH_PX / cols, y_room=panel)
    if shown < n_heads:
        title = f"{title} (first {shown} of {n_heads} heads)"
    if subtitle:
        title = f"{title}<br><sup>{subtitle}</sup>"
    return _finish(fig, title, height=_heatmap_height(q_len, rows),
                   margin=dict(t=MARGIN_TOP, b=MARGIN_BOTTOM))


def _label_token_axes(fig: go.Figure, tokens: Sequence, q_len: int, k_len: int,
                      x_room: float = PLOT_WIDTH_PX, y_room: float = PANEL_MAX_PX) -> None:
    """Token tick labels (keys across, the last ``q_len`` down), thinned to fit the room."""
    labels = [_token_label(t) for t in tokens]
    if len(labels) != k_len:
        raise ValueError(f"tokens has {len(labels)} entries, which is not allowed: expected "
                         f"one per key position ({k_len})")
    fig.update_xaxes(tickangle=0, **_thinned(labels, x_room, _x_label_px(labels)))
    fig.update_yaxes(**_thinned(labels[k_len - q_len:], y_room, LABEL_PX))


# ----------------------------------------------------------------------------- training


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

LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.14, x=0, xanchor="left",
                    maxheight=1.0)        # wraps into rows under the chart, never scrolls
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
# summaries (training_summary, training_comparison) and the live widgets (viz.live) are
# the same figure, filled by update_training_panels.

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
    ``training_summary`` / ``training_comparison`` (or a ``FigureWidget`` of one), in place:
    every trace's points, the peak-memory line, the memory axis (range and reading
    method), the step range (0..``total_steps`` when given) and the title. Runs the figure
    has no slots for get new ones. Wrap it in ``fig.batch_update()`` for a widget."""
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
    memory in MiB, the reading method (RSS, CUDA peak) named on the axis. The memory axis
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


# ----------------------------------------------------------------------------- benchmarks


def _series_label(record: Mapping) -> str:
    label = str(record.get("arch", "?"))
    if record.get("variant"):
        label += f" / {record['variant']}"
    return label


def _select_records(records: Sequence[Mapping], phase: str | None) -> list[Mapping]:
    """The bench records of ``phase`` (all of them when None)."""
    if isinstance(records, Mapping) or not isinstance(records, Sequence):
        raise ValueError(f"records={type(records).__name__} is not allowed: expected a list of "
                         "bench record dicts")
    chosen = [r for r in records if phase is None or r.get("phase") == phase]
    if phase is not None and not chosen:
        phases = sorted({str(r.get("phase")) for r in records})
        raise ValueError(f"phase={phase!r} is not allowed: records have phases "
                         f"{', '.join(phases) or 'none'}")
    return chosen


def _group_records(records: list[Mapping], value_key: str):
    """{(arch/variant label, phase): [(seq_len, value)...] by length}, and the phases present."""
    phases = list(dict.fromkeys(r.get("phase") for r in records))
    groups: dict[tuple[str, str | None], list[tuple[float, float]]] = {}
    for r in records:
        if r.get(value_key) is None or r.get("seq_len") is None:
            continue
        key = (_series_label(r), r.get("phase"))
        groups.setdefault(key, []).append((r["seq_len"], r[value_key]))
    return {k: sorted(v) for k, v in groups.items()}, phases


def _length_figure(groups: dict, phases: list, y_title: str, title: str, log_x: bool,
                   log_y: bool, scale: float = 1.0) -> go.Figure:
    """One line per arch+variant (colour) and phase (dash) against sequence length."""
    labels = list(dict.fromkeys(label for label, _ in groups))
    fig = go.Figure()
    lengths = sorted({length for points in groups.values() for length, _ in points})
    for (label, phase), points in groups.items():
        name = f"{label} · {phase}" if len(phases) > 1 and phase else label
        dash = PHASE_DASHES[phases.index(phase) % len(PHASE_DASHES)]
        fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] / scale for p in points],
                                 mode="lines+markers", name=name,
                                 line=dict(color=color(labels.index(label)), dash=dash)))
    fig.update_xaxes(title="sequence length (tokens)", type="log" if log_x else "linear")
    if log_x and lengths:
        fig.update_xaxes(tickmode="array", tickvals=lengths, ticktext=[str(n) for n in lengths])
    fig.update_yaxes(title=y_title, type="log" if log_y else "linear")
    return _finish(fig, title)


def throughput_vs_length(records: Sequence[Mapping], phase: str | None = None,
                         title: str = "Throughput vs sequence length", log_x: bool = True,
                         log_y: bool = True) -> go.Figure:
    """Tokens/s against sequence length, one line per arch+variant (dash per phase)."""
    groups, phases = _group_records(_select_records(records, phase), "tokens_per_s")
    return _length_figure(groups, phases, "tokens/s", title, log_x, log_y)


def memory_vs_length(records: Sequence[Mapping], key: str = "memory_bytes",
                     phase: str | None = None, title: str = "Memory vs sequence length",
                     log_x: bool = True, log_y: bool = True) -> go.Figure:
    """Memory in MiB against sequence length, one line per arch+variant.

    ``key``: "memory_bytes" (peak reading; the method — CUDA peak or
    RSS — is named on the axis) or "state_bytes" (decoding state).
    """
    keys = ("memory_bytes", "state_bytes")
    if key not in keys:
        raise ValueError(f"key={key!r} is not allowed: expected one of {', '.join(keys)}")
    chosen = _select_records(records, phase)
    groups, phases = _group_records(chosen, key)
    if key == "memory_bytes":
        methods = sorted({memory_method_label(r.get("memory_method")) for r in chosen
                          if r.get(key) is not None})
        y_title = f"peak memory (MiB, {', '.join(methods) or 'unknown method'})"
    else:
        y_title = "decoding state (MiB)"
    return _length_figure(groups, phases, y_title, title, log_x, log_y, scale=2**20)


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


# ----------------------------------------------------------------------------- generic charts


def _check_mapping(value, name: str, meaning: str) -> None:
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{name}={type(value).__name__} is not allowed: expected a non-empty "
                         f"dict mapping {meaning}")


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
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title, type="log" if log_y else "linear", range=y_range,
                     tickformat=y_tickformat)
    return _finish(fig, title, hovermode="x unified")


def line_panels(panels: Mapping, title: str = "", x_title: str | Sequence = "",
                y_title: str | Sequence = "", log_x: bool = False, log_y: bool = False,
                hlines: Mapping | None = None, shared_y: bool = False, dashed: Sequence = (),
                mode: str = "lines+markers", height: int = 400) -> go.Figure:
    """Several line charts side by side: ``panels`` is panel title -> series (name -> (x, y)).

    A name keeps its colour in every panel and appears once in the legend.
    ``x_title`` / ``y_title``: one string for all panels or one per panel;
    ``hlines``: panel title -> {label: y}.
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
        _add_references(fig, (hlines or {}).get(panel), row=1, col=col)
        if log_x:
            _log_ticks(fig, [v for d in fig.data if d.xaxis == _axis_name("x", col)
                             for v in d.x], row=1, col=col)
        fig.update_xaxes(title=x_titles[col - 1], row=1, col=col)
        if not shared_y or col == 1:
            fig.update_yaxes(title=y_titles[col - 1], row=1, col=col)
    fig.update_yaxes(type="log" if log_y else "linear")
    return _finish(fig, title, height=height)


def _axis_name(letter: str, col: int) -> str:
    return letter if col == 1 else f"{letter}{col}"


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


# ----------------------------------------------------------------------------- BCMT

DECAY_FLOOR = 1e-3          # decay weights below this share the darkest colour


def decay_heatmap(weights, title: str = "Decay weights W",
                  floor: float = DECAY_FLOOR) -> go.Figure:
    """BCMT's decay matrix W (N, N) (row i: the block that reads, column j: summary S_j).

    ``weights``: one (N, N) matrix, or a dict alpha -> (N, N), drawn two ways, because on
    a linear colour scale every α looks alike (the weights are small, and α = 0.8 and
    α = 1.0 differ by a factor per block, not by an offset):

    * top, one panel per α: W on one *logarithmic* colour scale from ``floor`` to 1
      (ticks 1, 0.1, 0.01, ...; smaller weights share the darkest colour; zero weights, the
      future j > i, are left blank). A geometric decay reads as bands parallel to the
      diagonal, α = 1 as a flat triangle; the scale is fixed, so slider moves compare;
    * bottom: the newest block's memory, its weight on the summary d blocks back
      (W[N-1, N-1-d]), one line per α on a log axis: a straight line of slope log α,
      flat for α = 1 (a plain mean, 1/N each), one point for α = 0.
    """
    named = weights if isinstance(weights, Mapping) else {None: weights}
    _check_mapping(named, "weights", "alpha to an (N, N) decay matrix")
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 < floor < 1:
        raise ValueError(f"floor={floor!r} is not allowed: expected a number in (0, 1)")
    arrays = {}
    for alpha, w in named.items():
        arr = _to_array(w, f"weights[{alpha!r}]").astype(float)
        _check_ndim(arr, f"weights[{alpha!r}]", (2,), "a square (N, N) decay matrix")
        if arr.shape[0] != arr.shape[1]:
            raise ValueError(f"weights[{alpha!r}] with shape {arr.shape} is not allowed: "
                             "expected a square (N, N) decay matrix")
        arrays[alpha] = arr
    n = len(arrays)
    names = [f"α = {a:g}" if a is not None else "W" for a in arrays]
    fig = make_subplots(rows=2, cols=n, row_heights=[0.6, 0.4], vertical_spacing=0.16,
                        horizontal_spacing=0.05,
                        specs=[[{}] * n, [{"colspan": n}] + [None] * (n - 1)],
                        subplot_titles=names + ["the newest block's memory: its weight on the "
                                                "summary d blocks back (log scale)"])
    low = math.log10(floor)
    for col, (alpha, arr) in enumerate(arrays.items(), start=1):
        who = f"α = {alpha:g}: " if alpha is not None else ""
        logw = np.where(arr > 0, np.log10(np.clip(arr, floor, None)), np.nan)    # (N, N)
        fig.add_trace(go.Heatmap(z=logw, customdata=arr, coloraxis="coloraxis", name=names[col - 1],
                                 hovertemplate=who + "block %{y} reads S_%{x} with weight "
                                 "%{customdata:.4f}<extra></extra>"), row=1, col=col)
        last = arr[-1, ::-1]                                       # (N,) d = 0 .. N-1 back
        fig.add_trace(go.Scatter(x=list(range(len(last))),
                                 y=[v if v > 0 else None for v in last.tolist()],
                                 mode="lines+markers", name=names[col - 1],
                                 line=dict(color=color(col - 1), width=2),
                                 marker=dict(size=6, color=color(col - 1)),
                                 hovertemplate=who + "d = %{x} blocks back: %{y:.4f}"
                                 "<extra></extra>"), row=2, col=1)
    for col in range(1, n + 1):
        fig.update_xaxes(title="summary S_j of block j", constrain="domain", row=1, col=col)
        fig.update_yaxes(autorange="reversed", scaleanchor=_axis_name("x", col),
                         constrain="domain", row=1, col=col)
    fig.update_yaxes(title="memory M_i of block i", row=1, col=1)
    fig.update_xaxes(title="d, blocks back (0: the block's own summary)", row=2, col=1)
    fig.update_yaxes(title="weight", type="log", range=[low, 0.05], row=2, col=1)
    decades = list(range(0, math.floor(low) - 1, -1))
    fig.update_layout(coloraxis=dict(
        colorscale=ATTENTION_COLORSCALE, cmin=low, cmax=0.0,
        colorbar=dict(title=dict(text="weight"), tickvals=decades,
                      ticktext=[f"{10.0 ** d:g}" for d in decades], len=0.55, y=1.0,
                      yanchor="top")))
    return _finish(fig, f"{title}<br><sup>log colour scale: each step of colour is a factor "
                        "of 10</sup>", height=760, legend=LEGEND_BELOW,
                   margin=dict(t=110, b=60))


def summary_weights_heatmap(weights, chars: Sequence | None = None,
                            title: str = "Summary weights π") -> go.Figure:
    """BCMT's summary softmax weights π (N, L): row = block, column = position in it.

    ``chars``: optional (N, L) labels (e.g. the characters of the window) written in the
    cells. Rows sum to 1; uniform is 1/L.
    """
    arr = _to_array(weights, "weights").astype(float)
    _check_ndim(arr, "weights", (2,), "(N blocks, L positions)")
    fig = go.Figure(go.Heatmap(z=arr, colorscale=ATTENTION_COLORSCALE, zmin=0.0,
                               colorbar=dict(title="weight"),
                               hovertemplate="block %{y}, token %{x}: weight %{z:.3f}"
                                             "<extra></extra>"))
    if chars is not None:
        labels = [[_token_label(c) for c in row] for row in chars]
        if [len(r) for r in labels] != [arr.shape[1]] * arr.shape[0]:
            raise ValueError(f"chars is not allowed: expected {arr.shape[0]} rows of "
                             f"{arr.shape[1]} labels, like weights {arr.shape}")
        fig.update_traces(text=labels, texttemplate="%{text}", textfont=dict(size=9),
                          hovertemplate="block %{y}, token %{x} '%{text}': weight %{z:.3f}"
                                        "<extra></extra>")
    fig.update_xaxes(title="position in the block")
    fig.update_yaxes(title="block", autorange="reversed")
    return _finish(fig, f"{title}<br><sup>uniform would be {1 / arr.shape[1]:.3f}</sup>")


def gate_histogram(gates: Mapping, title: str = "Gate values", bins: int = 50,
                   x_title: str = "G") -> go.Figure:
    """Overlaid histograms of gate values in [0, 1], one per name (e.g. per layer)."""
    _check_mapping(gates, "gates", "a name to a tensor of gate values")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins={bins!r} is not allowed: expected an integer >= 1")
    fig = go.Figure()
    for i, (name, values) in enumerate(gates.items()):
        arr = _to_array(values, f"gates[{name!r}]").astype(float).ravel()
        fig.add_trace(go.Histogram(x=arr, name=str(name), nbinsx=bins, opacity=0.6,
                                   marker_color=color(i)))
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title="count")
    return _finish(fig, title, barmode="overlay")


# ----------------------------------------------------------------------------- ARMT


def memory_matrices(matrices: Mapping, row_labels: Sequence | None = None,
                    title: str = "Memory A", x_title: str = "value dim") -> go.Figure:
    """Associative memories A (K features, D value dims) side by side, e.g. after each write.

    ``matrices``: name -> (K, D) or (1, K, D). One diverging colour scale (RdBu,
    centred on 0, symmetric) shared by all panels, so a write that changes A shows.
    """
    _check_mapping(matrices, "matrices", "a name to a (K, D) memory matrix")
    arrays = {}
    for name, a in matrices.items():
        arr = _to_array(a, f"matrices[{name!r}]").astype(float)
        if arr.ndim == 3 and arr.shape[0] == 1:
            arr = arr[0]
        _check_ndim(arr, f"matrices[{name!r}]", (2,), "(K, D) or (1, K, D)")
        arrays[name] = arr
    rows = None if row_labels is None else [str(r) for r in row_labels]
    if rows is not None and any(len(rows) != a.shape[0] for a in arrays.values()):
        raise ValueError(f"row_labels has {len(rows)} entries, which is not allowed: expected "
                         "one per row (feature) of every matrix")
    fig = make_subplots(rows=1, cols=len(arrays), subplot_titles=[str(n) for n in arrays],
                        shared_yaxes=True, horizontal_spacing=0.03)
    for col, arr in enumerate(arrays.values(), start=1):
        fig.add_trace(go.Heatmap(z=arr, y=rows, coloraxis="coloraxis",
                                 hovertemplate="feature %{y}, value dim %{x}: %{z:.3f}"
                                               "<extra></extra>"), row=1, col=col)
    bound = max(float(np.abs(a).max()) for a in arrays.values()) or 1.0
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title=x_title)
    fig.update_layout(coloraxis=dict(colorscale="RdBu", cmid=0.0, cmin=-bound, cmax=bound,
                                     colorbar=dict(title="A")))
    return _finish(fig, title, height=420)


# ----------------------------------------------------------------------------- MoC


def routing_heatmap(heat, share, title: str = "Routing") -> go.Figure:
    """MoC routing of a set of probe sequences: mean weight per (sequence, routed chapter)
    and the share of routed picks per chapter, with the uniform share dotted.

    ``heat``: (B, C-1), chapters 1..C-1 as columns; ``share``: (C-1,), sums to 1.
    """
    heat_arr = _to_array(heat, "heat").astype(float)
    share_arr = _to_array(share, "share").astype(float)
    _check_ndim(heat_arr, "heat", (2,), "(B sequences, C-1 routed chapters)")
    _check_ndim(share_arr, "share", (1,), "(C-1,) one share per routed chapter")
    if heat_arr.shape[1] != share_arr.shape[0]:
        raise ValueError(f"share with shape {share_arr.shape} is not allowed: expected one "
                         f"value per column of heat ({heat_arr.shape[1]})")
    chapters = list(range(1, len(share_arr) + 1))
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.08,
                        subplot_titles=("mean weight per probe sequence",
                                        "share of routed picks"))
    fig.add_trace(go.Heatmap(z=heat_arr, x=chapters, colorscale="Blues", zmin=0,
                             showscale=False), row=1, col=1)
    fig.add_trace(go.Bar(x=chapters, y=share_arr, marker_color=color(0)), row=1, col=2)
    fig.add_hline(y=1 / len(share_arr), line_dash="dot", row=1, col=2)     # uniform use
    fig.update_xaxes(title="routed chapter")
    fig.update_yaxes(title="probe sequence", autorange="reversed", row=1, col=1)
    return _finish(fig, title, height=340, showlegend=False)


def routing_decisions(chapters, weights, n_chapters: int,
                      title: str = "Routing decisions") -> go.Figure:
    """Every routing decision as a row: the weight it gives each chapter (0: not read).

    ``chapters``, ``weights``: (B, W, k+1) from a MoC trace (shared chapter first);
    rows are labelled "seq b · win w", columns are chapters 0..n_chapters-1.
    """
    ids = _to_array(chapters, "chapters")
    w = _to_array(weights, "weights").astype(float)
    _check_ndim(ids, "chapters", (3,), "(B sequences, W windows, k+1 chapters)")
    if w.shape != ids.shape:
        raise ValueError(f"weights with shape {w.shape} is not allowed: expected the shape of "
                         f"chapters {ids.shape}")
    if isinstance(n_chapters, bool) or not isinstance(n_chapters, int) or \
            n_chapters <= int(ids.max()):
        raise ValueError(f"n_chapters={n_chapters!r} is not allowed: expected an integer > the "
                         f"largest chapter id ({int(ids.max())})")
    b, n_win, _ = ids.shape
    grid = np.zeros((b * n_win, n_chapters))                         # (B*W, C)
    np.put_along_axis(grid, ids.reshape(b * n_win, -1).astype(int), w.reshape(b * n_win, -1),
                      axis=1)
    rows = [f"seq {i} · win {j}" for i in range(b) for j in range(n_win)]
    return heatmap(grid, x=list(range(n_chapters)), y=rows, title=title,
                   x_title="chapter (0 = shared)", zmin=0, colorbar_title="weight",
                   height=max(320, 16 * len(rows) + 120))


def chapter_weights_bar(chapter_ids, weights, n_shared: int = 1,
                        title: str = "One decision's weights") -> go.Figure:
    """The chapters one routing decision reads and their weights (shared ones in orange).

    ``chapter_ids``, ``weights``: (k+1,), the first ``n_shared`` are shared chapters.
    """
    ids = _to_array(chapter_ids, "chapter_ids").ravel().tolist()
    w = _to_array(weights, "weights").astype(float).ravel()
    if len(ids) != len(w):
        raise ValueError(f"weights has {len(w)} values, which is not allowed: expected one per "
                         f"chapter id ({len(ids)})")
    if isinstance(n_shared, bool) or not isinstance(n_shared, int) or not 0 <= n_shared <= len(ids):
        raise ValueError(f"n_shared={n_shared!r} is not allowed: expected an integer in "
                         f"0..{len(ids)}")
    colors = [color(1)] * n_shared + [color(0)] * (len(ids) - n_shared)
    fig = go.Figure(go.Bar(x=[f"ch {c}" for c in ids], y=w, marker_color=colors,
                           texttemplate="%{y:.3f}", textposition="outside"))
    fig.update_yaxes(title="weight", range=[0, 1])
    return _finish(fig, f"{title} (shared chapter in orange)", height=320, showlegend=False)
