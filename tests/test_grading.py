"""Teacher grading: synthetic submissions of every kind graded to an exact table; the nbgrader
metadata of the solution notebooks (and the exercises built from them)."""

import copy
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from blockmem_lite.__main__ import main as cli_main
from blockmem_lite.tools import exercises, grade_kernel, grade_report, grading
from blockmem_lite.tools.exercises import (
    add_nbgrader_metadata,
    drift,
    make_exercise,
    read_notebook,
    solution_notebooks,
    solutions_dir,
)

NAME = "01_sums.ipynb"
SOLUTION_ADD = "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"
SOLUTION_Y = "### BEGIN SOLUTION\ny = 2 * 21\n### END SOLUTION"


def _solution():
    """Two independent exercises, no torch (each kernel starts in about a second)."""
    cells = [new_markdown_cell("# Sums"), new_code_cell("base = 40"), new_code_cell(SOLUTION_ADD),
             new_code_cell("assert add(base, 2) == 42, f'add: expected 42, got {add(base, 2)}'",
                           metadata={"tags": ["check"]}),
             new_code_cell(SOLUTION_Y),
             new_code_cell("assert y == 42, f'y: expected 42, got {y}'",
                           metadata={"tags": ["check"]})]
    for i, cell in enumerate(cells):
        cell.id = f"c{i}"
    return new_notebook(cells=cells)


def _answer(exercise, add="return a + b", y="y = 2 * 21"):
    """A student's copy of the exercise with both stubs filled in."""
    nb = copy.deepcopy(exercise)
    nb.cells[2].source = f"def add(a, b):\n    {add}"
    nb.cells[4].source = y
    return nb


def _write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def solutions(tmp_path):
    folder = tmp_path / "solutions"
    _write(_solution(), folder / NAME)
    return folder


def _submissions(root: Path) -> Path:
    exercise = make_exercise(_solution(), NAME)
    subs = root / "submitted"
    _write(_answer(exercise), subs / "alice" / NAME)
    _write(_answer(exercise, add="return a - b"), subs / "bob" / NAME)
    (subs / "carol").mkdir(parents=True)
    (subs / "carol" / NAME).write_text('{"cells": [', encoding="utf-8")
    looping = _answer(exercise)
    looping.cells[2].source = "while True:\n    pass"
    _write(looping, subs / "dave" / NAME)
    crashing = _answer(exercise)
    crashing.cells[1].source = "base = 40\n1 / 0"
    _write(crashing, subs / "erin" / NAME)
    deleted = _answer(exercise)   # an old exercise: no nbgrader metadata, matched by cell id
    for cell in deleted.cells:
        cell.metadata.pop("nbgrader", None)
    del deleted.cells[5]
    _write(deleted, subs / "frank" / NAME)
    renamed = _answer(exercise, y="y = 41")
    renamed.cells[3].id, renamed.cells[5].id = "moved-1", "moved-2"   # grade_id still matches
    renamed.cells[5].source = "pass  # the check, 'fixed' by the student"
    _write(renamed, subs / "grace" / "homework (1).ipynb")
    _write(new_notebook(cells=[new_code_cell("1")]), subs / "heidi" / "Untitled.ipynb")
    return subs


