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
from collections.abc import Mapping, Sequence

import numpy as np

from blockmem_lite.units import memory_label

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


def _mask_trace(mask: np.ndarray, showscale: bool) -> go.Heatmap:
    """One boolean mask as a two-colour heatmap: allowed vs blocked."""
    q_len, k_len = mask.shape
    gap = 1 if max(q_len, k_len) <= MAX_CELL_GAPS else 0
    return go.Heatmap(
        z=mask.astype(np.int8),                                   # (Tq, Tk) 0/1
        text=np.where(mask, "allowed", "blocked"),
        colorscale=[[0.0, BLOCKED_COLOR], [0.5, BLOCKED_COLOR],
                    [0.5, ALLOWED_COLOR], [1.0, ALLOWED_COLOR]],
        zmin=0, zmax=1, xgap=gap, ygap=gap, showscale=showscale,
        colorbar=dict(tickvals=[0.25, 0.75], ticktext=["blocked", "allowed"], len=0.5),
        hovertemplate="query %{y} → key %{x}: %{text}<extra></extra>",
    )


def _as_mask(mask, name: str) -> np.ndarray:
    arr = _to_array(mask, name)
    _check_ndim(arr, name, (2,), "a 2-D (query, key) boolean mask")
    return arr.astype(bool)


# ----------------------------------------------------------------------------- masks


def mask_heatmap(mask, title: str = "Attention mask", x_title: str = "key position",
                 y_title: str = "query position") -> go.Figure:
    """A boolean mask (Tq, Tk) drawn as allowed (blue) vs blocked (grey).

    Queries run down the y axis (row 0 on top, like the matrix), keys along x.
    The title notes the share of allowed pairs (the attention work done).
    """
    arr = _as_mask(mask, "mask")                                  # (Tq, Tk)
    fig = go.Figure(_mask_trace(arr, showscale=True))
    fig.update_xaxes(title=x_title, constrain="domain")
    fig.update_yaxes(title=y_title, autorange="reversed", scaleanchor="x", constrain="domain")
    return _finish(fig, f"{title}<br><sup>{_density_text(arr)}</sup>")


def mask_grid(masks: Mapping, title: str = "Attention masks", x_title: str = "key position",
              y_title: str = "query position") -> go.Figure:
    """Several masks side by side (e.g. dense causal vs block-causal), one per subplot."""
    if not isinstance(masks, Mapping) or not masks:
        raise ValueError(f"masks={type(masks).__name__} is not allowed: expected a non-empty "
                         "dict mapping a name to a (query, key) mask")
    arrays = {name: _as_mask(m, f"masks[{name!r}]") for name, m in masks.items()}
    titles = [f"{name}<br><sup>{_density_text(a)}</sup>" for name, a in arrays.items()]
    fig = make_subplots(rows=1, cols=len(arrays), subplot_titles=titles,
                        horizontal_spacing=0.06)
    for col, arr in enumerate(arrays.values(), start=1):
        fig.add_trace(_mask_trace(arr, showscale=col == len(arrays)), row=1, col=col)
    fig.update_xaxes(title=x_title, constrain="domain")
    fig.update_yaxes(autorange="reversed", constrain="domain")
    fig.update_yaxes(title=y_title, row=1, col=1)
    return _finish(fig, title, margin=dict(t=110))


# ----------------------------------------------------------------------------- attention


