"""Data-parallel training over several processes: torchrun's environment, the process group,
DistributedDataParallel (DDP), the few collectives the Trainer needs and each process's
share of a global batch (its rows, its share of the target tokens, its seed).

``torchrun --nproc-per-node N -m blockmem_lite train ...`` starts N copies of the command
and tells each one its place through environment variables: ``RANK`` (0 .. W-1 over every
node), ``WORLD_SIZE`` (W, all processes) and ``LOCAL_RANK`` (its index on this node, which
picks its GPU). ``setup`` reads them and joins the process group: NCCL when the processes
train on CUDA (process k of a node on ``cuda:k``), Gloo on CPU. Without torchrun (W = 1)
nothing is started and every helper here is a no-op, so one process trains exactly as
before.

How the kit uses it (kit decisions, see ``train`` and docs/DISTRIBUTED.md):

* same global batch: each of the W processes takes ``batch_size / W`` rows of the global
  batch a single process would draw, and DDP averages the gradients, so the curve is a
  single process's curve (to float rounding);
* same settings: before any work every process's run settings are compared
  (``check_same_settings``) and different ones are refused on every process;
* rank 0 alone writes checkpoints and history, holds the run-folder lock and prints;
  a choice it makes alone (the lock, a file it read) reaches the others through
  ``World.on_main``, an error included, so no process waits for a peer that failed;
* a stop (Ctrl-C, SIGTERM) on any process stops every process after the same step: the
  stop flag is all-reduced (max) once per step.

This module sits beside ``runtime`` (where and how code runs) and imports nothing of
the kit but it, so the Trainer, the lab and the command line can all use it.
"""

from __future__ import annotations

import gc
import os
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist

from blockmem_lite.runtime import pick_device

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
RENDEZVOUS_KEYS = ("MASTER_ADDR", "MASTER_PORT")
FIND_UNUSED_ENV = "BLOCKMEM_DDP_FIND_UNUSED"   # =1: DDP tolerates parameters without a gradient


