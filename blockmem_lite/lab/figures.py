"""Figures of a comparison-lab result (``lab.reproduce``): what notebook 10 and the report show.

Each builder takes the results dict (``OUT/results.json``), optionally a subset of entries
(``labels``), and returns a plotly figure built with ``viz.charts`` and ``viz.training``.
A partial result (a run stopped before its plan was done) says so under each title
(``partial_note``).
"""

from __future__ import annotations

import functools
import html
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go

from blockmem_lite import labdata, recall, registry
from blockmem_lite.lab.report import PLOTS
from blockmem_lite.lab.verdicts import VERDICTS
from blockmem_lite.labdata import bench_record
from blockmem_lite.viz import charts, common, training
from blockmem_lite.viz.monitor import LiveMonitor


def _lm_entries(results: dict) -> list[tuple[str, str, dict]]:
    """[(label, variant, lm record)] for every trained entry and variant."""
    return [(key[3:], variant, record) for key, record in results["done"].items()
            if key.startswith("lm/") for variant in record["val_loss"]]


def _name(label: str, variant: str) -> str:
    return f"{label} {variant}".strip()


def _keep(name: str, labels: Sequence | None) -> bool:
    return labels is None or name in labels or name.split(" ")[0] in labels


def _empty(title: str, why: str):
    """A figure with no data and a note saying why (a partial result lacks that task)."""
    fig = go.Figure()
    fig.add_annotation(text=why, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return common._finish(fig, title)


def partial_note(results: dict, shown: int = 3) -> str:
    """"" for a finished run; else ``partial run: 13 of 14 tasks stored (missing:
    recall/moc)``, naming the first ``shown`` missing tasks."""
    plan = results.get("meta", {}).get("plan") or []
    missing = [key for key in plan if key not in results.get("done", {})]
    if not missing:
        return ""
    names = ", ".join(missing[:shown]) + (f" and {len(missing) - shown} more"
                                          if len(missing) > shown else "")
    return f"partial run: {len(plan) - len(missing)} of {len(plan)} tasks stored (missing: {names})"


def _marks_partial(builder):
    """A builder of ``builder(results, ...)`` whose figure, from a partial run, says so in
    a line under its title."""
    @functools.wraps(builder)
    def marked(results: dict, *args, **kwargs):
        fig = builder(results, *args, **kwargs)
        note = partial_note(results)
        if note:
            title = fig.layout.title.text or ""
            fig.update_layout(title_text=f'{title}<br><sup style="color:#b00020">'
                                         f"{html.escape(note)}</sup>",
                              margin_t=(fig.layout.margin.t or 80) + 30)
        return fig
    return marked


def _label_styled_lines(fig: go.Figure, styles: dict, key: str) -> go.Figure:
    """A short legend that never scrolls: a line named ``"<model>: <style>"`` for a style in
    ``styles`` ({": twin": "twin"}) leaves the legend, toggles with its model's measured line
    and is labelled at its right end (once per label and height); ``key`` names the line
    styles above the legend, which wraps under the chart."""
    placed: dict[str, list[float]] = {}                  # label -> heights already labelled
    for trace in fig.data:
        trace.legendgroup = trace.name.split(": ")[0]
        label = next((text for suffix, text in styles.items() if trace.name.endswith(suffix)),
                     None)
        if label is None or not len(trace.y):
            continue
        heights = placed.setdefault(label, [])
        text = "" if any(abs(trace.y[-1] - h) < 0.06 for h in heights) else label
        heights.append(trace.y[-1])
        trace.update(showlegend=False, mode="lines+markers+text", textposition="middle right",
                     text=[""] * (len(trace.y) - 1) + [text], cliponaxis=False,
                     textfont=dict(color="#555555"))
    fig.update_annotations(selector=dict(text="chance"), x=0, xanchor="left")  # not on a label
    legend = dict(common.LEGEND_BELOW, y=-0.22, title=dict(text=key, side="top"))
    return fig.update_layout(legend=legend, margin=dict(b=110, r=90))


def pareto_front(points: dict) -> list[str]:
    """The names of ``points`` {name: (speed, loss)} that no other point dominates (another
    point at least as fast *and* at least as good, better in one), fastest first."""
    front = [name for name, (x, y) in points.items()
             if not any(x2 >= x and y2 <= y and (x2 > x or y2 < y)
                        for other, (x2, y2) in points.items() if other != name)]
    return sorted(front, key=lambda name: (-points[name][0], points[name][1]))


def pareto_points(results: dict, labels: Sequence | None = None,
                  phase: str = "train") -> dict:
    """{model name: (same-run ``phase`` tokens/s vs dense, validation loss)} for every entry
    with both measurements (dense is 1.0 by definition)."""
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
    return points


@_marks_partial
def pareto(results: dict, labels: Sequence | None = None, phase: str = "train"):
    """Validation loss against same-run tokens/s vs dense (``phase`` train or decode): the
    quality / throughput trade-off, one labelled point per model (hover names it), the
    Pareto front joined by a dashed line."""
    title = f"Quality vs {phase} speed (lower right is better; dashed: the Pareto front)"
    points = pareto_points(results, labels, phase)
    if not points:
        return _empty(title, "no model has both a validation loss and a bench record")
    fig = charts.scatter_points(points, title=title,
                                x_title=f"{phase} tokens/s vs dense (same run)",
                                y_title="validation loss (nats)")
    fig.update_traces(hovertemplate="<b>%{text}</b><br>%{x:.2f}x dense<br>loss %{y:.4f}"
                                    "<extra></extra>")
    front = pareto_front(points)
    fig.add_trace(go.Scatter(x=[points[n][0] for n in front], y=[points[n][1] for n in front],
                             mode="lines", name="Pareto front", hoverinfo="skip",
                             line=dict(color="#555555", dash="dash", shape="hv")))
    return fig


@_marks_partial
def state_vs_length(results: dict, labels: Sequence | None = None):
    """Decoding state after t tokens: measured (solid) and each mechanism's analytic model
    (dotted), one colour per model."""
    curves = results["done"].get("bench/*", {}).get("state", {})
    title = "Decoding state vs context length (dotted: the analytic model)"
    series = {}
    for name, curve in curves.items():
        if not _keep(name, labels):
            continue
        kib = [b / 1024 for b in curve["measured"]]
        series[name] = {"measured": (curve["t"], kib)}
        if all(a is not None for a in curve["analytic"]):
            series[name]["analytic"] = (curve["t"], [a / 1024 for a in curve["analytic"]])
    if not series:
        return _empty(title, "the decoding state was not measured in this run (no bench)")
    fig = charts.line_chart(series, title=title, x_title="tokens in the context t",
                            y_title="state (KiB)", log_x=True, log_y=True)
    fig.for_each_trace(lambda trace: trace.update(line_dash="dot")
                       if trace.name.endswith(": analytic") else None)
    return fig


@_marks_partial
def recall_vs_distance(results: dict, labels: Sequence | None = None, task: str = "mqar"):
    """Accuracy against distance on held-out ``task`` rows (mqar or passkey), one line per
    model and one, dashed, per memory-less twin ("bcmt twin"); vertical lines at the local
    spans, a dotted line at chance."""
    series, spans, chance = {}, {}, None
    for key, record in results["done"].items():
        if not key.startswith("recall/"):
            continue
        label = key[len("recall/"):]
        drawn = {label: record["curves"]}
        if "twin" in record:
            drawn[f"{label} twin"] = record["twin"]["curves"]
        for model_name, curves in drawn.items():
            for variant, curve in curves.items():
                name = _name(model_name, variant)
                if not _keep(name, labels) or not curve.get(task):
                    continue
                series[name] = ([r["distance"] for r in curve[task]],
                                [r["accuracy"] for r in curve[task]])
                span = record["local_span"].get(variant)
                if span is not None:
                    spans.setdefault(f"span {span}", span)
        chance = record["chance"].get(task, chance)
    title = f"{task} recall vs distance (beyond a span, only a memory can help)"
    if not series:
        return _empty(title, f"{task} recall was not measured for these models in this run")
    hlines = {"chance": chance} if chance is not None else None
    return charts.line_chart(series, title=title, x_title="distance (tokens)",
                             y_title="accuracy", hlines=hlines, vlines=spans,
                             y_range=(0, 1.05), dashed=[n for n in series if " twin" in n])


@_marks_partial
def recall_capacity(results: dict, labels: Sequence | None = None):
    """Beyond-span MQAR accuracy against the number of pairs in the first span: per model
    and variant one colour, its measured line solid, its twin dashed and its slot model
    (``recall.slot_curve``, the memory's analytic capacity) dotted; dense for reference,
    chance as a dotted rule. Where the measured line leaves 1 with the slot model, that
    memory is full; where it falls below the slot model, it was not learned."""
    series, chance = {}, None
    for key, record in results["done"].items():
        if not key.startswith("recall/") or "capacity" not in record:
            continue
        label = key[len("recall/"):]
        for variant, curve in record["capacity"].items():
            name = _name(label, variant)
            if not _keep(name, labels):
                continue
            lines = {"measured": _pairs_curve(curve)}
            if "twin" in record:
                lines["twin"] = _pairs_curve(record["twin"]["capacity"][variant])
            slots = (record.get("slot_model") or {}).get(variant)
            if slots:
                lines["slot model"] = _pairs_curve(slots)
            series[name] = lines if len(lines) > 1 else lines["measured"]
        chance = record["chance"].get("mqar", chance)
    title = "How many pairs each memory holds (MQAR beyond the span)"
    if not series:
        return _empty(title, "recall by number of pairs was not measured in this run")
    fig = charts.line_chart(series, title=title, x_title="pairs in the first span",
                            y_title="accuracy beyond the span", y_range=(0, 1.05),
                            hlines={"chance": chance} if chance is not None else None)
    _label_styled_lines(fig, {": twin": "twin", ": slot model": "slot model"},
                        "solid: measured, dashed: memory-less twin, dotted: slot model")
    return fig.update_xaxes(dtick=1)                     # pairs are whole numbers


def _pairs_curve(curve: list[dict]) -> tuple[list, list]:
    return [p["n_pairs"] for p in curve], [p["accuracy"] for p in curve]


@_marks_partial
def facts_capacity(results: dict):
    """Facts recalled exactly against the size of the facts table (``results["knowledge"]``):
    each mechanism with an in-weights memory and its iso-FLOP baseline, and the format
    floor (the best a model gets that knows no fact) dashed: where the lines fall to the
    floor, the table no longer fits."""
    rows, title = results.get("knowledge") or [], "How many facts fit (facts never in the context)"
    if not rows:
        return _empty(title, "the facts experiment was not measured in this run")
    series, floors = {}, {}
    for row in sorted(rows, key=lambda r: r["n_facts"]):
        for name, value in ((row["entry"], row["recalled"]), (row["baseline"], row["dense"])):
            xs, ys = series.setdefault(name, ([], []))
            xs.append(row["n_facts"])
            ys.append(value)
        floors[row["n_facts"]] = row["floor"]
    series["format floor"] = (list(floors), list(floors.values()))
    return charts.line_chart(series, title=title, x_title="facts in the table",
                             y_title="facts recalled (every value byte right)",
                             y_range=(0, 1.05), log_x=True, dashed=["format floor"])


def memory_sweep(record: dict):
    """A memory-size sweep (``recall_sweep.run_sweep``): beyond-span accuracy against the
    knob's value, one colour per number of pairs, measured solid and the slot model of the
    memory's capacity dashed, chance as a dotted rule (Zoology's accuracy-against-size plot)."""
    knob, title = record["knob"], f"{record['arch']}: recall against {record['knob']}"
    stored = sorted(record["points"].values(), key=lambda p: p["value"])
    if not stored:
        return _empty(title, "no point of this sweep has finished yet")
    values = [p["value"] for p in stored]
    series = {}
    for i, first in enumerate(stored[0]["capacity"]):
        series[f"{first['n_pairs']} pair{'s' if first['n_pairs'] > 1 else ''}"] = {
            "measured": (values, [p["capacity"][i]["accuracy"] for p in stored]),
            "slot model": (values, [p["slot_model"][i]["accuracy"] for p in stored])}
    spread = max(values) / min(values) if min(values) > 0 else 1
    fig = charts.line_chart(series, title=title, x_title=knob,
                            y_title="accuracy beyond the span", y_range=(0, 1.05),
                            log_x=spread >= 4 and all(float(v).is_integer() for v in values),
                            hlines={"chance": record["chance"]})
    return _label_styled_lines(fig, {": slot model": "slot model"},
                               "solid: measured, dashed: slot model")


def recall_monitor(name: str, recipe: recall.RecallRecipe, every: int | None = None,
                   mode: str = "auto") -> LiveMonitor:
    """A trainer callback that asks the recall model ``name`` the held-out beyond-span MQAR
    every ``every`` steps (default: 10 points per run) and draws its accuracy against the
    step as it trains (text mode: one line per point), chance dotted."""
    every = every or max(1, recipe.steps // 10)
    chance = recall.chance(recipe)

    def probe(trainer, rec) -> float:
        return recall.beyond(trainer.model, recipe)["accuracy"]

    def figure(snapshots):
        steps, accuracy = zip(*snapshots, strict=True)
        return charts.line_chart({name: (list(steps), list(accuracy))}, y_range=(0, 1.05),
                                 x_title="training step", y_title="accuracy beyond the span",
                                 hlines={"chance": chance}, title=f"recall while training: {name}")

    def text(snapshots) -> str:
        return f"beyond-span accuracy {snapshots[-1][1]:.3f} (chance {chance:.3f})"

    return LiveMonitor(probe, figure, text, every=every, title=f"recall: {name}", series=True,
                       mode=mode)


def training_histories(results: dict, labels: Sequence | None = None) -> dict:
    """{model label: a history dict (step, loss, val_step, val_loss)} from each trained
    entry's stored curves, for ``viz.training.loss_curves`` / ``training_comparison``."""
    out = {}
    for key, record in results["done"].items():
        if not key.startswith("lm/") or "loss_curve" not in record:
            continue
        label = key[3:]
        if not _keep(label, labels):
            continue
        losses = list(record["loss_curve"])
        val = record.get("val_curve", [])
        out[label] = {"step": list(range(1, len(losses) + 1)), "loss": losses,
                      "val_step": [p[0] for p in val], "val_loss": [p[1] for p in val],
                      "total_steps": record.get("steps"), "arch": record["arch"]}
    return out


@_marks_partial
def training_curves(results: dict, labels: Sequence | None = None):
    """Every language model's training loss (line) and validation loss (diamonds) as the lab
    trained it, one panel per mechanism (dense drawn grey in the others), one legend entry
    per model under the chart."""
    title = "Training curves, same data and budget (one panel per mechanism)"
    histories = training_histories(results, labels)
    if not histories:
        return _empty(title, "no training curves in this result")
    arch = {name: h["arch"] for name, h in histories.items()}
    return training.loss_curves(histories, title=title, facet=arch,
                                reference="dense" if "dense" in histories else None)


POSITION_WIDTH = 8          # positions averaged per point of the loss-by-position curves


@_marks_partial
def loss_by_position(results: dict, labels: Sequence | None = None):
    """Each memory's validation loss by position in the window (mean over the seeds), one
    panel per model with a twin: with its memory, the same weights with the memory path off,
    and dense; dashed lines at its local span's boundaries (blocks, chunks, segments). The
    memory pays where its curve drops below "memory off" after the first boundary."""
    title = "Loss by position in the window: the memory on and off, dense for reference"
    curves = labdata.position_losses(results, POSITION_WIDTH)
    dense = curves.get(registry.BASELINE)
    panels, vlines = {}, {}
    for name, row in curves.items():
        if row["off"] is None or not _keep(name, labels):
            continue
        series = {"memory on": (row["x"], row["loss"]), "memory off": (row["x"], row["off"])}
        if dense:
            series["dense"] = (dense["x"], dense["loss"])
        panels[name] = series
        span = row["span"]
        bounds = range(span, row["length"], span) if span and row["length"] // span <= 8 else ()
        vlines[name] = {("span" if k == 0 else " " * k): x for k, x in enumerate(bounds)}
    if not panels:
        return _empty(title, "no model with a memory-less twin has a loss by position here")
    return charts.line_panels(panels, title=title, x_title="position",
                              y_title="validation loss (nats)", vlines=vlines, mode="lines",
                              shared_y=True)


def claims_overview(rows: Sequence[dict]):
    """The claims table (``lab.claims_table``) at a glance: per mechanism, how many of its
    papers' claims were reproduced, not reproduced, not comparable at kit scale, or not
    judged (a training accident)."""
    title = "The papers' claims at kit scale"
    if not rows:
        return _empty(title, "no claims to judge")
    archs = list(dict.fromkeys(r["arch"] for r in rows))
    groups = {v: {a: sum(r["arch"] == a and r["verdict"] == v for r in rows) for a in archs}
              for v in VERDICTS}
    return charts.grouped_bars(groups, title=title, x_title="mechanism",
                               y_title="claims", text_format="d")


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
