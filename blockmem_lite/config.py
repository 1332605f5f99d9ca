"""Configuration: model and training dataclasses, presets, and validation.

Every notebook has one visible config cell::

    cfg = notebook_config("class", arch="dense")

which returns the ``fast`` preset instead when the environment variable
``BLOCKMEM_FAST=1`` is set (CI). Invalid values raise a ``ValueError`` that
names the field, the value and what is allowed.

``ModelConfig`` holds what every model has; each mechanism declares its own
fields, their validation and their sizes per preset in its module (see
``registry.Mechanism``), so this module names no mechanism.

Presets (kit scale; docs/PAPERS.md, Notation and the shared backbone):

========  ===========================  =========================================
preset    size                         meant for
========  ===========================  =========================================
tiny      d=32, 2 layers, T=32         unit tests (milliseconds)
fast      d=32, 2 layers, T=64         CI notebooks (< 1 min each on 2 CPU cores)
class     d=128, 4 layers, T=256       a classroom laptop CPU (a few minutes)
gpu       d=384, 8 layers, T=1024,     one GPU: a free Colab T4 (15 GiB) holds
          batch 16                     every mechanism, a 6-8 GiB laptop GPU
                                       dense, HOnly, BCMT and ARMT
========  ===========================  =========================================

The ``gpu`` preset per mechanism (parameters; training memory at batch 16 under bf16 or
fp16 autocast, as ``train.memory`` finds it with CPU autocast standing in):

======  =======  ========  ==============================================================
arch    params   memory    why
======  =======  ========  ==============================================================
dense   14.4M    2.9 GiB   the backbone (HOnly the same)
armt    15.6M    3.4 GiB   + the associative memory of every layer
bcmt    17.9M    3.4 GiB   + the memory gates of every layer
cat     65.4M    7.3 GiB   the decoder at twice the width (the paper's default, a kit
                           decision): 4x the parameters per layer; + compressor and W_f
moc     119.4M   10 GiB    100.7M of it the paper's bank (4097 chapters x 64 tokens, a
                           kit decision), a table read 65 chapters at a time; each
                           window of 128 tokens reads 4160 bank tokens
======  =======  ========  ==============================================================

Before the first step the Trainer checks the estimate against the card's free memory
(``TrainConfig.check_memory``) and names the largest batch that fits; the precision is
bf16 on cards with fast bf16 (Ampere and later), else fp16 with a GradScaler
(``runtime.resolve_precision``). Its corpus is the offline one like every preset's (about
0.4M byte tokens, so 5,000 steps see it about 200 times: expect the validation loss to
turn up); ``corpus="wikitext-103"`` asks for WikiText, downloaded once.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields

from blockmem_lite import registry
from blockmem_lite.measure.flops import training_flops_per_token
from blockmem_lite.registry import PRESET_NAMES, Options
from blockmem_lite.runtime import (
    PRECISIONS,
    available_memory_bytes,
    matmul_flops_per_second,
    pick_device,
)
from blockmem_lite.units import human_bytes
from blockmem_lite.validation import (
    check_bool,
    check_choice,
    check_device,
    check_float,
    check_int,
    fail,
)


@dataclass(init=False, repr=False)
class ModelConfig:
    """Shape of a language model: the fields every model has, plus its mechanism's options.

    The common backbone (kit decision): pre-norm blocks, RMSNorm, RoPE, SwiGLU
    MLP, no biases, untied LM head. Everything else belongs to the mechanism
    named by ``arch`` and is declared in its module (an ``Options`` dataclass).
    ``ModelConfig(arch="bcmt", block_size=32)`` is an instance of ``BCMTConfig``, a
    subclass whose dataclass fields are the shared ones plus BCMT's options, so
    ``dataclasses.fields(cfg)``, ``cfg.block_size`` and tab completion show them; they
    are given flat: ``dataclasses.replace(cfg, block_size=16)``, ``--set block_size=16``.
    Changing ``arch`` keeps the options both mechanisms share by name (bcmt -> honly
    keeps ``block_size``) and drops the others.
    """

    arch: str = "dense"
    vocab_size: int = 256            # byte-level tokenizer by default
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    seq_len: int = 256               # training context length T
    mlp_ratio: float = 8 / 3         # SwiGLU hidden = round_up(mlp_ratio * d, 8)
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0
    init_std: float = 0.02

    def __new__(cls, arch: str = "dense", **values):
        target = config_class(arch)
        config = object.__new__(target)
        if not isinstance(config, cls):       # dataclasses.replace(cfg, arch=other): Python
            config.__init__(arch, **_keep_shared(cls, target, values))  # skips __init__ then
        return config

    def __init__(self, arch: str = "dense", **values):
        option_names = registry.get(arch).options.field_names()
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        for name in values:
            if name not in SHARED_FIELDS and name not in option_names:
                fail(name, values[name], unknown_field_help(name, arch))
        defaults = {f.name: (f.default if f.default is not dataclasses.MISSING
                             else f.default_factory()) for f in fields(type(self))}
        object.__setattr__(self, "arch", arch)
        for name in (*SHARED_FIELDS, *option_names):
            object.__setattr__(self, name, values.get(name, defaults[name]))
        self.validate()

    def __getattr__(self, name: str):       # only for names it does not have: a clear error
        raise AttributeError(f"ModelConfig of arch={self.__dict__.get('arch')!r} has no field "
                             f"{name!r}" + _owners_hint(name))

    def __reduce__(self):                   # the subclass is made at run time: pickle by value
        return (ModelConfig.from_dict, (self.to_dict(),))

    def __repr__(self) -> str:
        return f"ModelConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def option_names(self) -> tuple[str, ...]:
        """The fields of this config's mechanism (``cfg.options``)."""
        return registry.get(self.arch).options.field_names()

    @property
    def options(self) -> Options:
        """This config's mechanism options as their own ``Options`` dataclass (a copy)."""
        return registry.get(self.arch).options(**{n: getattr(self, n) for n in self.option_names})

    def to_dict(self) -> dict:
        """One flat dict: the shared fields, then the mechanism's options (JSON-ready)."""
        return {name: getattr(self, name) for name in ("arch", *SHARED_FIELDS, *self.option_names)}

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """Inverse of ``to_dict``; also reads the flat dicts of earlier releases, which held
        every mechanism's fields (the ones of other mechanisms are dropped), and nested ones
        (``options``: {...})."""
        d = dict(d)
        nested = d.pop("options", None) or {}
        arch = d.pop("arch", "dense")
        own = registry.get(arch).options.field_names()
        foreign = {n for m in registry.mechanisms() for n in m.options.field_names()} - set(own)
        values = {k: v for k, v in {**d, **nested}.items() if k not in foreign}
        return ModelConfig(arch, **values)

    def validate(self) -> None:
        check_int("vocab_size", self.vocab_size, 2)
        check_int("d_model", self.d_model, 2)
        check_int("n_layer", self.n_layer, 1)
        check_int("n_head", self.n_head, 1)
        if self.d_model % self.n_head:
            fail("n_head", self.n_head, f"must divide d_model={self.d_model} (divisors: "
                                        f"{', '.join(map(str, divisors(self.d_model)))})")
        if self.head_dim % 2:
            fail("n_head", self.n_head, f"d_model/n_head={self.head_dim} must be even for RoPE")
        check_int("seq_len", self.seq_len, 1)
        check_float("mlp_ratio", self.mlp_ratio, 0.0, low_inclusive=False)
        check_float("rope_base", self.rope_base, 1.0, low_inclusive=False)
        check_float("norm_eps", self.norm_eps, 0.0, low_inclusive=False)
        check_float("dropout", self.dropout, 0.0, 1.0)
        check_float("init_std", self.init_std, 0.0, low_inclusive=False)
        self.options.validate(self)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` >= 1, ascending (in about sqrt(n) steps: d_model may be huge)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def backbone_parameters(cfg: ModelConfig) -> int:
    """Parameters of the shared backbone of ``cfg``'s sizes, counted in Python ints: embedding
    and head (V x d each), then per layer attention (4 d^2), the SwiGLU MLP (3 d x hidden) and
    two norms, and the final norm. Every built-in mechanism adds to it; unlike a count of the
    built model (even on the meta device) it works for sizes no machine holds."""
    d = cfg.d_model
    hidden = 8 * math.ceil(cfg.mlp_ratio * d / 8)             # nn.MLP's width
    per_layer = 4 * d * d + 3 * d * hidden + 2 * d
    return 2 * cfg.vocab_size * d + cfg.n_layer * per_layer + d


FP32_BYTES = 4


def check_backbone_fits(cfg: ModelConfig, device, copies: int, what: str,
                        name: str = "d_model") -> None:
    """Refuse (ValueError naming ``name``, d_model as the user gave it) sizes whose backbone
    alone needs more than the memory available on ``device`` (a torch.device) for ``copies``
    fp32 values per parameter (``what`` they are): a check in Python numbers, before anything
    is built."""
    params = backbone_parameters(cfg)
    need = params * copies * FP32_BYTES
    available = available_memory_bytes(device)
    if available is not None and need > available:
        fail(name, cfg.d_model,
             f"this model is too large for this machine: {params:.3g} parameters need about "
             f"{human_bytes(need)} for {what} in its backbone alone ({cfg.n_layer} layers), "
             f"and {human_bytes(available)} is available on {device.type}; choose a smaller "
             "one or fewer layers")


SHARED_FIELDS = {f.name: f.default for f in fields(ModelConfig) if f.name != "arch"}
_CONFIG_CLASSES: dict[tuple[str, type], type] = {}


def config_class(arch: str) -> type:
    """The ModelConfig subclass of ``arch``: the shared fields plus its options as dataclass
    fields (``BCMTConfig``), made once per (arch, Options class)."""
    options = registry.get(arch).options
    key = (arch, options)
    if key not in _CONFIG_CLASSES:
        own = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                  metadata=f.metadata))
               for f in fields(options)]
        name = options.__name__.removesuffix("Options") or arch.capitalize()
        _CONFIG_CLASSES[key] = dataclasses.make_dataclass(
            f"{name}Config", own,
            bases=(ModelConfig,), init=False, repr=False, namespace={"__module__": __name__})
    return _CONFIG_CLASSES[key]


def _keep_shared(previous, target, values: dict) -> dict:
    """``values`` without the options of ``previous`` (a config class) that ``target``
    lacks: what ``dataclasses.replace(cfg, arch=other)`` passes along."""
    if previous is ModelConfig or previous is target:
        return values
    mine = {f.name for f in fields(previous)} - {f.name for f in fields(target)}
    return {k: v for k, v in values.items() if k not in mine}


def _owners_hint(name: str) -> str:
    owners = registry.option_owners(name)
    return f" (an option of {', '.join(owners)})" if owners else ""


def unknown_field_help(name: str, arch: str, train_fields=()) -> str:
    """What to say about a field ``arch`` does not have: whose option it is, what exists."""
    owners = registry.option_owners(name)
    own = registry.get(arch).options.field_names()
    if owners:
        return (f"an option of {', '.join(owners)}, not of arch={arch!r} (set arch as well, "
                f"e.g. arch={owners[0]!r})")
    listing = f"unknown field; shared fields are {', '.join(SHARED_FIELDS)}; {arch} options are " \
              f"{', '.join(own) or 'none'}"
    if train_fields:
        listing += f"; TrainConfig has {', '.join(sorted(train_fields))}"
    return listing


# the corpora ``corpora.load_corpus`` reads (named here, below it, so a config can check one)
CORPUS_NAMES = ("offline", "pydoc", "longrange", "wikitext-2", "wikitext-103", "files")
MAX_LR = 1.0        # AdamW moves each weight by about lr per step: more is never a schedule


@dataclass
class TrainConfig:
    """How to train: optimiser, schedule, evaluation, checkpoints, device."""

    steps: int = 600
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1        # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0           # 0 disables clipping
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 10
    checkpoint_every: int = 0        # 0: only at the end / on interrupt
    checkpoint_dir: str | None = None
    seed: int = 0
    device: str = "auto"             # auto = cuda > mps > cpu
    precision: str = "auto"          # auto = CUDA: bf16 autocast from compute capability 8.0
    #                                  (Ampere), fp16 + GradScaler before; fp32 elsewhere
    num_workers: int = 0             # DataLoader workers; 0 keeps 2-core machines responsive
    val_fraction: float = 0.1
    corpus: str = "offline"          # see corpora.load_corpus
    tokenizer: str = "bytes"         # "bytes" or a Hugging Face tokenizer in the local cache
    compile: bool = False            # torch.compile the model's forward/backward (compiling.py)
    check_memory: bool = True        # estimate the run's memory first; refuse what won't fit

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_int("steps", self.steps, 1)
        check_int("batch_size", self.batch_size, 1)
        check_float("lr", self.lr, 0.0, MAX_LR, low_inclusive=False)
        check_float("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_float("weight_decay", self.weight_decay, 0.0)
        if self.lr * self.weight_decay >= 1:                 # AdamW: w -= lr * wd * w per step
            fail("weight_decay", self.weight_decay,
                 f"expected lr * weight_decay < 1, so below {1 / self.lr:.4g} with "
                 f"lr={self.lr:g} (AdamW shrinks every weight by lr * weight_decay each step)")
        check_float("beta1", self.beta1, 0.0, 1.0)
        check_float("beta2", self.beta2, 0.0, 1.0)
        check_float("grad_clip", self.grad_clip, 0.0)
        check_int("eval_every", self.eval_every, 1)
        check_int("eval_batches", self.eval_batches, 1)
        check_int("log_every", self.log_every, 1)
        check_int("checkpoint_every", self.checkpoint_every, 0)
        check_int("seed", self.seed, 0)
        check_device("device", self.device)
        if self.precision not in PRECISIONS:
            fail("precision", self.precision, f"expected one of {', '.join(map(repr, PRECISIONS))}")
        check_int("num_workers", self.num_workers, 0)
        check_choice("corpus", self.corpus, CORPUS_NAMES)
        check_bool("compile", self.compile)
        check_bool("check_memory", self.check_memory)
        check_float("val_fraction", self.val_fraction, 0.0, 0.5, low_inclusive=False)
        if not isinstance(self.tokenizer, str) or not self.tokenizer:
            fail("tokenizer", self.tokenizer, "expected 'bytes' or the name of a Hugging Face "
                                              "tokenizer in the local cache")


@dataclass
class RunConfig:
    """A model config, a training config, and where they came from."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    preset: str = "class"

    @property
    def fast(self) -> bool:
        return self.preset in ("tiny", "fast")

    def replace(self, **overrides) -> RunConfig:
        """A copy with fields of ``model`` or ``train`` replaced (validated).

        A new ``arch`` starts from that mechanism's sizes for this preset.
        """
        train_names = {f.name for f in fields(TrainConfig)}
        train_kw = {k: v for k, v in overrides.items() if k in train_names}
        model_kw = {k: v for k, v in overrides.items() if k not in train_names}
        arch = model_kw.pop("arch", self.model.arch)
        mechanism = registry.get(arch)
        for key, value in model_kw.items():
            if key not in SHARED_FIELDS and key not in mechanism.options.field_names():
                fail(key, value, unknown_field_help(key, arch, train_names))
        if arch != self.model.arch:
            model_kw = {**registry.preset_values(arch, self.preset), **model_kw}
        return RunConfig(
            model=dataclasses.replace(self.model, arch=arch, **model_kw),
            train=dataclasses.replace(self.train, **train_kw),
            preset=self.preset,
        )

    def to_dict(self) -> dict:
        return {"preset": self.preset, "model": self.model.to_dict(),
                "train": dataclasses.asdict(self.train)}

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        return cls(model=ModelConfig.from_dict(d["model"]), train=TrainConfig(**d["train"]),
                   preset=d.get("preset", "custom"))


# preset name -> (shared ModelConfig fields, TrainConfig fields). Each mechanism sizes its own
# options per preset (their knobs' ``presets``: BCMT blocks, ARMT segments, MoC banks...).
_PRESETS = {
    "tiny": (dict(d_model=32, n_layer=2, n_head=2, seq_len=32),
             dict(steps=20, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=10,
                  eval_batches=2, log_every=5)),
    "fast": (dict(d_model=32, n_layer=2, n_head=2, seq_len=64),
             dict(steps=60, batch_size=8, lr=5e-3, warmup_steps=5, eval_every=20,
                  eval_batches=2, log_every=10)),
    "class": (dict(d_model=128, n_layer=4, n_head=4, seq_len=256),
              dict(steps=600, batch_size=16, lr=3e-3, warmup_steps=30, eval_every=100,
                   eval_batches=8, log_every=10)),
    "gpu": (dict(d_model=384, n_layer=8, n_head=6, seq_len=1024),
            dict(steps=5000, batch_size=16, lr=1e-3, warmup_steps=200, eval_every=250,
                 eval_batches=20, log_every=25)),
}
assert tuple(_PRESETS) == PRESET_NAMES


def preset(name: str, **overrides) -> RunConfig:
    """The named preset (tiny, fast, class, gpu), with optional field overrides.

    ``arch`` picks the mechanism, whose own sizes for this preset apply before
    the overrides.
    """
    if name not in _PRESETS:
        fail("preset", name, f"expected one of {', '.join(PRESET_NAMES)}")
    model_kw, train_kw = _PRESETS[name]
    arch = overrides.pop("arch", registry.BASELINE)
    sizes = registry.preset_values(arch, name)
    cfg = RunConfig(model=ModelConfig(arch, **model_kw, **sizes), train=TrainConfig(**train_kw),
                    preset=name)
    return cfg.replace(**overrides) if overrides else cfg


def fast_mode() -> bool:
    """True when ``BLOCKMEM_FAST`` is set to 1/true/yes (CI and quick runs)."""
    return os.environ.get("BLOCKMEM_FAST", "").strip().lower() in ("1", "true", "yes", "on")


SEED_ENV = "BLOCKMEM_SEED"
_last_notebook_preset: str | None = None


def last_notebook_preset() -> str | None:
    """The preset ``notebook_config`` last returned (None before its first call)."""
    return _last_notebook_preset


def _seed_override() -> dict:
    """``{"seed": N}`` when BLOCKMEM_SEED=N is set (``expected remake`` runs each seed so)."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return {}
    if not raw.isdigit():
        fail(SEED_ENV, raw, "expected a whole number of 0 or more")
    return {"seed": int(raw)}


def notebook_config(preset_name: str = "class", *, fast: dict | None = None,
                    **overrides) -> RunConfig:
    """The config a notebook uses: ``preset_name``, or ``fast`` when BLOCKMEM_FAST=1.

    ``overrides`` apply in both modes (e.g. ``arch="bcmt"``); ``fast`` holds extra
    overrides applied only in fast mode, after ``overrides`` (e.g. fewer steps). A seed in
    BLOCKMEM_SEED comes first, so an explicit ``seed=`` override wins.
    """
    global _last_notebook_preset
    overrides = {**_seed_override(), **overrides}
    if fast_mode():
        _last_notebook_preset = "fast"
        cfg = preset("fast", **overrides)
        return cfg.replace(**fast) if fast else cfg
    _last_notebook_preset = preset_name
    cfg = preset(preset_name, **overrides)
    note = gpu_preset_on_cpu(cfg)
    if note:
        print(note)
    return cfg


# A training step on a 2-core CPU runs at about half (dense, BCMT) to all (CAT, MoC) of a
# bare matmul's rate at the class preset: the estimate gives the time at both ends.
CPU_STEP_EFFICIENCY = (0.5, 1.0)
GPU_SIZED_PRESETS = ("gpu",)


def gpu_preset_on_cpu(cfg: RunConfig, rate: float | None = None) -> str:
    """What a notebook says when a preset sized for a GPU meets a CPU: about how long its
    training takes here (its FLOPs at ``rate``, this CPU's matmul rate by default) and how
    to switch; "" for any other preset or device."""
    if cfg.preset not in GPU_SIZED_PRESETS or pick_device(cfg.train.device).type != "cpu":
        return ""
    rate = matmul_flops_per_second() if rate is None else rate
    mechanism = registry.get(cfg.model.arch)
    if mechanism.flops is None:
        return ""
    tokens = cfg.train.steps * cfg.train.batch_size * cfg.model.seq_len
    total = training_flops_per_token(mechanism.flops(cfg.model, cfg.model.seq_len, False)) * tokens
    fastest, slowest = (total / (rate * share) for share in reversed(CPU_STEP_EFFICIENCY))
    return (f"preset {cfg.preset!r} on a CPU: its {cfg.train.steps} training steps would take "
            f"about {_hours_or_minutes(fastest)} to {_hours_or_minutes(slowest)} here. It is sized for "
            "a GPU: in Colab, Runtime > Change runtime type > GPU, then run the notebook again; "
            "or use notebook_config(\"class\", ...), sized for this CPU (minutes).")


def _hours_or_minutes(seconds: float) -> str:
    return f"{seconds / 3600:.0f} hours" if seconds >= 5400 else f"{seconds / 60:.0f} minutes"
