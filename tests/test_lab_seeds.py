"""The lab's language models at several seeds (the claims judged on the seed band) and their
loss by position in the window (the memory on and off)."""

import dataclasses

import pytest
import torch

from blockmem_lite import lab, labdata, registry
from blockmem_lite.config import preset
from blockmem_lite.corpora import load_corpus, make_loaders
from blockmem_lite.lab import language_models
from blockmem_lite.lab import run as lab_run
from blockmem_lite.lab import verdicts as lab_verdicts
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import seed_everything
from blockmem_lite.train import evaluate, loss_by_position


@pytest.fixture(scope="module")
def two_seed_run(tmp_path_factory):
    """The tiny lab's language models at two seeds."""
    out = tmp_path_factory.mktemp("seeds")
    return out, lab.reproduce("tiny", out=out, tasks=("lm",), progress=False, lm_seeds=2)


def test_every_entry_from_scratch_has_each_seed_and_its_band(two_seed_run):
    out, results = two_seed_run
    for key, record in results["done"].items():
        seeds = [0] if record["starts_from_trained"] else [0, 1]   # ARMT: the run's seed
        assert record["seeds"] == seeds, key
        assert sorted(record["by_seed"]) == [str(s) for s in seeds], key
        for variant, loss in record["val_loss"].items():
            each = [record["by_seed"][str(s)]["val_loss"][variant] for s in seeds]
            assert loss == pytest.approx(sum(each) / len(each)), key
            assert record["val_loss_band"][variant] == [min(each), max(each)], key
        if len(seeds) > 1:       # another seed: other first weights and data order
            assert record["by_seed"]["0"]["loss_curve"] != record["by_seed"]["1"]["loss_curve"]
        assert (out / "models" / f"{lab_run._file_name(key[3:])}.pt").is_file(), key
    assert not [k for k in results.get("parts", {}) if k.startswith("lm:")]   # in the records


def test_another_seed_count_is_another_run(two_seed_run):
    out, _ = two_seed_run
    with pytest.raises(ValueError, match="other settings \\(sizes differ\\)"):
        lab.Lab("tiny", out, tasks=("lm",), progress=False, lm_seeds=3)


def test_the_stored_model_is_the_run_seeds(two_seed_run):
    """OUT/models holds the run's own seed (a later entry starts from it): reloaded, it
    gives that seed's loss, not another's."""
    out, results = two_seed_run
    entry = next(e for e in lab_run.plan_entries("tiny") if e.label == "bcmt")
    model = build_model(entry.cfg)
    model.load_state_dict(torch.load(out / "models" / "bcmt.pt", weights_only=True))
    _, val = make_loaders(entry.run, corpus=load_corpus("offline"))
    loss = evaluate(model, val, entry.run.train.eval_batches, batch_size=entry.run.train.batch_size)
    record = results["done"]["lm/bcmt"]
    assert loss == pytest.approx(record["by_seed"]["0"]["val_loss"][""], abs=1e-4)
    assert loss != pytest.approx(record["by_seed"]["1"]["val_loss"][""], abs=1e-4)


def _gap_run(gaps: list[float]) -> dict:
    """A result with BCMT and HOnly at len(gaps) seeds, HOnly - BCMT = gaps[k] at seed k."""
    def record(losses):
        seeds = list(range(len(losses)))
        return {"arch": "x", "val_loss": {"": sum(losses) / len(losses)}, "seeds": seeds,
                "by_seed": {str(s): {"val_loss": {"": v}, "loss_curve": [5.5, 3.0]}
                            for s, v in zip(seeds, losses, strict=True)},
                "loss_curve": [5.5, 3.0]}
    return {"meta": {}, "done": {"lm/bcmt": record([2.0] * len(gaps)),
                                 "lm/honly": record([2.0 + g for g in gaps])}}


@pytest.mark.parametrize("gaps, verdict", [([0.1, 0.2, 0.05], "reproduced"),
                                           ([-0.1, -0.2, -0.05], "not reproduced"),
                                           ([0.3, -0.01, 0.02], "within noise")])
