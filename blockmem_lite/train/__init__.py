"""Training: the Trainer every notebook, benchmark and CLI run goes through.

The update itself is the one of ``train.simple.train_simple``, the loop notebook 01
builds; the Trainer wraps it with what long runs need. (This package is the first step
of splitting the Trainer by job, ARCHITECTURE.md's ``train/``; the rest still sits here.)

* AdamW (weight decay on matrices only, not on norms or biases), linear warmup
  then cosine decay to ``lr * min_lr_ratio`` (``lr_at``), global-norm gradient
  clipping, periodic evaluation, callbacks (``on_step`` / ``on_eval`` / ``on_end``).
* The Trainer owns the batch order: one permutation per epoch from a generator
  seeded with ``(seed, epoch)``. A checkpoint records ``(epoch, position)`` plus
  every RNG state, so a resumed run continues the *same* loss curve.
* Checkpoints hold only tensors, numbers, strings, lists and dicts, so they load
  with ``torch.load(path, weights_only=True)``; they are written atomically
  (temp file in the same folder, fsync, ``os.replace``).
* The notebook "stop" button (SIGINT) finishes the current step and stops
  cleanly: the model and the history are kept, a checkpoint is written when
  ``checkpoint_dir`` is set, and ``fit`` returns the history. A second press
  interrupts at once. A ``KeyboardInterrupt`` raised anywhere in the loop (for
  instance by a callback) is handled the same way.
* Device: ``runtime.pick_device`` (cuda > mps > cpu); bf16 autocast only on CUDA.
* Several processes (``torchrun``, ``distributed.setup``): the model trains inside DDP;
  each process takes ``batch_size / W`` rows of the same global batch, the loss is
  weighted by each process's share of the target tokens, so the gradient and the logged
  loss are the single process's (to float rounding); evaluation and the stop flag are
  all-reduced; rank 0 alone takes the folder lock, writes and runs the callbacks (the
  default printer included). ``save_checkpoint`` is then called on every process.
* Orchestration lives here too: ``train_curriculum`` (stages of growing data,
  ARMT's 2 -> 4 -> 8 segments) and ``load_model`` (a checkpoint's model, e.g.
  to wrap it). The command line is ``cli.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import random
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from blockmem_lite import distributed
from blockmem_lite.checkpoints import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    RunLock,
    atomic_write,
    atomic_write_bytes,
    is_disk_full,
    load_checkpoint_file,
    prepare_folder,
)
from blockmem_lite.compiling import compile_training
from blockmem_lite.config import ModelConfig, RunConfig, TrainConfig
from blockmem_lite.models.base import IGNORE_INDEX, build_model
from blockmem_lite.runtime import (
    autocast_context,
    available_memory_bytes,
    peak_memory,
    pick_device,
    reset_peak_memory,
    seed_everything,
    synchronize,
    usable_workers,
)
from blockmem_lite.train.simple import cosine_lr
from blockmem_lite.units import format_progress, human_bytes

PRINT_INTERVAL_S = 2.0           # the default progress printer writes at most one line per 2 s

STEP_KEYS = ("step", "total_steps", "loss", "ce_loss", "aux_loss", "lr", "grad_norm",
             "tokens_per_s", "memory_bytes", "memory_method", "elapsed_s", "eta_s", "extras")
EVAL_KEYS = ("step", "total_steps", "val_loss", "elapsed_s")


# --- history and callbacks -------------------------------------------------------------------
@dataclass
class History:
    """Everything a run measured, one list entry per step (and per evaluation)."""

    step: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    ce_loss: list = field(default_factory=list)
    aux_loss: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    grad_norm: list = field(default_factory=list)      # global norm before clipping
    tokens_per_s: list = field(default_factory=list)
    memory_bytes: list = field(default_factory=list)
    elapsed_s: list = field(default_factory=list)
    val_step: list = field(default_factory=list)
    val_loss: list = field(default_factory=list)
    extras: dict = field(default_factory=dict)         # name -> per-step values (ModelOutput.extras)
    memory_method: str = ""
    total_steps: int = 0
    interrupted: bool = False
    stopped_by: str = ""                               # the signal that stopped the run, if any

    def append_step(self, rec: dict) -> None:
        for name in ("step", "loss", "ce_loss", "aux_loss", "lr", "grad_norm", "tokens_per_s",
                     "memory_bytes", "elapsed_s"):
            getattr(self, name).append(rec[name])
        for name, value in rec.get("extras", {}).items():
            self.extras.setdefault(name, []).append(value)
        self.memory_method = rec["memory_method"]

    def append_eval(self, rec: dict) -> None:
        self.val_step.append(rec["step"])
        self.val_loss.append(rec["val_loss"])

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {k: list(v) for k, v in value.items()}
            out[f.name] = list(value) if isinstance(value, list) else value
        return out

    @classmethod
    def from_dict(cls, d: Mapping) -> History:
        """Inverse of ``to_dict``; missing keys take their defaults, unknown keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: (list(v) if isinstance(v, (list, tuple)) else v)
                      for k, v in d.items() if k in names})

    def save_json(self, path) -> Path:
        path = Path(path)
        atomic_write_bytes(path, json.dumps(self.to_dict(), indent=1).encode("utf-8"))
        return path


