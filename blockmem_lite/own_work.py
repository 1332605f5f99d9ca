"""Checks that keep an exercise honest: ``check_own_work`` (the answer is the learner's own, not
the kit's piece it asks for, which stays switched off inside it while the check runs),
``check_prediction`` (a "predict, then test" answer is judged without showing the right value)
and fresh inputs (``fresh_generator``, ``fresh_int``) that hard-coded answers cannot know.

Checks that compare with the library cannot tell the library's answer from the learner's, so
an exercise notebook runs this before them. It reads the answer's bytecode (globals, attribute
names, closures, base classes) and follows the helpers the notebook defines; a use of one of
the named kit pieces is a ``CheckFailed`` saying which. The checks themselves (and the
``OK ...`` / ``CheckFailed`` conventions) are in ``checks.py``.
"""

from __future__ import annotations

import builtins
import dis
import functools
import inspect
import os
import random

import torch

from blockmem_lite import guard as _guard
from blockmem_lite.checks import (
    CheckFailed,
    agrees,
    check_close,
    failure,
    not_allowed,
    print_ok,
    require_text,
)


def _library_names(library) -> dict[int, str]:
    """id -> a readable name for every library piece (a function, class or method)."""
    named = {}
    for piece in library:
        if not callable(piece):
            raise not_allowed("library", piece, "functions or classes of blockmem_lite")
        module = getattr(piece, "__module__", "") or ""
        named[id(piece)] = f"{module}.{getattr(piece, '__qualname__', repr(piece))}"
    return named


def _functions_of(piece) -> list:
    """The Python functions that make up ``piece``: itself, or a class's methods."""
    if isinstance(piece, type):
        found = []
        for value in vars(piece).values():
            value = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if isinstance(value, property):
                found += [f for f in (value.fget, value.fset) if f is not None]
            elif callable(value) and hasattr(value, "__code__"):
                found.append(value)
        return found
    piece = getattr(piece, "__func__", piece)
    return [piece] if hasattr(piece, "__code__") else []


def _names_used(code) -> set[str]:
    """Every global or attribute name the code object (and the code nested in it) loads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_used(const)
    return names


STUB_PREFIX = "Exercise: "     # the message of the raise that ``exercises build`` writes


def still_a_stub(piece) -> bool:
    """True while ``piece`` (or a method of it) still raises the exercise's NotImplementedError."""
    def stub(code) -> bool:
        raises = "NotImplementedError" in code.co_names and any(
            isinstance(c, str) and c.startswith(STUB_PREFIX) for c in code.co_consts)
        return raises or any(stub(c) for c in code.co_consts if hasattr(c, "co_names"))
    return any(stub(f.__code__) for f in _functions_of(piece))


def _attributes_used(code) -> set[str]:
    """The attribute names the code object (and the code nested in it) loads: ``x.name``."""
    names = {i.argval for i in dis.get_instructions(code)
             if i.opname in ("LOAD_ATTR", "LOAD_METHOD")}
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _attributes_used(const)
    return names


def _modules_reached(scope: dict, attributes: set[str], depth: int = 3) -> list:
    """The modules in ``scope`` and those reached from them through the attribute names the
    code loads (``blockmem_lite.models.armt``): where a kit function may be looked up."""
    found = [v for v in scope.values() if inspect.ismodule(v)]
    frontier = found
    for _ in range(depth):
        frontier = [getattr(m, a) for m in frontier for a in attributes
                    if inspect.ismodule(getattr(m, a, None))]
        found += frontier
    return found


def _calls_into(piece, library: dict[int, str], by_name: dict[str, str],
                seen: set[int]) -> str | None:
    """The name of the first library piece ``piece`` uses (following helpers defined in the
    same module, e.g. the notebook's own functions), or None."""
    if id(piece) in seen:
        return None
    seen.add(id(piece))
    if id(piece) in library:
        return library[id(piece)]
    if isinstance(piece, type):
        for base in piece.__mro__[1:]:
            if id(base) in library:
                return library[id(base)]
    if isinstance(piece, functools.partial):
        return _calls_into(piece.func, library, by_name, seen)
    for fn in _functions_of(piece):
        cells = [c.cell_contents for c in (fn.__closure__ or ()) if _cell_filled(c)]
        for value in cells:
            if id(value) in library:
                return library[id(value)]
        scope = {**vars(builtins), **fn.__globals__}
        attributes = _attributes_used(fn.__code__)
        own = set(vars(piece)) if isinstance(piece, type) else set()   # self.name: its own
        for name in sorted((attributes & set(by_name)) - own):
            in_a_module = any(id(getattr(m, name, None)) in library
                              for m in _modules_reached(scope, attributes))
            if in_a_module or name not in scope:  # lab.memory_pays (beside a global of that
                return by_name[name]              # name too); registry.get("dense").state_bytes
        for name in sorted(_names_used(fn.__code__)):
            value = scope.get(name)
            if value is not None and id(value) in library:
                return library[id(value)]
        for value in [scope.get(n) for n in _names_used(fn.__code__)] + cells:
            if _is_own_helper(value, piece):
                found = _calls_into(value, library, by_name, seen)
                if found:
                    return found
    return None


