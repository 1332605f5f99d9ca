"""What the figure modules share: plotly, the kit's look, input checks, heatmap sizing.

plotly is imported here, once, with the install hint when it is missing; the figure
modules (``charts``, ``mechanisms``, ``training``, ``bench``) take ``go`` and
``make_subplots`` from here. All figures share one colour-blind-friendly palette (Okabe &
Ito) and the ``plotly_white`` template (``color``, ``_finish``). Inputs are forgiving:
tensors, NumPy arrays or nested lists for matrices (``_to_array``). Heatmaps are sized
from their rows and thin their tick labels (``_panel_px``, ``_thinned``), and a boolean
matrix is drawn in two colours with a colour-bar legend (``_mask_trace``): attention
masks, and any boolean ``charts.heatmap``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from blockmem_lite.units import memory_label

try:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots  # noqa: F401  (the figure modules import it here)
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("blockmem_lite.viz needs plotly for its figures: "
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
PHASE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
LEGEND_BELOW = dict(orientation="h", yanchor="top", y=-0.14, x=0, xanchor="left",
                    maxheight=1.0)        # wraps into rows under the chart, never scrolls


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


def _check_mapping(value, name: str, meaning: str) -> None:
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{name}={type(value).__name__} is not allowed: expected a non-empty "
                         f"dict mapping {meaning}")


def _finish(fig: go.Figure, title: str, **layout) -> go.Figure:
    fig.update_layout(template=TEMPLATE, title=dict(text=title, x=0.02), **layout)
    return fig


def _axis_name(letter: str, col: int) -> str:
    return letter if col == 1 else f"{letter}{col}"


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
