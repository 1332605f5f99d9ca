"""``python -m blockmem_lite envcheck``: is this environment ready for the kit and its notebooks?

Prints one aligned line per item and exits 1 only when a required item fails. ``OK``: present
and working; ``FAIL``: missing or broken (required ones decide the exit code, optional ones
are marked ``[optional]``); ``--``: an optional extra that is not installed, which is normal
in a student install. Required: Python >= 3.10, torch, numpy and the kit itself (a tiny model
runs a forward pass); the ``notebooks`` extra (plotly, ipywidgets, jupyterlab, ipykernel)
too unless ``--core``. Optional: ``datasets`` (the ``data`` extra: WikiText),
``transformers`` (``hf``: the Hugging Face adapter), the test tools (``make test`` only),
psutil, widgets in JupyterLab, the lock, and the mode variables. In a hosted notebook
(Colab, Kaggle: ``HOSTED``) JupyterLab and its extensions are not needed: it has its own.

Kit design choice: the check is fast (about a second beyond importing torch) because it
imports only what it runs (torch, numpy, the kit); every other package is looked up in the
installed metadata (``importlib.metadata``, ``importlib.util.find_spec``), and whether the
live widgets can draw in JupyterLab is read from the installed packages and JupyterLab
extensions rather than by building one (importing jupyterlab, datasets and
ipywidgets takes seconds to tens of seconds).

The ``lock`` item compares every installed package with ``requirements.lock``, the
versions ``make test`` passed with, and names each difference ("transformers 5.24.0,
tested with 5.23.0"); locked packages that are not installed (the extras a student install
leaves out) are counted, not failed. PyTorch's own build (triton, the CUDA libraries) is
left out: the platform's torch wheel chooses it; torch is compared without its local label
(2.13.0+cpu is 2.13.0).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from blockmem_lite.__main__ import program

MIN_PYTHON = (3, 10)
CORE = ("python", "torch", "numpy", "kit")
NOTEBOOK_EXTRAS = ("plotly", "ipywidgets", "jupyterlab", "ipykernel")
MODULE_OF = {"pytest-xdist": "xdist"}          # distributions whose module has another name
TEST_TOOLS = ("pytest", "pytest-xdist", "nbval", "nbformat", "nbclient", "ruff", "kaleido",
              "playwright", "build")
OPTIONAL = ("datasets", "transformers", "test tools", "psutil", "live widgets", "lock",
            "BLOCKMEM_FAST", "BLOCKMEM_HEADLESS")
NOTEBOOKS_HINT = "pip install 'blockmem_lite[notebooks]', or make lab"
LOCK_NAME = "requirements.lock"
# PyTorch's build: chosen by the platform's torch wheel (TORCH_SPEC), not by the lock
TORCH_BUILD = re.compile(r"^(triton|nvidia-.*|cuda-.*)$")
# The JupyterLab extensions (folders under share/jupyter/labextensions) a live view draws
# through: ipywidgets' Output, and plotly's renderer for the figure drawn into it (each ships
# with its package).
LAB_EXTENSIONS = {"ipywidgets": "@jupyter-widgets/jupyterlab-manager",
                  "plotly": "jupyterlab-plotly"}
# Hosted notebooks bring their own Jupyter front-end (no JupyterLab, no lab extensions); each
# sets an environment variable in its kernels.
HOSTED = {"COLAB_RELEASE_TAG": "Colab", "KAGGLE_KERNEL_RUN_TYPE": "Kaggle"}

Item = tuple[str, bool | None, str]    # (name, ok, detail); ok None: optional, not installed


def installed(name: str) -> str | None:
    """The version of distribution ``name`` when it and its module ``name`` are installed,
    else None. Nothing is imported (a metadata look-up and a finder query: milliseconds)."""
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
    return version if importlib.util.find_spec(MODULE_OF.get(name, name)) is not None else None


def hosted_notebook() -> str | None:
    """The hosted notebook service this kernel runs in ("Colab"), or None."""
    return next((name for variable, name in HOSTED.items() if variable in os.environ), None)


def _version(module) -> str:
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = metadata.version(module.__name__)
        except metadata.PackageNotFoundError:
            version = "unknown version"
    return str(version)


def _package(name: str, why: str) -> Item:
    """A package the check imports anyway (torch, numpy): an import failure is reported."""
    try:
        module = importlib.import_module(name)
    except Exception as err:  # any import failure is reported, not raised
        return name, False, f"cannot import: {type(err).__name__}: {err} ({why})"
    return name, True, _version(module)


def _notebook_package(name: str, why: str) -> Item:
    """A package of the ``notebooks`` extra: required unless ``--core``."""
    version = installed(name)
    if version is None:
        return name, False, f"not installed ({why}: {NOTEBOOKS_HINT})"
    return name, True, version


def _jupyterlab() -> Item:
    """JupyterLab: required for ``make lab``, not in a hosted notebook (its own front-end)."""
    service = hosted_notebook()
    if service and installed("jupyterlab") is None:
        return "jupyterlab", None, f"not installed (not needed in {service}: its own front-end)"
    return _notebook_package("jupyterlab", "make lab opens it")


def _optional_package(name: str, need: str) -> Item:
    """A package only some work needs: its version, or ``--`` and who needs it (never FAIL)."""
    version = installed(name)
    return (name, True, version) if version else (name, None, f"not installed ({need})")


def _test_tools() -> Item:
    """The ``test`` extra's tools on one line: ``make test`` needs them, a student does not."""
    versions = {name: installed(name) for name in TEST_TOOLS}
    have = ", ".join(f"{name} {version}" for name, version in versions.items() if version)
    missing = [name for name, version in versions.items() if version is None]
    if not missing:
        return "test tools", True, have
    return "test tools", None, f"not installed (only `make test` needs them): {', '.join(missing)}"


