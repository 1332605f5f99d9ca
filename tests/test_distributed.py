"""Data-parallel training through torchrun (issue 15): 2 CPU processes (Gloo) train the same
curve as one process with the same global batch, stop together when one of them is signalled,
and resume exactly; a batch that cannot be split is refused before any work.

The torchrun tests start real processes, as a user's shell does
(``python -m torch.distributed.run --standalone --nproc-per-node 2 -m blockmem_lite train``),
on the shipped offline corpus, on the CPU (``--device cpu``), with one thread each.

Tolerance of the curve comparison (``CURVE_TOL``): the two processes each back-propagate half
of the batch and DDP sums the halves' gradients, so the float32 sums are added in another order
than in one backward over the whole batch (relative error ~1e-7 per operation), and AdamW
carries these differences through the steps. Measured: at most ~1e-6 on the loss. 1e-5 leaves
room for other machines while a real mistake (a wrong shard, an un-averaged gradient, another
batch size) moves the curve by 1e-3 or more from step 2 on, which
``test_the_tolerance_has_teeth`` shows. A gradient norm, a sum of squares over every weight,
moves more (measured: 4e-5 relative at step 34 of 40), so it is held to 1e-4.
"""

import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from blockmem_lite import build_model, distributed
from blockmem_lite.tools.reproduce_command import reproduce_main
from blockmem_lite.tools.train_command import train_main
from blockmem_lite.train.data import BatchStream

ROOT = Path(__file__).resolve().parent.parent
CURVE_TOL = dict(rtol=1e-5, atol=1e-5)
GRAD_NORM_TOL = dict(rtol=1e-4, atol=1e-4)
BASE = ["--preset", "fast", "--device", "cpu", "--set", "eval_every=5"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "BLOCKMEM_HEADLESS": "1"}

pytestmark = pytest.mark.skipif(not (torch.distributed.is_available()
                                     and torch.distributed.is_gloo_available()),
                                reason="this PyTorch has no torch.distributed with Gloo")


def _torchrun(*args) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2", "-m", "blockmem_lite", "train", *args]


def _history(folder: Path) -> dict:
    return json.loads((folder / "history.json").read_text())


