"""The comparison lab: ``reproduce --preset fast`` end to end (every registered architecture,
plugins included, the JSON, the report, the claims table), and an interrupted run that
continues to the same result as an uninterrupted one."""

import json
import re

import pytest

from blockmem_lite import lab, registry
from blockmem_lite.corpora import load_corpus
from blockmem_lite.lab import parts as lab_parts
from blockmem_lite.lab import verdicts as lab_verdicts
from blockmem_lite.tools.reproduce_command import reproduce_main

DETERMINISTIC_DROP = ("seconds",)          # wall-clock fields differ between runs


@pytest.fixture(scope="module")
def fast_run(fast_reproduce):
    return fast_reproduce


def test_every_registered_architecture_is_trained_measured_and_benched(fast_run):
    _, results = fast_run
    done = results["done"]
    for arch in registry.names():                      # plugins registered in this session too
        assert f"lm/{arch}" in done, arch
        has_twin = registry.lab_spec(arch).twin is not None
        assert (f"recall/{arch}" in done) == (has_twin or arch == registry.BASELINE), arch
        assert any(r["arch"] == arch for r in done["bench/*"]["records"]), arch
        assert done[f"lm/{arch}"]["val_loss"], arch
    assert "lm/dense iso-FLOP (moc)" in done            # MoC's iso-FLOP baseline (its LabSpec)
    assert set(done["lm/cat"]["val_loss"]) == {"C=4", "C=8", "C=16", "C=32"}
    assert done["lm/armt"]["starts_from_trained"] is True


def test_the_json_has_its_keys(fast_run):
    _, results = fast_run
    assert set(results) >= {"meta", "done", "claims", "memory_pays", "knowledge"}
    assert [r["entry"] for r in results["knowledge"]] == ["moc"]          # one table size
    assert set(results["meta"]) >= {"format", "preset", "entries", "sizes", "corpus", "seed",
                                     "device", "machine", "torch"}
    assert results["meta"]["preset"] == "fast"
    assert set(results["meta"]["plan"]) == set(results["done"])         # a finished run
    record = results["done"]["lm/dense"]
    assert set(record) >= {"val_loss", "tokens", "params", "steps", "loss_curve"}
    recall = results["done"]["recall/bcmt"]
    assert set(recall["curves"][""]) == {"passkey", "mqar"}
    assert recall["local_span"][""] == 8                  # the fast recall recipe's span
    assert set(recall["twin"]) == {"curves", "beyond", "capacity", "length", "blindness",
                                   "slot_model"}
    assert [p["slots"] for p in recall["slot_model"][""]] == [1, 1]        # one block memory
    assert {p["accuracy"] for p in recall["twin"]["slot_model"][""]} == {recall["chance"]["mqar"]}
    assert set(results["done"]["recall/cat"]["local_span"]) == {"C=4", "C=8"}
    pays = {r["entry"]: r for r in results["memory_pays"]}
    assert set(pays) == {"bcmt", "armt", "cat C=4", "cat C=8"}
    assert all(r["twin_blind"] for r in pays.values()), pays
    assert pays["bcmt"]["slot_model"] == pays["cat C=4"]["slot_model"] == (1 + 1 / 32) / 2
    # 2 pairs in 1 bag of MQAR's 32 values: right once, twice when the two values agree
    assert all(r["shortfall"] in {None, "capacity", "training"} for r in pays.values())
    assert results["done"]["recall/dense"]["beyond"][""]["mean"] > 2 * recall["chance"]["mqar"]
    state = results["done"]["bench/*"]["state"]["dense"]
    assert state["measured"][1] == 4 * state["measured"][0]   # dense: the KV cache grows with t
    assert state["analytic"] == state["measured"]


def test_the_claims_table_has_a_row_and_a_verdict_for_every_registered_claim(fast_run):
    _, results = fast_run
    claims = {c.key for name in registry.names() for c in registry.lab_spec(name).claims}
    rows = {r["key"]: r for r in results["claims"]}
    assert set(rows) == claims and len(claims) >= 12
    for row in rows.values():
        assert row["verdict"] in lab_verdicts.VERDICTS, row
        assert row["reason"] and row["paper"] and row["where"]
    assert rows["armt.babilong"]["verdict"] == "not comparable"
    assert rows["bcmt.train_speed"]["kit_value"] is not None
    assert rows["bcmt.train_speed"]["ceiling"] is not None