def default_lock() -> Path:
    """requirements.lock of the checkout the kit is imported from (absent in a wheel)."""
    return Path(__file__).resolve().parents[2] / LOCK_NAME


def normalize(name: str) -> str:
    """A package name as PEP 503 compares it: ``Typing_Extensions`` -> ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _marker_applies(marker: str) -> bool | None:
    """Whether a lock line's environment marker holds here (None: packaging is missing)."""
    try:
        from packaging.markers import Marker
    except ImportError:
        return None
    return Marker(marker).evaluate()


def read_lock(path: Path) -> dict[str, str]:
    """{normalized name: version} of the lock's lines that apply to this interpreter.

    Lines are ``name==version`` with an optional ``; marker`` (uv's universal lock);
    comments and ``# via`` lines are skipped. Without ``packaging`` to evaluate them,
    lines with a marker are skipped.
    """
    locked = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        requirement, _, marker = line.partition(";")
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", requirement.strip())
        if match is None or (marker.strip() and not _marker_applies(marker.strip())):
            continue
        locked[normalize(match[1])] = match[2]
    return locked


def installed_versions() -> dict[str, str]:
    """{normalized name: version} of every distribution this interpreter sees: the first on
    sys.path, the one an import loads. (Once setuptools is imported, its own vendored copies
    of packaging and platformdirs join the end of sys.path; they are not what the kit uses.)"""
    versions: dict[str, str] = {}
    for dist in metadata.distributions():
        if dist.metadata["Name"]:
            versions.setdefault(normalize(dist.metadata["Name"]), dist.version)
    return versions


def lock_differences(locked: dict[str, str], installed: dict[str, str]) -> tuple[list, list]:
    """(["transformers 5.24.0, tested with 5.23.0", ...], [locked names not installed]).

    Local version labels are ignored (``2.13.0+cpu`` is ``2.13.0``); PyTorch's build
    packages (TORCH_BUILD) are not compared.
    """
    differ, missing = [], []
    for name, version in sorted(locked.items()):
        if TORCH_BUILD.match(name):
            continue
        have = installed.get(name)
        if have is None:
            missing.append(name)
        elif have.split("+")[0] != version.split("+")[0]:
            differ.append(f"{name} {have}, tested with {version}")
    return differ, missing


