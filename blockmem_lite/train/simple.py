"""The training loop a learner writes: forward, loss, backward, clip, step.

``train_simple`` is the whole of it, in the style of nanoGPT's and minGPT's loops.
Notebook 01 builds it cell by cell and checks it against this one. ``train.Trainer``
makes the same update (the same AdamW groups, ``cosine_lr`` schedule and clipping; a
test proves their first steps equal on the CPU) and adds what a long run needs around
it: checkpoints and resume, evaluation, progress, signals, autocast on CUDA (bf16, or fp16
with a GradScaler), DDP.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from blockmem_lite.validation import check_float, check_int


def cosine_lr(step: int, steps: int, lr: float, warmup_steps: int = 0,
              min_lr_ratio: float = 0.1) -> float:
    """Learning rate of (0-based) ``step`` of ``steps``: linear warmup to ``lr`` over
    ``warmup_steps``, then cosine decay reaching ``lr * min_lr_ratio`` at the last step;
    constant after that."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    decay_steps = max(1, steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    floor = lr * min_lr_ratio
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def adamw(model: torch.nn.Module, lr: float, weight_decay: float = 0.1,
          betas: tuple[float, float] = (0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings (>= 2-D) only: decaying the
    norms' gains and the biases pulls them to 0, which nothing asks for."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
              {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def train_simple(model: torch.nn.Module, batches: Iterable, steps: int, lr: float, *,
                 warmup_steps: int = 0, min_lr_ratio: float = 0.1, weight_decay: float = 0.1,
                 grad_clip: float = 1.0) -> list[float]:
    """Train ``model`` for ``steps`` optimiser steps on ``batches`` (an iterable of
    (x, y), each (B, T) token ids, y the targets); returns each step's loss."""
    check_int("steps", steps, 1)
    check_float("lr", lr, 0.0, low_inclusive=False)
    check_float("grad_clip", grad_clip, 0.0)
    device = next(model.parameters()).device
    optimizer = adamw(model, lr, weight_decay)
    batches = iter(batches)
    model.train()
    losses = []
    for step in range(steps):
        x, y = _next_batch(batches, step, steps)
        x, y = x.to(device), y.to(device)                                # (B, T) each
        for group in optimizer.param_groups:
            group["lr"] = cosine_lr(step, steps, lr, warmup_steps, min_lr_ratio)
        loss = model(x, y).loss              # forward: mean cross-entropy (+ any aux terms)
        optimizer.zero_grad(set_to_none=True)   # the last step's gradients would add up
        loss.backward()                         # d loss / d every parameter
        if grad_clip > 0:                       # one bad batch must not throw the weights
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(loss.item())
    return losses


def _next_batch(batches, step: int, steps: int):
    try:
        return next(batches)
    except StopIteration:
        raise ValueError(f"batches ran out after {step} batches: steps={steps} needs one "
                         "batch per step (pass more, or an endless generator)") from None
