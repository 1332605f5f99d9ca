"""Grade a folder of submissions: ``python -m blockmem_lite exercises grade SUBMISSIONS_DIR``.

Options: ``--notebook NN``, ``--out DIR`` (default ``./grades``), ``--cell-timeout S``
(default: each cell's own limit, from the solution's measured time), ``--notebook-timeout S``
(1800), ``--student-timeout S`` (3600), ``--seed N`` (default: drawn and reported),
``--isolation auto|bubblewrap|process`` and ``--solutions DIR``.

``SUBMISSIONS_DIR`` holds one folder per student, named after the student, with that
student's notebooks anywhere below it (nbgrader's ``submitted/<student>/`` works as is).
Before anything is read, a student folder or notebook that is a symlink or lies behind one,
or a notebook that is not a regular file (a FIFO, a device), is refused unread: 0 points,
its row naming it (``refusal``), so no link leads the grader to files outside the folder.
A notebook is matched to ``notebooks/solutions/NN_topic.ipynb`` by its ``NN_`` prefix or,
when renamed, by the mark ``metadata["blockmem_lite"]["generated_from"]``.

Each notebook runs headless in a fresh kernel inside a sandbox of its own
(``tools/sandbox.py``), cell by cell with errors allowed (``tools/grade_kernel.py``). Check
cells are found by their nbgrader ``grade_id``, else by cell id; none of them runs in the
kernel: the check registered for that id (``blockmem_lite.exercise_checks``) runs in this
process against the kernel's answers, so every verdict is the grader's. An exercise is passed
when its check passed and the cells since the previous check cell ran without error;
otherwise it fails with the first error as ``cell N: Name: message`` (cells counted from 0,
on one line). A cell or check running past its limit fails with the solution's time beside
the limit; its exercise is lost, the rest of the notebook goes on in a fresh sandbox. A
dying kernel stops that notebook. A deleted check cell fails; a notebook that is not valid
JSON fails every check of its exercise. Every NN that some student submitted (or
``--notebook NN``) is graded for every student; a missing one fails as not submitted.

Writes ``grades.csv``, ``grades.md`` (totals per student and notebook, with the points of
the nbgrader metadata, the exercise titles and the time per student), ``written_answers.md``
(tools/grade_report.py) and ``review.md``, the answers to read, flagged where worth a look
(tools/review_sheet.py). A setup cell that fails is named once, on the first exercise it breaks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from blockmem_lite import exercise_checks
from blockmem_lite.__main__ import program
from blockmem_lite.tools.exercises import (
    MD_ANSWER,
    ExerciseError,
    add_nbgrader_metadata,
    clear_outputs,
    notebook_number,
    read_notebook,
    solution_notebooks,
    solutions_dir,
    stub_markdown,
)
from blockmem_lite.tools.grade_kernel import (
    Hung,
    KernelDied,
    NotebookJob,
    Timing,
    cell_error,
    one_line,
    run_notebook,
)
from blockmem_lite.tools.grade_report import (
    BY_HAND,
    Row,
    check_out,
    refusal,
    shown,
    write_tables,
)
from blockmem_lite.tools.review_sheet import write_review
from blockmem_lite.tools.sandbox import (
    LEVELS,
    Limits,
    SandboxError,
    choose_level,
    describe,
    require_linux,
)

UNKNOWN = ("cannot tell which exercise this is: keep the NN_ prefix of the notebook "
           "handed out (renamed copies of it are recognised by its metadata)")


@dataclass(frozen=True)
class Check:
    """A check cell of the solution: its ids, the source graded, its exercise's title."""

    grade_id: str
    cell_id: str
    source: str
    title: str = ""
    points: float = 1


@dataclass(frozen=True)
class Written:
    """A written answer (nbgrader's manually graded markdown cell)."""

    grade_id: str
    cell_id: str
    title: str
    points: float
    prompt: str           # the cell as the exercise notebook hands it out


@dataclass(frozen=True)
class Solution:
    name: str             # NN_topic (no .ipynb)
    checks: tuple[Check, ...]
    written: tuple[Written, ...] = ()
    setup_ids: tuple[str, ...] = ()   # the code cells before the first exercise


@dataclass(frozen=True)
class Refused:
    """A student's folder or notebook graded 0 and never read: its file, and why."""

    file: str             # as the tables show it ("" for the student's whole folder)
    why: str


