"""Nothing a user trained is lost (issue 48): the final state is rescued to the next folder
whatever the first one's fault, the history beside a checkpoint never runs past its step, and
broken checkpoints, lock paths and models are refused with one clear line."""

import errno
import json
import os
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from blockmem_lite import build_model, preset
from blockmem_lite import checkpoints as ck
from blockmem_lite.train import CheckpointNotSaved, Trainer, resume
from blockmem_lite.train.resume import RESCUE_ENV


def _data(n=16, t=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, t + 1), generator=g)
    return TensorDataset(x[:, :-1].clone(), x[:, 1:].clone())


def _trainer(folder, callbacks=(), **train):
    cfg = preset("tiny", seq_len=16, **{"steps": 6, "batch_size": 4, "warmup_steps": 1,
                                        "eval_every": 100, "checkpoint_dir": str(folder),
                                        **train})
    torch.manual_seed(0)
    return Trainer(build_model(cfg), cfg, _data(), callbacks=list(callbacks))


def _failing_inside(folder: Path, code=errno.ENOSPC):
    """A torch.save that fails with OSError(``code``) for files inside ``folder`` only."""
    real = torch.save

    def save(obj, f, *a, **kw):
        if str(folder) in str(getattr(f, "name", f)):
            raise OSError(code, os.strerror(code), str(getattr(f, "name", f)))
        return real(obj, f, *a, **kw)
    return save


@pytest.fixture
def disks(tmp_path, monkeypatch):
    """``disk`` (where --out lives, full) and ``other`` (the temp folder, another
    filesystem with room); the home folder is ``disk`` too, so it is never chosen."""
    disk, other = tmp_path / "disk", tmp_path / "other"
    disk.mkdir()
    other.mkdir()
    monkeypatch.setattr(resume, "filesystem_of", raising=False,
                        value=lambda p: 2 if str(Path(p).resolve()).startswith(str(other)) else 1)
    monkeypatch.setattr(resume.tempfile, "gettempdir", lambda: str(other))
    monkeypatch.setattr(resume.Path, "home", classmethod(lambda cls: disk))
    monkeypatch.setattr(torch, "save", _failing_inside(disk))
    return disk, other


def _stopped_on_a_full_disk(out: Path) -> Trainer:
    trainer = _trainer(out)
    with pytest.raises(CheckpointNotSaved):
        trainer.fit()
    return trainer


# --- 1. a set BLOCKMEM_RESCUE_DIR is tried first, then the usual fallbacks --------------------

@pytest.mark.parametrize("where", ["a typo", "the same full disk", "a full disk"])
def test_1_a_rescue_dir_that_fails_falls_back_to_the_temp_folder(disks, monkeypatch, where):
    disk, other = disks
    chosen = {"a typo": disk / "no-such-folder", "the same full disk": disk / "rescue",
              "a full disk": disk / "small"}[where]
    if where != "a typo":
        chosen.mkdir()
    if where == "a full disk":
        real = resume.shutil.disk_usage
        monkeypatch.setattr(resume.shutil, "disk_usage", lambda p: type(
            "U", (), {"free": 10 if Path(p) == chosen else real(p).free})())
    monkeypatch.setenv(RESCUE_ENV, str(chosen))
    trainer = _stopped_on_a_full_disk(disk / "out")
    with pytest.warns(UserWarning, match=re.escape(f"as {RESCUE_ENV}={chosen}: it ")):
        rescued = trainer.rescue_checkpoint()
    assert rescued is not None and rescued.parent.parent == other
    assert torch.load(rescued, weights_only=True)["step"] == 6


def test_1_when_every_folder_fails_the_message_names_each_and_never_advises_a_set_variable(
        disks, monkeypatch):
    disk, other = disks
    monkeypatch.setattr(resume, "filesystem_of", lambda p: 1)      # the temp folder too
    monkeypatch.setenv(RESCUE_ENV, str(disk / "typo"))
    trainer = _stopped_on_a_full_disk(disk / "out")
    assert trainer.rescue_checkpoint() is None
    problem = trainer.rescue_problem
    assert f"{RESCUE_ENV}={disk / 'typo'}: it does not exist" in problem, problem
    assert f"the temp folder {other}: it is on the same full disk as {disk / 'out'}" in problem
    assert f"the home folder {disk}: it is on the same full disk" in problem
    assert f"set {RESCUE_ENV}" not in problem
    monkeypatch.delenv(RESCUE_ENV)
    assert trainer.rescue_checkpoint() is None
    assert f"set {RESCUE_ENV} to a writable folder on another disk" in trainer.rescue_problem


# --- 2. any OSError writing a rescue candidate moves on to the next ---------------------------

@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOENT, errno.ENOTDIR,
                                  errno.ENOSPC])
def test_2_a_rescue_folder_that_cannot_be_written_moves_on_to_the_next(disks, monkeypatch,
                                                                      tmp_path, code):
    disk, other = disks
    chosen = tmp_path / "read-only"
    chosen.mkdir()
    monkeypatch.setenv(RESCUE_ENV, str(chosen))
    trainer = _stopped_on_a_full_disk(disk / "out")
    monkeypatch.setattr(torch, "save", _failing_inside(chosen, code))    # and the full disk
    with pytest.warns(UserWarning, match=re.escape(f"as {RESCUE_ENV}={chosen}: it cannot be "
                                                   f"written ({os.strerror(code)})")):
        rescued = trainer.rescue_checkpoint()
    assert rescued is not None and rescued.parent.parent == other
    assert not list(chosen.glob(".checkpoint.pt.*.tmp"))


