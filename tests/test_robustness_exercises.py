"""Exercise builder robustness: it never overwrites or deletes notebooks it did not generate,
and malformed notebooks give one line naming the file and the problem (exit 2)."""

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from blockmem_lite.tools import exercises
from blockmem_lite.tools.exercises import build, drift, read_notebook

SOLUTION = "x = 1\n### BEGIN SOLUTION\ny = x + 1\n### END SOLUTION\nprint(y)"


def _solution():
    return new_notebook(cells=[new_markdown_cell("# Title"),
                               new_code_cell(SOLUTION, metadata={"tags": ["check"]})])


def _write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _cli(*argv) -> int:
    return exercises.main([str(a) for a in argv])


@pytest.fixture
def repo(tmp_path):
    """notebooks/ with a main notebook, solutions/ and a built exercises/."""
    root = tmp_path / "notebooks"
    _write(new_notebook(cells=[new_markdown_cell("welcome")]), root / "00_welcome.ipynb")
    _write(_solution(), root / "01_x.ipynb")
    for name in ("01_x.ipynb", "02_y.ipynb"):
        _write(_solution(), root / "solutions" / name)
    build(root / "solutions", root / "exercises")
    return root


# --- finding 5: build never destroys notebooks ------------------------------------------------


@pytest.mark.parametrize("out", ["solutions", "solutions/../solutions", "link"])
def test_build_refuses_the_solutions_folder(repo, out, capsys, monkeypatch):
    os.symlink(repo / "solutions", repo / "link")
    monkeypatch.chdir(repo)
    before = _snapshot(repo)
    assert _cli("build", "--solutions", "solutions", "--out", out) == 2
    err = capsys.readouterr().err
    assert "is the solutions folder" in err and "overwrite the solutions" in err
    assert _snapshot(repo) == before


@pytest.mark.parametrize("prune", [False, True])
def test_build_refuses_a_folder_with_notebooks_it_did_not_generate(repo, prune, capsys):
    before = _snapshot(repo)
    argv = ["build", "--solutions", repo / "solutions", "--out", repo] + ["--prune"] * prune
    assert _cli(*argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2 notebook(s) that exercises build did not generate " \
        "(00_welcome.ipynb, 01_x.ipynb)" in err
    assert _snapshot(repo) == before


def test_build_refuses_an_out_that_is_a_file(repo, capsys):
    assert _cli("build", "--solutions", repo / "solutions", "--out", repo / "01_x.ipynb") == 2
    assert "is not a folder" in capsys.readouterr().err


def test_generated_notebooks_carry_a_deterministic_mark_and_prune_deletes_only_those(repo):
    out = repo / "exercises"
    mark = read_notebook(out / "01_x.ipynb").metadata["blockmem_lite"]
    assert mark["generated_from"] == "solutions/01_x.ipynb"
    (repo / "solutions" / "02_y.ipynb").unlink()
    build(repo / "solutions", out, prune=True)
    assert sorted(p.name for p in out.iterdir()) == ["01_x.ipynb"]
    assert drift(repo / "solutions", out) == []

    _write(_solution(), out / "03_mine.ipynb")                # a hand-made notebook
    assert exercises.main(["build", "--solutions", str(repo / "solutions"), "--out", str(out),
                           "--prune"]) == 2
    assert (out / "03_mine.ipynb").exists()


# --- finding 18: malformed notebooks ----------------------------------------------------------


def _v4() -> dict:
    return json.loads(nbformat.writes(_solution()))


def _without(key: str) -> dict:
    return {k: v for k, v in _v4().items() if k != key}


def _null_source() -> dict:
    raw = _v4()
    raw["cells"][1]["source"] = None
    return raw


MALFORMED = {
    "a JSON list": (b"[1, 2]", "expected a JSON object with 'cells' and 'metadata', got a JSON "
                               "list"),
    "empty object": (b"{}", "nbformat=None is not supported"),
    "no cells": (json.dumps(_without("cells")).encode(), "expected 'cells' to be a list"),
    "cells not objects": (json.dumps({**_v4(), "cells": [3]}).encode(),
                          "expected 'cells' to be a list of cell objects, got [3]"),
    "no metadata": (json.dumps(_without("metadata")).encode(), "'metadata' is a required"),
    "source null": (json.dumps(_null_source()).encode(), "(at cells[1].source)"),
    "latin-1": (json.dumps({**_v4(), "metadata": {"author": "Zoë"}}, ensure_ascii=False)
                .encode("latin-1"), "is not UTF-8 (byte 0xeb"),
    "not JSON": (b"{oops", "is not a valid notebook: Expecting property name"),
    "nbformat 5": (json.dumps({**_v4(), "nbformat": 5}).encode(), "nbformat=5 is not supported"),
}


@pytest.mark.parametrize("command", ["build", "check", "strip"])
@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_malformed_notebook_is_one_line_naming_the_file(tmp_path, case, command, capsys):
    data, problem = MALFORMED[case]
    bad = tmp_path / "solutions" / "01_bad.ipynb"
    bad.parent.mkdir()
    bad.write_bytes(data)
    argv = [command, bad] if command == "strip" else \
        [command, "--solutions", bad.parent, "--out", tmp_path / "out"]
    assert _cli(*argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad} ")
    assert problem in err
    assert bad.read_bytes() == data and not (tmp_path / "out").exists()


def test_malformed_exercise_in_out_is_refused_not_overwritten(repo, capsys):
    target = repo / "exercises" / "01_x.ipynb"
    target.write_bytes(b"[]")
    assert _cli("build", "--solutions", repo / "solutions", "--out", repo / "exercises") == 2
    assert "did not generate (01_x.ipynb)" in capsys.readouterr().err
    assert target.read_bytes() == b"[]"
    assert _cli("check", "--solutions", repo / "solutions", "--out", repo / "exercises") == 2
    assert f"error: {target} is not a valid notebook" in capsys.readouterr().err


V3 = {"nbformat": 3, "nbformat_minor": 0, "metadata": {"name": ""}, "worksheets": [{
    "metadata": {}, "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "# Old"},
        {"cell_type": "code", "input": SOLUTION, "language": "python", "outputs": [],
         "metadata": {}, "collapsed": False}]}]}


