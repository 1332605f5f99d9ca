"""Runs that hung, blocked or died without a word (hostile-probe round 3): processes of one
torchrun run started with different settings, stuck run-folder locks, memory limits the
up-front check did not see, and sizes of a nearly full disk printed as "0 MiB".

The distributed tests start real 2-process Gloo runs on the CPU, as tests/test_distributed.py
does; a run that hangs is killed whole (workers included) and reported.
"""

import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from blockmem_lite import checkpoints as ck
from blockmem_lite import preset, runtime
from blockmem_lite.tools.train_command import train_main
from blockmem_lite.train import check_fits_in_memory

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "BLOCKMEM_HEADLESS": "1"}
TINY = ["--preset", "tiny", "--steps", "2"]
HANG_S = 150                      # far above a refusal (seconds), far below Gloo's 30 min

distributed_only = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="this PyTorch has no torch.distributed with Gloo")


def _torchrun(script: Path, *args) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node 2 script args``; fails the test (after killing the
    launcher and its workers, which torchrun starts in sessions of their own) if it has not
    ended within HANG_S."""
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", str(script), *map(str, args)], cwd=ROOT,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        for child in [*psutil.Process(proc.pid).children(recursive=True), proc]:
            child.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"the two processes hung (killed after {HANG_S} s):\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


# --- 1. processes of one run started with different settings ---------------------------------

CHECK_DRIVER = """
import sys
from blockmem_lite import distributed, preset

world = distributed.setup("cpu")
same = preset("fast")
distributed.check_same_settings(same.to_dict(), world)            # equal: no error
print(f"rank {world.rank}: same settings accepted", flush=True)
other = same.replace(steps=4 + 2 * world.rank, lr=1e-3 * (1 + world.rank),
                     **({"d_model": 64} if world.rank else {}))
code = 0
try:
    distributed.check_same_settings(other.to_dict(), world)
except ValueError as err:
    print(f"rank {world.rank}: error: {err}", file=sys.stderr, flush=True)
    code = 2
distributed.shutdown()
sys.exit(code)
"""


@distributed_only
def test_1_ranks_with_different_settings_are_refused_on_every_rank(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(CHECK_DRIVER)
    run = _torchrun(driver)
    assert run.returncode != 0
    for rank in (0, 1):
        assert f"rank {rank}: same settings accepted" in run.stdout, run.stderr[-3000:]
        assert f"rank {rank}: error: the 2 processes of this run were started with " \
               "different settings, which is not allowed" in run.stderr, run.stderr[-3000:]
    assert run.stderr.count("  train.steps: rank 0 = 4, rank 1 = 6") == 2
    assert run.stderr.count("  train.lr: rank 0 = 0.001, rank 1 = 0.002") == 2
    assert run.stderr.count("  model.d_model: rank 0 = 32, rank 1 = 64") == 2
    assert "train.seed" not in run.stderr                           # equal fields are not listed


TRAIN_DRIVER = """
import os, sys
from blockmem_lite.tools.train_command import train_main

