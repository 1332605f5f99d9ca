"""The two installs and what runs where: the Makefile's student and maintainer sets, the
PyTorch build it chooses for a machine, the kit's own message for a Python or a Mac it cannot
run on, and the course copied out of an install (blockmem_lite/course.py).

This machine reaches PyPI only, so the tests check the choice the Makefile makes (``make -n``
prints the commands without running them), not PyTorch's download."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from blockmem_lite import course
from blockmem_lite.tools import platforms

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _make_dry_run(target: str, tmp_path: Path, *args, path_prefix: Path | None = None) -> str:
    """What ``make -n target`` would run for a venv that does not exist yet."""
    env = dict(os.environ)
    env.pop("TORCH_BUILD", None)
    env.pop("TORCH_PIP_ARGS", None)
    if path_prefix:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    result = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}",
                             f"PYTHON={sys.executable}", *args],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _fake_nvidia_smi(folder: Path) -> Path:
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA GeForce RTX 4060 (UUID: GPU-0)'\n")
    script.chmod(0o755)
    return folder


def _pip_install_lines(commands: str) -> list[str]:
    return [line for line in commands.splitlines() if "pip install" in line]


def test_the_student_install_has_no_test_tool_and_no_datasets():
    student = " ".join(PYPROJECT["optional-dependencies"]["notebooks"])
    for tool in ("pytest", "nbval", "ruff", "playwright", "kaleido", "transformers", "datasets"):
        assert tool not in student, f"the student install (notebooks extra) pulls in {tool}"
    assert PYPROJECT["optional-dependencies"]["dev"] == ["blockmem_lite[notebooks,data,hf,test]"]


@needs_make
@pytest.mark.skipif(sys.platform != "linux" or platforms.has_nvidia_gpu(),
                    reason="the CPU build is chosen on Linux without an NVIDIA GPU")
def test_make_lab_installs_the_student_set_and_the_cpu_torch_here(tmp_path):
    commands = _make_dry_run("setup-lab", tmp_path)
    torch_line, kit_line = _pip_install_lines(commands)[1:]
    assert CPU_INDEX in torch_line and "--no-deps" in torch_line and "torch==2.13.0" in torch_line
    assert '-e ".[notebooks]"' in kit_line and "-c " in kit_line


@needs_make
def test_make_setup_installs_the_maintainer_set(tmp_path):
    kit_line = _pip_install_lines(_make_dry_run("setup", tmp_path))[-1]
    assert '-e ".[dev]"' in kit_line and "-c " in kit_line


@needs_make
@pytest.mark.skipif(sys.platform != "linux", reason="PyPI's torch is the CUDA build on Linux only")
def test_make_takes_pypis_cuda_build_where_nvidia_smi_lists_a_gpu(tmp_path):
    fake = _fake_nvidia_smi(tmp_path / "bin")
    torch_line = _pip_install_lines(_make_dry_run("setup-lab", tmp_path, path_prefix=fake))[1]
    assert "download.pytorch.org" not in torch_line and "torch==2.13.0" in torch_line


@needs_make
def test_torch_build_and_pip_args_can_be_overridden(tmp_path):
    cuda = _pip_install_lines(_make_dry_run("setup-lab", tmp_path, "TORCH_BUILD=cuda"))[1]
    assert "download.pytorch.org" not in cuda
    cpu = _pip_install_lines(_make_dry_run("setup-lab", tmp_path, "TORCH_BUILD=cpu"))[1]
    assert CPU_INDEX in cpu
    own = _pip_install_lines(_make_dry_run("setup-lab", tmp_path,
                                           "TORCH_PIP_ARGS=--index-url https://example.org/x"))[1]
    assert "--index-url https://example.org/x" in own and CPU_INDEX not in own


@needs_make
def test_make_names_a_missing_python_in_its_own_words(tmp_path):
    result = subprocess.run(["make", "-C", str(ROOT), "setup-lab", f"VENV={tmp_path / 'venv'}",
                             "PYTHON=no-such-python3"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "blockmem_lite needs Python 3.10 or newer" in result.stdout + result.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("system, nvidia, build", [("Linux", False, "cpu"), ("Linux", True, "cuda"),
                                                   ("Darwin", False, "default"),
                                                   ("Windows", True, "default")])
def test_the_torch_build_for_each_platform(system, nvidia, build):
    assert platforms.torch_build(system, nvidia) == build
    assert (CPU_INDEX in " ".join(platforms.torch_pip_args(build))) == (build == "cpu")


def test_an_unknown_torch_build_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError, match="TORCH_BUILD='rocm'.*cpu, cuda, default"):
        platforms.torch_pip_args("rocm")


def test_the_kits_message_for_an_old_python_and_an_intel_mac():
    assert platforms.python_problem((3, 11, 7), "Linux", "x86_64") is None
    assert platforms.python_problem((3, 12, 0), "Darwin", "arm64") is None
    old = platforms.python_problem((3, 9, 6), "Darwin", "arm64")
    assert "needs Python 3.10 or newer" in old and "3.9.6" in old
    intel = platforms.python_problem((3, 12, 0), "Darwin", "x86_64")
    assert "Intel Mac" in intel and "2.2" in intel and "Colab" in intel


def test_the_platform_check_runs_on_the_standard_library_alone(tmp_path):
    """The Makefile runs the file as a script before anything is installed."""
    copy = tmp_path / "platforms.py"
    shutil.copy(ROOT / "blockmem_lite" / "tools" / "platforms.py", copy)
    result = subprocess.run([sys.executable, "-S", "-I", str(copy), "torch-pip-args", "cpu"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == CPU_INDEX, result.stderr


def test_copy_notebooks_copies_the_students_set_and_keeps_their_work(tmp_path):
    copied, kept = course.copy_notebooks(tmp_path)
    names = {str(path).replace(os.sep, "/") for path in copied}
    assert "notebooks/02_bcmt_blocks_and_decay_memory.ipynb" in names
    assert "notebooks/figures/cat.svg" in names and not kept
    assert not any("solutions" in name for name in names)
    mine = tmp_path / "notebooks" / "exercises" / "04_cat_compress_and_attend.ipynb"
    mine.write_text("my answers")
    copied, kept = course.copy_notebooks(tmp_path)
    assert copied == [] and [p.name for p in kept] == [mine.name]
    assert mine.read_text() == "my answers"
    copied, kept = course.copy_notebooks(tmp_path, overwrite=True)
    assert [p.name for p in copied] == [mine.name] and mine.read_text() != "my answers"


def test_the_lab_settings_never_replace_a_users_own(tmp_path):
    assert "JupyterLab settings:" in course.install_lab_settings(tmp_path)
    target = course.lab_settings_target(tmp_path)
    target.write_text('{"mine": true}')
    assert "kept your JupyterLab settings" in course.install_lab_settings(tmp_path)
    assert target.read_text() == '{"mine": true}'


def test_figures_and_shipped_runs_resolve_through_the_library():
    assert course.figure_path("moc").is_file()
    with pytest.raises(ValueError, match="figure='dense'.*bcmt, cat, armt, moc"):
        course.figure_path("dense")
    assert (course.shipped_runs() / "class_cpu" / "results.json").is_file()


def test_no_notebook_finds_a_file_through_the_repository_layout():
    """Notebooks copied anywhere find figures and runs through the library: no code cell
    builds a path from the package's location or to the repository's data/, and no markdown
    links a figure file."""
    import json
    for path in sorted((ROOT / "notebooks").glob("**/*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            text = "".join(cell["source"])
            if cell["cell_type"] == "code":
                assert "__file__" not in text and '"data"' not in text, (path.name, cell.get("id"))
            assert "](figures/" not in text, (path.name, cell.get("id"))


def test_a_gpu_preset_on_a_cpu_says_how_long_and_how_to_switch(monkeypatch, capsys):
    from blockmem_lite import config
    monkeypatch.delenv("BLOCKMEM_FAST", raising=False)
    monkeypatch.setattr(config, "pick_device", lambda preference="auto": __import__("torch").device("cpu"))
    cfg = config.notebook_config("gpu", arch="dense")
    printed = capsys.readouterr().out
    assert "preset 'gpu' on a CPU" in printed and "Change runtime type > GPU" in printed
    assert 'notebook_config("class"' in printed
    short = config.gpu_preset_on_cpu(cfg.replace(steps=50), rate=1e11)
    long = config.gpu_preset_on_cpu(cfg.replace(steps=5000), rate=1e11)
    assert "minutes" in short and "hours" in long          # it scales with the work
    config.notebook_config("class", arch="dense")
    assert capsys.readouterr().out == ""                   # a CPU preset says nothing
    monkeypatch.setenv("BLOCKMEM_FAST", "1")
    config.notebook_config("gpu", arch="dense")
    assert capsys.readouterr().out == ""                   # nor does fast mode (CI)


def test_the_time_a_gpu_preset_would_take_is_its_flops_at_the_cpus_rate():
    from blockmem_lite import config, registry
    from blockmem_lite.measure.flops import training_flops_per_token
    cfg = config.preset("gpu", arch="dense", device="cpu")
    m = cfg.model
    flops = training_flops_per_token(registry.get("dense").flops(m, m.seq_len, False))
    seconds = flops * cfg.train.steps * cfg.train.batch_size * m.seq_len / 1e12   # at 1 TFLOP/s
    note = config.gpu_preset_on_cpu(cfg, rate=1e12)
    assert f"about {seconds / 3600:.0f} hours to {2 * seconds / 3600:.0f} hours" in note, note


def test_the_notebooks_command_copies_even_where_lab_settings_cannot_be_written(tmp_path,
                                                                                monkeypatch,
                                                                                capsys):
    from blockmem_lite.tools import notebooks

    def read_only(prefix=None):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(course, "install_lab_settings", read_only)
    assert notebooks.main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "JupyterLab settings not written (Permission denied" in printed
    assert (tmp_path / "notebooks" / "00_welcome_and_setup.ipynb").is_file()
    (tmp_path / "file").write_text("x")
    assert notebooks.main([str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err