def _curves_close(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["val_step"] == b["val_step"]
    for key in ("loss", "grad_norm", "val_loss"):
        torch.testing.assert_close(torch.tensor(a[key], dtype=torch.float64),
                                   torch.tensor(b[key], dtype=torch.float64),
                                   **(GRAD_NORM_TOL if key == "grad_norm" else CURVE_TOL),
                                   msg=lambda m, key=key: f"{key}: {m}")


def _max_diff(a: dict, b: dict, key: str = "loss") -> float:
    return max(abs(x - y) for x, y in zip(a[key], b[key], strict=True))


# --- in process: the pieces -------------------------------------------------------------------

def test_the_shards_of_a_global_batch_are_the_single_process_batch_in_order():
    data = [(torch.tensor([i]), torch.tensor([i])) for i in range(40)]
    whole = BatchStream(data, 8, seed=3)
    halves = [BatchStream(data, 8, seed=3, shard=(r, 2)) for r in range(2)]
    for _ in range(7):                                       # across an epoch boundary (5/epoch)
        x, _ = whole.next_batch()
        parts = [h.next_batch()[0] for h in halves]
        assert torch.equal(torch.cat(parts), x)
    assert all(h.tell() == whole.tell() for h in halves)     # the position stays global


def test_a_single_process_world_is_a_no_op():
    world = distributed.current()
    assert not world.distributed and world.is_main
    t = torch.tensor([1.5, 2.0])
    assert world.all_reduce_mean(t) is t and world.all_reduce_max(3) == 3
    assert world.on_main(lambda: 7) == 7 and world.gather_objects("x") == ["x"]
    assert distributed.wrap(torch.nn.Linear(2, 2), world).__class__ is torch.nn.Linear


def test_a_batch_that_does_not_split_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    out = tmp_path / "run"
    assert train_main([*BASE, "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "batch_size=8 is not allowed with 3 processes (WORLD_SIZE=3)" in err
    assert "multiple of 3, e.g. 6 or 9" in err
    assert not out.exists() and not torch.distributed.is_initialized()   # nothing was started
    monkeypatch.setenv("RANK", "1")                          # the other ranks say nothing
    assert train_main([*BASE, "--steps", "2", "--out", str(out)]) == 2
    assert capsys.readouterr() == ("", "")
    with pytest.raises(ValueError, match="batch_size=5 is not allowed with 2 processes"):
        distributed.check_batch_size(5, 2)
    assert distributed.check_batch_size(8, 2) == 4


# --- torchrun: 2 processes --------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["dense", "bcmt"])
def test_two_processes_train_the_single_process_curve(tmp_path, arch):
    args = [*BASE, "--arch", arch, "--steps", "10"]
    ddp = subprocess.run(_torchrun(*args, "--out", str(tmp_path / "ddp")), cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=240)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "cpu x 2 processes (each 4 rows)" in ddp.stdout
    assert ddp.stdout.count("final val loss") == 1                     # rank 0 alone prints
    assert train_main([*args, "--out", str(tmp_path / "one")]) == 0
    a, b = _history(tmp_path / "ddp"), _history(tmp_path / "one")
    _curves_close(a, b)
    print(f"{arch}: max |loss diff| {_max_diff(a, b):.2e}, "
          f"max |val diff| {_max_diff(a, b, 'val_loss'):.2e}")
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == ["checkpoint.pt",
                                                                   "history.json"]


def test_the_tolerance_has_teeth(tmp_path):
    """Half the global batch (what 2 processes would train if each took batch_size rows
    of its own, or if the halves were not averaged) is far outside CURVE_TOL."""
    assert train_main([*BASE, "--steps", "4", "--out", str(tmp_path / "b8")]) == 0
    assert train_main([*BASE, "--steps", "4", "--set", "batch_size=4",
                       "--out", str(tmp_path / "b4")]) == 0
    a, b = _history(tmp_path / "b8"), _history(tmp_path / "b4")
    assert _max_diff(a, b) > 100 * CURVE_TOL["atol"]             # measured: 9e-3


def _worker_pids(launcher: subprocess.Popen, timeout: float = 60) -> dict[int, int]:
    """{rank: pid} of torchrun's worker processes (Linux /proc)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = {}
        for task in Path(f"/proc/{launcher.pid}/task").glob("*"):
            for pid in (task / "children").read_text().split():
                try:
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                ranks = [e[5:] for e in env if e.startswith(b"RANK=")]
                if ranks:
                    found[int(ranks[0])] = int(pid)
        if len(found) == 2:
            return found
        time.sleep(0.1)
    raise AssertionError("torchrun's two workers did not appear")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds workers through /proc")
def test_a_sigterm_to_one_process_stops_both_and_the_resumed_run_equals_the_whole(tmp_path):
    args = [*BASE, "--steps", "40", "--set", "log_every=1"]
    whole = subprocess.run(_torchrun(*args, "--out", str(tmp_path / "whole")), cwd=ROOT,
                           env=ENV, capture_output=True, text=True, timeout=240)
    assert whole.returncode == 0, whole.stderr[-3000:]

    split = tmp_path / "split"
    proc = subprocess.Popen(_torchrun(*args, "--out", str(split)), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = _worker_pids(proc)
    for line in proc.stdout:                                 # training really runs
        if line.startswith("step"):
            break
    os.kill(workers[1], signal.SIGTERM)                      # rank 1 only, not rank 0
    stdout, stderr = proc.communicate(timeout=120)
    assert "stopped by SIGTERM at step" in stdout, stderr[-3000:]
    stopped = _history(split)
    saved = torch.load(split / "checkpoint.pt", weights_only=True)
    assert stopped["interrupted"] and stopped["stopped_by"] == "SIGTERM"
    assert saved["step"] == stopped["step"][-1] < 40         # rank 0 stopped at the same step
    assert len(saved["rng_ranks"]) == 2
    assert not (split / ".blockmem_run.lock").exists()

    shutil.copytree(split, tmp_path / "split_one")
    resumed = subprocess.run(_torchrun(*args, "--out", str(split), "--resume"), cwd=ROOT,
                             env=ENV, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = _history(tmp_path / "whole"), _history(split)
    assert a["step"] == b["step"] == list(range(1, 41))
    assert a["loss"] == b["loss"] and a["val_loss"] == b["val_loss"]   # bit for bit

    # any number of processes resumes the global position: here one
    assert train_main([*args, "--out", str(tmp_path / "split_one"), "--resume"]) == 0
    _curves_close(a, _history(tmp_path / "split_one"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds workers through /proc")
def test_a_worker_killed_with_sigkill_leaves_rank_0_saving_the_last_whole_step(tmp_path):
    """kill -9 of rank 1 with the default checkpoint_every=0: rank 0 sees its collective fail,
    saves the last whole step alone (under its stop button, so torchrun's SIGTERM waits) and
    says so; the checkpoint holds that step and its history."""
    out = tmp_path / "run"
    proc = subprocess.Popen(_torchrun(*BASE, "--steps", "3000", "--set", "log_every=1",
                                      "--out", str(out)), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = _worker_pids(proc)
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("step")
        if seen == 3:
            break
    os.kill(workers[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "another process of the run ended without warning" in stderr, stderr[-3000:]
    assert "rank 0 saved step" in stderr and "alone to" in stderr, stderr[-3000:]
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    stopped = _history(out)
    assert 3 <= saved["step"] == stopped["step"][-1] < 3000
    assert stopped["interrupted"] and stopped["stopped_by"] == "a lost process"
    assert "rng_ranks" not in saved                    # rank 0's own streams only
    assert not (out / ".blockmem_run.lock").exists()


# --- masked targets: a library script under torchrun -----------------------------------------

DRIVER = """
import json, sys
import torch
from torch.utils.data import TensorDataset
from blockmem_lite import build_model, distributed, preset
from blockmem_lite.train import Trainer


def masked_data(n=32, t=32):
    # rows keep 10% .. 100% of their targets, so the two halves of a batch have different
    # numbers of target tokens
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, t + 1), generator=g)
    y = x[:, 1:].clone()
    y[torch.rand(n, t, generator=g) >= torch.linspace(0.1, 1.0, n)[:, None]] = -100
    return TensorDataset(x[:, :-1].clone(), y)


CFG = preset("tiny", steps=8, batch_size=8, warmup_steps=2, eval_every=4, device="cpu")


class StopAt3:                     # a callback that stops the run (on rank 0 only)
    def on_step(self, trainer, rec):
        if rec["step"] == 3:
            raise KeyboardInterrupt


if __name__ == "__main__":
    world = distributed.setup("cpu")
    torch.manual_seed(0)
    masked = Trainer(build_model(CFG), CFG, masked_data(), masked_data(),
                     callbacks=[]).fit()
    stopped = Trainer(build_model(CFG), CFG, masked_data(), callbacks=[StopAt3()]).fit()
    if world.is_main:
        with open(sys.argv[1], "w") as f:
            json.dump({"masked": masked.to_dict(), "stopped": stopped.to_dict()}, f)
    distributed.shutdown()
"""


def test_masked_targets_train_the_single_process_curve(tmp_path, monkeypatch):
    """Per-process target counts differ; the loss weighted by each process's share of them
    keeps the curve the single process's. And a callback's KeyboardInterrupt (callbacks
    run on rank 0 only) stops both processes after the same step."""
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(driver), str(tmp_path / "ddp.json")],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=240)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    monkeypatch.setattr(sys, "argv", [str(driver), str(tmp_path / "one.json")])
    space = runpy.run_path(str(driver), run_name="__main__")
    ddp_runs, one_runs = (json.loads((tmp_path / n).read_text()) for n in ("ddp.json", "one.json"))
    a, b = ddp_runs["masked"], one_runs["masked"]
    _curves_close(a, b)
    for run in (ddp_runs["stopped"], one_runs["stopped"]):
        assert run["step"] == [1, 2, 3] and run["interrupted"] and run["stopped_by"] == "SIGINT"

    # teeth: the halves of the first batch differ in targets, and the plain mean of the
    # two halves' losses (DDP without the weighting) is outside the tolerance
    data, cfg = space["masked_data"](), space["CFG"]
    halves = [BatchStream(data, 8, seed=cfg.train.seed, shard=(r, 2)).next_batch()
              for r in range(2)]
    counts = [int((y != -100).sum()) for _, y in halves]
    assert counts[0] != counts[1]
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():
        whole = model(torch.cat([x for x, _ in halves]), torch.cat([y for _, y in halves]))
        plain = sum(float(model(x, y).loss) for x, y in halves) / 2
    assert abs(plain - float(whole.loss)) > 10 * CURVE_TOL["atol"]
    torch.testing.assert_close(a["loss"][0], float(whole.loss), **CURVE_TOL)


# --- reproduce under torchrun -------------------------------------------------------------------

def test_reproduce_under_torchrun_measures_what_one_process_does(tmp_path):
    args = ["--preset", "tiny", "--arch", "dense"]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "blockmem_lite", "reproduce", *args,
                          "--out", str(tmp_path / "ddp")], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=240)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert ddp.stdout.count("claims:") == 1                             # rank 0 alone prints
    assert reproduce_main([*args, "--out", str(tmp_path / "one")]) == 0
    a, b = (json.loads((tmp_path / n / "results.json").read_text())["done"]
            for n in ("ddp", "one"))
    assert sorted(a) == sorted(b)
    for key in (k for k in a if k.startswith("lm/")):
        torch.testing.assert_close(a[key]["loss_curve"], b[key]["loss_curve"], **CURVE_TOL)
        torch.testing.assert_close(a[key]["val_loss"], b[key]["val_loss"], **CURVE_TOL)
    for key in (k for k in a if k.startswith("recall/")):
        assert a[key]["curves"] == b[key]["curves"]


def test_reproduce_under_torchrun_reads_dense_recall_on_every_rank(tmp_path):
    """Rank 0 reads the parts; every rank must skip their training, or the ranks part ways."""
    assert reproduce_main(["--preset", "tiny", "--arch", "dense", "--out",
                           str(tmp_path / "source")]) == 0
    source = tmp_path / "source" / "results.json"
    script = tmp_path / "adopt.py"
    script.write_text(
        "import sys\nfrom blockmem_lite import distributed, lab\n"
        "distributed.setup()\n"
        f"lab.reproduce('tiny', {str(tmp_path / 'ddp')!r}, archs=['bcmt'], tasks=('recall',),\n"
        f"              progress=False, dense_recall_from={str(source)!r})\n"
        "distributed.shutdown()\n")     # as the CLI does: a Gloo rank leaving early can abort
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(script)], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=240)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    done = json.loads((tmp_path / "ddp" / "results.json").read_text())
    source_parts = json.loads(source.read_text())["parts"]
    assert done["parts"]["dense/model/0"] == source_parts["dense/model/0"]
    assert set(done["parts_from"]) == {"dense/model/0"}
    assert {"bcmt/model/0", "bcmt/twin/0"} <= set(done["parts"])
