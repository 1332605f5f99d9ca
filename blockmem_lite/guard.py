"""The kit's pieces switched off inside the learner's code while a check cell runs.

``check_own_work`` reads an answer's bytecode, which a learner can talk round: the kit's
function fetched by ``getattr``, ``eval`` or ``importlib``, kept in a dict, a default argument
or a class attribute, rebuilt with ``types.FunctionType`` from its ``__code__``, or compiled
again from ``inspect.getsource``. A ``Guard`` watches what runs instead (``sys.setprofile``):
while it is installed, a call of a switched-off piece made from inside the learner's code is
refused, whatever route reached it, and the check cell's own calls of the same piece (to
compute the expected answer) still work.

- A piece is recognised by its code object, so a copy made with ``FunctionType`` is the
  piece; a function compiled from the piece's source outside any file or notebook cell is
  recognised by its bytecode. A built-in (``F.scaled_dot_product_attention``) by identity.
- A call is the learner's when a frame of the answer (its functions, the code nested in them,
  the notebook helpers they use, a class's methods) is on the stack.
- A refusal is raised where the call happens and also remembered: every check helper of
  ``checks.py`` fails after it, so an answer that catches the error gains nothing. Switching
  the profiler off (``sys.setprofile``, ``sys.settrace`` or ``threading``'s) from the answer
  is refused the same way, and a guard found switched off fails the next check.
- In a notebook a guard lasts until the end of the cell that installed it; elsewhere until the
  function that installed it returns, or the end of a ``with check_own_work(...):`` block.

Not covered, and said so in docs/GRADING.md: work handed to a thread started before the check,
or to another process. The grader's sandbox keeps such a student's harm to their own grade.
"""

from __future__ import annotations

import atexit
import dis
import linecache
import os
import sys
import threading

import torch

from blockmem_lite import checks

_TAMPERING = (sys.setprofile, sys.settrace)                 # C functions: refused by identity
_THREAD_HOOKS = (threading.setprofile, threading.settrace)   # Python ones: by their code


_LOCAL_OPS = {"LOAD_FAST", "STORE_FAST", "DELETE_FAST", "LOAD_DEREF", "STORE_DEREF",
              "DELETE_DEREF", "LOAD_CLOSURE", "MAKE_CELL", "LOAD_CLASSDEREF"}


def fingerprint(code) -> tuple:
    """What a function computes, not where it was written: its instructions with the globals,
    attributes and constants they use (nested code the same way); file, line numbers and the
    names of local variables left out (``LOAD_METHOD`` and ``LOAD_ATTR`` count as one)."""
    steps = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("CACHE", "EXTENDED_ARG", "RESUME", "NOP"):
            continue
        op = "LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname
        if hasattr(ins.argval, "co_code"):
            steps.append((op, fingerprint(ins.argval)))
        elif op in _LOCAL_OPS or ins.opname.startswith(("JUMP", "POP_JUMP", "FOR_ITER")):
            steps.append((op, ins.arg))
        else:
            steps.append((op, repr(ins.argval)))
    return tuple(steps)


def _has_source_file(code) -> bool:
    """Written in a file or a notebook cell (IPython puts each cell into ``linecache``)."""
    name = code.co_filename
    return bool(linecache.getlines(name)) or os.path.isfile(name)


def _nested_codes(code) -> list:
    found = [code]
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            found += _nested_codes(const)
    return found


