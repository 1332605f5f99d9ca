"""The figures the notebooks draw for each mechanism: masks and attention (dense, BCMT,
CAT), BCMT's decay and summary weights and gates, ARMT's memory matrices, MoC's routing.

Every builder returns a ``plotly.graph_objects.Figure`` and never shows it. Matrices may
be tensors, NumPy arrays or nested lists; the shapes are in each docstring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from blockmem_lite.viz.charts import heatmap
from blockmem_lite.viz.common import (
    ATTENTION_COLORSCALE,
    LABEL_PX,
    LEGEND_BELOW,
    MARGIN_BOTTOM,
    MARGIN_TOP,
    MASK_LABELS,
    PANEL_GAP_PX,
    PANEL_MAX_PX,
    PLOT_WIDTH_PX,
    _as_mask,
    _axis_name,
    _check_mapping,
    _check_ndim,
    _density_text,
    _finish,
    _heatmap_height,
    _mask_legend_text,
    _mask_style,
    _mask_subtitle,
    _mask_trace,
    _panel_px,
    _thinned,
    _to_array,
    _x_label_px,
    color,
    go,
    make_subplots,
)

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


def _token_label(token) -> str:
    """Make whitespace and control characters visible in tick labels."""
    text = str(token)
    visible = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍"}
    return "".join(visible.get(ch, ch if ch.isprintable() else f"\\x{ord(ch):02x}")
                   for ch in text) or "∅"


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
    x_title = "summary S_j of block j" if n == 1 else "block j"     # one panel's width each
    for col in range(1, n + 1):
        fig.update_xaxes(title=x_title, constrain="domain", row=1, col=col)
        fig.update_yaxes(autorange="reversed", scaleanchor=_axis_name("x", col),
                         constrain="domain", row=1, col=col)
    fig.update_yaxes(title="memory M_i of block i", row=1, col=1)
    fig.update_xaxes(title="d, blocks back (0: the block's own summary)", row=2, col=1)
    fig.update_yaxes(title="weight", type="log", range=[low, 0.05], dtick=1, row=2, col=1)
    decades = list(range(0, math.floor(low) - 1, -1))
    fig.update_layout(coloraxis=dict(
        colorscale=ATTENTION_COLORSCALE, cmin=low, cmax=0.0,
        colorbar=dict(title=dict(text="weight"), tickvals=decades,
                      ticktext=[f"{10.0 ** d:g}" for d in decades], len=0.55, y=1.0,
                      yanchor="top")))
    return _finish(fig, f"{title}<br><sup>log colour scale: each step of colour is a factor "
                        "of 10</sup>", height=760, legend=LEGEND_BELOW,
                   margin=dict(t=110, b=60))


# Light colours, so that the black characters written in the cells stay readable.
SUMMARY_COLORSCALE = [[0.0, "#f7f7f7"], [0.5, "#fdd49e"], [1.0, "#f4934a"]]


def summary_weights_heatmap(weights, chars: Sequence | None = None,
                            title: str = "Summary weights π",
                            zmax: float | None = None) -> go.Figure:
    """BCMT's summary softmax weights π (N, L): row = block, column = position in it.

    ``chars``: optional (N, L) labels (e.g. the characters of the window) written in the
    cells. Rows sum to 1; uniform is 1/L. ``zmax``: the top of the colour range (default
    the largest weight); give two figures the same ``zmax`` to compare them by colour.
    """
    arr = _to_array(weights, "weights").astype(float)
    _check_ndim(arr, "weights", (2,), "(N blocks, L positions)")
    if zmax is not None and not zmax > 0:
        raise ValueError(f"zmax={zmax!r} is not allowed: expected a weight above 0, or None")
    fig = go.Figure(go.Heatmap(z=arr, colorscale=SUMMARY_COLORSCALE, zmin=0.0, zmax=zmax,
                               colorbar=dict(title="weight"),
                               hovertemplate="block %{y}, token %{x}: weight %{z:.3f}"
                                             "<extra></extra>"))
    if chars is not None:
        labels = [[_token_label(c) for c in row] for row in chars]
        if [len(r) for r in labels] != [arr.shape[1]] * arr.shape[0]:
            raise ValueError(f"chars is not allowed: expected {arr.shape[0]} rows of "
                             f"{arr.shape[1]} labels, like weights {arr.shape}")
        size = int(min(14, max(9, PLOT_WIDTH_PX / arr.shape[1])))    # about a cell's width
        fig.update_traces(text=labels, texttemplate="%{text}",
                          textfont=dict(size=size, color="black"),
                          hovertemplate="block %{y}, token %{x} '%{text}': weight %{z:.3f}"
                                        "<extra></extra>")
    fig.update_xaxes(title="position in the block")
    fig.update_yaxes(title="block", autorange="reversed", dtick=1)
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