def _lock(path: Path | None = None) -> Item:
    """Installed versions against the lock (optional: a difference is reported, not fatal;
    locked packages that are not installed are counted, as a student install leaves some out)."""
    path = default_lock() if path is None else path
    if not path.is_file():
        return "lock", True, (f"no {path} (the kit is not a checkout, e.g. installed from a "
                              "wheel): versions not compared with the tested ones")
    locked = read_lock(path)
    differ, missing = lock_differences(locked, installed_versions())
    absent = (f"; {len(missing)} locked packages are not installed (extras this install "
              "leaves out; make test installs them all)" if missing else "")
    if not differ:
        return "lock", True, (f"all {len(locked) - len(missing)} installed packages of "
                              f"{path.name} are at the tested versions{absent}")
    return "lock", False, (f"{len(differ)} differ from {path.name}: {'; '.join(differ)}{absent}. "
                           "To install the tested versions remove .venv and run make lab "
                           "(or make setup)")


def _python() -> Item:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info[:2] >= MIN_PYTHON
    need = "" if ok else f" (need >= {'.'.join(map(str, MIN_PYTHON))})"
    return "python", ok, f"{version}{need} at {sys.executable}"


def torch_install_hint(lock: Path | None = None) -> str:
    """How to install torch: the lock's version when the checkout has one."""
    lock = default_lock() if lock is None else lock
    version = read_lock(lock).get("torch") if lock.is_file() else None
    spec = f"torch=={version.split('+')[0]}" if version else "torch"
    return f"install {spec} first (the CPU wheel, see docs/INSTALL.md)"


def _torch() -> Item:
    name, ok, detail = _package("torch", torch_install_hint())
    if not ok:
        return name, ok, detail
    torch = importlib.import_module("torch")
    from blockmem_lite.runtime import pick_device

    return name, True, (f"{detail}, device {pick_device()}, "
                        f"{torch.get_num_threads()} CPU threads")


def _kit() -> Item:
    """Build the tiny dense model and run one forward pass on the chosen device."""
    try:
        torch = importlib.import_module("torch")
        from blockmem_lite import __version__, build_model, preset
        from blockmem_lite.runtime import pick_device

        device = pick_device()
        cfg = preset("tiny")
        model = build_model(cfg).to(device).eval()
        tokens = torch.randint(0, cfg.model.vocab_size, (1, 8), device=device)
        with torch.no_grad():
            logits = model(tokens).logits
        if logits.shape != (1, 8, cfg.model.vocab_size) or not bool(logits.isfinite().all()):
            return "kit", False, (f"tiny model forward gave logits {tuple(logits.shape)}, "
                                  f"all finite: {bool(logits.isfinite().all())}")
    except Exception as err:  # report whatever broke
        return "kit", False, f"tiny model forward failed: {type(err).__name__}: {err}"
    return "kit", True, f"blockmem_lite {__version__}: tiny dense model forward OK on {device}"


def _lab_extension_dirs() -> list[Path]:
    """Where JupyterLab looks for prebuilt extensions (jupyter_core's data path)."""
    try:
        from jupyter_core.paths import jupyter_path
    except ImportError:  # no jupyterlab here: its own line fails
        return [Path(sys.prefix, "share", "jupyter", "labextensions")]
    return [Path(folder) for folder in jupyter_path("labextensions")]


def _live_widgets() -> Item:
    """Whether the live views can draw in JupyterLab (a plotly figure redrawn in an ipywidgets
    ``Output``): both packages and their JupyterLab extensions are installed (read from disk,
    nothing imported or built)."""
    name, fallback = "live widgets", "live dashboards fall back to text"
    missing = [package for package in LAB_EXTENSIONS if installed(package) is None]
    service = hosted_notebook()
    folders = [] if service else _lab_extension_dirs()
    if not service:
        missing += [f"the JupyterLab extension {extension}"
                    for package, extension in LAB_EXTENSIONS.items()
                    if installed(package) is not None
                    and not any((folder / extension).is_dir() for folder in folders)]
    if missing:
        return name, False, f"needs {', '.join(missing)} ({NOTEBOOKS_HINT}); {fallback}"
    parts = [f"{package} {installed(package)}" for package in LAB_EXTENSIONS]
    front_end = f"{service}'s widget front-end" if service else "their JupyterLab extensions"
    return name, True, f"{' and '.join(parts)} with {front_end}: live dashboards use widgets"



