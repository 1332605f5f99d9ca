"""The kit a graded kernel imports: the student edition of the ``blockmem_lite`` package.

``stage_student_kit(dest)`` writes ``dest/blockmem_lite/``: the package's ``.py`` files and
the course files an installed wheel carries in ``blockmem_lite/_course/`` (the globs of
``course.PACKAGED_FILES``, which ``setup.py`` packs too), and nothing else of the
repository: no ``.git``, solutions, mutants or tests. Where the kit runs from an installed
wheel the package already is that edition, and it is copied the same way. Before it is
used, every staged file is searched for the text of every solution region and for the
solution markers (``tools/release.py``'s search); one found refuses the kit and removes it.

With ``dest`` first on ``PYTHONPATH``, ``import blockmem_lite`` finds this copy, and
``course.course_root()`` its ``_course`` (there is no ``pyproject.toml`` beside it).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from blockmem_lite import course
from blockmem_lite.tools.exercises import ExerciseError, solutions_dir
from blockmem_lite.tools.release import leaks, solution_texts

PACKAGE = course.PACKAGE                      # the package folder the kit is copied from
PACKAGE_NAME = PACKAGE.name
COURSE_FOLDER = "_course"                     # as in course.PACKAGED and setup.py


def stage_student_kit(dest: Path, solutions: Path | None = None) -> Path:
    """Write the student edition of the package into ``dest`` (new or empty) and return
    ``dest``, the folder to put on ``PYTHONPATH``. ``solutions``: the solution notebooks
    whose regions must not appear in it (default: the checkout's, where there is one)."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ExerciseError(f"dest={str(dest)!r} is not allowed: expected a new or empty folder")
    package = dest / PACKAGE_NAME
    for source, relative in _kit_files():
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    _readable_by_all(dest)
    problems = leaks(package, _texts(solutions))
    if problems:
        shutil.rmtree(package, ignore_errors=True)
        raise ExerciseError("the student kit would hold solutions, so it was removed:\n  "
                            + "\n  ".join(problems))
    return dest


def _kit_files() -> list[tuple[Path, Path]]:
    """(source, path inside the staged package) of every file of the student edition."""
    files = [(p, p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
             if "__pycache__" not in p.parts and COURSE_FOLDER not in p.relative_to(PACKAGE).parts]
    root = course.course_root()
    for pattern in course.PACKAGED_FILES:
        files += [(p, Path(COURSE_FOLDER) / p.relative_to(root)) for p in sorted(root.glob(pattern))]
    return files


def _readable_by_all(folder: Path) -> None:
    """Folders 0755 and files 0644, whatever the umask: the kernel may run as another user."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _texts(solutions: Path | None) -> list[str]:
    """The solution regions to search for; none where there are no solution notebooks (an
    installed wheel carries none)."""
    folder = Path(solutions) if solutions else solutions_dir()
    if not folder.is_dir():
        return []
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size)
                  for p in sorted(folder.glob("*.ipynb")))
    return list(_cached_texts(os.fspath(folder.resolve()), stamp))


@functools.lru_cache(maxsize=4)
def _cached_texts(folder: str, stamp: tuple) -> tuple[str, ...]:
    """``solution_texts`` once per folder and content (``stamp``): each graded notebook
    stages a kit, and reading the solutions takes a second."""
    return tuple(solution_texts(Path(folder)))
