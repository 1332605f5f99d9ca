"""The lab's language models: one entry trained at one seed and measured (``train_lm``), and
its seeds combined into the entry's record (``combine_seeds``).

A seed fixes a model's first weights and the order of its batches, and every entry of a run
trains at the same seeds, so two entries compare seed by seed (``lab.verdicts.seed_views``).
Besides the validation loss, each model is measured at every position of the window
(``train.loss_by_position``); a mechanism with a memory-less twin is measured a second time
with the same trained weights and its memory path off (``memory_off``): inside the first
span the two see the same tokens, so what opens between them after it is the memory's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from blockmem_lite import distributed, registry
from blockmem_lite.config import ModelConfig, RunConfig
from blockmem_lite.corpora import make_loaders
from blockmem_lite.lab.parts import finished
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import seed_everything
from blockmem_lite.train import Trainer, loss_by_position
from blockmem_lite.train.callbacks import GradientGroups

SIGNIFICANT = 4                  # digits kept of a stored per-step loss or gradient norm
SEED_KEYS = ("val_loss", "train_loss", "loss_curve", "grad_norm_curve")  # kept of every seed


@dataclass(frozen=True)
class LMRun:
    """One language model of the lab at one seed."""

    label: str                      # the lab entry, e.g. "dense iso-FLOP (moc)"
    name: str                       # shown while it trains, e.g. "bcmt seed 1"
    arch: str
    cfg: ModelConfig
    run: RunConfig                  # the entry's run, at this seed
    corpus: object                  # corpora.Corpus: the run's text
    variants: tuple                 # ((variant, overrides), ...) measured apart
    baseline_of: str = ""           # e.g. "moc" for its iso-FLOP dense model

    @property
    def seed(self) -> int:
        return self.run.train.seed

    @property
    def key(self) -> str:
        """Its part's key in results["parts"]: "lm:<label>/<seed>"."""
        return f"lm:{self.label}/{self.seed}"


def train_lm(job: LMRun, callbacks: list = (), model=None) -> tuple[dict, torch.nn.Module]:
    """``job``'s model (fresh and seeded, or ``model``, e.g. ARMT around the trained dense)
    trained on the run's corpus and measured at every variant: (its record, the trained
    model). The record holds the validation loss, the loss at each position of the window
    with the memory and, for a mechanism with a twin, the same weights with the memory
    path off (``memory_off``), the loss and gradient-norm curves (also per parameter group,
    ``GradientGroups``) and the sizes."""
    start = time.perf_counter()
    world = distributed.current()
    train_loader, val_loader = make_loaders(job.run, corpus=job.corpus)
    if model is None:
        seed_everything(job.seed)
        model = build_model(job.cfg)
    grads = GradientGroups(model, job.run.train.grad_clip)
    trainer = Trainer(model, job.run.replace(checkpoint_dir=None), train_loader, val_loader,
                      callbacks=[*callbacks, grads])
    history = finished(trainer.fit())
    spec = registry.LabSpec() if job.baseline_of else registry.lab_spec(job.arch)
    twin = memory_off(model, job.cfg, spec)
    val_loss, by_position, off_by_position = {}, {}, {}
    for variant, overrides in job.variants:
        for each in (model, twin) if twin is not None else (model,):
            if overrides:
                spec.switch(each, overrides)
        val_loss[variant] = trainer.evaluate()                  # all-reduced over processes
        by_position[variant] = _positions(world, model, trainer)
        if twin is not None:
            off_by_position[variant] = _positions(world, twin, trainer)
    return {"val_loss": val_loss, "position_loss": by_position,
            **({"position_loss_off": off_by_position} if twin is not None else {}),
            "train_loss": history.loss[-1], "steps": trainer.step,
            "tokens": trainer.step * job.run.train.batch_size * job.cfg.seq_len,
            "params": model.num_params(), "seconds": time.perf_counter() - start,
            "loss_curve": _rounded(history.loss), "grad_norm_curve": _rounded(history.grad_norm),
            "grad_norm_groups": {group: _rounded(norms) for group, norms in grads.norms.items()},
            "val_curve": [list(p) for p in zip(history.val_step, history.val_loss,
                                               strict=True)]}, model


def combine_seeds(runs: dict[int, dict]) -> dict:
    """One language model's seeds ({seed: ``train_lm`` record}, the run's own seed first)
    as one record: the validation and position losses averaged over the seeds, with
    ``val_loss_band`` {variant: [lowest, highest]}; the curves, sizes and gradient groups
    of the run's own seed; ``seeds`` and, per seed, ``by_seed`` (its losses and curves,
    ``SEED_KEYS``, so a claim can be judged at every seed)."""
    first = next(iter(runs.values()))
    record = dict(first)
    record["val_loss"] = {v: _mean(r["val_loss"][v] for r in runs.values())
                          for v in first["val_loss"]}
    record["val_loss_band"] = {v: [min(r["val_loss"][v] for r in runs.values()),
                                   max(r["val_loss"][v] for r in runs.values())]
                               for v in first["val_loss"]}
    for key in ("position_loss", "position_loss_off"):
        if key in first:
            record[key] = {v: [round(_mean(at), 4)
                               for at in zip(*(r[key][v] for r in runs.values()), strict=True)]
                           for v in first[key]}
    record["seconds"] = sum(r["seconds"] for r in runs.values())
    record["seeds"] = list(runs)
    record["by_seed"] = {str(seed): {k: r[k] for k in SEED_KEYS if k in r}
                         for seed, r in runs.items()}
    return record


def _rounded(values) -> list[float]:
    return [float(f"{v:.{SIGNIFICANT}g}") for v in values]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def memory_off(model: torch.nn.Module, cfg: ModelConfig, spec: registry.LabSpec):
    """``model``'s weights in its memory-less twin's config (``LabSpec.twin``): the trained
    model with its memory path off, so the two differ by what the memory carries and
    nothing else. None for a mechanism without a twin."""
    if spec.twin is None:
        return None
    twin = build_model(spec.twin(cfg)).to(next(model.parameters()).device)
    missing, _ = twin.load_state_dict(model.state_dict(), strict=False)
    if missing:                                 # the twin must be the model minus its memory
        raise ValueError(f"the memory-less twin of {cfg.arch} has weights its model lacks "
                         f"({', '.join(missing[:3])}): LabSpec.twin must only turn the memory "
                         "path off")
    return twin


def _positions(world, model, trainer) -> list[float]:
    """The validation loss at each position (``train.loss_by_position``), 4 decimals; on
    the first process alone, handed to the others."""
    return world.on_main(lambda: [round(loss, 4) for loss in loss_by_position(
        model, trainer.val_dataset, trainer.cfg.eval_batches, trainer.device,
        batch_size=trainer.cfg.batch_size)])