class Guard:
    """While installed, calls of ``library`` (``{piece: readable name}``) from inside the code
    objects ``learner`` are refused. ``label`` names the answer in the message."""

    def __init__(self, learner: set, library: dict, label: str, entries: set = frozenset()):
        self.label = label
        self._learner = {id(c): c for c in learner}
        self._entries = {id(c): c for c in entries}     # the answer's own functions
        self._inputs: dict[int, list] = {}              # id(frame) -> [(name, tensor, version)]
        self.notes: list[str] = []
        self._codes, self._copies = {}, {}
        self._builtins = {id(t): (t, None) for t in _TAMPERING}   # C functions, by identity
        for piece, name in library.items():
            code = getattr(piece, "__code__", None)
            if code is None:
                self._builtins[id(piece)] = (piece, name)
            else:
                self._codes[id(code)] = (code, name)
                self._copies[fingerprint(code)] = name
        for hook in _THREAD_HOOKS:                        # the profiler of new threads
            self._codes[id(hook.__code__)] = (hook.__code__, f"threading.{hook.__name__}")
        # a copy compiled from a piece's source loads the same names: look closer only then
        self._copy_names = {(c.co_argcount, c.co_names) for c, _ in self._codes.values()}
        self._seen: dict[int, tuple] = {}          # id(code) -> (code, name or None)
        self.refusals: list[str] = []
        self._installed = False
        self._owner = None          # outside IPython: the frame whose return ends the guard

    # --- installing -----------------------------------------------------------------------
    def install(self) -> Guard:
        """Start watching (beside any other guard installed in the same cell)."""
        for other in list(checks.ACTIVE_GUARDS):
            if other._stale():
                other.close()
        if sys.getprofile() is not _watch_all:
            if not checks.ACTIVE_GUARDS:
                _PREVIOUS[:] = [sys.getprofile()]
            sys.setprofile(_watch_all)
            threading.setprofile(_watch_all)
        checks.ACTIVE_GUARDS.append(self)
        self._installed = True
        return self

    def close(self) -> None:
        """Stop watching (idempotent); the last guard to close puts back the profiler found."""
        if not self._installed:
            return
        self._installed = False
        if self in checks.ACTIVE_GUARDS:
            checks.ACTIVE_GUARDS.remove(self)
        if not checks.ACTIVE_GUARDS:
            if sys.getprofile() is _watch_all:
                sys.setprofile(_PREVIOUS[0] if _PREVIOUS else None)
            threading.setprofile(None)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.verdict()
        finally:
            self.close()

    # --- judging --------------------------------------------------------------------------
    def _stale(self) -> bool:
        """Installed by a function that has returned without the guard seeing it (a refusal
        raised inside the profiler switches the profiler off)."""
        if self._owner is None:
            return False
        frame = sys._getframe()
        while frame is not None and frame is not self._owner:
            frame = frame.f_back
        return frame is None

    def verdict(self) -> None:
        """Raise ``CheckFailed`` if the learner's code reached a switched-off piece, or if the
        guard was switched off while it should be watching."""
        if self._stale():
            self.close()
            return
        if self._installed and sys.getprofile() is not _watch_all:
            self.refusals.append("the check's guard was switched off while your code ran "
                                 "(sys.setprofile or sys.settrace)")
        if self.refusals:
            raise self._failure(self.refusals[0])

    def _failure(self, what: str) -> checks.CheckFailed:
        return checks.failure(self.label, what,
                               "this exercise asks you to write that piece yourself; while its "
                               "check runs the kit's version is switched off inside your code, "
                               "whatever route reaches it (getattr, eval, a dict, a default "
                               "argument, a copy of its code)",
                               "write it from torch operations, run that cell, then this check")

    def _refuse(self, what: str) -> None:
        self.refusals.append(what)
        raise self._failure(what)

    # --- watching (called for every event while installed: keep the common path short) ----
    def _call(self, frame) -> None:
        key = id(frame.f_code)
        if key in self._entries:
            self._watch_inputs(frame, "call")
        hit = self._codes.get(key)
        name = hit[1] if hit is not None and hit[0] is frame.f_code else \
            self._copied(frame.f_code)
        if name is not None and self._from_learner(frame.f_back):
            self._refuse(f"calls {name}, which is switched off in this check")

    def _c_call(self, frame, function) -> None:
        hit = self._builtins.get(id(function))
        if hit is not None and hit[0] is function and self._from_learner(frame):
            self._refuse("switches the check's profiler off (sys.setprofile / settrace)"
                         if hit[1] is None else
                         f"calls {hit[1]}, which is switched off in this check")

    def _return(self, frame) -> None:
        if frame is self._owner:
            self.close()
        elif id(frame.f_code) in self._entries:
            self._watch_inputs(frame, "return")

    def _watch_inputs(self, frame, event) -> None:
        """Note a tensor argument the answer changes in place (its version counter moves): the
        check's later comparisons then see changed inputs, and its message says so."""
        if event == "call":
            code = frame.f_code
            n_args = code.co_argcount + code.co_kwonlyargcount
            self._inputs[id(frame)] = [(n, v, v._version) for n in code.co_varnames[:n_args]
                                       if isinstance(v := frame.f_locals.get(n), torch.Tensor)]
            return
        for name, tensor, version in self._inputs.pop(id(frame), []):
            note = (f"note: {self.label} changed its input `{name}` in place, so what the "
                    "check compares afterwards was computed from changed values")
            if tensor._version != version and note not in self.notes:
                self.notes.append(note)

    def _copied(self, code) -> str | None:
        """The piece's name when ``code`` was compiled again from a piece's source."""
        seen = self._seen.get(id(code))
        if seen is None or seen[0] is not code:
            name = None
            if (code.co_argcount, code.co_names) in self._copy_names and \
                    not _has_source_file(code):
                name = self._copies.get(fingerprint(code))
            seen = self._seen[id(code)] = (code, name)
        return seen[1]

    def _from_learner(self, frame) -> bool:
        while frame is not None:
            if id(frame.f_code) in self._learner:
                return True
            frame = frame.f_back
        return False


_PREVIOUS: list = []      # the profiler found when the first guard was installed


@atexit.register
def _off_at_exit() -> None:
    if sys.getprofile() is _watch_all:
        sys.setprofile(None)


def _watch_all(frame, event, arg, guards=checks.ACTIVE_GUARDS) -> None:
    """The profiler while guards are installed: each one judges the event."""
    if event == "c_call":
        for guard in guards:
            guard._c_call(frame, arg)
    elif event == "call":
        for guard in guards:
            guard._call(frame)
    elif event == "return":
        for guard in tuple(guards):          # a guard may close itself here
            guard._return(frame)


def learner_codes(functions: list) -> set:
    """Every code object of ``functions`` and the code nested in them."""
    return {c for fn in functions for c in _nested_codes(fn.__code__)}


def _running_a_cell(frame) -> bool:
    """True when ``frame`` runs inside an IPython cell (InteractiveShell.run_code is below)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "run_code" and code.co_filename.endswith(_IPYTHON_SHELL):
            return True
        frame = frame.f_back
    return False


_IPYTHON_SHELL = os.path.join("IPython", "core", "interactiveshell.py")


def end_with_the_cell(guard: Guard, caller) -> None:
    """Close ``guard`` when the running notebook cell ends (IPython runs a cell's last line
    apart from the others, so the cell's end is its ``post_run_cell`` event); elsewhere when
    ``caller``, the frame that installed it, returns."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "events") or not _running_a_cell(caller):
        guard._owner = caller
        return

    def end(*args) -> None:
        guard.close()
        shell.events.unregister("post_run_cell", end)

    shell.events.register("post_run_cell", end)
