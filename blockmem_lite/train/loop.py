"""The Trainer: its fit / step loop, the main entry point of every notebook, benchmark and
CLI run.

The update itself is the one of ``train.simple.train_simple``, the loop notebook 01
builds: AdamW (weight decay on matrices only), linear warmup then cosine decay
(``optim.lr_at``), global-norm gradient clipping. Around it the Trainer does what long runs
need; each piece has its own module beside this one:

* the batch stream and evaluation: ``data``; checkpoints, resume and RNG states:
  ``resume``; the stop button and the clock: ``stopping``; the History and callbacks
  (``on_step`` / ``on_eval`` / ``on_end``): ``callbacks``; the optimiser: ``optim``.
* Device: ``runtime.pick_device`` (cuda > mps > cpu); autocast only on CUDA, at
  ``runtime.resolve_precision``'s dtype: bf16 on cards with fast bf16 (Ampere and later),
  else fp16 with a GradScaler (scale the loss, unscale before clipping, step, update; a
  step whose scaled gradients overflow is skipped, not failed).
* Memory: before the first step, ``train.memory`` estimates what the run needs
  (weights, gradients, AdamW moments, activations from two small dry runs) and refuses a
  run that does not fit the device, naming the largest batch that does (``check_memory``).
* Several processes (``torchrun``, ``distributed.setup``): the model trains inside DDP;
  each process takes ``batch_size / W`` rows of the same global batch, the loss is
  weighted by each process's share of the target tokens, so the gradient and the logged
  loss are the single process's (to float rounding); evaluation and the stop flag are
  all-reduced; rank 0 alone takes the folder lock, writes and runs the callbacks (the
  default printer included). ``save_checkpoint`` is then called on every process.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import signal
import time
import warnings
from pathlib import Path

import torch

from blockmem_lite import distributed
from blockmem_lite.checkpoints import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    is_disk_full,
    load_checkpoint_file,
)
from blockmem_lite.compiling import compile_training
from blockmem_lite.config import RunConfig, TrainConfig
from blockmem_lite.models.base import IGNORE_INDEX, build_model, check_output, model_name
from blockmem_lite.registry import PRESET_NAMES
from blockmem_lite.runtime import (
    SavedTensorCounter,
    autocast_for,
    grad_scaler,
    precision_note,
    reset_peak_memory,
    resolve_precision,
    seed_everything,
    synchronize,
    training_memory,
    usable_workers,
)
from blockmem_lite.train import resume
from blockmem_lite.train.callbacks import History, PrintProgress, check_callbacks, emit
from blockmem_lite.train.data import BatchStream, as_dataset, evaluate, first_examples
from blockmem_lite.train.memory import (
    MemoryEstimate,
    check_fits,
    estimate_training_memory,
    memory_for_run,
)
from blockmem_lite.train.optim import lr_at, make_optimizer
from blockmem_lite.train.resume import CheckpointNotSaved
from blockmem_lite.train.stopping import Clock, StopButton, agreed_stop
from blockmem_lite.units import human_bytes

MAX_SKIPPED_IN_A_ROW = 20     # fp16: overflowing steps in a row before the run is failed


class Trainer:
    """Train ``model`` on ``train_data`` with ``cfg``; see the module docstring.

    The one way to call it::

        cfg = notebook_config("bcmt")                  # a RunConfig: model + train settings
        trainer = Trainer(build_model(cfg), cfg, train_loader, val_loader, callbacks=[...])
        history = trainer.fit()

    ``cfg``: the RunConfig (its checkpoints then carry the model config, so ``load_model``
    and ``--resume`` rebuild the model alone), or a bare TrainConfig for a model that has no
    RunConfig (a hand-built one, a wrapped one); ``Trainer.from_checkpoint`` resumes.
    ``train_data``: a map-style Dataset of (x (T,), y (T,)), a DataLoader over one (its
    dataset is used; batch size and order come from ``cfg``), or an object with
    ``.dataset()`` (e.g. ``tasks.TaskBatch``). ``val_data`` likewise (optional).
    ``callbacks``: ``Callback`` objects or anything with on_step / on_eval / on_end; with
    none, the Trainer prints throttled progress lines itself.
    Under ``distributed.setup`` (torchrun) the Trainer trains with every process of the
    run (see the module docstring); callbacks then run on rank 0 only, and a
    KeyboardInterrupt they raise stops every process after the current step.
    ``trainer.precision`` is the precision chosen (bf16, fp16 or fp32), ``trainer.memory``
    the memory estimate (a ``MemoryEstimate``; None with ``check_memory=False`` or where the
    free memory is unknown). The estimate's two dry runs call the model in training mode on
    batches of 1 and 2 of the first examples before the first step.
    """

    def __init__(self, model: torch.nn.Module, cfg: RunConfig | TrainConfig, train_data,
                 val_data=None, callbacks=()):
        run_cfg = cfg if isinstance(cfg, RunConfig) else None
        cfg = cfg.train if isinstance(cfg, RunConfig) else cfg
        if not isinstance(cfg, TrainConfig):
            raise ValueError(f"cfg of type {type(cfg).__name__} is not allowed: expected a "
                             "TrainConfig (or a RunConfig)")
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model of type {type(model).__name__} is not allowed: expected a "
                             "torch.nn.Module (e.g. build_model(cfg))")
        self.cfg = cfg
        self.run_cfg = run_cfg
        self.world = distributed.current()
        # every rank the same settings, before anything a rank could fail alone
        distributed.check_same_settings(run_cfg.to_dict() if run_cfg is not None
                                        else dataclasses.asdict(cfg), self.world)
        distributed.check_batch_size(cfg.batch_size, self.world.world_size)
        self.device = distributed.joined_device(cfg.device, self.world)
        self.precision = resolve_precision(self.device, cfg.precision)   # bf16 / fp16 / fp32
        self.model = model.to(self.device)
        self.train_dataset = as_dataset(train_data, "train_data")
        self.val_dataset = as_dataset(val_data, "val_data") if val_data is not None else None
        self.memory = self._check_memory() if cfg.check_memory else None
        if cfg.compile:                                # forward + backward compiled in place
            compile_training(self.model)
        callbacks = check_callbacks(callbacks) or [PrintProgress(cfg.log_every)]
        self.callbacks = callbacks if self.world.is_main else []
        self.optimizer = make_optimizer(self.model, cfg)
        self.scaler = grad_scaler(self.device, self.precision)   # fp16 only
        self.skipped_steps = 0                 # fp16 steps skipped for overflowing gradients
        self._skipped_in_a_row = 0
        self.history = History()
        self.step = 0
        self._stream = BatchStream(self.train_dataset, cfg.batch_size, cfg.seed,
                                   usable_workers(cfg.num_workers), pin_memory=self.device.type == "cuda",
                                   shard=(self.world.rank, self.world.world_size))
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._train_model = distributed.wrap(self.model, self.world)   # DDP, or the model
        self._stop_code = 0                 # W > 1: a stop a callback asked for (SIGINT's number)
        self._seeded = False
        self._mid_update = False
        self._saved_step: int | None = None    # step of the checkpoint in checkpoint_dir
        self._saved_history: History | None = None          # and the history it holds
        self.rescue_problem = ""               # why rescue_checkpoint() found no folder
        self._contract_checked = False                # the model's outputs, on the first step

    def _check_memory(self) -> MemoryEstimate | None:
        """Estimate the run's training memory and refuse (ValueError, on every process) one
        that does not fit the device, before any step; None where its free memory is
        unknown or the model cannot run a dry run. On CUDA one line says the precision and
        the estimate."""
        available = memory_for_run(self.model, self.device)
        if available is None:
            return None
        where = self.device.type
        if where == "cuda":
            where = f"cuda ({torch.cuda.get_device_name(self.device)})"
        estimate, problem = self._estimate_memory(where)
        if estimate is not None:
            try:
                check_fits(estimate, available, where, self.world.world_size,
                           self._smaller_preset())
            except ValueError as err:
                problem = str(err)
        problems = [p for p in self.world.gather_objects(problem) if p]
        if problems:
            raise ValueError(problems[0])
        if estimate is not None and self.device.type == "cuda" and self.world.is_main:
            print(f"{where}: {precision_note(self.device, self.precision)}; training needs "
                  f"{estimate.describe()} of {human_bytes(available)} free", flush=True)
        return estimate

    def _estimate_memory(self, where: str) -> tuple[MemoryEstimate | None, str | None]:
        """(the estimate, None), or (None, why it cannot fit) when even the dry runs run out
        of memory, or (None, None) when the model fails on the data: its first step then
        says why, as it would without the estimate."""
        x, y = (t.to(self.device) for t in first_examples(self.train_dataset, 2))   # (2, T)
        try:
            return estimate_training_memory(self.model, x, y,
                                            self.cfg.batch_size // self.world.world_size,
                                            self.precision), None
        except torch.OutOfMemoryError:
            return None, (f"seq_len={x.shape[1]} is not allowed on {where}: even a dry run of "
                          "2 sequences ran out of memory; expected a shorter seq_len or a "
                          "smaller model")
        except Exception:              # any error of the model on this data: its step reports it
            return None, None

    def _smaller_preset(self) -> str:
        """"the 'class' preset" for a run of the 'gpu' preset, and so on; "" without one."""
        name = self.run_cfg.preset if self.run_cfg is not None else None
        if name not in PRESET_NAMES or PRESET_NAMES.index(name) == 0:
            return ""
        return f"the {PRESET_NAMES[PRESET_NAMES.index(name) - 1]!r} preset"

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
        resume.check_finite_parameters(self.model)
        with resume.run_folder(self.cfg.checkpoint_dir, self.checkpoint_bytes, self.world):
            return self._fit(total)

    def _fit(self, total: int) -> History:
        if not self._seeded:
            seed_everything(self.cfg.seed)
            distributed.seed_rank(self.cfg.seed, self.world)   # other dropout masks on other rows
            self._seeded = True
        self.history.total_steps = total
        self.history.interrupted = False
        self.history.stopped_by = ""
        self.model.train()
        reset_peak_memory(self.device)
        clock = Clock(self.history.elapsed_s[-1] if self.history.elapsed_s else 0.0, self.step)
        self._stop_code = 0
        with StopButton() as stop:
            agreed = None                              # W > 1: the stop every process agreed on
            try:
                while self.step < total:
                    if not self.world.distributed:
                        if stop.requested:
                            break
                    else:
                        agreed = agreed_stop(stop, self.world, self._stop_code)
                        if agreed:
                            break
                    self._step_with_rollback(total, clock)
                    self._after_step(total, clock)
                interrupted = stop.requested if agreed is None else bool(agreed)
            except KeyboardInterrupt:
                interrupted = True
            except RuntimeError as err:          # still under the stop button: torchrun's
                if not (self.world.distributed and distributed.peer_lost(err)):   # SIGTERM
                    raise                                                         # waits
                self._end_peer_lost(err)
            finally:
                self._stream.close()
            name = signal.Signals(agreed).name if agreed else stop.signal_name
            self.history.stopped_by = name or ("SIGINT" if interrupted else "")
            if interrupted:
                self._end_interrupted(total)
            else:
                self._end_finished(total, clock)
        return self.history

    def evaluate(self, max_batches: int | None = None) -> float:
        """Mean validation CE over ``max_batches`` (default ``cfg.eval_batches``) batches
        (with several processes: all-reduced, call it on every one)."""
        if self.val_dataset is None:
            raise ValueError("val_data is None: pass val_data to the Trainer to evaluate")
        return evaluate(self.model, self.val_dataset, max_batches or self.cfg.eval_batches,
                        self.device, batch_size=self.cfg.batch_size, precision=self.cfg.precision,
                        world=self.world)

    # --- checkpoints (the work is done in ``resume``) -----------------------------------------
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
        broken = resume.non_finite_tensors(self.model)
        if broken:
            raise FloatingPointError(f"not saving a checkpoint at step {self.step}: {broken} of "
                                     "the model's tensors are not finite")
        resume.write_checkpoint(path, self._checkpoint_state, self.device, self.world)
        if self._in_checkpoint_dir(path):
            self._mark_saved(self.step, self.history.to_dict())
        return path

    def _in_checkpoint_dir(self, path) -> bool:
        """Whether ``path`` is ``checkpoint_dir``'s checkpoint (not a copy elsewhere)."""
        own = self.checkpoint_path()
        return own is not None and Path(path).resolve() == own.resolve()

    def _mark_saved(self, step: int, history: dict) -> None:
        """``checkpoint_dir``'s checkpoint is now at ``step``, with ``history``."""
        self._saved_step = step
        self._saved_history = History.from_dict(history)

    @property
    def checkpoint_history(self) -> History | None:
        """The history the checkpoint in ``checkpoint_dir`` holds (written or restored by this
        Trainer; None before either): the history.json to keep beside it, which never runs
        past its step, while ``history`` also holds the steps trained since."""
        return self._saved_history

    def checkpoint_bytes(self) -> int:
        """About the size of one checkpoint: the weights and AdamW's two moments."""
        return resume.checkpoint_bytes(self.model)

    def load_checkpoint(self, path) -> None:
        """Restore model, optimizer, step, data position, history and RNG states (with
        several processes: rank 0 reads the file and hands it to the others)."""
        self.restore(self.world.on_main(lambda: load_checkpoint_file(path)), path)

    def restore(self, ckpt: dict, path=None) -> None:
        """``load_checkpoint`` with the checkpoint already read (``load_checkpoint_file``) from
        ``path`` (named in errors). Weights or an optimizer state that are not finite, or
        weights of another architecture, are refused (``CheckpointError``). A history.json
        beside ``path`` that runs past the checkpoint's step is cut back to it."""
        resume.check_finite_optimizer(ckpt, path)
        resume.load_weights(self.model, ckpt, path)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scaler is not None and "grad_scaler" in ckpt:
            self.scaler.load_state_dict(ckpt["grad_scaler"])
        self.step = int(ckpt["step"])
        self._stream.seek(int(ckpt["epoch"]), int(ckpt["position"]))
        self.history = History.from_dict(ckpt["history"])
        resume.check_data_size(ckpt, len(self.train_dataset))
        resume.restore_rng(ckpt, self.world, self.cfg.seed + self.step)
        self._seeded = True
        if path is not None and self.world.is_main:
            resume.cut_history_file(path, ckpt)
        if path is not None and self._in_checkpoint_dir(path):
            self._mark_saved(self.step, ckpt["history"])

    @classmethod
    def from_checkpoint(cls, path, train_data, val_data=None, callbacks=(), *,
                        model: torch.nn.Module | None = None, device: str | None = None,
                        checkpoint_dir: str | None = None) -> Trainer:
        """A Trainer restored from ``path``; the model is rebuilt from the stored run config
        unless ``model`` is given. ``device`` overrides the stored one (e.g. "cpu").
        Later checkpoints go beside ``path`` (the folder it was loaded from, wherever it was
        moved to), or to ``checkpoint_dir``."""
        ckpt = distributed.current().on_main(lambda: load_checkpoint_file(path))
        run_cfg, train_cfg = resume.configs_to_resume(ckpt, path, model_given=model is not None,
                                                      device=device, checkpoint_dir=checkpoint_dir)
        trainer = cls(model if model is not None else build_model(run_cfg),
                      run_cfg if run_cfg is not None else train_cfg, train_data, val_data,
                      callbacks)
        trainer.restore(ckpt, path)
        return trainer

    def _checkpoint_state(self) -> dict:
        epoch, position = self._stream.tell()
        state = {"format": CHECKPOINT_FORMAT, "torch_version": str(torch.__version__),
                 "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "step": self.step, "epoch": epoch, "position": position,
                 "data_size": len(self.train_dataset), "history": self.history.to_dict(),
                 "rng": resume.rng_state(self.device), "train_config": dataclasses.asdict(self.cfg)}
        if self.scaler is not None:
            state["grad_scaler"] = self.scaler.state_dict()
        run_dict = resume.run_config_dict(self.model, self.cfg, self.run_cfg)
        if run_dict is not None:
            state["run_config"] = run_dict
        return state

    # --- one step -----------------------------------------------------------------------------
    def _step_with_rollback(self, total: int, clock: Clock) -> None:
        """One step; an interrupt before the update puts the batch back (exact resume)."""
        mark = self._stream.tell()
        step_before = self.step
        try:
            self._train_step(total, clock)
        except (KeyboardInterrupt, RuntimeError) as err:
            lost = isinstance(err, RuntimeError) and self.world.distributed and \
                distributed.peer_lost(err)
            if (lost or isinstance(err, KeyboardInterrupt)) and self.step == step_before \
                    and not self._mid_update:
                self._stream.seek(*mark)
            raise

    def _train_step(self, total: int, clock: Clock) -> None:
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
        with autocast_for(self.device, self.precision), \
                SavedTensorCounter(self.model.parameters()) as saved:
            out = self._train_model(x, y)
        if not self._contract_checked:                  # the first step of this Trainer
            check_output(out, x, getattr(getattr(self.model, "cfg", None), "vocab_size", None),
                         model_name(self.model))
            self._contract_checked = True
        self.optimizer.zero_grad(set_to_none=True)
        ce = out.ce_loss if out.ce_loss is not None else out.loss
        aux = out.aux_loss if out.aux_loss is not None else torch.zeros_like(out.loss)
        extras = out.extras or {}
        if self.world.distributed:
            loss_v, ce_v, aux_v, norm_v, extra_v = self._distributed_backward(out, ce, aux, y)
        else:
            self._backward(out.loss)
            grad_norm = self._clip_gradients()
            loss_v, ce_v, aux_v, norm_v, *extra_v = torch.stack(
                [out.loss.detach().float(), ce.detach().float(), aux.detach().float(),
                 grad_norm.float(), *(torch.as_tensor(v, device=out.loss.device).detach().float()
                                      for v in extras.values())]).tolist()     # one host sync
        skipped = self._overflow_to_skip(loss_v, norm_v)          # fp16: the scaler skips it
        if not skipped and not (math.isfinite(loss_v) and math.isfinite(norm_v)):
            self._fail_non_finite(loss_v, norm_v, total)
        self._mid_update = True
        self._optimizer_step()
        self.step += 1
        self._mid_update = False
        synchronize(self.device)
        seconds = time.perf_counter() - start
        memory, method = training_memory(self.device, self.model, self.optimizer,
                                         saved.bytes)
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

        The cross-entropy is weighted by this process's share of the target tokens
        (``World.loss_share``, exactly 1 for full LM windows), which makes the gradient
        and the logged loss those of one process on the whole batch. The auxiliary terms
        are per-batch averages and are averaged as they are.
        """
        share = self.world.loss_share((y != IGNORE_INDEX).sum()).to(ce.dtype)
        if out.ce_loss is None:              # only the total is known: weight all of it
            rest = torch.zeros_like(ce)
        else:                                # the loss beyond the cross-entropy
            rest = aux if out.aux_loss is not None else out.loss - ce
        self._backward(ce * share + rest)             # out.loss's own graph when share = 1
        grad_norm = self._clip_gradients()                        # of the averaged gradients
        extras = out.extras or {}
        local = torch.stack([(ce * share).detach().float(), rest.detach().float(),
                             aux.detach().float(),
                             *(torch.as_tensor(v, device=out.loss.device).detach().float()
                               for v in extras.values())])
        ce_v, rest_v, aux_v, *extra_v = self.world.all_reduce_mean(local).tolist()
        return ce_v + rest_v, ce_v, aux_v, float(grad_norm), extra_v

    def _backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``; with a GradScaler (fp16) of the scaled loss, and the gradients
        unscaled again, so clipping and the logged norm see their true values."""
        if self.scaler is None:
            loss.backward()
            return
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)

    def _overflow_to_skip(self, loss: float, grad_norm: float) -> bool:
        """fp16: a finite loss whose scaled gradients overflowed. The scaler skips the update
        and lowers its scale, so it is no failure, unless MAX_SKIPPED_IN_A_ROW come in a row.
        Counted in ``skipped_steps``; the step still counts (the LR schedule moves on)."""
        overflow = self.scaler is not None and math.isfinite(loss) and not math.isfinite(grad_norm)
        self._skipped_in_a_row = self._skipped_in_a_row + 1 if overflow else 0
        self.skipped_steps += int(overflow)
        return overflow and self._skipped_in_a_row < MAX_SKIPPED_IN_A_ROW

    def _optimizer_step(self) -> None:
        """The AdamW update; with a GradScaler its step (skipped when the gradients hold an
        inf or NaN) and update (the scale halves after a skip, grows after a clean run)."""
        if self.scaler is None:
            self.optimizer.step()
            return
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def _clip_gradients(self) -> torch.Tensor:
        """Global grad norm before clipping; clips to ``cfg.grad_clip`` when it is > 0."""
        if self.cfg.grad_clip > 0:
            return torch.nn.utils.clip_grad_norm_(self._params, self.cfg.grad_clip)
        norms = [torch.linalg.vector_norm(p.grad) for p in self._params if p.grad is not None]
        return torch.linalg.vector_norm(torch.stack(norms))

    def _fail_non_finite(self, loss: float, grad_norm: float, total: int) -> None:
        broken = resume.non_finite_tensors(self.model)
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

    def _after_step(self, total: int, clock: Clock) -> None:
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

    def _run_eval(self, total: int, clock: Clock) -> None:
        rec = {"step": self.step, "total_steps": total, "val_loss": self.evaluate(),
               "elapsed_s": clock.elapsed()}
        self.history.append_eval(rec)
        self._emit("on_eval", rec)

    # --- endings ------------------------------------------------------------------------------
    def _end_finished(self, total: int, clock: Clock) -> None:
        last_eval = self.history.val_step[-1] if self.history.val_step else None
        if self.val_dataset is not None and last_eval != self.step:
            self._run_eval(total, clock)
        failure = self._save_at_end() if self.cfg.checkpoint_dir else None
        self._emit("on_end", self.history)
        if failure:
            raise failure

    def _end_peer_lost(self, err: RuntimeError) -> None:
        """Another process is gone mid-run: rank 0 saves the last whole step alone (no
        collective can run any more), then every survivor raises ``PeerLost``."""
        self.history.interrupted = True
        self.history.stopped_by = "a lost process"
        where = "nothing was saved (no checkpoint_dir)"
        if self.cfg.checkpoint_dir and self.world.is_main:
            path = self.checkpoint_path()
            try:
                if resume.non_finite_tensors(self.model):
                    raise FloatingPointError("its weights are not finite")
                resume.write_checkpoint(path, self._checkpoint_state, self.device,
                                        distributed.SINGLE)
                self._mark_saved(self.step, self.history.to_dict())
                where = (f"rank 0 saved step {self.step} alone to {path} (resume with "
                         "--resume: the other processes' random streams are reseeded, so the "
                         "result is close to an uninterrupted run, not bit for bit)")
            except (OSError, RuntimeError, FloatingPointError) as failure:
                where = f"rank 0 could not save step {self.step} ({failure}); " \
                        f"{resume.last_good(self._saved_step)}"
        elif self.cfg.checkpoint_dir:
            where = "rank 0 saves the last whole step, unless it is the process that was lost"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise distributed.PeerLost(f"rank {self.world.rank}: another process of the run ended "
                                   f"without warning at step {self.step + 1} ({first[:200]}); "
                                   f"{where}") from err

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
            return CheckpointNotSaved(f"{err}; {resume.last_good(self._saved_step)}")
        except (OSError, RuntimeError) as err:
            if not is_disk_full(err):
                raise
            return CheckpointNotSaved(f"the checkpoint of step {self.step} was not written: "
                                      f"{self._disk_full_advice()}; the model and history are "
                                      f"still in memory (save_checkpoint() once there is room, "
                                      f"or rescue_checkpoint()); "
                                      f"{resume.last_good(self._saved_step)}", disk_full=True)
        return None

    def rescue_checkpoint(self) -> Path | None:
        """Save the checkpoint that did not fit into ``checkpoint_dir`` somewhere else, trying
        ``resume.rescue_folders`` in turn (``$BLOCKMEM_RESCUE_DIR``, then the temp and the home
        folder on another filesystem): a folder that fails to take it (no room, read-only,
        missing) passes to the next. The path, or None when every folder failed; why each
        failed is then ``rescue_problem``. Call it on every process, like ``save_checkpoint``."""
        candidates = self.world.on_main(lambda: resume.rescue_folders(
            self.cfg.checkpoint_dir, self.checkpoint_bytes()))
        path, tried = resume.save_into_first(candidates, self._save_into, self.world)
        self.rescue_problem = "" if path else resume.rescue_failed(self.step, tried)
        return path

    def _save_into(self, folder: Path) -> Path:
        self.world.on_main(functools.partial(folder.mkdir, parents=True, exist_ok=True))
        return self.save_checkpoint(folder / CHECKPOINT_NAME)

    def _disk_full_advice(self) -> str:
        return resume.disk_full_advice(self.cfg.checkpoint_dir, self.checkpoint_bytes())

    def _emit(self, event: str, payload) -> None:
        try:
            emit(self.callbacks, self, event, payload)
        except KeyboardInterrupt:
            if not self.world.distributed or event == "on_end":
                raise
            self._stop_code = int(signal.SIGINT)      # every process stops after this step
