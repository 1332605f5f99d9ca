"""The bubblewrap sandbox shows an allow-list and runs its kernel unprivileged: what a hostile
notebook could read before (the machine's secrets, the kit's repository and its .git, the
solutions, another checkout, the submissions, a home folder) is absent inside; the kernel is
never root; it imports the student edition of the kit (tools/student_kit.py)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from blockmem_lite import course
from blockmem_lite.tools import sandbox, student_kit
from blockmem_lite.tools.exercises import ExerciseError, solutions_dir
from blockmem_lite.tools.release import solution_texts

needs_bubblewrap = pytest.mark.skipif(not sandbox.bubblewrap_works(),
                                      reason="bubblewrap (bwrap) is missing or may not create "
                                      "namespaces here: apt install bubblewrap")
REPO = sandbox.REPOSITORY
IS_CHECKOUT = (REPO / ".git").exists() and (REPO / "notebooks" / "solutions").is_dir()
ROOT = os.geteuid() == 0

# Run inside (or outside) a sandbox: how each path of argv[1] (JSON) looks, the ids, and
# every solution notebook, .git or mutants folder found by walking the visible disk.
PROBE = r'''
import json, os, sys
def state(path):
    if not os.path.lexists(path):
        return "absent"
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").close()
        return "readable"
    except OSError:
        return "unreadable"
found = []
if sys.argv[2] == "walk":
    for top, dirs, files in os.walk("/"):
        if top in ("/proc", "/sys", "/dev"):
            dirs[:] = []
            continue
        found += [os.path.join(top, d) for d in dirs if d in (".git", "mutants")]
        found += [os.path.join(top, f) for f in files
                  if f.endswith(".ipynb") and "solutions" in top]
paths = {p: state(p) for p in json.loads(sys.argv[1])}
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "found": found, "paths": paths,
                  "lists": {p: os.listdir(p) for p, s in paths.items()
                            if s == "readable" and os.path.isdir(p)}}))
'''


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)


def _probe(prefix: list[str], paths: list[Path], walk: bool = False, **kwargs) -> dict:
    """PROBE's answer, run as ``prefix`` + its command line."""
    done = _run([*prefix, "-c", PROBE, json.dumps([str(p) for p in paths]),
                 "walk" if walk else "-"], **kwargs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def planted():
    """What a student must not reach, planted outside /tmp (the sandbox's /tmp is its own):
    another checkout of the kit with its solutions, a class's submissions, a home folder's
    secret. Returns the paths to look for."""
    base = Path(tempfile.mkdtemp(prefix="blockmem-plant-", dir="/var/tmp"))
    places = [base / "kit" / "notebooks" / "solutions" / "01_x.ipynb",
              base / "submitted" / "alice" / "01_x.ipynb",
              base / "home" / "teacher" / "secret.txt"]
    home = Path("/home") / f"blockmem-test-{uuid.uuid4().hex[:8]}"
    if os.access("/home", os.W_OK):
        places.append(home / "secret.txt")
    mine = Path.home() / f"blockmem-test-secret-{uuid.uuid4().hex[:8]}"    # the grader's home
    if os.access(Path.home(), os.W_OK):
        places.append(mine)
    for path in places:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"cells": [], "secret": "TEACHER ONLY"}')
    for folder in [base, *(p for path in places for p in path.parents if p.is_relative_to(base)),
                   *([home] if home.exists() else [])]:
        folder.chmod(0o755)                     # nothing but the sandbox keeps them out
    yield places
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    mine.unlink(missing_ok=True)


def _forbidden(planted: list[Path]) -> list[Path]:
    """Every path a graded kernel must not see."""
    paths = [Path("/etc/shadow"), Path("/root"), Path("/home"), Path.home(), REPO, REPO / ".git",
             REPO / "notebooks" / "solutions", REPO / "tests" / "mutants",
             REPO / "pyproject.toml", REPO / "blockmem_lite", *planted]
    return list(dict.fromkeys(p for p in paths if os.path.lexists(p)))


PYTHON = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.executable]


def _on_the_way(folder: str, python: list[str]) -> set[str]:
    """The names a folder may show: those leading to the Python environment ``python``
    (its prefixes and interpreter), bound at its real paths (a venv inside the repository,
    a pyenv under /root)."""
    places = [Path(p).resolve() for p in python]
    return {p.relative_to(folder).parts[0] for p in places
            if p.is_relative_to(folder) and p != Path(folder)}