rank = int(os.environ["RANK"])
extra = ["--steps", "6", "--set", "seed=1"] if rank else ["--steps", "4"]
sys.exit(train_main(["--preset", "tiny", "--device", "cpu", "--out", sys.argv[1], *extra]))
"""


@distributed_only
def test_1_train_with_other_steps_or_seed_on_one_rank_exits_with_the_message(tmp_path):
    """Before the fix rank 0 finished its 4 steps and both processes waited for each other
    forever (Ctrl-C and SIGTERM could not reach them); now both refuse before any step."""
    driver = tmp_path / "driver.py"
    driver.write_text(TRAIN_DRIVER)
    out = tmp_path / "run"
    run = _torchrun(driver, out)
    assert run.returncode != 0
    assert "different settings, which is not allowed" in run.stderr, run.stderr[-3000:]
    assert "train.steps: rank 0 = 4, rank 1 = 6" in run.stderr
    assert "train.seed: rank 0 = 0, rank 1 = 1" in run.stderr
    assert "step 1/" not in run.stdout                                  # no work was done
    assert not (out / "checkpoint.pt").exists() and not (out / ck.LOCK_NAME).exists()


# --- 2. stuck run-folder locks -----------------------------------------------------------------

def _lock(folder: Path, **owner) -> Path:
    path = folder / ck.LOCK_NAME
    path.write_text(json.dumps({"host": socket.gethostname(), "started": "2024-01-02 03:04:05",
                                **owner}))
    return path


@pytest.fixture
def sleeper():
    """A live process that is not Python (as pid 1 of a container often is)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_2_a_lock_naming_a_live_process_that_is_no_run_is_taken_over(tmp_path, sleeper):
    _lock(tmp_path, pid=sleeper.pid)
    assert train_main([*TINY, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "checkpoint.pt").exists() and not (tmp_path / ck.LOCK_NAME).exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_2_a_lock_whose_pid_now_names_another_process_is_taken_over(tmp_path):
    """The lock's pid is alive and Python, but it started at another moment than the lock's
    owner: the pid was given to a later process."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lock(tmp_path, pid=holder.pid, process_start=ck._process_start(holder.pid) - 1)
        with ck.RunLock(tmp_path) as lock:
            mine = lock.owner()
        assert mine["pid"] == os.getpid()
        assert mine["process_start"] == ck._process_start(os.getpid())
    finally:
        holder.kill()
        holder.wait()


HOLDER = """
import sys, time
from blockmem_lite.checkpoints import RunLock
with RunLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_2_a_live_run_is_refused_naming_the_lock_file_and_how_to_clear_it(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert train_main([*TINY, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        path = tmp_path / ck.LOCK_NAME
        assert f"in use by another run (pid {holder.pid} on {socket.gethostname()}, started " in err
        assert f"lock file {path}" in err and f"process {holder.pid} still runs" in err
        assert f"if that run is gone, delete {path}" in err
        assert not (tmp_path / "checkpoint.pt").exists()
    finally:
        holder.kill()
        holder.wait()


def test_2_a_lock_from_another_host_says_it_cannot_be_checked(tmp_path, capsys):
    path = _lock(tmp_path, pid=4242, host="other-node")
    assert train_main([*TINY, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "(pid 4242 on other-node, started 2024-01-02 03:04:05; lock file " f"{path})" in err
    assert f"another host (other-node; this is {socket.gethostname()})" in err
    assert "cannot be checked from here" in err and f"if that run is gone, delete {path}" in err
    assert path.exists()                                      # left to the user


# --- 3. memory limits the up-front check must see ------------------------------------------------

def _cgroups(tmp_path, monkeypatch, groups: str, files: dict) -> None:
    """A fake /sys/fs/cgroup under tmp_path ({relative file: text}) and /proc/self/cgroup."""
    for name, text in files.items():
        (tmp_path / "cg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cg" / name).write_text(text)
    (tmp_path / "self_cgroup").write_text(groups)
    monkeypatch.setattr(runtime, "CGROUP_ROOT", str(tmp_path / "cg"))
    monkeypatch.setattr(runtime, "PROC_SELF_CGROUP", str(tmp_path / "self_cgroup"))
    monkeypatch.setattr(runtime, "_system_available", lambda: 64 * 2**30)


MIB = 2**20
V1_UNLIMITED = "9223372036854771712"


def test_3_a_cgroup_v1_limit_is_seen(tmp_path, monkeypatch):
    _cgroups(tmp_path, monkeypatch, "5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n", {
        "memory/docker/abc/memory.limit_in_bytes": f"{100 * MIB}\n",
        "memory/docker/abc/memory.usage_in_bytes": f"{40 * MIB}\n",
        "memory/docker/abc/memory.stat": f"cache 12\ntotal_inactive_file {10 * MIB}\n",
        "memory/memory.limit_in_bytes": V1_UNLIMITED, "memory/memory.usage_in_bytes": "0"})
    assert runtime.available_memory_bytes("cpu") == 70 * MIB     # page cache is reclaimable


def test_3_the_smallest_limit_of_the_group_and_its_ancestors_counts(tmp_path, monkeypatch):
    _cgroups(tmp_path, monkeypatch, "0::/user.slice/job\n", {
        "user.slice/job/memory.max": "max\n", "user.slice/job/memory.current": f"{MIB}\n",
        "user.slice/memory.max": f"{50 * MIB}\n", "user.slice/memory.current": f"{20 * MIB}\n"})
    assert runtime.available_memory_bytes("cpu") == 30 * MIB


def test_3_a_container_mount_of_its_own_v1_group_is_read(tmp_path, monkeypatch):
    """Without a cgroup namespace a container sees the host's group path, but its own group
    is mounted at the root of the hierarchy."""
    _cgroups(tmp_path, monkeypatch, "4:memory:/docker/abc\n", {
        "memory/memory.limit_in_bytes": f"{8 * MIB}", "memory/memory.usage_in_bytes": f"{MIB}"})
    assert runtime.available_memory_bytes("cpu") == 7 * MIB


def test_3_a_model_too_large_for_the_cgroup_limit_is_refused(tmp_path, monkeypatch, capsys):
    _cgroups(tmp_path, monkeypatch, "4:memory:/\n", {
        "memory/memory.limit_in_bytes": f"{MIB}", "memory/memory.usage_in_bytes": f"{MIB // 2}"})
    with pytest.raises(ValueError, match="too large for this machine.*512 KiB is available"):
        check_fits_in_memory(preset("tiny").model, "cpu")
    assert train_main([*TINY, "--out", str(tmp_path / "run")]) == 2
    assert "too large for this machine" in capsys.readouterr().err


RLIMIT_PROBE = """
import resource, psutil
from blockmem_lite.runtime import available_memory_bytes
size = psutil.Process().memory_info().vms
resource.setrlimit(resource.RLIMIT_AS, (size + 256 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
print(available_memory_bytes("cpu"))
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_AS)[1] != resource.RLIM_INFINITY,
                    reason="needs a raisable address-space limit")
def test_3_an_address_space_limit_is_seen(tmp_path):
    """``ulimit -v``: 256 MiB above what the process already maps."""
    probe = subprocess.run([sys.executable, "-c", RLIMIT_PROBE], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert 0 < int(probe.stdout) <= 256 * MIB


# --- 4. a nearly full disk -----------------------------------------------------------------------

@pytest.mark.parametrize("free, shown", [(1024, "1.0 KiB"), (300, "300 B"), (0, "0 B")])
def test_4_small_free_space_reads_in_kib_or_bytes(tmp_path, monkeypatch, free, shown):
    monkeypatch.setattr(ck.shutil, "disk_usage", lambda p: type("U", (), {"free": free})())
    with pytest.warns(UserWarning, match=f"only {shown} free in .*; a checkpoint needs about "
                                         "600 KiB: free some space"):
        ck.prepare_folder(tmp_path, expected_bytes=600 * 1024)
