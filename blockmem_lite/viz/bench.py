"""Benchmark charts: tokens/s and memory against sequence length, from ``bench`` records.

``records``: the list of bench record dicts (``arch``, ``variant``, ``phase``, ``seq_len``,
``tokens_per_s``, ``memory_bytes`` + ``memory_method``, ``state_bytes``); one line per
arch+variant (a colour), one dash per phase. The builders return figures, never show them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from blockmem_lite.viz.common import PHASE_DASHES, _finish, color, go, memory_method_label


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


def _log_ticks(values: list[float], unit: str) -> dict:
    """Fully labelled ticks for a log axis over ``values``: the powers of ten inside their
    range, or 1-2-5 steps when fewer than three fit (plotly's own minor labels, a lone
    "2" or "5", cannot be read). Empty (plotly decides) when fewer than two ticks fit."""
    low, high = min(values), max(values)
    if low <= 0:
        return {}
    ladder = [m * 10.0 ** e for e in range(math.floor(math.log10(low)),
                                           math.ceil(math.log10(high)) + 1) for m in (1, 2, 5)]
    inside = [v for v in ladder if low * (1 - 1e-9) <= v <= high * (1 + 1e-9)]
    decades = [v for v in inside if math.log10(v).is_integer()]
    ticks = decades if len(decades) >= 3 else inside
    if len(ticks) < 2:
        return {}
    return dict(tickmode="array", tickvals=ticks,
                ticktext=[f"{v:,.{max(0, -math.floor(math.log10(v)))}f}{unit}" for v in ticks])


def _length_figure(groups: dict, phases: list, y_title: str, title: str, log_x: bool,
                   log_y: bool, scale: float = 1.0, unit: str = "") -> go.Figure:
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
    values = [p[1] / scale for points in groups.values() for p in points]
    if log_y and values:
        fig.update_yaxes(**_log_ticks(values, unit))
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
    return _length_figure(groups, phases, y_title, title, log_x, log_y, scale=2**20,
                          unit=" MiB")
