"""The comparison lab: every registered mechanism on the same work, the papers' claims beside ours.

``reproduce(preset, out=...)`` trains every architecture (plugins included) on the same data,
with the same token budget and seed, and measures, per entry:

* ``lm``: validation loss after training (a multi-chunk CAT at each chunk size) at each of
  the preset's ``lm_seeds`` seeds (the claims judge the seed band), and the loss at each
  position of the window, with the memory and, for a mechanism with a twin, the same
  weights with the memory path off;
* ``recall``: the recall experiment (``recall``): the entry at the recipe's small sizes
  and one local span, trained on fresh MQAR and passkey rows at every recipe seed, with
  its memory-less twin where it declares one; accuracy against distance, beyond the span,
  and the twin's blindness ("when does memory pay?");

and once for all of them, in one process so the ratios are same-run ratios:

* ``bench``: training and decoding tokens/s and memory vs dense with their FLOP ceilings
  (``bench.bench_phase`` on the lab's own configs), and the decoding state after t
  tokens at several lengths, next to each mechanism's analytic state model.

Each finished (task, entry) is stored in ``OUT/results.json`` at once (atomically), so an
interrupted run continues where it stopped and recomputes nothing. The verdicts
(``lab.verdicts``) and ``report.md`` (with the claims table; ``lab.report``) are written at
the end; the command line adds ``plots/*.html`` (``lab.figures.write_plots``) and writes the
report again to link them. One progress line covers the whole plan, with an ETA.

Under torchrun (``distributed.setup``) every language model and recall model trains with
all the processes (``train.Trainer``); rank 0 alone reads and writes ``OUT``, runs the
measurements that are not training (recall curves, benches) while the others wait, and
hands what it read or measured to them, so every process follows the same plan. A stop
(Ctrl-C, SIGTERM) ends the run after the current training step, with nothing half-done
stored; the command line exits with 128 + the signal's number, as ``train`` does
(``TrainingStopped`` carries the stopped training's History). A stored file that cannot be
read (``results.json``, a trained model) and a model whose training breaks (a non-finite
loss) are clear errors naming the file or the mechanism; what is stored stays.

The lab names no mechanism: what a mechanism needs beyond "train it, measure it" it
declares in its ``LabSpec`` (CAT's multi-chunk config and chunk sizes, ARMT starting
from the trained dense model, MoC's iso-FLOP dense baseline, each one's local span).
Each mechanism's memory-less twin is its ``LabSpec.twin``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from blockmem_lite import course, distributed, knowledge, recall, registry
from blockmem_lite.checkpoints import atomic_write, atomic_write_bytes, prepare_folder
from blockmem_lite.config import PRESET_NAMES, ModelConfig, RunConfig, preset
from blockmem_lite.corpora import load_corpus
from blockmem_lite.lab import lab_bench, language_models, parts
from blockmem_lite.lab.parts import FactsJob, RecallJob, facts_part, recall_part
from blockmem_lite.lab.progress import PlanProgress
from blockmem_lite.lab.report import write_report
from blockmem_lite.lab.verdicts import claims_table, knowledge_pays, memory_pays
from blockmem_lite.measure import bench, metrics
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import pick_device, seed_everything
from blockmem_lite.validation import check_choice, fail

RESULTS_NAME = "results.json"
RESULTS_FORMAT = "blockmem_lite.lab/3"   # /3: language models at several seeds, by position
DETERMINISTIC = ("lm", "recall", "facts")  # tasks whose results are equal when rerun

# how much work each preset's lab does (the model sizes come from the preset itself; the
# recall experiment's sizes are recall.RECALL_SIZES). The class lab takes about an hour on a
# 2-core CPU, not the 30 minutes a class period allows: its 19 language models alone take 42
# minutes at three seeds. Fitting them in the 14 minutes the recall, facts and bench leave
# would mean about 200 steps of 8 sequences, which trains dense to 2.01 nats a byte against
# 1.51 here (seed 0), too little learned for the claims to judge. So the class run is made
# before class (stopped, it resumes), the kit ships one, and --lm-seeds 1 is the shorter run.
LAB_SIZES = {
    "tiny": dict(steps=20, lm_seeds=1, bench_lens=(32,),
                 state_lens=(32, 64), warmup=1, repeats=1, decode_burst=2),
    "fast": dict(steps=60, lm_seeds=1, bench_lens=(64, 128),
                 state_lens=(64, 256, 1024), warmup=1, repeats=2, decode_burst=4),
    "class": dict(steps=300, lm_seeds=3, bench_lens=(256, 1024),
                  state_lens=(256, 1024, 4096, 16384), warmup=3, repeats=5, decode_burst=16),
    "gpu": dict(steps=3000, lm_seeds=3, bench_lens=(1024, 4096),
                state_lens=(1024, 4096, 16384, 65536), warmup=5, repeats=10, decode_burst=32),
}


def shipped_run(preset_name: str) -> Path | None:
    """The ``results.json`` of the kit's own run of ``preset_name`` on a 2-core CPU
    (``data/reproduce/<preset>_cpu`` of a checkout, or the same inside an installed wheel);
    None where this install has none."""
    runs = course.shipped_runs()
    path = runs / f"{preset_name}_cpu" / RESULTS_NAME if runs else None
    return path if path and path.is_file() else None


# --- the plan ----------------------------------------------------------------------------------
@dataclass
class Entry:
    """One model of the lab: a label, its architecture and config, where it comes from."""

    label: str
    arch: str
    cfg: ModelConfig
    run: RunConfig
    baseline_of: str = ""              # e.g. the iso-FLOP dense model of "moc"

    @property
    def spec(self) -> registry.LabSpec:
        return registry.lab_spec(self.arch) if not self.baseline_of else registry.LabSpec()

    def local_span(self, overrides: dict, cfg: ModelConfig | None = None) -> int | None:
        """The local span of ``cfg`` (default the entry's) in one variant's setting."""
        spec = self.spec
        return spec.local_span(dataclasses.replace(cfg or self.cfg, **overrides)) \
            if spec.local_span else None

    def variants(self, cfg: ModelConfig | None = None) -> list[tuple[str, dict]]:
        """[(label, overrides)] of ``cfg`` (default the entry's): e.g. CAT's chunk sizes."""
        spec = self.spec
        return spec.variants(cfg or self.cfg) if spec.variants else [("", {})]


def plan_entries(preset_name: str, archs=None, steps: int | None = None,
                 seed: int | None = None) -> list[Entry]:
    """Dense first, then every architecture (default: all registered) and its baselines;
    every language model trained with ``seed`` (default: the preset's)."""
    check_choice("preset", preset_name, PRESET_NAMES)
    archs = bench.resolve_archs(archs if archs is not None else registry.names())
    archs = [registry.BASELINE] + [a for a in archs if a != registry.BASELINE]
    steps = steps or LAB_SIZES[preset_name]["steps"]
    seeded = {} if seed is None else {"seed": seed}
    entries = []
    for arch in archs:
        run = preset(preset_name, arch=arch, steps=steps, **seeded)
        spec = registry.lab_spec(arch)
        cfg = spec.config(run.model) if spec.config else run.model
        entries.append(Entry(arch, arch, cfg, dataclasses.replace(run, model=cfg)))
        if spec.iso_flop_baseline:
            base_cfg = metrics.iso_flop_dense_config(cfg)
            entries.append(Entry(f"{base_cfg.arch} iso-FLOP ({arch})", base_cfg.arch, base_cfg,
                                 dataclasses.replace(run, model=base_cfg), baseline_of=arch))
    return entries


def plan_tasks(entries: list[Entry]) -> list[tuple[str, str]]:
    """[(task, entry label)]: language modelling for all; recall for dense (that the task is
    learnable) and for every mechanism with a memory-less twin (whether its memory pays
    beyond its span; a mechanism without one, e.g. HOnly, which is BCMT's twin, or MoC,
    whose memory is in its weights, has nothing to compare there); the facts for a
    mechanism with an iso-FLOP baseline and for that baseline; then one bench."""
    return ([("lm", e.label) for e in entries]
            + [("recall", e.label) for e in entries
               if e.spec.twin or (e.arch == registry.BASELINE and not e.baseline_of)]
            + [("facts", e.label) for e in entries if e.baseline_of or e.spec.iso_flop_baseline]
            + [("bench", "*")])


# --- the tasks -----------------------------------------------------------------------------------
class Lab:
    """One reproduce run: its plan, the store in ``out`` and the models trained so far."""

    def __init__(self, preset_name: str, out, archs=None, corpus=None, steps: int | None = None,
                 progress: bool = True, live=None, recall_live=None, tasks=None,
                 recall_seeds=None, workers=None, dense_recall_from=None, seed=None,
                 lm_seeds=None):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed={seed!r} is not allowed: expected None (the preset's) or an "
                             "integer >= 0")
        if lm_seeds is not None and (isinstance(lm_seeds, bool) or not isinstance(lm_seeds, int)
                                     or lm_seeds < 1):
            raise ValueError(f"lm_seeds={lm_seeds!r} is not allowed: expected None (the "
                             "preset's) or an integer >= 1")
        if live is not None and not callable(getattr(live, "run", None)):
            raise ValueError(f"live={live!r} is not allowed: expected None or a live view with "
                             "run(name) -> trainer callback (viz.comparison.LiveComparison)")
        if recall_live is not None and not callable(recall_live):
            raise ValueError(f"recall_live={recall_live!r} is not allowed: expected None or a "
                             "function (name, recipe) -> trainer callback "
                             "(lab.figures.recall_monitor)")
        self.live, self.recall_live = live, recall_live
        parts.worker_count([], torch.device("cpu"), workers)          # checks it, before work
        self.workers = workers
        self.world = distributed.current()
        distributed.check_same_settings(   # every rank the same plan, before any work
            {"preset": preset_name, "archs": archs, "steps": steps, "tasks": tasks,
             "recall_seeds": recall_seeds, "dense_recall_from": str(dense_recall_from),
             "seed": seed, "lm_seeds": lm_seeds}, self.world, what="reproduce settings")
        self.preset = preset_name
        self.sizes = dict(LAB_SIZES[preset_name], **({"steps": steps} if steps else {}),
                          **({"lm_seeds": lm_seeds} if lm_seeds else {}))
        if seed is not None and recall_seeds is None:     # the run's seed moves the recall ones
            recall_seeds = tuple(seed + s for s in _recipe(preset_name, None).seeds)
        self.recipe = _recipe(preset_name, recall_seeds)
        if recall_seeds is not None:
            self.sizes["recall_seeds"] = list(self.recipe.seeds)
        self.entries = plan_entries(preset_name, archs, self.sizes["steps"], seed)
        for entry in self.entries:                              # before any work
            distributed.check_batch_size(entry.run.train.batch_size, self.world.world_size)
        self.by_label = {e.label: e for e in self.entries}
        self.plan = _only(plan_tasks(self.entries), tasks)
        self.out = self.world.on_main(lambda: prepare_folder(out, name="--out"))
        self.corpus = corpus if corpus is not None else load_corpus("offline")
        self.meta = self._meta()
        self.results = self.world.on_main(self._load)
        if dense_recall_from is not None:         # every rank gets the parts rank 0 read
            self.results = self.world.on_main(lambda: self._adopt_dense_recall(dense_recall_from))
        self.progress = PlanProgress(self.plan, set(self.results["done"]),
                                     stream=sys.stderr if progress and self.world.is_main
                                     else None)
        self.models: dict[str, torch.nn.Module] = {}

    # --- the store -----------------------------------------------------------------------
    def _meta(self) -> dict:
        device = pick_device(self.entries[0].run.train.device)
        meta = {"format": RESULTS_FORMAT, "preset": self.preset,
                "entries": [e.label for e in self.entries], "sizes": self.sizes,
                "plan": [f"{task}/{label}" for task, label in self.plan],
                "corpus": self.corpus.name, "corpus_source": self.corpus.source,
                "seed": self.entries[0].run.train.seed, "device": device.type,
                "machine": bench.machine(device), "torch": torch.__version__}
        return json.loads(json.dumps(meta))                 # as it reads back from the file

    def _load(self) -> dict:
        path = self.out / RESULTS_NAME
        if not path.is_file():
            return {"meta": self.meta, "done": {}}
        stored = _read_results(path)
        keys = ("format", "preset", "entries", "sizes", "corpus", "seed")
        changed = [k for k in keys if stored.get("meta", {}).get(k) != self.meta[k]]
        if changed:
            fail("--out", str(self.out), f"holds a run with other settings ({', '.join(changed)} "
                                         "differ); resume it with the same ones or use another "
                                         "folder")
        return stored

    def _adopt_dense_recall(self, source) -> dict:
        """Dense's recall models (the reference every memory is compared with) read from
        another run's ``results.json`` instead of trained (``parts.parts_of_run``); the
        results with them."""
        label = registry.BASELINE
        cfg = self._recall_roles(label)["model"]
        stored = self.results.setdefault("parts", {})
        wanted = [k for k in (self._recall_job(label, "model", cfg, seed).key
                              for seed in self.recipe.seeds) if k not in stored]
        taken = parts.parts_of_run(_read_results(Path(source)), source, self.preset,
                                   self.recipe, label, wanted)
        stored.update(taken)
        self.results.setdefault("parts_from", {}).update({k: str(source) for k in taken})
        if taken:
            self._store_results()
        return self.results

    def _store(self, key: str, value) -> None:
        self.results["done"][key] = value
        self._store_results()

    def _forget_parts(self, prefix: str) -> None:
        parts_done = self.results.get("parts", {})
        for key in [k for k in parts_done if k.startswith(prefix)]:
            del parts_done[key]
        self._store_results()

    def _store_results(self) -> None:
        if self.world.is_main:
            atomic_write_bytes(self.out / RESULTS_NAME,
                               json.dumps(self.results, indent=1, default=float).encode())

    # --- running -------------------------------------------------------------------------
    def run(self) -> dict:
        """Every task not stored yet, in plan order (the recall and facts models first, on
        worker processes where that pays); then the report."""
        self._train_in_workers()
        for task, label in self.plan:
            key = f"{task}/{label}"
            if key in self.results["done"]:
                continue
            self.progress.begin(task, label)
            try:
                value = getattr(self, f"_{task}")(label)
            except FloatingPointError as err:          # a training broke, on every process
                if label not in self.by_label:         # the bench trains nothing
                    raise
                raise FloatingPointError(self._broken_training(task, label, err)) from None
            self._store(key, value)
            if task == "lm":                  # its seeds' parts live on in the record
                self._forget_parts(f"lm:{label}/")
            self.progress.finish()
        self.results["claims"] = claims_table(self.results)
        self.results["memory_pays"] = memory_pays(self.results)
        self.results["knowledge"] = knowledge_pays(self.results)
        self._store_results()
        if self.world.is_main:
            write_report(self.results, self.out)
        return self.results

    def _broken_training(self, task: str, label: str, err: FloatingPointError) -> str:
        """What failed (the task, the mechanism and where it comes from) and what to do."""
        arch = self.by_label[label].arch
        source = registry.source(arch)
        origin = "" if source == registry.BUILTIN else f" (plugin {source or 'of this session'})"
        return (f"{task}/{label}: training the {arch} model{origin} failed: {err} The finished "
                f"tasks are kept in {self.out / RESULTS_NAME}: fix the mechanism or its "
                "settings, then run the same command again to continue")

    def _trained(self) -> dict:
        """Every language model trained so far (reloaded from OUT/models after a resume)."""
        for entry in self.entries:
            path = self.out / "models" / f"{_file_name(entry.label)}.pt"
            if entry.label in self.models:
                continue
            state = self.world.on_main(lambda path=path, label=entry.label:
                                       _stored_state(path, label))
            if state is not None:
                model = self._model_without_start(entry)
                try:
                    model.load_state_dict(state)
                except (RuntimeError, TypeError):           # other keys or shapes
                    raise ValueError(_unusable_model(path, entry.label, "its weights are not "
                                                     "this entry's model's")) from None
                self.models[entry.label] = model
        return self.models

    def _model_without_start(self, entry: Entry):
        seed_everything(entry.run.train.seed)
        return build_model(entry.cfg) if not entry.spec.start else \
            entry.spec.start(entry.cfg, _copies(self.models))

    def _lm(self, label: str) -> dict:
        """The entry trained at each of its seeds (one stored part per seed, so a resumed
        run retrains nothing), the seeds combined (``language_models.combine_seeds``)."""
        entry = self.by_label[label]
        jobs = self._lm_jobs(label)
        runs = {}
        for k, job in enumerate(jobs):
            self.progress.train_part(k, len(jobs))
            runs[job.seed] = self._lm_part(job)
        return {"arch": entry.arch, "baseline_of": entry.baseline_of,
                "starts_from_trained": entry.spec.start is not None,
                "local_span": {v: entry.local_span(o) for v, o in entry.variants()},
                **language_models.combine_seeds(runs)}

    def _lm_seeds(self, entry: Entry) -> list[int]:
        """The run's seed, and ``lm_seeds - 1`` after it for an entry that starts from
        scratch; one that starts from a trained model (ARMT) has the run's seed alone: no
        claim reads it, and each seed would need its own trained start."""
        count = 1 if entry.spec.start else self.sizes["lm_seeds"]
        return [entry.run.train.seed + k for k in range(count)]

    def _lm_jobs(self, label: str) -> list[language_models.LMRun]:
        entry = self.by_label[label]
        seeds = self._lm_seeds(entry)
        return [language_models.LMRun(
            label, label if seed == seeds[0] else f"{label} seed {seed}", entry.arch, entry.cfg,
            dataclasses.replace(entry.run, train=dataclasses.replace(entry.run.train, seed=seed)),
            self.corpus, tuple(entry.variants()), entry.baseline_of) for seed in seeds]

    def _lm_part(self, job: language_models.LMRun) -> dict:
        """One seed of a language model (stored in "parts", so a resumed run retrains
        nothing); the run's own seed keeps its model (``_keep_model``)."""
        stored = self.results.setdefault("parts", {})
        if job.key in stored:
            return stored[job.key]
        entry = self.by_label[job.label]
        start = None
        if entry.spec.start:
            seed_everything(job.run.train.seed)
            start = entry.spec.start(entry.cfg, _copies(self._trained()))
        live = [self.live.run(job.name)] if self.live is not None else []
        record, model = language_models.train_lm(job, [self.progress, *live], start)
        if job.seed == entry.run.train.seed:
            self._keep_model(job.label, model)
        stored[job.key] = record
        self._store_results()
        return record

    def _keep_model(self, label: str, model) -> None:
        """The run's own seed of ``label``: kept for the entries that start from it and
        stored in OUT/models (a resumed run reloads it)."""
        self.models[label] = model
        if self.world.is_main:
            atomic_write(self.out / "models" / f"{_file_name(label)}.pt",
                         lambda f: torch.save(model.state_dict(), f))

    def _recall(self, label: str) -> dict:
        """The entry at the recall recipe's sizes and span, trained at every recipe seed, and
        its memory-less twin where it has one (``recall`` module); one stored part per
        trained model, so a resumed run retrains nothing."""
        entry, recipe = self.by_label[label], self.recipe
        start = time.perf_counter()
        roles = self._recall_roles(label)
        cfg = roles["model"]
        record = {"arch": entry.arch, "recipe": json.loads(json.dumps(dataclasses.asdict(recipe))),
                  "chance": {"passkey": 1 / 10, "mqar": recall.chance(recipe)},
                  "local_span": {v: entry.local_span(o, cfg) for v, o in entry.variants(cfg)},
                  "stages": [s.seq_len for s in recall.stages(
                      recipe, entry.spec.recall_curriculum)]}
        for role, role_cfg in roles.items():
            runs = [self._recall_part(label, role, role_cfg, recipe, seed)
                    for seed in recipe.seeds_of(role)]
            record[role] = recall.combine(runs)
            record[role]["slot_model"] = {
                variant: recall.slot_curve(dataclasses.replace(role_cfg, **overrides), recipe)
                for variant, overrides in entry.variants(role_cfg)}
        record.update(record.pop("model"))
        record["seconds"] = time.perf_counter() - start
        return record

    def _recall_job(self, label: str, role: str, cfg: ModelConfig, seed: int) -> RecallJob:
        """One recall model of ``label`` (a curriculum's part has its own key, so a run
        stored before it retrains the model)."""
        entry = self.by_label[label]
        key = f"{label}/{role}/{seed}" + ("/curriculum" if entry.spec.recall_curriculum else "")
        name = f"{label} seed {seed}" if role == "model" else f"{label} {role} seed {seed}"
        return RecallJob(key, label, name, entry.arch, cfg, entry.run, self.recipe, seed)

    def _recall_roles(self, label: str) -> dict[str, ModelConfig]:
        """{role: config}: the entry at the recipe's sizes, and its twin where it has one."""
        entry = self.by_label[label]
        cfg = self.recipe.model_config(entry.cfg)
        return {"model": cfg, **({"twin": entry.spec.twin(cfg)} if entry.spec.twin else {})}

    def _recall_part(self, label: str, role: str, cfg: ModelConfig,
                     recipe: recall.RecallRecipe, seed: int) -> dict:
        """One recall model trained and measured at every variant (stored in "parts"), here,
        unless the workers trained it already (``_train_in_workers``)."""
        job, parts_done = self._recall_job(label, role, cfg, seed), self.results.setdefault(
            "parts", {})
        if job.key in parts_done:
            return parts_done[job.key]

        def callbacks(shown: str, stage: int) -> list:
            live = [self.recall_live(shown, recipe)] \
                if self.recall_live is not None and self.world.is_main else []
            return [self.progress, *live]

        parts_done[job.key] = recall_part(job, callbacks)
        self._store_results()
        return parts_done[job.key]

    def _train_in_workers(self) -> None:
        """The recall and facts models of the plan not stored yet, on worker processes
        (``lab.parts``: one per CPU thread); each stored as it ends. Nothing happens with
        fewer than two workers, and a mechanism a fresh process cannot build trains later,
        here."""
        stored = self.results.setdefault("parts", {})
        pending = [(task, label) for task, label in self.plan if task in ("recall", "facts")
                   and f"{task}/{label}" not in self.results["done"]]
        jobs = [job for task, label in pending for job in (
            self._recall_jobs(label) if task == "recall" else self._facts_jobs(label))]
        jobs = [j for j in jobs if j.key not in stored]
        here = {j.label for j in jobs if not parts.can_run_in_workers(j.arch)}
        jobs = [j for j in jobs if j.label not in here]
        device = pick_device(self.entries[0].run.train.device)
        workers = parts.worker_count(jobs, device, self.workers)
        if not workers:
            return

        def keep(job, measured: dict) -> None:
            stored[job.key] = measured
            self._store_results()

        self.progress.begin_workers([(task, label) for task, label in pending
                                     if label not in here])
        completed = False
        try:
            parts.train_in_workers(jobs, workers, keep, self.progress.within,
                                   live_for=self.recall_live if self.world.is_main else None)
            completed = True
        except FloatingPointError as err:                 # a training broke in a worker
            raise FloatingPointError(self._broken_training(err.task, err.label, err)) from None
        finally:
            self.progress.end_workers(completed)

    def _recall_jobs(self, label: str) -> list[RecallJob]:
        return [self._recall_job(label, role, cfg, seed)
                for role, cfg in self._recall_roles(label).items()
                for seed in self.recipe.seeds_of(role)]

    def _facts_jobs(self, label: str) -> list[FactsJob]:
        """One job per table of facts of the preset's ``FactsRecipe``."""
        entry, recipe = self.by_label[label], knowledge.FACTS_SIZES[self.preset]
        cfg = (knowledge.baseline_config(self.by_label[entry.baseline_of].cfg, recipe)
               if entry.baseline_of else recipe.model_config(entry.cfg))
        return [FactsJob(f"facts:{label}/{count}", label, f"{label} facts {count}", entry.arch,
                         cfg, entry.run, recipe, count) for count in recipe.counts]

    def _facts(self, label: str) -> dict:
        """The entry pretrained on each table of facts of the preset's ``FactsRecipe`` (a
        baseline at the iso-FLOP config of its mechanism at the recipe's length)."""
        start = time.perf_counter()
        jobs = self._facts_jobs(label)
        counts = [self._facts_part(job) for job in jobs]
        return {"arch": jobs[0].arch, "baseline_of": self.by_label[label].baseline_of,
                "n_layer": jobs[0].cfg.n_layer, "counts": counts,
                "seconds": time.perf_counter() - start}

    def _facts_part(self, job: FactsJob) -> dict:
        """One model pretrained on a table of facts, measured (a stored part), here, unless
        the workers trained it already."""
        stored = self.results.setdefault("parts", {})
        if job.key not in stored:
            stored[job.key] = facts_part(job, lambda shown, k: [self.progress])
            self._store_results()
        return stored[job.key]

    def _bench(self, label: str) -> dict:
        """All entries, every variant, timed interleaved with dense at each length (the
        machine measured first, so the records carry the roofline; on rank 0 alone: one
        process's timings, the others wait)."""
        return self.world.on_main(lambda: lab_bench.bench_entries(self.entries, self.sizes,
                                                                  self.progress))

TASKS = ("lm", "recall", "facts", "bench")



def _only(plan: list[tuple[str, str]], tasks) -> list[tuple[str, str]]:
    """The plan's tasks of the kinds in ``tasks`` (None: all), e.g. ("recall",) for a
    notebook that asks one experiment."""
    if tasks is None:
        return plan
    if isinstance(tasks, str) or not tasks:
        fail("tasks", tasks, f"expected a tuple of task kinds from {', '.join(TASKS)}")
    for task in tasks:
        check_choice("tasks", task, TASKS)
    return [(task, label) for task, label in plan if task in tasks]


def _recipe(preset_name: str, seeds) -> recall.RecallRecipe:
    """The preset's recall recipe, at ``seeds`` when given (e.g. (0,) in a notebook)."""
    recipe = recall.RECALL_SIZES[preset_name]
    if seeds is None:
        return recipe
    if isinstance(seeds, (str, int)) or not seeds or \
            not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        fail("recall_seeds", seeds, "expected a non-empty tuple of seeds >= 0, e.g. (0,)")
    return dataclasses.replace(recipe, seeds=tuple(seeds), twin_seeds=None)


def _read_results(path) -> dict:
    """The stored run at ``path``; a ValueError naming the file when it is not readable."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:               # ValueError: bad JSON or bytes
        problem = f"cannot be read ({err})"
    else:
        if isinstance(stored, dict) and all(isinstance(stored.get(k), dict)
                                            for k in ("meta", "done")):
            return stored
        problem = "is not a reproduce result (it lacks the meta and done tables)"
    raise ValueError(f"{path} {problem}: move it away to keep it, or delete it to start this "
                     "run over")


def _stored_state(path, label: str) -> dict | None:
    """The state dict of the model stored at ``path`` (None when there is none); a
    ValueError naming the file when it is damaged."""
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError):
        raise ValueError(_unusable_model(path, label, "it is empty, truncated or not a saved "
                                                      "model")) from None


def _unusable_model(path, label: str, reason: str) -> str:
    return (f"the stored model {path} cannot be used ({reason}); a later entry starts from it. "
            f"Delete it and the \"lm/{label}\" entry of {path.parent.parent / RESULTS_NAME} "
            "to train it again, or start over in a new --out")


def _file_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label)


def _copies(models: dict) -> dict:
    """Deep copies, so an entry that starts from trained models never changes them."""
    return {label: copy.deepcopy(model) for label, model in models.items()}


def reproduce(preset_name: str = "fast", out="runs/reproduce", archs=None, corpus=None,
              paths=None, steps: int | None = None, progress: bool = True, live=None,
              recall_live=None, tasks=None, recall_seeds=None, workers=None,
              dense_recall_from=None, seed: int | None = None,
              lm_seeds: int | None = None) -> dict:
    """Run (or continue) the lab; returns the results (also in ``out/results.json``).

    ``live``: a ``viz.comparison.LiveComparison`` (anything with ``run(name)`` returning a trainer
    callback) that draws each language model's training as it happens; ``recall_live``:
    ``(name, recipe) -> trainer callback`` for each recall model, e.g.
    ``lab.figures.recall_monitor`` (its beyond-span accuracy against the step);
    ``tasks``: only these kinds of task (``TASKS``; default all); ``recall_seeds``: train
    each recall model at these seeds instead of the recipe's (a notebook's one seed);
    ``dense_recall_from``: a ``results.json`` of the same preset (the kit's shipped run)
    whose dense recall models this run reads instead of training them again; ``seed``: the
    language models' seed (default: the preset's; a notebook passes ``BLOCKMEM_SEED``'s),
    which also moves the recall recipe's seeds by as much (seed 5: 5, 6, 7 for 0, 1, 2)
    unless ``recall_seeds`` names them; ``lm_seeds``: how many seeds each language model
    that starts from scratch trains at, from ``seed`` on (default: the preset's)."""
    if corpus is None or isinstance(corpus, str):
        corpus = load_corpus(corpus or ("files" if paths else "offline"), paths=paths)
    return Lab(preset_name, out, archs, corpus, steps, progress, live=live,
               recall_live=recall_live, tasks=tasks, recall_seeds=recall_seeds,
               workers=workers, dense_recall_from=dense_recall_from, seed=seed,
               lm_seeds=lm_seeds).run()
