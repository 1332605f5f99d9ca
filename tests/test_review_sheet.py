"""The review sheet (``review.md``): honest answers raise no flag, each planted trick does,
and no answer can break the sheet. No kernel runs here."""

import copy

import pytest
from test_grading import NAME, _solution, _write

from blockmem_lite.tools import review_sheet
from blockmem_lite.tools.exercises import (
    make_exercise,
    read_notebook,
    solution_notebooks,
    solutions_dir,
)
from blockmem_lite.tools.grade_report import Row
from blockmem_lite.tools.review_sheet import exercises_of, fenced, flag

SETUP = ["import torch\nimport torch.nn.functional as F\nfrom blockmem_lite.models import armt\n"
         "from blockmem_lite.checks import check_equal"]
SOLUTION = ("def my_dpfp(u):\n    ### BEGIN SOLUTION\n    r = torch.cat([F.relu(u), F.relu(-u)], "
            "-1)\n    return r * armt.EPS\n    ### END SOLUTION")
TRICKS = {
    "marshal.loads(marshal.dumps(kit.__code__))": "marshal",
    "FunctionType(f.__code__.replace(co_filename='x'), {})": "FunctionType",
    "g = f.__globals__": "__globals__",
    "compile(inspect.getsource(kit), 'x', 'exec')": "compile",
    "eval('1')": "eval",
    "exec('x = 1')": "exec",
    "__import__('os')": "__import__",
    "import importlib\nm = importlib.import_module('blockmem_lite.models.armt')": "importlib",
    "import gc\ngc.get_referrers(f)": "gc",
    "import ctypes": "ctypes",
    "import builtins\nprint(builtins)": "builtins",
    "threading.Thread(target=work).start()": "threading.Thread",
    "from concurrent.futures import ThreadPoolExecutor": "concurrent.futures",
    "import multiprocessing as mp\nmp.Process(target=work)": "multiprocessing.Process",
    "subprocess.run(['ls'])": "subprocess.run",
    "import os\nos.system('ls')": "os.system",
    "import sys\nsys.meta_path.insert(0, finder)": "sys.meta_path",
    "sys.modules['blockmem_lite.checks'] = fake": "sys.modules",
    "__builtins__.len = lambda x: 3": "__builtins__",
    "torch.Tensor.__ne__ = lambda *a: torch.tensor(False)": "changes torch.Tensor.__ne__",
    "armt.dpfp = my_fn": "changes blockmem_lite.models.armt.dpfp",
    "setattr(armt, 'dpfp', my_fn)": "setattr on blockmem_lite.models.armt",
    "F.relu, torch.roll = f, g": "changes torch.roll",
    "getattr(mod, 'dp' + 'fp')": "getattr with a computed name",
    "delattr(obj, name)": "delattr with a computed name",
    "get_ipython().kernel.do_execute = run": "changes get_ipython().kernel.do_execute",
    "random.SystemRandom.randint = lambda *a: 4": "changes random.SystemRandom.randint",
    "def my_dpfp(u):\n    return armt.dpfp(u)": "armt.dpfp (the piece this exercise asks for)",
    "from blockmem_lite.models.armt import dpfp as d": "armt.dpfp (the piece this exercise",
    "y = check_equal": "blockmem_lite.checks.check_equal (kit code the solution does not use)",
    "import shutil\nshutil.copy(armt.__file__, 'mine.py')": "__file__",
    "spec = armt.__spec__": "__spec__",
    "f = torch.compile(armt.dpfp, backend='eager')": "armt.dpfp (the piece this exercise",
    "from multiprocessing import Pool\nPool(2).map(f, xs)": "multiprocessing",
    "import blockmem_lite.exercise_checks.student_side as s\ns.serve = f":
        "changes blockmem_lite.exercise_checks.student_side.serve",
    "%time x = 1": "IPython line: %time",
    "!pip install cheat": "IPython line: !pip",
}


def _answers(path):
    nb = read_notebook(path)
    return nb, exercises_of(nb)


@pytest.mark.parametrize("path", solution_notebooks(solutions_dir()), ids=lambda p: p.stem)
def test_the_solutions_answers_raise_no_flag(path):
    nb, answers = _answers(path)
    others = [c.source for c in nb.cells if c.cell_type == "code"]
    assert answers, f"{path.name}: no BEGIN SOLUTION cell found"
    flagged = {cell_id: flag(source, source, others) for cell_id, _, source in answers}
    assert {k: v for k, v in flagged.items() if v} == {}


