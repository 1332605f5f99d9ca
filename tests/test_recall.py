"""The recall experiment (``recall``): its rows, the beyond-span form, each twin's blindness,
and the bands and verdicts built from several seeds."""

import dataclasses
import json
import shutil

import pytest
import torch

from blockmem_lite import lab, recall, registry, tasks
from blockmem_lite.config import preset
from blockmem_lite.lab import parts as lab_parts
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import seed_everything
from blockmem_lite.train import Callback

CLASS = recall.RECALL_SIZES["class"]
TINY = recall.RECALL_SIZES["tiny"]
LOCAL = [name for name in registry.names() if registry.lab_spec(name).twin]


def _recall_model(arch: str, recipe=TINY, twin: bool = False):
    """A fresh model of ``arch`` at the recipe's sizes and span (its twin with ``twin``)."""
    spec = registry.lab_spec(arch)
    run = preset("tiny", arch=arch)
    cfg = recipe.model_config(spec.config(run.model) if spec.config else run.model)
    seed_everything(0)
    model = build_model(spec.twin(cfg) if twin else cfg)
    for module in model.modules():   # BCMT's W_p and ARMT's W_V start at 0 (= the backbone):
        for name in ("memory_proj", "w_v"):                                  # wake the memory
            if isinstance(getattr(module, name, None), torch.nn.Linear):
                torch.nn.init.normal_(getattr(module, name).weight, std=0.2)
    return model