@dataclass(frozen=True)
class World:
    """This process's place among the processes of one run (W = 1: a single process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device | None = None        # the device this process trains on (W > 1)

    @property
    def distributed(self) -> bool:
        """True when several processes train together (a process group is joined)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files and prints."""
        return self.rank == 0

    # --- collectives (each a no-op for a single process) ----------------------------------
    def _on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        # NCCL reduces CUDA tensors only; Gloo takes CPU tensors
        return tensor.to(self.device) if self.device is not None else tensor

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``tensor`` over every process (a new tensor)."""
        if not self.distributed:
            return tensor
        out = self._on_device(tensor.detach().clone())
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(tensor.device)

    def all_reduce_mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise mean of a floating-point ``tensor`` over every process."""
        if not self.distributed:
            return tensor
        return self.all_reduce_sum(tensor) / self.world_size

    def all_reduce_max(self, value: int) -> int:
        """The largest of every process's ``value`` (e.g. a stop flag: 0 = go on)."""
        if not self.distributed:
            return int(value)
        out = self._on_device(torch.tensor([int(value)], dtype=torch.int64))
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return int(out.item())

    def sum_numbers(self, *values: float) -> tuple:
        """The sums of these numbers over every process (as floats), for instance a loss total
        and a token count; the numbers themselves for a single process."""
        if not self.distributed:
            return values
        return tuple(self.all_reduce_sum(torch.tensor(values, dtype=torch.float64)).tolist())

    # --- this process's share of a global batch --------------------------------------------
    def local_rows(self, n: int) -> slice:
        """The rows of an ``n``-row global batch this process takes (every row for a single
        process; ``n * rank // W .. n * (rank + 1) // W`` otherwise)."""
        if not self.distributed:
            return slice(None)
        return slice(*(n * r // self.world_size for r in (self.rank, self.rank + 1)))

    def loss_share(self, n_local: torch.Tensor) -> torch.Tensor:
        """``n_local * W / n_all``: this process's share of the global batch's ``n_all`` target
        tokens (it holds ``n_local``), times W; exactly 1 for full LM windows.

        DDP averages the gradients of per-process mean losses, which is the gradient of the
        global mean only when every process has as many target tokens; a process's mean
        cross-entropy weighted by this share makes it so. Call it on every process.
        """
        n_all = self.all_reduce_sum(n_local)
        return n_local * self.world_size / n_all.clamp(min=1)

    def barrier(self) -> None:
        """Wait until every process gets here."""
        if self.distributed:
            dist.barrier(**({"device_ids": [self.device.index]}
                            if self.device is not None and self.device.type == "cuda" else {}))

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` on every process (pickled: kit-made values only, never a file's)."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._object_device())
        return box[0]

    def gather_objects(self, obj) -> list:
        """``[obj of rank 0, obj of rank 1, ...]`` on every process."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def _object_device(self) -> torch.device | None:
        return self.device if self.device is not None and self.device.type == "cuda" else None

    def on_main(self, fn):
        """Run ``fn()`` on rank 0 only and give every process its result, or raise its error
        on every process (so no rank waits for one that failed)."""
        if not self.distributed:
            return fn()
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except Exception as err:          # shared, then raised on every rank
                error = err
        shared_error, shared = self.broadcast_object((_portable(error), result))
        if error is not None:
            raise error
        if shared_error is not None:
            raise shared_error
        return result if self.is_main else shared


def _portable(error: Exception | None) -> Exception | None:
    """``error`` if it survives pickling (to reach the other ranks), else a RuntimeError."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


SINGLE = World()


class PeerLost(RuntimeError):
    """A process of the run ended without warning (kill -9, a crash, a lost node). Once a
    Trainer raises it, SIGTERM is ignored (torchrun sends it to every survivor): write what
    must be kept, then exit."""


# What gloo and NCCL say when the process at the other end of a collective is gone.
_PEER_GONE = ("connection reset by peer", "connection closed by peer", "broken pipe",
              "remote worker", "communicator was aborted", "connection refused")


def peer_lost(err: BaseException) -> bool:
    """True when ``err``, raised by a collective, says another process is gone."""
    network_error = getattr(dist, "DistNetworkError", None)
    if network_error is not None and isinstance(err, network_error):
        return True
    return isinstance(err, RuntimeError) and any(p in str(err).lower() for p in _PEER_GONE)
_current = SINGLE
_started_here = False            # True when setup() joined the process group (shutdown leaves it)


# --- the environment torchrun sets -------------------------------------------------------------
def env_world() -> World:
    """The World torchrun's variables describe (``World()`` without them); joins nothing."""
    values = {}
    for key in ENV_KEYS:
        text = os.environ.get(key)
        if text is None:
            continue
        if not text.strip().isdigit():
            raise ValueError(f"{key}={text!r} is not allowed: expected a whole number >= 0 "
                             "(torchrun sets it; start the command with torchrun)")
        values[key] = int(text)
    world_size = values.get("WORLD_SIZE", 1)
    if world_size < 1:
        raise ValueError(f"WORLD_SIZE={world_size} is not allowed: expected >= 1")
    rank = values.get("RANK", 0)
    if world_size > 1 and not rank < world_size:
        raise ValueError(f"RANK={rank} is not allowed with WORLD_SIZE={world_size}: expected "
                         f"0 .. {world_size - 1}")
    return World(rank=rank if world_size > 1 else 0, world_size=world_size,
                 local_rank=values.get("LOCAL_RANK", 0) if world_size > 1 else 0)


def check_batch_size(batch_size: int, world_size: int) -> int:
    """Rows per process (``batch_size / world_size``); a ValueError naming both when
    ``batch_size`` cannot be split into equal shares."""
    if world_size > 1 and batch_size % world_size:
        lower = batch_size - batch_size % world_size
        upper = lower + world_size
        choices = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(f"batch_size={batch_size} is not allowed with {world_size} processes "
                         f"(WORLD_SIZE={world_size}): every process takes batch_size / "
                         f"{world_size} rows of the same global batch, so batch_size must be a "
                         f"multiple of {world_size}, e.g. {choices} (--set batch_size=N), or "
                         f"start a number of processes that divides {batch_size}")
    return batch_size // world_size


def check_same_settings(settings: dict, world: World, what: str = "settings") -> None:
    """Refuse (ValueError, raised on every process) ``settings`` (e.g. ``RunConfig.to_dict()``)
    that differ between the processes of a run; a no-op for a single process.

    Call it on every process before any other collective: processes with another number of
    steps or another model wait for each other forever (no signal reaches a process blocked
    in a collective), and another lr or seed trains replicas that silently drift apart.
    """
    if not world.distributed:
        return
    everyone = [dict(_flat(s)) for s in world.gather_objects(settings)]
    unset = object()
    differing = [key for key in dict.fromkeys(k for s in everyone for k in s)
                 if len({repr(s.get(key, unset)) for s in everyone}) > 1]
    if not differing:
        return
    lines = [f"  {key}: " + ", ".join(f"rank {r} = {s[key]!r}" if key in s else f"rank {r}: unset"
                                      for r, s in enumerate(everyone))
             for key in differing]
    raise ValueError(f"the {world.world_size} processes of this run were started with different "
                     f"{what}, which is not allowed: every process must train the same model "
                     "the same way. Differing:\n" + "\n".join(lines) + "\nStart every process "
                     "with the same command and settings (torchrun starts N copies of one "
                     "command; on several nodes, give each node the same arguments)")


def _flat(settings: dict, prefix: str = ""):
    """(``"model.d_model"``, 32) pairs of a nested dict's leaves."""
    for key, value in settings.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def device_for(preference: str, world: World) -> torch.device:
    """The device process ``world.local_rank`` trains on: ``cuda:LOCAL_RANK`` when the
    preference leads to CUDA, else the CPU. A single process: ``pick_device(preference)``."""
    if not world.distributed:
        return pick_device(preference)
    if preference.startswith("cuda:"):
        raise ValueError(f"device={preference!r} is not allowed with torchrun: process k of a "
                         "node trains on cuda:k (its LOCAL_RANK); use 'auto' or 'cuda' "
                         "(CUDA_VISIBLE_DEVICES picks which GPUs a node uses)")
    if preference == "mps":
        raise ValueError("device='mps' is not allowed with torchrun: data-parallel training "
                         "runs on CUDA (NCCL) or the CPU (Gloo); use 'auto' or 'cpu'")
    kind = pick_device(preference).type
    if kind != "cuda":
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if world.local_rank >= count:
        raise ValueError(f"LOCAL_RANK={world.local_rank} is not allowed: this node has {count} "
                         f"GPU(s); start at most {count} processes per node "
                         f"(--nproc-per-node {count}) or train on the CPU (--device cpu)")
    return torch.device("cuda", world.local_rank)


def joined_device(preference: str, world: World) -> torch.device:
    """``device_for(preference, world)``, refused (ValueError) when it is not the kind of
    device this process joined the run on (``setup``)."""
    target = device_for(preference, world)
    if world.distributed and world.device is not None and world.device.type != target.type:
        raise ValueError(f"device={preference!r} is not allowed here: this process joined "
                         f"the run on {world.device.type} (distributed.setup), and "
                         f"{preference!r} trains on {target.type}; use the device "
                         "given to distributed.setup")
    return target


# --- joining and leaving -----------------------------------------------------------------------
def setup(device: str = "auto") -> World:
    """Join the process group torchrun's variables describe and return this process's World
    (also ``current()`` from now on). W = 1 (no torchrun): nothing is joined, ``World()``.

    ``device``: the run's device preference (TrainConfig.device); CUDA gives NCCL and
    ``cuda:LOCAL_RANK``, the CPU gives Gloo.
    """
    global _current, _started_here
    world = env_world()
    if not world.distributed:
        _current = SINGLE
        return SINGLE
    if not dist.is_available():
        raise ValueError("this PyTorch build has no torch.distributed: train in one process")
    missing = [k for k in RENDEZVOUS_KEYS if k not in os.environ]
    if missing and not dist.is_initialized():
        raise ValueError(f"WORLD_SIZE={world.world_size} but {', '.join(missing)} is not set: "
                         "start the command with torchrun (see docs/DISTRIBUTED.md), "
                         "which sets them")
    target = device_for(device, world)
    backend = "nccl" if target.type == "cuda" else "gloo"
    if target.type == "cuda":
        torch.cuda.set_device(target)
    if dist.is_initialized():
        joined = dist.get_backend()
        if (joined == "nccl") != (backend == "nccl"):
            raise ValueError(f"the process group already joined uses {joined}, but this run "
                             f"trains on {target.type}, which needs {backend}")
    else:
        dist.init_process_group(backend=backend,
                                **({"device_id": target} if backend == "nccl" else {}))
        _started_here = True
    _current = World(rank=dist.get_rank(), world_size=dist.get_world_size(),
                     local_rank=world.local_rank, device=target)
    return _current


def current() -> World:
    """The World of this process: the one ``setup`` joined, else a single process."""
    return _current


def shutdown() -> None:
    """Wait for every process, then leave the process group ``setup`` joined (a no-op
    otherwise). The wait matters: a Gloo process that leaves while a peer is still working
    can abort at exit."""
    global _current, _started_here
    if _started_here and dist.is_initialized():
        # DDP objects of finished Trainers go now, while the interpreter is whole: Gloo work
        # they hold, freed during interpreter teardown, can abort a process at exit
        # ("terminate called without an active exception" after a finished run)
        gc.collect()
        try:
            _current.barrier()
        except Exception:           # a peer already failed; leave anyway (torchrun stops it)
            pass
        dist.destroy_process_group()
    _started_here = False
    _current = SINGLE


# --- the model ---------------------------------------------------------------------------------
def wrap(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """``model`` inside DistributedDataParallel when several processes train (its backward
    then averages the gradients over the processes); ``model`` itself otherwise.

    DDP copies rank 0's weights to every process when it is built. Every built-in
    mechanism gives every parameter a gradient; a plugin that leaves some unused sets
    ``BLOCKMEM_DDP_FIND_UNUSED=1`` (slower: DDP then walks the graph every step).
    """
    if not world.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    find_unused = os.environ.get(FIND_UNUSED_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    cuda = world.device is not None and world.device.type == "cuda"
    return DistributedDataParallel(model, device_ids=[world.device.index] if cuda else None,
                                   find_unused_parameters=find_unused)


def rank_seed(seed: int, rank: int) -> int:
    """The torch seed of process ``rank`` (rank 0 keeps ``seed``), so the dropout masks of
    different processes' rows differ as they would within one batch."""
    return seed if rank == 0 else (seed * 1_000_003 + rank) % 2**63


def seed_rank(seed: int, world: World) -> None:
    """On ranks > 0, seed torch with ``rank_seed(seed, rank)``: other dropout masks on other
    rows (rank 0, and a single process, keep the generator as it is)."""
    if world.rank:
        torch.manual_seed(rank_seed(seed, world.rank))
