"""Trainer: learning, schedule, clipping, callbacks, interrupt, checkpoints, exact resume, CLI."""

import dataclasses
import json
import math
import os
import signal
import sys
from itertools import pairwise

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from blockmem_lite import build_model, preset
from blockmem_lite.runtime import pick_device
from blockmem_lite.tools.train_command import train_main as main
from blockmem_lite.train import (
    EVAL_KEYS,
    STEP_KEYS,
    Callback,
    History,
    Trainer,
    evaluate,
    lr_at,
)
from blockmem_lite.train.callbacks import GradientGroups
from blockmem_lite.units import format_progress

SEQ = 16
CONTRACT_STEP_KEYS = {"step", "total_steps", "loss", "ce_loss", "aux_loss", "lr", "tokens_per_s",
                      "memory_bytes", "memory_method", "elapsed_s", "eta_s"}
CONTRACT_EVAL_KEYS = {"step", "total_steps", "val_loss", "elapsed_s"}


def run_cfg(**train):
    """Tiny model (T=16) and a quiet, fast training config."""
    return preset("tiny", seq_len=SEQ, **{"steps": 12, "batch_size": 4, "warmup_steps": 2,
                                          "eval_every": 4, "eval_batches": 2, **train})


def pattern_data(n=24, period=7, seed=0):
    """Windows of a repeating pattern with random phase: next token is a function of the last."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, period, (n,), generator=g)
    seqs = (starts[:, None] + torch.arange(SEQ + 1)) % period + 40        # (n, T + 1)
    return TensorDataset(seqs[:, :-1].clone(), seqs[:, 1:].clone())


def random_data(n=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, 256, (n, SEQ + 1), generator=g)
    return TensorDataset(seqs[:, :-1].clone(), seqs[:, 1:].clone())


class Recorder(Callback):
    def __init__(self, stop_at=None):
        self.steps, self.evals, self.ends, self.stop_at = [], [], [], stop_at

    def on_step(self, trainer, rec):
        self.steps.append(dict(rec))
        if rec["step"] == self.stop_at:
            raise KeyboardInterrupt

    def on_eval(self, trainer, rec):
        self.evals.append(dict(rec))

    def on_end(self, trainer, history):
        self.ends.append(history)


def make_trainer(cfg, data=None, val=None, callbacks=None):
    torch.manual_seed(0)
    return Trainer(build_model(cfg), cfg, data if data is not None else random_data(),
                   val, callbacks=callbacks if callbacks is not None else [Recorder()])


def test_loss_goes_down_on_a_learnable_pattern():
    cfg = run_cfg(steps=40, lr=1e-2, warmup_steps=4)
    history = make_trainer(cfg, pattern_data(64)).fit()
    first, last = sum(history.loss[:3]) / 3, sum(history.loss[-3:]) / 3
    assert first > 4.0                       # about ln(256) at the start
    assert last < 0.25 * first, (first, last)


def test_lr_schedule_warmup_peak_and_cosine_end():
    cfg = run_cfg(steps=50, lr=1e-3, warmup_steps=5, min_lr_ratio=0.1).train
    assert lr_at(0, cfg) == pytest.approx(1e-3 / 5)
    assert lr_at(4, cfg) == pytest.approx(1e-3)                            # peak ends warmup
    assert lr_at(5, cfg) == pytest.approx(1e-3)
    assert lr_at(49, cfg) == pytest.approx(1e-4)                           # lr * min_lr_ratio
    assert lr_at(200, cfg) == pytest.approx(1e-4)
    middle = 5 + (49 - 5) / 2
    assert lr_at(int(middle), cfg) == pytest.approx(0.55e-3)
    decay = [lr_at(s, cfg) for s in range(5, 50)]
    assert all(a >= b for a, b in pairwise(decay))
    warm = [lr_at(s, cfg) for s in range(5)]
    assert all(a < b for a, b in pairwise(warm))


def test_history_lr_follows_the_schedule():
    cfg = run_cfg(steps=8)
    history = make_trainer(cfg).fit()
    assert history.lr == pytest.approx([lr_at(s, cfg.train) for s in range(8)])


def test_weight_decay_only_on_matrices():
    trainer = make_trainer(run_cfg(weight_decay=0.3))
    for group in trainer.optimizer.param_groups:
        dims = {p.dim() for p in group["params"]}
        assert (dims == {1}) if group["weight_decay"] == 0 else (min(dims) >= 2)
    assert {g["weight_decay"] for g in trainer.optimizer.param_groups} == {0.0, 0.3}


class GradNormProbe(Callback):
    """Global norm of the gradients the optimizer actually used (after clipping)."""

    def __init__(self):
        self.used, self.reported = [], []

    def on_step(self, trainer, rec):
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        self.used.append(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads])).item())
        self.reported.append(rec["grad_norm"])


def test_grad_clipping_bounds_the_global_norm():
    clip = 0.05
    probe = GradNormProbe()
    make_trainer(run_cfg(steps=4, grad_clip=clip), callbacks=[probe]).fit()
    assert min(probe.reported) > clip                      # clipping had work to do
    assert max(probe.used) <= clip * (1 + 1e-4)
    free = GradNormProbe()
    make_trainer(run_cfg(steps=4, grad_clip=0.0), callbacks=[free]).fit()
    assert free.used == pytest.approx(free.reported, rel=1e-5)
    assert max(free.used) > clip


@pytest.mark.parametrize("clip", [0.05, 0.0])
def test_gradient_groups_split_the_global_norm_before_clipping(clip):
    cfg = run_cfg(arch="bcmt", steps=3, grad_clip=clip)
    torch.manual_seed(0)
    model = build_model(cfg)
    groups = GradientGroups(model, clip)
    history = Trainer(model, cfg, random_data(), callbacks=[groups]).fit()
    assert {"memory_proj.weight", "gate.bias", "attn.qkv.weight", "embed.weight"} <= set(groups.norms)
    assert all(len(norms) == 3 for norms in groups.norms.values())
    total = [math.sqrt(sum(norms[i] ** 2 for norms in groups.norms.values())) for i in range(3)]
    assert total == pytest.approx(history.grad_norm, rel=1e-4)      # before clipping
    if clip:
        assert min(history.grad_norm) > clip                         # the clip had work to do


def test_the_memory_reading_measures_the_model_not_the_process():
    """A CPU step's memory is its own tensors: the same run reads the same after a big
    allocation in the process, and it adds up weights, gradients, Adam's two moments and
    the activations saved for backward, which grow with the batch."""
    def memory(batch_size, steps=2):
        rec = Recorder()
        make_trainer(run_cfg(steps=steps, batch_size=batch_size, eval_every=steps),
                     callbacks=[rec]).fit()
        return rec.steps[-1]["memory_bytes"]

    first = memory(4)
    ballast = torch.ones(64 * 2**20, dtype=torch.uint8) + 1          # 64 MiB, touched
    assert memory(4) == first and ballast.sum() > 0
    model = build_model(run_cfg())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert first > 4 * weights                  # weights + gradients + two moments + saved
    assert memory(8) - weights * 4 > 1.8 * (first - weights * 4)     # activations ~ batch


def test_callbacks_receive_records_with_the_contract_keys():
    rec = Recorder()

    class EndOnly:
        def __init__(self):
            self.calls = 0

        def on_end(self, trainer, history):
            self.calls += 1

    end_only = EndOnly()
    history = make_trainer(run_cfg(steps=10), val=random_data(8, seed=5),
                           callbacks=[rec, end_only]).fit()
    assert [r["step"] for r in rec.steps] == list(range(1, 11))
    for r in rec.steps:
        assert CONTRACT_STEP_KEYS <= set(r) == set(STEP_KEYS)
        assert r["total_steps"] == 10 and r["tokens_per_s"] > 0 and r["memory_bytes"] > 0
        assert r["memory_method"] == "model_tensors" and r["eta_s"] >= 0
    assert rec.steps[-1]["eta_s"] == 0
    assert [r["step"] for r in rec.evals] == [4, 8, 10]      # eval_every=4 and at the end
    for r in rec.evals:
        assert CONTRACT_EVAL_KEYS <= set(r) == set(EVAL_KEYS)
    assert rec.ends == [history] and end_only.calls == 1
    assert history.val_step == [4, 8, 10] and len(history.loss) == 10
    elapsed = history.elapsed_s
    assert all(a <= b for a, b in pairwise(elapsed))


def test_callback_without_methods_is_rejected():
    with pytest.raises(ValueError, match="on_step, on_eval, on_end"):
        make_trainer(run_cfg(), callbacks=[object()])


def test_interrupt_keeps_model_and_history_and_writes_a_checkpoint(tmp_path, capsys):
    rec = Recorder(stop_at=3)
    trainer = make_trainer(run_cfg(checkpoint_dir=str(tmp_path)), callbacks=[rec])
    history = trainer.fit()
    assert history.interrupted and trainer.step == 3 and len(history.loss) == 3
    assert rec.ends == [history]
    path = tmp_path / "checkpoint.pt"
    assert f"stopped by SIGINT at step 3/12; model and history kept; checkpoint: {path}" in \
        capsys.readouterr().out
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["step"] == 3 and ckpt["history"]["interrupted"] is True
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(ckpt["model"][name], value)
    assert not list(tmp_path.glob("*.tmp"))                  # atomic write left no temp file


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_stop_button_sigint_finishes_the_current_step_then_stops():
    trainer = make_trainer(run_cfg())
    calls = []

    def press_stop_in_third_forward(module, args):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGINT)

    trainer.model.register_forward_pre_hook(press_stop_in_third_forward)
    history = trainer.fit()
    assert history.interrupted and trainer.step == 3 and len(history.loss) == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_checkpoint_loads_with_weights_only(tmp_path):
    cfg = run_cfg(steps=3, dropout=0.1)
    trainer = make_trainer(cfg)
    trainer.fit()
    path = trainer.save_checkpoint(tmp_path / "sub" / "ck.pt")
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["step"] == 3 and (ckpt["epoch"], ckpt["position"]) == (0, 3)
    assert ckpt["run_config"]["model"]["dropout"] == 0.1
    assert isinstance(ckpt["rng"]["torch"], torch.Tensor)
    assert len(ckpt["rng"]["python"]["state"]) == 625
    assert History.from_dict(ckpt["history"]).loss == trainer.history.loss


def test_load_checkpoint_restores_an_existing_trainer(tmp_path):
    cfg = run_cfg(steps=4)
    trained = make_trainer(cfg)
    trained.fit()
    path = trained.save_checkpoint(tmp_path / "ck.pt")
    fresh = make_trainer(cfg)
    assert fresh.step == 0
    fresh.load_checkpoint(path)
    assert fresh.step == 4 and fresh.history.loss == trained.history.loss
    for a, b in zip(fresh.model.parameters(), trained.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_save_checkpoint_without_a_path_or_dir_raises():
    with pytest.raises(ValueError, match="checkpoint_dir"):
        make_trainer(run_cfg()).save_checkpoint()


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_resume_after_interrupt_reproduces_the_uninterrupted_curve(tmp_path, dropout):
    # 24 examples / batch 4 = 6 batches per epoch: 14 steps cross two epoch boundaries
    cfg = run_cfg(steps=14, dropout=dropout, checkpoint_dir=str(tmp_path))
    data, val = random_data(), random_data(8, seed=7)
    full = make_trainer(cfg, data, val).fit()

    stopped = make_trainer(cfg, data, val, callbacks=[Recorder(stop_at=5)]).fit()
    assert stopped.interrupted and len(stopped.loss) == 5
    torch.manual_seed(1234)                      # a fresh process would have another RNG state
    resumed = Trainer.from_checkpoint(tmp_path / "checkpoint.pt", data, val,
                                      callbacks=[Recorder()])
    assert resumed.step == 5 and resumed.model is not None
    history = resumed.fit()
    assert not history.interrupted and history.step == list(range(1, 15))
    assert history.loss == pytest.approx(full.loss, abs=1e-6, rel=0)
    assert history.val_step == full.val_step
    assert history.val_loss == pytest.approx(full.val_loss, abs=1e-6, rel=0)


def test_dropout_resume_without_rng_restore_would_differ(tmp_path):
    """The exact-resume test above has teeth: dropout draws differ if the RNG is not restored."""
    cfg = run_cfg(steps=8, dropout=0.2, checkpoint_dir=str(tmp_path))
    data = random_data()
    full = make_trainer(cfg, data).fit()
    make_trainer(cfg, data, callbacks=[Recorder(stop_at=4)]).fit()
    resumed = Trainer.from_checkpoint(tmp_path / "checkpoint.pt", data, callbacks=[Recorder()])
    torch.manual_seed(99)                        # clobber the restored RNG state
    history = resumed.fit()
    assert history.loss[:4] == full.loss[:4]
    assert max(abs(a - b) for a, b in zip(history.loss[4:], full.loss[4:], strict=True)) > 1e-4


def test_fit_again_after_a_stop_continues_the_same_curve():
    """The notebook flow: press stop, then run the cell again (same Trainer, no checkpoint)."""
    cfg = run_cfg(steps=10, dropout=0.1)
    full = make_trainer(cfg).fit()
    trainer = make_trainer(cfg, callbacks=[Recorder(stop_at=4)])
    torch.manual_seed(123)                       # fit seeds the run itself with cfg.seed
    assert trainer.fit().interrupted
    history = trainer.fit()
    assert not history.interrupted and history.loss == full.loss
    assert len(trainer.fit().loss) == 10         # already done: nothing more to train


def test_interrupt_inside_a_step_puts_the_batch_back():
    """A second press of stop lands mid-step: the unfinished step is not counted, its batch
    is handed out again, and training continues on the same curve."""
    cfg = run_cfg(steps=10)
    full = make_trainer(cfg).fit()
    trainer = make_trainer(cfg)
    calls = []

    def interrupt_fifth_forward(module, args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt

    hook = trainer.model.register_forward_pre_hook(interrupt_fifth_forward)
    assert trainer.fit().interrupted and trainer.step == 4
    hook.remove()
    assert trainer.fit().loss == full.loss


def test_dataloader_and_taskbatch_inputs_give_the_same_batches():
    cfg = run_cfg(steps=6)
    data = random_data()

    class TaskLike:
        def dataset(self):
            return data

    base = make_trainer(cfg, data).fit().loss
    loader = make_trainer(cfg, DataLoader(data, batch_size=7, shuffle=True)).fit().loss
    task = make_trainer(cfg, TaskLike()).fit().loss
    assert loader == base and task == base


def test_worker_processes_give_the_same_batches():
    cfg = run_cfg(steps=7)                       # crosses the epoch boundary at step 6
    base = make_trainer(cfg).fit().loss
    workers = make_trainer(dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, num_workers=1))).fit().loss
    assert workers == base


@pytest.mark.parametrize("bad, match", [
    (42, "train_data of type int is not allowed"),
    ("some text", "train_data of type str is not allowed"),
    (torch.zeros(4, 17, dtype=torch.long), "TensorDataset"),
    ([torch.zeros(16, dtype=torch.long)] * 8, r"train_data items of the form Tensor"),
    ([(torch.zeros(16), torch.zeros(16))] * 8, "integer tensors"),
])
def test_bad_train_data_raises_a_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        make_trainer(run_cfg(), bad)


def test_too_few_examples_for_a_batch_raises():
    with pytest.raises(ValueError, match="batch_size=4 is not allowed"):
        make_trainer(run_cfg(), random_data(3))


def test_evaluate_restores_train_mode_and_averages_token_ce():
    cfg = run_cfg()
    torch.manual_seed(0)
    model = build_model(cfg)
    data = random_data(6)
    model.train()
    value = evaluate(model, data, max_batches=None, device="cpu", batch_size=4)
    assert model.training
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        expected = model(x, y).ce_loss.item()      # all 6 examples, every target counted
    assert value == pytest.approx(expected, rel=1e-5)
    assert not model.training
    one_batch = evaluate(model, DataLoader(data, batch_size=2), max_batches=1, device="cpu")
    with torch.no_grad():
        assert one_batch == pytest.approx(model(x[:2], y[:2]).ce_loss.item(), rel=1e-5)


def test_trainer_evaluate_needs_val_data():
    with pytest.raises(ValueError, match="val_data"):
        make_trainer(run_cfg()).evaluate()


def test_auto_device_and_precision():
    trainer = make_trainer(run_cfg())
    assert trainer.device == pick_device("auto")
    if not torch.cuda.is_available() and not torch.backends.mps.is_available():
        assert trainer.device.type == "cpu"
        with pytest.raises(ValueError, match="bf16"):
            make_trainer(run_cfg(precision="bf16"))


def test_non_finite_loss_saves_the_last_good_state(tmp_path):
    class PoisonOutput(Callback):           # the loss goes NaN, the weights stay finite
        def on_step(self, trainer, rec):
            if rec["step"] == 2:
                trainer.model.head.register_forward_hook(lambda m, i, out: out * float("nan"))

    trainer = make_trainer(run_cfg(checkpoint_dir=str(tmp_path)), callbacks=[PoisonOutput()])
    with pytest.raises(FloatingPointError, match=r"at step 3/12.*last good state was saved.*"
                                                 r"lower lr"):
        trainer.fit()
    assert trainer.step == 2
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 2


def test_non_finite_weights_are_never_saved_as_a_good_state(tmp_path):
    class PoisonWeights(Callback):
        def on_step(self, trainer, rec):
            if rec["step"] == 3:
                with torch.no_grad():
                    trainer.model.head.weight.fill_(float("nan"))

    trainer = make_trainer(run_cfg(checkpoint_dir=str(tmp_path), checkpoint_every=2),
                           callbacks=[PoisonWeights()])
    with pytest.raises(FloatingPointError, match=r"at step 4/12.*no longer finite \(1/\d+ "
                                                 r"tensors.*checkpoint of step 2 .*last good"):
        trainer.fit()
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 2
    with pytest.raises(FloatingPointError, match="not saving a checkpoint at step 3: 1/"):
        trainer.save_checkpoint()


def test_history_round_trips_through_dict_and_json(tmp_path):
    history = make_trainer(run_cfg(steps=3)).fit()
    assert History.from_dict(history.to_dict()) == history
    path = history.save_json(tmp_path / "h.json")
    assert History.from_dict(json.loads(path.read_text())) == history
    assert History.from_dict({"loss": [1.0], "future_field": 3}).loss == [1.0]


def test_format_progress_lines():
    line = format_progress({"step": 7, "total_steps": 60, "loss": 2.34567, "lr": 3e-3,
                            "tokens_per_s": 12345.0, "memory_bytes": 3.2e8,
                            "memory_method": "process_rss", "elapsed_s": 75.0, "eta_s": 5.0})
    assert line == ("step  7/60 | loss 2.3457 | lr 3.00e-03 | 12.3k tok/s | mem 305 MiB RSS | "
                    "1:15 elapsed, about 5 s left")
    assert format_progress({"step": 20, "total_steps": 60, "val_loss": 1.5}) == \
        "step 20/60 | val_loss 1.5000"
    unmeasured = format_progress({"step": 1, "total_steps": 2, "tokens_per_s": None,
                                  "memory_bytes": None, "memory_method": "", "eta_s": None})
    assert unmeasured == "step 1/2 | ? tok/s | mem - | time left unknown"


def test_prints_throttled_progress_only_without_callbacks(capsys):
    cfg = run_cfg(steps=12, log_every=1)
    torch.manual_seed(0)
    Trainer(build_model(cfg), cfg, random_data()).fit()
    lines = capsys.readouterr().out.strip().splitlines()
    # first step, then at most one line per 2 s, then the final step
    assert lines[0].startswith("step  1/12") and lines[-1].startswith("step 12/12")
    assert len(lines) < 12
    trainer = Trainer(build_model(cfg), cfg, random_data())
    trainer.fit(steps=3)
    trainer.fit(steps=12)                        # each fit shows its first step
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line[:10] for line in lines[:3]] == ["step 1/3 |", "step 3/3 |", "step  4/12"]
    make_trainer(cfg, callbacks=[Recorder()]).fit()
    assert capsys.readouterr().out == ""


def test_fit_rejects_bad_steps():
    with pytest.raises(ValueError, match="steps=0"):
        make_trainer(run_cfg()).fit(steps=0)


def test_lr_values_are_finite_everywhere():
    cfg = run_cfg(steps=1, warmup_steps=0).train
    assert math.isfinite(lr_at(0, cfg)) and lr_at(0, cfg) == pytest.approx(cfg.lr)


# --- command line ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--preset", "huge"], "invalid choice"),
    (["--preset", "tiny", "--set", "bogus=1"], "bogus=1 is not allowed"),
    (["--preset", "tiny", "--set", "lr"], "expected KEY=VALUE"),
    (["--preset", "tiny", "--steps", "0"], "steps=0 is not allowed"),
    (["--preset", "tiny", "--set", "block_size=8"], "an option of bcmt, honly"),
    (["--preset", "tiny", "--set", "tokenizer=no-such/tokenizer"],
     "not in the local Hugging Face cache"),
])
def test_cli_rejects_bad_arguments(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_cli_resume_needs_a_checkpoint(tmp_path, capsys):
    assert main(["--preset", "tiny", "--out", str(tmp_path), "--resume"]) == 2
    assert "--resume needs" in capsys.readouterr().err


def test_cli_trains_writes_outputs_and_resumes(tmp_path, capsys):
    pytest.importorskip("blockmem_lite.corpora")
    out = tmp_path / "run"
    assert main(["--preset", "tiny", "--steps", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "final val loss" in text and "sample:" in text
    assert json.loads((out / "history.json").read_text())["step"] == [1, 2, 3]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 3
    assert main(["--preset", "tiny", "--steps", "3", "--out", str(out)]) == 2   # no overwrite
    assert main(["--preset", "tiny", "--steps", "5", "--out", str(out), "--resume"]) == 0
    assert json.loads((out / "history.json").read_text())["step"] == [1, 2, 3, 4, 5]
    assert main(["--preset", "tiny", "--out", str(out), "--resume", "--set", "d_model=64"]) == 2
    assert "different settings is not allowed" in capsys.readouterr().err


def test_the_batch_order_follows_the_seed():
    """Each seed shuffles its own way, every epoch anew; the same seed, the same order.
    (A CPU Generator keeps 32 bits of its seed: a 64-bit (seed, epoch) lost the seed.)"""
    from blockmem_lite.train.data import BatchStream

    data = TensorDataset(torch.arange(64)[:, None].repeat(1, 4),            # row i: all i
                         torch.zeros(64, 4, dtype=torch.long))

    def first_batch(seed, epoch=0):
        stream = BatchStream(data, 8, seed)
        stream.seek(epoch, 0)
        return stream.next_batch()[0][:, 0].tolist()

    assert first_batch(0) == first_batch(0)
    assert first_batch(0) != first_batch(1) != first_batch(2)
    assert first_batch(0, epoch=0) != first_batch(0, epoch=1)
