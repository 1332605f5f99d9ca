"""The lab's small models (recall and facts), trained one per CPU core side by side.

The recall experiment trains many small independent models (every entry, seed and twin
at the recall recipe's sizes: d=64, T=64, batch 32). A step of such a model spends about
half its time in small element-wise kernels and copies that a second thread does not
speed up, so two models trained at once, one thread each, finish sooner than the same
two one after the other on two threads: on a 2-core CPU (with ``OMP_WAIT_POLICY=PASSIVE``,
as the Makefile and the site run everything) that is more than twice the throughput for
a small dense model and about one and a half times for the multi-chunk CAT.

One thread sums in another order than two, so a model trained here is not equal to the
last bit to the same model trained on two threads: dense, BCMT, CAT and twin figures
differ in the second decimal at most, but ARMT's curriculum amplifies rounding, so one of
its seeds can end visibly apart. On one thread everywhere (the tests) the results are
equal bit for bit.

The class language models (d=128, T=256, batch 16) are matmul-bound and do scale with
threads: two at once, one thread each, gain nothing (in a class run, two of the iso-FLOP
dense model took 182 s each against 85 s one after the other on two threads) or lose (two
multi-chunk CATs, whose decoder is twice as wide: 661 s each against 241 s), so the lab
trains those, every seed, in its own process on every thread (``lab.language_models``). The facts models have the same width at half the length
(T=128, batch 16, optimizer step included) and still gain about a quarter in throughput
two at once, so they join the recall models on the workers (``FactsJob``), where they
also fill the gap the last long recall model leaves.

``recall_part`` and ``facts_part`` train and measure one model, in the lab's process or
in a worker; ``train_in_workers`` runs a list of jobs on a pool of worker processes
(``forkserver``, ``spawn`` on Windows: fresh processes, started once, that never inherit a
notebook kernel's threads; the jobs travel pickled, to functions of this module), hands each
result to the caller as it arrives (the lab stores it at once), turns the workers' step
reports into one progress fraction and their probes into the caller's live views. A stop
(Ctrl-C, SIGTERM, SIGHUP where there is one) ends the workers at once: what finished is
stored, the trainings under way are dropped (``TrainingStopped``). A worker that dies
(killed, out of memory) ends the others the same way and is named (``WorkerLost``):
``concurrent.futures`` notices a dead worker, where a ``multiprocessing.Pool`` would wait
for its result forever. A lab's process killed outright (SIGKILL, out of memory, a kernel
restarted) takes its workers with it: each watches a pipe only the lab holds open
(``_end_with_the_lab``).

``parts_of_run`` takes finished recall models from another run instead (a notebook reads
the kit's shipped dense reference rather than training it a third time).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import queue as queue_module
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Callable

import torch

from blockmem_lite import distributed, knowledge, recall, registry
from blockmem_lite.config import ModelConfig, RunConfig
from blockmem_lite.measure import metrics
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import keep_freed_memory, seed_everything
from blockmem_lite.train import Trainer
from blockmem_lite.train.callbacks import History
from blockmem_lite.train.stopping import StopButton

PROBE_POINTS = 10              # probes of a watched recall model over its training
REPORT_EVERY_S = 0.5           # a worker's step reports, at most this often
END_GRACE_S = 10.0             # a worker still alive this long after SIGTERM is killed
ORPHANED_EXIT = 70             # a worker's exit status when the lab's process is gone


class TrainingStopped(KeyboardInterrupt):
    """A stop (Ctrl-C, SIGTERM, SIGHUP) ended a training; ``history.stopped_by`` names the
    signal. Nothing half-trained is stored."""

    def __init__(self, history):
        super().__init__(history.stopped_by or "SIGINT")
        self.history = history


def finished(history):
    """``history``, or TrainingStopped when a stop ended its training (nothing half-trained
    is stored; the command line says how to continue)."""
    if history.interrupted:
        raise TrainingStopped(history)
    return history


@dataclass(frozen=True)
class RecallJob:
    """One recall model: which entry, role (model or twin) and seed, and its settings."""

    key: str                        # its part's key in results["parts"]
    label: str                      # the lab entry
    name: str                       # shown while it trains, e.g. "cat twin seed 0"
    arch: str                       # the entry's architecture (its LabSpec)
    cfg: ModelConfig                # at the recall recipe's sizes
    run: RunConfig                  # the entry's run (its training settings)
    recipe: recall.RecallRecipe
    seed: int

    @property
    def spec(self) -> registry.LabSpec:
        return registry.lab_spec(self.arch)

    @property
    def steps(self) -> int:
        """Training steps over every stage (the curriculum's stages each take the budget)."""
        return self.recipe.steps * len(recall.stages(self.recipe, self.spec.recall_curriculum))

    @property
    def cost(self) -> float:
        """Forward FLOPs of the whole training, over every stage at its own length: what
        orders the jobs, longest first (a mechanism without a FLOP model is priced as dense
        of its sizes)."""
        dense = _dense_of(self.cfg)
        total = 0.0
        for stage in recall.stages(self.recipe, self.spec.recall_curriculum):
            per_token = (metrics.flops_per_token(self.cfg, stage.seq_len)
                         or metrics.flops_per_token(dense, stage.seq_len))
            total += stage.steps * stage.batch_size * stage.seq_len * per_token
        return total

    task = "recall"                 # the lab's task it belongs to
    watched = True                  # a live view may follow its recall accuracy

    def train(self, callbacks_for: Callable = lambda name, stage: []) -> dict:
        return recall_part(self, callbacks_for)


@dataclass(frozen=True)
class FactsJob:
    """One facts model: a lab entry pretrained on a table of ``count`` entities."""

    key: str                        # its part's key in results["parts"]
    label: str
    name: str                       # shown while it trains, e.g. "moc facts 64"
    arch: str
    cfg: ModelConfig                # at the facts recipe's length
    run: RunConfig
    recipe: knowledge.FactsRecipe
    count: int

    @property
    def steps(self) -> int:
        return self.recipe.steps

    @property
    def cost(self) -> float:
        """Forward FLOPs of the whole training (as ``RecallJob.cost``)."""
        per_token = metrics.flops_per_token(self.cfg, self.recipe.seq_len) or \
            metrics.flops_per_token(_dense_of(self.cfg), self.recipe.seq_len)
        return self.steps * self.recipe.batch_size * self.recipe.seq_len * per_token

    task = "facts"
    watched = False

    def train(self, callbacks_for: Callable = lambda name, stage: []) -> dict:
        return facts_part(self, callbacks_for)


def _dense_of(cfg: ModelConfig) -> ModelConfig:
    """Dense at ``cfg``'s sizes: the price of a mechanism without a FLOP model."""
    return ModelConfig(registry.BASELINE, d_model=cfg.d_model, n_layer=cfg.n_layer,
                       n_head=cfg.n_head, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)


def recall_part(job: RecallJob, callbacks_for: Callable = lambda name, stage: []) -> dict:
    """``job``'s model trained on fresh recall rows (in the curriculum's stages where its
    LabSpec asks for them) and measured at every variant: {variant: recall.measure(...)}.
    ``callbacks_for(shown name, stage index) -> trainer callbacks`` for each stage."""
    spec, world = job.spec, distributed.current()
    staged = spec.recall_curriculum
    seed_everything(job.seed)
    model = build_model(job.cfg)                 # its own sizes: never a trained LM's start

    def trainer_for(stage: recall.RecallRecipe, rows, k: int) -> Trainer:
        run = dataclasses.replace(job.run, model=job.cfg,
                                  train=stage.train_config(job.run.train, job.seed))
        shown = f"{job.name}, stage {k + 1} (T={stage.seq_len})" if staged else job.name
        return Trainer(model, run.replace(checkpoint_dir=None), rows,
                       callbacks=callbacks_for(shown, k))

    finished(recall.train(job.recipe, trainer_for, staged=staged))
    measured = {}
    variants = spec.variants(job.cfg) if spec.variants else [("", {})]
    for variant, overrides in variants:
        if overrides:
            spec.switch(model, overrides)
        measured[variant] = world.on_main(lambda: recall.measure(model, job.recipe))
    return measured


def facts_part(job: FactsJob, callbacks_for: Callable = lambda name, stage: []) -> dict:
    """``job``'s model (fresh, seeded) pretrained on its table of facts and measured
    (``knowledge.measure``)."""
    facts = knowledge.table(job.count, job.recipe)
    run = dataclasses.replace(job.run, model=job.cfg,
                              train=job.recipe.train_config(job.run.train))
    seed_everything(job.recipe.seed)
    model = build_model(job.cfg)
    finished(Trainer(model, run.replace(checkpoint_dir=None),
                     knowledge.training_windows(facts, job.recipe),
                     callbacks=callbacks_for(job.name, 0)).fit())
    return distributed.current().on_main(lambda: knowledge.measure(model, facts, job.recipe))


def can_run_in_workers(arch: str) -> bool:
    """Whether a fresh process can build ``arch`` (a built-in, an installed entry point or a
    plugin file; not a mechanism defined in this notebook or session)."""
    return bool(registry.source(arch))


def worker_count(jobs: list, device: torch.device, workers=None) -> int:
    """How many worker processes to use: ``workers`` when given, else one per thread torch
    uses here on a CPU with at least two, and none (train in this process) on an
    accelerator, under torchrun, or for fewer than two jobs."""
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"workers={workers!r} is not allowed: expected None (one per CPU "
                             "thread) or an integer >= 0 (0 or 1: train in this process)")
        return min(workers, len(jobs)) if workers > 1 else 0
    if device.type != "cpu" or distributed.current().distributed or len(jobs) < 2:
        return 0
    threads = torch.get_num_threads()
    return min(threads, len(jobs)) if threads >= 2 else 0


