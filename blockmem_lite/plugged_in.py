"""A learner's layer plugged into one of the kit's models: ``swap_modules`` puts it in place of
the kit's layer with the same weights, and ``check_plugged_in`` trains both models side by side
and compares causality, the logits and the loss curves (one ``OK ...`` line, or a
``CheckFailed``, as in ``checks.py``). ``plug`` builds what the learner's piece gives and
``judge_plugged_in`` decides, so a grader can obtain the first from a student's kernel and
decide in its own process.

A failure says what kind of bug it is: a leak (the first position, and its segment or window,
that sees a later token), the first position whose logits differ, or a loss curve that parts
after equal logits (the gradients). With a ``Probe`` (the values the model computes inside, as
``Part``s) it also names the first part of the learner's piece that differs from the kit's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from blockmem_lite.checks import (
    CheckFailed,
    _is_int,
    _perturb_after,
    _tolerance,
    _tolerances,
    check_causal,
    check_close,
    check_true,
    failure,
    not_allowed,
    require_text,
)


def swap_modules(model: torch.nn.Module, library_cls: type, make_yours: Callable) -> int:
    """Replace every ``library_cls`` module inside ``model`` by ``make_yours(old)``, loading the
    old module's weights into the new one (so both start from the same numbers); returns how
    many were replaced. A weight name or shape the new module lacks is a CheckFailed naming it.
    """
    if not isinstance(library_cls, type):
        raise not_allowed("library_cls", library_cls, "a torch.nn.Module class of the kit")
    targets = [(name, m) for name, m in model.named_modules() if type(m) is library_cls]
    for name, old in targets:
        new = make_yours(old)
        if not isinstance(new, torch.nn.Module):
            raise not_allowed("make_yours", new, "a function returning your torch.nn.Module")
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
        raise failure(f"your {type(new).__name__} at {where}",
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


LEAK_ATOL = 1e-5              # a part "moved" when a later token changed (check_causal's atol)
PART_RTOL = 1e-4              # parts compared to this share of their largest entry: rounding
                              # apart, a bug differs by far more


@dataclass(frozen=True)
class Part:
    """One value a ``Probe`` records inside a forward pass, in the order the model computes.

    ``label`` names it in a message ("segment 1, layer 0: the read"); ``kind`` tells the
    probe's ``explain`` which part of the learner's piece made it; ``value`` is (B, N, ...);
    ``uses`` (N entries): for each entry along dim 1, the first output position that reads it;
    ``unit``: what an entry is, "position" or "window" ("" for a value used as a whole)."""

    label: str
    kind: str
    value: torch.Tensor
    uses: tuple[int, ...]
    unit: str = "position"

    def entry(self, n: int) -> str:
        """Where entry ``n`` is, for a message: " at position 9", ", window 1" or ""."""
        if self.unit == "position":
            return f" at position {self.uses[n]}"
        return f", {self.unit} {n}" if self.unit else ""


@dataclass(frozen=True)
class Probe:
    """How a check looks inside a model to say where a plugged-in piece goes wrong.

    ``where(position)``: the segment or window of a token position ("segment 1");
    ``parts(model, tokens)``: the model's ``Part`` list (run in eval mode, no gradients);
    ``explain(part, n, yours, kit)``: what a first difference at entry ``n`` of ``part``
    points to, one sentence; ``training``: what a loss curve parting after equal logits
    suggests for this piece."""

    where: Callable[[int], str]
    parts: Callable | None = None
    explain: Callable | None = None
    training: str = ""

    def recorded(self, model: torch.nn.Module, tokens: torch.Tensor) -> list[Part]:
        """``parts(model, tokens)`` in eval mode, without gradients."""
        with torch.no_grad():
            return list(self.parts(model.eval(), tokens))


@dataclass(frozen=True)
class Plugged:
    """The learner's piece inside a kit model, as a check sees it: how many places it
    replaced, the first weight not shared with the kit's model (None: all shared), the
    logits for some tokens (eval mode, no gradients), the loss curve of training on batches,
    and (with a probe) the values of the probe's parts for some tokens."""

    replaced: object
    apart: str | None
    logits: Callable[[torch.Tensor], torch.Tensor]
    curve: Callable[[list], list[float]]
    parts: Callable[[torch.Tensor], list] | None = None


