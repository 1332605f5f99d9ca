"""Reading a comparison-lab result (``lab.reproduce``): single figures (one loss, one bench
value, recall beyond a span) and the tables notebook 10 and the report show (one row per
model, the decoding-state curves, the tasks a partial run lacks). A leaf module, so that each
mechanism's claims (``registry.Claim.kit``) read their figures without importing the lab;
``lab.report`` formats the tables as text. Every reader takes a partial result too: what the
run did not measure is None, never an error.

The result is a plain dict (its JSON is ``OUT/results.json``)::

    results["done"]["lm/<label>"]     = {"val_loss": {variant: loss (mean over the seeds)},
                                          "val_loss_band": {variant: [lowest, highest]},
                                          "position_loss": {variant: [loss at each position]},
                                          "seeds", "by_seed", "tokens", "params", ...}
    results["done"]["recall/<label>"] = {"curves": {variant: {"passkey": [{distance,
                                          accuracy, n_answers}], "mqar": [...]}},
                                          "local_span": {variant: int | None}, ...}
    results["done"]["bench/*"]        = {"records": [bench records], "state": {...}}

``<label>`` is the arch name, or a baseline's label (e.g. "dense iso-FLOP (moc)");
``variant`` is "" or a setting of one trained model (e.g. "C=16").
"""

from __future__ import annotations

# model_table's columns (lab.report.format_model_table prints them)
MODEL_COLUMNS = ("val loss", "train x", "decode x", "FLOPs/tok", "state KiB", "growth",
                 "passkey", "mqar", "pretrained")


def val_loss(results: dict, label: str, variant: str = "") -> float | None:
    """The validation loss of an entry (one of its variants), or None if not measured."""
    record = results.get("done", {}).get(f"lm/{label}")
    return None if record is None else record["val_loss"].get(variant)


def loss_gap(results: dict, label: str, reference: str, variant: str = "") -> float | None:
    """``val_loss(label) - val_loss(reference)`` in nats (negative: ``label`` is better)."""
    mine, other = val_loss(results, label, variant), val_loss(results, reference)
    return None if mine is None or other is None else mine - other


def bench_records(results: dict) -> list[dict]:
    """Every bench record of a lab result ([] before its bench ran)."""
    return results.get("done", {}).get("bench/*", {}).get("records", [])


def bench_record(results: dict, arch: str, phase: str, seq_len: int | None = None,
                 variant: str | None = None) -> dict | None:
    """The bench record of ``arch`` in ``phase`` at ``seq_len`` (default: the longest)."""
    records = [r for r in bench_records(results)
               if r["arch"] == arch and r["phase"] == phase
               and (variant is None or r["variant"] == variant)]
    if seq_len is None and records:
        seq_len = max(r["seq_len"] for r in records)
    found = [r for r in records if r["seq_len"] == seq_len]
    return found[0] if found else None


def bench_value(results: dict, arch: str, phase: str, key: str, seq_len: int | None = None,
                variant: str | None = None):
    """One field of ``bench_record`` (e.g. "ratio_vs_dense", "flop_ceiling"), or None."""
    record = bench_record(results, arch, phase, seq_len, variant)
    return None if record is None else record.get(key)


def memory_ratio(results: dict, arch: str, phase: str, key: str = "memory_bytes",
                 variant: str | None = None) -> float | None:
    """Dense's bytes over ``arch``'s (same run, longest length): > 1 means less memory."""
    mine = bench_value(results, arch, phase, key, variant=variant)
    record = bench_record(results, arch, phase, variant=variant)
    dense = bench_value(results, "dense", phase, key, record["seq_len"]) if record else None
    return dense / mine if mine and dense else None


def recall_beyond(results: dict, label: str, task: str = "passkey", variant: str = "",
                  span: int | None = None) -> float | None:
    """Mean accuracy at distances beyond ``span`` (default: the entry's local span)."""
    record = results.get("done", {}).get(f"recall/{label}")
    if record is None or variant not in record["curves"]:
        return None
    span = span if span is not None else record["local_span"].get(variant)
    rows = [r for r in record["curves"][variant][task] if span is None or r["distance"] > span]
    return sum(r["accuracy"] for r in rows) / len(rows) if rows else None


