"""The checks of exercises/10_shootout.ipynb (see ``exercise_checks``).

Every check reads the notebook's lab result (``results``, data) with ``Trial.value``; what it
expects from that result, the kit computes here.
"""

from __future__ import annotations

import dataclasses
import math
import unittest.mock

import torch

from blockmem_lite import lab, labdata, recall
from blockmem_lite.checks import CheckFailed, check_close, check_equal, check_true
from blockmem_lite.exercise_checks import exercise_check
from blockmem_lite.lab import figures as lab_figures
from blockmem_lite.mechanisms import cat
from blockmem_lite.registry import Claim

PRESETS = ("fast", "class", "gpu")


def not_allowed(name):
    def refuse(*args, **kwargs):
        raise CheckFailed(f"{name} is switched off in this check: compute it yourself")
    return refuse


def lab_result(t) -> dict:
    """The notebook's lab result: ``results``, a dict holding ``done``."""
    results = t.value("results")
    if not isinstance(results, dict) or not isinstance(results.get("done"), dict):
        raise CheckFailed("results is not a lab result (a dict with 'done'): run the notebook's "
                          "first cells again, then this check")
    return results


# --- exercise 1: the Pareto front -------------------------------------------------------------


def drawn_points(t) -> dict:
    """Up to 12 points on a coarse grid (ties on both axes likely), drawn anew."""
    gen = t.fresh_generator()
    n = t.fresh_int(4, 12)
    speeds = (torch.randint(1, 7, (n,), generator=gen) / 4).tolist()
    losses = (3 + torch.randint(0, 6, (n,), generator=gen) / 10).tolist()
    return {f"m{i}": (s, round(loss, 2)) for i, (s, loss) in enumerate(zip(speeds, losses,
                                                                           strict=True))}


@exercise_check("nb10-cell-5", own_work={"my_pareto_front": (lab_figures.pareto_front,)})
def pareto_check(t):
    """my_pareto_front against lab_figures.pareto_front on the lab's points, planted cases
    and points drawn anew, with pareto_front switched off while yours runs."""
    my_pareto_front = t.answer("my_pareto_front")
    results = lab_result(t)
    cases = {"the lab's training points": lab_figures.pareto_points(results, phase="train"),
             "the lab's decoding points": lab_figures.pareto_points(results, phase="decode"),
             "one dominated point": {"a": (1.0, 3.0), "b": (2.0, 3.2), "c": (0.5, 3.5)},
             "same speed, worse loss": {"a": (1.0, 3.0), "b": (1.0, 3.1)},
             "same loss, slower": {"a": (1.0, 3.0), "b": (1.5, 3.0)},
             "two identical points": {"a": (1.0, 3.0), "b": (1.0, 3.0), "c": (0.9, 3.0)},
             "a chain": {f"m{i}": (float(i), 3.0 + 0.1 * i) for i in range(5)},
             "points drawn anew": drawn_points(t)}
    expected = {case: sorted(lab_figures.pareto_front(points)) for case, points in cases.items()}
    with unittest.mock.patch.object(lab_figures, "pareto_front", not_allowed("pareto_front")):
        for case, points in cases.items():
            check_equal(sorted(my_pareto_front(points)), expected[case], f"front of {case}")


# --- exercise 2: equal steps or equal compute -------------------------------------------------