def test_a_claim_is_decided_only_outside_the_seed_band(gaps, verdict):
    """Mean gap +0.103 in the last case: one seed alone, or the mean, would say
    "reproduced"; the seeds disagree, so the verdict is "within noise"."""
    claim = next(c for c in registry.lab_spec("bcmt").claims if c.key == "bcmt.honly_worse")
    row = lab.claim_row("bcmt", claim, _gap_run(gaps))
    assert row["verdict"] == verdict, row["reason"]
    assert row["kit_band"] == pytest.approx([min(gaps), max(gaps)])
    assert row["kit_value"] == pytest.approx(sum(gaps) / len(gaps))
    assert row["seeds"] == 3


def test_an_accident_at_any_seed_leaves_the_claim_not_judged():
    claim = next(c for c in registry.lab_spec("bcmt").claims if c.key == "bcmt.honly_worse")
    results = _gap_run([0.1, 0.2, 0.05])
    results["done"]["lm/bcmt"]["by_seed"]["2"]["loss_curve"] = [5.5, 6.4, 3.0]
    row = lab.claim_row("bcmt", claim, results)
    assert row["verdict"] == "not judged" and "bcmt seed 2" in row["reason"], row["reason"]


def test_the_shipped_class_run_has_three_seeds_and_no_accident():
    """What the kit teaches from: every language model trained from scratch at three seeds,
    no seed's training loss above its start (``verdicts.accident``), so every claim that
    reads them has a verdict."""
    path = lab_run.shipped_run("class")
    if path is None:
        pytest.skip("this install ships no class run")
    results = lab_run._read_results(path)
    lms = {k: v for k, v in results["done"].items() if k.startswith("lm/")}
    untrained = lms["lm/dense"]["loss_curve"][0]
    for key, record in lms.items():
        if not record.get("starts_from_trained"):
            assert record["seeds"] == [0, 1, 2], key
        for seed, view in lab_verdicts._seed_records(record):
            assert lab_verdicts.accident(view, untrained) is None, (key, seed)
    assert all(c["verdict"] != "not judged" for c in results["claims"])


def test_seed_views_pair_each_model_at_the_same_seed():
    done = _gap_run([0.1, 0.2])["done"]
    views = lab_verdicts.seed_views(done)
    assert [v["lm/honly"]["val_loss"][""] - v["lm/bcmt"]["val_loss"][""] for v in views] == \
        pytest.approx([0.1, 0.2])
    assert lab_verdicts.seed_views({"lm/dense": {"val_loss": {"": 1.0}}}) == []


def test_combine_seeds_averages_the_seeds_and_keeps_the_run_seeds_curves():
    runs = {3: {"val_loss": {"": 1.0}, "position_loss": {"": [2.0, 1.0]}, "seconds": 1.0,
                "loss_curve": [5.0, 1.0], "grad_norm_groups": {"attn": [1.0, 2.0]}},
            4: {"val_loss": {"": 1.4}, "position_loss": {"": [3.0, 1.5]}, "seconds": 2.0,
                "loss_curve": [5.0, 1.4], "grad_norm_groups": {"attn": [9.0, 9.0]}}}
    record = language_models.combine_seeds(runs)
    assert record["val_loss"] == {"": pytest.approx(1.2)}
    assert record["val_loss_band"] == {"": [1.0, 1.4]}
    assert record["position_loss"] == {"": [2.5, 1.25]}
    assert record["loss_curve"] == [5.0, 1.0] and record["grad_norm_groups"]["attn"] == [1.0, 2.0]
    assert record["seeds"] == [3, 4] and record["seconds"] == 3.0
    assert record["by_seed"]["4"]["loss_curve"] == [5.0, 1.4]


