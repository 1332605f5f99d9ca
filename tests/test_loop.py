"""The loop a learner writes (``train.simple.train_simple``): the Trainer's update, step for step."""

import copy
import dataclasses

import pytest
import torch
from torch.utils.data import Dataset

from blockmem_lite.config import TrainConfig, preset
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import seed_everything
from blockmem_lite.train import Callback, Trainer, lr_at
from blockmem_lite.train import simple as loop

STEPS, BATCH = 6, 4


class RecordedRows(Dataset):
    """Random (x, y) windows over 8 of the ids (something to learn in a few steps) that
    remember the order the Trainer asked for them in."""

    def __init__(self, n: int, seq_len: int, vocab: int):
        g = torch.Generator().manual_seed(7)
        self.rows = torch.randint(0, min(8, vocab), (n, seq_len + 1), generator=g)
        self.asked = []

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        self.asked.append(i)
        return self.rows[i, :-1], self.rows[i, 1:]

    def batches_asked(self):
        """The Trainer's batches, in its order: (x, y), each (B, T)."""
        for start in range(0, len(self.asked), BATCH):
            rows = self.rows[self.asked[start:start + BATCH]]
            yield rows[:, :-1], rows[:, 1:]


def _tiny_run():
    run = preset("tiny", arch="dense")
    train = dataclasses.replace(run.train, steps=STEPS, batch_size=BATCH, warmup_steps=2,
                                eval_every=10**9, checkpoint_dir=None, lr=3e-3)
    return run.model, train


def test_the_simple_loop_makes_the_trainers_first_steps_on_the_same_batches():
    model_cfg, train = _tiny_run()
    seed_everything(0)
    model = build_model(model_cfg)
    mine = copy.deepcopy(model)
    data = RecordedRows(64, model_cfg.seq_len, model_cfg.vocab_size)
    trainer = Trainer(model, train, data, callbacks=[Callback()])
    data.asked.clear()                            # building it read one row to check shapes
    history = trainer.fit()
    losses = loop.train_simple(mine, data.batches_asked(), STEPS, train.lr,
                               warmup_steps=train.warmup_steps,
                               min_lr_ratio=train.min_lr_ratio,
                               weight_decay=train.weight_decay, grad_clip=train.grad_clip)
    assert losses == pytest.approx(history.loss, abs=1e-6)
    assert losses[-1] < losses[0]
    for (name, a), b in zip(model.state_dict().items(), mine.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


def test_a_loop_without_zero_grad_is_told_apart():
    """The comparison has teeth: a loop that lets gradients pile up takes other steps."""
    model_cfg, train = _tiny_run()
    seed_everything(0)
    reference = build_model(model_cfg)
    piled = copy.deepcopy(reference)
    rows = RecordedRows(STEPS * BATCH, model_cfg.seq_len, model_cfg.vocab_size).rows
    batches = [(r[:, :-1], r[:, 1:]) for r in rows.split(BATCH)]
    good = loop.train_simple(reference, batches, STEPS, train.lr, grad_clip=0.0)
    optimizer = loop.adamw(piled, train.lr)
    bad = []
    for step, (x, y) in enumerate(batches):       # the planted mistake: no zero_grad
        for group in optimizer.param_groups:
            group["lr"] = loop.cosine_lr(step, STEPS, train.lr)
        loss = piled(x, y).loss
        loss.backward()
        optimizer.step()
        bad.append(loss.item())
    assert good[:2] == pytest.approx(bad[:2], abs=1e-6)     # equal until gradients pile up
    assert good[-1] != pytest.approx(bad[-1], abs=1e-3)


def test_the_schedule_is_the_trainers():
    cfg = TrainConfig(steps=50, lr=1e-3, warmup_steps=5, min_lr_ratio=0.1)
    assert [loop.cosine_lr(s, 50, 1e-3, 5, 0.1) for s in range(60)] == \
        [lr_at(s, cfg) for s in range(60)]
    assert loop.cosine_lr(0, 50, 1e-3, 5) == pytest.approx(2e-4)           # warming up
    assert loop.cosine_lr(49, 50, 1e-3, 5, 0.1) == pytest.approx(1e-4)     # the floor


@pytest.mark.parametrize("kwargs, message", [
    ({"steps": 0}, "steps=0 is not allowed"),
    ({"lr": 0.0}, "lr=0.0 is not allowed"),
    ({"steps": 3, "batches": 2}, "batches ran out after 2 batches: steps=3 needs one batch"),
])
def test_bad_arguments_are_named(kwargs, message):
    model_cfg, _ = _tiny_run()
    model = build_model(model_cfg)
    x = torch.zeros(2, model_cfg.seq_len, dtype=torch.long)
    batches = [(x, x)] * kwargs.pop("batches", 4)
    args = {"steps": 2, "lr": 1e-3, **kwargs}
    with pytest.raises(ValueError, match=message):
        loop.train_simple(model, batches, args["steps"], args["lr"])
