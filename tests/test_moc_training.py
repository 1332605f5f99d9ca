"""MoC with the trainer: learning-rate groups, frozen bank, aux losses and extras in History."""

import json

import pytest
import torch
from torch.utils.data import TensorDataset

from blockmem_lite import build_model, preset
from blockmem_lite.train import History, Trainer, make_optimizer


class Quiet:
    def on_step(self, trainer, rec):
        self.last = rec


def _run_cfg(**kw):
    return preset("tiny", arch="moc", seq_len=16, routing_window=4,
                  **{"steps": 3, "batch_size": 2, "warmup_steps": 1, "eval_every": 10, **kw})


def _data(n=8, seed=0):
    seqs = torch.randint(0, 256, (n, 17), generator=torch.Generator().manual_seed(seed))
    return TensorDataset(seqs[:, :-1].clone(), seqs[:, 1:].clone())


def _trainer(cfg, callbacks=None):
    torch.manual_seed(0)
    return Trainer(build_model(cfg), cfg, _data(), callbacks=callbacks or [Quiet()])


def test_lr_scales_name_the_bank_and_the_memory_parts():
    model = build_model(preset("tiny", arch="moc", bank_lr_scale=3.0, memory_lr_scale=0.5))
    scales = model.lr_scales()
    names = dict(model.named_parameters())
    assert scales.pop("bank") == 3.0
    assert set(scales.values()) == {0.5}
    assert set(scales) == {"blocks.1.norm_m.weight", "blocks.1.router.weight",
                           "blocks.1.router.bias", "blocks.1.route_start",
                           "blocks.1.memory.q.weight", "blocks.1.memory.kv.weight",
                           "blocks.1.memory.out.weight"}
    assert set(scales) <= set(names)


def test_make_optimizer_gives_the_bank_and_memory_layers_their_lr():
    cfg = _run_cfg(bank_lr_scale=3.0, memory_lr_scale=0.5, lr=1e-3)
    model = build_model(cfg)
    optimizer = make_optimizer(model, cfg.train)

    def group_of(param):
        return next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))

    assert group_of(model.bank)["lr"] == pytest.approx(3e-3)
    assert group_of(model.blocks[1].router.weight)["lr"] == pytest.approx(5e-4)
    assert group_of(model.blocks[1].attn.qkv.weight)["lr"] == pytest.approx(1e-3)
    assert group_of(model.blocks[1].router.bias)["weight_decay"] == 0.0


def test_frozen_bank_is_unchanged_by_training_while_the_rest_learns():
    trainer = _trainer(_run_cfg(freeze_bank=True))
    model = trainer.model
    assert not model.bank.requires_grad
    bank, router = model.bank.detach().clone(), model.blocks[1].router.weight.detach().clone()
    trainer.fit(2)
    assert torch.equal(model.bank, bank)
    assert not torch.equal(model.blocks[1].router.weight, router)


def test_unfrozen_bank_is_trained():
    trainer = _trainer(_run_cfg())
    bank = trainer.model.bank.detach().clone()
    trainer.fit(2)
    assert not torch.equal(trainer.model.bank, bank)


def test_extras_reach_the_step_records_and_the_history(tmp_path):
    quiet = Quiet()
    history = _trainer(_run_cfg(lb_coef=0.1, z_coef=0.01), [quiet]).fit()
    assert set(history.extras) == {"lb_loss", "z_loss"}
    assert all(len(v) == 3 for v in history.extras.values())
    assert set(quiet.last["extras"]) == {"lb_loss", "z_loss"}
    for step in range(3):
        lb, z = history.extras["lb_loss"][step], history.extras["z_loss"][step]
        assert history.aux_loss[step] == pytest.approx(0.1 * lb + 0.01 * z, rel=1e-5)
        assert history.loss[step] == pytest.approx(history.ce_loss[step] + history.aux_loss[step],
                                                   rel=1e-5)
    assert History.from_dict(history.to_dict()) == history
    path = history.save_json(tmp_path / "history.json")
    assert History.from_dict(json.loads(path.read_text())).extras == history.extras


def test_a_dense_run_has_empty_extras():
    cfg = preset("tiny", seq_len=16, steps=2, batch_size=2, warmup_steps=1)
    history = _trainer(cfg).fit()
    assert history.extras == {}


def test_bank_gradient_is_bit_reproducible_with_several_threads():
    """The gather's backward must sum repeated chapters in a fixed order (index_select),
    or two identical multi-threaded CPU runs drift apart."""
    from blockmem_lite.models.moc import gather_chapters

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = []
        for _ in range(4):
            torch.manual_seed(0)
            bank = torch.randn(257 * 16, 64, requires_grad=True)
            ids = torch.randint(0, 257, (64, 9))                # many repeats of each chapter
            (gather_chapters(bank, ids, 16) * torch.randn(64, 9 * 16, 64)).sum().backward()
            grads.append(bank.grad)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(grads[0], g) for g in grads[1:])