def _assert_absent(result: dict, python: list[str] = PYTHON) -> None:
    """Nothing readable but the folders on the way to the Python environment."""
    seen = {p: s for p, s in result["paths"].items() if s == "readable"
            and not set(result["lists"].get(p, ["(a file)"])) <= _on_the_way(p, python)}
    assert not seen, f"the sandbox shows {seen}: {result['lists']}"
    assert not result["found"], f"the sandbox shows {result['found']}"


@needs_bubblewrap
def test_the_kernel_sees_only_the_allow_list_and_is_not_root(planted):
    forbidden = _forbidden(planted)
    assert len(forbidden) >= len(planted) + 1
    outside = _probe([sys.executable], forbidden)         # teeth: here each one is readable
    forbidden = [p for p in forbidden if outside["paths"][str(p)] == "readable"]
    assert set(map(str, planted)) <= set(map(str, forbidden)), outside  # (as root: every one)
    assert not ROOT or len(forbidden) == len(outside["paths"]), outside
    with sandbox.Sandbox("bubblewrap") as box:
        inside = _probe(box.wrap([sys.executable]), forbidden, walk=True)
        passwd = _run(box.wrap(["cat", "/etc/passwd"])).stdout
    _assert_absent(inside)
    if ROOT:
        assert (inside["uid"], inside["gid"]) == (sandbox.NOBODY, sandbox.NOBODY)
    else:
        assert inside["uid"] == os.getuid() != 0
    assert [line.split(":")[0] for line in passwd.splitlines()] == \
        ["root", "nobody" if inside["uid"] == sandbox.NOBODY else "student"]


@needs_bubblewrap
def test_writing_anywhere_but_work_fails():
    """Only ``work/`` (and the kernel's connection folder, /tmp and /dev/shm, all its own)
    may be written; the kit, the environment and the private folder are read-only."""
    with sandbox.Sandbox("bubblewrap") as box:
        checks = box.kit / "blockmem_lite" / "checks.py"
        before = checks.read_bytes()
        targets = [box.root / "planted", checks, Path(sys.prefix) / "planted", Path("/usr/planted"),
                   Path("/etc/passwd"), box.work / "allowed"]
        code = ("import json, sys\nout = {}\nfor p in json.loads(sys.argv[1]):\n"
                "    try:\n        open(p, 'a').write('x')\n        out[p] = 'written'\n"
                "    except OSError as e:\n        out[p] = type(e).__name__\n"
                "print(json.dumps(out))")
        done = _run(box.wrap([sys.executable, "-c", code, json.dumps([str(t) for t in targets])]))
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result.pop(str(box.work / "allowed")) == "written"
        assert set(result.values()) <= {"PermissionError", "OSError", "FileNotFoundError"}, result
        assert checks.read_bytes() == before
        assert not (box.root / "planted").exists()
        # the sandbox's / is a tmpfs of its own: an ordinary user may write there, never here
        _run(box.wrap([sys.executable, "-c", "open('/planted-by-the-sandbox', 'a')"]))
        assert not Path("/planted-by-the-sandbox").exists()


@needs_bubblewrap
@pytest.mark.skipif(not IS_CHECKOUT or shutil.which("git") is None,
                    reason="needs the kit's git checkout and git")
def test_git_cannot_show_the_solutions_from_inside():
    solution = next((REPO / "notebooks" / "solutions").glob("*.ipynb")).relative_to(REPO)
    show = ["git", "-c", "safe.directory=*", "-C", "{}", "show", f"HEAD:{solution.as_posix()}"]
    here = _run([a.replace("{}", str(REPO)) for a in show])
    assert here.returncode == 0 and "cells" in here.stdout        # teeth: it works outside
    with sandbox.Sandbox("bubblewrap") as box:
        for where in (box.kit, box.kit / "blockmem_lite", box.work, REPO, REPO / "notebooks"):
            inside = _run(box.wrap([a.replace("{}", str(where)) for a in show]))
            assert inside.returncode != 0 and "cells" not in inside.stdout, where


@needs_bubblewrap
def test_the_kernel_imports_the_student_kit_and_finds_its_course():
    code = ("import json, blockmem_lite\nfrom blockmem_lite import course\n"
            "print(json.dumps([blockmem_lite.__file__, str(course.course_root()), "
            "str(course.shipped_runs())]))")
    with sandbox.Sandbox("bubblewrap") as box:
        done = _run(box.wrap([sys.executable, "-c", code]))
        assert done.returncode == 0, done.stderr
        module, root, runs = map(Path, json.loads(done.stdout))
        assert module.is_relative_to(box.kit) and root.is_relative_to(box.kit)
        assert root == box.kit / "blockmem_lite" / "_course"
        assert runs.is_relative_to(box.kit)


