"""Every path a student or a teacher reaches runs on Windows and macOS, forced here on Linux:
no forkserver start method (the lab's workers start by spawn), no ``resource`` module, no
SIGHUP and no /proc (peak RSS through psutil, lock pids tested without a signal), and
grading (Linux's sandboxes) refused at once, in one line, off Linux.

A spawned process gets the same Windows-like Python through a ``sitecustomize`` on its
PYTHONPATH (``WINDOWS_LIKE``), which also leaves a mark, so a test can tell it ran there."""

import dataclasses
import multiprocessing
import os
import pathlib
import pickle
import signal
import socket
import subprocess
import sys
import time
import types
from multiprocessing import resource_tracker

import pytest

from blockmem_lite import checkpoints as ck
from blockmem_lite import lab
from blockmem_lite.__main__ import main as command_line
from blockmem_lite.config import ModelConfig
from blockmem_lite.corpora import load_corpus
from blockmem_lite.lab import parts
from blockmem_lite.measure import metrics
from blockmem_lite.tools import grading, sandbox

WINDOWS_LIKE = '''\
"""A Windows-like Python for tests/test_portability.py: no resource module, no SIGHUP, no
/proc for pathlib; each process marks itself in $BLOCKMEM_WINDOWS_LIKE_MARKS."""
import os
import pathlib
import signal
import sys

import psutil  # noqa: F401  (loaded first: its Linux half needs resource, Windows' does not)

sys.modules["resource"] = None
del signal.SIGHUP
_exists, _read_text, _read_bytes = (pathlib.Path.exists, pathlib.Path.read_text,
                                    pathlib.Path.read_bytes)


def _hidden(path):
    if str(path).startswith("/proc"):
        raise FileNotFoundError(2, "No such file or directory", str(path))


def _read_text_(self, *args, **kwargs):
    _hidden(self)
    return _read_text(self, *args, **kwargs)


def _read_bytes_(self):
    _hidden(self)
    return _read_bytes(self)


pathlib.Path.exists = lambda self, *a, **k: not str(self).startswith("/proc") and \\
    _exists(self, *a, **k)
pathlib.Path.read_text, pathlib.Path.read_bytes = _read_text_, _read_bytes_
pathlib.Path(os.environ["BLOCKMEM_WINDOWS_LIKE_MARKS"], str(os.getpid())).touch()
'''


@pytest.fixture
def windows_like(tmp_path, monkeypatch):
    """This process, and every Python it starts, as on Windows as far as the kit can tell:
    spawn the only start method, no ``resource``, no SIGHUP, no /proc. Returns the folder
    of the marks the started Pythons leave."""
    site, marks = tmp_path / "windows_site", tmp_path / "windows_marks"
    site.mkdir()
    marks.mkdir()
    (site / "sitecustomize.py").write_text(WINDOWS_LIKE, encoding="utf-8")
    resource_tracker.ensure_running()        # the session's, on the real Python, not this one
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("BLOCKMEM_WINDOWS_LIKE_MARKS", str(marks))
    real_context = multiprocessing.get_context

    def spawn_only(method=None):
        if method not in (None, "spawn"):
            raise ValueError(f"cannot find context for {method!r}")     # as on Windows
        return real_context(method)

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    monkeypatch.setattr(multiprocessing, "get_context", spawn_only)
    monkeypatch.setitem(sys.modules, "resource", None)
    monkeypatch.delattr(signal, "SIGHUP")
    _hide_proc(monkeypatch)
    return marks


def _hide_proc(monkeypatch) -> None:
    """pathlib finds nothing under /proc (psutil, which reads it with open(), still works)."""
    exists, read_text, read_bytes = (pathlib.Path.exists, pathlib.Path.read_text,
                                     pathlib.Path.read_bytes)

    def hidden(path) -> None:
        if str(path).startswith("/proc"):
            raise FileNotFoundError(2, "No such file or directory", str(path))

    def read_text_(self, *args, **kwargs):
        hidden(self)
        return read_text(self, *args, **kwargs)

    def read_bytes_(self):
        hidden(self)
        return read_bytes(self)

    monkeypatch.setattr(pathlib.Path, "exists", lambda self, *a, **k:
                        not str(self).startswith("/proc") and exists(self, *a, **k))
    monkeypatch.setattr(pathlib.Path, "read_text", read_text_)
    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes_)


# --- the lab's workers ------------------------------------------------------------------------

def _lab(tmp_path, archs, tasks) -> lab.Lab:
    return lab.Lab("tiny", tmp_path / "plan", archs=archs, corpus=load_corpus("offline"),
                   progress=False, tasks=tasks)


def test_the_lab_workers_start_by_spawn_where_there_is_no_forkserver(tmp_path, windows_like):
    """A real recall job (dense, its training shortened to two steps) trains and is measured
    on a spawned worker that has no SIGHUP, no resource and no /proc."""
    run = _lab(tmp_path, ["bcmt"], ("recall",))
    job = run._recall_jobs("dense")[0]
    recipe = dataclasses.replace(job.recipe, steps=2, warmup_steps=1, batch_size=4, eval_rows=8)
    got = []
    parts.train_in_workers([dataclasses.replace(job, recipe=recipe)], 1,
                           lambda done, measured: got.append((done.key, measured)))
    assert [key for key, _ in got] == [job.key]
    assert all("beyond" in variant for variant in got[0][1].values())
    assert list(windows_like.iterdir()), "no worker ran on the Windows-like Python"
    deadline = time.monotonic() + 10            # a worker told to end may take a moment to exit
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert multiprocessing.active_children() == [], "a worker outlived the lab's jobs"


