"""Figures of a comparison-lab result (``lab.reproduce``): what notebook 10 and the report show.

Each builder takes the results dict (``OUT/results.json``), optionally a subset of entries
(``labels``), and returns a plotly figure built with ``viz.figures``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from blockmem_lite.lab import PLOTS
from blockmem_lite.labdata import bench_record
from blockmem_lite.viz import figures


def _lm_entries(results: dict) -> list[tuple[str, str, dict]]:
    """[(label, variant, lm record)] for every trained entry and variant."""
    return [(key[3:], variant, record) for key, record in results["done"].items()
            if key.startswith("lm/") for variant in record["val_loss"]]


def _name(label: str, variant: str) -> str:
    return f"{label} {variant}".strip()


def _keep(name: str, labels: Sequence | None) -> bool:
    return labels is None or name in labels or name.split(" ")[0] in labels


def pareto(results: dict, labels: Sequence | None = None, phase: str = "train"):
    """Validation loss against same-run tokens/s vs dense (``phase`` train or decode): the
    quality / throughput trade-off, one labelled point per model (hover names it)."""
    points = {}
    for label, variant, record in _lm_entries(results):
        name = _name(label, variant)
        if not _keep(name, labels):
            continue
        arch = record["arch"]
        own = label[len(arch):].strip() if label != arch else ""
        bench = bench_record(results, arch, phase, variant=_name(own, variant))
        ratio = 1.0 if bench and bench["ratio_vs_dense"] is None else \
            (bench["ratio_vs_dense"] if bench else None)
        if ratio is not None:
            points[name] = (ratio, record["val_loss"][variant])
    return figures.scatter_points(points, title=f"Quality vs {phase} speed (lower left is "
                                                "worse, lower right is better)",
                                  x_title=f"{phase} tokens/s vs dense (same run)",
                                  y_title="validation loss (nats)")


def state_vs_length(results: dict, labels: Sequence | None = None):
    """Decoding state after t tokens: measured (solid) and each mechanism's analytic model
    (dotted), one colour per model."""
    curves = results["done"].get("bench/*", {}).get("state", {})
    series, dashed = {}, []
    for name, curve in curves.items():
        if not _keep(name, labels):
            continue
        kib = [b / 1024 for b in curve["measured"]]
        series[name] = {"measured": (curve["t"], kib)}
        if all(a is not None for a in curve["analytic"]):
            series[name]["analytic"] = (curve["t"], [a / 1024 for a in curve["analytic"]])
            dashed.append(name)
    return figures.line_chart(series, title="Decoding state vs context length (dotted: the "
                                            "analytic model)",
                              x_title="tokens in the context t", y_title="state (KiB)",
                              log_x=True, log_y=True)


def recall_vs_distance(results: dict, labels: Sequence | None = None, task: str = "passkey"):
    """Accuracy against distance on held-out ``task`` rows (passkey or mqar), one line per
    model; vertical lines at the local spans, a dotted line at chance."""
    series, spans, chance = {}, {}, None
    for key, record in results["done"].items():
        if not key.startswith("recall/"):
            continue
        label = key[len("recall/"):]
        for variant, curve in record["curves"].items():
            name = _name(label, variant)
            if not _keep(name, labels) or not curve[task]:
                continue
            series[name] = ([r["distance"] for r in curve[task]],
                            [r["accuracy"] for r in curve[task]])
            span = record["local_span"].get(variant)
            if span is not None:
                spans.setdefault(f"span {span}", span)
        chance = record["chance"][task]
    hlines = {"chance": chance} if chance is not None else None
    return figures.line_chart(series, title=f"{task} recall vs distance (beyond a span, only "
                                            "a memory can help)",
                              x_title="distance (tokens)", y_title="accuracy", hlines=hlines,
                              vlines=spans, y_range=(0, 1.05))


def write_plots(results: dict, out) -> list[Path]:
    """Each figure of ``PLOTS`` as a standalone HTML file in ``out/plots`` (plotly.js beside
    them, so they open offline)."""
    folder = Path(out) / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in PLOTS:
        paths.append(folder / f"{name}.html")
        globals()[name](results).write_html(paths[-1], include_plotlyjs="directory")
    return paths