@dataclass(frozen=True)
class Student:
    """A student's folder as scanned before anything runs: NN -> their notebook, or why it
    is refused; rows for notebooks that match no exercise; why the whole folder is refused."""

    folder: Path
    notebooks: dict[str, Path | Refused]
    unknown: list[Row]
    refused: Refused | None = None

    def notebook(self, nn: str) -> Path | Refused | None:
        return self.notebooks.get(nn, self.refused)


@dataclass(frozen=True)
class Budget:
    """How a class is graded: time limits in seconds (``cell`` None: each cell's limit comes
    from the solution's measured time, ``measured``), the class seed of the grader's RNG, the
    sandbox level and its limits, and the folders a graded kernel must not see."""

    cell: int | None = None
    notebook: int = 1800
    student: int = 3600
    isolation: str = "auto"
    seed: int = 0
    limits: Limits = field(default_factory=Limits)
    hidden: tuple[Path, ...] = ()
    measured: dict[str, dict[str, float]] = field(default_factory=dict)

    def check(self) -> None:
        for name, value in (("cell", self.cell), ("notebook", self.notebook),
                            ("student", self.student)):
            if value is None and name == "cell":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ExerciseError(f"--{name}-timeout={value} is not allowed: expected whole "
                                    "seconds >= 1")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 63:
            raise ExerciseError(f"--seed={self.seed} is not allowed: expected an integer in "
                                "0 .. 2**63 - 1")
        if self.isolation not in LEVELS:
            raise ExerciseError(f"--isolation={self.isolation} is not allowed: expected one of "
                                f"{', '.join(LEVELS)}")

    def timing(self, notebook: str) -> Timing:
        return Timing(self.cell, self.measured.get(notebook, {}))


# --- solutions and submissions -------------------------------------------------------------------


def load_solutions(folder: Path | None = None) -> dict[str, Solution]:
    """Solution notebooks by NN, with their check cells (grade_id as ``exercises build`` sets),
    written answers, exercise titles, points and setup cells."""
    solutions = {}
    for path in solution_notebooks(Path(folder) if folder else solutions_dir()):
        nn = notebook_number(path.name)
        if nn is None:
            continue
        nb = read_notebook(path)
        add_nbgrader_metadata(nb, path.name)
        solutions[nn] = _solution_of(path.stem, nb)
    return solutions


def _solution_of(name: str, nb) -> Solution:
    checks, written, setup, title, started = [], [], [], "", False
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"):
            title = cell.source.lstrip().split("\n")[0].lstrip("#").strip()
        if meta.get("grade") and cell.cell_type == "code":
            checks.append(Check(meta["grade_id"], cell.get("id"), cell.source, title,
                                meta.get("points", 1)))
        elif meta.get("grade") and cell.cell_type == "markdown":
            written.append(Written(meta["grade_id"], cell.get("id"), title,
                                   meta.get("points", 1), stub_markdown(cell.source)))
        started |= bool(meta)
        if cell.cell_type == "code" and not started and cell.get("id"):
            setup.append(cell.id)
    return Solution(name, tuple(checks), tuple(written), tuple(setup))


def student_folders(submissions: Path) -> list[Path]:
    """The student folders in ``submissions``, symlinks to folders too (sorted, hidden ones
    skipped)."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise ExerciseError(f"submissions={str(submissions)!r} is not allowed: expected a folder "
                            "holding one folder per student")
    for stray in sorted(submissions.glob("*.ipynb")):
        print(f"note: ignored {shown(stray.name)}: put each notebook in a folder named after "
              "its student")
    return sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))


def identify(path: Path, solutions: dict[str, Solution]) -> str | None:
    """The NN a submitted notebook answers: its name's prefix, else its generated mark."""
    nn = notebook_number(path.name)
    if nn in solutions:
        return nn
    try:
        mark = read_notebook(path).metadata.get("blockmem_lite", {})
    except ExerciseError:
        return None
    nn = notebook_number(str(mark.get("generated_from", ""))) if isinstance(mark, dict) else None
    return nn if nn in solutions else None


def scan(submissions: Path, solutions: dict[str, Solution]) -> list[Student]:
    """Every student folder of ``submissions`` with its notebooks matched to ``solutions``;
    what ``refusal`` refuses is named, never followed nor read."""
    students = []
    for folder in student_folders(submissions):
        if why := refusal(folder, Path(submissions)):
            print(f"note: {why}")
            students.append(Student(folder, {}, [], Refused("", why)))
        else:
            students.append(Student(folder, *match_student(folder, solutions)))
    return students


