"""Memory-size sweeps (``lab.recall_sweep``): the configs each value trains, the store a stopped
sweep resumes from, the slot model beside each point, the command line and its figure."""

import json

import pytest

from blockmem_lite import recall
from blockmem_lite.lab import figures as lab_figures
from blockmem_lite.lab import recall_sweep

CLASS = recall.RECALL_SIZES["class"]


def test_each_value_sets_its_knob_and_nothing_else():
    armt = recall_sweep.points("armt", "n_mem_tokens", (1, 8), CLASS)
    assert [p.cfg.n_mem_tokens for p in armt] == [1, 8]
    assert {p.cfg.segment_size for p in armt} == {CLASS.span}
    cat = recall_sweep.points("cat", "chunk_size", (4, 16), CLASS)
    assert [(p.cfg.chunk_size, p.cfg.chunk_sizes) for p in cat] == [(4, ()), (16, ())]
    bcmt = recall_sweep.points("bcmt", "span", (8, 16), CLASS)
    assert [(p.cfg.block_size, p.recipe.span) for p in bcmt] == [(8, 8), (16, 16)]
    alpha = recall_sweep.points("bcmt", "alpha", (0.2,), CLASS)
    assert alpha[0].cfg.alpha == 0.2 and isinstance(alpha[0].cfg.alpha, float)


@pytest.mark.parametrize("arch, knob, values, message", [
    ("nope", "d_mem", (1,), "--arch='nope' is not allowed"),
    ("armt", "alpha", (1,), "--knob='alpha' is not allowed: expected one of d_mem, n_mem_tokens"),
    ("cat", "chunk_size", (128,), "chunk_size=128 is not allowed: must be between 1 and"),
    ("bcmt", "span", (32,), "seq_len=64 is not allowed with span=32"),
])
def test_a_bad_sweep_is_refused_before_anything_trains(arch, knob, values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        recall_sweep.points(arch, knob, values, CLASS)


def _fake_training(calls):
    def train_point(point, seed, callbacks=()):
        calls.append((point.value, seed))
        accuracy = min(1.0, point.cfg.n_mem_tokens / 4)
        curve = [{"n_pairs": n, "accuracy": accuracy, "n_answers": 10}
                 for n in range(1, point.recipe.n_pairs + 1)]
        return {"capacity": curve, "beyond": {"accuracy": accuracy, "n_answers": 10}}
    return train_point


def test_a_stopped_sweep_goes_on_where_it_stopped(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(recall_sweep, "train_point", _fake_training(calls))
    first = recall_sweep.run_sweep("armt", "n_mem_tokens", (1, 2), "class", (0, 1), tmp_path,
                                   progress=False)
    assert calls == [(1, 0), (1, 1), (2, 0), (2, 1)]
    point = first["points"]["2"]
    assert point["capacity"][0]["accuracy"] == 0.5 and point["capacity"][0]["n_answers"] == 20
    assert [s["accuracy"] for s in point["slot_model"]] == [1.0, 1.0, 2 / 3, 0.5]
    again = recall_sweep.run_sweep("armt", "n_mem_tokens", (1, 2, 8), "class", (0, 1),
                                   tmp_path, progress=False)
    assert calls[4:] == [(8, 0), (8, 1)]                    # only the new value trains
    stored = json.loads((tmp_path / "armt-n_mem_tokens.json").read_text())
    assert list(stored["points"]) == ["1", "2", "8"] == list(again["points"])
    with pytest.raises(ValueError, match="holds a sweep with other settings \\(seeds differ\\)"):
        recall_sweep.run_sweep("armt", "n_mem_tokens", (1,), "class", (0,), tmp_path)
    assert stored["stages"] == [48, 64]                     # ARMT: the segment curriculum
    flat = {**stored, "stages": [64]}                       # a sweep trained before it
    (tmp_path / "armt-n_mem_tokens.json").write_text(json.dumps(flat))
    with pytest.raises(ValueError, match="\\(stages differ\\)"):
        recall_sweep.run_sweep("armt", "n_mem_tokens", (1, 2, 8), "class", (0, 1), tmp_path)


def test_the_figure_draws_measured_and_slot_model_per_pair_count(tmp_path, monkeypatch):
    monkeypatch.setattr(recall_sweep, "train_point", _fake_training([]))
    record = recall_sweep.run_sweep("armt", "n_mem_tokens", (1, 4), "class", (0,), tmp_path,
                                    progress=False)
    fig = lab_figures.memory_sweep(record)
    lines = {t.name: (list(t.x), list(t.y), t.line.dash) for t in fig.data}
    assert lines["4 pairs: measured"] == ([1, 4], [0.25, 1.0], "solid")
    assert lines["4 pairs: slot model"] == ([1, 4], [0.25, 1.0], "dash")
    assert lines["1 pair: slot model"][1] == [1.0, 1.0]
    assert fig.layout.xaxis.type == "log"
    assert "n_mem_tokens=4: 1:1.00/1.00" in recall_sweep.summary(record)
    empty = lab_figures.memory_sweep({**record, "points": {}})
    assert len(empty.data) == 0 and "no point" in empty.layout.annotations[0].text


def test_the_command_line_names_a_bad_value(capsys):
    assert recall_sweep.main(["--arch", "bcmt", "--knob", "alpha", "--values", "x"]) == 2
    assert "--values='x' is not allowed" in capsys.readouterr().err
    assert recall_sweep.main(["--arch", "armt", "--knob", "block_size"]) == 2
    assert "expected one of d_mem, n_mem_tokens" in capsys.readouterr().err



def test_a_stop_while_training_stores_no_half_trained_point(tmp_path, monkeypatch):
    class StoppedTrainer:                       # what Trainer.fit returns after a SIGTERM
        def __init__(self, *args, **kwargs):
            pass

        def fit(self):
            return type("History", (), {"interrupted": True})()

    monkeypatch.setattr(recall_sweep, "Trainer", StoppedTrainer)
    with pytest.raises(KeyboardInterrupt):
        recall_sweep.run_sweep("bcmt", "alpha", (0.5,), "tiny", (0,), tmp_path, progress=False)
    assert not (tmp_path / "bcmt-alpha.json").exists() or \
        json.loads((tmp_path / "bcmt-alpha.json").read_text())["points"] == {}


def test_the_shipped_sweeps_are_found_and_hold_every_default_value():
    for arch, knob in recall_sweep.SWEEPS:
        record = recall_sweep.shipped(arch, knob)
        assert record is not None, f"data/reproduce/class_cpu/sweeps/{arch}-{knob}.json is missing"
        assert record["format"] == recall_sweep.SWEEP_FORMAT and record["preset"] == "class"
        assert [float(v) for v in record["points"]] == \
            [float(v) for v in recall_sweep.SWEEPS[arch, knob]]
    assert recall_sweep.shipped("armt", "no_such_knob") is None