KERNEL = r'''
import asyncio, sys
from blockmem_lite.tools.sandbox import Sandbox

async def main(code):
    with Sandbox("bubblewrap") as box:
        km = box.kernel_manager()
        with box.log.open("wb") as log:
            await km.start_kernel(env=box.env, stdout=log, stderr=log)
        client, out = km.client(), []
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=120)
            reply = await client.execute_interactive(
                code, timeout=300, output_hook=lambda m: out.append(m["content"].get("text", "")))
            print("".join(out), reply["content"]["status"], reply["content"].get("evalue", ""))
        except Exception:
            print(box.log.read_text(errors="replace"), file=sys.stderr)
            raise
        finally:
            client.stop_channels()
            await km.shutdown_kernel(now=True)

asyncio.run(main(sys.argv[1]))
'''
NEEDS = r'''
import getpass, os, sys, torch, plotly.graph_objects, blockmem_lite
from blockmem_lite.lab.run import shipped_run
from torch.utils.data import DataLoader, TensorDataset
batches = [b[0].tolist() for b in DataLoader(TensorDataset(torch.arange(4.)), batch_size=2,
                                              num_workers=2)]
print(os.getuid(), getpass.getuser(), sys.prefix, shipped_run("class") is not None, batches)
'''


@needs_bubblewrap
def test_a_real_kernel_starts_and_has_what_notebooks_need():
    done = _run([sys.executable, "-c", KERNEL, NEEDS])
    assert done.returncode == 0, done.stderr[-3000:]
    uid, user, prefix, shipped, *_ = done.stdout.split()
    assert done.stdout.split()[-1] == "ok", done.stdout
    assert (uid, user) == ((str(sandbox.NOBODY), "nobody") if ROOT else (str(os.getuid()),
                                                                         "student"))
    assert prefix == sys.prefix and shipped == "True"
    assert "[[0.0, 1.0], [2.0, 3.0]]" in done.stdout


