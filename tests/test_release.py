"""The student edition (``exercises release``): the kit, the notebooks and the exercises, and
not one solution: no solution notebook, mutant or test, no solution region's text anywhere;
a leak refuses the release and writes nothing."""

import errno
import gzip
import io
import os
import re
import shutil
import tarfile
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from blockmem_lite.__main__ import main as cli_main
from blockmem_lite.tools import release
from blockmem_lite.tools.exercises import ExerciseError


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    out = tmp_path_factory.mktemp("edition") / "class"
    assert cli_main(["exercises", "release", str(out)]) == 0
    return out


def test_the_edition_holds_the_kit_the_notebooks_and_the_exercises(edition):
    root = release.repository_root()
    for rel in ("blockmem_lite/__init__.py", "pyproject.toml", "requirements.lock",
                "README.md", "STUDENT_EDITION.md"):
        assert (edition / rel).is_file(), rel
    for folder in ("notebooks", "notebooks/exercises"):
        names = sorted(p.name for p in (root / folder).glob("*.ipynb"))
        assert names and sorted(p.name for p in (edition / folder).glob("*.ipynb")) == names


def test_the_edition_holds_no_solution_mutant_or_test(edition):
    assert not (edition / "notebooks" / "solutions").exists()
    assert not (edition / "tests").exists()
    assert not [p for p in edition.rglob("*") if "mutant" in p.name or "solution" in p.name
                and p.suffix == ".ipynb"]
    texts = release.solution_texts(release.repository_root() / "notebooks" / "solutions")
    assert len(texts) > 50                           # the search has something to find
    assert release.leaks(edition, texts) == []


def test_the_notebooks_of_the_edition_carry_no_outputs(edition):
    for path in edition.rglob("*.ipynb"):
        nb = nbformat.read(str(path), as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), path


def _kit(root, leaked_into_main: str | None):
    """A small kit: one solution notebook (code and written answer), its exercise, and a main
    notebook that may hold a solution's text."""
    answer = "scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)"
    solution = new_notebook(cells=[
        new_code_cell(f"### BEGIN SOLUTION\n{answer}\n### END SOLUTION"),
        new_markdown_cell("<!-- BEGIN SOLUTION -->\nThe mask hides every later key.\n"
                          "<!-- END SOLUTION -->")])
    main = new_notebook(cells=[new_code_cell(leaked_into_main or "print('lesson')")])
    for rel, nb in (("notebooks/solutions/01_x.ipynb", solution),
                    ("notebooks/exercises/01_x.ipynb", new_notebook(cells=[new_code_cell("")])),
                    ("notebooks/01_x.ipynb", main)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(root / rel))
    (root / "tests" / "mutants").mkdir(parents=True)
    (root / "tests" / "mutants" / "01_x.py").write_text("MUTANTS = []\n")
    return answer


@pytest.mark.parametrize("leak", ["scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)",
                                  "# The mask   hides every later key.",
                                  "### BEGIN SOLUTION\nx = 1\n### END SOLUTION"])
def test_a_leaked_solution_refuses_the_release_and_writes_nothing(tmp_path, leak):
    _kit(tmp_path / "kit", leaked_into_main=leak)
    with pytest.raises(ExerciseError, match="would hold solutions, so nothing was written"):
        release.release(tmp_path / "out", root=tmp_path / "kit")
    assert not (tmp_path / "out").exists()


def test_a_clean_kit_is_released_without_its_solutions_and_mutants(tmp_path):
    _kit(tmp_path / "kit", leaked_into_main=None)
    written = release.release(tmp_path / "out", root=tmp_path / "kit")
    names = sorted(p.relative_to(tmp_path / "out").as_posix() for p in written)
    assert names == ["STUDENT_EDITION.md", "notebooks/01_x.ipynb",
                     "notebooks/exercises/01_x.ipynb"]


def test_a_folder_that_is_not_empty_is_refused(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    assert cli_main(["exercises", "release", str(tmp_path / "out")]) == 2
    assert "expected a new or empty folder" in capsys.readouterr().err


# --- the destination is checked before any work; a write error is one line ------------------


@pytest.fixture
def small_kit(tmp_path, monkeypatch):
    """The CLI releases a small kit (fast), and fails the test if any work starts."""
    _kit(tmp_path / "kit", leaked_into_main=None)
    monkeypatch.setattr(release, "repository_root", lambda: tmp_path / "kit")
    return tmp_path / "kit"


def _no_work(*_):
    raise AssertionError("the edition was staged before OUT was checked")


def test_an_out_below_a_file_is_refused_before_any_work(tmp_path, small_kit, monkeypatch,
                                                        capsys):
    (tmp_path / "afile").write_text("mine")
    monkeypatch.setattr(release, "solution_texts", _no_work)
    assert cli_main(["exercises", "release", str(tmp_path / "afile" / "sub")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: OUT=")
    assert "afile" in err and "not a folder" in err
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_destination_that_cannot_be_written_is_refused_before_any_work(
        tmp_path, small_kit, monkeypatch, capsys, code):
    locked = tmp_path / "locked"
    locked.mkdir()
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):       # root writes through chmod: simulate the refusal
        if Path(path).parent == locked:
            raise OSError(code, os.strerror(code), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(release, "solution_texts", _no_work)
    assert cli_main(["exercises", "release", str(locked / "class")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: OUT=")
    assert os.strerror(code) in err and "cannot be written" in err
    assert list(locked.iterdir()) == []


def test_a_write_error_while_copying_is_one_line_and_leaves_nothing_behind(
        tmp_path, small_kit, monkeypatch, capsys):
    def copy_then_fill_the_disk(src, dst, **kwargs):
        Path(dst, "README.md").write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(dst, "notebooks")))

    monkeypatch.setattr(shutil, "copytree", copy_then_fill_the_disk)
    out = tmp_path / "class"
    assert cli_main(["exercises", "release", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert os.strerror(errno.ENOSPC) in err and "class" in err
    assert not out.exists()                 # a rerun finds the folder as it was


# --- what the leak search cannot read is not shipped -------------------------------------------


def _tar_gz(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _zip(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize("name, pack", [
    ("data/backup.tar.gz", lambda text: _tar_gz("01_x.py", text.encode())),
    ("data/backup.zip", lambda text: _zip("01_x.py", text.encode())),
    ("data/notes.gz", lambda text: gzip.compress(text.encode())),
    ("data/notes.txt", lambda text: text.encode("utf-16")),         # text, but not UTF-8
])
def test_a_file_the_search_cannot_read_refuses_the_release(tmp_path, name, pack):
    answer = _kit(tmp_path / "kit", leaked_into_main=None)
    (tmp_path / "kit" / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kit" / name).write_bytes(pack(answer))
    with pytest.raises(ExerciseError, match=rf"{re.escape(name)}: not UTF-8 text"):
        release.release(tmp_path / "out", root=tmp_path / "kit")
    assert not (tmp_path / "out").exists()


def test_a_solution_in_a_notebooks_metadata_refuses_the_release(tmp_path):
    answer = _kit(tmp_path / "kit", leaked_into_main=None)
    path = tmp_path / "kit" / "notebooks" / "01_x.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.metadata["teacher_notes"] = answer
    nbformat.write(nb, str(path))
    with pytest.raises(ExerciseError, match="01_x.ipynb: the solution region"):
        release.release(tmp_path / "out", root=tmp_path / "kit")
