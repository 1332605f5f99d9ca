"""envcheck: OK/FAIL/-- per item, exit 1 only when a required item fails; a student install
(no test tools, no datasets, no transformers) passes quietly; usage lines name the program."""

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from blockmem_lite.__main__ import program
from blockmem_lite.tools import bench_command, envcheck, reproduce_command, train_command

ROOT = Path(__file__).resolve().parent.parent
# What `make lab` leaves out: the test extra's tools, `datasets` (data) and `transformers` (hf).
NOT_IN_A_STUDENT_INSTALL = (*envcheck.TEST_TOOLS, "datasets", "transformers")
# A subprocess in which the packages named in argv[1] (comma-separated) are not installed as
# far as Python can tell: no module to find or import, no distribution in importlib.metadata.
# It then runs `python -m blockmem_lite` with argv[2:] and reports what it imported.
HIDING_DRIVER = """
import importlib.machinery, re, sys

HIDDEN = {name for name in sys.argv[1].split(",") if name}
HEAVY = {"jupyterlab", "jupyter_server", "datasets", "transformers", "plotly", "ipywidgets",
         "IPython", "pandas", "pyarrow", "pytest", "nbval"}


class Hiding(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in HIDDEN:
            return None
        return super().find_spec(fullname, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        return (d for d in super().find_distributions(*args, **kwargs)
                if re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() not in HIDDEN)


sys.meta_path[:] = [Hiding if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from blockmem_lite.__main__ import main

code = main(sys.argv[2:])
print("heavy imports:", sorted(HEAVY & {m.split(".")[0] for m in sys.modules}), file=sys.stderr)
sys.exit(code)
"""


def _without(monkeypatch, *missing: str) -> None:
    """Make importlib.import_module fail for ``missing`` packages (and their submodules)."""
    real = importlib.import_module

    def fake(name, package=None):
        if name.split(".")[0] in missing:
            raise ImportError(f"No module named {name!r}")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)


def _hide(monkeypatch, *missing: str) -> None:
    """Make envcheck's look-up report ``missing`` packages as not installed."""
    real = envcheck.installed
    monkeypatch.setattr(envcheck, "installed",
                        lambda name: None if name in missing else real(name))


