"""The grade tables of ``exercises grade``: what a teacher reads and imports.

- ``grades.csv``: one row per student and exercise: student, notebook, file, exercise
  (grade_id), title, points, score, result (passed | failed | by hand), message.
- ``grades.md``: the isolation level used, then per student the score of each notebook, the
  total, the points possible and the time grading took; then every row.
- ``written_answers.md``: each written ("Explain") answer, question by question, for
  grading by hand (their points are not in the totals).

Each file is replaced whole (written beside it, then renamed), so an interrupted or failed
run never leaves a half-written table over the last good one; any file name is written.

Every cell is text a student may have chosen (a folder name, a file name, what their code
raised), so each is written safely (``cell_text``): on one line, at most ``CELL_CHARS``
characters, never read by a spreadsheet as a formula, and in grades.md never able to break
its row or hide the rows after it (``|``, ``\\``, ``<`` and ``[`` escaped). Names that look
alike but differ (José typed composed and decomposed) are told apart (``told_apart``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re
import stat
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from blockmem_lite.tools.exercises import ExerciseError
from blockmem_lite.tools.sandbox import describe

COLUMNS = ("student", "notebook", "file", "exercise", "title", "points", "score", "result",
           "message")
BY_HAND = "by hand"
CELL_CHARS = 500        # the most characters of a table cell; "…" marks a cut
ANSWER_CHARS = 5000     # the most characters of a written answer in written_answers.md
FORMULA_START = ("=", "+", "-", "@")     # what a spreadsheet reads as a formula (OWASP)
# control characters, line and paragraph separators, and bidirectional overrides
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_MARKDOWN = str.maketrans({"\\": "\\\\", "|": "\\|", "<": "\\<", "[": "\\["})


@dataclass(frozen=True)
class Row:
    """One student's result on one exercise (``kind`` "auto": a check cell; ``BY_HAND``: a
    written answer, its text in ``answer``)."""

    student: str
    notebook: str
    file: str
    exercise: str
    message: str = ""          # empty when passed (auto rows)
    title: str = ""
    points: float = 0
    kind: str = "auto"
    answer: str = ""

    @property
    def result(self) -> str:
        if self.kind == BY_HAND:
            return BY_HAND
        return "failed" if self.message else "passed"

    @property
    def score(self) -> float | None:
        """Points earned; None for a written answer (a teacher grades it)."""
        if self.kind == BY_HAND:
            return None
        return self.points if self.result == "passed" else 0

    def values(self) -> tuple[str, ...]:
        return (self.student, self.notebook, self.file, self.exercise, self.title,
                _number(self.points) if self.exercise else "",
                "" if self.score is None or not self.exercise else _number(self.score),
                self.result, self.message)


def _number(value: float) -> str:
    return f"{value:g}"


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last of them "…" where it was cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def visible(text: str) -> str:
    """``text`` on one line as it prints: control characters, line separators and
    bidirectional overrides written as escapes (``\\n``, ``\\x1b``, ``\\u202e``)."""
    return _UNPRINTABLE.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def cell_text(value: str) -> str:
    """A cell of either table: one line, at most ``CELL_CHARS`` characters, and a text that
    starts with = + - @ (blanks before them allowed), a tab or a CR behind a single quote,
    so a spreadsheet shows it as text and never runs it as a formula."""
    text = shorten(visible(shorten(value, CELL_CHARS)), CELL_CHARS)
    formula = value.startswith(("\t", "\r")) or value.lstrip().startswith(FORMULA_START)
    return "'" + text if formula else text


def _md_cell(value) -> str:
    return cell_text(str(value)).translate(_MARKDOWN)


def to_csv(rows: list[Row]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows([cell_text(v) for v in r.values()] for r in rows)
    return buffer.getvalue()


def _md_line(values) -> str:
    return "| " + " | ".join(_md_cell(v) for v in values) + " |"


def totals_table(rows: list[Row], seconds: dict[str, float]) -> str:
    """Per student: the score of each notebook (auto-graded points), total, possible, time."""
    notebooks = sorted({r.notebook for r in rows if r.notebook})
    header = ["student", *notebooks, "total", "of", "time"]
    lines = [_md_line(header), "|" + "---|" * len(header)]
    for student in dict.fromkeys(r.student for r in rows):
        mine = [r for r in rows if r.student == student and r.kind != BY_HAND and r.exercise]
        cells = [_number(sum(r.score for r in mine if r.notebook == nb)) for nb in notebooks]
        total, possible = sum(r.score for r in mine), sum(r.points for r in mine)
        lines.append(_md_line([student, *cells, _number(total), _number(possible),
                               f"{seconds.get(student, 0):.0f} s"]))
    return "\n".join(lines)


def to_markdown(rows: list[Row], level: str, seconds: dict[str, float] | None = None,
                seed: int | None = None) -> str:
    by_hand = sum(r.kind == BY_HAND for r in rows)
    drawn = [] if seed is None else [
        f"The checks' fresh inputs were drawn by the grader with seed {seed}, one stream per "
        f"student and check: `--seed {seed}` draws the same inputs again.", ""]
    parts = [f"Graded in isolation level {describe(level)}.", "", *drawn,
             "## Totals (automatically graded points)", "", totals_table(rows, seconds or {}),
             "", f"{by_hand} written answer(s) to grade by hand: written_answers.md." if by_hand
             else "No written answers.", "", "## Every exercise", "", _md_line(COLUMNS),
             "|" + "---|" * len(COLUMNS), *(_md_line(r.values()) for r in rows)]
    return "\n".join(parts) + "\n"


def written_answers(rows: list[Row]) -> str:
    """The written answers, question by question, each student's text quoted."""
    out = ["# Written answers, to grade by hand", ""]
    questions = dict.fromkeys((r.notebook, r.exercise, r.title, r.points)
                              for r in rows if r.kind == BY_HAND)
    for notebook, exercise, title, points in questions:
        out += [f"## {_md_cell(notebook)} · {_md_cell(title or exercise)} "
                f"({_number(points)} point(s), {_md_cell(exercise)})", ""]
        for r in rows:
            if r.kind == BY_HAND and (r.notebook, r.exercise) == (notebook, exercise):
                text = shorten(r.answer.strip(), ANSWER_CHARS) or "(no answer written)"
                out += [f"### {_md_cell(r.student)}", "", *map(_quoted, text.splitlines()), ""]
    return "\n".join(out) + "\n"