def _cell_filled(cell) -> bool:
    """A closure cell that holds a value (an unfilled one raises on access)."""
    try:
        return cell.cell_contents is not _EMPTY
    except ValueError:
        return False


_EMPTY = object()


def _is_own_helper(value, piece) -> bool:
    """A function or class written next to ``piece`` (same module: the notebook's)."""
    return (isinstance(value, type) or inspect.isfunction(value)) and \
        getattr(value, "__module__", None) == getattr(piece, "__module__", None)


def _learner_functions(piece, seen: set[int] | None = None) -> list:
    """The functions of ``piece`` and of the notebook helpers (functions, classes) it names or
    closes over, recursively: the code that is the learner's answer."""
    seen = set() if seen is None else seen
    if id(piece) in seen:
        return []
    seen.add(id(piece))
    if isinstance(piece, functools.partial):
        return _learner_functions(piece.func, seen)
    found = _functions_of(piece)
    for fn in list(found):
        scope = fn.__globals__
        values = [scope.get(n) for n in _names_used(fn.__code__)]
        values += [c.cell_contents for c in (fn.__closure__ or ()) if _cell_filled(c)]
        for value in values:
            if _is_own_helper(value, piece):
                found += _learner_functions(value, seen)
    return found


# Names an answer never needs and a cheat does: the check's frames and globals, code objects,
# the profiler that guards the check, code built from strings.
INTROSPECTION_GLOBALS = {"eval", "exec", "compile", "globals", "vars", "__import__",
                         "__builtins__"}
INTROSPECTION_ATTRIBUTES = {"_getframe", "currentframe", "f_back", "f_locals", "f_globals",
                            "f_code", "getsource", "__code__", "__globals__", "__closure__",
                            "setprofile", "settrace", "getprofile", "gettrace"}


def _introspection(functions: list) -> str | None:
    """The first name of the two sets above that the answer's code loads, or None."""
    for fn in functions:
        for code in _guard._nested_codes(fn.__code__):
            for ins in dis.get_instructions(code):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and \
                        ins.argval in INTROSPECTION_GLOBALS or ins.opname in (
                        "LOAD_ATTR", "LOAD_METHOD") and ins.argval in INTROSPECTION_ATTRIBUTES:
                    return ins.argval
    return None


def _recompiled(functions: list, library) -> str | None:
    """The name of the library piece one of ``functions`` is a copy of, compiled again from
    its source (``exec(inspect.getsource(...))``), or None."""
    copies = {_guard.fingerprint(f.__code__): f"{f.__module__}.{f.__qualname__}"
              for p in library for f in _functions_of(p)}
    for fn in functions:
        if not _guard._has_source_file(fn.__code__):
            hit = copies.get(_guard.fingerprint(fn.__code__))
            if hit:
                return hit
    return None


def _switched_off(library, named: dict[int, str]) -> dict:
    """{function or built-in: readable name} for the guard: a class by each of its methods."""
    pieces = {}
    for piece in library:
        functions = _functions_of(piece)
        if isinstance(piece, type):
            pieces.update({f: f"{named[id(piece)]}.{f.__name__}" for f in functions})
        else:
            pieces[functions[0] if functions else piece] = named[id(piece)]
    return pieces


def check_own_work(piece, *library, name: str | None = None) -> _guard.Guard:
    """``piece`` (a function or class the learner wrote) is not, does not subclass and does not
    call any of ``library``, the kit's own version of what the exercise asks for (or a helper
    of the check cell that computes it).

    Checks that compare with the library cannot tell the library's answer from the learner's,
    so an exercise that asks for a piece the library has runs this first. It reads the
    bytecode: globals, attribute names (``armt.dpfp``), closures, base classes, and the
    helpers the notebook defines that ``piece`` uses, recursively. Then it switches
    ``library`` off inside the learner's code (``guard.Guard``) for the rest of the notebook
    cell (elsewhere: of the calling function, or of a ``with check_own_work(...):`` block), so
    no other route reaches it either.
    Returns the guard.
    """
    if not callable(piece):
        raise not_allowed("piece", piece, "the function or class the exercise asks for")
    if not library:
        raise ValueError("library=() is not allowed: expected the library pieces the exercise "
                         "asks the learner to write")
    if name is not None:
        require_text("name", name)
    label = name or getattr(piece, "__name__", "your answer")
    named = _library_names(library)
    # attribute names to refuse: functions and classes; a method's name (forward, read) is
    # too common to refuse by name, so methods are caught by identity only
    by_name = {p.__name__: named[id(p)] for p in library
               if hasattr(p, "__name__") and "." not in getattr(p, "__qualname__", "")}
    if still_a_stub(piece):          # no "OK ... your own code" for an answer not written
        raise failure(label, "not written yet",
                       "it still raises the exercise's NotImplementedError: write your answer "
                       "in its place, run that cell, then this check")
    used = _calls_into(piece, named, by_name, set())
    functions = _learner_functions(piece)
    peeked = _introspection(functions)
    if peeked is not None:
        raise failure(label, f"uses {peeked}",
                       "an answer may not look into the check: its frames and globals, code "
                       "objects, its profiler, or code run from strings (eval, exec)",
                       "write it from torch operations")
    copied = _recompiled(functions, library)
    if copied is not None:
        raise failure(label, f"is the kit's own {copied}, compiled again from its source",
                       "this exercise asks you to write that piece yourself",
                       "write it from torch operations, in a notebook cell")
    if used is not None:
        short = used.rsplit(".", 1)[-1]
        whose = "the kit's own " if used.startswith("blockmem_lite.") else ""
        raise failure(label, f"uses {whose}{used}",
                       "this exercise asks you to write that piece yourself; the checks below "
                       "compare your answer with the kit's, so calling it would pass without "
                       "testing anything",
                       f"write it from torch operations ({short} may still be used after "
                       "this exercise, to check or to compare)")
    print_ok(f"{label}: your own code (it does not call the kit's "
        f"{', '.join(sorted(n.rsplit('.', 1)[-1] for n in named.values()))})")
    guard = _guard.Guard(_guard.learner_codes(functions), _switched_off(library, named),
                         label, entries={f.__code__ for f in _functions_of(piece)}).install()
    _guard.end_with_the_cell(guard, inspect.currentframe().f_back)
    return guard