EXPECTED_CSV = """\
student,notebook,file,exercise,title,points,score,result,message
alice,01_sums,01_sums.ipynb,nb01-c3,Sums,1,1,passed,
alice,01_sums,01_sums.ipynb,nb01-c5,Sums,1,1,passed,
bob,01_sums,01_sums.ipynb,nb01-c3,Sums,1,0,failed,"AssertionError: add: expected 42, got 38"
bob,01_sums,01_sums.ipynb,nb01-c5,Sums,1,1,passed,
carol,01_sums,01_sums.ipynb,nb01-c3,Sums,1,0,failed,01_sums.ipynb is not a valid notebook: Expecting value: line 1 column 12 (char 11)
carol,01_sums,01_sums.ipynb,nb01-c5,Sums,1,0,failed,01_sums.ipynb is not a valid notebook: Expecting value: line 1 column 12 (char 11)
dave,01_sums,01_sums.ipynb,nb01-c3,Sums,1,0,failed,cell 2: timed out after 5 s; the kernel was killed
dave,01_sums,01_sums.ipynb,nb01-c5,Sums,1,1,passed,
erin,01_sums,01_sums.ipynb,nb01-c3,Sums,1,0,failed,setup cell 1 failed: ZeroDivisionError: division by zero; fix it first: the exercises after it need what it defines
erin,01_sums,01_sums.ipynb,nb01-c5,Sums,1,1,passed,
frank,01_sums,01_sums.ipynb,nb01-c3,Sums,1,1,passed,
frank,01_sums,01_sums.ipynb,nb01-c5,Sums,1,0,failed,check cell nb01-c5 is missing (deleted?): restore it from the exercise notebook
grace,01_sums,homework (1).ipynb,nb01-c3,Sums,1,1,passed,
grace,01_sums,homework (1).ipynb,nb01-c5,Sums,1,0,failed,"AssertionError: y: expected 42, got 41"
heidi,01_sums,,nb01-c3,Sums,1,0,failed,not submitted
heidi,01_sums,,nb01-c5,Sums,1,0,failed,not submitted
heidi,,Untitled.ipynb,,,,,failed,cannot tell which exercise this is: keep the NN_ prefix of the notebook handed out (renamed copies of it are recognised by its metadata)
"""


def test_grade_copes_with_every_kind_of_submission(tmp_path, solutions, capsys):
    subs, out = _submissions(tmp_path), tmp_path / "grades"
    assert cli_main(["exercises", "grade", str(subs), "--solutions", str(solutions),
                     "--out", str(out), "--cell-timeout", "5"]) == 0
    assert (out / "grades.csv").read_text() == EXPECTED_CSV
    md = (out / "grades.md").read_text()
    assert md.startswith("Graded in isolation level ")
    totals = md.split("## Totals (automatically graded points)\n\n")[1].split("\n\n")[0]
    assert [line.rsplit("|", 2)[0] for line in totals.splitlines()] == [
        "| student | 01_sums | total | of ", "|---|---|---|---", "| alice | 2 | 2 | 2 ",
        "| bob | 1 | 1 | 2 ", "| carol | 0 | 0 | 2 ", "| dave | 1 | 1 | 2 ", "| erin | 1 | 1 | 2 ",
        "| frank | 1 | 1 | 2 ", "| grace | 1 | 1 | 2 ", "| heidi | 0 | 0 | 2 "]
    rows = md.split("## Every exercise\n\n")[1].splitlines()[2:]
    assert len(rows) == len(EXPECTED_CSV.splitlines()) - 1
    printed = capsys.readouterr().out
    assert "graded dave/01_sums.ipynb as 01_sums: 1/2 passed" in printed   # the hang cost one
    assert "graded grace/homework (1).ipynb as 01_sums: 1/2 passed" in printed
    assert "7/17 checks passed for 8 student(s)" in printed


def test_markdown_escapes_pipes_and_messages_are_one_line():
    row = grade_report.Row("ann", "01_x", "01_x.ipynb", "nb01-c3", "CheckFailed: a | b; got 1",
                           "Exercise 1", 2)
    assert grade_report.to_markdown([row], "process").splitlines()[-1] == (
        "| ann | 01_x | 01_x.ipynb | nb01-c3 | Exercise 1 | 2 | 0 | failed | CheckFailed: a \\| b; "
        "got 1 |")
    assert grade_kernel.one_line("CheckFailed: y: not equal\n  expected 42\n  got      41") == \
        "CheckFailed: y: not equal; expected 42; got 41"


@pytest.mark.parametrize("argv, problem", [
    (["--notebook", "7"], "--notebook=7 is not allowed: expected one of 01"),
    (["--cell-timeout", "0"], "--cell-timeout=0 is not allowed: expected whole seconds >= 1"),
])
def test_bad_options_are_clear_errors(tmp_path, solutions, capsys, argv, problem):
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    assert grading.main([str(tmp_path / "subs"), "--solutions", str(solutions),
                         "--out", str(tmp_path / "g"), *argv]) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


