"""Reading a comparison-lab result (``lab.reproduce``): a leaf module, so that each mechanism's
claims (``registry.Claim.kit``) can read the figures they answer without importing the lab.

The result is a plain dict (its JSON is ``OUT/results.json``)::

    results["done"]["lm/<label>"]     = {"val_loss": {variant: loss}, "tokens", "params", ...}
    results["done"]["recall/<label>"] = {"curves": {variant: {"passkey": [{distance,
                                          accuracy, n_answers}], "mqar": [...]}},
                                          "local_span": {variant: int | None}, ...}
    results["done"]["bench/*"]        = {"records": [bench records], "state": {...}}

``<label>`` is the arch name, or a baseline's label (e.g. "dense iso-FLOP (moc)");
``variant`` is "" or a setting of one trained model (e.g. "C=16").
"""

from __future__ import annotations


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