def test_the_report_and_the_plots_are_written(fast_run):
    out, results = fast_run
    report = (out / "report.md").read_text()
    for heading in ("Language modelling", "Speed and memory vs dense", "When does memory pay",
                    "The papers' claims at kit scale"):
        assert heading in report
    assert all((out / "plots" / f"{name}.html").is_file() for name in lab.PLOTS)
    assert report.count("| bcmt |") >= 1


def test_a_verdict_follows_the_claim(fast_run):
    """Teeth: the same claim flips with the measured value."""
    _, results = fast_run
    claim = next(c for c in registry.lab_spec("bcmt").claims if c.key == "bcmt.honly_worse")
    faked = json.loads(json.dumps(results))
    for label in ("bcmt", "honly"):                     # no training accident to hold it
        faked["done"][f"lm/{label}"]["loss_curve"] = [5.5, 3.0]
    faked["done"]["lm/honly"]["val_loss"][""] = faked["done"]["lm/bcmt"]["val_loss"][""] + 0.1
    assert lab.claim_row("bcmt", claim, faked)["verdict"] == "reproduced"
    faked["done"]["lm/honly"]["val_loss"][""] = faked["done"]["lm/bcmt"]["val_loss"][""] - 0.1
    assert lab.claim_row("bcmt", claim, faked)["verdict"] == "not reproduced"
    del faked["done"]["lm/honly"]
    assert lab.claim_row("bcmt", claim, faked)["verdict"] == "not comparable"


def test_a_claim_on_a_run_with_a_training_accident_is_not_judged(fast_run):
    """A language model whose training loss rose above where it started is an accident: the
    claims that read it get no verdict; the claims that read other runs keep theirs."""
    _, results = fast_run
    claims = {c.key: c for c in registry.lab_spec("bcmt").claims}
    faked = json.loads(json.dumps(results))
    for label in ("bcmt", "honly", "dense"):
        faked["done"][f"lm/{label}"]["loss_curve"] = [5.5, 4.0, 3.0]
    assert lab.claim_row("bcmt", claims["bcmt.honly_worse"], faked)["verdict"] != "not judged"
    faked["done"]["lm/bcmt"]["loss_curve"] = [5.5, 4.0, 6.1, 3.0]
    row = lab.claim_row("bcmt", claims["bcmt.honly_worse"], faked)
    assert row["verdict"] == "not judged" and "bcmt" in row["reason"] and "step 3" in row["reason"]
    assert row["kit_value"] is not None                     # measured, just not judged
    assert lab.claim_row("bcmt", claims["bcmt.train_speed"], faked)["verdict"] != "not judged"


def test_a_run_from_trained_weights_is_held_to_an_untrained_models_loss():
    wrapped = {"loss_curve": [1.4, 1.6, 1.3], "starts_from_trained": True}
    assert lab_verdicts.accident(wrapped, untrained=5.5) is None        # batch noise
    assert lab_verdicts.accident({**wrapped, "loss_curve": [1.4, 5.8]}, untrained=5.5)
    assert lab_verdicts.accident({"loss_curve": [1.4, 1.7]}) is not None   # from scratch: its own
    assert lab_verdicts.accident({"loss_curve": [1.4, 1.6]}) is None       # within the margin


def _deterministic(results: dict) -> dict:
    return {key: {k: v for k, v in value.items() if k not in DETERMINISTIC_DROP}
            for key, value in results["done"].items() if key.split("/")[0] in lab.DETERMINISTIC}


