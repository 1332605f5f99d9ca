"""The lab's verdicts on a result (``lab.reproduce``, or ``results_from`` measurements made
elsewhere): each paper's claim reproduced, not reproduced or not comparable (``claims_table``),
whether a memory beats its memory-less twin beyond its span (``memory_pays``) and whether
MoC's bank beats its iso-FLOP baseline on facts (``knowledge_pays``), and the terminal's
one-line ``summary``.
"""

from __future__ import annotations

import math

from blockmem_lite import knowledge, recall, registry
from blockmem_lite.measure import bench
from blockmem_lite.units import fmt


# --- claims --------------------------------------------------------------------------------------
def claims_table(results: dict, archs=None) -> list[dict]:
    """For every registered claim (of ``archs``, default all): the paper's value, the kit's,
    their ratio, the FLOP ceiling where one applies, and a verdict (reproduced / not
    reproduced / not comparable) with a one-line reason."""
    rows = []
    for name in registry.names():
        if archs is None or name in archs:
            rows.extend(claim_row(name, claim, results) for claim in registry.lab_spec(name).claims)
    return rows


def results_from(val_loss: dict | None = None, bench_records=(), recall: dict | None = None,
                 state: dict | None = None) -> dict:
    """A lab-style result from measurements made elsewhere (e.g. in a notebook), so
    ``claims_table`` can judge them: ``val_loss`` {label: loss or {variant: loss}},
    ``bench_records`` from ``bench.run_bench``, ``recall`` {label: lab recall record},
    ``state`` {label: {"t", "measured", "analytic"}}."""
    done = {f"lm/{label}": {"val_loss": loss if isinstance(loss, dict) else {"": loss}}
            for label, loss in (val_loss or {}).items()}
    done.update({f"recall/{label}": record for label, record in (recall or {}).items()})
    done["bench/*"] = {"records": list(bench_records), "state": state or {}}
    return {"meta": {}, "done": done}


CLAIM_COLUMNS = ("mechanism", "claim", "verdict", "why", "paper", "kit", "ceiling")


def format_claims(rows: list[dict]) -> str:
    """The claims table as fixed-width text (notebooks print it; the report has markdown)."""
    return bench.text_table(list(CLAIM_COLUMNS), [
        [r["arch"], r["quantity"], r["verdict"], r["reason"],
         f"{fmt(r['paper_value'], '.4g')} {r['unit']}".strip(), kit_text(r),
         fmt(r["ceiling"], ".2f")] for r in rows], left_columns=4)


def kit_text(row: dict) -> str:
    """A claim row's kit value, with its seed band where it has one: "0.12 (0.05 to 0.2)"."""
    band = row.get("kit_band")
    kit = fmt(row["kit_value"], ".3g")
    return f"{kit} ({band[0]:.3g} to {band[1]:.3g})" if band else kit


VERDICTS = ("reproduced", "not reproduced", "within noise", "not comparable", "not judged")