def _entries(folder: Path) -> list[Path]:
    """The ``.ipynb`` entries below a student's folder and the symlinks to folders there,
    sorted (``.ipynb_checkpoints`` skipped); no link is followed, no file opened."""
    found = []
    for here, folders, files in os.walk(folder):     # a linked folder is listed, not entered
        folders[:] = [name for name in folders if name != ".ipynb_checkpoints"]
        found += [Path(here, name) for name in folders if Path(here, name).is_symlink()]
        found += [Path(here, name) for name in files if name.endswith(".ipynb")]
    return sorted(found)


def match_student(folder: Path, solutions: dict[str, Solution]
                  ) -> tuple[dict[str, Path | Refused], list[Row]]:
    """NN -> the student's notebook for it (a refused one, unread, only where no other
    answers that NN), and rows for notebooks that match no exercise."""
    matched, refused, unknown = {}, {}, []
    for path in _entries(folder):
        file = path.relative_to(folder).as_posix()
        if why := refusal(path, folder.parent):
            print(f"note: {why}")
            nn = notebook_number(path.name)      # by its name alone: it is never read
            if nn in solutions:
                refused.setdefault(nn, Refused(file, why))
            else:
                unknown.append(Row(folder.name, "", file, "", why))
        elif (nn := identify(path, solutions)) is None:
            unknown.append(Row(folder.name, "", file, "", UNKNOWN))
        elif nn in matched:
            print(f"note: {shown(folder.name)}: {shown(file)} is a second notebook for {nn}; graded "
                  f"{matched[nn].relative_to(folder).as_posix()}")
        else:
            matched[nn] = path
    return {**refused, **matched}, unknown


# --- running one notebook ------------------------------------------------------------------------


# Run silently before every check cell: what a student's cell may have changed in the
# kernel goes back to the kit's. IPython's hooks (a custom exception handler hides an
# error's output; input and AST transformers rewrite the check's source; pre-run callbacks
# run code first), and the check helpers: checks and own_work are imported afresh from the
# kit's read-only files and every name the notebook holds of them is bound to the fresh one
# (a redefined or patched check_close, or checks._calls_into, is gone).
RESET_BEFORE_A_CHECK = """\
def _blockmem_grader_reset():
    import importlib, sys
    from IPython.core.getipython import get_ipython as kernel  # not the notebook's name
    from IPython.core.inputtransformer2 import TransformerManager
    shell = kernel()
    shell.custom_exceptions, shell.CustomTB = (), None
    shell.input_transformer_manager = TransformerManager()
    shell.input_transformers_post, shell.ast_transformers = [], []
    for event in ("pre_execute", "pre_run_cell", "post_execute", "post_run_cell"):
        shell.events.callbacks[event] = [
            c for c in shell.events.callbacks[event] if not event.startswith("pre_")
            and getattr(c, "__module__", "").startswith("blockmem_lite.")]
    fresh = []
    for name in ("blockmem_lite.checks", "blockmem_lite.guard", "blockmem_lite.own_work",
                 "blockmem_lite.plugged_in"):
        sys.modules.pop(name, None)
        fresh.append(importlib.import_module(name))
    for module in fresh:
        for key, value in vars(module).items():
            if not key.startswith("_") and key in shell.user_ns:
                shell.user_ns[key] = value
_blockmem_grader_reset()
"""


RESET_TIMEOUT_S = 120


# The reset is not run as a cell (a student's input or AST transformer would rewrite it, a
# name in the notebook could shadow ``exec``): it is a user expression of an empty request,
# which IPython evaluates as it is, and it reaches ``exec`` through the builtins of a kit-free
# class, not through any name the notebook can rebind.
_REAL_BUILTINS = ("[c for c in ().__class__.__base__.__subclasses__() "
                  "if c.__name__ == 'catch_warnings'][0]()._module.__builtins__")
RESET_EXPRESSION = (f"(lambda b: b['exec']({RESET_BEFORE_A_CHECK!r}, "
                    f"{{'__builtins__': b}}))({_REAL_BUILTINS})")


def _reset_kernel(client, timeout: float) -> bool:
    """Reset the kernel (``RESET_BEFORE_A_CHECK``) silently; True if it worked. It may import
    torch afresh, so it has its own time limit, not the cell's."""
    client.timeout = int(timeout)
    msg_id = client.kc.execute("", silent=True, store_history=False,
                               user_expressions={"reset": RESET_EXPRESSION})
    reply = client.wait_for_reply(msg_id, nbformat.v4.new_code_cell("(the reset)"))
    content = reply["content"] if reply else {}
    return content.get("status") == "ok" and \
        content.get("user_expressions", {}).get("reset", {}).get("status") == "ok"


