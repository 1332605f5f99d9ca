"""Checkpoints of a Trainer run and resuming from them: the RNG states a checkpoint
captures and restores, the run folder a fit locks, writing (rank 0 alone under torchrun),
the folders a checkpoint that found its disk full is rescued to, the checks a checkpoint
passes on load, the configs and the model a checkpoint rebuilds.

A checkpoint records the weights, AdamW's state, the step, the data position
``(epoch, position)``, the history and every RNG state, so a resumed run continues the
*same* loss curve. It holds only tensors, numbers, strings, lists and dicts, so it loads
with ``torch.load(path, weights_only=True)``; it is written atomically (temp file in the
same folder, fsync, ``os.replace``: ``checkpoints.atomic_write``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from blockmem_lite import distributed
from blockmem_lite.checkpoints import (
    HISTORY_NAME,
    CheckpointError,
    RunLock,
    atomic_write,
    load_checkpoint_file,
    prepare_folder,
)
from blockmem_lite.config import ModelConfig, RunConfig, TrainConfig
from blockmem_lite.models.base import build_model, model_name
from blockmem_lite.runtime import pick_device
from blockmem_lite.train.callbacks import History
from blockmem_lite.units import human_bytes


class CheckpointNotSaved(OSError):
    """The end-of-run checkpoint could not be written (the model is still in memory).
    ``disk_full``: because its folder had no room (``Trainer.rescue_checkpoint`` may save it
    elsewhere)."""

    def __init__(self, message: str, disk_full: bool = False):
        super().__init__(message)
        self.disk_full = disk_full

    def __str__(self) -> str:
        return self.args[0]


# --- RNG states ------------------------------------------------------------------------------
def rng_state(device: torch.device) -> dict:
    """Torch's, Python's and (on ``device``) CUDA's or MPS's generator states."""
    version, internal, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "python": {"version": version, "state": list(internal), "gauss_next": gauss_next}}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    if device.type == "mps":
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of ``rng_state``."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "mps" in state and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])


def restore_rng(ckpt: dict, world: distributed.World, seed: int) -> None:
    """This process's RNG states from ``ckpt``: its own when the checkpoint holds one per
    process of a run of as many processes, else rank 0's (a single process's), with torch
    reseeded from ``seed`` on the other ranks."""
    ranks = ckpt.get("rng_ranks")
    if world.distributed and ranks is not None and len(ranks) == world.world_size:
        set_rng_state(ranks[world.rank])                  # every process's own stream
    else:
        set_rng_state(ckpt["rng"])                        # rank 0's (a single process's)
        distributed.seed_rank(seed, world)


# --- what a checkpoint holds -------------------------------------------------------------------
def checkpoint_bytes(model: torch.nn.Module) -> int:
    """About the size of one checkpoint: the weights and AdamW's two moments."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters())


def non_finite(named: Mapping[str, torch.Tensor]) -> list[str]:
    """The names of the tensors of ``named`` that hold NaN or inf, in order (one host sync)."""
    if not named:
        return []
    device = next(iter(named.values())).device
    finite = torch.stack([torch.isfinite(t).all().to(device) for t in named.values()]).tolist()
    return [name for name, ok in zip(named, finite, strict=True) if not ok]


def _nan_and_inf(tensor: torch.Tensor) -> str:
    """'3 NaN and 0 inf values'."""
    return f"{int(tensor.isnan().sum())} NaN and {int(tensor.isinf().sum())} inf values"


def non_finite_tensors(model: torch.nn.Module) -> str:
    """'3/17' when 3 of the 17 floating-point tensors of the model are not finite, else ''."""
    tensors = {k: t for k, t in model.state_dict().items() if t.is_floating_point()}
    bad = non_finite(tensors)
    return f"{len(bad)}/{len(tensors)}" if bad else ""


def check_finite_parameters(model: torch.nn.Module) -> None:
    """Refuse (ValueError) a model whose parameters hold NaN or inf before training, naming
    the first such parameter: every update would be NaN and no checkpoint of it could be
    saved."""
    named = dict(model.named_parameters())
    bad = non_finite(named)
    if bad:
        raise ValueError(
            f"model is not allowed: its parameter {bad[0]!r} is not finite before training "
            f"({_nan_and_inf(named[bad[0]])}; {len(bad)} of {len(named)} parameters are not "
            "finite), so every update would be NaN and no checkpoint of it could be saved: "
            "build the model again or load finite weights")


def run_config_dict(model: torch.nn.Module, cfg: TrainConfig,
                    run_cfg: RunConfig | None) -> dict | None:
    """The run config a checkpoint stores to rebuild the model (None: it cannot be rebuilt)."""
    if run_cfg is not None:
        return {**run_cfg.to_dict(), "train": dataclasses.asdict(cfg)}
    model_cfg = getattr(model, "cfg", None)
    if isinstance(model_cfg, ModelConfig):
        return {"preset": "custom", "model": model_cfg.to_dict(),
                "train": dataclasses.asdict(cfg)}
    return None