def claim_row(arch: str, claim: registry.Claim, results: dict) -> dict:
    """One row of ``claims_table``: ``claim`` of mechanism ``arch`` judged on ``results``.

    Where the language models it reads were trained at several seeds, the claim is judged
    at each seed (``seed_views``): "reproduced" or "not reproduced" when every seed says
    so, "within noise" when they disagree; ``kit_value`` is the value on the seeds' mean
    losses and ``kit_band`` the lowest and highest seed's. A claim that reads a training
    run with an accident (``accident``, at any seed) is "not judged"."""
    done = results.get("done", {})
    looked_up = _LookUps(done)
    kit = claim.kit({**results, "done": looked_up}) if claim.comparable and claim.kit else None
    read = list(dict.fromkeys(looked_up.keys_read))
    seeded = [key for key in read if len((done.get(key) or {}).get("seeds", ())) > 1]
    per_seed = [claim.kit({**results, "done": view}) for view in seed_views(done)] \
        if seeded and kit is not None else []
    per_seed = [k for k in per_seed if k is not None and not (isinstance(k, float)
                                                              and math.isnan(k))]
    band = [min(per_seed), max(per_seed)] if per_seed else None
    ceiling = claim.ceiling(results) if claim.ceiling else None
    ratio = kit / claim.value if kit is not None and claim.value else None
    untrained = _first_loss(done.get(f"lm/{registry.BASELINE}", {}))
    accidents = [f"{key.split('/', 1)[1]}{where}: {why}" for key in read
                 for where, record in _seed_records(done.get(key) or {})
                 if (why := accident(record, untrained))]
    holding = [claim.holds(k) for k in per_seed] if per_seed else None
    if not claim.comparable:
        verdict, reason = "not comparable", claim.note
    elif accidents:
        verdict, reason = "not judged", f"a training accident: {'; '.join(accidents)}"
    elif kit is None or (isinstance(kit, float) and math.isnan(kit)):
        verdict, reason = "not comparable", "this run did not measure it"
    elif holding and any(holding) and not all(holding):
        verdict, reason = "within noise", (
            f"the seeds disagree: {band[0]:.3g} to {band[1]:.3g} {claim.unit} over "
            f"{len(per_seed)} seeds, {claim.statement} at {sum(holding)} of them")
    elif all(holding) if holding else claim.holds(kit):
        verdict, reason = "reproduced", f"at kit scale: {claim.statement} ({kit:.3g} {claim.unit}" \
            + (f", every one of {len(per_seed)} seeds" if per_seed else "") + ")"
    else:
        verdict, reason = "not reproduced", (
            f"at kit scale the kit measures {kit:.3g} {claim.unit}"
            + (f" ({band[0]:.3g} to {band[1]:.3g} over {len(per_seed)} seeds)" if per_seed
               else "") + f": not {claim.statement}")
    if claim.note and claim.comparable:
        reason += f"; {claim.note}"
    return {"arch": arch, "key": claim.key, "paper": claim.paper, "arxiv": claim.arxiv,
            "where": claim.where, "quantity": claim.quantity, "paper_value": claim.value,
            "unit": claim.unit, "setting": claim.setting, "kit_value": kit, "kit_band": band,
            "seeds": len(per_seed) or 1, "ratio": ratio, "ceiling": ceiling,
            "verdict": verdict, "reason": reason}


def seed_views(done: dict) -> list[dict]:
    """``done`` once per language-model seed: the k-th view holds every language model's
    k-th seed (its ``by_seed`` losses and curves over the combined record; an entry with
    fewer seeds keeps its record), so a claim can be judged seed by seed, each pair of
    models compared at the same seed (the same first weights and data order)."""
    counts = [len(r.get("seeds", ())) for key, r in done.items() if key.startswith("lm/")]
    views = []
    for k in range(max(counts, default=0)):
        view = dict(done)
        for key, record in done.items():
            if key.startswith("lm/") and len(record.get("seeds", ())) > k:
                view[key] = {**record, **record["by_seed"][str(record["seeds"][k])]}
        views.append(view)
    return views


def _seed_records(record: dict) -> list[tuple[str, dict]]:
    """[(" seed s", that seed's record)] of a combined record, or [("", record)]."""
    seeds = record.get("seeds") or ()
    if len(seeds) < 2:
        return [("", record)]
    return [(f" seed {s}", {**record, **record["by_seed"][str(s)]}) for s in seeds]


ACCIDENT_MARGIN = 0.25   # nats: one batch, and a fresh model's first steps, move the loss by
                         # up to about 0.15 (CAT's first chunk sizes); a spike that unlearns
                         # everything goes a nat or more above the start


def accident(record: dict, untrained: float | None = None) -> str | None:
    """Why a language model's run is a training accident, or None: its training loss rose
    above where it started (by more than ``ACCIDENT_MARGIN``), which a working recipe never
    does (a spike that unlearned everything, whatever caused it). A run that starts from
    trained weights (ARMT wraps the trained dense) is held to ``untrained``, an untrained
    model's first loss on the same data (dense's), not to its own start: its batches vary
    more than it improves."""
    curve = record.get("loss_curve") or []
    start = untrained if record.get("starts_from_trained") else _first_loss(record)
    for step, loss in enumerate(curve[1:], start=2):
        if start is not None and loss > start + ACCIDENT_MARGIN:
            return (f"its training loss rose above an untrained model's at step {step} "
                    f"({loss:.2f} > {start:.2f})")
    return None


def _first_loss(record: dict) -> float | None:
    curve = record.get("loss_curve") or []
    return curve[0] if curve else None