def test_what_a_spawned_worker_is_sent_pickles_and_its_entry_points_are_importable(tmp_path):
    """Spawn pickles every job and finds each function it runs by module and name."""
    run = _lab(tmp_path, None, ("recall", "facts"))
    jobs = [job for task, label in run.plan for job in
            (run._recall_jobs(label) if task == "recall" else run._facts_jobs(label))]
    assert {job.task for job in jobs} == {"recall", "facts"}
    assert [pickle.loads(pickle.dumps(job)) for job in jobs] == jobs
    for function in (parts._start_worker, parts._run_job, parts._end_worker_now):
        assert pickle.loads(pickle.dumps(function)) is function


# --- peak RSS -----------------------------------------------------------------------------------

def test_peak_rss_is_read_through_psutil_without_resource_or_proc(monkeypatch):
    monkeypatch.setitem(sys.modules, "resource", None)
    _hide_proc(monkeypatch)
    assert metrics.max_rss_bytes() > 10 * 2**20           # a reading: this process holds torch


@pytest.mark.parametrize("platform, expected", [("darwin", 5000), ("linux", 5000 * 1024),
                                                ("freebsd13", 5000 * 1024)])
def test_ru_maxrss_is_bytes_on_macos_and_kib_on_other_unixes(monkeypatch, platform, expected):
    usage = types.SimpleNamespace(ru_maxrss=5000)
    monkeypatch.setitem(sys.modules, "resource", types.SimpleNamespace(
        RUSAGE_SELF=0, getrusage=lambda who: usage))
    monkeypatch.setattr(sys, "platform", platform)
    _hide_proc(monkeypatch)
    assert metrics.max_rss_bytes() == expected


def test_the_bench_rss_child_measures_on_a_windows_like_python(windows_like):
    cfg = ModelConfig("dense", d_model=32, n_layer=1, n_head=2, vocab_size=64, seq_len=16)
    spec = {"model": cfg.to_dict(), "phase": "train", "batch": 1, "seq_len": 16, "threads": 1}
    reading = metrics.peak_rss_subprocess(spec, timeout=300)
    assert reading.peak_bytes >= reading.base_bytes > 50 * 2**20      # torch alone is > 50 MiB
    assert list(windows_like.iterdir()), "the child did not run on the Windows-like Python"


# --- run-folder locks ---------------------------------------------------------------------------

def _no_signal_zero_from_the_kit(monkeypatch) -> None:
    """os.kill(pid, 0) from the kit fails the test: on Windows it sends a console Ctrl-C
    instead of testing the pid. psutil may use it where it is a test (POSIX)."""
    real_kill = os.kill

    def kill(pid, sig):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if sig == 0 and caller.startswith("blockmem_lite"):
            pytest.fail(f"{caller} tested pid {pid} with os.kill(pid, 0)")
        return real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_run_locks_and_temp_files_test_pids_without_a_signal_or_proc(tmp_path, monkeypatch):
    _no_signal_zero_from_the_kit(monkeypatch)
    _hide_proc(monkeypatch)
    me = ck._process_start(os.getpid())
    assert me is not None                              # psutil's start time, without /proc
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead, started = _dead_pid(), ck._process_start(live.pid)
        owners = {"gone": ({"pid": dead}, True),
                  "alive": ({"pid": live.pid, "process_start": started}, False),
                  "pid given to a later process": ({"pid": live.pid,
                                                    "process_start": started - 1}, True)}
        for what, (owner, stale) in owners.items():
            owner["host"] = socket.gethostname()
            assert ck.RunLock(tmp_path)._stale(owner) is stale, what
        target = tmp_path / "checkpoint.pt"
        for pid in (dead, live.pid):
            (tmp_path / f".checkpoint.pt.{pid}.tmp").write_bytes(b"half")
        assert ck.remove_stale_temps(target) == [tmp_path / f".checkpoint.pt.{dead}.tmp"]
        with ck.RunLock(tmp_path) as taken:
            assert taken.owner()["pid"] == os.getpid() and taken.owner()["process_start"] == me
    finally:
        live.kill()
        live.wait()


# --- grading ------------------------------------------------------------------------------------

@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_grading_off_linux_is_refused_at_once_in_one_line(tmp_path, monkeypatch, capsys,
                                                          platform):
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    out = tmp_path / "grades"
    monkeypatch.setattr(sys, "platform", platform)
    if platform == "win32":
        monkeypatch.delattr(os, "geteuid")                  # Windows has no user ids
    for name in ("load_solutions", "student_folders"):
        monkeypatch.setattr(grading, name, lambda *a, **k: pytest.fail("grading went on"))
    monkeypatch.setattr(sandbox, "bubblewrap_works", lambda: pytest.fail("grading went on"))
    assert command_line(["exercises", "grade", str(tmp_path / "subs"), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err + captured.out, captured.err
    assert lines[0].startswith("error: grading needs Linux") and platform in lines[0]
    assert all(way in lines[0] for way in ("Linux machine", "Linux container", "WSL"))
    assert not out.exists()
    with pytest.raises(sandbox.SandboxError, match="grading needs Linux"):
        grading.grade(tmp_path / "subs")
