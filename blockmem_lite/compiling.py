"""``torch.compile`` for decoding and for training, as an option (off by default).

At batch 1 a decoding step is a few hundred tiny kernels; on a CPU most of the
step is the cost of launching them (docs/MEASUREMENTS.md, Roofline), not arithmetic.
``torch.compile`` fuses the elementwise work between the matmuls into a few
generated kernels, so it is the lever there; for training at kit scale the
matmuls dominate and it gains little. Both are opt-in (``bench --compile``,
``TrainConfig.compile``), measured, and off by default: compiling costs seconds
to minutes the first time a shape is seen, and the gain depends on the machine.

* ``compile_decoding(model)`` compiles the per-token part of ``model.step``, the
  model's ``decode_tokens(tokens, state)`` where it has one (dense, BCMT / HOnly,
  ARMT): no argument checks (``step`` runs those first, eagerly, so a bad token
  id still gets the kit's clear error) and no block / segment boundary work
  (BCMT's block close, ARMT's write, done once per block or segment, stay
  eager, so they neither split the compiled graph nor force recompiles). Models
  without ``decode_tokens`` get ``step`` compiled as a whole. The KV cache
  length changes every step: after the first few lengths, dynamo recompiles
  once with the length symbolic (``dynamic=None``, its automatic dynamic
  shapes), so warm-up steps include compilation: a handful of graphs per model
  (the lengths 0 and 1 and a full block are special cases, and dense's cache
  capacity is in its graph). dynamo keeps its compiled graphs per *function*, and
  models of one class share ``decode_tokens`` (BCMT and HOnly, ARMT at two
  segment sizes), so ``compile_decoding`` raises dynamo's per-function recompile
  limit (8 by default) to ``RECOMPILE_LIMIT``; past the limit dynamo would run
  the step eagerly and still check every stored graph's guards.
* ``compile_training(model)`` is ``model.compile()``: the module's forward (and
  with it the backward) compiled in place; parameters and ``state_dict`` keys
  are unchanged, so checkpoints are the same.

Results equal the eager ones to floating-point rounding (the generated kernels
sum in another order); tests check compiled decoding against the full forward.
"""

from __future__ import annotations

import torch

DECODE_PART = "decode_tokens"        # the per-token part of ``step`` a model may expose
RECOMPILE_LIMIT = 64                 # graphs dynamo may keep per function (its default: 8)


def _raise_recompile_limit(limit: int) -> None:
    """Let dynamo keep at least ``limit`` graphs per function (``recompile_limit`` from
    torch 2.6 on, ``cache_size_limit`` before)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), limit))


def _options(options: dict) -> dict:
    return {"dynamic": None, **options}


def compile_decoding(model: torch.nn.Module, **options) -> torch.nn.Module:
    """Compile ``model``'s decoding step in place (see the module docstring); returns it.

    ``options`` go to ``torch.compile`` (default ``dynamic=None``). Undo with
    ``uncompile_decoding(model)``.
    """
    _raise_recompile_limit(RECOMPILE_LIMIT)
    name = DECODE_PART if type(model).has_own(DECODE_PART) else "step"
    setattr(model, name, torch.compile(getattr(model, name), **_options(options)))
    model._compiled_decoding = name
    return model


def uncompile_decoding(model: torch.nn.Module) -> torch.nn.Module:
    """Back to the eager decoding step (drops what ``compile_decoding`` set)."""
    name = getattr(model, "_compiled_decoding", None)
    if name is not None:
        delattr(model, name)                   # the instance attribute; the method shows again
        del model._compiled_decoding
    return model


def is_decoding_compiled(model: torch.nn.Module) -> bool:
    return getattr(model, "_compiled_decoding", None) is not None


def compile_training(model: torch.nn.Module, **options) -> torch.nn.Module:
    """``model.compile(**options)``: forward and backward compiled in place; returns it."""
    model.compile(**options)
    return model