def _legacy_check(client, index: int, cell) -> str | None:
    """A check cell with no registered check runs in the kernel, after the reset."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    limit = client.timeout
    try:
        if not _reset_kernel(client, max(limit, RESET_TIMEOUT_S)):
            return ("the kernel could not be reset before this check (were IPython or the "
                    "kit's imports tampered with?)")
        client.timeout = limit
        client.execute_cell(cell, index)
    except CellTimeoutError:
        raise Hung(limit) from None
    except DeadKernelError:
        raise KernelDied() from None
    return cell_error(cell)


def _verdict(index: int, start: int, errors: dict[int, str], stopped: int | None) -> str:
    """The message of the check cell at ``index`` whose exercise starts at cell ``start``."""
    if stopped is not None and stopped < start:
        return f"not run: the kernel was killed at cell {stopped}"
    earlier = [f"cell {i}: {errors[i]}" for i in range(start, index) if i in errors]
    return earlier[0] if earlier else errors.get(index, "")


def _find_checks(nb, solution: Solution) -> dict[str, int]:
    """grade_id -> index of the submission's cell for that check (grade_id, else cell id)."""
    by_grade_id, by_cell_id = {}, {}
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader")
        if isinstance(meta, dict) and isinstance(meta.get("grade_id"), str):
            by_grade_id.setdefault(meta["grade_id"], i)
        if cell.get("id"):
            by_cell_id.setdefault(cell.id, i)
    found = {}
    for check in solution.checks:
        index = by_grade_id.get(check.grade_id, by_cell_id.get(check.cell_id))
        if index is not None and index not in found.values():
            found[check.grade_id] = index
    return found


def grade_notebook(student: str, path: Path, solution: Solution, budget: Budget, level: str,
                   file: str, deadline: float) -> list[Row]:
    """One row per check and written answer of ``solution`` for the student's notebook."""
    def row(check: Check, message: str) -> Row:
        return Row(student, solution.name, file, check.grade_id, message, check.title,
                   check.points)

    try:
        nb = read_notebook(path)
    except ExerciseError as err:
        problem = f"{path.name} {str(err).removeprefix(f'{path} ')}"
        return [row(check, problem) for check in solution.checks]
    clear_outputs(nb)
    found = _find_checks(nb, solution)
    answers = [_written_row(student, solution, file, nb, w) for w in solution.written]
    for check in solution.checks:
        if check.grade_id in found:      # what runs there: the registered check, else the solution's cell
            cell = nb.cells[found[check.grade_id]]
            cell.cell_type, cell.source = "code", check.source
            cell.setdefault("outputs", [])
            cell.setdefault("execution_count", None)
    job = NotebookJob(nb, {index: grade_id for grade_id, index in found.items()},
                      budget.timing(solution.name), deadline, budget.seed, student, level,
                      budget.limits, hidden=budget.hidden, name=path.name)
    graded = run_notebook(job, _legacy_check)
    errors, stopped = graded.errors, graded.stopped
    order = sorted(found.values())   # an exercise: the cells after the previous check cell
    starts = {index: order[k - 1] + 1 if k else 0 for k, index in enumerate(order)}

    def message(check: Check) -> str:
        if check.grade_id not in found:
            return (f"check cell {check.grade_id} is missing (deleted?): restore it from the "
                    "exercise notebook")
        index = found[check.grade_id]
        return _verdict(index, starts[index], errors, stopped)

    messages = {c.grade_id: message(c) for c in solution.checks}
    _name_the_root_cause(messages, _setup_failure(nb, solution, errors))
    return [row(check, messages[check.grade_id]) for check in solution.checks] + answers


def _setup_failure(nb, solution: Solution, errors: dict[int, str]) -> tuple[int, str] | None:
    """(index, error) of the first setup cell (before every exercise) that failed."""
    setup = set(solution.setup_ids)
    failed = [i for i in sorted(errors) if nb.cells[i].get("id") in setup]
    return (failed[0], errors[failed[0]]) if failed else None


def _name_the_root_cause(messages: dict[str, str], root: tuple[int, str] | None) -> None:
    """A failed setup cell is shown once, on the first failed exercise; the later failures
    point to it (their own errors, often a NameError, follow from it)."""
    if root is None:
        return
    index, error = root
    first = None
    for grade_id, text in messages.items():
        if not text:
            continue
        if first is None:
            messages[grade_id] = (f"setup cell {index} failed: {error}; fix it first: the "
                                  "exercises after it need what it defines")
            first = grade_id
        else:
            messages[grade_id] = f"setup cell {index} failed (see {first}); here: {text}"


