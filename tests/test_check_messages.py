"""A failed check says what kind of bug it is, and an unanswered exercise fails cleanly.

- Every registered check, run on a notebook with nothing written, says "not written yet"
  (a ``CheckFailed``, never a ``NameError``); so does every check cell of the exercise
  notebooks as a student's Run All reaches it (the answers still stubs), and the cell after a
  check that uses the check's result (a chart) runs without it, printing one line.
- Exercise 3 of notebook 01 (the cached decode step) names the first wrong step and what it
  got wrong; writing the cache in place, which the task asks for, is not blamed, while
  changing an input that must stay is.
- The capstones and the gradient check of notebook 06 name the kind of bug for planted
  mistakes taken from ``tests/mutants``: a leak as a causality failure with its position and
  the router's scores, a wrong read in ARMT as the read's queries, gamma's missing
  stop-gradient as such.
"""

from __future__ import annotations

import ast
import contextlib
import io
import runpy
from pathlib import Path

import nbformat
import pytest

from blockmem_lite import exercise_checks
from blockmem_lite.checks import CheckFailed
from blockmem_lite.exercise_checks.trial import NotebookTrial
from blockmem_lite.tools.exercises import check_cell_indices, exercises_dir, solutions_dir

MUTANTS = Path(__file__).parent / "mutants"
FAST = {"BLOCKMEM_FAST": "1", "BLOCKMEM_HEADLESS": "1", "PLOTLY_RENDERER": "json"}


def _all_checks() -> list[str]:
    for path in sorted(solutions_dir().glob("[0-9][0-9]_*.ipynb")):
        exercise_checks.find(f"nb{path.name[:2]}-00")          # imports the notebook's module
    return sorted(exercise_checks._CHECKS)


def _run(grade_id: str, namespace: dict) -> str | None:
    """The check's message (None if it passes), its OK lines kept quiet."""
    check = exercise_checks.find(grade_id)
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            check.body(NotebookTrial(check, namespace))
        except CheckFailed as err:
            return str(err)
    return None


# --- nothing written yet ---------------------------------------------------------------------


@pytest.mark.parametrize("grade_id", _all_checks())
def test_a_check_on_a_notebook_with_nothing_written_says_not_written_yet(grade_id):
    message = _run(grade_id, {})
    assert message is not None and "not written yet" in message.splitlines()[0], message


class _Recorder:
    """Stands in for viz and display: notes every call, draws nothing."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append(name)

    def __call__(self, *args, **kwargs):
        self.calls.append("display")


def _imports(source: str) -> str:
    """The import statements of a cell (a setup cell's magics and work left out)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    return "\n".join(ast.unparse(s) for s in tree.body if isinstance(s, (ast.Import,
                                                                           ast.ImportFrom)))


def _bound(source: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}


@pytest.mark.parametrize("path", sorted(exercises_dir().glob("[0-9][0-9]_*.ipynb")),
                         ids=lambda p: p.name[:2])
def test_untouched_exercise_notebooks_fail_each_check_cleanly(path, monkeypatch):
    """As a student's Run All reaches them: the answer cells (stubs) run, raising what they
    raise; each check cell fails with "not written yet", draws nothing, and the next cell
    that uses what the check cell binds (a chart of its result) runs without error."""
    for key, value in FAST.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(path, as_version=4)
    viz = _Recorder()
    namespace = {"__name__": "__main__"}
    for cell in nb.cells:
        if cell.cell_type == "code":
            exec(_imports(cell.source), namespace)               # noqa: S102  the kit's imports
    namespace.update(viz=viz, display=viz)
    checks = set(check_cell_indices(nb))
    for cell in nb.cells:
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
            exec(cell.source, namespace)                         # noqa: S102  a stub: it raises
    for i in sorted(checks):
        with pytest.raises(CheckFailed, match="not written yet"), \
                contextlib.redirect_stdout(io.StringIO()):
            exec(nb.cells[i].source, namespace)                  # noqa: S102
        assert viz.calls == [], f"{path.name} cell {i}: drew {viz.calls} from a failed check"
        after = next((j for j in range(i + 1, len(nb.cells))
                      if nb.cells[j].cell_type == "code"), None)
        if after is not None and after not in checks and \
                _bound(nb.cells[i].source) & _names(nb.cells[after].source):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(nb.cells[after].source, namespace)          # noqa: S102  must not raise
            assert out.getvalue().strip() and viz.calls == [], (path.name, after)


