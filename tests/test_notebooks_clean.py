"""Committed notebooks carry no outputs, have one `parameters` cell and follow NN_topic.ipynb."""

import json
import re
from pathlib import Path

import pytest

from blockmem_lite.exercises import notebooks_dir

NAME = re.compile(r"^\d{2}_[a-z0-9]+(_[a-z0-9]+)*\.ipynb$")
ROOT = notebooks_dir()
ALL = sorted(p for p in ROOT.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
MAIN = sorted(ROOT.glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def output_problems(nb: dict) -> list[str]:
    """Cells with outputs or execution counts, and saved widget state."""
    problems = [f"cell {i} has outputs" for i, c in enumerate(nb["cells"]) if c.get("outputs")]
    problems += [f"cell {i} has execution_count {c['execution_count']}"
                 for i, c in enumerate(nb["cells"]) if c.get("execution_count") is not None]
    if "widgets" in nb.get("metadata", {}):
        problems.append("the notebook metadata holds widget state")
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


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_committed_without_outputs(path):
    problems = output_problems(_load(path))
    assert problems == [], (f"{path.name}: {'; '.join(problems)}; run "
                            "`python -m blockmem_lite exercises strip notebooks`")


@pytest.mark.parametrize("path", ALL, ids=_ids(ALL))
def test_file_name_is_nn_topic(path):
    assert NAME.match(path.name), f"{path.name} should be named like 01_dense_baseline.ipynb"


@pytest.mark.parametrize("path", MAIN, ids=_ids(MAIN))
def test_one_parameters_cell_calling_notebook_config(path):
    problems = parameters_problems(_load(path))
    assert problems == [], f"{path.name}: {'; '.join(problems)}"
