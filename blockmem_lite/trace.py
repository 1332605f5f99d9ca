"""Record named intermediates of a forward pass for plots::

    with trace(model) as t:
        model(tokens)
    t["layer0.attn_weights"]        # the last recorded value
    t.all("layer0.attn_weights")    # every value recorded under that name

Modules call ``record(name, tensor)`` at interesting points. Outside a
``trace`` block ``record`` returns at once, so tracing costs nothing in
training. Names are prefixed with the module scope set by ``scope`` (models
wrap each layer in ``with scope(f"layer{i}")``). ``is_tracing(name)`` lets a
module compute something only for plots (e.g. explicit attention weights).
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections import defaultdict

import torch

_active: list[Trace] = []
_scopes: list[str] = []


class Trace:
    """What one ``trace`` block recorded: name -> list of tensors (detached, on CPU)."""

    def __init__(self, names: list[str] | None = None, keep_all: bool = True):
        self.patterns = names
        self.keep_all = keep_all
        self.records: dict[str, list[torch.Tensor]] = defaultdict(list)

    def wants(self, full_name: str) -> bool:
        return self.patterns is None or any(fnmatch.fnmatch(full_name, p) for p in self.patterns)

    def add(self, full_name: str, value: torch.Tensor) -> None:
        value = value.detach().to("cpu", copy=True)
        if self.keep_all:
            self.records[full_name].append(value)
        else:
            self.records[full_name] = [value]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.records:
            known = ", ".join(sorted(self.records)) or "nothing was recorded"
            raise KeyError(f"trace has no entry {name!r}; recorded: {known}")
        return self.records[name][-1]

    def __contains__(self, name: str) -> bool:
        return name in self.records

    def all(self, name: str) -> list[torch.Tensor]:
        self[name]  # raises a helpful KeyError when missing
        return list(self.records[name])

    def keys(self) -> list[str]:
        return sorted(self.records)

    def __repr__(self) -> str:
        items = ", ".join(f"{k}: {tuple(v[-1].shape)}" for k, v in sorted(self.records.items()))
        return f"Trace({items})"


def _full_name(name: str) -> str:
    return ".".join([*_scopes, name]) if _scopes else name


def is_tracing(name: str | None = None) -> bool:
    """True inside a ``trace`` block (that wants ``name``, when given)."""
    if not _active:
        return False
    return name is None or any(t.wants(_full_name(name)) for t in _active)


def record(name: str, value: torch.Tensor) -> None:
    """Store ``value`` under the current scope + ``name`` if a trace wants it."""
    if not _active:
        return
    full = _full_name(name)
    for t in _active:
        if t.wants(full):
            t.add(full, value)


@contextlib.contextmanager
def scope(name: str):
    """Prefix names recorded inside with ``name.`` (nests)."""
    _scopes.append(name)
    try:
        yield
    finally:
        _scopes.pop()


@contextlib.contextmanager
def trace(model: torch.nn.Module | None = None, names: list[str] | None = None,
          keep_all: bool = True):
    """Record intermediates while the block runs.

    ``names``: glob patterns to keep (e.g. ``["*.attn_weights"]``); None keeps all.
    ``model`` is accepted for readability (``with trace(model) as t``) and put in
    eval mode for the duration, so dropout does not disturb what is plotted.
    """
    t = Trace(names, keep_all)
    was_training = model.training if model is not None else None
    if model is not None:
        model.eval()
    _active.append(t)
    try:
        yield t
    finally:
        _active.remove(t)
        if model is not None and was_training:
            model.train()
