"""The Trainer's optimiser and learning-rate schedule, and what they cost in memory.

Both are the learner's loop's (``train.simple``): ``lr_at`` is ``simple.cosine_lr`` with a
TrainConfig's settings, ``make_optimizer`` is ``simple.adamw`` (weight decay on >= 2-D
parameters only) with a model's learning-rate scales added on top.
"""

from __future__ import annotations

import torch

from blockmem_lite.config import TrainConfig, check_backbone_fits
from blockmem_lite.models.base import LanguageModel, build_model
from blockmem_lite.runtime import available_memory_bytes
from blockmem_lite.train.memory import parameter_bytes
from blockmem_lite.train.simple import adamw, cosine_lr
from blockmem_lite.units import human_bytes


def lr_at(step: int, cfg: TrainConfig, total_steps: int | None = None) -> float:
    """Learning rate of (0-based) ``step``: ``simple.cosine_lr`` with ``cfg``'s lr, warmup and
    floor over ``total_steps`` (default ``cfg.steps``)."""
    total = cfg.steps if total_steps is None else total_steps
    return cosine_lr(step, total, cfg.lr, cfg.warmup_steps, cfg.min_lr_ratio)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on >= 2-D parameters (matrices, embeddings) only.

    A model may scale the learning rate of some parameters (e.g. MoC's bank and
    memory layers) with ``LanguageModel.lr_scales() -> {parameter name: factor}``; each group
    keeps its factor as ``lr_scale`` and the schedule multiplies it in.

    The decay split is ``simple.adamw``'s (its groups: no decay, then decay); each of
    its groups is split by scale, and the groups are ordered by (scale, decayed), so a
    model without scales gets exactly ``adamw``'s two groups (empty ones left out).
    """
    split = adamw(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2))   # only its groups
    scales = model.lr_scales() if isinstance(model, LanguageModel) else {}   # a declared hook
    scale_of = {id(p): float(scales.get(name, 1.0)) for name, p in model.named_parameters()}
    groups: dict[tuple[float, int], dict] = {}
    for decayed, group in enumerate(split.param_groups):      # 0: no decay, 1: decay
        for p in group["params"]:
            scale = scale_of[id(p)]
            groups.setdefault((scale, decayed), {
                "params": [], "lr": cfg.lr * scale, "lr_scale": scale,
                "weight_decay": group["weight_decay"]})["params"].append(p)
    return torch.optim.AdamW([groups[key] for key in sorted(groups)],
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def count_parameters(cfg) -> int:
    """Parameters of the model ``cfg`` describes, counted on the meta device (nothing is
    allocated, so it is safe for configs far too large to build)."""
    with torch.device("meta"):
        return build_model(cfg).num_params()


def check_fits_in_memory(cfg, device) -> int:
    """Refuse (ValueError) a model whose weights, gradients and AdamW state alone exceed the
    memory available on ``device``, before it is built (counted on the meta device); returns
    that estimate in bytes. The Trainer then checks the whole run, activations included
    (``train.memory``). Sizes too large to count even on the meta device are refused first,
    from the backbone's size in Python numbers (``config.check_backbone_fits``)."""
    check_backbone_fits(cfg, torch.device(device), copies=4,     # weight, gradient, 2 moments
                        what="weights, gradients and AdamW state")
    with torch.device("meta"):
        model = build_model(cfg)
    params = model.num_params()
    need = sum(parameter_bytes(model))
    available = available_memory_bytes(device)
    if available is not None and need > available:
        raise ValueError(f"this model is too large for this machine: {params / 1e6:,.1f}M "
                         f"parameters need about {human_bytes(need)} for weights, gradients and "
                         f"AdamW state alone, and {human_bytes(available)} is available on "
                         f"{torch.device(device).type}; choose a smaller d_model or n_layer")
    return need
