"""The kit outside its checkout: the wheel carries the course, `blockmem-lite notebooks DIR`
copies it out, and the copied notebooks run from there, finding their figures and the
shipped class run through the library (notebook 10 reads it in class mode).

The wheel goes into a fresh venv with ``--no-deps``; that venv sees this one's packages
(torch, Jupyter) through a ``.pth`` file, so the install costs seconds, not minutes. Only the
kit comes from the wheel: this venv's editable install is a ``.pth`` hook that a path added
by another ``.pth`` file does not run.
"""

import json
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(path.name for path in (ROOT / "notebooks").glob("*.ipynb"))

pytest.importorskip("build", reason="the wheel test builds with `build` (make setup installs it)")


def _bin(env: Path, name: str) -> Path:
    return env / ("Scripts" if os.name == "nt" else "bin") / name


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The kit's wheel, built through its sdist, as `make dist` builds it."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel",
                    "--outdir", str(out), str(ROOT)], check=True, capture_output=True,
                   cwd=out)
    (path,) = out.glob("blockmem_lite-*.whl")
    return path


@pytest.fixture(scope="module")
def student(tmp_path_factory, wheel) -> dict:
    """A fresh venv with only the wheel of the kit, and a HOME with no caches of ours."""
    base = tmp_path_factory.mktemp("student")
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = _bin(env_dir, "python")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True, text=True)
    Path(purelib.stdout.strip(), "_outer_packages.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    home = base / "home"
    home.mkdir()
    keep = ("PATH", "LANG", "LC_ALL", "OMP_WAIT_POLICY", "TMPDIR")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env.update(HOME=str(home), USERPROFILE=str(home), PLOTLY_RENDERER="json",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", BLOCKMEM_HEADLESS="1")
    return {"python": python, "env_dir": env_dir, "home": home, "env": env, "base": base}


def _run(student: dict, *args, extra_env=None, cwd=None) -> subprocess.CompletedProcess:
    env = {**student["env"], **(extra_env or {})}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env,
                          cwd=cwd or student["home"], timeout=600)


def test_the_wheel_carries_the_course_and_no_solution(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    course = [name for name in names if name.startswith("blockmem_lite/_course/")]
    for notebook in NOTEBOOKS:
        assert f"blockmem_lite/_course/notebooks/{notebook}" in course
    exercises = sorted(p.name for p in (ROOT / "notebooks" / "exercises").glob("*.ipynb"))
    for notebook in exercises:
        assert f"blockmem_lite/_course/notebooks/exercises/{notebook}" in course
    for figure in ("bcmt", "cat", "armt", "moc"):
        assert f"blockmem_lite/_course/notebooks/figures/{figure}.svg" in course
    assert "blockmem_lite/_course/data/reproduce/class_cpu/results.json" in course
    assert "blockmem_lite/_course/jupyter/overrides.json" in course
    assert not [name for name in names if "solutions" in name or "mutants" in name]


def test_the_installed_kit_is_the_wheel_and_finds_its_course(student):
    probe = _run(student, student["python"], "-c",
                 "import blockmem_lite, blockmem_lite.course as c; from blockmem_lite import lab;"
                 "print(blockmem_lite.__file__); print(c.course_root());"
                 "print(lab.shipped_run('class'))")
    assert probe.returncode == 0, probe.stderr
    kit, root, shipped = probe.stdout.split()
    assert Path(kit).is_relative_to(student["env_dir"]), "the kit was not imported from the wheel"
    assert Path(root) == Path(kit).parent / "_course"
    assert Path(shipped).is_file() and Path(shipped).is_relative_to(Path(root))


def test_the_command_copies_the_notebooks_and_keeps_a_students_changes(student):
    script = _bin(student["env_dir"], "blockmem-lite")
    dest = student["base"] / "course"
    first = _run(student, script, "notebooks", dest)
    assert first.returncode == 0, first.stderr
    copied = dest / "notebooks"
    assert sorted(p.name for p in copied.glob("*.ipynb")) == NOTEBOOKS
    assert (copied / "figures" / "bcmt.svg").is_file()
    assert len(list((copied / "exercises").glob("*.ipynb"))) == 11
    assert not (copied / "solutions").exists()
    settings = student["env_dir"] / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert settings.is_file(), first.stdout
    mine = copied / "exercises" / "01_dense_attention_from_scratch.ipynb"
    mine.write_text(mine.read_text() + " ")
    again = _run(student, script, "notebooks", dest)
    assert again.returncode == 0 and "kept 1 file(s) you changed" in again.stdout, again.stdout
    assert mine.read_text().endswith(" ")
    wrong = _run(student, script, "notebooks", mine)
    assert wrong.returncode == 2 and "is a file" in wrong.stderr and "Traceback" not in wrong.stderr


@pytest.mark.parametrize("notebook, fast", [("00_welcome_and_setup.ipynb", True),
                                            ("02_bcmt_blocks_and_decay_memory.ipynb", True),
                                            ("10_shootout.ipynb", False)])
def test_copied_notebooks_run_from_outside_the_checkout(student, notebook, fast):
    copied = student["base"] / "course" / "notebooks"
    if not copied.is_dir():
        assert _run(student, _bin(student["env_dir"], "blockmem-lite"), "notebooks",
                    copied.parent).returncode == 0
    nb = _executed(copied / notebook, student, {"BLOCKMEM_FAST": "1"} if fast else {})
    outputs = {cell.get("id"): cell.get("outputs", []) for cell in nb["cells"]}
    if notebook.startswith("02"):
        assert any("image/svg+xml" in out.get("data", {}) for out in outputs["nb02-figure"])
    if notebook.startswith("10"):
        printed = "".join(out.get("text", "") for out in outputs["cell-3"])
        assert "the run the kit ships" in printed, printed


def _executed(path: Path, student: dict, extra: dict) -> dict:
    """``path`` run top to bottom by the student's venv, in its own folder (a cell that
    fails fails the test); the executed notebook."""
    script = ("import json, sys, nbformat\nfrom nbclient import NotebookClient\n"
              "nb = nbformat.read(sys.argv[1], as_version=4)\n"
              "NotebookClient(nb, kernel_name='python3', timeout=300,"
              " resources={'metadata': {'path': sys.argv[2]}}).execute()\n"
              "print(json.dumps(nb))\n")
    result = _run(student, student["python"], "-c", script, path, path.parent, extra_env=extra)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout)


def test_the_first_cell_installs_the_kit_where_it_is_missing(tmp_path, wheel):
    """A hosted notebook (Colab) without the kit: the setup cell with KIT set to the wheel
    installs it, with the `hosted` extra, and says which device the notebook got. Every
    dependency, pip included, is already there (the outer venv, through a .pth file): nothing
    downloads."""
    env_dir = tmp_path / "hosted"
    venv.EnvBuilder(with_pip=False).create(env_dir)      # %pip runs the outer venv's pip
    python = _bin(env_dir, "python")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True, text=True)
    Path(purelib.stdout.strip(), "_outer_packages.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    script = ("import sys, nbformat\nfrom nbclient import NotebookClient\n"
              "nb = nbformat.read(sys.argv[1], as_version=4)\n"
              "cell = next(c for c in nb.cells if c.get('id') == 'nb00-setup')\n"
              "assert 'KIT = \"\"' in cell.source\n"
              "cell.source = cell.source.replace('KIT = \"\"', 'KIT = ' + repr(sys.argv[2]))\n"
              "nb.cells = [cell]\n"
              "NotebookClient(nb, kernel_name='python3', timeout=300).execute()\n"
              "print(''.join(out.get('text', '') for out in cell.outputs))\n")
    env = {key: os.environ[key] for key in ("PATH", "LANG", "TMPDIR") if key in os.environ}
    env.update(HOME=str(tmp_path), PIP_NO_INDEX="1")
    result = subprocess.run([str(python), "-c", script,
                             str(ROOT / "notebooks" / "00_welcome_and_setup.ipynb"), str(wheel)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "device cpu" in result.stdout or "device cuda" in result.stdout, result.stdout
    where = subprocess.run([str(python), "-c", "import blockmem_lite; print(blockmem_lite.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert Path(where.stdout.strip()).is_relative_to(env_dir), where.stdout + where.stderr