def _run(command: list[str]) -> subprocess.CompletedProcess:
    """``command`` in a subprocess that imports this checkout's kit."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=300)


def _run_hiding(tmp_path, hidden, *args: str) -> subprocess.CompletedProcess:
    driver = tmp_path / "hiding_driver.py"
    driver.write_text(HIDING_DRIVER)
    return _run([sys.executable, str(driver), ",".join(hidden), *args])


def test_run_envcheck_reports_torch_and_kit_ok():
    items = {name: (ok, detail) for name, ok, detail in envcheck.run_envcheck()}
    assert set(items) == set(envcheck.CORE + envcheck.NOTEBOOK_EXTRAS + envcheck.OPTIONAL)
    assert items["torch"][0] and "device cpu" in items["torch"][1]
    assert items["kit"][0] and "forward OK" in items["kit"][1]
    assert items["python"][0]


def test_mode_lines_say_what_the_current_state_means(monkeypatch):
    monkeypatch.delenv("BLOCKMEM_FAST", raising=False)
    monkeypatch.setenv("BLOCKMEM_HEADLESS", "1")
    items = {name: detail for name, _, detail in envcheck.run_envcheck()}
    assert items["BLOCKMEM_FAST"].startswith("not set: fast mode off, so notebooks use their "
                                             "full configs")
    assert items["BLOCKMEM_HEADLESS"] == ("BLOCKMEM_HEADLESS=1: headless mode on, so dashboards "
                                          "print text lines")


def test_main_prints_ok_lines_and_returns_0(capsys, monkeypatch):
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    assert envcheck.main([]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.startswith("OK   torch ") for line in lines)
    assert any(line.startswith("OK   kit ") for line in lines)
    assert "BLOCKMEM_FAST=1: fast mode on, so notebooks use tiny configs, as CI does" in out
    assert "all required items OK" in out
    # the detail column is aligned
    assert len({line.index(line.split()[2]) for line in lines[:4]}) == 1


def test_missing_notebook_extra_fails_unless_core(capsys, monkeypatch):
    _hide(monkeypatch, "plotly")
    items = {name: (ok, detail) for name, ok, detail in envcheck.run_envcheck()}
    assert items["plotly"][0] is False
    assert "not installed" in items["plotly"][1] and "blockmem_lite[notebooks]" in items["plotly"][1]
    assert not items["live widgets"][0] and "fall back to text" in items["live widgets"][1]
    assert envcheck.main([]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith("FAIL plotly ") for line in out.splitlines())
    assert "1 required item(s) failed: plotly" in out
    assert envcheck.main(["--core"]) == 0


@pytest.mark.parametrize("missing", ["torch", "numpy"])
def test_missing_core_package_fails_even_with_core(capsys, monkeypatch, missing):
    _without(monkeypatch, missing)
    assert envcheck.main(["--core"]) == 1
    assert f"FAIL {missing} " in capsys.readouterr().out


def test_missing_optional_extras_are_listed_not_failed(capsys, monkeypatch):
    _hide(monkeypatch, "nbval", "kaleido", "datasets", "transformers", "psutil")
    assert envcheck.main([]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    lines = {line.split()[1]: line for line in out.splitlines() if line[:4] in ("OK  ", "--  ")}
    assert lines["test"].startswith("--   test tools ")
    assert lines["test"].endswith("not installed (only `make test` needs them): nbval, kaleido")
    assert lines["datasets"].startswith("--   datasets ")
    assert "pip install 'blockmem_lite[data]'" in lines["datasets"]
    assert "pip install 'blockmem_lite[hf]'" in lines["transformers"]
    assert lines["psutil"].startswith("--   psutil ")


def test_a_student_install_passes_quietly(tmp_path):
    """`make lab`'s install, in a process where the maintainer's packages are not to be found."""
    done = _run_hiding(tmp_path, NOT_IN_A_STUDENT_INSTALL, "envcheck")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and "all required items OK" in done.stdout
    lines = {line.split()[1]: line for line in done.stdout.splitlines() if line.strip()}
    assert lines["test"].startswith("--   test tools         not installed (only `make test` "
                                    "needs them): pytest, pytest-xdist, nbval,")
    assert "not installed (only the WikiText corpora need it: pip install 'blockmem_lite[data]')" \
        in lines["datasets"]
    assert "pip install 'blockmem_lite[hf]'" in lines["transformers"]
    assert lines["lock"].startswith("OK   lock ") and "locked packages are not installed" \
        in lines["lock"]


def test_a_missing_required_package_fails_in_a_student_install(tmp_path):
    done = _run_hiding(tmp_path, (*NOT_IN_A_STUDENT_INSTALL, "jupyterlab"), "envcheck")
    assert done.returncode == 1, done.stdout + done.stderr
    assert any(line.startswith("FAIL jupyterlab ") for line in done.stdout.splitlines())
    assert "1 required item(s) failed: jupyterlab" in done.stdout


def test_envcheck_imports_only_what_it_runs(tmp_path):
    """Presence and versions come from the installed metadata: importing jupyterlab, datasets
    and the widget stack is what made the check take tens of seconds."""
    done = _run_hiding(tmp_path, (), "envcheck")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "heavy imports: []" in done.stderr


def test_a_hosted_notebook_needs_no_jupyterlab(capsys, monkeypatch):
    """Colab and Kaggle bring their own front-end: no JupyterLab, no lab extensions."""
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20250101-060000_RC00")
    monkeypatch.setattr(envcheck, "_lab_extension_dirs", lambda: [])
    _hide(monkeypatch, "jupyterlab", *NOT_IN_A_STUDENT_INSTALL)
    assert "jupyterlab" not in envcheck.required_items()
    assert envcheck.main([]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert "--   jupyterlab" in out and "not needed in Colab" in out
    assert "with Colab's widget front-end: live dashboards use widgets" in out
    monkeypatch.delenv("COLAB_RELEASE_TAG")
    assert envcheck.main([]) == 1                         # on a laptop, make lab needs it


def test_live_widgets_need_ipywidgets_plotly_and_their_lab_extensions(tmp_path, monkeypatch):
    monkeypatch.setattr(envcheck, "_lab_extension_dirs", lambda: [tmp_path])
    versions = {"plotly": "7.1.0", "ipywidgets": "8.1.0"}
    monkeypatch.setattr(envcheck, "installed", lambda name: versions.get(name))
    ok, detail = envcheck._live_widgets()[1:]
    assert not ok and "@jupyter-widgets/jupyterlab-manager" in detail
    assert "jupyterlab-plotly" in detail and "fall back to text" in detail
    (tmp_path / "@jupyter-widgets" / "jupyterlab-manager").mkdir(parents=True)
    ok, detail = envcheck._live_widgets()[1:]
    assert not ok and "jupyterlab-plotly" in detail and "jupyterlab-manager" not in detail
    (tmp_path / "jupyterlab-plotly").mkdir()
    ok, detail = envcheck._live_widgets()[1:]
    assert ok and detail.startswith("ipywidgets 8.1.0 and plotly 7.1.0")
    versions.pop("ipywidgets")
    ok, detail = envcheck._live_widgets()[1:]
    assert not ok and "needs ipywidgets" in detail
    assert "anywidget" not in detail                 # plain figures in an Output: no anywidget


def test_the_groups_follow_pyproject_extras():
    tomllib = pytest.importorskip("tomllib")
    requirements = pytest.importorskip("packaging.requirements")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]

    def names(extra):
        return {envcheck.normalize(requirements.Requirement(line).name) for line in extras[extra]}

    assert set(envcheck.NOTEBOOK_EXTRAS) <= names("notebooks")
    assert set(envcheck.TEST_TOOLS) <= names("test")
    # each one is reported somewhere; setuptools, the build backend, is in most venvs anyway
    assert names("test") - {"setuptools"} <= set(NOT_IN_A_STUDENT_INSTALL)


# --- usage lines name the program that ran ------------------------------------------------


@pytest.mark.parametrize("argv0, name", [
    ("/home/me/kit/.venv/bin/blockmem-lite", "blockmem-lite"),
    ("C:/kit/.venv/Scripts/blockmem-lite.exe", "blockmem-lite"),
    ("/home/me/kit/blockmem_lite/__main__.py", "python -m blockmem_lite"),
    ("/home/me/kit/.venv/bin/pytest", "python -m blockmem_lite"),
    ("", "python -m blockmem_lite"),
])
def test_program_is_the_name_the_user_typed(argv0, name):
    assert program(argv0) == name


def _console_script() -> str:
    script = shutil.which("blockmem-lite", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the blockmem-lite console script is not installed (pip install -e .)")
    return script


@pytest.mark.parametrize("args, usage", [
    (["--help"], "usage: blockmem-lite COMMAND [options]"),
    (["envcheck", "--help"], "usage: blockmem-lite envcheck "),
])
def test_the_console_script_names_itself(args, usage):
    done = _run([_console_script(), *args])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(usage)
    assert "python -m blockmem_lite" not in done.stdout


@pytest.mark.parametrize("args, usage", [
    (["--help"], "usage: python -m blockmem_lite COMMAND [options]"),
    (["envcheck", "--help"], "usage: python -m blockmem_lite envcheck "),
])
def test_python_dash_m_names_itself(args, usage):
    done = _run([sys.executable, "-m", "blockmem_lite", *args])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(usage)
    assert "blockmem-lite" not in done.stdout


@pytest.mark.parametrize("make", [train_command.train_parser, bench_command.bench_parser,
                                  reproduce_command.reproduce_parser])
def test_the_cli_parsers_take_the_program_name(monkeypatch, make):
    command = make.__name__.removesuffix("_parser")
    monkeypatch.setattr(sys, "argv", ["/venv/bin/blockmem-lite", command, "--help"])
    assert make().format_usage().startswith(f"usage: blockmem-lite {command} ")
    monkeypatch.setattr(sys, "argv", ["/kit/blockmem_lite/__main__.py", command, "--help"])
    assert make().format_usage().startswith(f"usage: python -m blockmem_lite {command} ")


# --- the lock: installed versions against the tested ones --------------------------------

LOCK_TEXT = """# This file was autogenerated by uv via the following command:
#    make lock
numpy==1.0.0
    # via blockmem-lite (pyproject.toml)
