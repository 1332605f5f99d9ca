"""Reading a lab result (``labdata``, and ``lab.report``'s text tables): a small hand-made
result read into notebook 10's tables, every number checked against the records it comes
from, and a partial result read without an error."""

from blockmem_lite import lab

ISO = "dense iso-FLOP (moc)"


def _bench(arch, variant, phase, seq_len, ratio, flops=None):
    return {"arch": arch, "variant": variant, "phase": phase, "seq_len": seq_len,
            "ratio_vs_dense": ratio, "flops_per_token": flops}


def _curve(*points):
    return [{"distance": d, "accuracy": a, "n_answers": 10} for d, a in points]


RESULTS = {
    "meta": {"plan": ["lm/dense", "lm/cat", f"lm/{ISO}", "recall/cat", "facts/moc", "bench/*"]},
    "done": {
        "lm/dense": {"arch": "dense", "val_loss": {"": 3.0}},
        "lm/cat": {"arch": "cat", "val_loss": {"C=4": 2.9, "C=8": 3.1}},
        f"lm/{ISO}": {"arch": "dense", "val_loss": {"": 3.2}, "starts_from_trained": True},
        "recall/cat": {"local_span": {"C=4": 4, "C=8": 8}, "curves": {
            "C=4": {"passkey": _curve((2, 1.0), (10, 0.5), (20, 0.25)),
                    "mqar": _curve((2, 1.0), (10, 0.1), (20, 0.3))},
            "C=8": {"passkey": _curve((2, 1.0), (10, 0.75), (20, 0.25)),
                    "mqar": _curve((2, 1.0), (10, 0.2), (20, 0.2))}}},
        "bench/*": {
            "records": [_bench("dense", "", "train", 32, None, 100.0),
                        _bench("dense", "", "train", 64, None, 110.0),
                        _bench("cat", "C=4", "train", 32, 2.0, 80.0),
                        _bench("cat", "C=4", "train", 64, 0.8, 90.0),     # the longest: read
                        _bench("cat", "C=4", "decode", 64, 1.5),
                        _bench("dense", "iso-FLOP (moc)", "train", 64, 0.95, 120.0)],
            "state": {"dense": {"t": [32, 64], "measured": [1024, 2048],
                                "analytic": [1024, 2000]},
                      "cat C=4": {"t": [32, 64], "measured": [512, 512],
                                  "analytic": [None, None]}}},
    },
}


def test_trained_models_lists_every_variant_and_the_baselines_bench_variant():
    assert lab.trained_models(RESULTS) == [
        ("dense", "dense", "dense", "", ""),
        ("cat C=4", "cat", "cat", "C=4", "C=4"),
        ("cat C=8", "cat", "cat", "C=8", "C=8"),
        (ISO, "dense", ISO, "", "iso-FLOP (moc)")]


def test_the_model_table_reads_each_column_from_its_record():
    table = lab.model_table(RESULTS)
    assert list(table) == ["dense", "cat C=4", "cat C=8", ISO]
    assert all(list(row) == list(lab.MODEL_COLUMNS) for row in table.values())
    dense, cat4, cat8, iso = (table[n] for n in table)
    assert dense["val loss"] == 3.0 and cat4["val loss"] == 2.9 and cat8["val loss"] == 3.1
    assert dense["train x"] == 1.0 and dense["decode x"] is None     # dense is its own unit
    assert cat4["train x"] == 0.8 and cat4["decode x"] == 1.5        # the longest length
    assert cat4["FLOPs/tok"] == 90.0 and dense["FLOPs/tok"] == 110.0
    assert cat8["train x"] is None and cat8["FLOPs/tok"] is None     # not benched
    assert iso["train x"] == 0.95 and iso["FLOPs/tok"] == 120.0      # its own bench variant
    assert dense["state KiB"] == 2.0 and dense["growth"] == 2.0
    assert cat4["state KiB"] == 0.5 and cat4["growth"] == 1.0
    assert cat8["state KiB"] is None and cat8["growth"] is None
    assert cat4["passkey"] == 0.375 and cat4["mqar"] == 0.2          # beyond the span of 4
    assert cat8["passkey"] == 0.5 and cat8["mqar"] == 0.2            # beyond the span of 8
    assert dense["passkey"] is None                                   # no recall task stored
    assert iso["pretrained"] and not dense["pretrained"]
    text = lab.format_model_table(table)
    assert text.splitlines()[0].split()[:3] == ["model", "val", "loss"]
    cat8_line = next(line for line in text.splitlines() if line.startswith("cat C=8"))
    assert cat8_line.split()[2:5] == ["3.1000", "-", "-"] and cat8_line.endswith("no")


def test_speed_vs_dense_is_none_where_nothing_was_benched():
    assert lab.speed_vs_dense(RESULTS, "cat", "train", "C=4") == 0.8
    assert lab.speed_vs_dense(RESULTS, "cat", "train", "C=8") is None
    assert lab.speed_vs_dense(RESULTS, "dense", "decode") is None


def test_the_state_table_sets_measured_beside_analytic():
    states = lab.state_table(RESULTS)
    assert states["dense"]["gap"] == (2048 - 2000) / 2000 and states["dense"]["growth"] == 2.0
    assert states["cat C=4"]["gap"] is None and states["cat C=4"]["growth"] == 1.0
    assert states["dense"]["t"] == [32, 64] and states["dense"]["measured"] == [1024, 2048]
    text = lab.format_state_table(states)
    assert "t=32 KiB" in text and "t=64 KiB" in text
    dense_line = next(line for line in text.splitlines() if line.startswith("dense"))
    assert dense_line.split()[1:] == ["1.0", "2.0", "2.00", "2.4%"]


def test_missing_tasks_are_the_plans_unstored_ones_in_order():
    assert lab.missing_tasks(RESULTS) == ["facts/moc"]
    assert lab.missing_tasks({"meta": {"plan": ["lm/dense", "bench/*"]}, "done": {}}) \
        == ["lm/dense", "bench/*"]


def test_a_partial_result_reads_as_empty_tables():
    partial = {"meta": {"plan": ["lm/dense"]}, "done": {}}
    assert lab.trained_models(partial) == [] and lab.model_table(partial) == {}
    assert lab.state_table(partial) == {}
    assert lab.format_state_table({}) == "no state measured in this run"
    assert lab.format_memory_pays([]) == "no recall measured in this run"
    assert lab.format_knowledge([]) == "no facts task in this run"


def test_the_memory_pays_and_facts_tables_print_their_rows():
    row = {"entry": "bcmt", "local_span": 8, "recall_beyond": 0.61, "band": [0.5, 0.7],
           "local_baseline": 0.12, "twin_blind": True, "dense": 0.9, "noise": 0.123,
           "pays": True, "holds": 2, "slot_model": 0.5, "shortfall": "capacity"}
    line = lab.format_memory_pays([row]).splitlines()[-1]
    assert line.split() == ["bcmt", "8", "0.610", "0.50-0.70", "0.120", "yes", "0.900",
                            "0.123", "yes", "2", "pairs", "0.50", "capacity"]
    fact = {"entry": "moc", "baseline": ISO, "n_facts": 8, "recalled": 0.75, "dense": 0.25,
            "floor": 0.0, "noise": 0.3, "pays": True}
    line = lab.format_knowledge([fact]).splitlines()[-1]
    assert line.startswith("moc") and line.split()[-6:] == ["8", "0.75", "0.25", "0.00", "0.30",
                                                             "yes"]