def _written_row(student: str, solution: Solution, file: str, nb, written: Written) -> Row:
    """The student's written answer: the cell's text, less the question handed out."""
    cell = next((c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                 == written.grade_id), None) or \
        next((c for c in nb.cells if c.get("id") == written.cell_id), None)
    text = "" if cell is None else cell.source
    prompt_lines = [line for line in written.prompt.splitlines() if line.strip()]
    answer = [line for line in text.splitlines()
              if line.strip() and line not in prompt_lines and line.strip() != MD_ANSWER]
    return Row(student, solution.name, file, written.grade_id, "", written.title,
               written.points, BY_HAND, "\n".join(answer))


# --- a folder of submissions ---------------------------------------------------------------------


def _wanted(notebook: str | None, solutions: dict[str, Solution],
            students: list[Student]) -> list[str]:
    if notebook is None:
        return sorted({nn for student in students for nn in student.notebooks})
    nn = notebook.zfill(2)
    if nn not in solutions:
        raise ExerciseError(f"--notebook={notebook} is not allowed: expected one of "
                            f"{', '.join(sorted(solutions))} (a solution notebook's NN)")
    return [nn]


def grade(submissions: Path, solutions: Path | None = None, notebook: str | None = None,
          budget: Budget = Budget()) -> tuple[list[Row], str, dict[str, float]]:
    """(rows for every student and exercise, the isolation level used, seconds per student);
    prints one line per graded notebook."""
    budget.check()
    level = choose_level(budget.isolation)
    known = load_solutions(solutions)
    students = scan(submissions, known)
    wanted = _wanted(notebook, known, students)
    hidden = (*budget.hidden, Path(submissions), Path(solutions) if solutions else
              solutions_dir(), *_teacher_folders())
    budget = dataclasses.replace(budget, hidden=tuple(dict.fromkeys(hidden)))
    print(f"isolation: {describe(level)}")
    print(f"seed: {budget.seed} (grade again with --seed {budget.seed} to draw the same inputs)")
    for nn in wanted:
        if unregistered := [c.grade_id for c in known[nn].checks
                            if exercise_checks.find(c.grade_id) is None]:
            print(f"warning: {known[nn].name}: {', '.join(unregistered)} have no registered "
                  "check, so they run inside the student's kernel, whose code can forge their "
                  "verdict (register them in blockmem_lite/exercise_checks)")
    if budget.cell is None:
        measured = {known[nn].name: _measure_solution(known[nn], solutions, budget, level)
                    for nn in wanted}
        budget = dataclasses.replace(budget, measured=measured)
    rows, seconds = [], {}
    for one in students:
        student, start = one.folder.name, time.monotonic()
        for nn in wanted:
            deadline = min(time.monotonic() + budget.notebook, start + budget.student)
            rows += _grade_one(student, one.notebook(nn), one.folder, known[nn], budget,
                               level, deadline)
        rows += one.unknown if notebook is None else []
        if one.refused and not wanted:           # no notebook to give the refusal to
            rows.append(Row(student, "", "", "", one.refused.why))
        seconds[student] = time.monotonic() - start
    return rows, level, seconds


def _measure_solution(solution: Solution, folder: Path | None, budget: Budget,
                      level: str) -> dict[str, float]:
    """Run the teacher's solution as the students' notebooks run: seconds per cell id (per
    grade_id for a check), from which each cell's time limit follows. A check the solution
    fails here is said at once: the grader, not the class, needs looking at."""
    path = (Path(folder) if folder else solutions_dir()) / f"{solution.name}.ipynb"
    nb = read_notebook(path)
    clear_outputs(nb)
    found = _find_checks(nb, solution)
    job = NotebookJob(nb, {index: grade_id for grade_id, index in found.items()},
                      Timing(fixed=budget.notebook), time.monotonic() + budget.notebook,
                      budget.seed, "(solution)", level, budget.limits, hidden=budget.hidden,
                      name=path.name)
    graded = run_notebook(job, _legacy_check)
    for index, error in sorted(graded.errors.items()):
        print(f"warning: the solution of {solution.name} fails cell {index} here: {error}")
    measured = {job.checks.get(i) or nb.cells[i].get("id"): t for i, t in graded.seconds.items()}
    total = sum(graded.seconds.values())
    print(f"timed the solution of {solution.name}: {total:.0f} s; each cell may take "
          f"{Timing(measured=measured).limit(None)} s at most")
    return {key: t for key, t in measured.items() if key}


