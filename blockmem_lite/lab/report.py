"""The comparison lab's report: ``OUT/report.md`` from a lab result (``lab.reproduce``).

Language modelling, speed and memory against dense, the memory-pays tables (recall beyond
the span against each twin; facts in the weights against the iso-FLOP baseline) and the
papers' claims, as markdown tables; ``PLOTS`` names the figures ``lab.figures`` writes
beside it. The report links only the plots that are there when it is written (the command
line writes it again once it has drawn them); without them it says how to draw them. The
``format_*`` functions give the same tables as fixed-width text, for notebook 10 and the
terminal ("-": not measured).
"""

from __future__ import annotations

from pathlib import Path

from blockmem_lite.checkpoints import atomic_write_bytes
from blockmem_lite.lab.verdicts import kit_text
from blockmem_lite.labdata import MODEL_COLUMNS, position_losses
from blockmem_lite.measure import bench
from blockmem_lite.measure.bench_table import text_table
from blockmem_lite.units import fmt, human_duration

MODEL_FORMATS = {"val loss": ".4f", "FLOPs/tok": ".3g", "state KiB": ".1f", "growth": ".2f"}
PLOTS = ("pareto", "state_vs_length", "recall_vs_distance",      # lab.figures writes them
         "recall_capacity", "facts_capacity", "loss_by_position")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _with_band(mean, bounds) -> str:
    return "-" if mean is None else f"{mean:.2f} ({bounds[0]:.2f}-{bounds[1]:.2f})"


def plots_line(preset: str, plots=()) -> str:
    """The report's last line: links to ``plots`` (names of ``PLOTS`` written beside it in
    ``plots/``), or, with none, how to draw them."""
    if plots:
        return "Plots: " + ", ".join(f"[{name}](plots/{name}.html)" for name in plots)
    return ("Plots: none beside this report. `python -m blockmem_lite reproduce --preset "
            f"{preset} --out DIR` draws them into `DIR/plots/` when plotly is installed (the "
            "`notebooks` extra); run on a copy of this folder, it finds every measurement done "
            "and only writes this report and the plots, in seconds. Notebook 10 draws the same "
            "figures from `results.json`.")


def _partial_lines(results: dict) -> list[str]:
    """A warning paragraph for a run that stopped before its plan was done (none else)."""
    plan = results["meta"].get("plan") or []
    missing = [key for key in plan if key not in results["done"]]
    if not missing:
        return []
    return [f"**Partial run: {len(plan) - len(missing)} of {len(plan)} tasks stored** "
            f"(missing: {', '.join(missing)}). Every table and plot shows only what is "
            "stored; run the same command again to finish it.", ""]