@pytest.mark.parametrize("trick", TRICKS)
def test_each_planted_trick_is_flagged_with_its_line(trick):
    notes = flag("x = 1\n" + trick, SOLUTION, SETUP)
    assert [n for n in notes if TRICKS[trick] in n], notes
    assert all(n.startswith("line ") and not n.startswith("line 1:") for n in notes), notes


def test_the_solution_itself_and_plain_code_raise_none():
    assert flag(SOLUTION, SOLUTION, SETUP) == []
    plain = "self.w = nn.Linear(2, 2)\nd = {}\nd['a'] = getattr(m, 'weight')\nx.data = y\n"
    assert flag(plain, SOLUTION, SETUP) == []


@pytest.mark.parametrize("source", ["def f(:\n", "x = !ls", "%%bash\necho hi\nls -l |", "a\x00b"])
def test_unparseable_answers_get_a_note_never_an_error(source):
    assert flag(source, SOLUTION, SETUP) == [
        "not checked: the code cannot be parsed (a syntax error or an IPython line)"]


def test_magic_lines_are_skipped_and_the_rest_checked():
    assert flag("%matplotlib inline\nif x:\n    !ls\neval('1')") == [
        "line 1: IPython line: %matplotlib inline", "line 3: IPython line: !ls",
        "line 4: uses eval"]


def test_no_answer_can_close_its_fence_or_smuggle_html():
    source = "x = 1\n```\n`````\n</code><!-- hide\n\x1b[2J\u202e\tend"
    block = fenced(source)
    fence = block[0].removesuffix("python")
    assert set(fence) == {"`"} and len(fence) == 6 and block[-1] == fence
    assert not [line for line in block[1:-1] if line.lstrip().startswith(fence)]
    assert "\\x1b[2J\\u202e   end" in block                 # the tab to its stop
    assert len("".join(fenced("y" * 50_000))) < review_sheet.CODE_CHARS + 50


def _class(tmp_path):
    """A solution (answers in cells c2 and c4), and three students: honest, the stub left
    as is with a trick in the other answer, and one whose notebook is a symlink."""
    solution = _solution()
    _write(solution, tmp_path / "solutions" / NAME)
    exercise = make_exercise(copy.deepcopy(solution), NAME)
    honest, tricky = copy.deepcopy(exercise), copy.deepcopy(exercise)
    honest.cells[2].source, honest.cells[4].source = "def add(a, b):\n    return a + b", "y = 42"
    tricky.cells[4].source = "import subprocess\ny = eval('4' + '2')\n# ````\ns = '<!--'"
    subs = tmp_path / "subs"
    _write(honest, subs / "ann" / NAME)
    _write(tricky, subs / "bob" / "work" / NAME)
    (subs / "eve").mkdir()
    (subs / "eve" / NAME).symlink_to(tmp_path / "solutions" / NAME)
    rows = [Row(s, "01_sums", f, g) for s, f in (("ann", NAME), ("bob", f"work/{NAME}"),
                                                ("eve", NAME)) for g in ("nb01-c3", "nb01-c5")]
    return subs, tmp_path / "solutions", rows


def test_the_sheet_shows_each_answer_flags_tricks_and_reads_no_link(tmp_path):
    subs, solutions, rows = _class(tmp_path)
    path = review_sheet.write_review(rows, subs, tmp_path / "grades", solutions)
    sheet = path.read_text(encoding="utf-8")
    assert path == tmp_path / "grades" / "review.md"
    assert [p.name for p in path.parent.iterdir()] == ["review.md"]     # no partial left
    ann, bob, eve = (sheet.split(f"## {s}\n")[1] for s in ("ann", "bob", "eve"))
    assert ann.count("No flags.") == 2 and "return a + b" in ann
    assert "Not answered (the stub as handed out)." in bob
    assert "- line 1: imports subprocess" in bob and "- line 2: uses eval" in bob
    assert "`````python\nimport subprocess" in bob and "\ns = '<!--'\n`````\n" in bob
    assert eve.startswith("\n### 01_sums (01_sums.ipynb)\n\nNot read: refused")
    assert "### END SOLUTION" not in sheet                  # the linked solution never read