def state_growth(results: dict, label: str) -> float | None:
    """Measured decoding state at the longest length over the shortest (1.0 = constant)."""
    curve = results.get("done", {}).get("bench/*", {}).get("state", {}).get(label)
    if not curve or not curve["measured"] or not curve["measured"][0]:
        return None
    return curve["measured"][-1] / curve["measured"][0]


def best(values, pick=max) -> float | None:
    """``pick`` (max, or min) of the values that are not None (None when there is none)."""
    found = [v for v in values if v is not None]
    return pick(found) if found else None


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
    record = bench_record(results, arch, phase, variant=bench_variant)
    if record is None:
        return None
    ratio = record.get("ratio_vs_dense")
    return 1.0 if ratio is None else ratio          # only dense's own records have none


def model_table(results: dict) -> dict[str, dict]:
    """{model name: {column: value or None}} over ``MODEL_COLUMNS``: validation loss, training
    and decoding speed over dense (same run), training FLOPs per token, the measured decoding
    state after the longest t (KiB) and its growth from the shortest, mean recall beyond the
    local span (passkey, MQAR), and whether the model started from one trained earlier."""
    states = results["done"].get("bench/*", {}).get("state", {})
    table = {}
    for name, arch, label, variant, bvar in trained_models(results):
        train = bench_record(results, arch, "train", variant=bvar)
        state = states.get(name)
        table[name] = {
            "val loss": val_loss(results, label, variant),
            "train x": speed_vs_dense(results, arch, "train", bvar),
            "decode x": speed_vs_dense(results, arch, "decode", bvar),
            "FLOPs/tok": train["flops_per_token"] if train else None,
            "state KiB": state["measured"][-1] / 1024 if state else None,
            "growth": state_growth(results, name),
            "passkey": recall_beyond(results, label, "passkey", variant),
            "mqar": recall_beyond(results, label, "mqar", variant),
            "pretrained": bool(results["done"][f"lm/{label}"].get("starts_from_trained"))}
    return table


def val_loss_band(results: dict, label: str, variant: str = "") -> list[float] | None:
    """[lowest, highest] validation loss over an entry's seeds (None: one seed, or not
    measured)."""
    record = results.get("done", {}).get(f"lm/{label}") or {}
    band = (record.get("val_loss_band") or {}).get(variant)
    return band if band and len(record.get("seeds", ())) > 1 else None


def position_losses(results: dict, width: int | None = None) -> dict[str, dict]:
    """{model name: {"x", "loss", "off", "span", "length", "gain"}}: each language model's
    validation loss by position in the window (mean over its seeds), averaged over
    stretches of ``width`` positions (default: a quarter of the window); "x" is each
    stretch's first position, "off" the same trained weights with the memory path off
    (None for a model without a twin), "span" the local span (a block, a chunk, a segment;
    None: the whole window), "length" the window, "gain" the mean of off - loss over the
    positions after the first span (None without "off"). A memory pays where "loss" falls
    below "off" after the first span; before it, the two see the same tokens."""
    out = {}
    for name, _, label, variant, _ in trained_models(results):
        record = results["done"][f"lm/{label}"]
        curve = (record.get("position_loss") or {}).get(variant)
        if not curve:
            continue
        step = width or max(1, len(curve) // 4)
        x = list(range(0, len(curve), step))
        off = (record.get("position_loss_off") or {}).get(variant)
        span = (record.get("local_span") or {}).get(variant)
        after = list(zip(curve[span or len(curve):], (off or [])[span or len(curve):],
                         strict=False))
        out[name] = {"x": x, "loss": _means(curve, step), "off": _means(off, step) if off else None,
                     "span": span, "length": len(curve),
                     "gain": sum(o - m for m, o in after) / len(after) if after else None}
    return out


def _means(values: list[float], width: int) -> list[float]:
    return [sum(values[i:i + width]) / len(values[i:i + width])
            for i in range(0, len(values), width)]


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
                       "growth": state_growth(results, name),
                       "gap": max((abs(m - a) / a for m, a in known), default=None)}
    return table