def attention_heatmap(weights, title: str = "Attention weights", tokens: Sequence | None = None,
                      max_heads: int = 8, batch_index: int = 0) -> go.Figure:
    """Attention weights as heatmaps, one subplot per head.

    ``weights``: (Tq, Tk), (H, Tq, Tk) or (B, H, Tq, Tk) (``batch_index`` picks the
    sequence). Up to ``max_heads`` heads are drawn, four per row. ``tokens``: the
    Tk key tokens (strings or ids) used as tick labels; queries are the last Tq of them.
    """
    arr = _to_array(weights, "weights").astype(float)
    _check_ndim(arr, "weights", (2, 3, 4), "(Tq, Tk), (H, Tq, Tk) or (B, H, Tq, Tk)")
    if isinstance(max_heads, bool) or not isinstance(max_heads, int) or max_heads < 1:
        raise ValueError(f"max_heads={max_heads!r} is not allowed: expected an integer >= 1")
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
    subtitles = [f"head {h}" for h in range(shown)] if arr.ndim > 2 else None
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=subtitles,
                        horizontal_spacing=0.05, vertical_spacing=0.12 if rows > 1 else 0.0)
    for h in range(shown):
        fig.add_trace(go.Heatmap(z=heads[h], coloraxis="coloraxis",
                                 hovertemplate="query %{y} → key %{x}: %{z:.3f}<extra></extra>"),
                      row=h // cols + 1, col=h % cols + 1)
    fig.update_yaxes(autorange="reversed")
    if tokens is not None:
        _label_token_axes(fig, tokens, q_len, k_len)
    fig.update_layout(coloraxis=dict(colorscale=ATTENTION_COLORSCALE, cmin=0.0,
                                     colorbar=dict(title="weight")),
                      height=max(320, 300 * rows))
    if shown < n_heads:
        title = f"{title} (first {shown} of {n_heads} heads)"
    return _finish(fig, title)


def _label_token_axes(fig: go.Figure, tokens: Sequence, q_len: int, k_len: int) -> None:
    labels = [_token_label(t) for t in tokens]
    if len(labels) != k_len:
        raise ValueError(f"tokens has {len(labels)} entries, which is not allowed: expected "
                         f"one per key position ({k_len})")
    fig.update_xaxes(tickmode="array", tickvals=list(range(k_len)), ticktext=labels,
                     tickangle=0)
    fig.update_yaxes(tickmode="array", tickvals=list(range(q_len)),
                     ticktext=labels[k_len - q_len:])


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


def loss_curves(histories: Mapping, x: str = "step", title: str = "Loss",
                tokens_per_step: int | Mapping | None = None, log_y: bool = False) -> go.Figure:
    """Train loss (thin line) and validation loss (markers) for several runs.

    ``histories``: run name -> ``train.History`` or a dict with the same keys.
    ``x``: "step", "tokens" (needs a ``tokens`` series or ``tokens_per_step``,
    a number or a dict per run) or "time" (elapsed seconds).
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r} is not allowed: expected one of {', '.join(X_AXES)}")
    if not isinstance(histories, Mapping) or not histories:
        raise ValueError(f"histories={type(histories).__name__} is not allowed: expected a "
                         "non-empty dict mapping a run name to a History or dict")
    fig = go.Figure()
    for i, (name, history) in enumerate(histories.items()):
        per_step = (tokens_per_step.get(name) if isinstance(tokens_per_step, Mapping)
                    else tokens_per_step)
        _add_loss_traces(fig, name, history, color(i), x, per_step)
    x_titles = {"step": "step", "tokens": "tokens seen", "time": "elapsed (s)"}
    fig.update_xaxes(title=x_titles[x])
    fig.update_yaxes(title="loss (nats/token)", type="log" if log_y else "linear")
    return _finish(fig, title, hovermode="x unified")


def _add_loss_traces(fig: go.Figure, name: str, history, line_color: str, x: str,
                     tokens_per_step, row: int | None = None, col: int | None = None,
                     val_color: str | None = None) -> None:
    """Train loss (thin line) and val loss (diamonds); ``val_color`` defaults to the run's."""
    val_color = val_color or line_color
    steps, losses = _series(history, "step"), _series(history, "loss")
    val_steps, val_losses = _series(history, "val_step"), _series(history, "val_loss")
    where = dict(row=row, col=col) if row is not None else {}
    fig.add_trace(go.Scatter(x=_x_values(history, steps, x, tokens_per_step), y=losses,
                             mode="lines", name=f"{name} train".strip(), legendgroup=name,
                             line=dict(color=line_color, width=1.2)), **where)
    if val_steps:
        fig.add_trace(go.Scatter(x=_x_values(history, val_steps, x, tokens_per_step),
                                 y=val_losses, mode="lines+markers", name=f"{name} val".strip(),
                                 legendgroup=name, cliponaxis=False,
                                 line=dict(color=val_color, width=1, dash="dot"),
                                 marker=dict(color=val_color, size=8, symbol="diamond")),
                      **where)


def training_summary(history, title: str = "Training run") -> go.Figure:
    """The static picture of one run: loss, throughput and memory against step.

    Three stacked panels sharing the step axis: train + validation loss,
    tokens/s, and memory in MiB (the reading method, e.g. RSS or CUDA peak, is
    named on the axis). Interrupted runs say so in the title.
    """
    steps = _series(history, "step")
    memory = [None if b is None else b / 2**20 for b in _series(history, "memory_bytes")]
    method = memory_method_label(_scalar(history, "memory_method"))
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.5, 0.25, 0.25])
    _add_loss_traces(fig, "", history, color(0), "step", None, row=1, col=1,
                     val_color=color(1))
    fig.add_trace(go.Scatter(x=steps, y=_series(history, "tokens_per_s"), mode="lines",
                             name="tokens/s", line=dict(color=color(2))), row=2, col=1)
    fig.add_trace(go.Scatter(x=steps, y=memory, mode="lines", name="memory",
                             line=dict(color=color(3))), row=3, col=1)
    fig.update_yaxes(title="loss", row=1, col=1)
    fig.update_yaxes(title="tokens/s", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title=f"MiB ({method})", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title="step", row=3, col=1)
    subtitle = _run_subtitle(history, steps)
    return _finish(fig, f"{title}<br><sup>{subtitle}</sup>", height=620,
                   hovermode="x unified")


def _run_subtitle(history, steps: list) -> str:
    total = _scalar(history, "total_steps")
    done = steps[-1] if steps else 0
    parts = [f"{done}/{total} steps" if total else f"{done} steps"]
    val_losses = _series(history, "val_loss")
    if val_losses:
        parts.append(f"final val loss {val_losses[-1]:.3f}")
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
