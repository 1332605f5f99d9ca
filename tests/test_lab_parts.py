"""The lab's recall and facts models on worker processes (``lab.parts``): the same parts as
the lab's own process trains, each handed over as it ends; a stop or a dead worker loses nothing
finished and leaves no process behind; bad settings are refused before any work."""

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from blockmem_lite import lab
from blockmem_lite.corpora import load_corpus
from blockmem_lite.lab import parts
from blockmem_lite.lab import run as lab_run
from blockmem_lite.tools.reproduce_command import reproduce_main
from blockmem_lite.train.stopping import StopButton


def _jobs(tmp_path, archs=("bcmt",)) -> list[parts.RecallJob]:
    """The tiny preset's recall jobs of ``archs`` (dense, each model, each twin)."""
    run = lab.Lab("tiny", tmp_path / "plan", archs=list(archs), corpus=load_corpus("offline"),
                  progress=False, tasks=("recall",))
    return [run._recall_job(label, role, cfg, seed)
            for task, label in run.plan
            for role, cfg in run._recall_roles(label).items()
            for seed in run.recipe.seeds_of(role)]


def _tiny_lab(folder, archs: list[str], tasks: tuple, workers: int) -> dict:
    return lab.Lab("tiny", folder, archs=archs, corpus=load_corpus("offline"), progress=False,
                   tasks=tasks, workers=workers).run()


def test_workers_train_the_same_parts_as_the_lab_process(tmp_path, monkeypatch):
    """One thread everywhere (conftest), so the sums run in the same order: equal bits."""
    here = _tiny_lab(tmp_path / "here", ["bcmt"], ("recall",), workers=0)
    monkeypatch.setattr(lab_run, "recall_part", lambda *a, **k: pytest.fail(
        "a recall model was trained in the lab's process"))
    apart = _tiny_lab(tmp_path / "apart", ["bcmt"], ("recall",), workers=2)
    assert set(apart["parts"]) == {"dense/model/0", "bcmt/model/0", "bcmt/twin/0"}
    assert apart["parts"] == here["parts"]
    assert apart["memory_pays"] == here["memory_pays"]


def test_facts_models_train_on_the_workers_beside_the_recall_models(tmp_path, monkeypatch):
    """The facts tables of MoC and its iso-FLOP dense go to the workers with the recall
    models (one thread everywhere: the same bits as in the lab's process)."""
    here = _tiny_lab(tmp_path / "here", ["moc"], ("facts",), workers=0)
    monkeypatch.setattr(lab_run, "facts_part", lambda *a, **k: pytest.fail(
        "a facts model was trained in the lab's process"))
    apart = _tiny_lab(tmp_path / "apart", ["moc"], ("facts", "recall"), workers=2)
    facts = {key for key in apart["parts"] if key.startswith("facts:")}
    assert facts == {"facts:moc/2", "facts:dense iso-FLOP (moc)/2"}
    assert any(not key.startswith("facts:") for key in apart["parts"])   # recall beside them
    assert {key: apart["parts"][key] for key in facts} == here["parts"]
    assert apart["knowledge"] == here["knowledge"]
    assert apart["done"]["facts/moc"]["counts"] == here["done"]["facts/moc"]["counts"]


def test_jobs_are_handed_out_costliest_first(tmp_path):
    """CAT's recall model costs more FLOPs than BCMT's and dense's: it starts first, though
    it comes last in the plan and has as many steps."""
    jobs = _jobs(tmp_path, archs=("bcmt", "cat"))
    costs = {job.key: job.cost for job in jobs}
    assert costs["cat/model/0"] > max(costs["bcmt/model/0"], costs["dense/model/0"]) > 0
    assert len({job.steps for job in jobs}) == 1
    order = [jobs[i].key for i in parts.costliest_first(jobs)]
    assert order == sorted(order, key=lambda key: -costs[key]) and order[0].startswith("cat/")
    assert [job.key for job in jobs][0].startswith("dense/")        # the plan's order