def test_loss_by_position_averages_to_the_mean_loss():
    """Every window has a target at every position, so the positions' mean is the mean loss;
    and a causal model's loss at position t does not move when later tokens change."""
    run = preset("tiny", arch="dense")
    seed_everything(0)
    model = build_model(run.model)
    x = torch.randint(0, run.model.vocab_size, (6, run.model.seq_len + 1))
    data = list(zip(x[:, :-1], x[:, 1:], strict=True))
    by_position = loss_by_position(model, data, batch_size=3)
    assert len(by_position) == run.model.seq_len
    assert sum(by_position) / len(by_position) == pytest.approx(evaluate(model, data, batch_size=3),
                                                                rel=1e-5)
    changed = x.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % run.model.vocab_size
    after = loss_by_position(model, list(zip(changed[:, :-1], x[:, 1:], strict=True)))
    assert after[:20] == pytest.approx(by_position[:20], abs=1e-5)
    assert after[20:] != pytest.approx(by_position[20:], abs=1e-5)
    with pytest.raises(ValueError, match="max_batches=0"):
        loss_by_position(model, data, max_batches=0)


@pytest.mark.parametrize("arch", ["bcmt", "cat", "armt"])
def test_memory_off_is_the_trained_model_with_its_memory_path_off(arch):
    """The twin keeps every trained weight (so the two agree wherever the memory has not
    spoken yet: the first span), and a planted twin config with weights of its own is
    refused."""
    entry = next(e for e in lab_run.plan_entries("tiny", [arch]) if e.label == arch)
    spec = registry.lab_spec(arch)
    seed_everything(0)
    model = build_model(entry.cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))        # a "trained" memory, not a fresh one
    twin = language_models.memory_off(model, entry.cfg, spec)
    variant, overrides = entry.variants()[0]
    if overrides:
        spec.switch(model, overrides)
        spec.switch(twin, overrides)
    span = entry.local_span(overrides)
    x = torch.randint(0, entry.cfg.vocab_size, (2, entry.cfg.seq_len))
    model.eval(), twin.eval()
    on, off = model(x).logits, twin(x).logits
    first = span - 1           # CAT's last token of a chunk reads that chunk's own vector
    assert torch.allclose(on[:, :first], off[:, :first], atol=1e-5)
    assert not torch.allclose(on[:, span:], off[:, span:], atol=1e-4)
    bad = registry.LabSpec(twin=lambda cfg: dataclasses.replace(cfg, n_layer=cfg.n_layer + 1))
    with pytest.raises(ValueError, match="twin"):
        language_models.memory_off(model, entry.cfg, bad)


def test_the_position_table_and_figure(two_seed_run):
    _, results = two_seed_run
    table = labdata.position_losses(results)
    assert table["bcmt"]["off"] is not None and table["dense"]["off"] is None
    assert table["bcmt"]["span"] == results["done"]["lm/bcmt"]["local_span"][""]
    assert len(table["bcmt"]["loss"]) == 4 and table["bcmt"]["length"] == 32
    from blockmem_lite.lab import figures
    fig = figures.loss_by_position(results)
    names = {t.name for t in fig.data}
    assert {"memory on", "memory off", "dense"} <= names
    assert "Loss by position" in lab.report_markdown(results)


def test_a_tasks_seeds_share_its_progress_bar():
    """Three seeds of one language model fill a third of the task's bar each, so the bar
    never runs back when the next seed starts."""
    bar = lab.PlanProgress([("lm", "bcmt")], set(), stream=None)
    bar.begin("lm", "bcmt")
    shares = []
    for k in range(3):
        bar.train_part(k, 3)
        for step in (1, 5, 10):
            bar.on_step(None, {"step": step, "total_steps": 10})
            shares.append(bar.fraction)
    assert shares == sorted(shares) and shares[-1] == 1.0 and shares[2] == pytest.approx(1 / 3)
    bar.begin("lm", "dense")                       # the next task starts its bar afresh
    bar.on_step(None, {"step": 5, "total_steps": 10})
    assert bar.fraction == 0.5