def test_nbformat_3_is_upgraded_deterministically(tmp_path, capsys):
    solutions, out = tmp_path / "solutions", tmp_path / "out"
    solutions.mkdir()
    (solutions / "01_old.ipynb").write_text(json.dumps(V3))
    assert _cli("build", "--solutions", solutions, "--out", out) == 0
    assert _cli("check", "--solutions", solutions, "--out", out) == 0
    capsys.readouterr()
    assert _cli("build", "--solutions", solutions, "--out", out) == 0
    assert "0 written, 1 unchanged" in capsys.readouterr().out
    student = read_notebook(out / "01_old.ipynb")
    assert student.nbformat == 4 and [c.id for c in student.cells] == ["cell-0", "cell-1"]
    assert "y = x + 1" not in student.cells[1].source


def test_unsupported_old_notebook_is_refused_clearly(tmp_path):
    path = tmp_path / "01_v3.ipynb"
    path.write_text(json.dumps({"nbformat": 3, "nbformat_minor": 0}))
    with pytest.raises(exercises.ExerciseError, match=r"01_v3.ipynb is not a valid nbformat 3 "
                                                      "notebook and cannot be upgraded"):
        read_notebook(path)



@pytest.mark.parametrize("command", ["build", "check"])
def test_a_solution_whose_cells_share_an_id_is_refused_naming_the_id(tmp_path, command, capsys):
    raw = json.loads(nbformat.writes(_solution()))
    raw["cells"][0]["id"] = raw["cells"][1]["id"] = "same"   # nbformat would rename one at random
    bad = tmp_path / "solutions" / "01_x.ipynb"
    bad.parent.mkdir()
    bad.write_text(json.dumps(raw))
    before = bad.read_bytes()
    assert _cli(command, "--solutions", bad.parent, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}: ")
    assert "cells 0 and 1 share the id 'same'" in err
    assert bad.read_bytes() == before and not (tmp_path / "out").exists()