# --- rows ----------------------------------------------------------------------------------------
def test_every_beyond_span_answer_lies_a_whole_span_or_more_away():
    for recipe in recall.RECALL_SIZES.values():
        batch = recall.beyond_rows(recipe, rows=8)
        span, start = recipe.span, recipe.queries_from
        assert start % span == 0 and start >= 2 * span
        positions, distances = batch.meta["answer_positions"], batch.meta["distances"]
        sources = positions - distances
        assert positions.min() >= start and sources.max() < span           # pairs in span 0
        assert torch.all(positions // span - sources // span >= 2)         # a span between
        assert torch.all(distances > span)
        for pairs in range(1, recipe.n_pairs + 1):                         # capacity rows
            rows = recall.beyond_rows(recipe, rows=2, n_pairs=pairs)
            assert rows.meta["n_pairs"] == pairs and rows.meta["queries_from"] == start


def test_training_starts_on_per_span_rows_then_mixes():
    rows = recall.training_rows(CLASS)
    assert len(rows) == CLASS.steps * CLASS.batch_size
    first = round(CLASS.local_first * len(rows))
    assert {rows.row(i).meta["task"] for i in range(0, first, 97)} == {"mqar_per_span"}
    later = {rows.row(i).meta["task"] for i in range(first + 1, first + 64)}
    assert later == {"mqar", "mqar_per_span", "passkey"}


def test_training_rows_mix_the_kinds_and_pair_counts_by_seed_and_are_fresh():
    mixed = dataclasses.replace(CLASS, local_first=0.0)
    rows = recall.training_rows(mixed)
    metas = [rows.row(i).meta for i in range(64)]
    kinds = [m["task"] if m["task"] != "mqar" else
             "beyond" if m["queries_from"] else "anywhere" for m in metas]
    assert [kinds.count(k) for k in ("anywhere", "mqar_per_span", "beyond", "passkey")] \
        == [16, 16, 16, 16]
    assert {m["n_pairs"] for m in metas if m["task"] == "mqar"} == set(range(1, 5))
    assert all(m["queries_from"] == CLASS.queries_from for m, k in zip(metas, kinds, strict=True)
               if k == "beyond")
    again = recall.training_rows(mixed)                                     # from the seeds
    assert torch.equal(again[5][0], rows[5][0]) and not torch.equal(rows[4][0], rows[8][0])
    inputs = torch.stack([rows[i][0] for i in range(64) if kinds[i] != "passkey"])
    assert len({tuple(x.tolist()) for x in inputs}) == len(inputs)          # no repeats
    held_out = recall.beyond_rows(CLASS).inputs
    assert not (inputs[:, None] == held_out[None]).all(-1).any()           # never held out


def test_per_span_rows_keep_every_pair_and_its_queries_inside_one_span():
    rows = recall.training_rows(CLASS)
    for i in (1, 5, 9, 13):
        batch = rows.row(i)
        assert batch.meta["task"] == "mqar_per_span"
        positions, distances = batch.meta["answer_positions"][0], batch.meta["distances"][0]
        assert torch.equal(positions // CLASS.span, (positions - distances) // CLASS.span)
        x = batch.inputs[0]
        for pos, answer in zip(positions.tolist(), batch.answers()[0].tolist(), strict=True):
            start = pos // CLASS.span * CLASS.span
            pairs = {x[start + 2 * j].item(): x[start + 2 * j + 1].item()
                     for j in range(batch.meta["n_pairs"])}
            assert pairs[x[pos].item()] == answer


def test_recipe_errors_name_the_field():
    with pytest.raises(ValueError, match="span=4 is not allowed with n_pairs=4"):
        recall.RecallRecipe(span=4)
    with pytest.raises(ValueError, match="seq_len=32 is not allowed with span=16.*>= 40"):
        recall.RecallRecipe(seq_len=32)
    with pytest.raises(ValueError, match="span=24 is not allowed with seq_len=64"):
        recall.RecallRecipe(span=24)


def test_every_mechanism_is_set_to_the_recipe_span():
    for arch in LOCAL + ["honly"]:
        spec = registry.lab_spec(arch)
        run = preset("class", arch=arch)
        cfg = CLASS.model_config(spec.config(run.model) if spec.config else run.model)
        assert (cfg.d_model, cfg.seq_len, cfg.vocab_size) == (64, 64, 68)
        assert spec.local_span(cfg) == CLASS.span, arch


# --- twins -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", LOCAL)
def test_the_twin_is_blind_beyond_its_span_and_the_mechanism_is_not(arch):
    """check_causal in space: replacing every token of the earlier spans leaves the twin's
    answer logits where they were, and moves the mechanism's."""
    assert recall.blindness(_recall_model(arch, twin=True), TINY) < lab.BLIND_ATOL
    assert recall.blindness(_recall_model(arch), TINY) > 100 * lab.BLIND_ATOL


def test_the_twin_probe_has_teeth_against_a_model_that_sees_everything():
    assert recall.blindness(_recall_model("dense"), TINY) > 100 * lab.BLIND_ATOL


def test_the_cat_twin_still_reads_its_own_chunk():
    model = _recall_model("cat", twin=True)
    batch = recall.beyond_rows(TINY, rows=4)
    changed = batch.inputs.clone()
    last = TINY.seq_len - 2                          # a token of the last chunk, not its end
    changed[:, last - 1] = (changed[:, last - 1] + 1) % tasks.content_vocab(TINY.vocab_size)
    model.eval()
    with torch.no_grad():
        moved = (model(changed).logits - model(batch.inputs).logits)[:, last].abs().max()
    assert moved > 1e-3


def test_the_live_monitor_draws_beyond_span_accuracy_against_the_step(tmp_path, capsys):
    from blockmem_lite.lab import figures as lab_figures

    shown = []
    run = lab.Lab("tiny", tmp_path, archs=["dense"], progress=False,
                  recall_live=lambda name, recipe: shown.append(name) or
                  lab_figures.recall_monitor(name, recipe, every=5, mode="text"))
    run._recall("dense")
    assert shown == ["dense seed 0"]
    lines = [line for line in capsys.readouterr().out.splitlines() if "beyond-span" in line]
    assert lines and lines[-1].startswith("[recall: dense seed 0] step 20/20: beyond-span")
    monitor = lab_figures.recall_monitor("x", TINY, every=5, mode="text")
    monitor.record(0, 0.25)
    monitor.record(5, 0.5)
    figure = monitor._figure_fn(monitor.snapshots)
    assert list(figure.data[0].x) == [0, 5] and list(figure.data[0].y) == [0.25, 0.5]
    with pytest.raises(ValueError, match="recall_live=3 is not allowed"):
        lab.Lab("tiny", tmp_path, progress=False, recall_live=3)


# --- bands and verdicts ----------------------------------------------------------------------------
def _measured(accuracy: float, blind: float = 0.0, n: int = 100) -> dict:
    curve = [{"distance": 20, "accuracy": accuracy, "n_answers": n}]
    capacity = [{"n_pairs": 1, "accuracy": 1.0, "n_answers": n},
                {"n_pairs": 2, "accuracy": accuracy, "n_answers": n}]
    length = [{"factor": 1, "seq_len": 64, "accuracy": accuracy, "n_answers": n},
              {"factor": 4, "seq_len": 256, "accuracy": None, "n_answers": n}]
    return {"": {"curves": {"mqar": curve, "passkey": curve}, "capacity": capacity,
                 "length": length, "beyond": {"accuracy": accuracy, "n_answers": n},
                 "blindness": blind}}


def test_combine_gives_the_mean_and_the_band_of_the_seeds():
    record = recall.combine([_measured(0.9), _measured(0.6), _measured(0.75, blind=2e-5)])
    beyond = record["beyond"][""]
    assert beyond["mean"] == pytest.approx(0.75) and (beyond["lo"], beyond["hi"]) == (0.6, 0.9)
    assert beyond["n_answers"] == 300 and beyond["n"] == 3
    point = record["curves"][""]["mqar"][0]
    assert point["accuracy"] == pytest.approx(0.75) and point["n_answers"] == 300
    assert record["blindness"][""] == 2e-5
    assert [p["n_pairs"] for p in record["capacity"][""]] == [1, 2]
    assert record["capacity"][""][1]["lo"] == 0.6
    assert recall.holds(record["capacity"][""]) == 1
    assert recall.holds([{"n_pairs": 1, "accuracy": 0.5}]) == 0
    first, refused = record["length"][""]
    assert first["accuracy"] == pytest.approx(0.75) and first["seq_len"] == 64
    assert refused["accuracy"] is None and refused["factor"] == 4


def test_longer_rows_keep_the_pairs_first_and_the_queries_last():
    for factor in recall.LENGTH_FACTORS:
        batch = recall.longer_rows(TINY, factor, rows=4)
        length = factor * TINY.seq_len
        positions = batch.meta["answer_positions"]
        assert batch.seq_len == length
        assert positions.min() >= length - (TINY.seq_len - TINY.queries_from)
        assert (positions - batch.meta["distances"]).max() < 2 * TINY.n_pairs


def test_the_length_curve_says_none_where_a_model_refuses_the_length():
    cat = recall.length_curve(_recall_model("cat"), TINY, factors=(1, 2))
    assert cat[0]["accuracy"] is not None and cat[1]["accuracy"] is None
    armt = recall.length_curve(_recall_model("armt"), TINY, factors=(1, 2))
    assert all(0 <= p["accuracy"] <= 1 for p in armt)


def _results(mechanism: float, twin: float, blind: float = 0.0) -> dict:
    record = {"arch": "bcmt", "local_span": {"": 16}, "chance": {"mqar": 1 / 32},
              **recall.combine([_measured(mechanism)])}
    record["twin"] = recall.combine([_measured(twin, blind)])
    dense = {"arch": "dense", "local_span": {"": None}, **recall.combine([_measured(0.99)])}
    return {"done": {"recall/bcmt": record, "recall/dense": dense}}


def test_memory_pays_only_beyond_the_noise_and_says_whether_the_twin_was_blind():
    row, = lab.memory_pays(_results(0.95, 0.04))
    assert row["pays"] and row["twin_blind"] and row["dense"] == 0.99
    assert row["noise"] == pytest.approx(2 * (0.25 / 100 + 0.25 / 100) ** 0.5)
    row, = lab.memory_pays(_results(0.10, 0.04))                    # inside the noise
    assert not row["pays"]
    row, = lab.memory_pays(_results(0.95, 0.04, blind=0.3))         # a twin that sees
    assert not row["twin_blind"]
    report = lab.report_markdown({"meta": {"preset": "x", "machine": "m", "device": "cpu",
                                           "torch": "t", "corpus": "c", "corpus_source": "s",
                                           "sizes": {"steps": 1}, "seed": 0},
                                  "done": {}, "memory_pays": [row]})
    assert "| bcmt | 16 | 0.95 (0.95-0.95) | 0.04 (0.04-0.04) | no (0.3) |" in report
    assert "| 1:1.00 2:0.95 | 2 | - | - | 1x:0.95 4x:- |" in report


def test_the_slot_model_gives_one_over_the_pairs_sharing_a_slot():
    assert recall.slot_accuracy(1, 1, 0.03) == 1.0
    assert recall.slot_accuracy(4, 1, 0.03) == 0.25         # one bag of four values
    assert recall.slot_accuracy(4, 2, 0.03) == 0.5
    assert recall.slot_accuracy(3, 2, 0.03) == 2 / 3        # one right answer per slot
    assert recall.slot_accuracy(4, 8, 0.03) == 1.0
    assert recall.slot_accuracy(4, 0, 0.03) == 0.03         # no memory: chance


def test_the_top_count_of_a_bag_is_exact_where_it_can_be_counted():
    assert recall.expected_top_count(1, 32) == 1.0
    assert recall.expected_top_count(2, 32) == pytest.approx(1 + 1 / 32, abs=1e-12)
    assert recall.expected_top_count(3, 1) == pytest.approx(3.0)         # one value, 3 times
    # three draws of three values: 6 of 27 all differ, 3 of 27 all alike, the rest a pair
    assert recall.expected_top_count(3, 3) == pytest.approx((6 + 18 * 2 + 3 * 3) / 27)
    with pytest.raises(ValueError, match="n_values=0"):
        recall.expected_top_count(4, 0)


def _bag_answers_on_mqar_rows(n_pairs: int, slots: int, rows: int = 20_000) -> float:
    """A memory that keeps only the bags of MQAR's values (the pairs spread evenly over
    ``slots``) and answers a query with its slot's most frequent value."""
    batch = tasks.mqar(rows, 64, n_pairs, vocab_size=68, seed=5)
    values = batch.inputs[:, 1:2 * n_pairs:2]                                   # (N, P)
    used = min(slots, n_pairs)
    slot_of = torch.arange(n_pairs) * used // n_pairs                           # even split
    right = 0.0
    for s in range(used):
        bag = values[:, slot_of == s]                                           # (N, k)
        right += (bag[:, :, None] == bag[:, None, :]).sum(-1).max(-1).values.float().sum()
    return (right / (rows * n_pairs)).item()


@pytest.mark.parametrize("n_pairs, slots", [(4, 1), (6, 1), (4, 2), (5, 2), (6, 4)])
def test_the_slot_model_counts_repeated_values_like_the_bag_does(n_pairs, slots):
    n_values = tasks.mqar_value_count(68)
    line = recall.slot_accuracy(n_pairs, slots, 0.03, n_values)
    assert line == pytest.approx(_bag_answers_on_mqar_rows(n_pairs, slots), abs=0.01)
    if n_pairs > slots:                          # repeats lift the line over one per slot
        assert line > recall.slot_accuracy(n_pairs, slots, 0.03) + 0.01


def test_the_lab_draws_the_slot_model_with_repeats():
    recipe = recall.RECALL_SIZES["class"]
    cfg = dataclasses.replace(preset("tiny", arch="bcmt").model, vocab_size=recipe.vocab_size)
    curve = recall.slot_curve(cfg, recipe)
    n_values = tasks.mqar_value_count(recipe.vocab_size)
    assert [p["accuracy"] for p in curve] == [
        recall.expected_top_count(p["n_pairs"], n_values) / p["n_pairs"] for p in curve]


def _slots(arch: str, n_pairs: int, twin: bool = False, **overrides) -> int:
    spec = registry.lab_spec(arch)
    run = preset("tiny", arch=arch)
    cfg = CLASS.model_config(spec.config(run.model) if spec.config else run.model)
    cfg = dataclasses.replace(spec.twin(cfg) if twin else cfg, **overrides)
    return spec.memory_slots(cfg, n_pairs)


def test_each_memory_declares_its_slots_and_every_twin_has_none():
    assert _slots("bcmt", 4) == 1 and _slots("honly", 4) == 0
    assert _slots("cat", 4, chunk_size=4) == 2 and _slots("cat", 4, chunk_size=16) == 1
    assert _slots("cat", 1, chunk_size=4) == 1
    assert _slots("armt", 4, n_mem_tokens=8) == 8 and _slots("armt", 4, n_mem_tokens=2) == 2
    assert _slots("armt", 4, n_mem_tokens=16, d_mem=1) == 6     # K = 2 nu d_mem keys apart
    assert all(_slots(arch, 4, twin=True) == 0 for arch in LOCAL)


def _with_slot_model(results: dict, predicted: float) -> dict:
    record = results["done"]["recall/bcmt"]
    record["slot_model"] = {"": [{"n_pairs": 1, "slots": 1, "accuracy": 1.0},
                                 {"n_pairs": 2, "slots": 1, "accuracy": predicted}]}
    return results


def test_a_shortfall_is_capacity_only_where_the_slot_model_falls_short_too():
    row, = lab.memory_pays(_with_slot_model(_results(0.50, 0.04), 0.5))
    assert row["slot_model"] == 0.5 and row["shortfall"] == "capacity"
    row, = lab.memory_pays(_with_slot_model(_results(0.50, 0.04), 1.0))
    assert row["shortfall"] == "training"                   # room for the pairs, not learned
    row, = lab.memory_pays(_with_slot_model(_results(0.20, 0.04), 0.5))
    assert row["shortfall"] == "training"                   # under its own capacity
    row, = lab.memory_pays(_with_slot_model(_results(0.95, 0.04), 0.5))
    assert row["shortfall"] is None
    row, = lab.memory_pays(_results(0.50, 0.04))
    assert row["slot_model"] is None and row["shortfall"] is None


def _bcmt_row(folder) -> dict:
    """BCMT's memory-pays row from a lab run of its recall task alone (twin included)."""
    run = lab.Lab("tiny", folder, archs=["bcmt"], progress=False)
    row, = lab.memory_pays({"done": {"recall/bcmt": run._recall("bcmt")}})
    return row


def test_a_mechanism_with_its_memory_disconnected_does_not_pay(tmp_path, monkeypatch):
    """A planted bug: BCMT's memory path cut (its block memory forced to zero) trains to its
    twin's beyond-span accuracy, and the table says "no". The recipe (one pair, 250 steps)
    is one BCMT learns beyond its span; the test proves that first, so it has teeth."""
    recipe = dataclasses.replace(CLASS, n_pairs=1, steps=250, seeds=(0,), eval_rows=64,
                                 local_first=0.0)
    monkeypatch.setitem(recall.RECALL_SIZES, "tiny", recipe)
    healthy = _bcmt_row(tmp_path / "healthy")
    assert healthy["pays"] and healthy["recall_beyond"] > 0.8 and healthy["twin_blind"], healthy

    from blockmem_lite.models import bcmt
    real = bcmt.BCMTLayer.block_memory
    monkeypatch.setattr(bcmt.BCMTLayer, "block_memory",
                        lambda self, *a, **k: real(self, *a, **k) * 0.0)
    # The twin (HOnly) has no block memory, so the bug cannot touch it: keep its stored part
    # and retrain only BCMT itself.
    shutil.copytree(tmp_path / "healthy", tmp_path / "broken")
    stored = tmp_path / "broken" / lab.RESULTS_NAME
    results = json.loads(stored.read_text())
    results["parts"] = {k: v for k, v in results["parts"].items() if "/twin/" in k}
    assert len(results["parts"]) == 1, sorted(results["parts"])
    stored.write_text(json.dumps(results))
    broken = _bcmt_row(tmp_path / "broken")
    assert not broken["pays"] and broken["recall_beyond"] < 0.3, broken


def test_the_twin_trains_at_its_own_seeds_and_the_mechanism_at_all(tmp_path, monkeypatch):
    """A twin is blind by proof (its accuracy beyond the span is chance whatever its seed),
    so the class recipe trains it once; the mechanism keeps every seed for its band."""
    assert CLASS.seeds_of("model") == (0, 1, 2) and CLASS.seeds_of("twin") == (0,)
    recipe = dataclasses.replace(TINY, seeds=(0, 1), twin_seeds=(1,))
    monkeypatch.setitem(recall.RECALL_SIZES, "tiny", recipe)
    run = lab.Lab("tiny", tmp_path, archs=["bcmt"], progress=False)
    record = run._recall("bcmt")
    assert sorted(run.results["parts"]) == ["bcmt/model/0", "bcmt/model/1", "bcmt/twin/1"]
    assert record["beyond"][""]["n"] == 2 and record["twin"]["beyond"][""]["n"] == 1


# --- the segment curriculum ----------------------------------------------------------------------
def test_the_curriculum_grows_the_row_from_the_shortest_that_holds_the_beyond_span_form():
    first, second = recall.curriculum(CLASS)
    assert (first.seq_len, second.seq_len) == (48, CLASS.seq_len)      # 3 segments, then 4
    assert first.steps == second.steps == CLASS.steps                  # a budget per stage
    assert first.local_first == CLASS.local_first and second.local_first == 0.0
    assert first.queries_from + 2 * first.n_pairs <= first.seq_len     # the form still fits
    whole = dataclasses.replace(CLASS, seq_len=48)                     # nothing shorter fits
    assert recall.curriculum(whole) == [whole]
    for recipe in recall.RECALL_SIZES.values():
        stages = recall.curriculum(recipe)
        assert stages[-1].seq_len == recipe.seq_len
        assert all(s.seq_len % recipe.span == 0 for s in stages)


def test_staged_training_runs_each_stage_on_its_own_stream_of_rows_and_stops_when_stopped():
    seen = []

    class Recorder:
        def __init__(self, stage, rows, k, interrupted=False):
            self.stage, self.rows, self.k, self.interrupted = stage, rows, k, interrupted

        def fit(self):
            seen.append((self.k, self.stage.seq_len, self.rows[0][0].shape[0], len(self.rows)))
            return dataclasses.make_dataclass("H", ["interrupted"])(self.interrupted)

    recall.train(CLASS, Recorder, staged=True)
    rows = CLASS.steps * CLASS.batch_size
    assert seen == [(0, 48, 48, rows), (1, 64, 64, rows)]
    first, second = recall.curriculum(CLASS)
    assert not torch.equal(recall.training_rows(first, 0)[0][0][:48],
                           recall.training_rows(second, 1)[0][0][:48])   # fresh, not re-seen
    seen.clear()
    recall.train(CLASS, Recorder, staged=False)
    assert seen == [(0, 64, 64, CLASS.steps * CLASS.batch_size)]
    seen.clear()
    history = recall.train(CLASS, lambda s, r, k: Recorder(s, r, k, interrupted=True),
                           staged=True)
    assert history.interrupted and [k for k, *_ in seen] == [0]          # stage 2 never ran


def test_the_lab_trains_armt_and_its_twin_in_stages_and_the_others_in_one(tmp_path, monkeypatch):
    assert {n for n in registry.names() if registry.lab_spec(n).recall_curriculum} == {"armt"}
    lengths = {}
    real = lab_parts.Trainer                      # where the recall models' trainers are made

    def record(model, run, train_data, *args, **kwargs):
        lengths.setdefault(id(model), []).append(train_data[0][0].shape[0])
        return real(model, run, train_data, *args, **kwargs)

    monkeypatch.setattr(lab_parts, "Trainer", record)
    names = []
    run = lab.Lab("tiny", tmp_path, archs=["armt"], progress=False, tasks=("recall",),
                  recall_live=lambda name, recipe: names.append(name) or Callback())
    results = run.run()
    assert sorted(results["parts"]) == ["armt/model/0/curriculum", "armt/twin/0/curriculum",
                                        "dense/model/0"]      # a flat part is never reused
    stages = [s.seq_len for s in recall.curriculum(TINY)]
    assert sorted(lengths.values()) == [stages, stages, [TINY.seq_len]]  # armt, twin; dense
    assert "armt seed 0, stage 1 (T=48)" in names and "armt seed 0" not in names
