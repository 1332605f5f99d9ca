"""Grading in a sandbox: a hostile student's notebook plants each attack found against the
grader (a classmate's notebook overwritten, the kit's checks patched, a process that outlives
its kernel and rewrites the grades, the teacher's environment read, the solutions read and
executed) and none has any effect on the grades, the files or the machine."""

import csv
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from test_grading import NAME, _answer, _solution, _write

from blockmem_lite import checks
from blockmem_lite.tools import grade_report, grading, sandbox
from blockmem_lite.tools.exercises import make_exercise

needs_bubblewrap = pytest.mark.skipif(not sandbox.bubblewrap_works(),
                                      reason="bubblewrap (bwrap) is missing or may not create "
                                      "namespaces here: apt install bubblewrap")
SECRET = "TEACHER_SECRET_TOKEN"


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def classroom():
    """A class folder outside /tmp (a bubblewrap kernel gets an empty /tmp of its own, so a
    class under /tmp would be out of reach for another reason than the one tested)."""
    base = Path("/var/tmp")
    if not base.is_dir():
        pytest.skip("no /var/tmp to hold the class outside /tmp")
    root = Path(tempfile.mkdtemp(prefix="blockmem-class-", dir=base))
    yield root
    shutil.rmtree(root, ignore_errors=True)


ATTACKS = '''\
import glob, json, os, subprocess, sys
base = 40
SUBMISSIONS, GRADES, SOLUTIONS, MARK = {subs!r}, {grades!r}, {solutions!r}, {mark!r}
# 1. every notebook in reach: cwd, the grader's cwd through /proc, the class folder
places = [os.getcwd(), SUBMISSIONS]
try:
    places.append(os.path.realpath(f"/proc/{{os.getppid()}}/cwd"))
except OSError:
    pass
for place in places:
    for up in (place, os.path.dirname(place)):
        if up.count(os.sep) < 3:               # not a whole disk: a class folder and its parent
            continue
        for path in glob.glob(os.path.join(up, "**", "*.ipynb"), recursive=True):
            try:
                open(path, "w").write("{{}}")
            except OSError:
                pass
# 2. the kit's checks, patched for everyone graded after
try:
    open({checks_file!r}, "a").write("\\ndef check_close(*args, **kwargs):\\n    pass\\n")
except OSError:
    pass
# 3. a process of its own session and environment that outlives the kernel
rewrite = ("import pathlib, time\\n"
           "for _ in range(600):\\n"
           f"    for p in pathlib.Path({{GRADES!r}}).glob('grades.*'):\\n"
           "        p.write_text('all passed')\\n"
           "    time.sleep(0.05)\\n")
subprocess.Popen([sys.executable, "-c", rewrite, MARK], start_new_session=True, env={{}},
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''

STEALER = '''\
import json, os
for cell in json.load(open(os.path.join({solutions!r}, {name!r})))["cells"]:
    if "def add" in "".join(cell["source"]):
        exec("".join(cell["source"]))          # the teacher's answer, not mine
