"""A learner's layer plugged into one of the kit's models: ``swap_modules`` puts it in place of
the kit's layer with the same weights, and ``check_plugged_in`` trains both models side by side
and compares the logits and the loss curves (one ``OK ...`` line, or a ``CheckFailed``, as in
``checks.py``). ``plug`` builds what the learner's piece gives and ``judge_plugged_in`` decides,
so a grader can obtain the first from a student's kernel and decide in its own process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from blockmem_lite.checks import (
    _failure,
    _is_int,
    _not_allowed,
    _require_text,
    _tolerance,
    check_causal,
    check_close,
    check_true,
)


def swap_modules(model: torch.nn.Module, library_cls: type, make_yours: Callable) -> int:
    """Replace every ``library_cls`` module inside ``model`` by ``make_yours(old)``, loading the
    old module's weights into the new one (so both start from the same numbers); returns how
    many were replaced. A weight name or shape the new module lacks is a CheckFailed naming it.
    """
    if not isinstance(library_cls, type):
        raise _not_allowed("library_cls", library_cls, "a torch.nn.Module class of the kit")
    targets = [(name, m) for name, m in model.named_modules() if type(m) is library_cls]
    for name, old in targets:
        new = make_yours(old)
        if not isinstance(new, torch.nn.Module):
            raise _not_allowed("make_yours", new, "a function returning your torch.nn.Module")
        like = next(old.parameters(), None)
        if like is not None:                      # the kit's device and dtype (float64 too)
            new = new.to(device=like.device, dtype=like.dtype)
        _load_same_weights(new, old, name)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    return len(targets)


def _load_same_weights(new: torch.nn.Module, old: torch.nn.Module, where: str) -> None:
    mine, theirs = new.state_dict(), old.state_dict()
    missing = sorted(set(theirs) - set(mine))
    extra = sorted(set(mine) - set(theirs))
    wrong = sorted(k for k in set(mine) & set(theirs) if mine[k].shape != theirs[k].shape)
    if missing or extra or wrong:
        raise _failure(f"your {type(new).__name__} at {where}",
                       "its weights do not match the kit's layer, so they cannot be shared",
                       *([f"missing: {', '.join(missing)}"] if missing else []),
                       *([f"not in the kit's layer: {', '.join(extra)}"] if extra else []),
                       *(f"{k}: shape {tuple(mine[k].shape)}, the kit's is "
                         f"{tuple(theirs[k].shape)}" for k in wrong),
                       "name and shape the parameters as the kit's layer does "
                       f"({type(old).__name__}: {', '.join(list(theirs)[:8])}...)")
    new.load_state_dict(theirs)


def loss_curve(model: torch.nn.Module, batches, lr: float, seed: int) -> list[float]:
    """Train ``model`` on ``batches`` [(tokens, targets)] with AdamW; the loss before each step."""
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    curve = []
    for tokens, targets in batches:
        loss = model(tokens, targets).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        curve.append(float(loss.detach()))
    model.eval()
    return curve


def first_weight_apart(model: torch.nn.Module, kit: torch.nn.Module) -> str | None:
    """The first weight in which ``model`` and ``kit`` differ ("a / b"), None if none."""
    for (key, theirs), (key2, mine) in zip(kit.state_dict().items(), model.state_dict().items(),
                                           strict=False):
        if key != key2 or theirs.shape != mine.shape or not torch.equal(theirs, mine):
            return f"{key!r} / {key2!r}"
    return None


@dataclass(frozen=True)
class Plugged:
    """The learner's piece inside a kit model, as a check sees it: how many places it
    replaced, the first weight not shared with the kit's model (None: all shared), the
    logits for some tokens (eval mode, no gradients), the loss curve of training on batches."""

    replaced: object
    apart: str | None
    logits: Callable[[torch.Tensor], torch.Tensor]
    curve: Callable[[list], list[float]]


def plug(make_model: Callable, plug_in: Callable, lr: float = 3e-3, seed: int = 0) -> Plugged:
    """``plug_in(make_model())`` as a ``Plugged``: each use builds and plugs a fresh model."""
    def fresh() -> torch.nn.Module:
        model = make_model()
        plug_in(model)
        return model.eval()

    def logits(tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return fresh()(tokens).logits

    model = make_model()
    replaced = plug_in(model)
    return Plugged(replaced, first_weight_apart(model, make_model()), logits,
                   lambda batches: loss_curve(fresh(), batches, lr, seed))


def check_plugged_in(make_model: Callable, plug_in: Callable, batches, name: str = "your layer",
                     lr: float = 3e-3, seed: int = 0, atol: float | None = None,
                     curve_rtol: float = 2e-3) -> tuple[list[float], list[float]]:
    """The learner's piece, plugged into a model, does what the kit's does.

    ``make_model()`` builds the kit's model (seeded: two calls give the same weights);
    ``plug_in(model)`` puts the learner's piece into it in place of the kit's and returns how
    many places it replaced (``swap_modules`` does this for a layer class). Then, against a
    second ``make_model()`` with the kit's piece:

    1. the weights are the same (the swap shares them) and the forward on ``batches[0]``'s
       tokens gives the same logits (``atol`` as in ``check_close``);
    2. the model with the learner's piece is causal (``check_causal``);
    3. training both on ``batches`` (AdamW, ``lr``) gives the same early loss curve, to
       ``curve_rtol``, and the loss falls.

    Returns ``(kit_curve, your_curve)`` for a plot.
    """
    lr = _tolerance("lr", lr, positive=True)
    return judge_plugged_in(plug(make_model, plug_in, lr, seed), make_model, batches, name, lr,
                            seed, atol, curve_rtol)


def judge_plugged_in(yours: Plugged, make_model: Callable, batches, name: str = "your layer",
                     lr: float = 3e-3, seed: int = 0, atol: float | None = None,
                     curve_rtol: float = 2e-3) -> tuple[list[float], list[float]]:
    """``check_plugged_in``'s verdict on ``yours``, however it was obtained (in the notebook,
    or from a graded kernel): the kit's side is computed here."""
    _require_text("name", name)
    lr = _tolerance("lr", lr, positive=True)
    curve_rtol = _tolerance("curve_rtol", curve_rtol)
    batches = list(batches)
    if len(batches) < 2:
        raise _not_allowed("batches", batches, "two or more (tokens, targets) pairs")
    if not _is_int(yours.replaced) or yours.replaced < 1:
        raise _failure(name, f"plug_in replaced {yours.replaced!r} pieces of the model",
                       "expected it to put your piece in at least one place (it returns how "
                       "many it replaced)")
    if yours.apart is not None:
        raise _failure(name, "the weights are not shared with the kit's model",
                       f"first difference at {yours.apart}; plug_in must copy the kit's weights "
                       "into your piece (swap_modules does)")
    tokens = batches[0][0]
    kit = make_model().eval()
    with torch.no_grad():
        check_close(yours.logits(tokens), kit(tokens).logits,
                    f"{name}: logits on shared weights vs the kit's", atol=atol)
    check_causal(yours.logits, tokens)
    kit_curve = loss_curve(kit, batches, lr, seed)
    your_curve = [float(x) for x in yours.curve(batches)]
    check_close(your_curve, kit_curve, f"{name}: loss over {len(batches)} training steps vs "
                "the kit's", atol=1e-4, rtol=curve_rtol)
    check_true(your_curve[-1] < your_curve[0],
               f"{name}: the loss falls in training ({your_curve[0]:.3f} -> {your_curve[-1]:.3f})")
    return kit_curve, your_curve