def check_data_size(ckpt: dict, data_size: int) -> None:
    """Warn when the checkpoint was trained on another number of examples."""
    if ckpt["data_size"] != data_size:
        warnings.warn(f"the checkpoint was trained on {ckpt['data_size']} examples, "
                      f"train_data has {data_size}: the batch order will "
                      "differ from the original run", stacklevel=4)


# --- writing -------------------------------------------------------------------------------------
@contextlib.contextmanager
def run_folder(folder: str | None, need_bytes: Callable[[], int], world: distributed.World):
    """During one fit: ``folder`` prepared (``need_bytes()`` free) and locked against a second
    run writing into it; rank 0 alone does both under torchrun, and its error reaches every
    process. Nothing without a folder."""
    if not world.distributed:
        if folder:
            prepare_folder(folder, need_bytes())
        with RunLock(folder) if folder else contextlib.nullcontext():
            yield
        return
    lock = RunLock(folder) if folder and world.is_main else None

    def claim():                                    # rank 0 alone writes into the folder
        if lock is not None:
            prepare_folder(folder, need_bytes())
            lock.acquire()

    world.on_main(claim)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def write_checkpoint(path: Path, state: Callable[[], dict], device: torch.device,
                     world: distributed.World) -> None:
    """Write ``state()`` to ``path`` atomically. Under torchrun call it on every process:
    rank 0 writes (with every process's RNG state as ``rng_ranks``), the others wait for
    the file and share its error."""
    if not world.distributed:
        snapshot = state()
        atomic_write(path, lambda f: torch.save(snapshot, f))
        return
    rngs = world.gather_objects(rng_state(device))

    def write():
        snapshot = {**state(), "rng_ranks": rngs}
        atomic_write(path, lambda f: torch.save(snapshot, f))

    world.on_main(write)      # the others wait for the file, and share its error


def last_good(saved_step: int | None) -> str:
    """What is left on disk when a checkpoint could not be written."""
    if saved_step is None:
        return "no checkpoint was written in this run"
    return f"the checkpoint on disk (step {saved_step}) is intact"


RESCUE_ENV = "BLOCKMEM_RESCUE_DIR"      # where a checkpoint goes when its own disk is full


class RescueFolder(NamedTuple):
    """A folder a checkpoint may be rescued into, as a message names it, and why it cannot
    take the checkpoint ('' while it may be tried)."""
    name: str
    folder: Path
    problem: str = ""

    def describe(self) -> str:
        return f"{self.name}: {self.problem}"


def filesystem_of(path) -> int:
    """The device id of the filesystem ``path`` (or its nearest existing parent) is on."""
    existing = Path(path).resolve()
    while not existing.exists():
        existing = existing.parent
    return existing.stat().st_dev


def rescue_folders(folder, need_bytes: int) -> list[RescueFolder]:
    """Where a checkpoint of about ``need_bytes`` that did not fit into ``folder`` may go, in
    the order to try them: ``$BLOCKMEM_RESCUE_DIR`` when set, then a ``blockmem-rescue-<pid>``
    folder in the temp folder and in the home folder, which must be on another filesystem
    than ``folder`` (the same full disk would fail again). Each says why it cannot be used
    ('' when it may be tried)."""
    found = []
    chosen = os.environ.get(RESCUE_ENV)
    if chosen:
        found.append(RescueFolder(f"{RESCUE_ENV}={chosen}", Path(chosen),
                                  _no_room(Path(chosen), need_bytes)))
    full = filesystem_of(folder)
    for kind, base in (("temp", Path(tempfile.gettempdir())), ("home", Path.home())):
        problem = _no_room(base, need_bytes)
        if not problem and filesystem_of(base) == full:
            problem = f"it is on the same full disk as {folder}"
        found.append(RescueFolder(f"the {kind} folder {base}",
                                  base / f"blockmem-rescue-{os.getpid()}", problem))
    return found


def _no_room(folder: Path, need_bytes: int) -> str:
    """Why ``folder`` cannot take ``need_bytes`` ('' when it can be tried)."""
    if not folder.exists():
        return "it does not exist"
    if not folder.is_dir():
        return "it is not a folder"
    try:
        free = shutil.disk_usage(folder).free
    except OSError as err:
        return f"its free space cannot be read ({err.strerror or err})"
    if free < need_bytes * 1.2:
        return f"it has only {human_bytes(free)} free, a checkpoint needs about " \
               f"{human_bytes(need_bytes)}"
    return ""