def test_an_interrupted_run_continues_to_the_uninterrupted_result(tmp_path, monkeypatch):
    """Four entries (dense, BCMT, CAT, HOnly: four recall tasks) are enough to stop between
    tasks; resuming does not depend on which mechanisms run (ARMT and MoC cost twice these)."""
    corpus, archs = load_corpus("offline"), ["bcmt", "cat", "honly"]
    whole = lab.Lab("tiny", tmp_path / "whole", archs=archs, corpus=corpus, progress=False).run()
    real, calls = lab.Lab._recall, []

    def interrupted(self, label):
        calls.append(label)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, label)

    monkeypatch.setattr(lab.Lab, "_recall", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lab.Lab("tiny", tmp_path / "split", archs=archs, corpus=corpus, progress=False).run()
    stored = json.loads((tmp_path / "split" / lab.RESULTS_NAME).read_text())["done"]
    assert len([k for k in stored if k.startswith("recall/")]) == 2      # kept, not lost
    rerun = []
    monkeypatch.setattr(lab.Lab, "_recall", lambda self, label: rerun.append(label)
                        or real(self, label))
    monkeypatch.setattr(lab.Lab, "_lm", lambda self, label: pytest.fail(f"lm/{label} rerun"))
    resumed = lab.Lab("tiny", tmp_path / "split", archs=archs, corpus=corpus,
                      progress=False).run()
    assert not set(calls[:2]) & set(rerun)                              # nothing recomputed
    assert _deterministic(resumed) == _deterministic(whole)


def test_a_folder_holding_another_plan_is_refused(tmp_path):
    corpus = load_corpus("offline")
    lab.Lab("tiny", tmp_path, archs=["dense"], corpus=corpus, progress=False).run()
    with pytest.raises(ValueError, match="holds a run with other settings .*entries"):
        lab.Lab("tiny", tmp_path, archs=["dense", "bcmt"], corpus=corpus, progress=False)


def test_a_seed_trains_every_language_model_with_it_and_makes_another_run(tmp_path):
    """``seed`` reaches every language model (notebook 10 passes BLOCKMEM_SEED's); a folder
    holding a run of another seed is refused, not mixed; a bad seed is named."""
    entries = lab.plan_entries("tiny", ["bcmt", "moc"], seed=7)
    assert {e.run.train.seed for e in entries} == {7}
    assert {e.run.train.seed for e in lab.plan_entries("tiny", ["bcmt"])} == {0}
    corpus = load_corpus("offline")
    first = lab.Lab("tiny", tmp_path, archs=["dense"], corpus=corpus, progress=False,
                    tasks=("lm",), seed=1).run()
    assert first["meta"]["seed"] == 1
    assert lab.Lab("tiny", tmp_path / "r", archs=["bcmt"], corpus=corpus, progress=False,
                   tasks=("recall",), seed=4).recipe.seeds == (4,)       # tiny's recipe: (0,)
    other = lab.Lab("tiny", tmp_path / "seed2", archs=["dense"], corpus=corpus, progress=False,
                    tasks=("lm",), seed=2).run()
    assert other["done"]["lm/dense"]["val_loss"] != first["done"]["lm/dense"]["val_loss"]
    with pytest.raises(ValueError, match="other settings \\(.*seed differ"):
        lab.Lab("tiny", tmp_path, archs=["dense"], corpus=corpus, tasks=("lm",), seed=2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"seed={bad!r} is not allowed"):
            lab.Lab("tiny", tmp_path / "bad", archs=["dense"], corpus=corpus, seed=bad)


def test_cli_errors(tmp_path, capsys):
    assert reproduce_main(["--preset", "tiny", "--arch", "nope", "--out", str(tmp_path)]) == 2
    assert "arch='nope' is not allowed" in capsys.readouterr().err
    assert reproduce_main(["--preset", "tiny", "--steps", "0", "--out", str(tmp_path)]) == 2
    assert "--steps=0 is not allowed" in capsys.readouterr().err
    assert reproduce_main(["--preset", "tiny", "--seed", "-1", "--out", str(tmp_path)]) == 2
    assert "--seed=-1 is not allowed" in capsys.readouterr().err
    assert reproduce_main(["--preset", "tiny", "--lm-seeds", "0", "--out", str(tmp_path)]) == 2
    assert "--lm-seeds=0 is not allowed: expected an integer >= 1" in capsys.readouterr().err
    assert reproduce_main(["--preset", "tiny", "--paths", str(tmp_path / "none.txt"), "--out",
                           str(tmp_path)]) == 2
    assert "text files not found" in capsys.readouterr().err


def test_a_recall_task_stopped_between_its_models_keeps_the_trained_ones(tmp_path, monkeypatch):
    """The recall task trains several models (seeds, the twin); each is stored as it
    finishes, so a stop between them loses none and a resume trains only the rest."""
    corpus = load_corpus("offline")
    monkeypatch.setattr(lab.Lab, "_bench", lambda self, label: {"records": [], "state": {}})
    real = lab.Lab._recall_part

    def stop_at_the_twin(self, label, role, cfg, recipe, seed):
        if (label, role) == ("bcmt", "twin"):
            raise KeyboardInterrupt
        return real(self, label, role, cfg, recipe, seed)

    monkeypatch.setattr(lab.Lab, "_recall_part", stop_at_the_twin)
    with pytest.raises(KeyboardInterrupt):
        lab.Lab("tiny", tmp_path, archs=["bcmt"], corpus=corpus, progress=False).run()
    stored = json.loads((tmp_path / lab.RESULTS_NAME).read_text())
    assert "bcmt/model/0" in stored["parts"] and "recall/bcmt" not in stored["done"]
    built = []                                   # recall models are built in lab.parts
    real_build = lab_parts.build_model
    monkeypatch.setattr(lab_parts, "build_model", lambda cfg: built.append(getattr(cfg, "memory", 0))
                        or real_build(cfg))
    monkeypatch.setattr(lab.Lab, "_recall_part", real)
    results = lab.Lab("tiny", tmp_path, archs=["bcmt"], corpus=corpus, progress=False).run()
    assert built == [False]                                  # only the twin was trained
    assert results["done"]["recall/bcmt"]["beyond"][""]["mean"] \
        == stored["parts"]["bcmt/model/0"][""]["beyond"]["accuracy"]   # the stored model's


def test_a_notebook_can_ask_the_recall_task_alone_at_its_own_seeds(tmp_path):
    corpus = load_corpus("offline")
    run = lab.Lab("tiny", tmp_path, archs=["bcmt"], corpus=corpus, progress=False,
                  tasks=("recall",), recall_seeds=(3,))
    assert run.plan == [("recall", "dense"), ("recall", "bcmt")]
    assert run.meta["plan"] == ["recall/dense", "recall/bcmt"]
    results = run.run()
    assert set(results["done"]) == {"recall/dense", "recall/bcmt"}
    assert set(results["parts"]) == {"dense/model/3", "bcmt/model/3", "bcmt/twin/3"}
    assert [r["entry"] for r in results["memory_pays"]] == ["bcmt"]
    assert results["meta"]["sizes"]["recall_seeds"] == [3]
    with pytest.raises(ValueError, match="holds a run with other settings \\(sizes differ\\)"):
        lab.Lab("tiny", tmp_path, archs=["bcmt"], corpus=corpus, recall_seeds=(0,))


def test_the_bench_shows_its_phases_on_the_progress_bar(tmp_path, capsys):
    lab.Lab("tiny", tmp_path, archs=["bcmt"], corpus=load_corpus("offline"),
            tasks=("bench",)).run()
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("[reproduce] [")]
    shown = [re.split(r"(?:left|unknown)  ", line, maxsplit=1)[1] for line in lines]
    assert list(dict.fromkeys(text for text in shown if text.startswith("bench:"))) == [
        "bench: T=32 train", "bench: T=32 decode", "bench: decoding state curves"]
    shares = [int(line.split("]")[2].split("%")[0]) for line in lines]
    assert shares == sorted(shares) and shares[-1] == 100, shares


@pytest.mark.parametrize("kwargs, message", [
    ({"tasks": ("recal",)}, "tasks='recal' is not allowed: expected one of lm, recall"),
    ({"tasks": "recall"}, "tasks='recall' is not allowed: expected a tuple of task kinds"),
    ({"recall_seeds": 0}, "recall_seeds=0 is not allowed: expected a non-empty tuple"),
    ({"recall_seeds": (-1,)}, "recall_seeds=\\(-1,\\) is not allowed"),
    ({"lm_seeds": 0}, "lm_seeds=0 is not allowed: expected None"),
    ({"lm_seeds": True}, "lm_seeds=True is not allowed"),
])
def test_bad_tasks_or_seeds_are_refused_before_any_work(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        lab.Lab("tiny", tmp_path, archs=["bcmt"], progress=False, **kwargs)
