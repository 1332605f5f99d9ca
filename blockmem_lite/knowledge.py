"""The knowledge experiment: facts that never appear in the context, so only weights hold them.

A mechanism whose memory lives in its parameters (MoC's bank of chapters) is compared with
its iso-FLOP dense model (``metrics.iso_flop_dense_config``), whose knowledge can only sit
in its attention and FFN weights. Both pretrain on the same table of facts
(``tasks.facts``: "<Entity>'s <relation> is <value>.", one line each, shuffled passes)
and are asked every fact with other facts as the context (``Facts.recall_probe``). A fact
counts as recalled when all its value bytes are the model's argmax. The table grows over
``FactsRecipe.counts`` so the curve reaches the count where the dense FFN saturates: at
equal FLOPs MoC has far more parameters (its bank), read k chapters at a time, and it
pays where it recalls more facts than dense by more than the noise.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from blockmem_lite import tasks
from blockmem_lite.config import ModelConfig, TrainConfig
from blockmem_lite.measure import metrics


@dataclass(frozen=True)
class FactsRecipe:
    """Sizes of the knowledge experiment: tables of ``counts`` entities (4 facts each)."""

    seq_len: int = 128
    counts: tuple = (16, 64, 256)
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 30
    repeats: int = 30              # shuffled passes of the table in the training text
    seed: int = 0

    def model_config(self, cfg: ModelConfig) -> ModelConfig:
        """``cfg`` at the recipe's length (its routing window capped there)."""
        window = getattr(cfg, "routing_window", None)
        extra = {"routing_window": min(window, self.seq_len)} if window else {}
        return dataclasses.replace(cfg, seq_len=self.seq_len, **extra)

    def train_config(self, train: TrainConfig) -> TrainConfig:
        return dataclasses.replace(train, steps=self.steps, batch_size=self.batch_size,
                                   lr=self.lr, warmup_steps=self.warmup_steps, seed=self.seed,
                                   eval_every=10**9, checkpoint_dir=None)


FACTS_SIZES = {
    "tiny": FactsRecipe(seq_len=64, counts=(2,), steps=10, batch_size=4, repeats=4),
    "fast": FactsRecipe(seq_len=64, counts=(4,), steps=60, batch_size=8, repeats=20),
    "class": FactsRecipe(),
    "gpu": FactsRecipe(seq_len=256, counts=(64, 256, 1024, 4096), steps=4000, batch_size=32),
}


def baseline_config(cfg: ModelConfig, recipe: FactsRecipe) -> ModelConfig:
    """The iso-FLOP dense model of ``cfg`` at the recipe's length."""
    return metrics.iso_flop_dense_config(recipe.model_config(cfg))


def table(n_entities: int, recipe: FactsRecipe) -> tasks.Facts:
    return tasks.facts(n_entities, seed=recipe.seed)


def training_windows(facts: tasks.Facts, recipe: FactsRecipe):
    """The table as ``repeats`` shuffled passes, cut into next-token windows."""
    return facts.windows(recipe.seq_len, recipe.repeats)


@torch.no_grad()
def facts_recalled(model, probe: tasks.TaskBatch, batch_size: int = 64) -> float:
    """Share of the probe's rows whose every answer byte is the model's argmax."""
    was_training = model.training
    model.eval()
    device = tasks.model_device(model)
    hits = []
    try:
        for start in range(0, len(probe), batch_size):
            part = probe[start:start + batch_size]
            logits = model(part.inputs.to(device)).logits.cpu()                 # (N, T, V)
            right = (logits.argmax(dim=-1) == part.targets) | ~part.mask        # (N, T)
            hits.append(right.all(dim=1))
    finally:
        model.train(was_training)
    return torch.cat(hits).float().mean().item()


def chance(facts: tasks.Facts) -> float:
    """Recall of a uniform guess among each relation's values."""
    return sum(1 / len(tasks.FACT_RELATIONS[r]) for r in facts.relations) / len(facts.relations)


def format_floor(facts: tasks.Facts) -> float:
    """Recall of always answering each relation's most frequent value in the table."""
    best = []
    for r in range(len(facts.relations)):
        column = [values[r] for values in facts.values]
        best.append(max(column.count(v) for v in set(column)) / len(column))
    return sum(best) / len(best)


def measure(model, facts: tasks.Facts, recipe: FactsRecipe) -> dict:
    """Facts recalled (exact), byte accuracy, and the two floors, on every fact of the table."""
    probe = facts.recall_probe(recipe.seq_len)
    return {"n_facts": facts.n_facts, "recalled": facts_recalled(model, probe),
            "byte_accuracy": tasks.task_accuracy(model, probe), "chance": chance(facts),
            "floor": format_floor(facts)}


def compare(mine: list[dict], dense: list[dict]) -> list[dict]:
    """Per table size: the mechanism's and dense's recall and whether the mechanism pays
    (more than 2 standard errors of a difference of two rates on n facts, at p = 1/2)."""
    rows = []
    for a, b in zip(mine, dense, strict=True):
        noise = 2 * math.sqrt(0.5 / a["n_facts"])
        rows.append({"n_facts": a["n_facts"], "recalled": a["recalled"],
                     "dense": b["recalled"], "floor": a["floor"], "noise": noise,
                     "pays": a["recalled"] - b["recalled"] > noise})
    return rows
