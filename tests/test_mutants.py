"""Mutation teeth: every check cell of the solution notebooks rejects planted wrong answers.

The mutants live as data in ``tests/mutants/NN_topic.py``: ``MUTANTS`` maps the id of a check
cell to a list of ``(description, original, replacement)``; ``original`` is text that must occur
exactly once in the solution regions (``### BEGIN SOLUTION`` .. ``### END SOLUTION``) of the
code cells between the previous check cell and this one, the exercise that check judges.

A mutant may carry a fourth element, ``says``: phrases the check's message must contain, so
a check names the kind of bug (a causality leak, the part of a capstone, gamma's
stop-gradient), not only that values differ.

``CHEATS`` (same form) holds the cheating mutants: answers that pass without being the
learner's own (the kit's function reached by getattr, eval, a dict, a default argument, a copy
of its code; hard-coded results; the check helpers or the kernel's hooks tampered with). Each
check cell runs after the grader's reset (``tools.grading.RESET_BEFORE_A_CHECK``, sent as the grader sends it), as in
``exercises grade``, so a cheat is judged as a graded notebook would be.

``test_mutants_match_their_solutions`` (no kernel) fails on drift: an original no longer in its
exercise, an unknown check id, an exercise with fewer than ``MIN_MUTANTS`` mutants.

``test_checks_kill_every_mutant`` runs each covered solution notebook in ONE kernel (fast mode,
headless): the cells before an exercise run once; the exercise's span (its first solution cell
up to and including its check cell) runs with the solution (the check must pass), then once per
mutant with the mutant substituted (the check cell must fail with an assertion or a runtime
error, not a SyntaxError/NameError/..., which would be the mutant's fault, and no earlier cell
of the span may fail), then with the solution again (the check must pass again: no mutant left
state behind that changes the verdict). Then the exercise is put back unanswered (the names its
solution cells bind are forgotten and their stubs run), so every later cell runs as in a
student's Run All with this exercise not done: a later exercise or prose cell that needs this
answer fails the test (each exercise stands alone). The check's message is recorded for the summary
(``pytest -s`` prints every mutant; tests/conftest.py prints the table at the end).
"""

from __future__ import annotations

import copy
import re
import runpy
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from blockmem_lite import exercise_checks
from blockmem_lite.tools.exercises import (
    BEGIN,
    END,
    check_cell_indices,
    read_notebook,
    solutions_dir,
    stub_code,
)
from blockmem_lite.tools.grade_kernel import KernelLink, check_seed, run_graded_check
from blockmem_lite.tools.grading import RESET_TIMEOUT_S, _reset_kernel

MUTANTS_DIR = Path(__file__).parent / "mutants"
MIN_MUTANTS = 3
CELL_TIMEOUT = 240
# A check cell failing with one of these says the mutant is broken, not that the check has teeth.
MUTANT_FAULTS = {"SyntaxError", "IndentationError", "TabError", "NameError", "UnboundLocalError",
                 "NotImplementedError", "ImportError", "ModuleNotFoundError", "AttributeError",
                 "KeyboardInterrupt"}
# A cheat passes unless a check catches it: any other error means the cheat itself is broken.
CHECK_KINDS = {"CheckFailed", "AssertionError", "AnswerFailed"}
FAST_ENV = {"BLOCKMEM_FAST": "1", "BLOCKMEM_HEADLESS": "1", "PLOTLY_RENDERER": "json",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}


# --- exercises and mutants as data ----------------------------------------------------------


@dataclass
class Region:
    cell: int
    start: int      # offsets into the cell's source: the text between the marker lines
    end: int


@dataclass
class Exercise:
    check: int                      # index of the check cell
    check_id: str
    regions: list[Region] = field(default_factory=list)

    @property
    def first(self) -> int:
        return self.regions[0].cell if self.regions else self.check


@dataclass
class Mutant:
    description: str
    original: str
    replacement: str
    says: tuple[str, ...] = ()  # phrases the check's message must contain (the kind of bug)
    cheat: bool = False         # a cheating mutant (CHEATS), not an honest mistake (MUTANTS)