def _names(source: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}


# --- exercise 3 of notebook 01: the cached decode step ---------------------------------------

DECODE_IMPORTS = "import math\nimport torch\nfrom blockmem_lite.exercise_checks import check_exercise\n"
DECODE_STEP = """
def decode_step(attn, x_t, cache_k, cache_v, t):
    q, k, v = attn.project_qkv(x_t, torch.tensor([t]))
    cache_k[:, :, t:t + 1] = k
    cache_v[:, :, t:t + 1] = v{extra}
    scores = q @ cache_k[:, :, :t + 1].transpose(-2, -1)           # the 1/sqrt(hd) forgotten
    y = scores.softmax(dim=-1) @ cache_v[:, :, :t + 1]
    return attn.out(attn.merge_heads(y))
"""


def _kernel_errors(cells: list[str]) -> list[str | None]:
    """Run ``cells`` in one fresh kernel (as a notebook's cells run); each cell's error text."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(source) for source in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True).execute()
    return [next((f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"),
                 None) for cell in nb.cells]


def test_the_decode_step_check_names_the_step_and_not_the_cache_it_must_write():
    check = 'check_exercise("nb01-11")'
    errors = _kernel_errors([DECODE_IMPORTS + DECODE_STEP.format(extra=""), check,
                             DECODE_STEP.format(extra="\n    x_t.mul_(1.0)"), check])
    written, touched = errors[1], errors[3]
    assert "step 1: the output differs from the full causal forward's at position 1" in written
    assert "1/sqrt(hd) scale" in written and "in place" not in written, written
    assert "changed its input `x_t` in place" in touched, touched
    assert "cache_k" not in touched and "cache_v" not in touched, touched


# --- the kind of bug, for planted mistakes -----------------------------------------------------


def _namespace(notebook: str, cell_ids: list[str], mutant: tuple[str, str] | None) -> dict:
    """The solution notebook's cells ``cell_ids`` run in order, one mutant substituted."""
    nb = nbformat.read(solutions_dir() / f"{notebook}.ipynb", as_version=4)
    namespace = {"__name__": "__main__"}
    for cell in nb.cells:
        if cell.get("id") in cell_ids:
            source = cell.source
            if mutant is not None and mutant[0] in source:
                source = source.replace(*mutant)
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(source, f"<cell {cell.id}>", "exec"), namespace)   # noqa: S102
    return namespace


def _mutant(notebook: str, check_id: str, description: str, kind: str = "MUTANTS"):
    found = runpy.run_path(str(MUTANTS / f"{notebook}.py"))[kind][check_id]
    [(original, replacement)] = [m[1:3] for m in found if m[0].startswith(description)]
    return original, replacement


ARMT = ("06_armt_associative_memory", ["nb06-01", "nb06-02", "nb06-18a", "nb06-18"])
MOC = ("08_moc_mixture_of_chapters", ["nb08-01", "nb08-02", "nb08-22", "nb08-23", "nb08-24"])


@pytest.mark.parametrize("where, check_id, description, kind, says", [
    (MOC, "nb08-25", "router reads the current window", "MUTANTS",
     ["MyMoCBlock: not causal: the output at position 16 (window 1) sees a later token",
      "first in layer 0: the router's scores, window 1"]),
    (ARMT, "nb06-19", "the read queries made with W_K", "MUTANTS",
     ["from position 8 (segment 1)", "the first difference inside is segment 1, layer 0: "
      "the read at position 8: its queries"]),
    (("06_armt_associative_memory", ["nb06-01", "nb06-02", "nb06-07"]), "nb06-09",
     "gamma without the stop-gradient", "CHEATS",
     ["my_write_heads: no stop-gradient on gamma? the gradients with respect to z, k_phi"]),
], ids=["moc-leak", "armt-queries", "gamma"])
def test_a_failed_check_names_the_kind_of_bug(where, check_id, description, kind, says,
                                              monkeypatch):
    for key, value in FAST.items():
        monkeypatch.setenv(key, value)
    notebook, cells = where
    message = _run(check_id, _namespace(notebook, cells, _mutant(notebook, check_id,
                                                                 description, kind)))
    assert message is not None, "the planted mistake passed"
    for phrase in says:
        assert phrase in message, f"{phrase!r} not in:\n{message}"
