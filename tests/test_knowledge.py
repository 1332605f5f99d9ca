"""The knowledge experiment (``knowledge``): exact fact recall, the iso-FLOP baseline at the
recipe's length, the verdict, and the lab's facts task for MoC and its baseline."""

import json

import pytest
import torch

from blockmem_lite import knowledge, lab
from blockmem_lite.config import preset
from blockmem_lite.corpora import load_corpus
from blockmem_lite.lab import run as lab_run
from blockmem_lite.measure import metrics
from blockmem_lite.models.base import ModelOutput

TINY = knowledge.FACTS_SIZES["tiny"]


class Oracle(torch.nn.Module):
    """A "model" whose logits put all mass on the probe's targets, except where told."""

    def __init__(self, probe, wrong_rows=()):
        super().__init__()
        self.probe, self.wrong_rows = probe, set(wrong_rows)
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens):
        rows = [next(i for i in range(len(self.probe)) if torch.equal(self.probe.inputs[i], t))
                for t in tokens]
        logits = torch.zeros(*tokens.shape, 256)
        for n, i in enumerate(rows):
            targets = self.probe.targets[i].clamp(min=0)
            logits[n, torch.arange(tokens.shape[1]), targets] = 1.0
            if i in self.wrong_rows:                  # one wrong byte: the last answer byte
                last = self.probe.meta["answer_positions"][i, -1]
                logits[n, last] = torch.roll(logits[n, last], 1)
        return ModelOutput(logits=logits)


def test_a_fact_counts_only_when_every_value_byte_is_right():
    facts = knowledge.table(3, TINY)
    probe = facts.recall_probe(TINY.seq_len)
    assert knowledge.facts_recalled(Oracle(probe), probe) == 1.0
    assert knowledge.facts_recalled(Oracle(probe, wrong_rows=range(0, 12, 2)), probe) == 0.5
    measured = knowledge.measure(Oracle(probe, wrong_rows=[0]), facts, TINY)
    assert measured["n_facts"] == 12 and measured["recalled"] == pytest.approx(11 / 12)
    assert measured["byte_accuracy"] == pytest.approx(1 - 1 / (12 * 5))
    assert 0 < measured["chance"] < measured["floor"] <= 1


def test_the_baseline_is_iso_flop_at_the_recipe_length():
    cfg = preset("class", arch="moc").model
    recipe = knowledge.FACTS_SIZES["class"]
    moc_cfg, dense = recipe.model_config(cfg), knowledge.baseline_config(cfg, recipe)
    assert dense.arch == "dense" and dense.seq_len == moc_cfg.seq_len == recipe.seq_len
    assert moc_cfg.routing_window <= recipe.seq_len and dense.n_layer > cfg.n_layer
    layer = 24 * cfg.d_model ** 2 + 4 * cfg.d_model * recipe.seq_len
    assert abs(metrics.flops_per_token(dense) - metrics.flops_per_token(moc_cfg)) <= layer


def test_compare_pays_only_beyond_the_noise():
    mine = [{"n_facts": 200, "recalled": 0.9, "floor": 0.3}, {"n_facts": 200, "recalled": 0.5,
                                                            "floor": 0.3}]
    dense = [{"n_facts": 200, "recalled": 0.6}, {"n_facts": 200, "recalled": 0.45}]
    rows = knowledge.compare(mine, dense)
    assert [r["pays"] for r in rows] == [True, False]                 # noise 0.1 at 200 facts
    assert rows[0]["noise"] == pytest.approx(0.1)


def test_the_lab_pretrains_moc_and_its_baseline_on_facts_and_reports_them(tmp_path,
                                                                          monkeypatch):
    run = lab.Lab("tiny", tmp_path, archs=["moc"], corpus=load_corpus("offline"),
                  progress=False)
    assert ("facts", "moc") in run.plan and ("facts", "dense iso-FLOP (moc)") in run.plan
    assert ("facts", "dense") not in run.plan
    results = run.run()
    baseline = results["done"]["facts/dense iso-FLOP (moc)"]
    assert baseline["baseline_of"] == "moc" and baseline["counts"][0]["n_facts"] == 8
    row, = results["knowledge"]
    assert row["entry"] == "moc" and row["baseline"] == "dense iso-FLOP (moc)"
    assert "Knowledge in the weights" in lab.report_markdown(results)
    stored = json.loads((tmp_path / lab.RESULTS_NAME).read_text())
    assert "facts:moc/2" in stored["parts"]
    monkeypatch.setattr(lab_run, "build_model", lambda cfg: pytest.fail("retrained"))
    again = lab.Lab("tiny", tmp_path, archs=["moc"], corpus=load_corpus("offline"),
                    progress=False).run()
    assert again["knowledge"] == results["knowledge"]