@needs_bubblewrap
@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests do not run in a venv")
def test_a_venv_reached_through_a_symlink_under_tmp_starts_a_kernel(tmp_path):
    real = Path(sys.prefix).resolve()
    link = Path(tempfile.gettempdir()) / f"blockmem-venv-{uuid.uuid4().hex[:8]}"
    link.symlink_to(real)
    try:
        ops = sandbox._read_only([link])
        assert ("--ro-bind", str(real), str(real)) in ops and \
            ("--symlink", str(real), str(link)) in ops
        done = _run([str(link / "bin" / "python"), "-c", KERNEL,
                     "import sys; print(sys.prefix)"], cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split()[:2] == [str(link), "ok"]
    finally:
        link.unlink()


NOBODY_SCRIPT = r'''
import importlib.util, json, subprocess, sys
spec = importlib.util.spec_from_file_location("sandbox_by_path", sys.argv[1])
sandbox = sys.modules["sandbox_by_path"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
with sandbox.Sandbox("bubblewrap", kit=sys.argv[2]) as box:
    cmd = box.wrap([sys.executable, "-c", sys.argv[3], sys.argv[4], "walk"])
    done = subprocess.run(cmd, capture_output=True, text=True)
print(json.dumps({"cmd": cmd, "rc": done.returncode, "out": done.stdout, "err": done.stderr,
                  "python": [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.executable]}))
'''


def _python_for_nobody() -> str | None:
    """An interpreter uid 65534 may run (this one, or the system's)."""
    for python in (sys.executable, "/usr/bin/python3"):
        done = _run([*sandbox.DROP_TO_NOBODY, python, "-c", "import sys; print(sys.base_prefix)"],
                    cwd="/")
        if done.returncode == 0 and Path(done.stdout.strip()).is_dir() and \
                (python != sys.executable or done.stdout.strip() == sys.base_prefix):
            return python
    return None


@needs_bubblewrap
@pytest.mark.skipif(not ROOT or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run a grader as an ordinary user")
def test_an_ordinary_user_gets_the_same_allow_list(planted):
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no Python here that uid 65534 may run")
    switch = [*sandbox.DROP_TO_NOBODY, python]
    if _run([*sandbox.DROP_TO_NOBODY, "bwrap", "--ro-bind", "/", "/", "--unshare-all",
             "true"]).returncode != 0:
        pytest.skip("unprivileged user namespaces are not allowed here")
    kit = Path(tempfile.mkdtemp(prefix="blockmem-kit-", dir="/var/tmp"))
    try:
        kit.chmod(0o755)
        student_kit.stage_student_kit(kit / "kit")
        outside = _probe(switch, _forbidden(planted), cwd="/")
        visible = [p for p, state in outside["paths"].items() if state == "readable"]
        assert {str(p) for p in planted[:3]} <= set(visible)   # teeth: nobody may read them
        done = _run([*switch, "-c", NOBODY_SCRIPT, sandbox.__file__, str(kit / "kit"), PROBE,
                     json.dumps(visible)], cwd="/")
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["rc"] == 0, answer["err"]
        assert "--unshare-all" in answer["cmd"] and "setpriv" not in answer["cmd"]
        inside = json.loads(answer["out"])
        _assert_absent(inside, answer["python"])
        assert (inside["uid"], inside["gid"]) == (sandbox.NOBODY, sandbox.NOBODY)
    finally:
        shutil.rmtree(kit, ignore_errors=True)


@pytest.mark.skipif(not ROOT or shutil.which("setpriv") is None,
                    reason="the process level drops to uid 65534 only where the grader is root")
def test_the_process_level_drops_root_to_nobody(monkeypatch):
    python = "/usr/bin/python3"                 # an interpreter any user may run
    if not os.access(python, os.X_OK) or _python_for_nobody() is None:
        pytest.skip("no Python here that uid 65534 may run")
    monkeypatch.setattr(sandbox, "_nobody_may_run_python", lambda: True)
    assert "uid 65534 (nobody)" in sandbox.describe("process")
    target = REPO / f"planted-{uuid.uuid4().hex[:8]}"
    code = (f"import os\nopen({str(target)!r}, 'w').close()" if IS_CHECKOUT else "pass")
    with sandbox.Sandbox("process") as box:
        assert os.stat(box.work).st_uid == sandbox.NOBODY
        ids = _run(box.wrap([python, "-c", "import os; print(os.getuid(), os.getgid())"]),
                   cwd=box.work, env=box.env)
        shadow = _run(box.wrap(["cat", "/etc/shadow"]), cwd=box.work, env=box.env)
        write = _run(box.wrap([python, "-c", code]), cwd=box.work, env=box.env)
    assert ids.stdout.split() == [str(sandbox.NOBODY)] * 2
    assert shadow.returncode != 0 and "Permission denied" in shadow.stderr
    if IS_CHECKOUT:
        assert write.returncode != 0 and not target.exists()


def test_the_staged_kit_is_the_student_edition(tmp_path):
    dest = student_kit.stage_student_kit(tmp_path / "kit")
    files = [p.relative_to(dest) for p in dest.rglob("*")]
    assert not [f for f in files if {"solutions", "mutants", "tests", ".git", "__pycache__"}
                & set(f.parts)]
    assert Path("blockmem_lite/__init__.py") in files
    exercises = [f for f in files if f.match("blockmem_lite/_course/notebooks/exercises/*.ipynb")]
    root = course.course_root()
    assert len(exercises) == len(list(root.glob("notebooks/exercises/*.ipynb"))) > 0
    assert all(f.suffix == ".py" for f in files if "_course" not in f.parts and
               (dest / f).is_file())


@pytest.mark.skipif(not solutions_dir().is_dir(), reason="needs the checkout's solutions")
def test_staging_refuses_a_kit_that_holds_a_solution(tmp_path, monkeypatch):
    answer = max(solution_texts(solutions_dir()), key=len)
    package = tmp_path / "src" / "blockmem_lite"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("# nothing of an answer here\n")
    monkeypatch.setattr(student_kit, "PACKAGE", package)
    assert student_kit.stage_student_kit(tmp_path / "clean").is_dir()    # teeth: it stages
    (package / "helpers.py").write_text(f"'''{answer}'''\n")
    with pytest.raises(ExerciseError, match="helpers.py: the solution region"):
        student_kit.stage_student_kit(tmp_path / "leaky")
    assert not (tmp_path / "leaky" / "blockmem_lite").exists()


@pytest.mark.parametrize("kwargs, problem", [
    ({"level": "auto"}, "level='auto' is not allowed: expected one of bubblewrap, process"),
    ({"level": "process", "kit": "/nonexistent"}, "kit='/nonexistent' is not allowed"),
])
def test_bad_sandbox_arguments_are_clear_errors(kwargs, problem):
    with pytest.raises(sandbox.SandboxError, match=problem.replace("(", r"\(")):
        sandbox.Sandbox(**kwargs)


@pytest.mark.skipif(not IS_CHECKOUT, reason="needs the kit's git checkout")
def test_a_data_folder_holding_the_repository_is_refused(monkeypatch):
    monkeypatch.setenv("BLOCKMEM_DATA", str(REPO.parent))
    with sandbox.Sandbox("process") as box, pytest.raises(sandbox.SandboxError,
                                                          match="holds the kit's repository"):
        box.mounts()
