"""Where an exercise check gets the student's answers from: their notebook, or a graded kernel.

An exercise check (``@exercise_check`` in ``exercise_checks/nbNN.py``) is one function of a
``Trial``. It asks the trial for the student's answers and the values they predicted, draws
its fresh inputs from it, and computes everything else, what the kit expects included, with
the kit it imported. Two trials run the same check:

- ``NotebookTrial``, in the student's own notebook (``check_exercise("nb01-05")``): the
  answers are the notebook's own functions, each first read by ``check_own_work`` where the
  check names the kit's pieces it must not use; fresh inputs come from the operating system.
- ``GradedTrial``, in the grader's process: each answer is a stand-in that sends its
  arguments, as data (``wire``), to the student's kernel, where a ``NotebookTrial`` calls the
  real answer and sends back only data: the result, and the tensor arguments as the answer
  left them. Fresh inputs come from the grader's RNG, seeded per student. Whatever the
  student's kernel does, the verdict is reached here, by the grader's own kit.

``remote(function, *args)`` runs a function of an exercise_checks module where the answers
live (for a class answer, trained inside a model): in the notebook directly, under grading
in the kernel, with the arguments and the result as data.
"""

from __future__ import annotations

import inspect
import random
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from blockmem_lite.checks import CheckFailed
from blockmem_lite.exercise_checks import wire


class AnswerFailed(CheckFailed):
    """The student's answer raised (``kind``: what it raised), or gave back something that is
    not data (``kind`` "AnswerFailed")."""

    def __init__(self, message: str, kind: str = "AnswerFailed"):
        super().__init__(message)
        self.kind = kind


def _shape_text(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_shape_text(v) for v in value) + ")"
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


def call_text(name: str, args: tuple, kwargs: dict) -> str:
    """``name(tensor(2, 3), 5, correction=True)``: a call as a message names it."""
    parts = [_shape_text(a) for a in args] + [f"{k}={_shape_text(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


class Trial(ABC):
    """What a check body may ask for (see the module docstring)."""

    def __init__(self, check):
        self.check = check                  # the ExerciseCheck being run

    @abstractmethod
    def answer(self, name: str) -> Callable:
        """The student's function or class ``name``."""

    @abstractmethod
    def value(self, name: str):
        """The value of the student's variable ``name`` (data only)."""

    @abstractmethod
    def remote(self, function: Callable, *args):
        """``function(trial, *args)`` run where the answers live; its result as data."""

    @abstractmethod
    def fresh_int(self, low: int, high: int) -> int:
        """An integer in ``low .. high`` no answer can know in advance."""

    @abstractmethod
    def fresh_generator(self) -> torch.Generator:
        """A torch generator no answer can know in advance."""


class NotebookTrial(Trial):
    """The answers from ``namespace`` (a notebook's globals), read by ``check_own_work``."""

    def __init__(self, check, namespace: dict):
        super().__init__(check)
        self.namespace = namespace
        self._read: set[str] = set()

    def _defined(self, name: str):
        if name not in self.namespace:
            raise CheckFailed(f"{name}: not written yet (or its cell not run)\n  {name} is not "
                              "defined: write it in the cell(s) of this exercise above, run "
                              "them, then this check")
        return self.namespace[name]

    def answer(self, name: str) -> Callable:
        from blockmem_lite.own_work import check_own_work, still_a_stub

        answer = self._defined(name)
        if not callable(answer):
            raise CheckFailed(f"{name} is a {type(answer).__name__}: the exercise asks for a "
                              "function (or class)")
        if still_a_stub(answer):
            raise CheckFailed(f"{name}: not written yet\n  it still raises the exercise's "
                              "NotImplementedError: write your answer in its place, run that "
                              "cell, then this check")
        pieces = self.check.own_work.get(name)
        if pieces and name not in self._read:
            guard = check_own_work(answer, *pieces, name=name)
            if name in self.check.writes:
                guard.notes = _NotesBesides(_arguments(answer, self.check.writes[name]))
            self._read.add(name)
        return answer

    def value(self, name: str):
        value = self._defined(name)
        wire.encode(value)                  # what a graded notebook could not hand back fails here too
        return value

    def remote(self, function: Callable, *args):
        return function(self, *args)

    def fresh_int(self, low: int, high: int) -> int:
        from blockmem_lite.own_work import fresh_int

        return fresh_int(low, high)

    def fresh_generator(self) -> torch.Generator:
        from blockmem_lite.own_work import fresh_generator

        return fresh_generator()


def _arguments(answer: Callable, positions: tuple[int, ...]) -> set[str]:
    """The names ``answer`` gives its arguments at ``positions``."""
    try:
        names = list(inspect.signature(answer).parameters)
    except (TypeError, ValueError):
        return set()
    return {names[i] for i in positions if i < len(names)}


class _NotesBesides(list):
    """A guard's notes, less those on the arguments the exercise asks the answer to change in
    place (a cache it fills): such a change is the task, not what went wrong."""

    def __init__(self, written: set[str]):
        super().__init__()
        self.written = written

    def append(self, note: str) -> None:
        if not any(f"`{name}` in place" in note for name in self.written):
            super().append(note)


class GradedTrial(Trial):
    """The answers as stand-ins for the ones in a graded kernel, reached through ``send``
    (a request dict -> the reply's value; it raises ``AnswerFailed`` for an error reply)."""

    def __init__(self, check, send: Callable[[dict], object], seed: int):
        super().__init__(check)
        self.send = send
        self.rng = random.Random(seed)

    def _request(self, kind: str, **fields):
        return self.send({"kind": kind, "check": self.check.grade_id, **fields})

    def answer(self, name: str) -> Callable:
        return RemoteAnswer(self, name)

    def value(self, name: str):
        return self._request("value", name=name)

    def remote(self, function: Callable, *args):
        self.check.module_function(function)          # only exercise_checks' own functions
        return self._request("run", module=function.__module__, function=function.__name__,
                             args=list(args))

    def fresh_int(self, low: int, high: int) -> int:
        if not (isinstance(low, int) and isinstance(high, int)) or low > high:
            raise ValueError(f"fresh_int(low={low!r}, high={high!r}) is not allowed: expected "
                             "two integers with low <= high")
        return self.rng.randint(low, high)

    def fresh_generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.rng.getrandbits(63))


