"""The memory-pays experiment: recall that dense learns, asked beyond each mechanism's span.

A ``RecallRecipe`` (one per preset, ``RECALL_SIZES``) fixes a small model and a task form
that a dense model learns in a few hundred steps on a CPU: MQAR in Zoology's form, with
every query slot after the pairs asked (``tasks.mqar(..., n_queries=query_slots)``), which
gives a row about seven times the answers of one query per pair at no extra length; plus
a one-token passkey in a quiet haystack. Fresh rows every step (``tasks.FreshRows``).

The training rows (``training_row``): first, for ``local_first`` of the steps, rows whose
every span holds an MQAR of its own, so a model learns recall inside its span before its
memory has to carry anything (ARMT's paper grows the number of segments for the same
reason); then, by row seed, a quarter each of MQAR with its queries anywhere after the
pairs, those per-span rows, the *beyond-span* MQAR form (the pairs in the first span, no
query before the span after next: ``RecallRecipe.queries_from``), and a passkey at every
distance. MQAR rows hold 1 to ``n_pairs`` pairs in turn. Every model, mechanism or twin,
trains on these rows with the same budget of steps, except that a mechanism whose
``LabSpec`` asks for its paper's segment curriculum (ARMT) trains, with its twin, in two
stages of growing length of that budget each (``curriculum``, ``train``).

Measured on held-out seeds (below 2**31, which training never draws):

* ``curves``: accuracy against distance (passkey and fixed-distance MQAR), where the
  lab's figure marks the span;
* ``beyond``: accuracy on the beyond-span MQAR rows, the figure "memory pays" judges;
* ``capacity``: the same with 1 ... ``n_pairs`` pairs: how many pairs the memory holds;
* ``length``: the same at 1, 2, 4 and 8 times the trained length (length generalisation);
* ``slot_curve``: the same curve from the memory's analytic capacity (``slot_accuracy``:
  addressable slots, each a bag of values, repeats counted), drawn beside the measured one;
* ``blindness``: how far a model's answer logits move when every token before
  ``queries_from`` (only earlier spans) is replaced. The memory-less twin must not move
  (it cannot see there), the mechanism must (that is where its answers come from).

A mechanism's twin (``registry.LabSpec.twin``) is the same model and span with the
memory path off: BCMT without its block memory (HOnly), ARMT without its associative
memory (the segmented backbone), CAT with zero chunk vectors (each token sees its own
chunk only).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from blockmem_lite import registry, tasks
from blockmem_lite.config import ModelConfig, TrainConfig
from blockmem_lite.validation import check_int

TARGET = 0.9             # beyond-span accuracy at which a memory "holds" the pairs

EVAL_SEEDS = {"passkey": 10_000, "mqar": 20_000, "beyond": 30_000, "blind": 40_000,
              "length": 50_000}


@dataclass(frozen=True)
class RecallRecipe:
    """The model and task sizes of the recall experiment (searched on a 2-core CPU; the
    search is summarised in docs/MEASUREMENTS.md, "The recall recipe")."""

    seq_len: int = 64
    vocab_size: int = 68          # 64 content ids: 32 keys, 32 values (+ 4 special)
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 2
    span: int = 16                # block / segment / chunk size of every local mechanism
    n_pairs: int = 4
    key_len: int = 1              # passkey: one token to find (reach, not copying skill)
    steps: int = 900
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 150       # a sixth of the steps: with 30, dense's seed 0 settled on
                                  # guessing one of the row's values (0.29 beyond the span)
    seeds: tuple = (0, 1, 2)
    twin_seeds: tuple | None = None   # the twin's seeds (None: ``seeds``); it is blind by proof
    eval_rows: int = 128
    local_first: float = 0.33     # share of the steps, at the start, on per-span rows only

    def __post_init__(self):
        if self.seq_len % self.span:
            raise ValueError(f"span={self.span} is not allowed with seq_len={self.seq_len}: "
                             "expected a span that divides seq_len")
        if self.span < 2 * self.n_pairs:
            raise ValueError(f"span={self.span} is not allowed with n_pairs={self.n_pairs}: the "
                             f"pairs must fit in the first span; expected span >= "
                             f"{2 * self.n_pairs}")
        if self.seq_len < self.queries_from + 2 * self.n_pairs:
            raise ValueError(f"seq_len={self.seq_len} is not allowed with span={self.span}: the "
                             f"beyond-span form asks from position {self.queries_from}; expected "
                             f"seq_len >= {self.queries_from + 2 * self.n_pairs}")

    @property
    def queries_from(self) -> int:
        """First query position of the beyond-span form: the start of the span after next
        (pairs in span 0, nothing asked in span 1), so every answer lies one whole span or
        more before its query, in an earlier block, segment or chunk."""
        pair_spans = math.ceil(2 * self.n_pairs / self.span)
        return (pair_spans + 1) * self.span

    def model_config(self, cfg: ModelConfig) -> ModelConfig:
        """``cfg``'s architecture and options at the recipe's sizes, its span set to ``span``
        (``LabSpec.recall_span``)."""
        sized = dataclasses.replace(cfg, seq_len=self.seq_len, vocab_size=self.vocab_size,
                                    d_model=self.d_model, n_layer=self.n_layer,
                                    n_head=self.n_head)
        spec = registry.lab_spec(cfg.arch)
        return spec.recall_span(sized, self.span) if spec.recall_span else sized

    def seeds_of(self, role: str) -> tuple:
        """The seeds a role ("model" or "twin") trains at."""
        return self.twin_seeds if role == "twin" and self.twin_seeds else self.seeds

    def train_config(self, train: TrainConfig, seed: int) -> TrainConfig:
        """``train`` (device, precision, ...) with the recipe's optimisation and ``seed``."""
        return dataclasses.replace(train, steps=self.steps, batch_size=self.batch_size,
                                   lr=self.lr, warmup_steps=self.warmup_steps, seed=seed,
                                   eval_every=10**9, checkpoint_dir=None)


