"""Memory-size sweeps (``lab.recall_sweep``): the configs each value trains, the store a stopped
sweep resumes from, the slot model beside each point, the command line and its figure."""

import json
import textwrap

import pytest

from blockmem_lite import recall, registry
from blockmem_lite.lab import figures as lab_figures
from blockmem_lite.lab import recall_sweep

CLASS = recall.RECALL_SIZES["class"]


def test_each_value_sets_its_knob_and_nothing_else():
    armt = recall_sweep.points("armt", "n_mem_tokens", (1, 8), CLASS)
    assert [p.cfg.n_mem_tokens for p in armt] == [1, 8]
    assert {p.cfg.segment_size for p in armt} == {CLASS.span}
    cat = recall_sweep.points("cat", "chunk_size", (4, 16), CLASS)
    assert [(p.cfg.chunk_size, p.cfg.chunk_sizes) for p in cat] == [(4, ()), (16, ())]
    bcmt = recall_sweep.points("bcmt", "block_size", (8, 16), CLASS)
    assert [p.cfg.block_size for p in bcmt] == [8, 16]
    alpha = recall_sweep.points("bcmt", "alpha", (0.2,), CLASS)
    assert alpha[0].cfg.alpha == 0.2 and isinstance(alpha[0].cfg.alpha, float)
    assert alpha[0].cfg.block_size == CLASS.span                # the recipe's span otherwise


def test_the_budget_sweep_changes_the_recipes_steps_and_not_the_model(tmp_path, monkeypatch):
    budget = recall_sweep.points("armt", "steps", (900, 1800), CLASS)
    assert budget[0].cfg == budget[1].cfg == recall_sweep.points(
        "armt", "n_mem_tokens", (CLASS.model_config(budget[0].cfg).n_mem_tokens,), CLASS)[0].cfg
    recipes = [p.recipe(CLASS) for p in budget]
    assert [r.steps for r in recipes] == [900, 1800]
    assert {r.__class__(**{**r.__dict__, "steps": 1}) for r in recipes} == {
        CLASS.__class__(**{**CLASS.__dict__, "steps": 1})}          # nothing else moves
    with pytest.raises(ValueError, match="expected steps >= 1"):
        recall_sweep.points("armt", "steps", (0,), CLASS)
    calls = []
    monkeypatch.setattr(recall_sweep, "train_point", _fake_training(calls))
    recall_sweep.run_sweep("armt", "steps", None, "class", (0,), tmp_path, progress=False)
    assert [value for value, _ in calls] == [CLASS.steps, 2 * CLASS.steps, 4 * CLASS.steps]


def test_the_default_sweeps_come_from_the_knobs():
    assert recall_sweep.default_sweeps() == {
        ("bcmt", "block_size"): (8, 16), ("bcmt", "alpha"): (0.2, 0.8, 0.95),
        ("cat", "chunk_size"): (4, 8, 16),
        ("armt", "n_mem_tokens"): (1, 2, 4, 8), ("armt", "d_mem"): (1, 2, 16)}