# --- the workers ------------------------------------------------------------------------------
_reports = None                   # the worker's queue to the lab's process


def _start_worker(reports, threads: int, plugins: tuple[str, ...], lab_alive) -> None:
    """Each worker: its share of the threads, Ctrl-C and a closed terminal left to the lab's
    process (which ends the workers), SIGTERM (how it ends them) ending the worker at once,
    the lab's life watched (``_end_with_the_lab``), and the plugin files the jobs need.

    A worker's Trainer must not catch the SIGTERM: its stop button takes over any signal
    still at its default handler, so a training under way would stop cleanly, hand back its
    result and the worker wait for the next job, while the lab's process waits for it to
    end: the stop would hang (``test_lab_parts``'s stop test covers it)."""
    global _reports
    _reports = reports
    keep_freed_memory()               # a process of its own, only training: no fresh-page faults
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):                       # not on Windows
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _end_worker_now)
    _end_with_the_lab(lab_alive)
    registry.load_entry_points()
    for path in plugins:
        registry.load_plugin(path)


def _end_with_the_lab(lab_alive) -> None:
    """Exit this worker as soon as the lab's process is gone, however it went (SIGKILL, the
    out-of-memory killer, a notebook kernel restarted while it trained): the lab holds the
    only writing end of the ``lab_alive`` pipe and never writes, so a read returns only
    when that end closes, with the lab. Without it a worker would train on, unsupervised,
    for results nobody takes. A pipe works on every platform, where a parent-death signal
    is Linux's alone (and a worker's parent is the forkserver, not the lab)."""
    def watch() -> None:
        try:
            lab_alive.recv()
        except (EOFError, OSError):
            pass
        os._exit(ORPHANED_EXIT)
    threading.Thread(target=watch, name="blockmem-lab-watch", daemon=True).start()