def _regions(source: str, cell: int) -> list[Region]:
    found, start, offset = [], None, 0
    for line in source.splitlines(keepends=True):
        if line.strip() == BEGIN:
            start = offset + len(line)
        elif line.strip() == END and start is not None:
            found.append(Region(cell, start, offset))
            start = None
        offset += len(line)
    return found


def exercises_of(nb) -> list[Exercise]:
    """One exercise per check cell: the solution regions of the code cells since the last one."""
    out, previous = [], -1
    for c in check_cell_indices(nb):
        ex = Exercise(c, nb.cells[c].get("id", f"cell-{c}"))
        for i in range(previous + 1, c):
            if nb.cells[i].cell_type == "code":
                ex.regions += _regions(nb.cells[i].source, i)
        out.append(ex)
        previous = c
    return out


def mutants_path(notebook: Path) -> Path:
    return MUTANTS_DIR / (notebook.stem + ".py")


def load_mutants(notebook: Path) -> dict[str, list[Mutant]]:
    """The honest mistakes (``MUTANTS``) then the cheats (``CHEATS``) of each check cell."""
    data = runpy.run_path(str(mutants_path(notebook)))
    found: dict[str, list[Mutant]] = {}
    for key, cheat in (("MUTANTS", False), ("CHEATS", True)):
        for check_id, mutants in data.get(key, {}).items():
            found.setdefault(check_id, []).extend(Mutant(*m, cheat=cheat) for m in mutants)
    return found


def locate(nb, ex: Exercise, original: str) -> list[tuple[int, int]]:
    """(cell, offset) of every occurrence of ``original`` inside the exercise's regions."""
    hits = []
    for r in ex.regions:
        text = nb.cells[r.cell].source
        for m in re.finditer(re.escape(original), text[r.start:r.end]):
            hits.append((r.cell, r.start + m.start()))
    return hits


def drift_problems(nb, mutants: dict[str, list[Mutant]], name: str) -> list[str]:
    problems = []
    by_id = {ex.check_id: ex for ex in exercises_of(nb)}
    for ex in by_id.values():
        honest = [m for m in mutants.get(ex.check_id, []) if not m.cheat]
        if ex.regions and len(honest) < MIN_MUTANTS:
            problems.append(f"{name}: check {ex.check_id} has {len(honest)} mutants, needs "
                            f"{MIN_MUTANTS}")
    for check_id, ms in mutants.items():
        ex = by_id.get(check_id)
        if ex is None or not ex.regions:
            problems.append(f"{name}: {check_id} is not a check cell with solution regions "
                            "before it")
            continue
        if len({m.description for m in ms}) != len(ms):
            problems.append(f"{name}: {check_id} has duplicate mutant descriptions")
        for m in ms:
            hits = len(locate(nb, ex, m.original))
            if hits != 1 or m.original == m.replacement:
                problems.append(f"{name}: {check_id} mutant {m.description!r}: original occurs "
                                f"{hits} times in the exercise's solution regions (needs 1)"
                                + (" and equals its replacement" if hits == 1 else ""))
    return problems


def mutate(nb, ex: Exercise, m: Mutant) -> dict[int, str]:
    """The mutated source of the one cell the mutant changes: {cell index: source}."""
    [(cell, offset)] = locate(nb, ex, m.original)
    src = nb.cells[cell].source
    return {cell: src[:offset] + m.replacement + src[offset + len(m.original):]}


COVERED = sorted(p for p in solutions_dir().glob("*.ipynb") if mutants_path(p).exists())
UNCOVERED = sorted(p.name for p in solutions_dir().glob("*.ipynb") if not mutants_path(p).exists())


def test_mutants_match_their_solutions():
    assert COVERED, "no tests/mutants/NN_topic.py"
    assert not [p for p in MUTANTS_DIR.glob("*.py")
                if not (solutions_dir() / (p.stem + ".ipynb")).exists()], \
        "a mutants file has no solution notebook"
    problems = []
    for path in COVERED:
        problems += drift_problems(read_notebook(path), load_mutants(path), path.name)
    assert problems == [], "\n".join(problems)