def _setting(name: str, mode: str, when_on: str, when_off: str) -> Item:
    """Informational: whether a mode variable is set, and what that means now (always OK)."""
    value = os.environ.get(name)
    on = value is not None and value.strip().lower() in ("1", "true", "yes", "on")
    shown = "not set" if value is None else f"{name}={value}"
    return name, True, f"{shown}: {mode} {'on' if on else 'off'}, {when_on if on else when_off}"


def run_envcheck(lock: Path | None = None) -> list[Item]:
    """Every item as (name, ok, detail), in the order printed; ``ok`` is None for an optional
    extra that is not installed. ``lock``: the lock file to compare with (default: the
    checkout's requirements.lock)."""
    checks: list[Callable[[], Item]] = [
        _python,
        _torch,
        lambda: _package("numpy", "pip install numpy"),
        _kit,
        lambda: _notebook_package("plotly", "figures and dashboards"),
        lambda: _notebook_package("ipywidgets", "sliders and live widgets"),
        _jupyterlab,
        lambda: _notebook_package("ipykernel", "runs the notebooks"),
        lambda: _optional_package("datasets", "only the WikiText corpora need it: "
                                              "pip install 'blockmem_lite[data]'"),
        lambda: _optional_package("transformers", "only the ARMT Hugging Face adapter needs it: "
                                                  "pip install 'blockmem_lite[hf]'"),
        _test_tools,
        lambda: _optional_package("psutil", "CPU memory readings fall back to /proc"),
        _live_widgets,
        lambda: _lock(lock),
        lambda: _setting("BLOCKMEM_FAST", "fast mode", "so notebooks use tiny configs, as CI does",
                         "so notebooks use their full configs (BLOCKMEM_FAST=1: tiny ones, "
                         "as in CI)"),
        lambda: _setting("BLOCKMEM_HEADLESS", "headless mode", "so dashboards print text lines",
                         "so dashboards draw widgets in a notebook (BLOCKMEM_HEADLESS=1: text "
                         "lines)"),
    ]
    return [check() for check in checks]


def required_items(core_only: bool = False) -> tuple[str, ...]:
    """The items that must say OK: the core, plus the ``notebooks`` extra (less JupyterLab
    in a hosted notebook) unless ``core_only``."""
    if core_only:
        return CORE
    return tuple(name for name in CORE + NOTEBOOK_EXTRAS
                 if not (name == "jupyterlab" and hosted_notebook()))


def format_items(items: list[Item], required: tuple[str, ...]) -> str:
    """Aligned ``OK   name  detail`` lines: ``FAIL`` when missing or broken (``[optional]``
    when not required), ``--`` for an optional extra that is not installed."""
    width = max(len(name) for name, _, _ in items)
    lines = []
    for name, ok, detail in items:
        status = "OK" if ok else "--" if ok is None else "FAIL"
        note = " [optional]" if ok is False and name not in required else ""
        lines.append(f"{status:<4} {name:<{width}}  {detail}{note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"{program()} envcheck",
        description="Check dependencies and widgets: OK, FAIL, or -- for an optional extra "
                    "that is not installed.")
    parser.add_argument("--core", action="store_true",
                        help="require only python, torch, numpy and the kit (no notebook extras)")
    parser.add_argument("--lock", type=Path, default=None,
                        help=f"the lock to compare installed versions with (default: the "
                             f"checkout's {LOCK_NAME})")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.lock is not None and not args.lock.is_file():
        parser.error(f"--lock={str(args.lock)!r} is not allowed: no such file (expected a "
                     f"lock file such as {default_lock()})")
    items = run_envcheck(args.lock)
    required = required_items(args.core)
    print(format_items(items, required))
    failed = [name for name, ok, _ in items if not ok and name in required]
    if failed:
        print(f"\n{len(failed)} required item(s) failed: {', '.join(failed)}. Each FAIL line "
              "says what to install; make lab installs all a student needs.")
        return 1
    print("\nall required items OK" + (" (core only)" if args.core else ""))
    return 0
