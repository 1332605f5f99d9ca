"""What runs where, checked before anything is installed: the Python version, Intel Macs,
and which PyTorch build a machine should get.

The Makefile runs this file as a plain script with the Python it was given, before the
kit or any of its dependencies exist, so it imports only the standard library and keeps
to syntax that an old Python can still parse far enough to print the kit's own message.

    python blockmem_lite/tools/platforms.py check          # exit 1 with a message
    python blockmem_lite/tools/platforms.py torch-build    # cpu | cuda | default
    python blockmem_lite/tools/platforms.py torch-pip-args cpu
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

MIN_PYTHON = (3, 10)
# PyTorch's own index of CPU-only wheels: PyPI's Linux torch is the CUDA build, several GB
# of libraries a machine without an NVIDIA GPU never uses.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_BUILDS = ("cpu", "cuda", "default")


def python_problem(version=None, system=None, machine=None):
    """Why this Python cannot run the kit (one paragraph), or None where it can."""
    version = tuple(sys.version_info[:3]) if version is None else tuple(version)
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    if system == "Darwin" and machine == "x86_64":
        return ("blockmem_lite does not run on an Intel Mac: PyTorch stopped publishing macOS "
                "x86_64 wheels after 2.2, and the kit needs PyTorch 2.4.1 or newer. Use a Mac "
                "with Apple silicon, a Linux or Windows machine, or a hosted notebook such as "
                "Colab (docs/INSTALL.md: 'Colab and other hosted notebooks').")
    if version[:2] < MIN_PYTHON:
        found = ".".join(str(part) for part in version)
        wanted = ".".join(str(part) for part in MIN_PYTHON)
        return (f"blockmem_lite needs Python {wanted} or newer; {sys.executable} is {found} "
                "(macOS's own python3 is 3.9). Install a newer Python (python.org, Homebrew, "
                "pyenv, conda or your system's packages) and name it: "
                "make lab PYTHON=python3.12")
    return None


def has_nvidia_gpu():
    """Whether this machine has an NVIDIA GPU with its driver loaded."""
    gpus = "/proc/driver/nvidia/gpus"
    if os.path.isdir(gpus) and os.listdir(gpus):
        return True
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def torch_build(system=None, nvidia=None):
    """Which PyTorch build to install: ``cpu`` on Linux without an NVIDIA GPU (PyTorch's CPU
    index), ``cuda`` on Linux with one (PyPI's Linux wheel is the CUDA build), ``default``
    elsewhere (PyPI's macOS wheel runs on the CPU and Apple's GPU; its Windows wheel is
    the CPU build)."""
    system = platform.system() if system is None else system
    if system != "Linux":
        return "default"
    nvidia = has_nvidia_gpu() if nvidia is None else nvidia
    return "cuda" if nvidia else "cpu"


def torch_pip_args(build):
    """pip's extra arguments that fetch ``build``. The CPU index is an extra index, not the
    only one: pip then prefers its ``2.13.0+cpu`` to PyPI's ``2.13.0`` (a local version
    sorts after its public one), and everything else still comes from PyPI."""
    if build not in TORCH_BUILDS:
        raise ValueError(f"TORCH_BUILD={build!r} is not a PyTorch build: expected one of "
                         f"{', '.join(TORCH_BUILDS)}")
    return ["--extra-index-url", TORCH_CPU_INDEX] if build == "cpu" else []


def main(argv):
    if argv == ["check"]:
        problem = python_problem()
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    if argv == ["torch-build"]:
        print(torch_build())
        return 0
    if len(argv) == 2 and argv[0] == "torch-pip-args":
        try:
            print(" ".join(torch_pip_args(argv[1])))
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
        return 0
    print("usage: platforms.py check | torch-build | torch-pip-args cpu|cuda|default",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