def _end_worker_now(signum, frame) -> None:
    """A worker's SIGTERM handler: exit at once. Its training under way is dropped by
    design (the module docstring), and an exception would only reach the pool's worker
    loop, which reports it and waits for the next job."""
    os._exit(128 + signum)


class _Reporter:
    """A worker's trainer callback: the step (at most every ``REPORT_EVERY_S``) and, for a
    watched job, the beyond-span accuracy at the recall monitor's points."""

    def __init__(self, index: int, job: RecallJob, probe_every: int | None, shown: str,
                 stage: int):
        self.index, self.job, self.probe_every, self.shown = index, job, probe_every, shown
        self.before = stage * job.recipe.steps          # the steps of the stages before
        self.last = 0.0

    def on_step(self, trainer, rec: dict) -> None:
        step, total = rec["step"], rec["total_steps"]
        now = time.monotonic()
        if now - self.last >= REPORT_EVERY_S or step == total:
            _reports.put(("step", self.index, self.shown, self.before + step, step, total))
            self.last = now
        if self.probe_every and (step == 1 or step == total or step % self.probe_every == 0):
            accuracy = recall.beyond(trainer.model, self.job.recipe)["accuracy"]
            _reports.put(("probe", self.index, self.shown, self.before + step, step, total,
                          accuracy))


