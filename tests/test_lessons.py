"""The notebooks' repeated cells as library helpers: train_live, compare_live, check_learned."""

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from blockmem_lite import preset
from blockmem_lite.checks import CheckFailed
from blockmem_lite.lessons import check_learned, compare_live, train_live
from blockmem_lite.models.base import build_model
from blockmem_lite.train import Callback, History

SEQ = 16


def cfg_of(**overrides):
    return preset("tiny", seq_len=SEQ, **{"steps": 30, "batch_size": 4, "warmup_steps": 2,
                                          "lr": 1e-2, "eval_every": 10, "eval_batches": 2,
                                          **overrides})


def pattern_data(n=48, period=7):
    starts = torch.randint(0, period, (n,), generator=torch.Generator().manual_seed(0))
    seqs = (starts[:, None] + torch.arange(SEQ + 1)) % period + 40           # (n, T + 1)
    return TensorDataset(seqs[:, :-1].clone(), seqs[:, 1:].clone())


def test_train_live_trains_and_its_dashboard_saw_every_step(monkeypatch):
    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")
    cfg = cfg_of()
    history, dashboard = train_live(build_model(cfg), cfg, pattern_data(), pattern_data(8),
                                    title="tiny")
    assert history.step == list(range(1, 31))
    assert dashboard.record.steps == history.step
    check_learned(history, cfg.model.vocab_size, drop=1.0)


def test_compare_live_gives_equal_configs_equal_runs(monkeypatch):
    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")
    cfg = cfg_of(steps=6)
    out = compare_live({"a": cfg, "b": cfg, "bcmt": cfg.replace(arch="bcmt")}, pattern_data())
    histories, models, _ = out
    assert list(histories) == ["a", "b", "bcmt"] and out.models is models
    assert histories["a"].loss == histories["b"].loss                  # same seed, same data
    assert histories["a"].loss != histories["bcmt"].loss
    for p, q in zip(models["a"].parameters(), models["b"].parameters(), strict=True):
        assert torch.equal(p, q)


class StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_step(self, trainer, rec):
        if rec["step"] == self.step:
            raise KeyboardInterrupt


def test_an_interrupt_keeps_the_run_and_skips_the_rest(monkeypatch, capsys):
    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")
    cfg = cfg_of(steps=6)
    out = compare_live({"a": cfg, "b": cfg, "c": cfg}, pattern_data(),
                       callbacks=lambda name, model: [StopAt(3)] if name == "b" else [])
    assert list(out.histories) == ["a", "b"]
    assert out.histories["b"].interrupted and out.histories["b"].step == [1, 2, 3]
    assert "b was interrupted" in capsys.readouterr().out


@pytest.mark.parametrize("runs", [{}, [("a", None)], None])
def test_compare_live_refuses_what_is_not_a_dict_of_runs(runs):
    with pytest.raises(ValueError, match="runs=.* is not allowed"):
        compare_live(runs, pattern_data())


def history_of(loss, val_loss=()):
    return History(step=list(range(1, len(loss) + 1)), loss=list(loss), val_loss=list(val_loss))


def test_check_learned_passes_a_run_that_learned():
    check_learned(history_of([5.0] * 10 + [2.0] * 10, [2.5]), 256, drop=1.0)


@pytest.mark.parametrize("history, message", [
    (history_of([5.0] * 10 + [4.5] * 10, [2.5]), "fell by more"),            # too little
    (history_of([5.0] * 10 + [math.nan] + [2.0] * 9, [2.5]), "finite"),      # a NaN
    (history_of([5.0] * 10 + [2.0] * 10, [5.5]), "beats uniform"),           # val = uniform
    (history_of([]), "at least one step"),
])
def test_check_learned_rejects_each_planted_failure(history, message):
    with pytest.raises(CheckFailed, match=message):
        check_learned(history, 256, drop=1.0)
