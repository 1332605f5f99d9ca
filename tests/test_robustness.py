"""Nothing a user trained is lost and every bad input gets a clear error: one regression test
per finding of the robustness review (issue 11), through the CLI where a user meets them.

`T` below is ``python -m blockmem_lite train``. Subprocess tests start a real process, as a
user's shell does; the rest call the same entry points in process.
"""

import errno
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from blockmem_lite import ModelConfig, TrainConfig, build_model, preset, registry
from blockmem_lite import checkpoints as ck
from blockmem_lite.corpora import load_corpus
from blockmem_lite.tools.bench_command import bench_main
from blockmem_lite.tools.train_command import train_main
from blockmem_lite.train import CheckpointNotSaved, Trainer
from blockmem_lite.train.resume import RESCUE_ENV
from blockmem_lite.train.stopping import StopButton

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--preset", "tiny", "--steps", "6"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _data(n=16, t=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, t + 1), generator=g)
    return TensorDataset(x[:, :-1].clone(), x[:, 1:].clone())


def _trainer(tmp_path, **train):
    cfg = preset("tiny", seq_len=16, **{"steps": 6, "batch_size": 4, "warmup_steps": 1,
                                        "eval_every": 100, "checkpoint_dir": str(tmp_path),
                                        **train})
    torch.manual_seed(0)
    return Trainer(build_model(cfg), cfg, _data(), callbacks=[])