def _quoted(line: str) -> str:
    """A line of a written answer as a quote: its Markdown kept, but no HTML (a ``<!--``
    would hide the answers after it) and no control characters."""
    return "> " + visible(line).replace("<", "\\<")


def told_apart(rows: list[Row], seconds: dict[str, float]) -> tuple[list[Row], dict]:
    """Rows and seconds with each student name that looks like another but differs from it
    (equal after Unicode NFKC, zero-width characters dropped: "José" composed and
    decomposed) followed by its code points in parentheses: both show, told apart."""
    names = dict.fromkeys(r.student for r in rows)
    looks = Counter(_looks(name) for name in names)
    label = {name: f"{name} ({name.encode('ascii', 'backslashreplace').decode('ascii')})"
             if looks[_looks(name)] > 1 else name for name in names}
    return ([dataclasses.replace(r, student=label[r.student]) for r in rows],
            {label.get(name, name): s for name, s in seconds.items()})


def _looks(name: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKC", name)
                   if unicodedata.category(c) != "Cf")


def check_out(out: Path) -> None:
    if Path(out).exists() and not Path(out).is_dir():
        raise ExerciseError(f"--out={out} is not allowed: expected a folder for grades.csv and "
                            "grades.md")


def write_tables(rows: list[Row], out: Path, level: str,
                 seconds: dict[str, float] | None = None, seed: int | None = None
                 ) -> tuple[Path, ...]:
    """Write grades.csv, grades.md and written_answers.md into ``out``; return their paths."""
    out = Path(out)
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, seconds = told_apart(rows, seconds or {})
    texts = {"grades.csv": to_csv(rows), "grades.md": to_markdown(rows, level, seconds, seed),
             "written_answers.md": written_answers(rows)}
    for name, text in texts.items():
        replace_whole(out / name, text)
    return tuple(out / name for name in texts)


def replace_whole(path: Path, text: str) -> None:
    """Write ``text`` beside ``path``, then rename it over ``path``: never half written."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8", errors="surrogateescape")
    os.replace(partial, path)


# --- what may be read -----------------------------------------------------------------------
ALLOWED = "only folders and regular files inside the submissions folder are graded"


def shown(name: str) -> str:
    """A file or folder name as one line any terminal prints: bytes that are not UTF-8 (kept
    by the file system as surrogates) become U+FFFD, control characters escapes (``\\n``)."""
    return visible(name.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))


def refusal(path: Path, root: Path) -> str | None:
    """Why ``path``, a student's folder or notebook below the submissions folder ``root``, is
    refused unread: a symlink on the way to it (so no path leads outside ``root``), or not a
    folder nor a regular file (a FIFO, a device, a socket). None when it may be read."""
    here, mode = Path(root), None
    for part in path.relative_to(root).parts:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except OSError as err:
            return f"refused: {_below(here, root)} cannot be examined ({err.strerror})"
        if stat.S_ISLNK(mode):
            return f"refused: {_below(here, root)} is a symlink (not followed): {ALLOWED}"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = {"p": "a FIFO", "c": "a device", "b": "a device", "s": "a socket"}
        return (f"refused: {_below(path, root)} is not a regular file "
                f"({kind.get(stat.filemode(mode)[0], 'a special file')}): {ALLOWED}")
    return None


def _below(path: Path, root: Path) -> str:
    return shown(path.relative_to(root).as_posix())