RECALL_SIZES = {
    "tiny": RecallRecipe(steps=20, warmup_steps=30, seeds=(0,), eval_rows=16, batch_size=8,
                         local_first=0.0),
    "fast": RecallRecipe(seq_len=32, span=8, n_pairs=2, steps=100, warmup_steps=30,
                         batch_size=16, seeds=(0,), eval_rows=32,
                         local_first=0.0),                   # dense ~0.3 beyond (chance 0.03)
    "class": RecallRecipe(twin_seeds=(0,)),   # a twin is at chance by proof: more seeds of
                                              # it would cost class time and tell nothing
    "gpu": RecallRecipe(seq_len=256, vocab_size=260, d_model=128, n_head=4, span=64,
                        n_pairs=16, steps=4000, batch_size=64, warmup_steps=200,
                        eval_rows=256),
}


# --- rows ----------------------------------------------------------------------------------------
def _mqar(recipe: RecallRecipe, count: int, seed: int, queries_from: int | None = None,
          n_pairs: int | None = None):
    """MQAR rows asking every query slot (``n_pairs`` default: the recipe's)."""
    n_pairs = n_pairs or recipe.n_pairs
    slots = tasks.query_slots(recipe.seq_len, n_pairs, queries_from)
    return tasks.mqar(count, recipe.seq_len, n_pairs, n_queries=slots,
                      queries_from=queries_from, vocab_size=recipe.vocab_size, seed=seed)


def _passkey(recipe: RecallRecipe, count: int, distance: int, seed: int):
    return tasks.passkey(count, recipe.seq_len, distance, key_len=recipe.key_len,
                         filler="quiet", vocab_size=recipe.vocab_size, seed=seed)


