"""Training: the Trainer every notebook, benchmark and CLI run goes through.

The package, one job per module (read ``loop`` first):

* ``simple``: ``train_simple``, the loop a learner writes (notebook 01), and its
  ``cosine_lr`` schedule and ``adamw`` groups, which the Trainer uses too;
* ``loop``: the ``Trainer`` (its fit / step loop and public methods);
* ``optim``: ``make_optimizer`` and ``lr_at`` (``simple``'s, with a model's lr scales
  and a TrainConfig), and the memory a model's training needs (``check_fits_in_memory``);
* ``memory``: that memory estimated before a run starts (weights, gradients, AdamW's
  state, the activations of two dry runs) and the check that it fits;
* ``data``: the batch stream a checkpoint can resume, ``evaluate`` and ``loss_by_position``;
* ``resume``: checkpoints, resuming and RNG states, ``load_model``;
* ``stopping``: the stop button (SIGINT, SIGTERM, SIGHUP) and the run's clock;
* ``callbacks``: ``History``, ``Callback`` and the default progress printer;
* ``curriculum``: ``train_curriculum``, stages of growing data (ARMT's 2 -> 4 -> 8
  segments).

What torchrun needs (process group, DDP, the collectives, each process's rows) is
``blockmem_lite.distributed``. The command line is ``tools/train_command.py``.
"""

from blockmem_lite.train.callbacks import EVAL_KEYS, STEP_KEYS, Callback, History
from blockmem_lite.train.curriculum import train_curriculum
from blockmem_lite.train.data import evaluate, loss_by_position
from blockmem_lite.train.loop import Trainer
from blockmem_lite.train.optim import check_fits_in_memory, lr_at, make_optimizer
from blockmem_lite.train.resume import CheckpointNotSaved, load_model

__all__ = [
    "EVAL_KEYS",
    "STEP_KEYS",
    "Callback",
    "CheckpointNotSaved",
    "History",
    "Trainer",
    "check_fits_in_memory",
    "evaluate",
    "load_model",
    "loss_by_position",
    "lr_at",
    "make_optimizer",
    "train_curriculum",
]