def _run_job(index: int, job, watched: bool) -> tuple[int, dict]:
    every = max(1, job.recipe.steps // PROBE_POINTS) if watched and job.watched else None
    return index, job.train(lambda shown, k: [_Reporter(index, job, every, shown, k)])


def train_in_workers(jobs: list, workers: int, on_result: Callable,
                     on_progress: Callable = lambda fraction, text: None,
                     live_for: Callable | None = None) -> None:
    """Train ``jobs`` on ``workers`` processes, the costliest first (``RecallJob.cost``: a
    long job handed out last leaves the other workers idle at the end; by steps alone,
    CAT's costly jobs would go last and one worker would idle for minutes, by cost the
    workers end close together); ``on_result(job, measured)``
    as each one ends, ``on_progress(share of the work, text)`` as they train (``done_share``),
    ``live_for(name, recipe)`` gives each watched stage's live view (a callback with
    ``record(step, accuracy, total_steps)``, e.g. ``lab.figures.recall_monitor``).

    A worker's error is raised here (the finished jobs already handed over), a worker that
    died (killed, out of memory) as ``WorkerLost`` naming its model; a stop raises
    ``TrainingStopped``. Either way every worker is ended before this returns."""
    order = costliest_first(jobs)
    threads = max(1, torch.get_num_threads() // workers)
    plugins = tuple(sorted({p for job in jobs if (p := registry.plugin_file(job.arch))}))
    context = _worker_context()
    reports = context.Queue()
    done_steps = {i: 0 for i in order}
    views: dict[str, object] = {}
    lab_alive, held_by_the_lab = context.Pipe(duplex=False)     # (read end, write end)
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                               initargs=(reports, threads, plugins, lab_alive))
    try:
        with StopButton() as stop:
            pending = {pool.submit(_run_job, i, jobs[i], live_for is not None): i
                       for i in order}
            while pending:
                if stop.requested:
                    history = History()
                    history.interrupted, history.stopped_by = True, stop.signal_name or "SIGINT"
                    raise TrainingStopped(history)
                _drain(reports, jobs, done_steps, views, live_for)
                on_progress(done_share(jobs, done_steps),
                            f"{len(jobs) - len(pending)} of {len(jobs)} small models on "
                            f"{workers} processes")
                for future in [f for f in pending if f.done()]:
                    i = pending.pop(future)
                    on_result(jobs[i], _result_of(future, jobs[i]))
                    done_steps[i] = jobs[i].steps
    finally:
        _end(pool)
        reports.close()
        held_by_the_lab.close()
        lab_alive.close()


def _worker_context():
    """The workers' start method: ``forkserver`` (Linux, macOS), its server importing this
    module once for all the workers; ``spawn`` where the platform has no forkserver
    (Windows), each worker importing it itself."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["blockmem_lite.lab.parts"])
    return context


def done_share(jobs: list, done_steps: dict[int, int]) -> float:
    """The share of the jobs' work done: each job's steps done, weighted by its ``cost``
    per step. By steps alone the bar and its ETA would be far off at the start: CAT's four
    recall models, a fifth of the steps and over a third of the work, go first."""
    total = sum(job.cost for job in jobs)
    if not total:
        return sum(done_steps.values()) / max(1, sum(job.steps for job in jobs))
    return sum(done * jobs[i].cost / jobs[i].steps for i, done in done_steps.items()) / total


def costliest_first(jobs: list) -> list[int]:
    """The indices of ``jobs`` in the order they are handed out: by ``cost``, highest first
    (equal costs keep the plan's order)."""
    return sorted(range(len(jobs)), key=lambda i: -jobs[i].cost)


class WorkerLost(RuntimeError):
    """A worker process died (killed, or out of memory) while training a model."""


def _result_of(future, job) -> dict:
    """A finished job's measurements; its error raised, naming the model."""
    try:
        _, measured = future.result()
    except BrokenProcessPool:
        raise WorkerLost(f"a worker process died while training the {job.task} model {job.name!r} "
                         "(killed, or out of memory); the models finished before it are "
                         "kept: run the same command again to continue, or with workers=0 "
                         "(--workers 0) to train one model at a time in this process") from None
    except FloatingPointError as err:            # a training broke: say whose
        err.label, err.task = job.label, job.task
        raise
    return measured


def _end(pool: ProcessPoolExecutor) -> None:
    """Every worker ended at once, the running trainings with them (the executor has no
    public way to stop a running call before Python 3.14's ``terminate_workers``): SIGTERM,
    then SIGKILL for any worker still alive ``END_GRACE_S`` later (a plugin's own SIGTERM
    handler, say), so this always returns."""
    processes = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(END_GRACE_S)
        if process.is_alive():
            process.kill()
            process.join()


def _drain(reports, jobs, done_steps: dict, views: dict, live_for) -> None:
    """Every report the workers sent so far (waiting up to 0.2 s for the first)."""
    timeout = 0.2
    while True:
        try:
            message = reports.get(timeout=timeout)
        except queue_module.Empty:
            return
        timeout = 0.0
        kind, index, shown, so_far, step, total = message[:6]
        done_steps[index] = max(done_steps[index], so_far)
        if kind == "probe" and live_for is not None:
            if shown not in views:
                views[shown] = live_for(shown, jobs[index].recipe)
            views[shown].record(step, message[6], total)


def parts_of_run(other: dict, source, preset_name: str, recipe: recall.RecallRecipe,
                 label: str, keys: list[str]) -> dict:
    """{key: measured part} of ``keys`` that ``other`` (the results read from ``source``)
    holds for ``label``; a ValueError naming ``source`` unless that run is of
    ``preset_name`` and trained ``label`` with ``recipe`` (its seeds aside)."""
    def without_seeds(values: dict) -> dict:
        return {k: v for k, v in values.items() if k not in ("seeds", "twin_seeds")}

    record = other["done"].get(f"recall/{label}") or {}
    ours = json.loads(json.dumps(without_seeds(dataclasses.asdict(recipe))))
    if other["meta"].get("preset") != preset_name or \
            without_seeds(record.get("recipe") or {}) != ours:
        raise ValueError(f"dense_recall_from={str(source)!r} is not allowed: it holds no "
                         f"{label} recall run of preset {preset_name!r} with this recall "
                         f"recipe; expected a results.json of `reproduce --preset "
                         f"{preset_name}`")
    held = other.get("parts", {})
    return {key: held[key] for key in keys if key in held}