def plug(make_model: Callable, plug_in: Callable, lr: float = 3e-3, seed: int = 0,
         probe: Probe | None = None) -> Plugged:
    """``plug_in(make_model())`` as a ``Plugged``: each use builds and plugs a fresh model."""
    def fresh() -> torch.nn.Module:
        model = make_model()
        plug_in(model)
        return model.eval()

    def logits(tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return fresh()(tokens).logits

    def parts(tokens: torch.Tensor) -> list[torch.Tensor]:
        return [part.value for part in probe.recorded(fresh(), tokens)]

    model = make_model()
    replaced = plug_in(model)
    return Plugged(replaced, first_weight_apart(model, make_model()), logits,
                   lambda batches: loss_curve(fresh(), batches, lr, seed),
                   parts if probe is not None and probe.parts is not None else None)


def check_plugged_in(make_model: Callable, plug_in: Callable, batches, name: str = "your layer",
                     lr: float = 3e-3, seed: int = 0, atol: float | None = None,
                     curve_rtol: float = 2e-3, probe: Probe | None = None
                     ) -> tuple[list[float], list[float]]:
    """The learner's piece, plugged into a model, does what the kit's does.

    ``make_model()`` builds the kit's model (seeded: two calls give the same weights);
    ``plug_in(model)`` puts the learner's piece into it in place of the kit's and returns how
    many places it replaced (``swap_modules`` does this for a layer class). Then, against a
    second ``make_model()`` with the kit's piece:

    1. the weights are the same (the swap shares them);
    2. the model with the learner's piece is causal (``check_causal``), on ``batches[0]``'s
       tokens;
    3. the forward on those tokens gives the same logits (``atol`` as in ``check_close``);
    4. training both on ``batches`` (AdamW, ``lr``) gives the same early loss curve, to
       ``curve_rtol``, and the loss falls.

    ``probe`` (optional) lets a failure name the first part inside that differs. Returns
    ``(kit_curve, your_curve)`` for a plot.
    """
    lr = _tolerance("lr", lr, positive=True)
    return judge_plugged_in(plug(make_model, plug_in, lr, seed, probe), make_model, batches,
                            name, lr, seed, atol, curve_rtol, probe)


def judge_plugged_in(yours: Plugged, make_model: Callable, batches, name: str = "your layer",
                     lr: float = 3e-3, seed: int = 0, atol: float | None = None,
                     curve_rtol: float = 2e-3, probe: Probe | None = None
                     ) -> tuple[list[float], list[float]]:
    """``check_plugged_in``'s verdict on ``yours``, however it was obtained (in the notebook,
    or from a graded kernel): the kit's side is computed here."""
    require_text("name", name)
    lr = _tolerance("lr", lr, positive=True)
    curve_rtol = _tolerance("curve_rtol", curve_rtol)
    batches = list(batches)
    if len(batches) < 2:
        raise not_allowed("batches", batches, "two or more (tokens, targets) pairs")
    if not _is_int(yours.replaced) or yours.replaced < 1:
        raise failure(name, f"plug_in replaced {yours.replaced!r} pieces of the model",
                       "expected it to put your piece in at least one place (it returns how "
                       "many it replaced)")
    if yours.apart is not None:
        raise failure(name, "the weights are not shared with the kit's model",
                       f"first difference at {yours.apart}; plug_in must copy the kit's weights "
                       "into your piece (swap_modules does)")
    tokens = batches[0][0]
    kit = make_model().eval()
    _judge_causal(yours, kit, tokens, name, probe)
    _judge_logits(yours, kit, tokens, name, atol, probe)
    kit_curve = loss_curve(kit, batches, lr, seed)
    your_curve = [float(x) for x in yours.curve(batches)]
    _judge_curve(your_curve, kit_curve, name, curve_rtol, probe)
    check_true(your_curve[-1] < your_curve[0],
               f"{name}: the loss falls in training ({your_curve[0]:.3f} -> {your_curve[-1]:.3f})")
    return kit_curve, your_curve


# --- saying what kind of bug it is -----------------------------------------------------------


def _retitled(err: CheckFailed, headline: str) -> CheckFailed:
    """``err`` under a new first line (its own lines indented below it)."""
    return CheckFailed("\n".join([headline] + [f"  {line}" for line in str(err).splitlines()]))


def _where(probe: Probe | None, position: int) -> str:
    return f" ({probe.where(position)})" if probe is not None else ""


def _judge_causal(yours: Plugged, kit, tokens: torch.Tensor, name: str, probe) -> None:
    """check_causal first: a leak is said as such, before the logits it also changes."""
    try:
        check_causal(yours.logits, tokens)
    except CheckFailed as err:
        if getattr(err, "leak", None) is None:
            raise
        position, after = err.leak
        headline = (f"{name}: not causal: the output at position {position}"
                    f"{_where(probe, position)} sees a later token")
        found = _leaking_part(yours, kit, tokens, after, probe)
        if found:
            headline += (f"; first in {found}, which moves when only the tokens after position "
                         f"{after} change")
        raise _retitled(err, headline) from None


def _diagnosable(yours: Plugged, probe: Probe | None) -> bool:
    return probe is not None and probe.parts is not None and yours.parts is not None


def _values(yours: Plugged, tokens: torch.Tensor, kit_parts: list[Part]) -> list | None:
    """The values of the learner's parts, None unless laid out as the kit's (a diagnosis only:
    the verdict never depends on it)."""
    try:
        values = yours.parts(tokens)
    except (CheckFailed, RuntimeError, ValueError, TypeError, AttributeError, LookupError):
        return None
    if not isinstance(values, (list, tuple)) or len(values) != len(kit_parts):
        return None
    return list(values)


def _per_entry(x: torch.Tensor) -> torch.Tensor:
    """(B, N, ...) -> (N,): the largest absolute value over everything but dim 1."""
    return x.double().abs().reshape(x.shape[0], x.shape[1], -1).amax(dim=(0, 2))


def _leaking_part(yours: Plugged, kit, tokens: torch.Tensor, after: int, probe) -> str | None:
    """The first part whose entries read by outputs <= ``after`` move when only the tokens
    after ``after`` change: "layer 0: the router's scores, window 1"."""
    if not _diagnosable(yours, probe):
        return None
    vocab = getattr(getattr(kit, "cfg", None), "vocab_size", None) or int(tokens.max()) + 2
    changed = _perturb_after(tokens, after, vocab, torch.Generator().manual_seed(0))
    kit_parts = probe.recorded(kit, tokens)
    before, moved = _values(yours, tokens, kit_parts), _values(yours, changed, kit_parts)
    if before is None or moved is None:
        return None
    for part, b, a in zip(kit_parts, before, moved, strict=True):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or \
                a.shape != b.shape or b.dim() < 2 or b.shape[1] != len(part.uses):
            return None
        early = (torch.tensor(part.uses) <= after) & (_per_entry(a - b) > LEAK_ATOL)
        if bool(early.any()):
            return part.label + part.entry(int(early.nonzero()[0]))
    return None


def _first_wrong_position(mine: torch.Tensor, kit: torch.Tensor, atol) -> int | None:
    """The first position (dim 1) where ``mine`` is not close to ``kit`` (check_close's
    tolerances), None if the shapes differ."""
    if not isinstance(mine, torch.Tensor) or mine.shape != kit.shape or mine.dim() < 2:
        return None
    atol, rtol = _tolerances(mine, kit, atol, None)
    close = torch.isclose(mine.double(), kit.double(), rtol=rtol, atol=atol, equal_nan=True)
    wrong = (~close).transpose(0, 1).reshape(mine.shape[1], -1).any(dim=1)
    return int(wrong.nonzero()[0]) if bool(wrong.any()) else None


def _judge_logits(yours: Plugged, kit, tokens: torch.Tensor, name: str, atol, probe) -> None:
    with torch.no_grad():
        mine, theirs = yours.logits(tokens), kit(tokens).logits
    try:
        check_close(mine, theirs, f"{name}: logits on shared weights vs the kit's", atol=atol)
    except CheckFailed as err:
        position = _first_wrong_position(mine, theirs, atol)
        if position is None:
            raise
        headline = (f"{name}: the logits differ from the kit's from position {position}"
                    f"{_where(probe, position)} on")
        found = _first_part_apart(yours, kit, tokens, probe)
        if found:
            headline += f"; the first difference inside is {found}"
        raise _retitled(err, headline) from None


def _first_part_apart(yours: Plugged, kit, tokens: torch.Tensor, probe) -> str | None:
    """The first part of the learner's model that differs from the kit's, and what that
    points to: "segment 1, layer 0: the read at position 8: <explanation>"."""
    if not _diagnosable(yours, probe):
        return None
    kit_parts = probe.recorded(kit, tokens)
    values = _values(yours, tokens, kit_parts)
    if values is None:
        return None
    for part, value in zip(kit_parts, values, strict=True):
        if not isinstance(value, torch.Tensor) or value.shape != part.value.shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            return (f"{part.label}: shape {shape}, the kit's {tuple(part.value.shape)}"
                    f"{_explained(probe, part, None, value)}")
        scale = max(float(_per_entry(part.value).max()) if part.value.numel() else 0.0, 1e-12)
        apart = _per_entry(value.double() - part.value.double()) > PART_RTOL * scale
        if bool(apart.any()):
            n = int(apart.nonzero()[0])
            return f"{part.label}{part.entry(n)}{_explained(probe, part, n, value)}"
    return None


def _explained(probe: Probe, part: Part, n: int | None, value) -> str:
    """": what it points to" from the probe's ``explain``, "" without one."""
    text = probe.explain(part, n, value, part.value) if probe.explain is not None else ""
    return f": {text}" if text else ""


def _judge_curve(your_curve: list[float], kit_curve: list[float], name: str, curve_rtol: float,
                 probe) -> None:
    """The loss curves; a failure after equal logits is the loss's other terms (the first loss
    differs) or the gradients (it parts later)."""
    try:
        check_close(your_curve, kit_curve, f"{name}: loss over {len(kit_curve)} training steps "
                    "vs the kit's", atol=1e-4, rtol=curve_rtol)
    except CheckFailed as err:
        apart = [abs(a - b) > 1e-4 + curve_rtol * abs(b)
                 for a, b in zip(your_curve, kit_curve, strict=False)]
        if len(your_curve) != len(kit_curve) or not any(apart):
            raise
        step = apart.index(True)
        if step == 0:
            headline = (f"{name}: the logits match the kit's, but the loss before any training "
                        "step does not: a term of the loss besides the logits' cross-entropy "
                        "(an auxiliary loss your piece feeds) differs")
        else:
            headline = (f"{name}: the logits and the first loss match the kit's, the loss "
                        f"after {step} training step{'s' * (step > 1)} does not: the forward is "
                        "right, the gradients are not")
            if probe is not None and probe.training:
                headline += f"; {probe.training}"
        raise _retitled(err, headline) from None
