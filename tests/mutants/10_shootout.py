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
    ],
    "cell-9": [  # cat_state_bytes
        ("finished chunks rounded down instead of up",
         "chunks = math.ceil(t / chunk_size)", "chunks = t // chunk_size"),
        ("the decoder width forgotten",
         "* d_model * decoder_width", "* d_model"),
        ("keys only, the values forgotten",
         "return 4 * n_layer * 2 *", "return 4 * n_layer *"),
        ("the C slots of the open chunk forgotten",
         "(chunks + chunk_size)", "chunks"),
        ("numbers instead of bytes",
         "return 4 * n_layer * 2 *", "return n_layer * 2 *"),
    ],
    "cell-14": [  # kit_decode_speed + verdict
        ("reads the training speed instead of decoding",
         '"bcmt", "decode", "ratio_vs_dense"', '"bcmt", "train", "ratio_vs_dense"'),
        ("reads another mechanism's record",
         'labdata.bench_value(results, "bcmt",', 'labdata.bench_value(results, "cat",'),
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
        ("memory pays: None not handled",
         "None not in (mine, local, noise) and mine - local > noise", "mine - local > noise"),
    ],
}