class Callback:
    """Base class for Trainer callbacks; override what you need.

    Any object with some of these methods works too (duck typing).
    """

    def on_step(self, trainer: Trainer, rec: dict) -> None:
        """After every optimizer step; ``rec`` has the keys in ``STEP_KEYS``."""

    def on_eval(self, trainer: Trainer, rec: dict) -> None:
        """After every evaluation; ``rec`` has the keys in ``EVAL_KEYS``."""

    def on_end(self, trainer: Trainer, history: History) -> None:
        """Once when ``fit`` ends (finished, or stopped by an interrupt)."""


class _PrintProgress(Callback):
    """Default callback: throttled text lines (the first step of each fit, every log_every
    steps at most once per PRINT_INTERVAL_S, and the final step)."""

    def __init__(self, log_every: int, min_interval_s: float = PRINT_INTERVAL_S):
        self.log_every = log_every
        self.min_interval_s = min_interval_s
        self._last = None          # time of the last line; None: nothing printed in this fit

    def _print(self, rec: dict, periodic: bool) -> None:
        now = time.monotonic()
        final = rec["step"] >= rec["total_steps"]
        due = periodic and (self._last is None or now - self._last >= self.min_interval_s)
        if final or self._last is None or due:
            print(format_progress(rec), flush=True)
            self._last = now

    def on_step(self, trainer, rec):
        self._print(rec, periodic=rec["step"] % self.log_every == 0)

    def on_eval(self, trainer, rec):
        self._print(rec, periodic=True)

    def on_end(self, trainer, history):
        self._last = None


def _check_callbacks(callbacks) -> list:
    if callbacks is None:
        return []
    if any(hasattr(callbacks, name) for name in ("on_step", "on_eval", "on_end")):
        callbacks = [callbacks]
    out = list(callbacks)
    for cb in out:
        if not any(callable(getattr(cb, name, None)) for name in ("on_step", "on_eval", "on_end")):
            raise ValueError(f"callbacks entry {cb!r} is not allowed: a callback needs at least one "
                             "of the methods on_step, on_eval, on_end")
    return out


