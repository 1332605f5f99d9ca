"""The student edition: ``python -m blockmem_lite exercises release OUT``.

The repository a teacher clones holds the worked answers (``notebooks/solutions/``) and the
planted mistakes that test the checks (``tests/mutants/``). A class gets this edition
instead: the kit, the main notebooks, the exercise notebooks (outputs cleared), the data
and the docs, and no solution, mutant or test. OUT is checked first (a new or empty folder
that can be written). Before the edition is written out, every file is searched for the text
of every solution region (code and written answers) and for the solution markers; one
found, or a file that is not UTF-8 text (an archive, compressed or binary data: the search
cannot read it), refuses the release and leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from blockmem_lite.__main__ import program
from blockmem_lite.tools.exercises import (
    BEGIN,
    END,
    MD_BEGIN,
    MD_END,
    ExerciseError,
    clear_outputs,
    notebooks_dir,
    read_notebook,
    solution_notebooks,
    write_notebook,
)

# Folders left out, relative to the repository: the answers, the tests (the mutants and
# the checks of the answers live there), CI, and what runs write.
LEFT_OUT = ("notebooks/solutions", "tests", ".ci", "runs", "site", "grades", ".venv")
SKIPPED_PARTS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache", ".git"}
MIN_REGION_CHARS = 12          # shorter answers (``y = 42``) are too common to search for
NOTICE = """\
# blockmem_lite, student edition

This is the kit without its worked answers. Start with `make lab` (or the commands
without make in docs/INSTALL.md), open `notebooks/`, and do the exercises in
`notebooks/exercises/`: each check cell tells you what is right and what is not. Your
teacher holds the solutions and grades with `python -m blockmem_lite exercises grade`. The
README's `make test` needs the teacher's repository (its tests and solutions are not part
of this edition).
"""


def repository_root() -> Path:
    return notebooks_dir().parent


def release_files(root: Path) -> list[Path]:
    """The files of the edition, relative to ``root``: git's tracked files where ``root`` is a
    checkout (nothing untracked or ignored), else every file; minus ``LEFT_OUT``."""
    if (root / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=True,
                                capture_output=True).stdout.decode("utf-8", "surrogateescape")
        files = [Path(p) for p in listed.split("\0") if p]
    else:
        files = [p.relative_to(root) for p in root.rglob("*") if p.is_file()]
    return sorted(p for p in files
                  if not any(p.as_posix() == d or p.as_posix().startswith(d + "/")
                             for d in LEFT_OUT)
                  and not SKIPPED_PARTS & set(p.parts) and (root / p).is_file())


def solution_texts(solutions: Path) -> list[str]:
    """The text of every solution region of the solution notebooks (code and written
    answers), each whitespace-normalised; the short ones are left out (see above)."""
    texts = []
    for path in solution_notebooks(solutions):
        for cell in read_notebook(path).cells:
            begin, end = (BEGIN, END) if cell.cell_type == "code" else (MD_BEGIN, MD_END)
            for region in _regions(cell.source, begin, end):
                text = " ".join(region.split())
                if len(text) >= MIN_REGION_CHARS:
                    texts.append(text)
    return texts


def _regions(source: str, begin: str, end: str) -> list[str]:
    out, inside = [], None
    for line in source.splitlines():
        if line.strip() == begin:
            inside = []
        elif line.strip() == end and inside is not None:
            out.append("\n".join(inside))
            inside = None
        elif inside is not None:
            inside.append(line)
    return out


def _strings(value) -> list[str]:
    """Every string of a parsed JSON value (a notebook's sources, metadata and outputs)."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [text for item in items for text in _strings(item)]


def leaks(folder: Path, texts: list[str]) -> list[str]:
    """'file: what' for each file of ``folder`` holding a solution marker or region, or that
    is not UTF-8 text (an archive or other bytes the search cannot read)."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        where = path.relative_to(folder).as_posix()
        try:
            raw = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            found.append(f"{where}: not UTF-8 text (an archive, compressed or binary data, or "
                         "another encoding): the search for solutions cannot read it")
            continue
        content = raw
        if path.suffix == ".ipynb":                    # every text of it, not JSON escapes
            content = "\n".join(_strings(json.loads(raw)))
        flat = " ".join(content.split())
        if path.suffix == ".ipynb":                    # a region left in a cell
            marked = {line.strip() for line in content.splitlines()} & {BEGIN, MD_BEGIN}
            found += [f"{where}: a solution marker {marker!r}" for marker in sorted(marked)]
        found += [f"{where}: the solution region {text[:60]!r}..." for text in texts if text in flat]
    return found


def release(out: Path, root: Path | None = None) -> list[Path]:
    """Write the student edition into ``out`` (new or empty); return the files written."""
    root = Path(root) if root else repository_root()
    out = Path(out)
    _check_destination(out)
    if not (root / "notebooks" / "exercises").is_dir():
        raise ExerciseError(f"{root} holds no notebooks/exercises: release from the kit's "
                            "repository (a source checkout)")
    texts = solution_texts(root / "notebooks" / "solutions")
    files = release_files(root)
    with tempfile.TemporaryDirectory(prefix="blockmem-release-") as staging:
        stage = Path(staging) / "edition"
        for rel in files:
            target = stage / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if rel.suffix == ".ipynb":                 # the working copy may hold outputs
                nb = read_notebook(root / rel)
                clear_outputs(nb)
                write_notebook(nb, target)
            else:
                shutil.copy2(root / rel, target)
        (stage / "STUDENT_EDITION.md").write_text(NOTICE, encoding="utf-8")
        problems = leaks(stage, texts)
        if problems:
            raise ExerciseError("the student edition would hold solutions, so nothing was "
                                "written:\n  " + "\n  ".join(problems))
        _write_out(stage, out)
    return [out / rel for rel in [*files, Path("STUDENT_EDITION.md")]]


def _check_destination(out: Path) -> None:
    """Refuse, before any work, an OUT that cannot become the edition's folder: one that is
    not a new or empty folder, lies below a file, or lies in a folder that cannot be written."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExerciseError(f"OUT={out} is not allowed: expected a new or empty folder")
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise ExerciseError(f"OUT={out} is not allowed: {existing} is a file, not a folder; "
                            "expected a new or empty folder")
    try:                                               # what writing OUT will do first
        os.rmdir(tempfile.mkdtemp(prefix=".blockmem-release-probe-", dir=existing))
    except OSError as err:
        raise ExerciseError(f"OUT={out} is not allowed: {existing} cannot be written "
                            f"({err.strerror or err}); pass a folder you can write to") from err


def _write_out(stage: Path, out: Path) -> None:
    """Copy the staged edition into ``out`` (new or empty); on an error remove what was
    copied, so a rerun finds ``out`` as it was."""
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(stage, out, dirs_exist_ok=True)
    except OSError:
        for child in ([out] if made else list(out.iterdir())):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"{program()} exercises release",
                                     description="Write the student edition: the kit, the "
                                     "notebooks and the exercises, without solutions, mutants "
                                     "or tests.")
    parser.add_argument("out", type=Path, help="a new or empty folder")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        written = release(args.out)
    except ExerciseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        print(f"error: OUT={args.out}: the student edition could not be written: "
              f"{err.strerror or err}{where}", file=sys.stderr)
        return 2
    print(f"wrote the student edition: {len(written)} files in {args.out} (no solutions, "
          "mutants or tests); give this folder, not the repository, to the class")
    return 0