def _span_mqar(recipe: RecallRecipe, count: int, seed: int, n_pairs: int) -> tasks.TaskBatch:
    """Rows whose every span holds an MQAR of its own (pairs and queries inside the span):
    recall a block-local model can learn at full signal, the skill the beyond-span form
    builds on."""
    n_spans, span = recipe.seq_len // recipe.span, recipe.span
    part = tasks.mqar(count * n_spans, span, n_pairs,
                      n_queries=tasks.query_slots(span, n_pairs),
                      vocab_size=recipe.vocab_size, seed=seed)
    offsets = (torch.arange(n_spans) * span).repeat(count)[:, None]          # (N*S, 1)
    joined = {name: getattr(part, name).reshape(count, n_spans * span)
              for name in ("inputs", "targets", "mask")}
    meta = {"task": "mqar_per_span", "n_pairs": n_pairs, "queries_from": None,
            "answer_positions": (part.meta["answer_positions"] + offsets).reshape(count, -1),
            "distances": part.meta["distances"].reshape(count, -1), "seed": seed}
    return tasks.TaskBatch(**joined, meta=meta)


def training_row(count: int, *, seed: int, recipe: RecallRecipe) -> tasks.TaskBatch:
    """``count`` rows of the kind the seed picks: seeds 0 mod 4 MQAR asked anywhere after
    its pairs, 1 an MQAR inside every span (``_span_mqar``), 2 the beyond-span MQAR, 3 a
    passkey (its distance cycles through every allowed one). An MQAR row holds 1 to
    ``n_pairs`` pairs (in turn), so every batch has rows easy enough to start learning
    from: with ``n_pairs`` in every row a dense model can sit for hundreds of steps at the
    plateau of guessing one of the row's values."""
    kind, turn = seed % 4, seed // 4
    pairs = 1 + turn % recipe.n_pairs
    if seed - tasks.TRAIN_SEED_OFFSET < recipe.local_first * recipe.steps * recipe.batch_size:
        kind = 1
    if kind == 0:
        return _mqar(recipe, count, seed, n_pairs=pairs)
    if kind == 1:
        return _span_mqar(recipe, count, seed, min(pairs, recipe.span // 4))
    if kind == 2:
        return _mqar(recipe, count, seed, recipe.queries_from, n_pairs=pairs)
    low, high = recipe.key_len + 1, recipe.seq_len - recipe.key_len
    return _passkey(recipe, count, low + turn % (high - low + 1), seed)


def training_rows(recipe: RecallRecipe, stream: int = 0) -> tasks.FreshRows:
    """steps x batch fresh rows: no step sees a row another step saw (each curriculum stage
    draws from its own ``stream``)."""
    return tasks.FreshRows(functools.partial(training_row, recipe=recipe),
                           recipe.steps * recipe.batch_size, stream=stream)


# --- training ------------------------------------------------------------------------------------
def curriculum(recipe: RecallRecipe) -> list[RecallRecipe]:
    """The recall training as a segment curriculum (the ARMT paper's recipe): first the
    shortest row of whole spans the beyond-span form fits in (3 of the class recipe's 4
    spans), then the full length, each stage the recipe's steps, as the paper trains every
    stage for its own budget. The later stage starts on the mixed rows (no per-span
    warm-up). Where the shortest row is the full one, the recipe itself.

    Why, for ARMT at the class recipe (beyond-span accuracy at 4 pairs): the flat recipe
    plateaus near two slots' worth, even at twice its steps, while the curriculum at the
    same total steps gets well past it and keeps rising with a larger budget (at half the
    recipe's steps per stage it is no better than the flat recipe); a higher learning rate
    (3e-3) collapses to one slot."""
    fits = recipe.queries_from + 2 * recipe.n_pairs
    first = math.ceil(fits / recipe.span) * recipe.span
    if first >= recipe.seq_len:
        return [recipe]
    return [dataclasses.replace(recipe, seq_len=first),
            dataclasses.replace(recipe, local_first=0.0)]


def stages(recipe: RecallRecipe, staged: bool) -> list[RecallRecipe]:
    """The recipes a recall model trains through: ``curriculum`` where ``staged``, else the
    recipe alone."""
    return curriculum(recipe) if staged else [recipe]


def train(recipe: RecallRecipe, trainer_for: Callable, staged: bool = False):
    """Train on fresh rows of ``recipe``, in ``curriculum`` stages where ``staged``:
    ``trainer_for(stage, rows, k) -> Trainer`` builds stage k's trainer around the one
    model (a fresh optimiser and schedule per stage, as ``train.train_curriculum``). Returns
    the last stage's History; an interrupted stage ends the training there."""
    for k, stage in enumerate(stages(recipe, staged)):
        history = trainer_for(stage, training_rows(stage, stream=k), k).fit()
        if history.interrupted:
            break
    return history


def distances(recipe: RecallRecipe) -> list[int]:
    """Distances the curves are measured at: a few inside the span, most beyond it."""
    top = recipe.seq_len - recipe.key_len
    points = {round(top * f) for f in (0.05, 0.15, 0.25, 0.4, 0.55, 0.7, 0.85, 0.98)}
    return sorted(d for d in points | {recipe.span} if recipe.key_len + 1 <= d <= top)


def beyond_rows(recipe: RecallRecipe, rows: int | None = None,
                n_pairs: int | None = None) -> tasks.TaskBatch:
    """Held-out beyond-span MQAR rows (every answer one span or more away), with the
    recipe's pairs or ``n_pairs``."""
    return _mqar(recipe, rows or recipe.eval_rows, EVAL_SEEDS["beyond"] + (n_pairs or 0),
                 recipe.queries_from, n_pairs=n_pairs)


# --- measuring -----------------------------------------------------------------------------------
def curves(model, recipe: RecallRecipe) -> dict:
    """Accuracy against distance on held-out passkey and fixed-distance MQAR rows."""
    rows, points = recipe.eval_rows, distances(recipe)
    passkey = tasks.accuracy_vs_distance(
        model, lambda d: _passkey(recipe, rows, d, EVAL_SEEDS["passkey"] + d), points)
    low, high = 2 * recipe.n_pairs, recipe.seq_len + 1 - 2 * recipe.n_pairs
    mqar = tasks.accuracy_vs_distance(
        model, lambda d: tasks.mqar(rows, recipe.seq_len, recipe.n_pairs, distance=d,
                                    vocab_size=recipe.vocab_size,
                                    seed=EVAL_SEEDS["mqar"] + d),
        sorted({min(max(d, low), high) for d in points}))
    keep = ("distance", "accuracy", "n_answers")
    return {"passkey": [{k: r[k] for k in keep} for r in passkey],
            "mqar": [{k: r[k] for k in keep} for r in mqar]}


def beyond(model, recipe: RecallRecipe, n_pairs: int | None = None) -> dict:
    """Accuracy on the beyond-span MQAR rows, and how many answers it rests on."""
    batch = beyond_rows(recipe, n_pairs=n_pairs)
    return {"accuracy": tasks.task_accuracy(model, batch), "n_answers": int(batch.mask.sum())}


def capacity(model, recipe: RecallRecipe) -> list[dict]:
    """Beyond-span accuracy with 1 ... ``n_pairs`` pairs in the first span: how many pairs
    the memory holds. The model trained on every one of these counts (``training_row``),
    so one training gives the whole curve."""
    return [{"n_pairs": p, **beyond(model, recipe, n_pairs=p)}
            for p in range(1, recipe.n_pairs + 1)]


LENGTH_FACTORS = (1, 2, 4, 8)


def longer_rows(recipe: RecallRecipe, factor: int, rows: int | None = None) -> tasks.TaskBatch:
    """Beyond-span MQAR rows ``factor`` times the trained length: the pairs in the first
    span, every query in the last ``seq_len - queries_from`` tokens, so the distances grow
    with the length while the row's shape stays the trained one."""
    length = factor * recipe.seq_len
    start = length - (recipe.seq_len - recipe.queries_from)
    return tasks.mqar(rows or recipe.eval_rows, length, recipe.n_pairs,
                      n_queries=tasks.query_slots(length, recipe.n_pairs, start),
                      queries_from=start, vocab_size=recipe.vocab_size,
                      seed=EVAL_SEEDS["length"] + factor)


def length_curve(model, recipe: RecallRecipe, factors=LENGTH_FACTORS) -> list[dict]:
    """Beyond-span accuracy at ``factors`` x the trained length (ARMT's claim: recall holds
    far past the training length). Accuracy None where the model refuses the length (CAT's
    chunk-index table ends at its trained length)."""
    out = []
    for factor in factors:
        batch = longer_rows(recipe, factor)
        try:
            accuracy = tasks.task_accuracy(model, batch)
        except ValueError as refused:
            if "sequence length" not in str(refused):
                raise
            accuracy = None
        out.append({"factor": factor, "seq_len": batch.seq_len, "accuracy": accuracy,
                    "n_answers": int(batch.mask.sum())})
    return out


def slot_accuracy(n_pairs: int, slots: int, chance_accuracy: float,
                  n_values: int | None = None) -> float:
    """The slot model of a memory's capacity: ``slots`` slots a query can address by its
    key, each a *bag*: it tells which values it holds, not which key each belongs to. A
    query finds its slot and answers the value the bag holds most often, so the queries of
    a slot are right as often as that value occurs. With all values different (``n_values``
    None) that is once per slot: min(slots, n_pairs) right answers of ``n_pairs``. MQAR
    draws values with repeats from ``n_values``, so a bag of k values is right
    ``expected_top_count(k, n_values)`` times; the pairs fill the used slots evenly. With
    no slot a query can only guess (``chance_accuracy``). A memory that binds keys to
    values inside a slot beats this line; one with room it has not learned to use falls
    below it."""
    if slots <= 0:
        return chance_accuracy
    used = min(slots, n_pairs)
    if n_values is None:
        return used / n_pairs
    size, bigger = divmod(n_pairs, used)                    # ``bigger`` slots hold one more
    return (bigger * expected_top_count(size + 1, n_values)
            + (used - bigger) * expected_top_count(size, n_values)) / n_pairs


@functools.lru_cache(maxsize=1024)
def expected_top_count(k: int, n_values: int) -> float:
    """E[how often the most frequent value occurs] among ``k`` values drawn uniformly, with
    repeats, from ``n_values``: the sum over m of P(some value occurs more than m times).
    The draws whose counts all stay <= m number k! [x^k] (sum_{j<=m} x^j / j!)^n_values."""
    check_int("k", k, 1)
    check_int("n_values", n_values, 1)
    total = 0.0
    for m in range(1, k):
        truncated = [1.0 / math.factorial(j) for j in range(m + 1)]
        all_at_most_m = math.factorial(k) * _power_coefficient(truncated, n_values, k)
        total += 1.0 - all_at_most_m / n_values ** k
    return 1.0 + total                                       # the top count is at least 1


def _power_coefficient(poly: list[float], power: int, degree: int) -> float:
    """The coefficient of x^degree in poly(x)^power (by squaring, truncated at degree)."""
    def times(a, b):
        out = [0.0] * (degree + 1)
        for i, x in enumerate(a):
            if x:
                for j, y in enumerate(b[:degree + 1 - i]):
                    out[i + j] += x * y
        return out

    result, base = [1.0] + [0.0] * degree, (poly + [0.0] * degree)[:degree + 1]
    while power:
        if power & 1:
            result = times(result, base)
        base = times(base, base)
        power >>= 1
    return result[degree]


def slot_curve(cfg: ModelConfig, recipe: RecallRecipe) -> list[dict] | None:
    """The slot model's accuracy with 1 ... ``n_pairs`` pairs for ``cfg`` (None where its
    mechanism declares no ``LabSpec.memory_slots``): the analytic line of the capacity
    figure."""
    slots_of = registry.lab_spec(cfg.arch).memory_slots
    if slots_of is None:
        return None
    out = []
    for n in range(1, recipe.n_pairs + 1):
        slots = slots_of(cfg, n)
        out.append({"n_pairs": n, "slots": slots,
                    "accuracy": slot_accuracy(n, slots, chance(recipe),
                                              tasks.mqar_value_count(recipe.vocab_size))})
    return out


def holds(curve: list[dict], threshold: float = TARGET) -> int:
    """The most pairs up to which every point of a capacity curve reaches ``threshold``."""
    held = 0
    for point in curve:
        if point["accuracy"] < threshold:
            break
        held = point["n_pairs"]
    return held


def _answer_logits(model, batch: tasks.TaskBatch) -> torch.Tensor:
    """(A, V) logits at the answer positions of ``batch``."""
    device = tasks.model_device(model)
    return model(batch.inputs.to(device)).logits[batch.mask.to(device)].float()


def blindness(model, recipe: RecallRecipe, rows: int = 16) -> float:
    """Largest change of any answer logit on beyond-span rows when every token before
    ``queries_from`` (the pairs and the quiet span after them) is replaced by random
    content: 0 (to rounding) for a model that cannot see beyond its span."""
    batch = _mqar(recipe, rows, EVAL_SEEDS["blind"], recipe.queries_from)
    generator = torch.Generator().manual_seed(EVAL_SEEDS["blind"])
    changed = batch.inputs.clone()
    changed[:, :recipe.queries_from] = torch.randint(
        0, tasks.content_vocab(recipe.vocab_size), (rows, recipe.queries_from),
        generator=generator)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            base = _answer_logits(model, batch)
            moved = _answer_logits(model, dataclasses.replace(batch, inputs=changed))
    finally:
        model.train(was_training)
    return float((moved - base).abs().max())


def measure(model, recipe: RecallRecipe) -> dict:
    """Everything the lab stores of one trained recall model."""
    return {"curves": curves(model, recipe), "beyond": beyond(model, recipe),
            "capacity": capacity(model, recipe), "length": length_curve(model, recipe),
            "blindness": blindness(model, recipe)}


# --- across seeds ----------------------------------------------------------------------------
def band(values: list[float]) -> dict:
    """Mean and the lowest and highest of the values (one per seed)."""
    return {"mean": sum(values) / len(values), "lo": min(values), "hi": max(values),
            "n": len(values)}


def noise(n_answers: int, other: int | None = None) -> float | None:
    """Two standard errors of the difference of two accuracies measured on ``n_answers``
    and ``other`` answers, at the widest p = 1/2; with no ``other``, of one accuracy
    against an exact value (a prediction)."""
    if not n_answers or other == 0:
        return None
    return 2 * math.sqrt(0.25 / n_answers + (0.25 / other if other else 0.0))


def chance(recipe: RecallRecipe) -> float:
    """MQAR's chance accuracy: one value among the upper half of the content ids."""
    return 2 / tasks.content_vocab(recipe.vocab_size)


def combine(runs: list[dict]) -> dict:
    """One record from the ``measure`` results of several seeds ({variant: measure} each):
    curves, capacity curves and beyond-span accuracy as mean with the lowest and highest
    seed (``band``), answers summed, and the largest ``blindness`` of any seed."""
    out = {"curves": {}, "beyond": {}, "capacity": {}, "length": {}, "blindness": {}}
    for variant in runs[0]:
        per_seed = [run[variant] for run in runs]
        for curve in ("capacity", "length"):
            out[curve][variant] = combine_curve([m[curve] for m in per_seed])
        out["curves"][variant] = {
            task: [_point([m["curves"][task][i] for m in per_seed])
                   for i in range(len(per_seed[0]["curves"][task]))]
            for task in per_seed[0]["curves"]}
        out["beyond"][variant] = {**band([m["beyond"]["accuracy"] for m in per_seed]),
                                  "n_answers": sum(m["beyond"]["n_answers"] for m in per_seed)}
        out["blindness"][variant] = max(m["blindness"] for m in per_seed)
    return out


def combine_curve(curves: list[list[dict]]) -> list[dict]:
    """One curve (capacity, length) from one per seed: each point's mean and band."""
    return [_point(list(points)) for points in zip(*curves, strict=True)]


def _point(rows: list[dict]) -> dict:
    """One point of a curve over seeds: mean accuracy, its band, answers summed (accuracy
    None where the model refused the rows)."""
    where = {k: rows[0][k] for k in ("distance", "n_pairs", "factor", "seq_len") if k in rows[0]}
    answers = sum(r["n_answers"] for r in rows)
    if any(r["accuracy"] is None for r in rows):
        return {**where, "accuracy": None, "lo": None, "hi": None, "n_answers": answers}
    spread = band([r["accuracy"] for r in rows])
    return {**where, "accuracy": spread["mean"], "lo": spread["lo"], "hi": spread["hi"],
            "n_answers": answers}