# --- schedule and optimizer ----------------------------------------------------------------
def lr_at(step: int, cfg: TrainConfig, total_steps: int | None = None) -> float:
    """Learning rate of (0-based) ``step``: ``simple.cosine_lr`` with ``cfg``'s lr, warmup and
    floor over ``total_steps`` (default ``cfg.steps``)."""
    total = cfg.steps if total_steps is None else total_steps
    return cosine_lr(step, total, cfg.lr, cfg.warmup_steps, cfg.min_lr_ratio)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on >= 2-D parameters (matrices, embeddings) only.

    A model may scale the learning rate of some parameters (e.g. MoC's bank and
    memory layers) with ``lr_scales() -> {parameter name: factor}``; each group
    keeps its factor as ``lr_scale`` and the schedule multiplies it in.
    """
    scales = model.lr_scales() if callable(getattr(model, "lr_scales", None)) else {}
    groups: dict[tuple[float, bool], list] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault((float(scales.get(name, 1.0)), p.dim() >= 2), []).append(p)
    return torch.optim.AdamW(
        [{"params": params, "lr": cfg.lr * scale, "lr_scale": scale,
          "weight_decay": cfg.weight_decay if decayed else 0.0}
         for (scale, decayed), params in sorted(groups.items(), key=lambda kv: kv[0])],
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


# --- data ------------------------------------------------------------------------------------
def _as_dataset(data, name: str):
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


class _BatchStream:
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
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches={max_batches} is not allowed: expected None or >= 1")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batches = data if isinstance(data, DataLoader) else _sequential_batches(
        _as_dataset(data, "data"), batch_size)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for i, (x, y) in enumerate(batches):
            if max_batches is not None and i >= max_batches:
                break
            if world.distributed:                       # this process's rows of the batch
                lo, hi = (len(x) * r // world.world_size for r in (world.rank, world.rank + 1))
                x, y = x[lo:hi], y[lo:hi]
            x, y = x.to(device), y.to(device)
            n = int((y != IGNORE_INDEX).sum())
            if n == 0:
                continue
            with autocast_context(device, precision):
                loss = _loss_for_eval(model(x, y))
            total += float(loss) * n
            count += n
    finally:
        model.train(was_training)
    if world.distributed:
        total, count = world.all_reduce_sum(torch.tensor([total, count],
                                                         dtype=torch.float64)).tolist()
    if count == 0:
        raise ValueError("data has no target tokens to evaluate (every target is -100 or the "
                         "data is empty)")
    return total / count


def _sequential_batches(dataset, batch_size: int):
    for start in range(0, len(dataset), batch_size):
        yield default_collate([dataset[i] for i in range(start, min(start + batch_size,
                                                                        len(dataset)))])


# --- RNG states ------------------------------------------------------------------------------
def _rng_state(device: torch.device) -> dict:
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "python": {"version": version, "state": list(internal), "gauss_next": gauss_next}}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    if device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "mps" in state and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])


# --- the stop button -------------------------------------------------------------------------
class CheckpointNotSaved(OSError):
    """The end-of-run checkpoint could not be written (the model is still in memory)."""


STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


class _StopButton:
    """While active, the first SIGINT (Ctrl-C, the notebook stop button), SIGTERM or SIGHUP
    only sets ``requested`` (and ``signal_name``) so the loop stops between steps and saves;
    a second one raises KeyboardInterrupt.

    Installed only in the main thread, and only over a signal's default handler.
    """

    def __init__(self):
        self.requested = False
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> _StopButton:
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)           # SIGHUP does not exist on Windows
            default = signal.default_int_handler if name == "SIGINT" else signal.SIG_DFL
            if number is not None and signal.getsignal(number) is default:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()


# --- the trainer -----------------------------------------------------------------------------
class Trainer:
    """Train ``model`` on ``train_data`` with ``cfg``; see the module docstring.

    ``train_data``: a map-style Dataset of (x (T,), y (T,)), a DataLoader over one (its
    dataset is used; batch size and order come from ``cfg``), or an object with
    ``.dataset()`` (e.g. ``tasks.TaskBatch``). ``val_data`` likewise (optional).
    ``callbacks``: ``Callback`` objects or anything with on_step / on_eval / on_end; with
    none, the Trainer prints throttled progress lines itself.
    Under ``distributed.setup`` (torchrun) the Trainer trains with every process of the
    run (see the module docstring); callbacks then run on rank 0 only, and a
    KeyboardInterrupt they raise stops every process after the current step.
    """

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, train_data, val_data=None,
                 callbacks=(), run_cfg: RunConfig | None = None):
        if isinstance(cfg, RunConfig):
            run_cfg, cfg = run_cfg or cfg, cfg.train
        if not isinstance(cfg, TrainConfig):
            raise ValueError(f"cfg of type {type(cfg).__name__} is not allowed: expected a "
                             "TrainConfig (or a RunConfig)")
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model of type {type(model).__name__} is not allowed: expected a "
                             "torch.nn.Module (e.g. build_model(cfg))")
        self.cfg = cfg
        self.run_cfg = run_cfg
        self.world = distributed.current()
        distributed.check_batch_size(cfg.batch_size, self.world.world_size)
        self.device = distributed.device_for(cfg.device, self.world)
        if self.world.distributed and self.world.device.type != self.device.type:
            raise ValueError(f"device={cfg.device!r} is not allowed here: this process joined "
                             f"the run on {self.world.device.type} (distributed.setup), and "
                             f"{cfg.device!r} trains on {self.device.type}; use the device "
                             "given to distributed.setup")
        autocast_context(self.device, cfg.precision)   # fails early for bf16 off CUDA
        self.model = model.to(self.device)
        if cfg.compile:                                # forward + backward compiled in place
            compile_training(self.model)
        self.train_dataset = _as_dataset(train_data, "train_data")
        self.val_dataset = _as_dataset(val_data, "val_data") if val_data is not None else None
        callbacks = _check_callbacks(callbacks) or [_PrintProgress(cfg.log_every)]
        self.callbacks = callbacks if self.world.is_main else []
        self.optimizer = make_optimizer(self.model, cfg)
        self.history = History()
        self.step = 0
        self._stream = _BatchStream(self.train_dataset, cfg.batch_size, cfg.seed,
                                    usable_workers(cfg.num_workers), pin_memory=self.device.type == "cuda",
                                    shard=(self.world.rank, self.world.world_size))
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._train_model = distributed.wrap(self.model, self.world)   # DDP, or the model
        self._stop_code = 0                 # W > 1: a stop a callback asked for (SIGINT's number)
        self._seeded = False
        self._mid_update = False
        self._saved_step: int | None = None           # step of the last checkpoint written here

    # --- public API ---------------------------------------------------------------------------
    def fit(self, steps: int | None = None) -> History:
        """Train until ``steps`` optimizer steps are done in total (default ``cfg.steps``).

        The LR schedule spans ``steps``. Returns the history, also after an interrupt.
        """
        total = self.cfg.steps if steps is None else steps
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"steps={steps!r} is not allowed: expected None or an integer >= 1")
        if total < self.step:
            raise ValueError(f"steps={total} is not allowed: this trainer is already at step "
                             f"{self.step}; expected at least {self.step}")
        folder = self.cfg.checkpoint_dir
        if not self.world.distributed:
            if folder:
                prepare_folder(folder, self.checkpoint_bytes())
            with RunLock(folder) if folder else contextlib.nullcontext():
                return self._fit(total)
        lock = RunLock(folder) if folder and self.world.is_main else None

        def claim():                                    # rank 0 alone writes into the folder
            if lock is not None:
                prepare_folder(folder, self.checkpoint_bytes())
                lock.acquire()

        self.world.on_main(claim)
        try:
            return self._fit(total)
        finally:
            if lock is not None:
                lock.release()

    def _fit(self, total: int) -> History:
        if not self._seeded:
            seed_everything(self.cfg.seed)
            if self.world.rank:                          # other dropout masks on other rows
                torch.manual_seed(distributed.rank_seed(self.cfg.seed, self.world.rank))
            self._seeded = True
        self.history.total_steps = total
        self.history.interrupted = False
        self.history.stopped_by = ""
        self.model.train()
        reset_peak_memory(self.device)
        clock = _Clock(self.history.elapsed_s[-1] if self.history.elapsed_s else 0.0, self.step)
        self._stop_code = 0
        with _StopButton() as stop:
            agreed = None                              # W > 1: the stop every process agreed on
            try:
                while self.step < total:
                    if not self.world.distributed:
                        if stop.requested:
                            break
                    else:
                        agreed = self._agreed_stop(stop)
                        if agreed:
                            break
                    self._step_with_rollback(total, clock)
                    self._after_step(total, clock)
                interrupted = stop.requested if agreed is None else bool(agreed)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                self._stream.close()
            name = signal.Signals(agreed).name if agreed else stop.signal_name
            self.history.stopped_by = name or ("SIGINT" if interrupted else "")
            if interrupted:
                self._end_interrupted(total)
            else:
                self._end_finished(total, clock)
        return self.history

    def _agreed_stop(self, stop: _StopButton) -> int:
        """W > 1, before each step: the largest stop signal number any process has (0: go on),
        so every process stops after the same step. Peers' stops do not touch ``stop``, so
        their own signal, arriving later, still only asks for a stop."""
        mine = 0
        if stop.requested:
            mine = int(getattr(signal, stop.signal_name or "SIGINT", signal.SIGINT))
        return self.world.all_reduce_max(max(mine, self._stop_code))

    def evaluate(self, max_batches: int | None = None) -> float:
        """Mean validation CE over ``max_batches`` (default ``cfg.eval_batches``) batches
        (with several processes: all-reduced, call it on every one)."""
        if self.val_dataset is None:
            raise ValueError("val_data is None: pass val_data to the Trainer to evaluate")
        return evaluate(self.model, self.val_dataset, max_batches or self.cfg.eval_batches,
                        self.device, batch_size=self.cfg.batch_size, precision=self.cfg.precision,
                        world=self.world)

    def checkpoint_path(self) -> Path | None:
        """``<checkpoint_dir>/checkpoint.pt``, or None without a checkpoint_dir."""
        return Path(self.cfg.checkpoint_dir) / CHECKPOINT_NAME if self.cfg.checkpoint_dir else None

    def save_checkpoint(self, path=None) -> Path:
        """Write everything needed to resume exactly (atomically); returns the path.

        Refuses (FloatingPointError) to write weights that are not finite, so a
        checkpoint on disk is always a good state. With several processes, call it on
        every one: rank 0 writes (with every process's RNG state), the others wait.
        """
        path = Path(path) if path is not None else self.checkpoint_path()
        if path is None:
            raise ValueError("path=None is not allowed when cfg.checkpoint_dir is None: pass a "
                             "path or set checkpoint_dir")
        broken = self._non_finite_tensors()
        if broken:
            raise FloatingPointError(f"not saving a checkpoint at step {self.step}: {broken} of "
                                     "the model's tensors are not finite")
        if not self.world.distributed:
            state = self._checkpoint_state()
            atomic_write(path, lambda f: torch.save(state, f))
            self._saved_step = self.step
            return path
        rngs = self.world.gather_objects(_rng_state(self.device))

        def write():
            state = {**self._checkpoint_state(), "rng_ranks": rngs}
            atomic_write(path, lambda f: torch.save(state, f))

        self.world.on_main(write)      # the others wait for the file, and share its error
        self._saved_step = self.step
        return path

    def checkpoint_bytes(self) -> int:
        """About the size of one checkpoint: the weights and AdamW's two moments."""
        return 3 * sum(p.numel() * p.element_size() for p in self.model.parameters())

    def _non_finite_tensors(self) -> str:
        """'3/17' when 3 of the 17 floating-point tensors of the model are not finite, else ''."""
        tensors = [t for t in self.model.state_dict().values() if t.is_floating_point()]
        bad = sum(not bool(torch.isfinite(t).all()) for t in tensors)
        return f"{bad}/{len(tensors)}" if bad else ""

    def load_checkpoint(self, path) -> None:
        """Restore model, optimizer, step, data position, history and RNG states (with
        several processes: rank 0 reads the file and hands it to the others)."""
        self._restore(self.world.on_main(lambda: load_checkpoint_file(path)))

    @classmethod
    def from_checkpoint(cls, path, train_data, val_data=None, callbacks=(), *,
                        model: torch.nn.Module | None = None, device: str | None = None,
                        checkpoint_dir: str | None = None) -> Trainer:
        """A Trainer restored from ``path``; the model is rebuilt from the stored run config
        unless ``model`` is given. ``device`` overrides the stored one (e.g. "cpu").
        Later checkpoints go beside ``path`` (the folder it was loaded from, wherever it was
        moved to), or to ``checkpoint_dir``."""
        ckpt = distributed.current().on_main(lambda: load_checkpoint_file(path))
        run_dict = ckpt.get("run_config")
        run_cfg = RunConfig.from_dict(run_dict) if run_dict is not None else None
        if model is None and run_cfg is None:
            raise ValueError(f"model=None is not allowed: checkpoint {path} stores no run config "
                             "to rebuild the model from; pass model=")
        train_cfg = run_cfg.train if run_cfg is not None else TrainConfig(**ckpt["train_config"])
        folder = str(checkpoint_dir if checkpoint_dir is not None else Path(path).parent)
        train_cfg = dataclasses.replace(train_cfg, checkpoint_dir=folder,
                                        **({"device": device} if device is not None else {}))
        run_cfg = dataclasses.replace(run_cfg, train=train_cfg) if run_cfg else None
        trainer = cls(model if model is not None else build_model(run_cfg), train_cfg,
                      train_data, val_data, callbacks, run_cfg=run_cfg)
        trainer._restore(ckpt)
        return trainer

    # --- one step -----------------------------------------------------------------------------
    def _step_with_rollback(self, total: int, clock: _Clock) -> None:
        """One step; an interrupt before the update puts the batch back (exact resume)."""
        mark = self._stream.tell()
        step_before = self.step
        try:
            self._train_step(total, clock)
        except KeyboardInterrupt:
            if self.step == step_before and not self._mid_update:
                self._stream.seek(*mark)
            raise

    def _train_step(self, total: int, clock: _Clock) -> None:
        start = time.perf_counter()
        x, y = self._stream.next_batch()                                   # (B, T) each
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        lr = lr_at(self.step, self.cfg, total)
        if not math.isfinite(lr):
            raise FloatingPointError(f"the learning rate of step {self.step + 1} is {lr}: check "
                                     f"lr={self.cfg.lr}, min_lr_ratio={self.cfg.min_lr_ratio}, "
                                     f"warmup_steps={self.cfg.warmup_steps}")
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        with autocast_context(self.device, self.cfg.precision):
            out = self._train_model(x, y)
        if out.loss is None:
            raise ValueError("the model returned loss=None: its forward(tokens, targets) must "
                             "return a ModelOutput with a loss")
        self.optimizer.zero_grad(set_to_none=True)
        ce = out.ce_loss if out.ce_loss is not None else out.loss
        aux = out.aux_loss if out.aux_loss is not None else torch.zeros_like(out.loss)
        extras = out.extras or {}
        if self.world.distributed:
            loss_v, ce_v, aux_v, norm_v, extra_v = self._distributed_backward(out, ce, aux, y)
        else:
            out.loss.backward()
            grad_norm = self._clip_gradients()
            loss_v, ce_v, aux_v, norm_v, *extra_v = torch.stack(
                [out.loss.detach().float(), ce.detach().float(), aux.detach().float(),
                 grad_norm.float(), *(torch.as_tensor(v, device=out.loss.device).detach().float()
                                      for v in extras.values())]).tolist()     # one host sync
        if not (math.isfinite(loss_v) and math.isfinite(norm_v)):
            self._fail_non_finite(loss_v, norm_v, total)
        self._mid_update = True
        self.optimizer.step()
        self.step += 1
        self._mid_update = False
        synchronize(self.device)
        seconds = time.perf_counter() - start
        memory, method = peak_memory(self.device)
        rec = {"step": self.step, "total_steps": total, "loss": loss_v, "ce_loss": ce_v,
               "aux_loss": aux_v, "lr": lr, "grad_norm": norm_v,
               "tokens_per_s": x.numel() * self.world.world_size / seconds,
               "memory_bytes": memory,
               "memory_method": method, "elapsed_s": clock.elapsed(),
               "eta_s": clock.eta(self.step, total),
               "extras": dict(zip(extras, extra_v, strict=True))}
        self.history.append_step(rec)
        self._emit("on_step", rec)

    def _distributed_backward(self, out, ce, aux, y) -> tuple:
        """W > 1: backward through DDP (which averages the gradients over the processes),
        clip, and the step's global figures, the same on every process.

        DDP's average of per-process means is the global mean only when every process
        has as many target tokens; so the cross-entropy is weighted by this process's
        share of them (``n_local * W / n_all``, exactly 1 for full LM windows), which makes
        the gradient and the logged loss those of one process on the whole batch. The
        auxiliary terms are per-batch averages and are averaged as they are.
        """
        n_local = (y != IGNORE_INDEX).sum()
        n_all = self.world.all_reduce_sum(n_local)
        share = (n_local * self.world.world_size / n_all.clamp(min=1)).to(ce.dtype)
        if out.ce_loss is None:              # only the total is known: weight all of it
            rest = torch.zeros_like(ce)
        else:                                # the loss beyond the cross-entropy
            rest = aux if out.aux_loss is not None else out.loss - ce
        (ce * share + rest).backward()                # out.loss's own graph when share = 1
        grad_norm = self._clip_gradients()                        # of the averaged gradients
        extras = out.extras or {}
        local = torch.stack([(ce * share).detach().float(), rest.detach().float(),
                             aux.detach().float(),
                             *(torch.as_tensor(v, device=out.loss.device).detach().float()
                               for v in extras.values())])
        ce_v, rest_v, aux_v, *extra_v = self.world.all_reduce_mean(local).tolist()
        return ce_v + rest_v, ce_v, aux_v, float(grad_norm), extra_v

    def _clip_gradients(self) -> torch.Tensor:
        """Global grad norm before clipping; clips to ``cfg.grad_clip`` when it is > 0."""
        if self.cfg.grad_clip > 0:
            return torch.nn.utils.clip_grad_norm_(self._params, self.cfg.grad_clip)
        norms = [torch.linalg.vector_norm(p.grad) for p in self._params if p.grad is not None]
        return torch.linalg.vector_norm(torch.stack(norms))

    def _fail_non_finite(self, loss: float, grad_norm: float, total: int) -> None:
        broken = self._non_finite_tensors()
        if broken:
            last = (f"the checkpoint of step {self._saved_step} in {self.cfg.checkpoint_dir} is "
                    "the last good state" if self._saved_step is not None
                    else "no checkpoint was written in this run")
            saved = (f" The weights themselves are no longer finite ({broken} tensors: an "
                     f"earlier update broke them), so nothing was saved; {last}.")
        elif self.cfg.checkpoint_dir:
            saved = f" The last good state was saved to {self.save_checkpoint()}."
        else:
            saved = ""
        raise FloatingPointError(
            f"non-finite training signal at step {self.step + 1}/{total} (loss={loss}, "
            f"grad_norm={grad_norm}); the weights were not updated by it.{saved} Try a lower lr "
            f"(now {self.cfg.lr}), grad_clip > 0 (now {self.cfg.grad_clip}) or precision='fp32'.")

    def _after_step(self, total: int, clock: _Clock) -> None:
        if self.val_dataset is not None and self.step % self.cfg.eval_every == 0:
            self._run_eval(total, clock)
        if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0 \
                and self.cfg.checkpoint_dir and self.step < total:
            try:
                self.save_checkpoint()
            except (OSError, RuntimeError) as err:          # a full disk must not end the run
                if not is_disk_full(err):
                    raise
                if self.world.is_main:
                    warnings.warn(f"the checkpoint of step {self.step} was not written: "
                                  f"{self._disk_full_advice()}; training goes on", stacklevel=2)

    def _run_eval(self, total: int, clock: _Clock) -> None:
        rec = {"step": self.step, "total_steps": total, "val_loss": self.evaluate(),
               "elapsed_s": clock.elapsed()}
        self.history.append_eval(rec)
        self._emit("on_eval", rec)

    # --- endings ------------------------------------------------------------------------------
    def _end_finished(self, total: int, clock: _Clock) -> None:
        last_eval = self.history.val_step[-1] if self.history.val_step else None
        if self.val_dataset is not None and last_eval != self.step:
            self._run_eval(total, clock)
        failure = self._save_at_end() if self.cfg.checkpoint_dir else None
        self._emit("on_end", self.history)
        if failure:
            raise failure

    def _end_interrupted(self, total: int) -> None:
        self.history.interrupted = True
        failure = self._save_at_end() if self.cfg.checkpoint_dir else None
        where = ("not written (see below)" if failure else self.checkpoint_path()) \
            if self.cfg.checkpoint_dir else "none (no checkpoint_dir)"
        note = " (the interrupt hit an optimizer update: weights may mix two steps)" \
            if self._mid_update else ""
        self._mid_update = False
        if self.world.is_main:
            print(f"stopped by {self.history.stopped_by} at step {self.step}/{total}; model and "
                  f"history kept; checkpoint: {where}{note}", flush=True)
        self._emit("on_end", self.history)
        if failure:
            raise failure

    def _save_at_end(self) -> CheckpointNotSaved | None:
        """Save the final checkpoint; a full disk or broken weights come back as the error to
        raise once the callbacks have seen the end (the model stays in memory)."""
        try:
            self.save_checkpoint()
        except FloatingPointError as err:
            return CheckpointNotSaved(f"{err}; {self._last_good()}")
        except (OSError, RuntimeError) as err:
            if not is_disk_full(err):
                raise
            return CheckpointNotSaved(f"the checkpoint of step {self.step} was not written: "
                                      f"{self._disk_full_advice()}; the model and history are "
                                      f"still in memory (save_checkpoint() once there is room); "
                                      f"{self._last_good()}")
        return None

    def _last_good(self) -> str:
        if self._saved_step is None:
            return "no checkpoint was written in this run"
        return f"the checkpoint on disk (step {self._saved_step}) is intact"

    def _disk_full_advice(self) -> str:
        folder = Path(self.cfg.checkpoint_dir)
        free = shutil.disk_usage(folder).free if folder.exists() else 0
        return (f"the disk is full ({free / 2**20:.0f} MiB free in {folder}; a checkpoint needs "
                f"about {self.checkpoint_bytes() / 2**20:.0f} MiB): free that much space")

    def _emit(self, event: str, payload) -> None:
        try:
            for cb in self.callbacks:
                method = getattr(cb, event, None)
                if callable(method):
                    method(self, payload)
        except KeyboardInterrupt:
            if not self.world.distributed or event == "on_end":
                raise
            self._stop_code = int(signal.SIGINT)      # every process stops after this step

    # --- checkpoint state ---------------------------------------------------------------------
    def _run_config_dict(self) -> dict | None:
        if self.run_cfg is not None:
            return {**self.run_cfg.to_dict(), "train": dataclasses.asdict(self.cfg)}
        model_cfg = getattr(self.model, "cfg", None)
        if isinstance(model_cfg, ModelConfig):
            return {"preset": "custom", "model": model_cfg.to_dict(),
                    "train": dataclasses.asdict(self.cfg)}
        return None

    def _checkpoint_state(self) -> dict:
        epoch, position = self._stream.tell()
        state = {"format": CHECKPOINT_FORMAT, "torch_version": str(torch.__version__),
                 "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "step": self.step, "epoch": epoch, "position": position,
                 "data_size": len(self.train_dataset), "history": self.history.to_dict(),
                 "rng": _rng_state(self.device), "train_config": dataclasses.asdict(self.cfg)}
        run_dict = self._run_config_dict()
        if run_dict is not None:
            state["run_config"] = run_dict
        return state

    def _restore(self, ckpt: dict) -> None:
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.step = int(ckpt["step"])
        self._stream.seek(int(ckpt["epoch"]), int(ckpt["position"]))
        self.history = History.from_dict(ckpt["history"])
        if ckpt["data_size"] != len(self.train_dataset):
            warnings.warn(f"the checkpoint was trained on {ckpt['data_size']} examples, "
                          f"train_data has {len(self.train_dataset)}: the batch order will "
                          "differ from the original run", stacklevel=3)
        ranks = ckpt.get("rng_ranks")
        if self.world.distributed and ranks is not None and len(ranks) == self.world.world_size:
            _set_rng_state(ranks[self.world.rank])            # every process's own stream
        else:
            _set_rng_state(ckpt["rng"])                       # rank 0's (a single process's)
            if self.world.rank:
                torch.manual_seed(distributed.rank_seed(self.cfg.seed + self.step,
                                                        self.world.rank))
        self._seeded = True


class _Clock:
    """Wall time of a run (continuing ``base_s`` from earlier fits) and the ETA."""

    def __init__(self, base_s: float, start_step: int):
        self.base_s = base_s
        self.start_step = start_step
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return self.base_s + time.perf_counter() - self.start

    def eta(self, step: int, total: int) -> float:
        done = step - self.start_step
        mean_step = (time.perf_counter() - self.start) / max(1, done)
        return mean_step * max(0, total - step)


# --- orchestration: staged training, models from checkpoints --------------------------------
def train_curriculum(model: torch.nn.Module, stages: Sequence[int] = (2, 4, 8), *,
                     make_data: Callable[[int], tuple], train_cfg,
                     steps_per_stage: int | Sequence[int], callbacks=(),
                     checkpoint_dir: str | Path | None = None) -> list:
    """Train in stages of growing data (e.g. ARMT's 2 -> 4 -> 8 segments), each stage starting
    from the last one's weights.

    ``make_data(n_segments) -> (train_data, val_data)`` (val may be None) builds a
    stage's data, e.g. sequences of n_segments * segment_size tokens.
    ``train_cfg``: a TrainConfig (or RunConfig) whose steps / checkpoint_dir are
    replaced per stage.
    ``steps_per_stage``: one count for all stages or one per stage. Each stage
    gets a fresh optimiser and LR schedule (a new ``train.Trainer``); with
    ``checkpoint_dir`` stage k is saved to ``<dir>/stage{k}_{n}seg/checkpoint.pt``.
    An interrupted stage ends the curriculum. Returns one History per stage run.
    """
    train_cfg = getattr(train_cfg, "train", train_cfg)          # a RunConfig's TrainConfig
    stages = list(stages)
    if not stages or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in stages):
        raise ValueError(f"stages={stages!r} is not allowed: expected a non-empty list of "
                         "segment counts >= 1, e.g. (2, 4, 8)")
    steps = [steps_per_stage] * len(stages) if isinstance(steps_per_stage, int) \
        else list(steps_per_stage)
    if len(steps) != len(stages) or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                        for s in steps):
        raise ValueError(f"steps_per_stage={steps_per_stage!r} is not allowed: expected an "
                         f"integer >= 1 or one per stage ({len(stages)} stages)")
    if not callable(make_data):
        raise ValueError(f"make_data={make_data!r} is not allowed: expected a function "
                         "n_segments -> (train_data, val_data)")
    histories = []
    for k, (n_segments, n_steps) in enumerate(zip(stages, steps, strict=True)):
        folder = (str(Path(checkpoint_dir) / f"stage{k}_{n_segments}seg")
                  if checkpoint_dir is not None else None)
        cfg = dataclasses.replace(train_cfg, steps=n_steps, checkpoint_dir=folder)
        train_data, val_data = make_data(n_segments)
        history = Trainer(model, cfg, train_data, val_data, callbacks).fit(n_steps)
        histories.append(history)
        if history.interrupted:
            break
    return histories


