"""Committed notebooks carry no outputs, have one `parameters` cell and follow NN_topic.ipynb."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from blockmem_lite.tools.exercises import notebooks_dir

NAME = re.compile(r"^\d{2}_[a-z0-9]+(_[a-z0-9]+)*\.ipynb$")
ROOT = notebooks_dir()
ALL = sorted(p for p in ROOT.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
MAIN = sorted(ROOT.glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
REPO = ROOT.parent
FILTER = "filter.nbstripout.clean"


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def output_problems(nb: dict) -> list[str]:
    """Cells with outputs or execution counts, saved widget state and language_info."""
    problems = [f"cell {i} has outputs" for i, c in enumerate(nb["cells"]) if c.get("outputs")]
    problems += [f"cell {i} has execution_count {c['execution_count']}"
                 for i, c in enumerate(nb["cells"]) if c.get("execution_count") is not None]
    if "widgets" in nb.get("metadata", {}):
        problems.append("the notebook metadata holds widget state")
    if "language_info" in nb.get("metadata", {}):
        problems.append("the notebook metadata holds language_info (JupyterLab's Python)")
    return problems


def parameters_problems(nb: dict) -> list[str]:
    """Exactly one code cell tagged `parameters`, and it calls notebook_config."""
    cells = [c for c in nb["cells"]
             if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        return [f"{len(cells)} cells are tagged 'parameters' (expected exactly 1)"]
    if cells[0]["cell_type"] != "code" or "notebook_config(" not in _source(cells[0]):
        return ["the 'parameters' cell does not call notebook_config(...)"]
    return []


def test_the_checks_catch_a_dirty_notebook():
    nb = {"metadata": {"widgets": {}}, "cells": [
        {"cell_type": "code", "source": "cfg = 1", "outputs": [{"output_type": "stream"}],
         "execution_count": 4, "metadata": {"tags": ["parameters"]}},
        {"cell_type": "code", "source": ["cfg = notebook_config(", "'class')"], "outputs": [],
         "execution_count": None, "metadata": {"tags": ["parameters"]}}]}
    assert output_problems(nb) == ["cell 0 has outputs", "cell 0 has execution_count 4",
                                   "the notebook metadata holds widget state"]
    assert parameters_problems(nb) == ["2 cells are tagged 'parameters' (expected exactly 1)"]
    del nb["cells"][1]
    assert parameters_problems(nb) == ["the 'parameters' cell does not call notebook_config(...)"]
    assert not NAME.match("1_intro.ipynb") and not NAME.match("01-Intro.ipynb")
    assert NAME.match("01_dense_attention_from_scratch.ipynb")


def _git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def _in_git() -> bool:
    return shutil.which("git") is not None and _git("rev-parse", "--is-inside-work-tree").returncode == 0


def as_git_stores(path: Path) -> dict:
    """The notebook as git holds it (the index's copy) in a checkout; the file otherwise."""
    if _in_git():
        shown = _git("show", f":{path.relative_to(REPO).as_posix()}")
        if shown.returncode == 0:
            return json.loads(shown.stdout)
    return _load(path)


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_committed_without_outputs(path):
    problems = output_problems(as_git_stores(path))
    assert problems == [], (f"{path.name}: {'; '.join(problems)}; run "
                            "`python -m blockmem_lite exercises strip notebooks`")


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_outputs_stay_in_the_working_copy_only_behind_the_filter(path):
    """A notebook run in JupyterLab keeps its outputs on disk; git must not get them."""
    if not output_problems(_load(path)) or not _in_git():
        return
    assert _git("config", "--get", FILTER).returncode == 0, (
        f"{path.name} has outputs and this checkout has no nbstripout filter, so a commit "
        "would store them: run `make setup` (it configures the filter), or strip them with "
        "`python -m blockmem_lite exercises strip notebooks`")


def test_the_filter_keeps_outputs_out_of_git_and_cell_ids_in(tmp_path):
    """What `make setup` configures, tried on a scratch repository with a dirty notebook."""
    pytest.importorskip("nbstripout")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    assert "*.ipynb filter=nbstripout diff=ipynb" in (REPO / ".gitattributes").read_text()
    assert "--keep-id --extra-keys metadata.language_info" in (REPO / "Makefile").read_text()
    _git("init", "-q", cwd=tmp_path)
    _git("config", FILTER, f'"{sys.executable}" -m nbstripout --keep-id --extra-keys '
         "metadata.language_info", cwd=tmp_path)
    shutil.copy(REPO / ".gitattributes", tmp_path / ".gitattributes")
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"widgets": {"state": {}}, "language_info": {"version": "3.11.7"}},
          "cells": [{"cell_type": "code", "id": "nb01-04", "execution_count": 3,
                     "metadata": {"tags": ["check"]}, "source": "print(1)",
                     "outputs": [{"output_type": "stream", "name": "stdout", "text": "1\n"}]}]}
    (tmp_path / "01_x.ipynb").write_text(json.dumps(nb))
    assert _git("add", "01_x.ipynb", cwd=tmp_path).returncode == 0
    stored = json.loads(_git("show", ":01_x.ipynb", cwd=tmp_path).stdout)
    assert output_problems(stored) == []
    assert stored["cells"][0]["id"] == "nb01-04" and stored["cells"][0]["metadata"]["tags"] == \
        ["check"]
    assert output_problems(json.loads((tmp_path / "01_x.ipynb").read_text())) != [], \
        "the working copy keeps its outputs"


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_file_name_is_nn_topic(path):
    assert NAME.match(path.name), f"{path.name} should be named like 01_dense_baseline.ipynb"


@pytest.mark.parametrize("path", MAIN, ids=_ids(MAIN))
def test_one_parameters_cell_calling_notebook_config(path):
    problems = parameters_problems(_load(path))
    assert problems == [], f"{path.name}: {'; '.join(problems)}"


def test_jupyterlab_saves_widget_state_with_the_kit_settings():
    """`make setup` copies jupyter/overrides.json into the venv's JupyterLab settings."""
    overrides = json.loads((REPO / "jupyter" / "overrides.json").read_text())
    assert overrides["@jupyter-widgets/jupyterlab-manager:plugin"]["saveState"] is True
    makefile = (REPO / "Makefile").read_text()
    assert "share/jupyter/lab/settings/overrides.json" in makefile
    assert "$(LAB_ARGS)" in makefile


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_the_filter_leaves_a_clean_notebook_byte_for_byte(path):
    """Else a fresh checkout with the filter shows every notebook as modified. (In process,
    as ``python -m nbstripout --keep-id`` does it: strip_output, then nbformat's writer.)"""
    nbstripout = pytest.importorskip("nbstripout")
    import nbformat

    if output_problems(_load(path)):
        pytest.skip("the working copy has outputs (the filter strips them on commit)")
    nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=nbformat.NO_CONVERT)
    stripped = nbstripout.strip_output(nb, keep_output=False, keep_count=False, keep_id=True,
                                       extra_keys=["metadata.language_info"])
    assert nbformat.writes(stripped) + "\n" == path.read_text(encoding="utf-8"), (
        f"{path.name}: nbstripout writes it differently (key order or layout); rewrite it "
        "with `python -m nbstripout --keep-id --extra-keys metadata.language_info FILE`")
