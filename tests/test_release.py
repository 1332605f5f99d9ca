"""The student edition (``exercises release``): the kit, the notebooks and the exercises, and
not one solution: no solution notebook, mutant or test, no solution region's text anywhere;
a leak refuses the release and writes nothing."""

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