TRAIN_BYTES_PER_PARAM = 16       # fp32 weights + gradients + AdamW's two moments


def count_parameters(cfg) -> int:
    """Parameters of the model ``cfg`` describes, counted on the meta device (nothing is
    allocated, so it is safe for configs far too large to build)."""
    with torch.device("meta"):
        return build_model(cfg).num_params()


def check_fits_in_memory(cfg, device) -> int:
    """Refuse (ValueError) a model whose weights, gradients and AdamW state alone exceed the
    memory available on ``device``; returns that estimate in bytes."""
    params = count_parameters(cfg)
    need = TRAIN_BYTES_PER_PARAM * params
    available = available_memory_bytes(device)
    if available is not None and need > available:
        raise ValueError(f"this model is too large for this machine: {params / 1e6:,.1f}M "
                         f"parameters need about {human_bytes(need)} for weights, gradients and "
                         f"AdamW state alone, and {human_bytes(available)} is available on "
                         f"{torch.device(device).type}; choose a smaller d_model or n_layer")
    return need


def load_model(path, device: str | None = None) -> torch.nn.Module:
    """The model stored in a Trainer checkpoint at ``path``, rebuilt from its run config and
    with its weights loaded (e.g. to wrap a pretrained dense model: ``ARMT.wrap(load_model(p))``)."""
    ckpt = load_checkpoint_file(path)
    run = ckpt.get("run_config")
    if run is None:
        raise ValueError(f"checkpoint {path} stores no run config, so its model cannot be "
                         "rebuilt: build the model yourself, then load_state_dict(ckpt['model'])")
    model = build_model(ModelConfig.from_dict(run["model"]))
    model.load_state_dict(ckpt["model"])
    return model.to(pick_device(device)) if device else model