class _LookUps(dict):
    """A result's ``done`` that notes which entries a claim's ``kit`` looked up."""

    def __init__(self, done: dict):
        super().__init__(done)
        self.keys_read: list[str] = []

    def __getitem__(self, key):
        self.keys_read.append(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.keys_read.append(key)
        return super().get(key, default)


# --- the memory-pays experiments ---------------------------------------------------------------
BLIND_ATOL = 1e-4          # answer logits of a blind twin move by float32 rounding only


def memory_pays(results: dict) -> list[dict]:
    """Per entry with a memory-less twin, per variant: beyond-span recall of the mechanism
    (mean over seeds, with the band of the lowest and highest seed), of its twin and of
    dense on the same rows. "pays" when the mechanism beats its twin by more than the noise
    of the difference of two rates on the held-out answers (2 standard errors at the widest
    p = 1/2); ``twin_blind`` says whether the twin's answers ignored every token beyond its
    span (``recall.blindness`` below ``BLIND_ATOL``)."""
    rows, done = [], results["done"]
    dense = done.get(f"recall/{registry.BASELINE}", {}).get("beyond", {}).get("", {})
    for key, record in done.items():
        if not key.startswith("recall/") or "twin" not in record:
            continue
        for variant, span in record["local_span"].items():
            mine, twin = record["beyond"][variant], record["twin"]["beyond"][variant]
            blind = record["twin"]["blindness"][variant]
            rows.append({"entry": f"{key.split('/', 1)[1]} {variant}".strip(),
                         "local_span": span, "recall_beyond": mine["mean"],
                         "band": [mine["lo"], mine["hi"]], "local_baseline": twin["mean"],
                         "twin_band": [twin["lo"], twin["hi"]], "dense": dense.get("mean"),
                         "dense_band": [dense["lo"], dense["hi"]] if dense else None,
                         "chance": record["chance"]["mqar"], "seeds": mine["n"],
                         "stages": record.get("stages", []),
                         "noise": recall.noise(mine["n_answers"], twin["n_answers"]),
                         "twin_blindness": blind, "twin_blind": blind < BLIND_ATOL,
                         "capacity": [[c["n_pairs"], c["accuracy"]]
                                      for c in record["capacity"][variant]],
                         "holds": recall.holds(record["capacity"][variant]),
                         "length": [[c["factor"], c["accuracy"]]
                                    for c in record["length"][variant]],
                         "pays": mine["mean"] - twin["mean"] > recall.noise(
                             mine["n_answers"], twin["n_answers"]),
                         **_shortfall(mine, record.get("slot_model", {}).get(variant))})
    return rows


def _shortfall(mine: dict, slot_curve: list[dict] | None) -> dict:
    """The slot model's accuracy at the recipe's pairs, and why the mechanism is short of
    ``recall.TARGET`` where it is: "capacity" (the slot model is short too, and the
    measured accuracy reaches it within the noise of its own answers), else "training" (the
    memory could hold the pairs; the model did not learn to use it)."""
    if not slot_curve:
        return {"slot_model": None, "shortfall": None}
    predicted = slot_curve[-1]["accuracy"]
    if mine["mean"] >= recall.TARGET:
        why = None
    elif predicted < recall.TARGET and \
            mine["mean"] >= predicted - recall.noise(mine["n_answers"]):
        why = "capacity"
    else:
        why = "training"
    return {"slot_model": predicted, "shortfall": why}


def knowledge_pays(results: dict) -> list[dict]:
    """Per mechanism with facts measured beside its iso-FLOP baseline, per table size:
    facts recalled by each, and whether the mechanism beats the baseline by the noise."""
    done, rows = results["done"], []
    for key, record in done.items():
        if not key.startswith("facts/") or not record["baseline_of"]:
            continue
        mine = done.get(f"facts/{record['baseline_of']}")
        if mine is not None:
            rows += [{"entry": record["baseline_of"], "baseline": key.split("/", 1)[1], **row}
                     for row in knowledge.compare(mine["counts"], record["counts"])]
    return rows


def summary(results: dict) -> str:
    """A few lines for the terminal: where the report is, the verdicts, the memory result."""
    verdicts = [r["verdict"] for r in results.get("claims", [])]
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if v in verdicts
                       or v not in ("within noise", "not judged"))
    pays = [r["entry"] for r in results.get("memory_pays", []) if r["pays"]]
    pays += sorted({f"{r['entry']} (facts)" for r in results.get("knowledge", []) if r["pays"]})
    return (f"claims: {counts}; memory pays beyond the local span for: "
            f"{', '.join(pays) or 'none at this scale'}")