def test_a_plugins_knob_is_swept_like_a_built_in_one(tmp_path):
    plugin = tmp_path / "wide_swa.py"
    plugin.write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from blockmem_lite import registry
        from blockmem_lite.mechanisms.moc import flops_per_token, state_bytes
        from blockmem_lite.models.moc import MoCLM, MoCOptions

        @dataclass
        class Options(MoCOptions):
            top_k: int = registry.knob(2, help="routed chapters", recall_sweep=(1, 3))

        registry.register(registry.Mechanism(
            name="moc_sweepable", model=MoCLM, options=Options, flops=flops_per_token,
            state_bytes=state_bytes, summary="MoC with a swept top_k"))
    """))
    try:
        registry.load_plugin(plugin)
        assert recall_sweep.default_sweeps()["moc_sweepable", "top_k"] == (1, 3)
        swept = recall_sweep.points("moc_sweepable", "top_k", (1, 3), CLASS)
        assert [p.cfg.top_k for p in swept] == [1, 3]
    finally:
        registry.unregister("moc_sweepable")


@pytest.mark.parametrize("arch, knob, values, message", [
    ("nope", "d_mem", (1,), "--arch='nope' is not allowed"),
    ("armt", "alpha", (1,), "--knob='alpha' is not allowed: expected one of d_mem, "),
    ("cat", "chunk_size", (128,), "chunk_size=128 is not allowed: must be between 1 and"),
    ("bcmt", "block_size", (128,), "block_size=128 is not allowed: must be between 1 and"),
    ("dense", "d_mem", (1,), "--arch='dense' is not allowed: has no numeric option to sweep"),
    ("armt", "detach_every", (), "--values=.* has no default sweep; give the values"),
])
def test_a_bad_sweep_is_refused_before_anything_trains(arch, knob, values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        recall_sweep.points(arch, knob, values, CLASS)


def _fake_training(calls):
    def train_point(point, recipe, seed, callbacks=()):
        calls.append((point.value, seed))
        accuracy = min(1.0, point.cfg.n_mem_tokens / 4)
        curve = [{"n_pairs": n, "accuracy": accuracy, "n_answers": 10}
                 for n in range(1, recipe.n_pairs + 1)]
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
    two = recall.expected_top_count(2, 32)                # a bag of 2 of MQAR's 32 values
    assert [s["accuracy"] for s in point["slot_model"]] == [1.0, 1.0, (two + 1) / 3, two / 2]
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
    assert lines["4 pairs: slot model"] == ([1, 4], [recall.expected_top_count(4, 32) / 4, 1.0],
                                            "dash")
    assert lines["1 pair: slot model"][1] == [1.0, 1.0]
    assert fig.layout.xaxis.type == "log"
    assert "n_mem_tokens=4: 1:1.00/1.00" in recall_sweep.summary(record)
    empty = lab_figures.memory_sweep({**record, "points": {}})
    assert len(empty.data) == 0 and "no point" in empty.layout.annotations[0].text


def test_the_command_line_names_a_bad_value(capsys):
    assert recall_sweep.main(["--arch", "bcmt", "--knob", "alpha", "--values", "x"]) == 2
    assert "--values='x' is not allowed" in capsys.readouterr().err
    assert recall_sweep.main(["--arch", "armt", "--knob", "block_size"]) == 2
    assert "--knob='block_size' is not allowed: expected one of d_mem" in capsys.readouterr().err
    assert recall_sweep.main(["--arch", "armt", "--knob", "d_mem", "--values", "1.5"]) == 2
    assert "expected comma-separated ints" in capsys.readouterr().err
    assert recall_sweep.main(["--arch", "x", "--knob", "y", "--plugin", "nope.py"]) == 2
    assert "plugin='nope.py' is not allowed" in capsys.readouterr().err



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
    for (arch, knob), values in recall_sweep.default_sweeps().items():
        record = recall_sweep.shipped(arch, knob)
        assert record is not None, f"data/reproduce/class_cpu/sweeps/{arch}-{knob}.json is missing"
        assert record["format"] == recall_sweep.SWEEP_FORMAT and record["preset"] == "class"
        assert [float(v) for v in record["points"]] == \
            [float(v) for v in values]
    assert recall_sweep.shipped("armt", "no_such_knob") is None


def test_the_command_line_takes_seed_zero_and_refuses_a_negative_one(tmp_path, monkeypatch,
                                                                      capsys):
    calls = []
    monkeypatch.setattr(recall_sweep, "train_point", _fake_training(calls))
    args = ["--arch", "armt", "--knob", "n_mem_tokens", "--values", "2", "--out", str(tmp_path)]
    assert recall_sweep.main([*args, "--seeds", "0,1"]) == 0
    assert calls == [(2, 0), (2, 1)]
    assert recall_sweep.main([*args, "--seeds", "-1"]) == 2
    assert "--seeds='-1' is not allowed: expected comma-separated integers >= 0" \
        in capsys.readouterr().err
    assert calls == [(2, 0), (2, 1)]                      # nothing trained for the bad seed