def _cli(*args, timeout=240):
    """Run T in a fresh process; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "blockmem_lite", "train", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "BLOCKMEM_HEADLESS": "1"})


# --- 1. two runs into one folder --------------------------------------------------------------

def test_1_a_second_run_into_a_locked_folder_refuses_naming_the_pid(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ck.LOCK_NAME).write_text(json.dumps(
            {"pid": holder.pid, "host": socket.gethostname(), "started": "now"}))
        assert train_main([*TINY, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"in use by another run (pid {holder.pid}" in err
        assert not (tmp_path / "checkpoint.pt").exists()
    finally:
        holder.kill()


def test_1_a_stale_lock_is_taken_over_and_released(tmp_path):
    (tmp_path / ck.LOCK_NAME).write_text(json.dumps(
        {"pid": _dead_pid(), "host": socket.gethostname(), "started": "long ago"}))
    assert train_main([*TINY, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "checkpoint.pt").exists() and not (tmp_path / ck.LOCK_NAME).exists()


def test_1_the_command_claims_its_folder_once_and_a_busy_one_before_building(tmp_path,
                                                                              monkeypatch):
    taken = []
    real_acquire = ck.RunLock.acquire
    monkeypatch.setattr(ck.RunLock, "acquire",
                        lambda lock: taken.append(lock.folder) or real_acquire(lock))
    assert train_main([*TINY, "--out", str(tmp_path / "run")]) == 0
    assert taken == [tmp_path / "run"]                  # by the fit alone
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "busy").mkdir()
        (tmp_path / "busy" / ck.LOCK_NAME).write_text(json.dumps(
            {"pid": holder.pid, "host": socket.gethostname(), "started": "now"}))
        import blockmem_lite.tools.train_command as command
        monkeypatch.setattr(command, "_trainer", lambda *a: pytest.fail("built a trainer"))
        assert train_main([*TINY, "--out", str(tmp_path / "busy")]) == 2
    finally:
        holder.kill()


def test_1_the_library_trainer_takes_the_lock_too(tmp_path):
    trainer = _trainer(tmp_path)
    with ck.RunLock(tmp_path):                          # nested in one process: fine
        trainer.fit()
    other = {"pid": os.getppid(), "host": socket.gethostname(), "started": "now"}
    (tmp_path / ck.LOCK_NAME).write_text(json.dumps(other))
    with pytest.raises(ck.RunLocked, match=f"pid {os.getppid()}"):
        _trainer(tmp_path).fit()


# --- 2. SIGTERM and SIGHUP stop like the stop button --------------------------------------------

def _default_stop_signals() -> None:
    """In the child: default handlers, whatever the tests inherited (under ``nohup`` SIGHUP is
    ignored, a pytest-xdist worker ignores SIGINT, and the trainer rightly leaves an ignored
    signal ignored)."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def test_2_an_ignored_sighup_stays_ignored(tmp_path):
    """``nohup`` sets SIGHUP to ignored: training must not take it over (and stop on it)."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopButton():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)

@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_2_a_signal_saves_checkpoint_and_history_then_exits(tmp_path, name):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "blockmem_lite", "train", "--preset", "tiny",
                             "--steps", "100000", "--set", "log_every=1", "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_stop_signals)
    for line in proc.stdout:                             # wait until training really runs
        if line.startswith("step"):
            break
    proc.send_signal(getattr(signal, name))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + getattr(signal, name), stderr
    assert f"stopped by {name} at step" in stdout
    history = json.loads((out / "history.json").read_text())
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert history["interrupted"] and history["stopped_by"] == name
    assert saved["step"] == history["step"][-1] >= 1


# --- 3. a bad --out is found before the work --------------------------------------------------

def test_3_an_out_folder_under_a_file_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "afile").write_text("not a folder")
    assert train_main([*TINY, "--out", str(tmp_path / "afile" / "sub")]) == 2
    captured = capsys.readouterr()
    assert "afile is a file, not a folder" in captured.err and "training" not in captured.out


def test_3_an_unwritable_out_folder_is_refused(tmp_path, capsys, monkeypatch):
    def no_write(self, data):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Path, "write_bytes", no_write)
    assert train_main([*TINY, "--out", str(tmp_path / "ro")]) == 2
    assert "cannot be written (Permission denied)" in capsys.readouterr().err


def test_3_low_disk_space_is_warned_about(tmp_path, monkeypatch):
    monkeypatch.setattr(ck.shutil, "disk_usage", lambda p: type("U", (), {"free": 1024})())
    with pytest.warns(UserWarning, match="only 1.0 KiB free .* a checkpoint needs about 10 MiB"):
        ck.prepare_folder(tmp_path, expected_bytes=10 * 2**20)


# --- 4. a full disk ---------------------------------------------------------------------------

def _disk_full_after(calls: int, error):
    """A torch.save that fails from its ``calls``-th call on."""
    real, count = torch.save, [0]

    def save(obj, f, *a, **kw):
        count[0] += 1
        if count[0] >= calls:
            raise error
        return real(obj, f, *a, **kw)
    return save


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("[enforce fail at inline_container.cc] . "
                                                "unexpected pos 64 vs 0")])
def test_4_a_full_disk_keeps_the_run_alive_and_the_old_checkpoint(tmp_path, monkeypatch, error):
    trainer = _trainer(tmp_path, checkpoint_every=2)
    monkeypatch.setattr(torch, "save", _disk_full_after(2, error))   # step 2 saves, 4 fails
    with pytest.warns(UserWarning, match="checkpoint of step 4 was not written: the disk is "
                                         r"full .*free that much space; training goes on"):
        with pytest.raises(CheckpointNotSaved, match=r"step 6 was not written.*still in memory"
                                                     r".*checkpoint on disk \(step 2\) is intact"):
            trainer.fit()
    assert trainer.step == 6 and len(trainer.history.step) == 6    # the run went on
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 2
    assert not list(tmp_path.glob(".checkpoint.pt.*.tmp"))


def test_4_the_cli_stops_cleanly_on_a_full_disk_with_history_saved(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch, "save", _disk_full_after(1, OSError(errno.ENOSPC, "full")))
    assert train_main([*TINY, "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "the disk is full" in err and "free that much space" in err
    assert json.loads((tmp_path / "history.json").read_text())["step"][-1] == 6


def _full_inside(folder: Path):
    """A torch.save that fails with ENOSPC for files inside ``folder`` only."""
    real = torch.save

    def save(obj, f, *a, **kw):
        if str(folder) in str(getattr(f, "name", f)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *a, **kw)
    return save


def test_4_the_final_state_is_rescued_to_another_folder_when_the_disk_is_full(
        tmp_path, monkeypatch, capsys):
    out, rescue = tmp_path / "out", tmp_path / "rescue"
    rescue.mkdir()
    monkeypatch.setattr(torch, "save", _full_inside(out))
    monkeypatch.setenv(RESCUE_ENV, str(rescue))
    assert train_main([*TINY, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"the final state was saved instead to {rescue / 'checkpoint.pt'}" in err, err
    assert torch.load(rescue / "checkpoint.pt", weights_only=False)["step"] == 6
    monkeypatch.setattr(torch, "save", _full_inside(tmp_path / "nowhere"))
    assert f"continue from it with --out {rescue} --resume" in err
    assert train_main([*TINY[:2], "--steps", "8", "--out", str(rescue), "--resume"]) == 0
    assert json.loads((rescue / "history.json").read_text())["step"][-1] == 8


def test_4_without_a_folder_with_room_the_cli_says_the_final_state_is_lost(
        tmp_path, monkeypatch, capsys):
    from blockmem_lite.train import resume

    monkeypatch.setattr(torch, "save", _full_inside(tmp_path))
    monkeypatch.setenv(RESCUE_ENV, str(tmp_path / "not-a-folder"))
    monkeypatch.setattr(resume.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    monkeypatch.setattr(resume.Path, "home", classmethod(lambda cls: tmp_path / "home"))
    assert train_main([*TINY, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "the final state is lost" in err and "not-a-folder" in err
    assert f"set {RESCUE_ENV}" not in err                 # it is set: never advise it


def test_4_a_rescue_folder_on_the_same_full_disk_is_not_chosen(tmp_path, monkeypatch):
    from blockmem_lite.train import resume

    monkeypatch.delenv(RESCUE_ENV, raising=False)
    monkeypatch.setattr(resume.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(resume.Path, "home", classmethod(lambda cls: tmp_path))
    assert all(c.problem for c in resume.rescue_folders(tmp_path / "run", 1024))  # same fs
    (tmp_path / "run").mkdir()
    assert all("same full disk" in c.problem for c in resume.rescue_folders(tmp_path / "run", 1024))


# --- 6. temp files left by killed writers -----------------------------------------------------

def test_6_stale_temp_files_are_removed_and_live_ones_kept(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".checkpoint.pt.{_dead_pid()}.tmp"
        live = tmp_path / f".checkpoint.pt.{holder.pid}.tmp"
        stale.write_bytes(b"half a checkpoint")
        live.write_bytes(b"being written")
        _trainer(tmp_path, steps=1).fit()
        assert not stale.exists() and live.exists()
    finally:
        holder.kill()


# --- 7, 8. non-finite values ------------------------------------------------------------------

def _float_fields():
    yield from ((TrainConfig, f.name) for f in fields(TrainConfig) if f.type == "float")
    yield from ((None, f.name) for f in fields(ModelConfig) if f.type == "float")
    for m in registry.mechanisms():
        yield from ((m.name, f.name) for f in fields(m.options) if f.type == "float")


@pytest.mark.parametrize("owner, name", list(_float_fields()))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_8_every_float_field_rejects_non_finite_values(owner, name, value):
    with pytest.raises(ValueError, match=rf"{name}={value!r} is not allowed: expected a finite"):
        if owner is TrainConfig:
            TrainConfig(**{name: value})
        else:
            preset("tiny", arch=owner or "dense", **{name: value})


@pytest.mark.parametrize("setting", ["lr=inf", "weight_decay=nan", "min_lr_ratio=nan"])
def test_7_the_cli_refuses_non_finite_settings_before_training(tmp_path, capsys, setting):
    assert train_main([*TINY, "--out", str(tmp_path), "--set", setting]) == 2
    assert "is not allowed: expected a finite number" in capsys.readouterr().err
    assert not (tmp_path / "checkpoint.pt").exists()


def test_7_a_non_finite_learning_rate_from_the_schedule_is_caught(tmp_path, monkeypatch):
    import blockmem_lite.train.loop as loop_module

    trainer = _trainer(tmp_path)
    monkeypatch.setattr(loop_module, "lr_at", lambda step, cfg, total: math.nan)
    with pytest.raises(FloatingPointError, match="learning rate of step 1 is nan"):
        trainer.fit()


# --- 9. identical runs are identical; interrupted + resumed == uninterrupted ------------------

def test_9_two_identical_cli_runs_give_identical_histories(tmp_path):
    for name in ("a", "b"):
        assert train_main([*TINY, "--out", str(tmp_path / name)]) == 0
    a, b = (json.loads((tmp_path / n / "history.json").read_text()) for n in ("a", "b"))
    assert a["loss"] == b["loss"] and a["val_loss"] == b["val_loss"]


def test_9_an_interrupted_and_resumed_cli_run_equals_an_uninterrupted_one(tmp_path):
    base = ["--preset", "tiny", "--steps", "40", "--set", "log_every=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = subprocess.run([sys.executable, "-m", "blockmem_lite", "train", *base, "--out",
                            str(tmp_path / "whole")], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=240)
    assert whole.returncode == 0, whole.stderr
    proc = subprocess.Popen([sys.executable, "-m", "blockmem_lite", "train", *base, "--out",
                             str(tmp_path / "split")], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_stop_signals)
    for line in proc.stdout:
        if line.startswith("step"):
            break
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    stopped = json.loads((tmp_path / "split" / "history.json").read_text())["step"][-1]
    assert stopped < 40
    resumed = subprocess.run([sys.executable, "-m", "blockmem_lite", "train", *base, "--out",
                              str(tmp_path / "split"), "--resume"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    a, b = (json.loads((tmp_path / n / "history.json").read_text()) for n in ("whole", "split"))
    assert a["step"] == b["step"] == list(range(1, 41))
    assert a["loss"] == b["loss"] and a["val_loss"] == b["val_loss"]


# --- 10. booleans through --set ---------------------------------------------------------------

@pytest.mark.parametrize("word, memory", [("no", False), ("off", False), ("0", False),
                                          ("False", False), ("yes", True), ("on", True),
                                          ("1", True), ("true", True)])
def test_10_booleans_accept_the_usual_words(tmp_path, word, memory):
    out = tmp_path / word
    assert train_main([*TINY, "--steps", "1", "--arch", "bcmt", "--set", f"memory={word}",
                       "--out", str(out)]) == 0
    stored = torch.load(out / "checkpoint.pt", weights_only=True)
    assert stored["run_config"]["model"]["memory"] is memory
    assert any("memory_proj" in k for k in stored["model"]) is memory


def test_10_other_words_are_an_error(tmp_path, capsys):
    assert train_main([*TINY, "--arch", "bcmt", "--set", "memory=maybe", "--out",
                       str(tmp_path)]) == 2
    assert "memory='maybe' is not allowed: expected true/false, yes/no, on/off or 1/0" in \
        capsys.readouterr().err


# --- 11. num_workers --------------------------------------------------------------------------

def test_11_the_worker_count_warned_about_is_the_one_started(tmp_path):
    spare = max((os.cpu_count() or 1) - 1, 0)
    with pytest.warns(UserWarning, match=f"num_workers=64 is more than .*using {spare}"):
        trainer = _trainer(tmp_path, num_workers=64)
    assert trainer._stream.num_workers == spare


# --- 12. a moved checkpoint keeps saving beside itself ----------------------------------------

def test_12_from_checkpoint_writes_beside_the_loaded_file(tmp_path):
    first = _trainer(tmp_path / "run1", steps=2)
    first.fit()
    moved = tmp_path / "moved" / "run1"
    moved.parent.mkdir()
    (tmp_path / "run1").rename(moved)
    resumed = Trainer.from_checkpoint(moved / "checkpoint.pt", _data(), callbacks=[])
    resumed.fit(4)
    assert torch.load(moved / "checkpoint.pt", weights_only=True)["step"] == 4
    assert not (tmp_path / "run1").exists()
    elsewhere = Trainer.from_checkpoint(moved / "checkpoint.pt", _data(), callbacks=[],
                                        checkpoint_dir=str(tmp_path / "copy"))
    assert elsewhere.checkpoint_path() == tmp_path / "copy" / "checkpoint.pt"


# --- 13. --resume that changes the run --------------------------------------------------------

def test_13_resume_shows_what_differs_and_refuses(tmp_path, capsys):
    assert train_main([*TINY, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert train_main([*TINY, "--steps", "9", "--out", str(tmp_path), "--resume", "--set",
                       "lr=0.01", "--set", "batch_size=2"]) == 2
    err = capsys.readouterr().err
    assert "batch_size=4 (checkpoint) vs 2 (this command)" in err and "lr=0.003" in err
    assert train_main([*TINY, "--steps", "4", "--out", str(tmp_path), "--resume"]) == 2
    assert "--steps 4 is not allowed with --resume: the checkpoint is at step 6" in \
        capsys.readouterr().err
    assert train_main([*TINY, "--steps", "8", "--out", str(tmp_path), "--resume"]) == 0
    assert "LR schedule now spans 8 steps instead of 6" in capsys.readouterr().err


# --- 14. the closing sample respects the model's context ---------------------------------------

@pytest.mark.parametrize("preset_name", ["tiny", "fast"])
def test_14_cat_finishes_with_a_sample_inside_its_context(tmp_path, preset_name, capsys):
    assert train_main(["--preset", preset_name, "--arch", "cat", "--steps", "1", "--out",
                       str(tmp_path)]) == 0
    assert "sample: " in capsys.readouterr().out


# --- 15. broken checkpoints -------------------------------------------------------------------

def _good_checkpoint(tmp_path) -> Path:
    trainer = _trainer(tmp_path / "good", steps=1)
    trainer.fit()
    return tmp_path / "good" / "checkpoint.pt"


@pytest.mark.parametrize("damage, message", [
    ("truncate", "truncated or not a torch checkpoint"),
    ("random", "truncated or not a torch checkpoint"),
    ("empty", "the file is empty"),
    ("keyless", "it lacks optimizer"),
    ("pickle", "holds objects other than tensors"),
])
def test_15_a_broken_checkpoint_is_one_clear_message(tmp_path, capsys, damage, message):
    good = _good_checkpoint(tmp_path)
    bad = tmp_path / "run" / "checkpoint.pt"
    bad.parent.mkdir()
    if damage == "truncate":
        bad.write_bytes(good.read_bytes()[:len(good.read_bytes()) // 2])
    elif damage == "random":
        bad.write_bytes(os.urandom(4096))
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "keyless":
        ckpt = torch.load(good, weights_only=True)
        del ckpt["optimizer"]
        torch.save(ckpt, bad)
    else:
        torch.save({"format": ck.CHECKPOINT_FORMAT, "evil": socket.socket}, bad)
    with pytest.raises(ck.CheckpointError, match=message):
        ck.load_checkpoint_file(bad)
    assert train_main([*TINY, "--out", str(bad.parent), "--resume"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and message in err and "weights_only=False" not in err


# --- 16, 17. corpora ----------------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    (b"", "is empty"), (b"\x00\x01\x02binary\x00", "holds NUL bytes"),
    ("caf\u00e9 cr\u00e8me".encode("latin-1"), "as utf-8: byte 0xe9 at offset 3"),
])
def test_16_bad_text_files_name_the_file_and_the_problem(tmp_path, content, message):
    path = tmp_path / "mine.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"text file {path} is not usable.*{message}"):
        load_corpus("files", paths=[path])


def test_16_non_utf8_text_reads_with_an_encoding(tmp_path, capsys):
    path = tmp_path / "old.txt"
    path.write_bytes(("caf\u00e9 " * 4000).encode("latin-1"))
    assert load_corpus("files", paths=[path], encoding="latin-1").text.startswith("caf\u00e9")
    assert train_main([*TINY, "--steps", "1", "--paths", str(path), "--out",
                       str(tmp_path / "run")]) == 2
    assert "--encoding" in capsys.readouterr().err
    assert train_main([*TINY, "--steps", "1", "--paths", str(path), "--encoding", "latin-1",
                       "--out", str(tmp_path / "run")]) == 0


def test_17_offline_wikitext_messages_name_the_cli_options(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("BLOCKMEM_DATA", str(tmp_path / "data"))
    assert train_main([*TINY, "--corpus", "wikitext-2", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--local-path" in err and "--allow-fallback" in err
    with pytest.warns(UserWarning, match="offline corpus instead"):
        assert train_main([*TINY, "--steps", "1", "--corpus", "wikitext-2", "--allow-fallback",
                           "--out", str(tmp_path / "b")]) == 0


# --- 20. too large for the machine --------------------------------------------------------------

def test_20_a_model_too_large_is_refused_at_once_with_the_estimate(tmp_path, capsys):
    start = time.perf_counter()
    assert train_main([*TINY, "--set", "d_model=65536", "--set", "n_head=256", "--out",
                       str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "too large for this machine" in err and "parameters need about" in err
    assert "is available on cpu" in err and time.perf_counter() - start < 30


def test_20_the_limit_is_what_is_available(tmp_path, capsys, monkeypatch):
    import blockmem_lite.train.optim as optim_module

    monkeypatch.setattr(optim_module, "available_memory_bytes", lambda device: 10 * 2**20)
    assert train_main([*TINY, "--set", "n_layer=64", "--out", str(tmp_path)]) == 2
    assert "and 10 MiB is available" in capsys.readouterr().err


# --- 21. bad model inputs ---------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["dense", "bcmt", "cat", "armt", "moc"])
def test_21_an_empty_batch_is_a_clear_error(arch):
    model = build_model(preset("tiny", arch=arch))
    for shape in ((0, 8), (2, 0)):
        with pytest.raises(ValueError, match=r"tokens of shape .* are not allowed: expected at "
                                             "least one sequence of at least one token"):
            model(torch.zeros(shape, dtype=torch.long))


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=2.5), "max_new_tokens=2.5 is not allowed: expected an integer"),
    (dict(max_new_tokens=4, temperature=math.nan), "temperature=nan is not allowed"),
    (dict(max_new_tokens=4, top_k=0), "top_k=0 is not allowed"),
])
def test_21_generate_checks_its_arguments(kwargs, message):
    model = build_model(preset("tiny"))
    with pytest.raises(ValueError, match=message):
        model.generate(torch.zeros(1, 4, dtype=torch.long), **kwargs)


# --- 22. bench arguments are checked first ------------------------------------------------------

def test_22_a_bad_json_path_fails_before_any_timing(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert bench_main(["--json", str(tmp_path / "afile" / "x.json"), "--seq-len", "16"]) == 2
    captured = capsys.readouterr()
    assert "afile is a file, not a folder" in captured.err and "tok/s" not in captured.out


def test_22_fewer_warm_up_steps_than_the_protocol_are_called_a_smoke_test(capsys):
    assert bench_main(["--seq-len", "16", "--warmup", "1", "--repeats", "1", "--memory", "none",
                       "--phases", "train", "--d-model", "32", "--n-layer", "1", "--n-head",
                       "2", "--batch", "1"]) == 0
    assert "below the protocol's 3 and 5: a smoke test" in capsys.readouterr().err
