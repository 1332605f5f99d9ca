"""Notebook 00's two maps stay true: the notebook map lists every numbered notebook (and
links it), and the tour of the kit names only modules that exist."""

import importlib
import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
WELCOME = NOTEBOOKS / "00_welcome_and_setup.ipynb"
ROW = re.compile(r"^\|\s*(\d\d)\s*\|\s*([^|]*?)\s*\|", re.M)
LINK = re.compile(r"\]\(([^)#]+)\)")
MODULE = re.compile(r"`([a-z_][a-z0-9_.]*)`")


def table_under(heading: str) -> str:
    """The markdown of 00's cell that holds ``heading``, from the heading to the first blank
    line after its table."""
    for cell in nbformat.read(WELCOME, 4).cells:
        if cell.cell_type == "markdown" and heading in cell.source:
            rest = cell.source.split(heading, 1)[1]
            lines = rest.splitlines()
            start = next(i for i, line in enumerate(lines) if line.startswith("|"))
            end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")),
                       len(lines))
            return "\n".join(lines[start:end])
    raise AssertionError(f"{WELCOME.name} has no markdown cell with {heading!r}")


def numbered_notebooks() -> dict[str, str]:
    return {path.name[:2]: path.name for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))}


def test_the_notebook_map_lists_every_numbered_notebook():
    rows = ROW.findall(table_under("The notebook map"))
    listed = [number for number, _ in rows]
    assert len(listed) == len(set(listed)), f"a notebook is listed twice: {listed}"
    assert listed == sorted(numbered_notebooks()), (
        f"notebook 00's map lists {listed}; notebooks/ holds {sorted(numbered_notebooks())}")


def test_every_other_notebook_in_the_map_links_its_own_file():
    files = numbered_notebooks()
    for number, title in ROW.findall(table_under("The notebook map")):
        if number == "00":
            continue
        assert LINK.findall(title) == [files[number]], f"row {number} links {title!r}"


@pytest.mark.parametrize("name", sorted({
    name for first_column in re.findall(r"^\|\s*([^|]*?)\s*\|", table_under("A tour of the kit"),
                                        re.M)
    for name in MODULE.findall(first_column)}))
def test_the_tour_names_modules_of_the_kit(name):
    module = importlib.import_module(f"blockmem_lite.{name}")
    assert module.__doc__, f"blockmem_lite.{name} has no docstring to read with help()"