def test_missing_submissions_folder_is_a_clear_error(tmp_path, solutions, capsys):
    assert grading.main([str(tmp_path / "nope"), "--solutions", str(solutions)]) == 2
    assert "is not allowed: expected a folder holding one folder per student" \
        in capsys.readouterr().err


# --- nbgrader metadata -------------------------------------------------------------------------


def test_exercise_and_solution_get_nbgrader_metadata(tmp_path, solutions):
    exercise = make_exercise(read_notebook(solutions / NAME), NAME)
    assert exercise.cells[3].metadata["nbgrader"] == {
        "grade": True, "grade_id": "nb01-c3", "locked": True, "points": 1, "schema_version": 3,
        "solution": False, "task": False}
    assert exercise.cells[2].metadata["nbgrader"] == {
        "grade": False, "grade_id": "nb01-c2", "locked": False, "schema_version": 3,
        "solution": True, "task": False}
    assert "nbgrader" not in exercise.cells[1].metadata
    out = tmp_path / "exercises"
    assert drift(solutions, out)[0] == f"solution lacks nbgrader metadata: {solutions / NAME}"
    exercises.build(solutions, out)
    assert read_notebook(solutions / NAME).cells[3].metadata["nbgrader"]["grade_id"] == "nb01-c3"
    assert drift(solutions, out) == []


def test_existing_grade_ids_and_points_are_kept_and_copies_get_new_ones():
    nb = _solution()
    add_nbgrader_metadata(nb, NAME)
    nb.cells[3].metadata["nbgrader"].update(grade_id="add-check", points=3)
    nb.cells.append(copy.deepcopy(nb.cells[3]))   # Jupyter's copy keeps the metadata
    nb.cells[-1].id = "c6"
    assert add_nbgrader_metadata(nb, NAME)
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]
    assert ids == ["nb01-c2", "add-check", "nb01-c4", "nb01-c5", "nb01-c6"]
    assert nb.cells[3].metadata["nbgrader"]["points"] == 3
    assert not add_nbgrader_metadata(nb, NAME)


NBGRADER_KEYS = {"grade", "grade_id", "locked", "schema_version", "solution", "task"}


def _nbgrader_problems(path: Path) -> list[str]:
    """nbgrader's own rules (schema 3) plus ours: check cells are locked grade cells."""
    problems = []
    for i, cell in enumerate(read_notebook(path).cells):
        meta = cell.metadata.get("nbgrader")
        is_check = exercises.CHECK_TAG in cell.metadata.get("tags", [])
        if meta is None:
            problems += [f"cell {i} is a check cell without nbgrader metadata"] if is_check else []
            continue
        expected_keys = NBGRADER_KEYS | ({"points"} if meta.get("grade") else set())
        if set(meta) != expected_keys or meta["schema_version"] != 3 or meta["task"]:
            problems.append(f"cell {i}: nbgrader metadata {meta} is not schema 3")
        if not re.fullmatch(r"[a-zA-Z0-9_-]+", str(meta.get("grade_id"))):
            problems.append(f"cell {i}: grade_id {meta.get('grade_id')!r} is not valid")
        if is_check and not (meta.get("grade") and meta.get("locked") and meta.get("points", 0) > 0
                             and not meta.get("solution")):
            problems.append(f"cell {i}: a check cell must be a locked grade cell with points")
        if cell.cell_type == "markdown" and not (meta.get("grade") and meta.get("solution")):
            problems.append(f"cell {i}: a markdown answer must be grade and solution")
    return problems


@pytest.mark.parametrize("path", solution_notebooks(solutions_dir()), ids=lambda p: p.stem)
def test_solution_notebooks_carry_valid_nbgrader_metadata(path):
    assert _nbgrader_problems(path) == []
    assert not add_nbgrader_metadata(read_notebook(path), path.name), \
        "run `python -m blockmem_lite exercises build`"