def report_markdown(results: dict, plots=()) -> str:
    """The markdown report: setup, language modelling, speed and memory, recall, the memory-pays
    experiment, the claims table and the plots line (``plots``: the plots beside it)."""
    meta = results["meta"]
    parts = [f"# blockmem_lite reproduce: preset {meta['preset']}",
             f"Machine: {meta['machine']} ({meta['device']}), torch {meta['torch']}. Corpus: "
             f"{meta['corpus']} ({meta['corpus_source']}). Every model trained on the same "
             f"data, {meta['sizes']['steps']} steps, at seed"
             f"{_seeds_text(meta['seed'], meta['sizes'].get('lm_seeds', 1))} (a seed fixes "
             "the first weights and the data order, the same for every model).", "",
             *_partial_lines(results),
             "## Language modelling (validation loss, nats per byte: the lab reads bytes)", ""]
    rows = []
    for key, record in results["done"].items():
        if key.startswith("lm/"):
            for variant, loss in record["val_loss"].items():
                mark = " *" if record.get("starts_from_trained") else ""
                band = (record.get("val_loss_band") or {}).get(variant)
                rows.append([f"{key[3:]} {variant}".strip() + mark, f"{loss:.4f}",
                             f"{band[0]:.4f}-{band[1]:.4f}" if band and len(
                                 record.get("seeds", ())) > 1 else "-",
                             str(len(record.get("seeds", ())) or 1),
                             f"{record['params'] / 1e6:.2f}M", f"{record['tokens']:,}",
                             human_duration(record["seconds"])])
    parts += [_md_table(["model", "val loss", "band", "seeds", "params", "tokens", "time"],
                        rows), "",
              "val loss: the mean over the seeds; band: the lowest and highest seed. "
              "\\* starts from a model trained earlier in this run (ARMT wraps the trained "
              "dense model), then trains its own budget, at the run's seed alone.", "",
              *_position_lines(results)]
    records = results["done"].get("bench/*", {}).get("records", [])
    if records:
        parts += ["## Speed and memory vs dense (same run)", "", "```",
                  bench.format_table(records), "```", ""]
    parts += ["## When does memory pay? (MQAR recall beyond the local span)", "",
              "Every answer lies one span or more before its query. Twin: the same model and "
              "span with the memory path off; blind: its answers did not move when every "
              "token beyond its span was replaced. Bands: the lowest and highest seed.", ""]
    parts.append(_md_table(
        ["model", "span", "beyond (band)", "twin (band)", "twin blind", "dense", "chance",
         "noise", "pays", "by pairs", "holds", "slot model", "short by", "x T"],
        [[r["entry"], str(r["local_span"]), _with_band(r["recall_beyond"], r["band"]),
          _with_band(r["local_baseline"], r["twin_band"]), "yes" if r["twin_blind"] else
          f"no ({r['twin_blindness']:.2g})", _with_band(r["dense"], r["dense_band"]),
          f"{r['chance']:.3f}", fmt(r["noise"], ".2f"), "yes" if r["pays"] else "no",
          " ".join(f"{p}:{a:.2f}" for p, a in r["capacity"]), str(r["holds"]),
          fmt(r.get("slot_model"), ".2f"), r.get("shortfall") or "-",
          " ".join(f"{f}x:{fmt(a, '.2f')}" for f, a in r["length"])]
         for r in results.get("memory_pays", [])]))
    parts += ["", "\"by pairs\": beyond-span accuracy with 1, 2, ... pairs in the first span "
              "(one trained model); \"holds\": the most pairs recalled at 0.9 or better; "
              "\"slot model\": the accuracy the memory's analytic capacity allows "
              "(`recall.slot_accuracy`: slots a query can address, each a bag of values "
              "answering its most frequent one); "
              "\"short by\": why it is under 0.9, \"capacity\" (the slot model is too) or "
              "\"training\" (the memory could hold the pairs); "
              "\"x T\": the same rows stretched to 1, 2, 4, 8 times the trained length "
              "(\"-\": the model refuses the length).", ""]
    staged = [f"{r['entry']} (T={', then '.join(map(str, r['stages']))})"
              for r in results.get("memory_pays", []) if len(r.get("stages", ())) > 1]
    if staged:
        parts += ["Trained in stages of growing length, the recipe's steps in each (the "
                  f"paper's segment curriculum, `recall.curriculum`), its twin alike: "
                  f"{'; '.join(staged)}.", ""]
    parts += ["### Knowledge in the weights (facts never in the context)", "",
              "Each model pretrained on a table of facts, then asked every fact with other "
              "facts as its context; recalled = every value byte right.", ""]
    parts.append(_md_table(
        ["model", "baseline", "facts", "recalled", "baseline recalled", "format floor",
         "noise", "pays"],
        [[r["entry"], r["baseline"], str(r["n_facts"]), f"{r['recalled']:.2f}",
          f"{r['dense']:.2f}", f"{r['floor']:.2f}", f"{r['noise']:.2f}",
          "yes" if r["pays"] else "no"] for r in results.get("knowledge", [])]))
    parts += ["", "## The papers' claims at kit scale", ""]
    parts.append(_md_table(
        ["mechanism", "claim", "where", "paper", "kit", "ceiling", "verdict", "why"],
        [[r["arch"], r["quantity"], f"{r['paper']} ({r['where']})",
          f"{fmt(r['paper_value'], '.4g')} {r['unit']}", kit_text(r),
          fmt(r["ceiling"], ".2f"), r["verdict"], r["reason"]]
         for r in results.get("claims", [])]))
    parts += ["", "kit: the value on the seeds' mean losses, with the lowest and highest seed's "
              "where the claim reads language models trained at several seeds. \"within "
              "noise\": the seeds disagree (the claim holds at some and not at others). \"not "
              "judged\": a training run the claim reads had an accident (its training loss "
              "rose above an untrained model's, at any seed); its value is shown, no verdict "
              "is drawn from it.", "", plots_line(meta["preset"], plots), ""]
    return "\n".join(parts)