torch==2.13.0
Typing_Extensions==0.0.1
appnope==0.1.4 ; sys_platform == 'darwin'
nvidia-cublas==13.1.1.3 ; sys_platform == 'linux'
not-a-real-package==1.2.3
"""


def test_read_lock_keeps_the_lines_that_apply_here(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.platform", "linux")
    path = tmp_path / "requirements.lock"
    path.write_text(LOCK_TEXT)
    locked = envcheck.read_lock(path)
    assert locked["numpy"] == "1.0.0" and locked["typing-extensions"] == "0.0.1"
    assert "appnope" not in locked                      # darwin only
    assert "via" not in " ".join(locked)


def test_lock_differences_name_each_package_with_both_versions():
    locked = {"transformers": "5.23.0", "torch": "2.13.0", "triton": "3.7.1",
              "nvidia-cublas": "13.1", "plotly": "7.1.0", "gone": "1.0"}
    installed = {"transformers": "5.24.0", "torch": "2.13.0+cpu", "plotly": "7.1.0"}
    differ, missing = envcheck.lock_differences(locked, installed)
    assert differ == ["transformers 5.24.0, tested with 5.23.0"]   # +cpu is the same torch
    assert missing == ["gone"]                  # triton / nvidia-*: torch's build, not compared


def test_the_lock_item_reports_a_drift_without_failing_the_check(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    path = tmp_path / "requirements.lock"
    path.write_text(LOCK_TEXT)
    items = {name: (ok, detail) for name, ok, detail in envcheck.run_envcheck(path)}
    ok, detail = items["lock"]
    assert not ok
    assert f"numpy {importlib.import_module('numpy').__version__}, tested with 1.0.0" in detail
    assert "locked packages are not installed" in detail and "make lab" in detail
    assert envcheck.main(["--lock", str(path)]) == 0             # optional: a report only
    assert "[optional]" in capsys.readouterr().out


def test_the_checkout_lock_matches_or_names_what_differs():
    locked = envcheck.read_lock(envcheck.default_lock())
    differ, missing = envcheck.lock_differences(locked, envcheck.installed_versions())
    ok, detail = {name: (ok, detail) for name, ok, detail in envcheck.run_envcheck()}["lock"]
    assert ok == (not differ) and all(line in detail for line in differ)


def test_locked_packages_not_installed_are_counted_not_failed(tmp_path):
    """A student install leaves the test extras of the lock out: that is no drift."""
    numpy = importlib.import_module("numpy").__version__
    path = tmp_path / "requirements.lock"
    path.write_text(f"numpy=={numpy}\nnot-a-real-package==1.2.3\nnor-this-one==2.0\n")
    _, ok, detail = envcheck._lock(path)
    assert ok, detail
    assert detail.startswith(f"all 1 installed packages of {path.name} are at the tested")
    assert "2 locked packages are not installed" in detail


def test_no_lock_file_is_said_not_failed(tmp_path):
    _, ok, detail = envcheck._lock(tmp_path / "requirements.lock")
    assert ok and "not compared" in detail


def test_a_missing_lock_argument_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        envcheck.main(["--lock", str(tmp_path / "nope.lock")])
    assert "--lock=" in capsys.readouterr().err


def test_the_torch_hint_names_the_locked_version(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("numpy==2.3.0\ntorch==9.8.7+cpu\n    # via blockmem-lite\n")
    assert "install torch==9.8.7 first" in envcheck.torch_install_hint(lock)
    assert "install torch first" in envcheck.torch_install_hint(tmp_path / "absent.lock")


def test_a_vendored_copy_later_on_sys_path_is_not_the_installed_version(tmp_path, monkeypatch):
    """setuptools puts its _vendor folder (older packaging, platformdirs) at the end of sys.path
    when imported; the version that counts is the first, the one an import loads."""
    vendored = tmp_path / "_vendor" / "packaging-1.0.dist-info"
    vendored.mkdir(parents=True)
    (vendored / "METADATA").write_text("Metadata-Version: 2.1\nName: packaging\nVersion: 1.0\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path / "_vendor")])
    from importlib import metadata
    assert envcheck.installed_versions()["packaging"] == metadata.version("packaging") != "1.0"