def write_failure(err: OSError | RuntimeError) -> str:
    """Why a folder could not be written, in a few words: 'it cannot be written (Read-only
    file system)'."""
    why = err.strerror if isinstance(err, OSError) and err.strerror else \
        (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return f"it cannot be written ({why})"


def save_into_first(candidates: list[RescueFolder], save_into: Callable[[Path], Path],
                    world: distributed.World) -> tuple[Path | None, list[RescueFolder]]:
    """``save_into(folder)`` for the first of ``candidates`` that takes the checkpoint: one
    that fails (no room, read-only, missing: any OSError) passes to the next. Returns the
    path (None when all failed) and the folders that failed, each with why; rank 0 warns
    when a later folder took it (e.g. after a typo in ``$BLOCKMEM_RESCUE_DIR``)."""
    tried = []
    for candidate in candidates:
        if not candidate.problem:
            try:
                path = save_into(candidate.folder)
            except (OSError, RuntimeError) as err:
                candidate = candidate._replace(problem=write_failure(err))
            else:
                if tried and world.is_main:
                    warnings.warn(f"the checkpoint went to {path}, as "
                                  f"{'; '.join(c.describe() for c in tried)}", stacklevel=3)
                return path, tried
        tried.append(candidate)
    return None, tried


def rescue_failed(step: int, tried: list[RescueFolder]) -> str:
    """One line: every folder tried for the checkpoint of ``step`` and why each failed, and
    what to do (set ``$BLOCKMEM_RESCUE_DIR`` only when it is not set)."""
    chosen = os.environ.get(RESCUE_ENV)
    advice = (f"make {RESCUE_ENV}={chosen} a writable folder with room on another disk"
              if chosen else f"set {RESCUE_ENV} to a writable folder on another disk")
    return (f"no folder could take the checkpoint of step {step}: "
            f"{'; '.join(c.describe() for c in tried)} ({advice})")


def disk_full_advice(folder, need_bytes: int) -> str:
    """What to free when a checkpoint of about ``need_bytes`` did not fit into ``folder``."""
    folder = Path(folder)
    free = shutil.disk_usage(folder).free if folder.exists() else 0
    return (f"the disk is full ({human_bytes(free)} free in {folder}; a checkpoint needs "
            f"about {human_bytes(need_bytes)}): free that much space")


# --- reading back ------------------------------------------------------------------------------
def cut_history_file(checkpoint_path, ckpt: dict) -> None:
    """Rewrite a history.json beside ``checkpoint_path`` that runs past ``ckpt``'s step (its run
    went on after its last checkpoint was written) to the checkpoint's own history, so a
    resumed run continues the history it restores; warns when it does."""
    path = Path(checkpoint_path).with_name(HISTORY_NAME)
    try:
        steps = json.loads(path.read_text(encoding="utf-8"))["step"]
        last = int(steps[-1]) if steps else 0
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return                                   # none, or not the kit's: left as it is
    step = ckpt["step"]
    if last <= step:
        return
    try:
        History.from_dict(ckpt["history"]).save_json(path)
    except OSError as err:
        warnings.warn(f"{path} runs to step {last}, past the checkpoint's step {step}, and "
                      f"could not be cut back ({err.strerror or err})", stacklevel=3)
        return
    warnings.warn(f"{path} ran to step {last}, past the checkpoint's step {step}: it now ends "
                  f"at step {step}, as the history the run continues does", stacklevel=3)


def configs_to_resume(ckpt: dict, path, *, model_given: bool, device: str | None,
                      checkpoint_dir: str | None) -> tuple[RunConfig | None, TrainConfig]:
    """The run config (None when the checkpoint stores none) and the TrainConfig a Trainer
    resumed from ``ckpt`` (read from ``path``) takes: later checkpoints go beside ``path``,
    or to ``checkpoint_dir``; ``device`` overrides the stored one."""
    run_dict = ckpt.get("run_config")
    run_cfg = RunConfig.from_dict(run_dict) if run_dict is not None else None
    if not model_given and run_cfg is None:
        raise ValueError(f"model=None is not allowed: checkpoint {path} stores no run config "
                         "to rebuild the model from; pass model=")
    train_cfg = run_cfg.train if run_cfg is not None else TrainConfig(**ckpt["train_config"])
    folder = str(checkpoint_dir if checkpoint_dir is not None else Path(path).parent)
    train_cfg = dataclasses.replace(train_cfg, checkpoint_dir=folder,
                                    **({"device": device} if device is not None else {}))
    run_cfg = dataclasses.replace(run_cfg, train=train_cfg) if run_cfg else None
    return run_cfg, train_cfg


def check_finite_weights(ckpt: dict, path=None) -> None:
    """Refuse (CheckpointError) a checkpoint whose weights hold NaN or inf, naming the file and
    the first such tensor: a run resumed from it would train on garbage and refuse to save."""
    weights = ckpt["model"]
    if not isinstance(weights, Mapping):
        raise CheckpointError(f"{_checkpoint(path)} is not usable: its 'model' entry is a "
                              f"{type(weights).__name__}, not a state dict")
    floats = {k: t for k, t in weights.items() if torch.is_tensor(t) and t.is_floating_point()}
    bad = non_finite(floats)
    if bad:
        raise CheckpointError(
            f"{_checkpoint(path)} is not usable: its weights are not finite (tensor {bad[0]!r} "
            f"holds {_nan_and_inf(floats[bad[0]])}; {len(bad)} of {len(floats)} tensors are "
            "not finite): it comes from a run that diverged; resume from an earlier copy, or "
            "train again")


def check_finite_optimizer(ckpt: dict, path=None) -> None:
    """Refuse (CheckpointError) a checkpoint whose optimizer state (AdamW's moments, its
    settings) holds NaN or inf, naming the file and the first such entry: its first update
    would turn the weights to NaN."""
    entries = {name: torch.as_tensor(value) for name, value in _numbers(ckpt["optimizer"], "")}
    bad = non_finite(entries)
    if bad:
        raise CheckpointError(
            f"{_checkpoint(path)} is not usable: its optimizer state is not finite (entry "
            f"{bad[0]} holds {_nan_and_inf(entries[bad[0]])}; {len(bad)} of {len(entries)} "
            "entries are not finite): it comes from a run that diverged; resume from an "
            "earlier copy, or train again")


def _numbers(value, name: str):
    """(name, value) for every floating-point tensor and float nested in ``value``, named
    as it is reached: ``state[0]['exp_avg']``."""
    if torch.is_tensor(value) and value.is_floating_point() or isinstance(value, float):
        yield name, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers(item, f"{name}[{key!r}]" if name else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{name}[{i}]")


def load_weights(model: torch.nn.Module, ckpt: dict, path=None) -> None:
    """``ckpt``'s weights into ``model``, refused (CheckpointError) when they are not finite or
    do not fit: the error names the checkpoint's arch and the model's, not torch's key list."""
    check_finite_weights(ckpt, path)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError:
        raise CheckpointError(weights_mismatch(model, ckpt, path)) from None


def weights_mismatch(model: torch.nn.Module, ckpt: dict, path=None) -> str:
    """Why ``ckpt``'s weights do not fit ``model``: another arch, other sizes, other tensors."""
    stored = (ckpt.get("run_config") or {}).get("model") or {}
    own = getattr(model, "cfg", None)
    arch, mine = stored.get("arch"), getattr(own, "arch", None)
    head = f"{_checkpoint(path)} holds a {arch!r} model" if arch else \
        f"{_checkpoint(path)} holds another model (it stores no model config)"
    if arch and mine and arch != mine:
        return (f"{head}, not a {model_name(model)} one: its weights do not fit. "
                f"Resume with a {arch!r} model (model=None rebuilds the checkpoint's), or train "
                f"this {mine!r} model into another folder")
    ours = own.to_dict() if isinstance(own, ModelConfig) else {}
    differ = [f"{k}={v!r} (checkpoint) vs {ours[k]!r} (this model)"
              for k, v in stored.items() if k in ours and ours[k] != v]
    if differ:
        return (f"{head} with other settings than this one: {'; '.join(differ)}. "
                "Build the model with the checkpoint's settings (model=None rebuilds it)")
    have, want = model.state_dict(), ckpt["model"]
    odd = sorted(set(have) ^ set(want)) + [
        k for k in have if k in want and have[k].shape != getattr(want[k], "shape", None)]
    return (f"{head} whose weights do not fit this {model_name(model)} ({len(odd)} tensors "
            f"missing, extra or of another shape, e.g. {odd[:3]}): pass the model the "
            "checkpoint was trained with")


def _checkpoint(path) -> str:
    return f"checkpoint {path}" if path is not None else "the checkpoint"


def load_model(path, device: str | None = None) -> torch.nn.Module:
    """The model stored in a Trainer checkpoint at ``path``, rebuilt from its run config and
    with its weights loaded (e.g. to wrap a pretrained dense model: ``ARMT.wrap(load_model(p))``)."""
    ckpt = load_checkpoint_file(path)
    run = ckpt.get("run_config")
    if run is None:
        raise ValueError(f"checkpoint {path} stores no run config, so its model cannot be "
                         "rebuilt: build the model yourself, then load_state_dict(ckpt['model'])")
    model = build_model(ModelConfig.from_dict(run["model"]))
    load_weights(model, ckpt, path)
    return model.to(pick_device(device)) if device else model
