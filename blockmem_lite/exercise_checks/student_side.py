"""The graded kernel's side of a check: call the student's answer, send back only data.

``exercises grade`` sends each request as one silent execution of ``serve(request, reply)``:
the request is ``wire`` text; the reply, also ``wire`` text, is written to the file
``reply`` in the kernel's working folder. Nothing here decides a verdict: the grader compares
what comes back with what its own kit computes, so a kernel that lies, or never answers,
only fails its own checks.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

from blockmem_lite import exercise_checks
from blockmem_lite.exercise_checks import wire
from blockmem_lite.exercise_checks.trial import NotebookTrial, call_text

KEPT_CALLS = 64                    # calls whose graph is kept for a later gradient request
_graphs: dict[int, tuple] = {}


def _namespace() -> dict:
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell.user_ns if shell is not None else vars(sys.modules["__main__"])


def _trial(request: dict) -> NotebookTrial:
    check = exercise_checks.find(request["check"])
    if check is None:
        raise ValueError(f"no exercise check {request['check']!r} in this kit")
    return NotebookTrial(check, _namespace())


def _call(request: dict) -> dict:
    trial = _trial(request)
    answer = trial.answer(request["name"])
    args, kwargs, keep = list(request["args"]), dict(request["kwargs"]), request["keep"]
    for i in keep:
        args[i] = args[i].detach().requires_grad_()
    with torch.enable_grad() if keep else torch.no_grad():
        result = answer(*args, **kwargs)
    reply = {"result": result, "args_after": [a if isinstance(a, torch.Tensor) else None
                                              for a in args]}
    if keep:
        outputs = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        call_id = len(_graphs) and max(_graphs) + 1
        _graphs[call_id] = (outputs, [args[i] for i in keep])
        while len(_graphs) > KEPT_CALLS:
            _graphs.pop(min(_graphs))
        reply["call_id"] = call_id
        reply["result"] = tuple(o.detach() for o in outputs) if not \
            isinstance(result, torch.Tensor) else result.detach()
    return reply


def _grad(request: dict) -> list:
    outputs, inputs = _graphs.pop(request["call_id"])
    pairs = [(o, g) for o, g in zip(outputs, request["grad_outputs"], strict=True)
             if o.requires_grad and g is not None]
    if not pairs:
        return [None] * len(inputs)
    found = torch.autograd.grad([o for o, _ in pairs], inputs, [g.to(o) for o, g in pairs],
                                allow_unused=True)
    return list(found)


def _run(request: dict):
    if not str(request["module"]).startswith(exercise_checks.__name__ + "."):
        raise ValueError(f"module {request['module']!r} is not an exercise check module")
    module = importlib.import_module(request["module"])
    trial = _trial(request)
    function = getattr(module, request["function"])
    trial.check.module_function(function)
    return function(trial, *request["args"])


HANDLERS = {"call": _call, "grad": _grad, "value": lambda r: _trial(r).value(r["name"]),
            "run": _run, "ping": lambda r: "pong"}


def serve(request_text: str, reply_name: str) -> None:
    """Answer one request; the reply is ``{"ok": value}`` or ``{"error": message}``."""
    try:
        request = wire.decode(request_text)
        value = HANDLERS[request["kind"]](request)
        text = wire.encode({"ok": value})
    except BaseException as err:            # the student's error, said to the grader as data
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        message = f"{type(err).__name__}: {err}"
        if isinstance(err, wire.WireError) and "request" in locals() and \
                request.get("kind") == "call":
            message = f"{call_text(request['name'], (), {})} gave back {err}"
        text = wire.encode({"error": message})
    Path(reply_name).write_text(text, encoding="utf-8")