class RemoteAnswer:
    """Calls the student's answer in the graded kernel: the arguments go as data, the result
    comes back as data, and tensor arguments the answer changed in place are changed here too
    (so a check sees what a call in the notebook would have done). With gradients needed
    (an argument requires grad), backward asks the kernel for the answer's own gradients."""

    def __init__(self, trial: GradedTrial, name: str):
        self.trial, self.name, self.__name__ = trial, name, name

    def __repr__(self) -> str:
        return f"<the student's {self.name}>"

    def __call__(self, *args, **kwargs):
        grads = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        if grads and torch.is_grad_enabled():
            leaves = [args[i] for i in grads]
            outputs = _RemoteCall.apply(self, args, kwargs, grads, *leaves)
            return outputs[0] if self._single else outputs
        reply = self._call(args, kwargs, keep=[])
        self._write_back(args, reply["args_after"])
        return reply["result"]

    def _call(self, args: tuple, kwargs: dict, keep: list[int]) -> dict:
        data = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            return self.trial._request("call", name=self.name, args=data, kwargs=kwargs,
                                       keep=keep)
        except AnswerFailed as err:
            raise AnswerFailed(f"{call_text(self.name, args, kwargs)}: {err}", err.kind) from None

    @staticmethod
    def _write_back(args: tuple, after: list) -> None:
        with torch.no_grad():
            for arg, new in zip(args, after, strict=False):
                if isinstance(arg, torch.Tensor) and isinstance(new, torch.Tensor) and \
                        new.shape == arg.shape and not torch.equal(new.to(arg.dtype), arg):
                    arg.copy_(new)

    def _backward(self, call_id: int, grad_outputs: tuple) -> list:
        return self.trial._request("grad", call_id=call_id, grad_outputs=list(grad_outputs))


class _RemoteCall(torch.autograd.Function):
    """The student's answer as one autograd node: forward and backward run in the kernel."""

    @staticmethod
    def forward(ctx, answer: RemoteAnswer, args, kwargs, grads, *leaves):
        reply = answer._call(args, kwargs, keep=grads)
        result = reply["result"]
        answer._single = isinstance(result, torch.Tensor)
        outputs = (result,) if answer._single else result
        if not isinstance(outputs, tuple) or not all(isinstance(o, torch.Tensor) and
                                                     o.is_floating_point() for o in outputs):
            raise AnswerFailed(f"{answer.name} returned {_shape_text(result)}: with gradients "
                               "it must return a floating-point tensor or a tuple of them")
        ctx.answer, ctx.call_id, ctx.n_leaves = answer, reply["call_id"], len(leaves)
        return tuple(o.clone() for o in outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = ctx.answer._backward(ctx.call_id, grad_outputs)
        if not isinstance(grads, (list, tuple)) or len(grads) != ctx.n_leaves:
            raise AnswerFailed(f"{ctx.answer.name}: the kernel sent back no gradients")
        return (None, None, None, None, *grads)