def test_grade_ids_of_the_solution_notebooks_are_unique():
    ids = [c.metadata["nbgrader"]["grade_id"] for path in solution_notebooks(solutions_dir())
           for c in read_notebook(path).cells if "nbgrader" in c.metadata]
    assert ids and len(ids) == len(set(ids))


def test_a_student_folder_named_in_bytes_that_are_not_utf8_is_graded(tmp_path, solutions,
                                                                     capsys):
    """An unzipped Windows archive gives folder names like b'caf\\xe9': graded, printed and
    written as they are, and the previous grades are replaced only by complete new ones."""
    name = os.fsdecode(b"caf\xe9")
    _write(_answer(make_exercise(_solution(), NAME)), tmp_path / "subs" / name / NAME)
    out = tmp_path / "grades"
    out.mkdir()
    (out / "grades.csv").write_text("the previous grades\n")
    assert grading.main([str(tmp_path / "subs"), "--solutions", str(solutions), "--out",
                         str(out)]) == 0
    written = (out / "grades.csv").read_bytes()
    assert written.count(b"caf\xe9,01_sums") == 2 and b"passed" in written
    assert "2/2 checks passed for 1 student(s)" in capsys.readouterr().out


def _titled_solution():
    """Two exercises with titles (one worth 2 points), a setup cell, and a written answer."""
    cells = [new_markdown_cell("# Sums"), new_code_cell("base = 40"),
             new_markdown_cell("## Exercise 1 · Add two numbers"), new_code_cell(SOLUTION_ADD),
             new_code_cell("assert add(base, 2) == 42", metadata={"tags": ["check"],
                                                                  "nbgrader": {"points": 2}}),
             new_markdown_cell("## Exercise 2 · Two more"),
             new_code_cell("### BEGIN SOLUTION\ny = base + 2\n### END SOLUTION"),
             new_code_cell("assert y == 42", metadata={"tags": ["check"]}),
             new_markdown_cell("**Explain:** why 42?\n<!-- BEGIN SOLUTION -->\nIt is the answer."
                               "\n<!-- END SOLUTION -->")]
    for i, cell in enumerate(cells):
        cell.id = f"t{i}"
    return new_notebook(cells=cells)


def test_the_tables_give_titles_points_totals_written_answers_and_the_root_cause_once(tmp_path):
    solutions = tmp_path / "solutions"
    _write(_titled_solution(), solutions / NAME)
    exercise = make_exercise(_titled_solution(), NAME)
    broken = copy.deepcopy(exercise)                 # the setup cell fails: both checks too
    broken.cells[1].source = "base = fourty"
    broken.cells[3].source = "def add(a, b):\n    return a + b"
    broken.cells[6].source = "y = base + 2"
    broken.cells[8].source = broken.cells[8].source + "\nBecause it is 40 + 2."
    _write(broken, tmp_path / "subs" / "sue" / NAME)
    assert grading.main([str(tmp_path / "subs"), "--solutions", str(solutions), "--out",
                         str(tmp_path / "grades")]) == 0
    out = tmp_path / "grades"
    lines = (out / "grades.csv").read_text().splitlines()
    assert lines[1:] == [
        "sue,01_sums,01_sums.ipynb,nb01-t4,Exercise 1 · Add two numbers,2,0,failed,setup cell 1 "
        "failed: NameError: name 'fourty' is not defined; fix it first: the exercises after it "
        "need what it defines",
        "sue,01_sums,01_sums.ipynb,nb01-t7,Exercise 2 · Two more,1,0,failed,setup cell 1 failed "
        "(see nb01-t4); here: cell 6: NameError: name 'base' is not defined",
        "sue,01_sums,01_sums.ipynb,nb01-t8,Exercise 2 · Two more,1,,by hand,"]
    assert "| sue | 0 | 0 | 3 |" in (out / "grades.md").read_text()
    answers = (out / "written_answers.md").read_text()
    assert "## 01_sums · Exercise 2 · Two more (1 point(s), nb01-t8)" in answers
    assert "### sue\n\n> Because it is 40 + 2.\n" in answers and "why 42" not in answers