# --- running ---------------------------------------------------------------------------------


def _error(cell) -> tuple[str, str] | None:
    for o in cell.get("outputs", []):
        if o.output_type == "error":
            return o.ename, o.evalue
    return None


class _Kernel:
    """One kernel for one notebook; runs cells (copies, with an optional new source). A check
    cell whose grade_id has a registered check is judged as ``exercises grade`` judges it: the
    check runs in this process against the kernel's answers (``grade_kernel.run_graded_check``,
    seeded as for a student); any other check cell runs in the kernel after the grader's reset."""

    def __init__(self, client, check_cells: dict[int, str], work: Path):
        self.client = client
        self.check_cells = check_cells
        self.work = work
        self.graded = 0

    def run(self, nb, index: int, source: str | None = None):
        check = exercise_checks.find(self.check_cells.get(index, ""))
        if index in self.check_cells:   # the grader needs no reset; the harness cleans up with it
            assert _reset_kernel(self.client, RESET_TIMEOUT_S), "the grader's reset failed"
            self.client.timeout = CELL_TIMEOUT
        if check is not None:
            self.graded += 1
            link = KernelLink(self.client, self.work, CELL_TIMEOUT)
            failed = run_graded_check(check, link, check_seed(0, f"mutant {self.graded}",
                                                              check.grade_id))
            cell = copy.deepcopy(nb.cells[index])
            cell.outputs = [] if failed is None else [nbformat.v4.new_output(
                "error", ename=failed[0], evalue=failed[1], traceback=[])]
            return cell
        cell = copy.deepcopy(nb.cells[index])
        if source is not None:
            cell.source = source
        cell.outputs = []
        self.client.execute_cell(cell, index)
        return cell

    def run_span(self, nb, start: int, stop: int, sources: dict[int, str] | None = None):
        """Cells start..stop (inclusive); stops at the first error: (index, ename, evalue)."""
        for i in range(start, stop + 1):
            if nb.cells[i].cell_type != "code":
                continue
            err = _error(self.run(nb, i, (sources or {}).get(i)))
            if err:
                return (i, *err)
        return None

    def unanswer(self, nb, ex: Exercise) -> None:
        """Put the exercise back as the student gets it: forget every top-level name its solution
        cells bind, then run their stubbed versions (their NotImplementedError is expected)."""
        cells = sorted({r.cell for r in ex.regions})
        names = sorted(set().union(*(top_level_names(nb.cells[i].source) for i in cells)))
        forget = nbformat_cell(f"for _name in {names!r}:\n    globals().pop(_name, None)")
        self.client.execute_cell(forget, 0)
        for i in cells:
            self.run(nb, i, stub_code(nb.cells[i].source))


def nbformat_cell(source: str):
    from nbformat.v4 import new_code_cell

    return new_code_cell(source)


def top_level_names(source: str) -> set[str]:
    """Names a cell binds at module level: assignments, loop targets, defs, classes, imports."""
    import ast

    names = set()
    for stmt in ast.parse(source).body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
            continue
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
            continue
        stack = [stmt]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                     ast.Lambda)):
                stack.extend(ast.iter_child_nodes(node))
    return names


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if ln.strip()]
    return " / ".join(lines[:3])[:200]


def _grade_ids(nb) -> dict[int, str]:
    """Check cell index -> its grade_id."""
    return {i: nb.cells[i].metadata.get("nbgrader", {}).get("grade_id", nb.cells[i].get("id"))
            for i in check_cell_indices(nb)}