def check_prediction(predicted, actual, name: str = "your prediction", hint: str = "",
                     atol: float | None = None, rtol: float | None = None) -> None:
    """``predicted`` (what the learner predicted) equals ``actual`` (what the code does), and a
    wrong prediction is told so without the right value: it is the learner's to reason out,
    and a check that printed it would answer the exercise. Tensors and arrays compare within
    the dtype's tolerance (or ``atol`` / ``rtol``), everything else exactly."""
    require_text("name", name)
    require_text("hint", hint, empty_ok=True)
    try:
        right = agrees(predicted, actual, name, atol, rtol)
    except CheckFailed:                # its message would describe the right value
        right = False
    if not right:
        raise failure(name, "does not match what the code does",
                       "the right value is not shown: a prediction is yours to reason out",
                       *([hint] if hint else []),
                       "think it through again, change your prediction, then run this check")
    print_ok(f"{name}: your prediction matches what the code does")


_SYSTEM_RANDOM = random.SystemRandom()


def fresh_generator(device=None) -> torch.Generator:
    """A torch generator seeded from the operating system: inputs that no answer can know in
    advance, so hard-coding the results of a check's fixed cases does not pass it. A check
    names the inputs it drew in its messages, so a failure can be reproduced."""
    return torch.Generator(device=device or "cpu").manual_seed(int.from_bytes(os.urandom(8),
                                                                               "little"))


def fresh_int(low: int, high: int) -> int:
    """An integer in ``low .. high`` (both included) from the operating system's randomness."""
    if not (isinstance(low, int) and isinstance(high, int)) or low > high:
        raise ValueError(f"fresh_int(low={low!r}, high={high!r}) is not allowed: expected two "
                         "integers with low <= high")
    return _SYSTEM_RANDOM.randint(low, high)


def _as_outputs(value, name: str) -> tuple:
    outputs = value if isinstance(value, (tuple, list)) else (value,)
    if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise not_allowed(name, value, "a tensor or a tuple of tensors")
    return tuple(outputs)


def check_gradients(yours, kit, inputs, name: str = "your function", names=None,
                    atol: float | None = None, rtol: float | None = None) -> None:
    """``yours(*inputs)`` and ``kit(*inputs)`` give the same gradient with respect to every
    tensor of ``inputs``: what the forward values cannot show, e.g. a stop-gradient
    (``.detach()``) the task asks for. Each output is weighted by fresh random numbers (the
    same for both) before summing, so no gradient cancels out. ``names``: one per input."""
    require_text("name", name)
    inputs = tuple(inputs)
    names = tuple(names) if names is not None else tuple(f"input {i}" for i in range(len(inputs)))
    if not inputs or not all(isinstance(x, torch.Tensor) and x.is_floating_point()
                             for x in inputs):
        raise not_allowed("inputs", inputs, "floating-point tensors")
    if len(names) != len(inputs):
        raise not_allowed("names", names, f"{len(inputs)} names, one per input")
    runs = []
    for fn, role in ((yours, name), (kit, "the kit's version")):
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        runs.append((leaves, _as_outputs(fn(*leaves), role)))
    (_, mine), (_, theirs) = runs
    if len(mine) != len(theirs):
        raise failure(name, f"returns {len(mine)} outputs", f"the kit's version returns "
                                                            f"{len(theirs)}")
    gen = fresh_generator()
    weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in mine]
    grads = []
    for leaves, outputs in runs:
        total = sum((w.to(o) * o).sum() for w, o in zip(weights, outputs, strict=True))
        found = torch.autograd.grad(total, leaves, allow_unused=True) \
            if total.requires_grad else [None] * len(leaves)   # no path to any input
        grads.append([torch.zeros_like(x) if g is None else g
                      for x, g in zip(leaves, found, strict=True)])
    for label, mine, theirs in zip(names, *grads, strict=True):
        check_close(mine, theirs, f"{name}: gradient with respect to {label}", atol=atol,
                    rtol=rtol)