'''


def _class(root: Path, grades: Path, solutions: Path, mark: str) -> Path:
    exercise = make_exercise(_solution(), NAME)
    subs = root / "submitted"
    attacker = _answer(exercise)
    attacker.cells[1].source = ATTACKS.format(subs=str(subs), grades=str(grades),
                                              solutions=str(solutions), mark=mark,
                                              checks_file=checks.__file__)
    attacker.cells[4].source = (f"import os\nif any({SECRET!r} in k for k in os.environ):\n"
                                "    raise RuntimeError('I can read the teacher environment')\n"
                                "y = 2 * 21")
    _write(attacker, subs / "mallory" / NAME)
    thief = _answer(exercise, add="raise NotImplementedError")
    thief.cells[2].source = STEALER.format(solutions=str(solutions), name=NAME) + \
        "\n" + thief.cells[2].source.replace("def add", "def my_add")
    _write(thief, subs / "trudy" / NAME)
    _write(_answer(exercise), subs / "victor" / NAME)                     # honest, all right
    _write(_answer(exercise, add="return a - b"), subs / "walter" / NAME)  # honest, one wrong
    return subs


def _processes_with_mark(mark: str) -> list[int]:
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "cmdline").read_bytes():
                    alive.append(int(entry.name))
            except OSError:
                continue
    return alive


def _grade(subs: Path, solutions: Path, grades: Path, isolation: str) -> dict:
    assert grading.main([str(subs), "--solutions", str(solutions), "--out", str(grades),
                         "--isolation", isolation, "--cell-timeout", "60"]) == 0
    rows = csv.DictReader(io.StringIO((grades / "grades.csv").read_text()))
    return {(row["student"], row["exercise"]): row["result"] for row in rows}


@needs_bubblewrap
def test_no_attack_of_a_student_has_any_effect_under_bubblewrap(classroom, monkeypatch):
    monkeypatch.setenv(SECRET, "the teacher's token")
    solutions, grades, mark = classroom / "solutions", classroom / "grades", uuid.uuid4().hex
    _write(_solution(), solutions / NAME)
    subs = _class(classroom, grades, solutions, mark)
    victims = {p: _digest(p) for p in (subs / "victor" / NAME, subs / "walter" / NAME,
                                        solutions / NAME, Path(checks.__file__))}
    result = _grade(subs, solutions, grades, "bubblewrap")
    assert result == {("mallory", "nb01-c3"): "passed", ("mallory", "nb01-c5"): "passed",
                      ("trudy", "nb01-c3"): "failed", ("trudy", "nb01-c5"): "passed",
                      ("victor", "nb01-c3"): "passed", ("victor", "nb01-c5"): "passed",
                      ("walter", "nb01-c3"): "failed", ("walter", "nb01-c5"): "passed"}
    written = (grades / "grades.csv").read_text()
    time.sleep(2)                                      # the rewriter, had it survived
    assert (grades / "grades.csv").read_text() == written
    assert not _processes_with_mark(mark)
    assert {p: _digest(p) for p in victims} == victims
    assert "bubblewrap" in (grades / "grades.md").read_text().splitlines()[0]


def test_the_fallback_hides_the_environment_and_ends_the_session(classroom, monkeypatch):
    """Without bubblewrap: the minimal environment, and every process that keeps the run's
    token is killed before the grades are written (one that clears its environment and
    leaves the session is not: the report says so, and a class should use bubblewrap)."""
    monkeypatch.setenv(SECRET, "the teacher's token")
    solutions, grades, mark = classroom / "solutions", classroom / "grades", uuid.uuid4().hex
    _write(_solution(), solutions / NAME)
    exercise = make_exercise(_solution(), NAME)
    student = _answer(exercise)
    student.cells[1].source = (
        "import os, subprocess, sys\nbase = 40\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {mark!r}],"
        " start_new_session=True)\n")
    student.cells[4].source = (f"import os\nif any({SECRET!r} in k for k in os.environ):\n"
                               "    raise RuntimeError('I can read the teacher environment')\n"
                               "y = 2 * 21")
    _write(student, classroom / "submitted" / "mallory" / NAME)
    result = _grade(classroom / "submitted", solutions, grades, "process")
    assert result == {("mallory", "nb01-c3"): "passed", ("mallory", "nb01-c5"): "passed"}
    assert not _processes_with_mark(mark)
    assert "NOT hidden" in (grades / "grades.md").read_text().splitlines()[0]


def test_ending_the_run_waits_until_its_processes_have_exited():
    """SIGKILL returns before the process is gone: a process holding 1 GiB takes tens of
    milliseconds to tear down, so the grades must wait for it, not only send the signal."""
    token = uuid.uuid4().hex
    child = subprocess.Popen(
        [sys.executable, "-c", "b = b'x' * (1 << 30); print('ready', flush=True); "
         "import time; time.sleep(60)"],
        env={**os.environ, sandbox.TOKEN_VARIABLE: token}, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        run = sandbox.Sandbox.__new__(sandbox.Sandbox)     # no folders: only its token
        run.token = token
        run.end_every_process()
        assert not sandbox._running(child.pid)
        assert child.wait(timeout=5) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()


def test_the_minimal_environment_holds_nothing_of_the_teacher(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET, "x")
    env = sandbox.minimal_environment(tmp_path, "token")
    assert SECRET not in env and env["HOME"] == str(tmp_path)
    assert env["BLOCKMEM_FAST"] == "1" and env[sandbox.TOKEN_VARIABLE] == "token"
    assert set(env) <= {"PATH", "HOME", "LANG", "PYTHONHASHSEED", "BLOCKMEM_FAST",
                        "BLOCKMEM_HEADLESS", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                        "OMP_WAIT_POLICY", "MPLBACKEND", "BLOCKMEM_DATA", "PYTHONPATH",
                        sandbox.TOKEN_VARIABLE}


def test_a_notebook_and_a_student_have_a_time_limit(tmp_path):
    """A notebook whose cells each stay under the cell limit still stops at the notebook's
    limit; the student's limit bounds all their notebooks."""
    solutions = tmp_path / "solutions"
    _write(_solution(), solutions / NAME)
    slow = _answer(make_exercise(_solution(), NAME))
    slow.cells[1].source = "import time\ntime.sleep(3)\nbase = 40"
    slow.cells[2].source = "import time\ntime.sleep(3)\ndef add(a, b):\n    return a + b"
    _write(slow, tmp_path / "subs" / "sam" / NAME)
    assert grading.main([str(tmp_path / "subs"), "--solutions", str(solutions), "--out",
                         str(tmp_path / "grades"), "--cell-timeout", "30",
                         "--notebook-timeout", "4"]) == 0
    rows = (tmp_path / "grades" / "grades.csv").read_text()
    assert "time left for this notebook or student" in rows or "ran out" in rows, rows


@pytest.mark.parametrize("argv, problem", [
    (["--notebook-timeout", "0"], "--notebook-timeout=0 is not allowed"),
    (["--student-timeout", "-5"], "--student-timeout=-5 is not allowed"),
])
def test_bad_limits_are_clear_errors_before_any_work(tmp_path, capsys, argv, problem):
    (tmp_path / "subs").mkdir()
    assert grading.main([str(tmp_path / "subs"), "--out", str(tmp_path / "g"), *argv]) == 2
    assert problem in capsys.readouterr().err


def test_an_unknown_isolation_level_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        grading.main([str(tmp_path), "--isolation", "chroot"])
    assert stop.value.code == 2 and "invalid choice: 'chroot'" in capsys.readouterr().err


def test_grades_are_replaced_whole_and_any_file_name_is_written(tmp_path):
    """A student folder named in bytes that are not UTF-8 (an unzipped Windows archive) is
    written as it is, and a table is never left half written."""
    name = os.fsdecode(b"caf\xe9")
    rows = [grade_report.Row(name, "01_x", "01_x.ipynb", "nb01-c3", "")]
    (tmp_path / "grades.csv").write_text("old grades\n")
    grade_report.write_tables(rows, tmp_path, "process")
    assert os.fsencode(name) in (tmp_path / "grades.csv").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grades.csv", "grades.md",
                                                           "written_answers.md"]


# --- a kernel a student's cell tampered with, reset before each check ------------------------

KIT_CHECK_SOLUTION = (
    "from blockmem_lite.checks import check_equal\nbase = 40",
    "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION",
    "check_equal(add(base, 2), 42, 'add(40, 2)')")
WRONG = "def add(a, b):\n    return a - b\n"
TRICKS = {   # each after a wrong answer; each makes an unprotected grader see no error
    "a custom exception handler hides the error":
        "get_ipython().set_custom_exc((Exception,), lambda *args, **kwargs: None)",
    "the check helper redefined": "def check_equal(*args, **kwargs):\n    print('OK')",
    "the kit's function patched in place":
        "import blockmem_lite.checks as kit\nkit.check_equal.__code__ = "
        "(lambda *args, **kwargs: None).__code__",
    "an input transformer rewrites the check":
        "get_ipython().input_transformers_post.append(lambda lines: ['pass\\n'])",
    "an AST transformer empties the check":
        "import ast\nclass Empty(ast.NodeTransformer):\n    def visit_Module(self, node):\n"
        "        return ast.Module(body=[ast.Pass()], type_ignores=[])\n"
        "get_ipython().ast_transformers.append(Empty())",
    "a post-run callback clears the error output":
        "from IPython.display import clear_output\n"
        "get_ipython().events.register('post_run_cell', lambda result: clear_output())",
}


def _kit_check_notebooks():
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [new_code_cell(src) for src in KIT_CHECK_SOLUTION]
    cells[2].metadata["tags"] = ["check"]
    for i, cell in enumerate(cells):
        cell.id = f"k{i}"
    solution = new_notebook(cells=cells)
    students = {}
    for k, (what, trick) in enumerate(TRICKS.items()):
        nb = make_exercise(solution, NAME)
        nb.cells[1].source = WRONG + trick
        students[f"s{k}"] = (what, nb)
    honest = make_exercise(solution, NAME)
    honest.cells[1].source = "def add(a, b):\n    return a + b"
    return solution, students, honest


def test_each_tampering_trick_would_fool_an_unprotected_run():
    """Teeth: run as a plain nbclient run judged by its outputs, every trick passes."""
    from nbclient import NotebookClient

    _, students, _ = _kit_check_notebooks()
    for what, nb in students.values():
        NotebookClient(nb, timeout=120, allow_errors=True, kernel_name="python3").execute()
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
        assert not errors, f"{what}: the trick did not hide the failure"


def test_the_grader_resets_the_kernel_and_judges_by_the_reply(tmp_path):
    solution, students, honest = _kit_check_notebooks()
    _write(solution, tmp_path / "solutions" / NAME)
    for name, (_, nb) in students.items():
        _write(nb, tmp_path / "subs" / name / NAME)
    _write(honest, tmp_path / "subs" / "z_honest" / NAME)
    result = _grade(tmp_path / "subs", tmp_path / "solutions", tmp_path / "grades", "auto")
    for name, (what, _) in students.items():
        assert result[(name, "nb01-k2")] == "failed", what
    assert result[("z_honest", "nb01-k2")] == "passed"