# --- 3. the history beside a checkpoint never runs past its step ------------------------------

def test_3_the_checkpoint_history_ends_at_the_last_checkpoint_written(tmp_path, monkeypatch):
    real, calls = torch.save, [0]

    def save(obj, f, *a, **kw):                  # step 2 is saved, 4 and 6 find a full disk
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *a, **kw)
    monkeypatch.setattr(torch, "save", save)
    trainer = _trainer(tmp_path, checkpoint_every=2)
    with pytest.warns(UserWarning), pytest.raises(CheckpointNotSaved):
        trainer.fit()
    assert trainer.history.step[-1] == 6                          # still in memory
    assert trainer.checkpoint_history.step == [1, 2]              # what checkpoint.pt holds


class _BreakWeights:
    """Sets a weight to NaN after step ``at``, so the next step fails with nothing saved."""

    def __init__(self, at):
        self.at = at

    def on_step(self, trainer, rec):
        if rec["step"] == self.at:
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("nan"))


def test_3_a_resumed_run_that_fails_keeps_the_restored_checkpoint_history(tmp_path):
    _trainer(tmp_path, steps=2).fit()
    resumed = Trainer.from_checkpoint(tmp_path / "checkpoint.pt", _data(),
                                      callbacks=[_BreakWeights(at=3)])
    with pytest.raises(FloatingPointError, match="step 4/6"):
        resumed.fit(6)
    assert resumed.history.step[-1] == 3
    assert resumed.checkpoint_history.step == [1, 2]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 2


def test_3_a_resume_cuts_a_history_file_that_runs_past_the_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    trainer = _trainer(tmp_path, steps=2)
    trainer.fit()
    at_step_2 = path.read_bytes()
    trainer.fit(5)
    trainer.history.save_json(tmp_path / "history.json")
    path.write_bytes(at_step_2)                  # a later save was lost: history.json is ahead
    with pytest.warns(UserWarning, match=r"history.json ran to step 5, past the checkpoint's "
                                         r"step 2"):
        resumed = Trainer.from_checkpoint(path, _data())
    assert json.loads((tmp_path / "history.json").read_text())["step"] == [1, 2]
    assert resumed.history.step == [1, 2]


# --- 4. checkpoints with a bad field or a non-finite optimizer state ---------------------------

@pytest.mark.parametrize("field,value", [("step", "ten"), ("epoch", -1), ("position", 1.5),
                                         ("history", [1, 2])])
def test_4_a_checkpoint_field_of_the_wrong_kind_names_the_file_and_the_field(tmp_path, field,
                                                                            value):
    _trainer(tmp_path, steps=2).fit()
    path = tmp_path / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=True)
    ckpt[field] = value
    torch.save(ckpt, path)
    with pytest.raises(ck.CheckpointError, match=re.escape(f"checkpoint {path} is not usable: "
                                                           f"its '{field}' is {value!r}, not a")):
        Trainer.from_checkpoint(path, _data())


def test_4_a_checkpoint_with_a_non_finite_optimizer_state_is_refused_on_load(tmp_path):
    _trainer(tmp_path, steps=2).fit()
    path = tmp_path / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["optimizer"]["state"][0]["exp_avg"].fill_(float("nan"))
    torch.save(ckpt, path)
    with pytest.raises(ck.CheckpointError, match=rf"checkpoint {path} is not usable: its "
                                                 r"optimizer state is not finite \(entry "
                                                 r"state\[0\]\['exp_avg'\]"):
        Trainer.from_checkpoint(path, _data())


def test_4_the_command_refuses_a_non_finite_optimizer_state_before_reading_text(
        tmp_path, monkeypatch, capsys):
    from blockmem_lite.tools import train_command

    args = ["--preset", "tiny", "--set", "steps=2", "--out", str(tmp_path)]
    assert train_command.train_main(args) == 0
    path = tmp_path / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["optimizer"]["state"][0]["exp_avg"].fill_(float("inf"))
    torch.save(ckpt, path)
    capsys.readouterr()

    def no_text(*args, **kwargs):
        raise AssertionError("the corpus was read before the checkpoint was checked")
    monkeypatch.setattr(train_command, "load_corpus", no_text)
    assert train_command.train_main([*args, "--resume"]) == 2
    assert "its optimizer state is not finite" in capsys.readouterr().err


# --- 5. a run lock whose path is a folder ----------------------------------------------------

def test_5_a_run_lock_path_that_is_a_folder_is_one_clear_error(tmp_path):
    (tmp_path / ck.LOCK_NAME).mkdir()
    message = rf"{tmp_path / ck.LOCK_NAME} is a folder, not a run lock file"
    with pytest.raises(ValueError, match=message):
        ck.RunLock(tmp_path).check()
    with pytest.raises(ValueError, match=message):
        _trainer(tmp_path).fit()


# --- 6. a model born with a non-finite weight -----------------------------------------------

def test_6_a_model_born_with_a_nan_weight_is_refused_before_the_first_step(tmp_path):
    trainer = _trainer(tmp_path)
    name, weight = list(trainer.model.named_parameters())[3]
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match=rf"its parameter {name!r} is not finite before "
                                         r"training \(1 NaN and 0 inf values"):
        trainer.fit()
    assert trainer.step == 0 and not (tmp_path / "checkpoint.pt").exists()
