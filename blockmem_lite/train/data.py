"""The Trainer's data: what it accepts as a dataset, the batch stream whose order a
checkpoint can resume, and evaluation (mean validation cross-entropy, and the same by
position in the window: what a memory that carries context across spans lowers).

The Trainer owns the batch order: one permutation per epoch from a generator seeded with
``(seed, epoch)``; ``BatchStream.tell`` / ``seek`` give and take the ``(epoch, position)``
a checkpoint records, so a resumed run sees the batches the uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Mapping

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from blockmem_lite import distributed
from blockmem_lite.models.base import IGNORE_INDEX
from blockmem_lite.runtime import autocast_context


def as_dataset(data, name: str):
    """A map-style dataset of (x, y) from a Dataset, a DataLoader over one, or ``.dataset()``."""
    if isinstance(data, DataLoader):
        data = data.dataset
    elif not isinstance(data, Dataset) and callable(getattr(data, "dataset", None)):
        data = data.dataset()
    allowed = ("a map-style Dataset yielding (x, y), a DataLoader over one, or an object with "
               ".dataset() such as tasks.TaskBatch")
    if isinstance(data, IterableDataset):
        raise ValueError(f"{name} of type {type(data).__name__} is not allowed: iterable datasets "
                         f"have no fixed order to resume from; expected {allowed}")
    if (isinstance(data, (str, bytes, torch.Tensor, Mapping))
            or not (hasattr(data, "__getitem__") and hasattr(data, "__len__"))):
        hint = " (wrap tensors with torch.utils.data.TensorDataset(x, y))" \
            if isinstance(data, torch.Tensor) else ""
        raise ValueError(f"{name} of type {type(data).__name__} is not allowed: expected "
                         f"{allowed}{hint}")
    if len(data) == 0:
        raise ValueError(f"{name} is empty: expected at least one (x, y) example")
    _check_example(data[0], name)
    return data


def first_examples(dataset, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n`` examples collated (the last one repeated where there are fewer):
    (x (n, T), y (n, T)); what the memory estimate's dry runs read."""
    batch = default_collate([dataset[min(i, len(dataset) - 1)] for i in range(n)])
    return batch[0], batch[1]


def _check_example(item, name: str) -> None:
    ok = (isinstance(item, (tuple, list)) and len(item) == 2
          and all(isinstance(t, torch.Tensor) for t in item)
          and item[0].shape == item[1].shape and item[0].dim() == 1
          and not item[0].is_floating_point() and not item[1].is_floating_point())
    if not ok:
        got = (tuple(f"{type(t).__name__}{tuple(t.shape) if isinstance(t, torch.Tensor) else ''}"
                     for t in item) if isinstance(item, (tuple, list)) else type(item).__name__)
        raise ValueError(f"{name} items of the form {got} are not allowed: expected (x, y) pairs "
                         "of integer tensors of the same shape (T,)")


def _epoch_seed(seed: int, epoch: int) -> int:
    """A 32-bit seed for (seed, epoch): a CPU torch.Generator keeps only the low 32 bits of
    its seed, so packing seed and epoch side by side in 64 bits lost the seed."""
    digest = hashlib.blake2b(f"{seed}:{epoch}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


class BatchStream:
    """Batches in a reproducible order: a permutation per epoch seeded with (seed, epoch).

    ``position`` counts the batches already handed out in ``epoch``; a partial last
    batch is dropped so every step sees ``batch_size`` examples.
    ``shard=(rank, W)``: this process gets rows ``rank * B/W .. (rank+1) * B/W`` of each
    global batch; the order and the position stay global, so any W can resume them.
    """

    def __init__(self, dataset, batch_size: int, seed: int, num_workers: int = 0,
                 pin_memory: bool = False, shard: tuple[int, int] = (0, 1)):
        if len(dataset) < batch_size:
            raise ValueError(f"batch_size={batch_size} is not allowed: train_data has only "
                             f"{len(dataset)} examples; use batch_size <= {len(dataset)}")
        self.rows = distributed.check_batch_size(batch_size, shard[1])   # rows per process
        self.shard = shard
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.epoch, self.position = 0, 0
        self._order = None            # (epoch, permutation)
        self._workers_iter = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.dataset) // self.batch_size

    def _indices(self, position: int) -> list[int]:
        if self._order is None or self._order[0] != self.epoch:
            g = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
            self._order = (self.epoch, torch.randperm(len(self.dataset), generator=g))
        start = position * self.batch_size + self.shard[0] * self.rows
        return self._order[1][start:start + self.rows].tolist()

    def next_batch(self):
        """(x, y), each (B, T); advances the position (and the epoch when it is used up)."""
        if self.position >= self.batches_per_epoch:
            self.seek(self.epoch + 1, 0)
        if self.num_workers == 0:
            batch = default_collate([self.dataset[i] for i in self._indices(self.position)])
        else:
            if self._workers_iter is None:
                self._workers_iter = iter(self._worker_loader())
            batch = next(self._workers_iter)
        self.position += 1
        return batch[0], batch[1]

    def _worker_loader(self) -> DataLoader:
        rest = [self._indices(p) for p in range(self.position, self.batches_per_epoch)]
        return DataLoader(self.dataset, batch_sampler=rest, num_workers=self.num_workers,
                          collate_fn=default_collate, pin_memory=self.pin_memory)

    def tell(self) -> tuple[int, int]:
        return self.epoch, self.position

    def seek(self, epoch: int, position: int) -> None:
        self.epoch, self.position = epoch, position
        self._workers_iter = None

    def close(self) -> None:
        self._workers_iter = None


