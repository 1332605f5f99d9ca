"""Answers borrowed from the kit: what the grader can and cannot refuse, and the review sheet.

A check compares the answer with the kit, so an answer that *is* the kit's code passes
whatever path it took to get there; the grader cannot tell it from the student's own. The
kit's guard (``check_own_work``, run where the answer is called) refuses the routes it can
see; the others pass, and the review sheet flags every one of them for the teacher. Each
route is planted as notebook 01's exercise 1 and judged through the grader's own path
(the check in this process, the answer in a kernel), as ``exercises grade`` judges it.
This test states which routes the guard refuses, so docs/GRADING.md can say so.
"""

import copy

import nbformat
import pytest
from nbclient import NotebookClient

from blockmem_lite.exercise_checks import find
from blockmem_lite.tools.exercises import solutions_dir
from blockmem_lite.tools.grade_kernel import KernelLink, check_seed, run_graded_check
from blockmem_lite.tools.review_sheet import flag

SOLUTION = solutions_dir() / "01_dense_attention_from_scratch.ipynb"
HEAD = "def my_causal_mask(q_len, kv_len):\n"

KIT_NAME = "_name = 'causal' + '_mask'\n"      # a determined student hides the name

# route -> (the answer cell, refused by the guard where the answer is called?)
ROUTES = {
    "marshal": (
        "import marshal, types\n" + KIT_NAME + "_kit = getattr(__import__('blockmem_lite.masks', "
        "fromlist=['x']), _name)\n_code = marshal.loads(marshal.dumps(_kit.__code__))\n"
        "_copy = types.FunctionType(_code, _kit.__globals__, 'x', _kit.__defaults__)\n"
        + HEAD + "    return _copy(q_len, kv_len)", False),
    "FunctionType of a renamed code": (
        "import types\n" + KIT_NAME + "_kit = getattr(__import__('blockmem_lite.masks', "
        "fromlist=['x']), _name)\n_copy = types.FunctionType(_kit.__code__.replace("
        "co_filename='mine.py'), _kit.__globals__, 'x', _kit.__defaults__)\n"
        + HEAD + "    return _copy(q_len, kv_len)", True),
    "its source compiled again": (
        "import inspect, blockmem_lite.masks as _m\n_ns = {}\n"
        "exec(compile(inspect.getsource(_m), _m.__file__, 'exec'), _ns)\n" + KIT_NAME
        + HEAD + "    return _ns[_name](q_len, kv_len)", False),
    "a second import of its file": (
        "import importlib.util, blockmem_lite.masks as _m\n" + KIT_NAME +
        "_spec = importlib.util.spec_from_file_location('copy_of_masks', _m.__file__)\n"
        "_copy = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(_copy)\n"
        + HEAD + "    return getattr(_copy, _name)(q_len, kv_len)", False),
    "its .py copied into the working folder": (
        "import shutil, sys, importlib, blockmem_lite.masks as _m\n" + KIT_NAME +
        "shutil.copy(_m.__file__, 'mine_masks.py')\nsys.path.insert(0, '.')\n"
        "_mine = importlib.import_module('mine_masks')\n"
        + HEAD + "    return getattr(_mine, _name)(q_len, kv_len)", False),
    "torch.compile of it": (
        "import blockmem_lite.masks as _m\n" + KIT_NAME + "_compiled = torch.compile("
        "getattr(_m, _name), backend='eager')\n" + HEAD + "    return _compiled(q_len, kv_len)",
        False),
    "a thread pool": (
        "from concurrent.futures import ThreadPoolExecutor\nimport blockmem_lite.masks as _m\n"
        + KIT_NAME + "_pool = ThreadPoolExecutor(1)\n_pool.submit(print, 'started').result()\n"
        + HEAD + "    return _pool.submit(lambda: getattr(_m, _name)(q_len, kv_len)).result()",
        False),
    "a fork pool": (
        "import multiprocessing\nimport blockmem_lite.masks as _m\n" + KIT_NAME + HEAD +
        "    with multiprocessing.get_context('fork').Pool(1) as pool:\n"
        "        return pool.apply(getattr(_m, _name), (q_len, kv_len))", True),
    "a subprocess": (
        "import json, subprocess, sys\n" + HEAD + "    out = subprocess.run([sys.executable, "
        "'-c', f'from blockmem_lite.masks import causal_mask as c; print(c({q_len}, {kv_len})"
        ".int().tolist())'], capture_output=True, text=True).stdout\n"
        "    return torch.tensor(json.loads(out)).bool()", False),
    "the kernel's side of the check rewritten": (
        HEAD + "    return k_pos\n"
        "import blockmem_lite.exercise_checks.student_side as _side\n"
        "_call = _side._call\n"
        "def _borrowed(request):\n"
        "    request['name'] = 'causal' + '_mask'\n"
        "    return _call(request)\n"
        "_side.HANDLERS['call'] = _borrowed", False),
}


def _nb(answer: str):
    nb = nbformat.read(SOLUTION, as_version=4)
    for cell in nb.cells:
        if cell.get("id") == "nb01-04":
            cell.source = answer
    return nb


@pytest.mark.parametrize("route", ROUTES)
def test_every_borrowed_answer_is_flagged_on_the_review_sheet(route):
    answer, _ = ROUTES[route]
    assert flag(answer), f"the review sheet shows nothing for {route!r}"


def test_which_borrowed_answers_the_guard_refuses(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    check = find("nb01-05")
    base = _nb("")
    upto = next(i for i, c in enumerate(base.cells) if c.get("id") == "nb01-04")
    client = NotebookClient(copy.deepcopy(base), timeout=240, allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    refused = {}
    with client.setup_kernel():
        for i in range(upto):
            if base.cells[i].cell_type == "code":
                client.execute_cell(copy.deepcopy(base.cells[i]), i)
        for route, (answer, _) in ROUTES.items():
            client.execute_cell(nbformat.v4.new_code_cell(answer), upto)
            failed = run_graded_check(check, KernelLink(client, tmp_path, 120),
                                      check_seed(0, route, "nb01-05"))
            refused[route] = failed is not None
            client.execute_cell(nbformat.v4.new_code_cell(
                "import importlib, blockmem_lite.exercise_checks.student_side as s\n"
                "importlib.reload(s)"), upto)                       # undo the last route
    assert refused == {route: expected for route, (_, expected) in ROUTES.items()}