def test_the_progress_of_the_workers_weighs_each_step_by_its_jobs_cost(tmp_path):
    jobs = _jobs(tmp_path, archs=("bcmt", "cat"))
    cat = next(i for i, job in enumerate(jobs) if job.key == "cat/model/0")
    half_of_cat = {i: (jobs[i].steps // 2 if i == cat else 0) for i in range(len(jobs))}
    share = parts.done_share(jobs, half_of_cat)
    assert share == pytest.approx(jobs[cat].cost / 2 / sum(job.cost for job in jobs))
    assert share > 0.5 * jobs[cat].steps / sum(job.steps for job in jobs)   # more than by steps
    assert parts.done_share(jobs, {i: job.steps for i, job in enumerate(jobs)}) == \
        pytest.approx(1.0)


def test_each_result_is_handed_over_as_it_ends_and_progress_reaches_one(tmp_path):
    jobs, got, fractions = _jobs(tmp_path), [], []
    parts.train_in_workers(jobs, 2, lambda job, measured: got.append((job.key, measured)),
                           on_progress=lambda fraction, text: fractions.append(fraction))
    assert sorted(key for key, _ in got) == sorted(job.key for job in jobs)
    assert all(measured and all("beyond" in variant for variant in measured.values())
               for _, measured in got)
    assert fractions == sorted(fractions) and 0 <= fractions[0] and fractions[-1] <= 1
    assert multiprocessing.active_children() == []


@pytest.mark.usefixtures("interactive_sigint")
def test_a_stop_keeps_the_finished_models_and_ends_every_worker(tmp_path):
    jobs, got = _jobs(tmp_path, archs=("bcmt", "cat")), []

    def stop_after_the_first(job, measured):
        got.append(job.key)
        if len(got) == 1:                               # once: a second Ctrl-C would raise
            os.kill(os.getpid(), signal.SIGINT)         # Ctrl-C while the others train

    with pytest.raises(parts.TrainingStopped) as stopped:
        parts.train_in_workers(jobs, 2, stop_after_the_first)
    assert stopped.value.history.stopped_by == "SIGINT"
    assert 1 <= len(got) < len(jobs)
    assert multiprocessing.active_children() == []


@dataclass
class _TrainingJob:
    """A stand-in job for a worker. ``mode`` "trainer": trains inside a stop button, as a
    Trainer does, writing ``caught`` if a stop signal reaches it; "deaf": ignores SIGTERM
    while it trains; "short": waits until the other job is under way (its ``started``
    file), then ends at once. A long one gives up after a minute."""

    key: str
    folder: Path
    mode: str
    arch: str = "dense"
    task: str = "recall"
    name: str = "stand-in"
    steps: int = 1

    @property
    def cost(self) -> float:
        return 1.0 if self.mode == "short" else 2.0      # the long one is handed out first

    def train(self, callbacks) -> dict:
        started, deadline = self.folder / "started", time.monotonic() + 60
        if self.mode == "short":
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return {}
        if self.mode == "deaf":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with StopButton() as stop:
            started.touch()
            try:
                while not stop.requested and time.monotonic() < deadline:
                    time.sleep(0.01)
            finally:                                     # a second signal raises here
                if stop.requested:
                    (self.folder / "caught").touch()
        return {}


@pytest.mark.usefixtures("interactive_sigint")
@pytest.mark.parametrize("mode", ["trainer", "deaf"])
def test_a_stop_ends_a_worker_whose_training_would_outlive_sigterm(tmp_path, monkeypatch, mode):
    """The lab's process ends its workers with SIGTERM. A Trainer's stop button would take
    it as a clean stop, hand back its result and leave the worker waiting for the next job,
    and the lab's process waiting for the worker (a CI run hung so): a worker exits at the
    signal instead. One that ignores it (a plugin's own handler) is killed."""
    monkeypatch.setattr(parts, "END_GRACE_S", 0.5)
    jobs = [_TrainingJob("long", tmp_path, mode), _TrainingJob("short", tmp_path, "short")]

    def stop_after_the_first(job, measured):
        os.kill(os.getpid(), signal.SIGINT)

    stuck = threading.Event()                            # a guard, so a regression fails

    def unstick():                                       # rather than hangs the suite
        stuck.set()
        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGKILL)
    guard = threading.Timer(120, unstick)
    guard.start()
    try:
        with pytest.raises(parts.TrainingStopped):
            parts.train_in_workers(jobs, 2, stop_after_the_first)
    finally:
        guard.cancel()
    assert not stuck.is_set(), "a worker outlived the lab's SIGTERM"
    assert (tmp_path / "started").exists()               # the long job was under way
    assert not (tmp_path / "caught").exists()            # its training never saw the stop
    assert multiprocessing.active_children() == []


def test_a_worker_killed_is_named_and_the_finished_models_are_kept(tmp_path):
    jobs, got = _jobs(tmp_path, archs=("bcmt", "cat")), []

    def kill_a_worker(job, measured):
        got.append(job.key)
        for child in multiprocessing.active_children():
            if child.name.startswith(("SpawnProcess", "ForkServerProcess")):
                os.kill(child.pid, signal.SIGKILL)

    with pytest.raises(parts.WorkerLost, match="a worker process died while training the "
                                               "recall model .* workers=0"):
        parts.train_in_workers(jobs, 2, kill_a_worker)
    assert 1 <= len(got) < len(jobs)
    assert multiprocessing.active_children() == []


def test_workers_are_used_on_a_cpu_with_threads_to_share_only():
    two = [object(), object()]
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert parts.worker_count(two, cpu) == 0                 # one thread here (conftest)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert parts.worker_count(two, cpu) == 2
        assert parts.worker_count(two[:1], cpu) == 0         # one model: nothing to share
        assert parts.worker_count(two, cuda) == 0            # an accelerator trains them
    finally:
        torch.set_num_threads(threads)
    assert parts.worker_count(two, cpu, workers=5) == 2      # never more than the jobs
    assert parts.worker_count(two, cpu, workers=1) == 0      # one: in this process


@pytest.mark.parametrize("workers", [-1, True, 1.5, "2"])
def test_bad_worker_counts_are_refused_before_any_work(tmp_path, workers):
    with pytest.raises(ValueError, match=f"workers={workers!r} is not allowed: expected None"):
        lab.Lab("tiny", tmp_path, archs=["bcmt"], progress=False, workers=workers)
    assert not (tmp_path / lab.RESULTS_NAME).exists()


def test_the_command_line_takes_workers_and_refuses_a_bad_count(tmp_path, capsys):
    assert reproduce_main(["--preset", "tiny", "--arch", "bcmt", "--workers", "-2",
                           "--out", str(tmp_path)]) == 2
    assert "workers=-2 is not allowed" in capsys.readouterr().err


def test_the_progress_never_falls_back_after_the_workers_and_ends_at_100(tmp_path, capsys):
    """The recall tasks the workers did count as done once they end: the bar does not drop
    while the language models train, and those tasks add nothing when they run."""
    lab.Lab("tiny", tmp_path, archs=["bcmt"], corpus=load_corpus("offline"),
            workers=2).run()
    shares = [int(line.split("]")[2].split("%")[0])
              for line in capsys.readouterr().err.splitlines()
              if line.startswith("[reproduce] [")]
    assert shares == sorted(shares), shares
    assert shares[-1] == 100


def test_a_mechanism_a_fresh_process_cannot_build_trains_in_the_lab_process(tmp_path,
                                                                             monkeypatch):
    """A mechanism defined in a notebook (no source a worker could import) trains here; the
    others still go to the workers."""
    monkeypatch.setattr(parts, "can_run_in_workers", lambda arch: arch != "bcmt")
    here, real = [], lab_run.recall_part
    monkeypatch.setattr(lab_run, "recall_part", lambda job, *a: here.append(job.key)
                        or real(job, *a))
    results = lab.Lab("tiny", tmp_path, archs=["bcmt"], corpus=load_corpus("offline"),
                      progress=False, tasks=("recall",), workers=2).run()
    assert sorted(here) == ["bcmt/model/0", "bcmt/twin/0"]
    assert set(results["parts"]) == {"dense/model/0", "bcmt/model/0", "bcmt/twin/0"}


def test_dense_recall_read_from_another_run_is_not_trained_again(tmp_path, monkeypatch):
    corpus = load_corpus("offline")
    first = lab.Lab("tiny", tmp_path / "first", archs=["bcmt"], corpus=corpus, progress=False,
                    tasks=("recall",), workers=0).run()
    trained = []
    real = lab_run.recall_part
    monkeypatch.setattr(lab_run, "recall_part",
                        lambda job, *a, **k: trained.append(job.key) or real(job, *a, **k))
    source = tmp_path / "first" / lab.RESULTS_NAME
    second = lab.Lab("tiny", tmp_path / "second", archs=["cat"], corpus=corpus, progress=False,
                     tasks=("recall",), workers=0, dense_recall_from=source).run()
    assert sorted(trained) == ["cat/model/0", "cat/twin/0"]
    assert second["parts"]["dense/model/0"] == first["parts"]["dense/model/0"]
    assert second["parts_from"] == {"dense/model/0": str(source)}
    assert {row["dense"] for row in second["memory_pays"]} == \
        {first["memory_pays"][0]["dense"]}


def test_a_dense_recall_source_of_another_setting_is_refused_before_any_work(tmp_path):
    corpus = load_corpus("offline")
    lab.Lab("tiny", tmp_path / "tiny", archs=["dense"], corpus=corpus, progress=False,
            tasks=("recall",), workers=0).run()
    with pytest.raises(ValueError, match=r"dense_recall_from=.*preset 'fast'"):
        lab.Lab("fast", tmp_path / "fast", archs=["bcmt"], corpus=corpus, progress=False,
                tasks=("recall",), dense_recall_from=tmp_path / "tiny" / lab.RESULTS_NAME)
    assert not (tmp_path / "fast" / lab.RESULTS_NAME).exists()
    with pytest.raises(ValueError, match="cannot be read"):
        lab.Lab("tiny", tmp_path / "other", archs=["bcmt"], corpus=corpus, progress=False,
                tasks=("recall",), dense_recall_from=tmp_path / "missing.json")


LAB_KILLED_OUTRIGHT = """
import sys
from pathlib import Path
from blockmem_lite.lab import parts
from tests.test_lab_parts import _TrainingJob
folder = Path(sys.argv[1])
jobs = [_TrainingJob(key, folder, "trainer") for key in ("a", "b")]
parts.train_in_workers(jobs, 2, lambda job, measured: None)
"""


def _living_descendants(pid: int) -> set[int]:
    """The processes below ``pid`` that have not exited (Linux's /proc; a zombie has)."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue                                    # ended while we read
        if fields[0] != "Z":
            parent_of[int(stat.parent.name)] = int(fields[1])
    family, grew = {pid}, True
    while grew:
        below = {child for child, parent in parent_of.items() if parent in family}
        grew = not below <= family
        family |= below
    return family - {pid}


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_workers_end_when_the_lab_is_killed_outright(tmp_path):
    """SIGKILL of the lab's process (the out-of-memory killer, a kernel restarted while it
    trains) leaves no worker training on: every process the lab started is gone soon after."""
    lab_process = subprocess.Popen([sys.executable, "-c", LAB_KILLED_OUTRIGHT, str(tmp_path)],
                                   cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "started").exists(), "no worker started training"
        family = _living_descendants(lab_process.pid)     # workers, forkserver, tracker
        assert len(family) >= 2, family
    finally:
        lab_process.kill()
        lab_process.wait()
    deadline = time.monotonic() + 20
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _alive(family)
    for pid in left:                                    # never leave them to the suite
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of the lab's {len(family)} processes outlived it"