def _loss_for_eval(out) -> torch.Tensor:
    ce = getattr(out, "ce_loss", None)
    return ce if ce is not None else out.loss


@torch.no_grad()
def evaluate(model: torch.nn.Module, data, max_batches: int | None = None,
             device: torch.device | str | None = None, *, batch_size: int = 16,
             precision: str = "auto", world: distributed.World | None = None) -> float:
    """Mean cross-entropy (``ModelOutput.ce_loss``, else ``loss``) over ``data``.

    ``data``: a DataLoader (iterated as is), a map-style Dataset of (x, y) or an object with
    ``.dataset()`` (batched in order, ``batch_size`` examples). Averaged per target token
    (positions with target -100 do not count). Runs in eval mode under no_grad and puts
    the model back in the mode it was in.
    ``world`` with several processes: each evaluates its share of every batch's rows and
    the sums are all-reduced, so every process returns the same value (call it on all).
    """
    world = world or distributed.SINGLE
    total, count = 0.0, 0
    with _evaluating(model, data, max_batches, device, batch_size) as (device, batches):
        for x, y in batches:
            rows = world.local_rows(len(x))             # this process's rows of the batch
            x, y = x[rows].to(device), y[rows].to(device)
            n = int((y != IGNORE_INDEX).sum())
            if n == 0:
                continue
            with autocast_context(device, precision):
                loss = _loss_for_eval(model(x, y))
            total += float(loss) * n
            count += n
    total, count = world.sum_numbers(total, count)
    if count == 0:
        raise ValueError("data has no target tokens to evaluate (every target is -100 or the "
                         "data is empty)")
    return total / count


@torch.no_grad()
def loss_by_position(model: torch.nn.Module, data, max_batches: int | None = None,
                     device: torch.device | str | None = None, *,
                     batch_size: int = 16) -> list[float]:
    """Mean cross-entropy of the next token at each position of the window, over ``data``
    (as ``evaluate``; one process): [loss at position 0, 1, ..., T-1]. A memory that
    carries context across its local span lowers the loss after each span boundary; a
    gap that is the same before the first boundary is not the memory's. A position with
    no target in ``data`` (every one -100) is NaN."""
    total = count = None
    with _evaluating(model, data, max_batches, device, batch_size) as (device, batches):
        for x, y in batches:
            x, y = x.to(device), y.to(device)                         # (B, T)
            logits = model(x).logits.float()                          # (B, T, V)
            losses = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), y, ignore_index=IGNORE_INDEX, reduction="none")  # (B, T)
            counted = (y != IGNORE_INDEX)
            total = losses.sum(0) if total is None else total + losses.sum(0)   # (T,)
            count = counted.sum(0) if count is None else count + counted.sum(0)
    if total is None or int(count.sum()) == 0:
        raise ValueError("data has no target tokens to evaluate (every target is -100 or the "
                         "data is empty)")
    return torch.where(count > 0, total / count.clamp(min=1), float("nan")).tolist()


@contextlib.contextmanager
def _evaluating(model: torch.nn.Module, data, max_batches: int | None, device, batch_size: int):
    """(device, the first ``max_batches`` (x, y) batches of ``data``) with the model in eval
    mode; the mode it was in comes back at the end."""
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches={max_batches} is not allowed: expected None or >= 1")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batches = data if isinstance(data, DataLoader) else _sequential_batches(
        as_dataset(data, "data"), batch_size)
    was_training = model.training
    model.eval()
    try:
        yield device, itertools.islice(batches, max_batches)
    finally:
        model.train(was_training)


def _sequential_batches(dataset, batch_size: int):
    for start in range(0, len(dataset), batch_size):
        yield default_collate([dataset[i] for i in range(start, min(start + batch_size,
                                                                        len(dataset)))])
