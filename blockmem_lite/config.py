"""Configuration: model and training dataclasses, presets, and validation.

Every notebook has one visible config cell::

    cfg = notebook_config("class", arch="dense")

which returns the ``fast`` preset instead when the environment variable
``BLOCKMEM_FAST=1`` is set (CI). Invalid values raise a ``ValueError`` that
names the field, the value and what is allowed.

Presets (kit scale, see MECHANISMS.md "Kit decisions"):

========  ===========================  =========================================
preset    size                         meant for
========  ===========================  =========================================
tiny      d=32, 2 layers, T=32         unit tests (milliseconds)
fast      d=32, 2 layers, T=64         CI notebooks (< 1 min each on 2 CPU cores)
class     d=128, 4 layers, T=256       a classroom laptop CPU (a few minutes)
gpu       d=384, 8 layers, T=1024      one GPU (about 15M parameters)
========  ===========================  =========================================
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields

BLOCK_ARCHS = ("bcmt", "honly")      # architectures that use block_size / alpha


def _fail(field_name: str, value, allowed: str) -> None:
    raise ValueError(f"{field_name}={value!r} is not allowed: {allowed}")


def check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(name, value, f"expected an integer >= {minimum}")


def check_float(name: str, value, low: float, high: float | None = None,
                 low_inclusive: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(name, value, "expected a number")
    too_low = value < low if low_inclusive else value <= low
    if too_low or (high is not None and value > high):
        bracket = "[" if low_inclusive else "("
        upper = f"{high}]" if high is not None else "inf)"
        _fail(name, value, f"expected a number in {bracket}{low}, {upper}")


@dataclass
class ModelConfig:
    """Shape of a language model. Mechanism modules add their own fields here.

    The common backbone (kit decision): pre-norm blocks, RMSNorm, RoPE, SwiGLU
    MLP, no biases, untied LM head.
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
    # --- BCMT / HOnly (models/bcmt.py) ---
    block_size: int = 64             # L: tokens per block (the tail is padded)
    alpha: float = 0.8               # decay of the exponential block memory (fixed)
    memory: bool = True              # False = the HOnly ablation (no block memory)
    learn_alpha: bool = False        # exercises only: make alpha a parameter
    # --- CAT (models/cat.py) ---
    chunk_size: int = 16             # C: tokens per compressed chunk (the default knob setting)
    chunk_sizes: tuple = ()          # () = fixed-C model; else the multi-chunk model's sizes
    decoder_width: int = 2           # decoder width = decoder_width * d_model (paper: 2)
    compressor_layers: int = 0       # 0 = max(1, n_layer // 4)
    # --- ARMT (models/armt.py) ---
    backbone: str = "dense"          # arch of the wrapped model when ARMT is built from a config
    segment_size: int = 64           # tokens per segment
    n_mem_tokens: int = 8            # M: memory (write) tokens appended to each segment
    d_mem: int = 16                  # associative key width before DPFP (keep <= d_model / 4)
    normalize_phi: bool = True       # L2-normalised DPFP features (False: the 2024 paper)
    correction: bool = True          # delta rule with the v_bar / gamma correction
    detach_every: int = 0            # truncated BPTT: detach memory every k segments (0 = full)
    grad_checkpoint: bool = False    # recompute each segment in backward (ARMT)
    # --- ARMT and MoC: which layers carry memory (None = the mechanism's default) ---
    memory_layers: tuple | None = None
    # --- MoC (models/moc.py) ---
    n_chapters: int = 17             # chapters in the bank, chapter 0 always read (shared)
    chapter_len: int = 8             # latent tokens per chapter
    top_k: int = 2                   # routed chapters read per routing decision
    routing: str = "block_causal"    # "block_causal" (default, causal) or "sequence" (paper)
    routing_window: int = 32         # R: tokens per routing window (block_causal)
    routed_scale: float = 2.5        # routed_scaling_factor of the chapter weights
    lb_coef: float = 0.01            # load-balance loss coefficient
    z_coef: float = 0.001            # router z-loss coefficient
    freeze_bank: bool = False        # keep the bank fixed (fine-tuning experiments)
    bank_lr_scale: float = 2.0       # bank lr = lr * this (paper: 6e-4 vs 3e-4)
    memory_lr_scale: float = 2.0     # memory-layer lr = lr * this (paper: 6e-4 vs 3e-4)

    def __post_init__(self) -> None:
        for name in ("chunk_sizes", "memory_layers"):        # JSON gives lists back
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def validate(self) -> None:
        from blockmem_lite.models.base import available_archs

        archs = available_archs()
        if self.arch not in archs:
            _fail("arch", self.arch, f"known architectures are {', '.join(archs)}")
        check_int("vocab_size", self.vocab_size, 2)
        check_int("d_model", self.d_model, 2)
        check_int("n_layer", self.n_layer, 1)
        check_int("n_head", self.n_head, 1)
        if self.d_model % self.n_head:
            _fail("n_head", self.n_head,
                  f"must divide d_model={self.d_model} (divisors: "
                  f"{', '.join(str(h) for h in range(1, self.d_model + 1) if self.d_model % h == 0)})")
        if self.head_dim % 2:
            _fail("n_head", self.n_head,
                  f"d_model/n_head={self.head_dim} must be even for RoPE")
        check_int("seq_len", self.seq_len, 1)
        check_float("mlp_ratio", self.mlp_ratio, 0.0, low_inclusive=False)
        check_float("rope_base", self.rope_base, 1.0, low_inclusive=False)
        check_float("norm_eps", self.norm_eps, 0.0, low_inclusive=False)
        check_float("dropout", self.dropout, 0.0, 1.0)
        check_float("init_std", self.init_std, 0.0, low_inclusive=False)
        if self.arch in BLOCK_ARCHS:
            check_int("block_size", self.block_size, 1)
            if self.block_size > self.seq_len:
                _fail("block_size", self.block_size,
                      f"must be between 1 and seq_len={self.seq_len} (the context)")
            check_float("alpha", self.alpha, 0.0, 1.0)
        if self.arch == "cat":
            self._validate_cat()
        if self.arch == "armt":
            self._validate_armt()
        if self.arch == "moc":
            self._validate_moc()

    # Each mechanism validates its own fields (the module owning them documents them).
    def _validate_cat(self) -> None:
        from blockmem_lite.models.cat import validate_config

        validate_config(self)

    def _validate_armt(self) -> None:
        from blockmem_lite.models.armt import validate_config

        validate_config(self)

    def _validate_moc(self) -> None:
        from blockmem_lite.models.moc import validate_config

        validate_config(self)


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
    precision: str = "auto"          # auto = bf16 autocast on CUDA, fp32 elsewhere
    num_workers: int = 0             # DataLoader workers; 0 keeps 2-core machines responsive
    val_fraction: float = 0.1
    corpus: str = "offline"          # see corpora.load_corpus

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_int("steps", self.steps, 1)
        check_int("batch_size", self.batch_size, 1)
        check_float("lr", self.lr, 0.0, low_inclusive=False)
        check_float("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_float("weight_decay", self.weight_decay, 0.0)
        check_float("beta1", self.beta1, 0.0, 1.0)
        check_float("beta2", self.beta2, 0.0, 1.0)
        check_float("grad_clip", self.grad_clip, 0.0)
        check_int("eval_every", self.eval_every, 1)
        check_int("eval_batches", self.eval_batches, 1)
        check_int("log_every", self.log_every, 1)
        check_int("checkpoint_every", self.checkpoint_every, 0)
        check_int("seed", self.seed, 0)
        if self.device not in ("auto", "cpu", "cuda", "mps") and not self.device.startswith("cuda:"):
            _fail("device", self.device, "expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
        if self.precision not in ("auto", "fp32", "bf16"):
            _fail("precision", self.precision, "expected 'auto', 'fp32' or 'bf16'")
        check_int("num_workers", self.num_workers, 0)
        check_float("val_fraction", self.val_fraction, 0.0, 0.5, low_inclusive=False)


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
        """A copy with fields of ``model`` or ``train`` replaced (validated)."""
        model_names = {f.name for f in fields(ModelConfig)}
        train_names = {f.name for f in fields(TrainConfig)}
        model_kw, train_kw = {}, {}
        for key, value in overrides.items():
            if key in model_names:
                model_kw[key] = value
            elif key in train_names:
                train_kw[key] = value
            else:
                _fail(key, value,
                      "unknown field; ModelConfig has " + ", ".join(sorted(model_names))
                      + "; TrainConfig has " + ", ".join(sorted(train_names)))
        return RunConfig(
            model=dataclasses.replace(self.model, **model_kw),
            train=dataclasses.replace(self.train, **train_kw),
            preset=self.preset,
        )

    def to_dict(self) -> dict:
        return {"preset": self.preset, "model": dataclasses.asdict(self.model),
                "train": dataclasses.asdict(self.train)}

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        return cls(model=ModelConfig(**d["model"]), train=TrainConfig(**d["train"]),
                   preset=d.get("preset", "custom"))


# preset name -> (ModelConfig fields, TrainConfig fields). Mechanism sizes follow MECHANISMS.md
# "Kit scale": BCMT block, ARMT segment, MoC bank (chapters x tokens, top-k) per preset.
_PRESETS = {
    "tiny": (dict(d_model=32, n_layer=2, n_head=2, seq_len=32, block_size=8, segment_size=8,
                  routing_window=8),
             dict(steps=20, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=10,
                  eval_batches=2, log_every=5)),
    "fast": (dict(d_model=32, n_layer=2, n_head=2, seq_len=64, block_size=16, segment_size=16,
                  routing_window=16),
             dict(steps=60, batch_size=8, lr=5e-3, warmup_steps=5, eval_every=20,
                  eval_batches=2, log_every=10)),
    "class": (dict(d_model=128, n_layer=4, n_head=4, seq_len=256, block_size=64,
                   segment_size=64, n_chapters=257, chapter_len=16, top_k=8),
              dict(steps=600, batch_size=16, lr=3e-3, warmup_steps=30, eval_every=100,
                   eval_batches=8, log_every=10)),
    "gpu": (dict(d_model=384, n_layer=8, n_head=6, seq_len=1024, block_size=128,
                 segment_size=256, n_chapters=4097, chapter_len=64, top_k=64,
                 routing_window=128),
            dict(steps=5000, batch_size=32, lr=1e-3, warmup_steps=200, eval_every=250,
                 eval_batches=20, log_every=25, corpus="wikitext-103")),
}
PRESET_NAMES = tuple(_PRESETS)


def preset(name: str, **overrides) -> RunConfig:
    """The named preset (tiny, fast, class, gpu), with optional field overrides."""
    if name not in _PRESETS:
        _fail("preset", name, f"expected one of {', '.join(PRESET_NAMES)}")
    model_kw, train_kw = _PRESETS[name]
    cfg = RunConfig(model=ModelConfig(**model_kw), train=TrainConfig(**train_kw), preset=name)
    return cfg.replace(**overrides) if overrides else cfg


def fast_mode() -> bool:
    """True when ``BLOCKMEM_FAST`` is set to 1/true/yes (CI and quick runs)."""
    return os.environ.get("BLOCKMEM_FAST", "").strip().lower() in ("1", "true", "yes", "on")


def notebook_config(preset_name: str = "class", *, fast: dict | None = None,
                    **overrides) -> RunConfig:
    """The config a notebook uses: ``preset_name``, or ``fast`` when BLOCKMEM_FAST=1.

    ``overrides`` apply in both modes (e.g. ``arch="bcmt"``); ``fast`` holds extra
    overrides applied only in fast mode, after ``overrides`` (e.g. fewer steps).
    """
    if fast_mode():
        cfg = preset("fast", **overrides)
        return cfg.replace(**fast) if fast else cfg
    return preset(preset_name, **overrides)
