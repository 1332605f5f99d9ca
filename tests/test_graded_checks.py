"""The verdict is the grader's: tricks played inside a graded kernel change no grade.

Each student of the class below hands in notebook 01 with the same wrong causal mask and one
trick that forged a full grade when the checks ran inside the student's kernel (the kernel's
execute handler, IPython's run_cell and user_expressions, builtins.exec, an import hook,
torch's comparisons, the reference the check compares with, the "fresh" inputs). Graded with
``exercises grade``, every one of them still fails exercise 1, with the grader's own message,
and the honest student passes everything. The same class graded twice with the same seed
gets the same table; a hang costs only its own exercise.
"""

import re
import shutil
import tempfile
from pathlib import Path

import nbformat
import pytest
import torch

from blockmem_lite.exercise_checks import find, wire
from blockmem_lite.exercise_checks.trial import AnswerFailed
from blockmem_lite.tools import grade_kernel, grading
from blockmem_lite.tools.exercises import solutions_dir

SOLUTION = solutions_dir() / "01_dense_attention_from_scratch.ipynb"
WRONG_MASK = "return k_pos < q_pos"          # a query may not see its own key: wrong

TRICKS = {
    "do_execute": """
_k = get_ipython().kernel
_orig = _k.do_execute
_k.do_execute = lambda code, silent, *a, **kw: _orig('pass' if code.strip() else code, silent,
                                                     *a, **kw)""",
    "run_cell": """
_shell = get_ipython()
async def _nothing(*a, **kw):
    return None
_shell.run_cell_async = _nothing
_shell.run_cell = lambda *a, **kw: None""",
    "user_expressions": """
get_ipython().user_expressions = lambda expressions: {
    k: {'status': 'ok', 'data': {'text/plain': 'None'}, 'metadata': {}} for k in expressions}""",
    "builtins.exec": """
import builtins
_exec = builtins.exec
builtins.exec = lambda source, *a, **kw: None if 'serve' in str(source) else _exec(source, *a, **kw)""",
    "import hook": """
import sys
class _Patch:
    def find_spec(self, name, path=None, target=None):
        if name.startswith('blockmem_lite'):
            import blockmem_lite.checks as c
            c.check_equal = lambda *a, **k: print('OK')
        return None
sys.meta_path.insert(0, _Patch())
import blockmem_lite.checks as _c
_c.check_equal = lambda *a, **k: print('OK')""",
    "torch comparisons": """
torch.Tensor.__ne__ = lambda self, other: torch.zeros_like(self, dtype=torch.bool)
torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)
torch.equal = lambda a, b: True""",
    "the reference replaced": """
causal_mask = my_causal_mask
import blockmem_lite.masks as _masks
_masks.causal_mask = my_causal_mask
import blockmem_lite.exercise_checks.nb01 as _nb01
_nb01.causal_mask = my_causal_mask""",
    "fresh inputs pinned": """
import random
random.SystemRandom.randint = lambda self, a, b: a
random.Random.randint = lambda self, a, b: a
import blockmem_lite.own_work as _ow
_ow.fresh_int = lambda low, high: low""",
    "a forged reply": """
import blockmem_lite.exercise_checks.student_side as _side
from pathlib import Path as _P
_side.serve = lambda request, reply: _P(reply).write_text('{"ok":{"result":true,"args_after":[]}}')""",
}


def _submission(answer: str, trick: str = "") -> nbformat.NotebookNode:
    nb = nbformat.read(SOLUTION, as_version=4)
    for cell in nb.cells:
        if cell.get("id") == "nb01-04":
            cell.source = cell.source.replace("return k_pos <= q_pos", answer) + "\n" + trick
    return nb


@pytest.fixture(scope="module")
def tricked_class():
    """A class outside /tmp (a bubblewrap kernel gets an empty /tmp): the honest student,
    the honest mistake, and the mistake with each trick."""
    root = Path(tempfile.mkdtemp(prefix="blockmem-tricks-", dir="/var/tmp"))
    students = {"honest": _submission("return k_pos <= q_pos"), "mistake": _submission(WRONG_MASK)}
    students |= {f"trick {i:02d}": _submission(WRONG_MASK, code)
                 for i, code in enumerate(TRICKS.values())}
    for name, nb in students.items():
        (root / name).mkdir()
        nbformat.write(nb, str(root / name / SOLUTION.name))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _verdicts(rows) -> dict[str, dict[str, str]]:
    table = {}
    for row in rows:
        if row.kind != "by hand":
            table.setdefault(row.student, {})[row.exercise] = row.message
    return table


@pytest.fixture(scope="module")
def graded_twice(tricked_class):
    """The class graded, then three of its students again with the same seed."""
    budget = grading.Budget(seed=1234, cell=60)
    first, level, _ = grading.grade(tricked_class, notebook="01", budget=budget)
    again = tricked_class / "again"
    for name in ("honest", "mistake", "trick 05"):
        shutil.copytree(tricked_class / name, again / name)
    second, _, _ = grading.grade(again, notebook="01", budget=budget)
    return _verdicts(first), _verdicts(second), level