def reference_loss_at(curve, flops_per_step, budget, window):
    """The check's reading of a curve at a budget (see the exercise), or None."""
    steps = int(budget // flops_per_step)
    if steps < window or steps > len(curve):
        return None
    return sum(curve[steps - window:steps]) / window


def reference_gaps(curve_a, flops_a, curve_b, flops_b, window):
    """(gap at equal steps, gap at equal compute), as the exercise defines them."""
    end_a, end_b = (sum(c[-window:]) / window for c in (curve_a, curve_b))
    budget = min(len(curve_a) * flops_a, len(curve_b) * flops_b)
    return end_a - end_b, (reference_loss_at(curve_a, flops_a, budget, window)
                           - reference_loss_at(curve_b, flops_b, budget, window))


REFERENCES = (reference_loss_at, reference_gaps)


@exercise_check("nb10-cell-9", own_work={"loss_at_compute": REFERENCES, "compare_at": REFERENCES})
def compute_check(t):
    """loss_at_compute and compare_at on planted curves and on curves drawn anew."""
    loss_at_compute = t.answer("loss_at_compute")
    compare_at = t.answer("compare_at")
    a = [8.0, 6.0, 4.0, 3.0, 2.5, 2.0, 1.5, 1.0]       # 8 steps
    b = [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.5, 2.0]       # 8 steps
    gen = t.fresh_generator()
    steps = t.fresh_int(8, 20)
    c, d = ((1 + 7 * torch.rand(steps, generator=gen, dtype=torch.float64)).tolist()
            for _ in range(2))
    flops_c, flops_d = t.fresh_int(1, 4), t.fresh_int(1, 4)
    drawn_window, drawn_budget = t.fresh_int(1, 4), t.fresh_int(0, steps * flops_c + 3)
    named = {id(a): "a", id(b): "b", id(c): "c (drawn anew)", id(d): "d (drawn anew)"}
    for (curve, flops, budget, window), want in [
            ((a, 2, 8, 2), 3.5),                        # 4 steps paid for: the mean of steps 2, 3
            ((a, 2, 9, 2), 3.5),                        # half a step is not a step
            ((a, 2, 16, 2), 1.25), ((b, 1, 5, 3), 5.0),
            ((a, 2, 3, 2), None),                       # 1 step: fewer than the window
            ((a, 2, 18, 2), None),                      # more than the run ever spent
            ((c, flops_c, drawn_budget, drawn_window),
             reference_loss_at(c, flops_c, drawn_budget, drawn_window))]:
        what = f"loss_at_compute({named[id(curve)]}, flops={flops}, budget={budget}, " \
               f"window={window})"
        if want is None:
            check_equal(loss_at_compute(curve, flops, budget, window), None, what)
        else:
            check_close(loss_at_compute(curve, flops, budget, window), want, what)
    pair_window = t.fresh_int(1, 2)                     # both runs read at >= 2 steps
    for (ca, fa, cb, fb, window), want, what in [
            ((a, 2, b, 1, 2), (-1.0, 1.25),
             "a costs 2x: better at equal steps, worse at equal compute"),
            ((b, 1, a, 2, 2), (1.0, -1.25), "the same pair the other way round"),
            ((a, 1, b, 1, 2), (-1.0, -1.0), "equal FLOPs: equal steps is equal compute"),
            ((a, 3, a, 1, 2), (0.0, 5.75), "the same curve at 3x the cost: 2 steps paid for"),
            ((c, flops_c, d, flops_d, pair_window),
             reference_gaps(c, flops_c, d, flops_d, pair_window),
             f"curves drawn anew at {flops_c} and {flops_d} FLOPs a step, window "
             f"{pair_window}")]:
        check_close(compare_at(ca, fa, cb, fb, window), want, f"compare_at: {what}")


# --- exercise 3: a planted claim --------------------------------------------------------------

PLANTED = Claim("bcmt.decode_planted", "a planted paper", "-", "-", "decoding speed over dense",
                1.5, "x dense", "planted", "faster than dense in generation",
                kit=lambda r: labdata.bench_value(r, "bcmt", "decode", "ratio_vs_dense"),
                holds=lambda ratio: ratio > 1.0)      # the reference kit, not yours


def bench(*rows):
    return [{"arch": arch, "variant": "", "phase": phase, "seq_len": n, "ratio_vs_dense": r}
            for arch, phase, n, r in rows]


def judge(t, kit_value, comparable: bool = True) -> str:
    """Where the answers live: verdict(kit_value, the planted claim's test[, comparable])."""
    verdict = t.answer("verdict")
    if comparable:
        return verdict(kit_value, PLANTED.holds)
    return verdict(kit_value, PLANTED.holds, comparable=comparable)


def drawn_records(t) -> list:
    """BCMT decoding and training records at lengths drawn anew, and one of CAT's."""
    lengths = sorted({32 * 2 ** t.fresh_int(0, 5) for _ in range(3)})
    rows = [("bcmt", "decode", n, t.fresh_int(3, 20) / 10) for n in lengths]
    rows += [("bcmt", "train", n, t.fresh_int(3, 20) / 10) for n in lengths]
    rows.append(("cat", "decode", 2 * lengths[-1], t.fresh_int(3, 20) / 10))
    return bench(*rows)


@exercise_check("nb10-cell-14", own_work={
    "kit_decode_speed": (labdata.bench_value, labdata.bench_record),
    "verdict": (lab.claim_row, lab.claims_table)})
def claim_check(t):
    """kit_decode_speed and verdict against lab.claim_row on planted records, records drawn
    anew and this run's result."""
    kit_decode_speed = t.answer("kit_decode_speed")
    t.answer("verdict")                                # read by check_own_work before any call
    results = lab_result(t)
    cases = {"faster only at the longest length": bench(("bcmt", "decode", 64, 0.8),
                                                         ("bcmt", "decode", 128, 1.2)),
             "faster, but below the paper's 1.5x": bench(("bcmt", "decode", 128, 1.3)),
             "fast in training, slow decoding": bench(("bcmt", "train", 128, 2.0),
                                                      ("bcmt", "decode", 128, 0.9)),
             "slower only at the longest length": bench(("bcmt", "decode", 64, 1.4),
                                                        ("bcmt", "decode", 128, 0.7)),
             "not benched": bench(("cat", "decode", 128, 1.1)),
             "timing failed (NaN)": bench(("bcmt", "decode", 128, float("nan"))),
             "records drawn anew": drawn_records(t)}
    for case, records in cases.items():
        made = lab.results_from(bench_records=records)
        want = lab.claim_row("bcmt", PLANTED, made)
        check_equal(t.remote(judge, kit_decode_speed(made)), want["verdict"], case)
    check_equal(t.remote(judge, 2.0, False), "not comparable",
                "a claim marked not comparable stays so")
    check_equal(t.remote(judge, kit_decode_speed(results)),
                lab.claim_row("bcmt", PLANTED, results)["verdict"], "on this run's result")


# --- exercise 4: recall beyond the span -------------------------------------------------------


def row(d, acc, n=100):
    return {"distance": d, "accuracy": acc, "n_answers": n}


def drawn_curve(t) -> tuple[list, int]:
    """A recall curve of 3 to 8 rows at distances drawn anew, and a span among them."""
    gen = t.fresh_generator()
    distances = sorted((torch.randperm(1024, generator=gen)[:t.fresh_int(3, 8)] + 1).tolist())
    accuracies = torch.rand(len(distances), generator=gen, dtype=torch.float64).tolist()
    curve = [row(d, acc, t.fresh_int(1, 500)) for d, acc in zip(distances, accuracies,
                                                                 strict=True)]
    return curve, distances[t.fresh_int(0, len(distances) - 2)]


@exercise_check("nb10-cell-18", own_work={
    "my_recall_beyond": (labdata.recall_beyond, lab.memory_pays),
    "noise_band": (lab.memory_pays,), "memory_pays": (lab.memory_pays,)})
def recall_check(t):
    """my_recall_beyond, noise_band and memory_pays on planted curves and a curve drawn anew,
    then against the lab's own memory-pays rows of this run."""
    my_recall_beyond = t.answer("my_recall_beyond")
    noise_band = t.answer("noise_band")
    memory_pays = t.answer("memory_pays")
    results = lab_result(t)
    curve = [row(4, 0.9), row(8, 0.6, 50), row(16, 0.3, 200), row(32, 0.1, 400)]
    drawn, span = drawn_curve(t)
    beyond = [r for r in drawn if r["distance"] > span]
    planted = [(curve, 8, 0.2, 2 * math.sqrt(0.25 / 600)),
               (curve, 3, 0.475, 2 * math.sqrt(0.25 / 750)),
               (curve, 32, None, None), ([row(5, 0.95, 16)], 0, 0.95, 0.25),
               (drawn, span, labdata.recall_beyond(lab.results_from(recall={"x": {
                   "curves": {"": {"passkey": drawn}}, "local_span": {"": span}}}), "x"),
                recall.noise(sum(r["n_answers"] for r in beyond)))]
    lab_rows = lab.memory_pays(results)
    mine, local, noise = (t.fresh_int(0, 100) / 100 for _ in range(3))
    with unittest.mock.patch.object(labdata, "recall_beyond", not_allowed("recall_beyond")):
        for c, span_, mean, band in planted:
            for got, want, what in ((my_recall_beyond(c, span_), mean, "recall beyond"),
                                    (noise_band(c, span_), band, "noise band")):
                if want is None:
                    check_equal(got, None, f"{what} span={span_}: nothing beyond it")
                else:
                    check_close(got, want, f"{what} span={span_}", atol=1e-12)
        for mine_, local_, noise_, want in ((0.3, 0.1, 0.15, True), (0.3, 0.1, 0.2, False),
                                            (0.3, 0.1, 0.25, False), (None, 0.1, 0.1, False),
                                            (0.5, 0.25, 0.25, False),  # exactly the noise: no
                                            (mine, local, noise, mine - local > noise)):
            check_equal(memory_pays(mine_, local_, noise_), want,
                        f"pays({mine_}, {local_}, {noise_})")
        for r in lab_rows:                       # the mechanism and its twin beyond the span
            label, _, variant = r["entry"].partition(" ")
            record = results["done"][f"recall/{label}"]
            curves = [[row(r["local_span"] + 1, b["mean"], b["n_answers"])]
                      for b in (record["beyond"][variant], record["twin"]["beyond"][variant])]
            combined = math.hypot(*(noise_band(c, r["local_span"]) for c in curves))
            check_close(combined, r["noise"], f"{r['entry']}: your two bands combined (a "
                        "difference of two rates) vs the lab's noise", atol=1e-12)
            check_equal(memory_pays(my_recall_beyond(curves[0], r["local_span"]),
                                    r["local_baseline"], r["noise"]), r["pays"],
                        f"{r['entry']}: pays vs the lab's")


# --- exercise 5: the slot model ---------------------------------------------------------------


@exercise_check("nb10-cell-22", own_work={
    "my_slot_accuracy": (recall.slot_accuracy, recall.slot_curve),
    "my_cat_slots": (cat.memory_slots,)})
def slots_check(t):
    """my_slot_accuracy and my_cat_slots against the slot model and CAT's memory_slots on a
    grid of cases, cases drawn anew, and this run's slot-model rows."""
    my_slot_accuracy = t.answer("my_slot_accuracy")
    my_cat_slots = t.answer("my_cat_slots")
    results = lab_result(t)
    preset_name = t.value("PRESET")
    if preset_name not in PRESETS:
        raise CheckFailed(f"PRESET is {preset_name!r}: expected one of {', '.join(PRESETS)} "
                          "(run the notebook's first cells again)")
    cat_cfg = lab.plan_entries(preset_name, archs=["cat"])[-1].cfg

    def cat_slots(n_pairs, c):
        return cat.memory_slots(dataclasses.replace(cat_cfg, chunk_sizes=(), chunk_size=c),
                                n_pairs)

    drawn = [(t.fresh_int(9, 64), t.fresh_int(0, 80), t.fresh_int(1, 50) / 100,
              t.fresh_int(1, 40)) for _ in range(3)]
    with unittest.mock.patch.object(recall, "slot_accuracy", not_allowed("slot_accuracy")):
        for n_pairs in range(1, 9):
            for slots in range(0, 10):
                check_close(my_slot_accuracy(n_pairs, slots, 0.03),
                            min(slots, n_pairs) / n_pairs if slots else 0.03,
                            f"slot accuracy with {n_pairs} pairs in {slots} slots", atol=1e-12)
            for c in (1, 2, 3, 4, 8, 16):
                check_equal(my_cat_slots(n_pairs, c), cat_slots(n_pairs, c),
                            f"CAT's slots with {n_pairs} pairs at C={c}")
        for n_pairs, slots, chance, c in drawn:             # drawn anew
            check_close(my_slot_accuracy(n_pairs, slots, chance),
                        min(slots, n_pairs) / n_pairs if slots else chance,
                        f"slot accuracy with {n_pairs} pairs in {slots} slots, chance {chance}",
                        atol=1e-12)
            check_equal(my_cat_slots(n_pairs, c), cat_slots(n_pairs, c),
                        f"CAT's slots with {n_pairs} pairs at C={c}")
    for key, record in results["done"].items():   # the lab's own slot model, row by row:
        for variant, curve in (record.get("slot_model") or {}).items():   # repeats counted,
            for point in curve or []:                  # so never below all-different values
                mine = my_slot_accuracy(point["n_pairs"], point["slots"],
                                        record["chance"]["mqar"])
                check_true(mine <= point["accuracy"] + 1e-12,
                           f"{key} {variant} with {point['n_pairs']} pairs: yours {mine:.4f} "
                           f"lies above the lab's line {point['accuracy']:.4f}, which counts "
                           "repeated values too")
