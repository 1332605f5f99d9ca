"""Reading a comparison-lab result (``lab.reproduce``, its ``OUT/results.json``) into tables.

One row of numbers per trained model and variant (``model_table``), the decoding state
against its analytic model (``state_table``), the tasks a partial run still lacks
(``missing_tasks``), and the memory-pays and facts tables as text. Notebook 10 reads a
run through these; the single figures a mechanism's claims read (one loss, one bench
value) are in ``labdata``, a leaf module the mechanisms import.

Every reader takes a partial result too: what the run did not measure is None (a "-" in
the text tables), never an error.
"""

from __future__ import annotations

from blockmem_lite import labdata, registry
from blockmem_lite.measure.bench import text_table
from blockmem_lite.units import fmt

# model_table's columns, and how format_model_table prints the numeric ones (default ".2f")
MODEL_COLUMNS = ("val loss", "train x", "decode x", "FLOPs/tok", "state KiB", "growth",
                 "passkey", "mqar", "pretrained")
MODEL_FORMATS = {"val loss": ".4f", "FLOPs/tok": ".3g", "state KiB": ".1f", "growth": ".2f"}


def trained_models(results: dict) -> list[tuple[str, str, str, str, str]]:
    """[(name, arch, label, variant, bench variant)] per trained language model and variant,
    in the result's order: e.g. ("cat C=16", "cat", "cat", "C=16", "C=16") for one chunk
    size of CAT's multi-chunk model, ("dense iso-FLOP (moc)", "dense", "dense iso-FLOP (moc)",
    "", "iso-FLOP (moc)") for a baseline (its bench records name it in their variant)."""
    out = []
    for key, record in results["done"].items():
        if key.startswith("lm/"):
            label, arch = key[3:], record["arch"]
            own = label[len(arch):].strip()              # e.g. "iso-FLOP (moc)"
            out += [(f"{label} {v}".strip(), arch, label, v, f"{own} {v}".strip())
                    for v in record["val_loss"]]
    return out


def speed_vs_dense(results: dict, arch: str, phase: str, bench_variant: str = "") -> float | None:
    """Same-run tokens/s over dense's at the longest benched length (dense itself: 1.0;
    None when ``arch`` was not benched in ``phase``)."""
    if labdata.bench_record(results, arch, phase, variant=bench_variant) is None:
        return None
    ratio = labdata.bench_value(results, arch, phase, "ratio_vs_dense", variant=bench_variant)
    return 1.0 if ratio is None and arch == registry.BASELINE else ratio


def model_table(results: dict) -> dict[str, dict]:
    """{model name: {column: value or None}} over ``MODEL_COLUMNS``: validation loss, training
    and decoding speed over dense (same run), training FLOPs per token, the measured decoding
    state after the longest t (KiB) and its growth from the shortest, mean recall beyond the
    local span (passkey, MQAR), and whether the model started from one trained earlier."""
    states = results["done"].get("bench/*", {}).get("state", {})
    table = {}
    for name, arch, label, variant, bvar in trained_models(results):
        train = labdata.bench_record(results, arch, "train", variant=bvar)
        state = states.get(name)
        table[name] = {
            "val loss": labdata.val_loss(results, label, variant),
            "train x": speed_vs_dense(results, arch, "train", bvar),
            "decode x": speed_vs_dense(results, arch, "decode", bvar),
            "FLOPs/tok": train["flops_per_token"] if train else None,
            "state KiB": state["measured"][-1] / 1024 if state else None,
            "growth": labdata.state_growth(results, name),
            "passkey": labdata.recall_beyond(results, label, "passkey", variant),
            "mqar": labdata.recall_beyond(results, label, "mqar", variant),
            "pretrained": bool(results["done"][f"lm/{label}"].get("starts_from_trained"))}
    return table


def format_model_table(table: dict[str, dict]) -> str:
    """``model_table`` as fixed-width text, one row per model ("-": not measured)."""
    def cell(column, value):
        if column == "pretrained":
            return "yes" if value else "no"
        return fmt(value, MODEL_FORMATS.get(column, ".2f"))

    return text_table(["model", *MODEL_COLUMNS],
                      [[name] + [cell(c, row[c]) for c in MODEL_COLUMNS]
                       for name, row in table.items()])


def missing_tasks(results: dict) -> list[str]:
    """The tasks of the run's plan ("lm/dense", "bench/*", ...) it has not stored yet, in plan
    order (empty for a finished run)."""
    return [key for key in results["meta"]["plan"] if key not in results["done"]]


def state_table(results: dict) -> dict[str, dict]:
    """{model name: {"t", "measured", "analytic", "growth", "gap"}} from the run's state sweep:
    the decoding state in bytes after each t, measured (prefill) and analytic (None where the
    mechanism has no state model), the growth from the shortest t to the longest, and "gap",
    the largest relative distance between the two (None when nothing analytic is known)."""
    table = {}
    for name, curve in results["done"].get("bench/*", {}).get("state", {}).items():
        known = [(m, a) for m, a in zip(curve["measured"], curve["analytic"], strict=True) if a]
        table[name] = {"t": curve["t"], "measured": curve["measured"],
                       "analytic": curve["analytic"],
                       "growth": labdata.state_growth(results, name),
                       "gap": max((abs(m - a) / a for m, a in known), default=None)}
    return table


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