def _seeds_text(first: int, count: int) -> str:
    seeds = [str(first + k) for k in range(count)]
    return f" {seeds[0]}" if count == 1 else f"s {', '.join(seeds)}"


def _position_lines(results: dict) -> list[str]:
    """The loss by position section: each model's loss in each quarter of the window, and
    for a memory the same weights with the memory path off."""
    table = position_losses(results)
    if not table:
        return []
    first = next(iter(table.values()))
    edges = first["x"] + [first["length"]]
    header = ["model", "span"] + [f"{a}-{b - 1}" for a, b in zip(edges, edges[1:], strict=False)] \
        + ["memory's gain after the first span"]
    rows = []
    for name, row in table.items():
        rows.append([name, fmt(row["span"], "d"), *(f"{v:.3f}" for v in row["loss"]), "-"])
        if row["off"]:
            rows.append([f"{name}, memory off", fmt(row["span"], "d"),
                         *(f"{v:.3f}" for v in row["off"]), fmt(row["gain"], "+.3f")])
    return ["## Loss by position in the window", "",
            "Validation loss (mean over the seeds) in each quarter of the window. \"memory "
            "off\": the same trained weights with the memory path off (its twin's config): "
            "both see the same tokens inside the first span, so a gap there is not the "
            "memory's. The last column: how much lower the loss is with the memory than "
            "without it, over the positions after the first span.", "",
            _md_table(header, rows), ""]


def write_report(results: dict, out: Path) -> Path:
    """OUT/report.md, linking the plots already in OUT/plots (the command line draws them,
    ``lab.figures.write_plots``, then writes the report again)."""
    plots = [name for name in PLOTS if (Path(out) / "plots" / f"{name}.html").is_file()]
    path = Path(out) / "report.md"
    atomic_write_bytes(path, report_markdown(results, plots).encode())
    return path


def format_model_table(table: dict[str, dict]) -> str:
    """``model_table`` as fixed-width text, one row per model ("-": not measured)."""
    def cell(column, value):
        if column == "pretrained":
            return "yes" if value else "no"
        return fmt(value, MODEL_FORMATS.get(column, ".2f"))

    return text_table(["model", *MODEL_COLUMNS],
                      [[name] + [cell(c, row[c]) for c in MODEL_COLUMNS]
                       for name, row in table.items()])


def format_state_table(table: dict[str, dict]) -> str:
    """``state_table`` as text: the measured KiB at each t, the growth, the gap to the
    analytic model."""
    if not table:
        return "no state measured in this run"
    lengths = next(iter(table.values()))["t"]
    return text_table(["model"] + [f"t={t} KiB" for t in lengths] + ["growth", "vs analytic"],
                      [[name] + [fmt(m / 1024, ".1f") for m in row["measured"]]
                       + [fmt(row["growth"], ".2f"), fmt(row["gap"], ".1%")]
                       for name, row in table.items()])


def format_memory_pays(rows: list[dict]) -> str:
    """``lab.memory_pays`` rows as text: recall beyond the span against the twin and dense,
    the noise, whether it pays, the pairs it holds and the slot model's reading."""
    if not rows:
        return "no recall measured in this run"
    return text_table(
        ["model", "span", "beyond span", "band", "twin", "twin blind", "dense", "noise", "pays",
         "holds", "slot model", "short by"],
        [[r["entry"], str(r["local_span"]), fmt(r["recall_beyond"], ".3f"),
          "{:.2f}-{:.2f}".format(*r["band"]), fmt(r["local_baseline"], ".3f"),
          "yes" if r["twin_blind"] else "no", fmt(r["dense"], ".3f"), fmt(r["noise"], ".3f"),
          "yes" if r["pays"] else "no", f"{r['holds']} pairs", fmt(r["slot_model"], ".2f"),
          r["shortfall"] or "-"] for r in rows])


def format_knowledge(rows: list[dict]) -> str:
    """``lab.knowledge_pays`` rows as text: facts recalled from the weights by the mechanism
    and by its iso-FLOP baseline, per table size."""
    if not rows:
        return "no facts task in this run"
    return text_table(
        ["model", "baseline", "facts", "recalled", "baseline", "format floor", "noise", "pays"],
        [[r["entry"], r["baseline"], str(r["n_facts"]), f"{r['recalled']:.2f}",
          f"{r['dense']:.2f}", f"{r['floor']:.2f}", f"{r['noise']:.2f}",
          "yes" if r["pays"] else "no"] for r in rows])