def run_mutants(path: Path, mutants: dict[str, list[Mutant]],
                work: Path) -> tuple[list[dict], list[str]]:
    """Rows (one per mutant) and problems for one solution notebook; ``work``: a folder for
    the kernel's replies to the graded checks."""
    from nbclient import NotebookClient

    nb = read_notebook(path)
    # the client writes each executed cell back into its notebook: give it a copy
    client = NotebookClient(copy.deepcopy(nb), timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True,
                            resources={"metadata": {"path": str(path.parent)}})
    rows, problems, done = [], [], -1
    with client.setup_kernel():
        kernel = _Kernel(client, _grade_ids(nb), work)
        for ex in exercises_of(nb):
            if not ex.regions:
                continue
            err = kernel.run_span(nb, done + 1, ex.first - 1)
            if err:
                problems.append(f"cell {err[0]} fails before {ex.check_id} with the exercises "
                                f"before it unanswered (as in a student's Run All), so it "
                                f"depends on an answer: {err[1]}: {_first_line(err[2])}")
                break
            if err := kernel.run_span(nb, ex.first, ex.check):
                problems.append(f"{ex.check_id}: the solution fails (cell {err[0]}): {err[1]}: "
                                f"{_first_line(err[2])}")
                break
            for m in mutants.get(ex.check_id, []):
                if len(locate(nb, ex, m.original)) != 1:
                    problems.append(f"{ex.check_id}: mutant {m.description!r} does not match its "
                                    "solution region once (see test_mutants_match_their_solutions)")
                    continue
                t0 = time.perf_counter()
                err = kernel.run_span(nb, ex.first, ex.check, mutate(nb, ex, m))
                row = {"notebook": path.stem[:2], "check": ex.check_id, "mutant": m.description,
                       "seconds": time.perf_counter() - t0, "cheat": m.cheat}
                if err is None:
                    row.update(verdict="SURVIVED", message="the check passed")
                    problems.append(f"{ex.check_id}: mutant survived: {m.description}")
                elif err[0] != ex.check:
                    row.update(verdict="INVALID", message=f"cell {err[0]}: {err[1]}")
                    problems.append(f"{ex.check_id}: mutant {m.description!r} fails in cell "
                                    f"{err[0]} before the check ({err[1]}: "
                                    f"{_first_line(err[2])}): fix the mutant")
                elif err[1] in MUTANT_FAULTS or m.cheat and err[1] not in CHECK_KINDS:
                    row.update(verdict="INVALID", message=f"{err[1]}: {_first_line(err[2])}")
                    problems.append(f"{ex.check_id}: mutant {m.description!r} raises {err[1]}: "
                                    "that is the mutant's fault, fix it")
                else:
                    row.update(verdict="killed", kind=err[1], message=_first_line(err[2]))
                    unsaid = [phrase for phrase in m.says if phrase not in err[2]]
                    if unsaid:
                        problems.append(f"{ex.check_id}: mutant {m.description!r} is killed, "
                                        f"but the message does not say {unsaid}: {err[2]}")
                rows.append(row)
            if err := kernel.run_span(nb, ex.first, ex.check):
                problems.append(f"{ex.check_id}: the solution fails after its mutants ran "
                                f"(state left behind?): {err[1]}: {_first_line(err[2])}")
                break
            kernel.unanswer(nb, ex)
            killed = sum(r["verdict"] == "killed" for r in rows
                         if r["check"] == ex.check_id and not r["cheat"])
            if killed < MIN_MUTANTS:
                problems.append(f"{ex.check_id}: only {killed} mutants killed, needs "
                                f"{MIN_MUTANTS}")
            done = ex.check
        else:   # the cells after the last check: the suite runs the solutions here, not in nbval
            if err := kernel.run_span(nb, done + 1, len(nb.cells) - 1):
                problems.append(f"cell {err[0]} after the last exercise fails with the "
                                f"exercises unanswered: {err[1]}: {_first_line(err[2])}")
    return rows, problems


