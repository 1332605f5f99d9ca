"""Planted wrong answers for notebooks/solutions/10_shootout.ipynb.

MUTANTS: check cell id -> [(description, original text in the solution region, replacement)].
tests/test_mutants.py substitutes each one and proves the check cell rejects it.
"""

MUTANTS = {
    "cell-5": [  # my_pareto_front
        ("non-strict domination: identical points knock each other out",
         "x2 >= x and y2 <= y and (x2 > x or y2 < y)", "x2 >= x and y2 <= y"),
        ("loss compared the wrong way round (higher loss counted better)",
         "x2 >= x and y2 <= y and (x2 > x or y2 < y)", "x2 >= x and y2 >= y and (x2 > x or y2 > y)"),
        ("strict on both axes: ties on one axis never dominate",
         "x2 >= x and y2 <= y and (x2 > x or y2 < y)", "x2 > x and y2 < y"),
        ("returns the dominated points",
         "if not any(x2 >= x", "if any(x2 >= x"),
        ("speed treated as a cost (slower counted better)",
         "x2 >= x and y2 <= y and (x2 > x or y2 < y)", "x2 <= x and y2 <= y and (x2 < x or y2 < y)"),
        ("calls the kit's pareto_front",
         "    return front", "    return lab_figures.pareto_front(points)"),
    ],
    "cell-9": [  # loss_at_compute + compare_at
        ("a half-paid step counted (ceil instead of floor)",
         "steps = int(budget // flops_per_step)", "steps = math.ceil(budget / flops_per_step)"),
        ("the window ends one step late",
         "curve[steps - window:steps]", "curve[steps - window + 1:steps + 1]"),
        ("one noisy step instead of the window's mean",
         "return sum(curve[steps - window:steps]) / window", "return curve[steps - 1]"),
        ("a budget beyond the run not refused",
         " or steps > len(curve)", ""),
        ("fewer steps than the window not refused",
         "steps < window or ", ""),
        ("the gap at equal steps the wrong way round (b - a)",
         "return end_a - end_b, at_compute", "return end_b - end_a, at_compute"),
        ("equal compute at the budget only one run reached (max instead of min)",
         "budget = min(", "budget = max("),
        ("a's curve read at b's cost per step",
         "loss_at_compute(curve_a, flops_a, budget, window)",
         "loss_at_compute(curve_a, flops_b, budget, window)"),
        ("equal compute read at each run's own end (FLOPs ignored)",
         "at_compute = (loss_at_compute(curve_a, flops_a, budget, window)\n"
         "                  - loss_at_compute(curve_b, flops_b, budget, window))",
         "at_compute = end_a - end_b"),
    ],
    "cell-14": [  # kit_decode_speed + verdict
        ("reads the training speed instead of decoding",
         'r["phase"] == "decode"', 'r["phase"] == "train"'),
        ("reads another mechanism's record",
         'r["arch"] == "bcmt"', 'r["arch"] == "cat"'),
        ("the shortest benched length instead of the longest",
         "max(records, key=", "min(records, key="),
        ("the first record instead of the longest length",
         'max(records, key=lambda r: r["seq_len"])', "records[0]"),
        ("no record not handled",
         "    if not records:\n        return None\n", ""),
        ("calls the kit's labdata.bench_value",
         'return max(records, key=lambda r: r["seq_len"])["ratio_vs_dense"]',
         'return labdata.bench_value(results, "bcmt", "decode", "ratio_vs_dense")'),
        ("NaN not treated as nothing to judge",
         " or math.isnan(kit_value)", ""),
        ("the comparable flag ignored",
         "if not comparable or kit_value is None", "if kit_value is None"),
        ("judged against the paper's 1.5x instead of the claim's own test",
         '"reproduced" if holds(kit_value)', '"reproduced" if kit_value >= 1.5'),
    ],
    "cell-18": [  # my_recall_beyond + noise_band + memory_pays
        ("recall beyond: >= span includes the span itself",
         'rows = [r["accuracy"] for r in curve if r["distance"] > span]',
         'rows = [r["accuracy"] for r in curve if r["distance"] >= span]'),
        ("recall beyond weighted by n_answers, not a plain mean",
         "return sum(rows) / len(rows) if rows else None",
         'return sum(r["accuracy"] * r["n_answers"] for r in curve if r["distance"] > span) / '
         'sum(r["n_answers"] for r in curve if r["distance"] > span) if rows else None'),
        ("noise band: n counts rows, not answers",
         'n = sum(r["n_answers"] for r in curve if r["distance"] > span)',
         'n = sum(1 for r in curve if r["distance"] > span)'),
        ("noise band: the factor 2 forgotten",
         "return 2 * math.sqrt(0.25 / n) if n else None",
         "return math.sqrt(0.25 / n) if n else None"),
        ("memory pays: >= instead of a strict margin",
         "mine - local > noise", "mine - local >= noise"),
        ("recall beyond: calls the kit's labdata.recall_beyond",
         "return sum(rows) / len(rows) if rows else None",
         'return labdata.recall_beyond(lab.results_from(recall={"x": {"curves": {"": {"passkey": '
         'curve}}, "local_span": {"": span}}}), "x")'),
        ("memory pays: None not handled",
         "None not in (mine, local, noise) and mine - local > noise", "mine - local > noise"),
    ],
}
MUTANTS["cell-22"] = [  # my_slot_accuracy + my_cat_slots
    ("one guess in the fullest slot for every query", "return min(slots, n_pairs) / n_pairs",
     "return 1.0 / math.ceil(n_pairs / slots)"),
    ("more slots than pairs counted as more than all right", "min(slots, n_pairs) / n_pairs",
     "slots / n_pairs"),
    ("no slot answers 0, not chance", "        return chance", "        return 0.0"),
    ("one token a pair", "math.ceil(2 * n_pairs / chunk_size)", "math.ceil(n_pairs / chunk_size)"),
    ("a half-filled chunk not counted", "math.ceil(2 * n_pairs / chunk_size)",
     "max(1, 2 * n_pairs // chunk_size)"),
    ("calls the kit's slot_accuracy", "return min(slots, n_pairs) / n_pairs",
     "return recall.slot_accuracy(n_pairs, slots, chance)"),
]

_REDEFINE = "return None\n\n\n"          # ends the original body; what follows is top level
CHEATS = {
    "cell-5": [  # my_pareto_front: routes around the check's mock.patch of the module name
        ("the kit's pareto_front kept in a default argument before the check patches it",
         "    return front",
         "    return front\n\n\n"
         "def my_pareto_front(points, _kit=lab_figures.pareto_front):\n    return _kit(points)"),
        ("the kit's pareto_front copied with types.FunctionType",
         "    return front",
         "    return front\n\n\nimport types\n_copy = types.FunctionType("
         "lab_figures.pareto_front.__code__, lab_figures.pareto_front.__globals__)\n\n\n"
         "def my_pareto_front(points):\n    return _copy(points)"),
        ("the check's expected answer read from its calling frame",
         "    return front",
         "    return front\n\n\nimport sys\n\n\ndef my_pareto_front(points):\n"
         "    check = sys._getframe(1)\n"
         "    return check.f_globals['expected'][check.f_globals['case']]"),
        ("the check's expected answer read from the notebook's globals",
         "    return front",
         "    return front\n\n\ndef my_pareto_front(points):\n"
         "    return globals()['expected'][globals()['case']]"),
    ],
}