def test_no_trick_inside_the_kernel_turns_a_wrong_answer_into_a_pass(graded_twice):
    verdicts, _, _ = graded_twice
    assert set(verdicts["honest"].values()) == {""}, verdicts["honest"]
    assert "my_causal_mask(6, 6) vs causal_mask" in verdicts["mistake"]["nb01-05"]
    for i, name in enumerate(TRICKS):
        message = verdicts[f"trick {i:02d}"]["nb01-05"]
        assert message, f"the trick {name!r} passed exercise 1 with a wrong answer"


def test_a_class_graded_twice_with_one_seed_gets_the_same_verdicts(graded_twice):
    first, second, _ = graded_twice
    assert second == {name: first[name] for name in second}


def test_a_kernel_whose_execute_path_is_broken_is_stopped_at_once(graded_twice):
    """It would make every check wait out its whole limit: a ping says so first."""
    verdicts, _, _ = graded_twice
    for i in (0, 1):                       # do_execute, run_cell
        assert "no longer runs requests" in verdicts[f"trick {i:02d}"]["nb01-05"]


def test_the_seed_is_per_student_and_check():
    seeds = {grade_kernel.check_seed(7, student, grade_id)
             for student in ("ana", "bo") for grade_id in ("nb01-05", "nb01-08")}
    assert len(seeds) == 4
    assert grade_kernel.check_seed(7, "ana", "nb01-05") == grade_kernel.check_seed(7, "ana",
                                                                                    "nb01-05")
    assert grade_kernel.check_seed(8, "ana", "nb01-05") != grade_kernel.check_seed(7, "ana",
                                                                                    "nb01-05")


def test_a_hang_costs_its_own_exercise_and_says_what_the_solution_took(tmp_path, monkeypatch):
    """Limits from the solution's own time: a loop in exercise 1 is stopped, the rest of the
    notebook is graded in a fresh sandbox."""
    monkeypatch.setattr(grade_kernel, "FLOOR_S", 4)
    monkeypatch.setattr(grade_kernel, "MARGIN", 3)
    nb = _submission("return k_pos <= q_pos", "while True:\n    pass")
    (tmp_path / "looper").mkdir()
    nbformat.write(nb, str(tmp_path / "looper" / SOLUTION.name))
    rows, _, _ = grading.grade(tmp_path, notebook="01", budget=grading.Budget(seed=1))
    verdicts = _verdicts(rows)["looper"]
    assert re.search(r"timed out after \d+ s \(the teacher's solution took [\d.]+ s here\)",
                     verdicts["nb01-05"]), verdicts["nb01-05"]
    assert [verdicts[g] for g in ("nb01-08", "nb01-11", "nb01-14", "nb01-19")] == [""] * 4


def test_limits_come_from_the_solution_unless_fixed():
    timing = grade_kernel.Timing(measured={"a": 2.0, "b": 0.1})
    assert timing.limit("a") == grade_kernel.FLOOR_S + 20
    assert timing.limit("unknown") == timing.limit("a")      # a cell of the student's own
    assert grade_kernel.Timing(fixed=7, measured={"a": 2.0}).limit("a") == 7
    assert "took 2.0 s" in timing.said("a", 50)


@pytest.mark.parametrize("text", [
    '{"t": "tensor", "dtype": "float64", "shape": [2], "data": "AAAA"}',      # 3 bytes, not 16
    '{"t": "tensor", "dtype": "object", "shape": [1], "data": ""}',
    '{"t": "pickle", "data": "gASVAAAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjAJpZJSFlFKULg=="}',
    '{"t": "tensor", "dtype": "float32", "shape": [-1], "data": ""}',
    "not json", '[' * 100 + ']' * 100,
])
def test_the_wire_refuses_what_it_never_writes(text):
    with pytest.raises(wire.WireError):
        wire.decode(text)


def test_the_wire_carries_data_only():
    value = {"x": (torch.arange(6.0).view(2, 3), [1, 2.5, None, "s"]), "d": torch.float16,
             "empty": torch.zeros(0, 4, dtype=torch.bool), "big": 2 ** 70}
    back = wire.decode(wire.encode(value))
    assert torch.equal(back["x"][0], value["x"][0]) and back["x"][1] == value["x"][1]
    assert back["d"] is torch.float16 and back["empty"].shape == (0, 4) and back["big"] == 2 ** 70
    with pytest.raises(wire.WireError, match="function"):
        wire.encode({"f": lambda: 0})
    with pytest.raises(wire.WireError, match="Linear"):
        wire.encode(torch.nn.Linear(2, 2))


def test_a_reply_through_a_link_or_a_fifo_is_refused(tmp_path):
    import os

    secret = tmp_path / "secret.json"
    secret.write_text('{"ok": 1}')
    (tmp_path / "link.json").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo.json")
    for name in ("link.json", "fifo.json", "missing.json"):
        with pytest.raises(AnswerFailed):
            grade_kernel._read_reply(tmp_path / name)


def test_every_check_of_the_kit_is_registered():
    for path in sorted(solutions_dir().glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and cell.cell_type == "code":
                assert find(meta["grade_id"]) is not None, f"{path.name}: {meta['grade_id']}"
                assert f'check_exercise("{meta["grade_id"]}")' in cell.source