@pytest.mark.parametrize("path", COVERED, ids=[p.stem[:2] for p in COVERED])
def test_checks_kill_every_mutant(path, monkeypatch, mutant_summary, request, tmp_path):
    if path.name.startswith("10_"):
        request.getfixturevalue("fast_reproduce")      # the lab run notebook 10 reads
    for key, value in FAST_ENV.items():
        monkeypatch.setenv(key, value)
    t0 = time.perf_counter()
    rows, problems = run_mutants(path, load_mutants(path), tmp_path)
    elapsed = time.perf_counter() - t0
    mutant_summary.append({"notebook": path.stem, "rows": rows, "seconds": elapsed,
                           "problems": problems})
    print(f"\n{path.name}: {len(rows)} mutants in {elapsed:.0f} s")
    for r in rows:
        print(f"  {r['check']:<9} {r['verdict']:<8} {r.get('kind', ''):<13} {r['mutant']}\n"
              f"  {'':<9} -> {r['message']}")
    assert problems == [], f"{path.name}:\n" + "\n".join(problems)


def test_harness_reports_survivors_and_broken_mutants(tmp_path, monkeypatch):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION"),
        new_code_cell("from blockmem_lite.checks import check_equal\n"
                      "check_equal(double(3), 6, 'double(3)')", metadata={"tags": ["check"]}),
    ])
    path = tmp_path / "99_toy.ipynb"
    nbformat.write(nb, str(path))
    nb = read_notebook(path)
    check_id = nb.cells[1].id
    mutants = {check_id: [Mutant("adds instead", "2 * x", "2 + x"),      # 2 + 3 != 6: killed
                          Mutant("same value", "2 * x", "x + x"),        # survives
                          Mutant("typo", "2 * x", "2 * y")]}             # NameError: invalid
    for key, value in FAST_ENV.items():
        monkeypatch.setenv(key, value)
    rows, problems = run_mutants(path, mutants, tmp_path)
    assert [r["verdict"] for r in rows] == ["killed", "SURVIVED", "INVALID"]
    assert rows[0]["kind"] == "CheckFailed" and "double(3)" in rows[0]["message"]
    assert any("survived: same value" in p for p in problems)
    assert any("raises NameError" in p for p in problems)
    assert any("only 1 mutants killed" in p for p in problems)
    assert drift_problems(nb, {check_id: mutants[check_id][:1] + [Mutant("gone", "3 * x", "x")]},
                          "99_toy.ipynb") == [
        f"99_toy.ipynb: check {check_id} has 2 mutants, needs 3",
        f"99_toy.ipynb: {check_id} mutant 'gone': original occurs 0 times in the exercise's "
        "solution regions (needs 1)"]


def test_harness_finds_an_exercise_that_needs_an_earlier_answer(tmp_path, monkeypatch):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    check = "from blockmem_lite.checks import check_equal\n"
    nb = new_notebook(cells=[
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION"),
        new_code_cell(check + "check_equal(double(3), 6, 'double(3)')", metadata={"tags": ["check"]}),
        new_code_cell("table = [double(i) for i in range(3)]"),      # prose that needs exercise 1
        new_code_cell("def triple(x):\n    ### BEGIN SOLUTION\n    return 3 * x\n"
                      "    ### END SOLUTION"),
        new_code_cell(check + "check_equal(triple(2), 6, 'triple(2)')", metadata={"tags": ["check"]}),
    ])
    path = tmp_path / "98_toy.ipynb"
    nbformat.write(nb, str(path))
    nb = read_notebook(path)
    assert top_level_names(nb.cells[0].source) == {"double"}
    for key, value in FAST_ENV.items():
        monkeypatch.setenv(key, value)
    _, problems = run_mutants(path, {}, tmp_path)
    needs = [p for p in problems if "depends on an answer" in p]
    assert len(needs) == 1 and needs[0].startswith("cell 2 fails before") \
        and "depends on an answer: NotImplementedError" in needs[0], problems
    nb.cells[2].source = "table = [2 * i for i in range(3)]"          # now it stands alone
    nbformat.write(nb, str(path))
    _, problems = run_mutants(path, {}, tmp_path)
    assert not any("depends on an answer" in p for p in problems), problems


def test_every_solution_notebook_has_mutants():
    """A new solution notebook needs its tests/mutants/NN_topic.py before it lands."""
    assert not UNCOVERED, "no mutants yet for: " + ", ".join(UNCOVERED)
