"""The exercise checks: one definition per check, run in the notebook and by the grader.

A check cell of an exercise notebook is one call, ``check_exercise("nb01-05")``. The check
itself is a function in ``exercise_checks/nbNN.py``, registered with ``@exercise_check``;
it asks a ``Trial`` (``trial.py``) for the student's answers and compares what they give with
what the kit gives. In the student's notebook it runs there and then; ``exercises grade``
runs the same function in the grader's own process, against the student's answers in a
sandboxed kernel, so no code of the student's takes part in a verdict.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

GRADE_ID = re.compile(r"nb(\d\d)-[0-9a-z]+(?:-[0-9a-z]+)*")
_CHECKS: dict[str, ExerciseCheck] = {}


@dataclass(frozen=True)
class ExerciseCheck:
    """One check: its nbgrader ``grade_id``, the function that judges, per answer name the
    kit's pieces that answer must not use (``check_own_work``), and per answer name the
    positions of the arguments the exercise asks it to change in place (``writes``: a
    failure then does not blame those changes)."""

    grade_id: str
    body: Callable
    own_work: dict[str, tuple] = field(default_factory=dict)
    writes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def module_function(self, function: Callable) -> None:
        """Refuse a function ``Trial.remote`` may not run: only this check's module's own,
        or a capstone's (``plugged``)."""
        allowed = (self.body.__module__, f"{__name__}.plugged")
        if getattr(function, "__module__", None) not in allowed:
            raise ValueError(f"function={function!r} is not allowed: expected a function of "
                             f"{' or '.join(allowed)}")


def exercise_check(grade_id: str, own_work: dict[str, tuple] | None = None,
                   writes: dict[str, tuple[int, ...]] | None = None) -> Callable:
    """Register the decorated ``body(trial)`` as the check ``grade_id``."""
    if not GRADE_ID.fullmatch(grade_id):
        raise ValueError(f"grade_id={grade_id!r} is not allowed: expected nbNN-<id>")

    def register(body: Callable) -> Callable:
        _CHECKS[grade_id] = ExerciseCheck(grade_id, body, dict(own_work or {}),
                                          dict(writes or {}))
        return body

    return register


def find(grade_id: str) -> ExerciseCheck | None:
    """The check registered as ``grade_id`` (its module imported), None if there is none."""
    match = GRADE_ID.fullmatch(grade_id) if isinstance(grade_id, str) else None
    if match is None:
        return None
    try:
        importlib.import_module(f"{__name__}.nb{match.group(1)}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.nb{match.group(1)}":
            raise
        return None
    return _CHECKS.get(grade_id)


def check_exercise(grade_id: str):
    """Run the check ``grade_id`` on the answers of the calling notebook; returns what the
    check returns (a curve to plot, say). A check that fails raises ``CheckFailed``."""
    from blockmem_lite.exercise_checks.trial import NotebookTrial

    check = find(grade_id)
    if check is None:
        known = sorted(g for g in _CHECKS if g[:4] == str(grade_id)[:4])
        raise ValueError(f"grade_id={grade_id!r} is not allowed: expected one of "
                         f"{', '.join(known) or 'the ids of the exercise notebooks'}")
    namespace = sys._getframe(1).f_globals
    return check.body(NotebookTrial(check, namespace))