def _teacher_folders() -> list[Path]:
    """The kit's own folders a student must not read: its solutions and mutants."""
    root = solutions_dir().parent.parent
    return [p for p in (root / "notebooks" / "solutions", root / "tests" / "mutants") if p.is_dir()]


def _grade_one(student: str, path: Path | Refused | None, folder: Path, solution: Solution,
               budget: Budget, level: str, deadline: float) -> list[Row]:
    """Rows for one student and notebook; a problem grading it never stops the others."""
    if not isinstance(path, Path):
        file, why = (path.file, path.why) if path else ("", "not submitted")
        return [Row(student, solution.name, file, c.grade_id, why, c.title, c.points)
                for c in solution.checks]
    file = path.relative_to(folder).as_posix()
    start = time.monotonic()
    try:
        rows = grade_notebook(student, path, solution, budget, level, file, deadline)
    except Exception as err:  # a kernel that will not start, a broken cell structure, ...
        rows = [Row(student, solution.name, file, c.grade_id,
                    one_line(f"not graded: {type(err).__name__}: {err}"), c.title, c.points)
                for c in solution.checks]
    rows_auto = [r for r in rows if r.kind != BY_HAND]
    passed = sum(not r.message for r in rows_auto)
    print(f"graded {shown(student)}/{shown(file)} as {solution.name}: "
          f"{passed}/{len(rows_auto)} passed ({time.monotonic() - start:.0f} s)")
    return rows


# --- command line --------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{program()} exercises grade",
                                     description="Run every student's notebooks headless and "
                                     "write grades.csv and grades.md.")
    parser.add_argument("submissions", type=Path, help="folder with one folder per student")
    parser.add_argument("--notebook", metavar="NN", default=None,
                        help="grade only this notebook (default: every one submitted)")
    parser.add_argument("--out", type=Path, default=Path("grades"),
                        help="folder for grades.csv and grades.md (default: ./grades)")
    parser.add_argument("--cell-timeout", type=int, default=None, metavar="S",
                        help="seconds any cell may run before its kernel is killed (default: "
                        "each cell's own limit, 30 s + 10 x the time the solution takes there)")
    parser.add_argument("--notebook-timeout", type=int, default=1800, metavar="S",
                        help="seconds one notebook may run in all (default: 1800)")
    parser.add_argument("--student-timeout", type=int, default=3600, metavar="S",
                        help="seconds all of one student's notebooks may run (default: 3600)")
    parser.add_argument("--isolation", choices=LEVELS, default="auto",
                        help="sandbox of each graded kernel: bubblewrap (namespaces), process "
                        "(fallback), auto = bubblewrap where it works (default)")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="the grader's RNG seed for the checks' fresh inputs (default: drawn "
                        "anew and printed; the same seed draws the same inputs again)")
    parser.add_argument("--solutions", type=Path, default=None,
                        help="folder of solution notebooks (default: notebooks/solutions)")
    return parser


def _class_seed(given: int | None) -> int:
    return given if given is not None else int.from_bytes(os.urandom(8), "little") >> 1


def main(argv: list[str] | None = None) -> int:
    """``exercises grade``: grade, write the tables, say what was graded; 2 on a usage error."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        require_linux()       # before minutes of grading
        check_out(args.out)
        budget = Budget(cell=args.cell_timeout, notebook=args.notebook_timeout,
                        student=args.student_timeout, isolation=args.isolation,
                        seed=_class_seed(args.seed),
                        hidden=(args.out.resolve(),))
        rows, level, seconds = grade(args.submissions, args.solutions, args.notebook, budget)
        csv_path, md_path, answers_path = write_tables(rows, args.out, level, seconds,
                                                          budget.seed)
        review = write_review(rows, args.submissions, args.out, args.solutions)
    except (ExerciseError, SandboxError) as err:
        print(f"error: {shown(str(err))}", file=sys.stderr)
        return 2
    students = len({r.student for r in rows})
    auto = [r for r in rows if r.kind != BY_HAND]
    passed = sum(not r.message for r in auto)
    print(shown(f"{passed}/{len(auto)} checks passed for {students} student(s); wrote "
                f"{csv_path}, {md_path}, {answers_path} and {review}"))
    return 0
