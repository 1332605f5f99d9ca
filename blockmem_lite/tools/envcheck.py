"""``python -m blockmem_lite envcheck``: is this environment ready for the kit and its notebooks?

Prints one aligned line per item, ``OK`` or ``FAIL`` with a detail, and
exits 1 when a required item fails. Required: Python >= 3.10, torch, numpy
and the kit itself (a tiny model runs a forward pass); the notebook extras
(plotly, ipywidgets, anywidget, jupyterlab, datasets) too unless ``--core``.
Optional items (psutil, nbval, a plotly ``FigureWidget``, the lock, the mode
variables) are reported but never change the exit code: without a
FigureWidget the live dashboards fall back to text.

The ``lock`` item compares every installed package with ``requirements.lock``, the
versions ``make test`` passed with, and names each difference ("transformers 5.24.0,
tested with 5.23.0"). PyTorch's own build (triton, the CUDA libraries) is left out:
the platform's torch wheel chooses it; torch is compared without its local label
(2.13.0+cpu is 2.13.0).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

MIN_PYTHON = (3, 10)
CORE = ("python", "torch", "numpy", "kit")
NOTEBOOK_EXTRAS = ("plotly", "ipywidgets", "anywidget", "jupyterlab", "datasets")
OPTIONAL = ("psutil", "nbval", "FigureWidget", "lock", "BLOCKMEM_FAST", "BLOCKMEM_HEADLESS")
LOCK_NAME = "requirements.lock"
# PyTorch's build: chosen by the platform's torch wheel (TORCH_SPEC), not by the lock
TORCH_BUILD = re.compile(r"^(triton|nvidia-.*|cuda-.*)$")

Item = tuple[str, bool, str]


def _version(module) -> str:
    version = getattr(module, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(module.__name__)
        except metadata.PackageNotFoundError:
            version = "unknown version"
    return str(version)


def _package(name: str, why: str) -> Item:
    try:
        module = importlib.import_module(name)
    except Exception as err:  # any import failure is reported, not raised
        return name, False, f"cannot import: {type(err).__name__}: {err} ({why})"
    return name, True, _version(module)


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
    for line in path.read_text().splitlines():
        requirement, _, marker = line.partition(";")
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", requirement.strip())
        if match is None or (marker.strip() and not _marker_applies(marker.strip())):
            continue
        locked[normalize(match[1])] = match[2]
    return locked


def installed_versions() -> dict[str, str]:
    """{normalized name: version} of every distribution this interpreter sees."""
    return {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()
            if d.metadata["Name"]}


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
    """Installed versions against the lock (optional: a difference is reported, not fatal)."""
    path = default_lock() if path is None else path
    if not path.is_file():
        return "lock", True, (f"no {path} (the kit is not a checkout, e.g. installed from a "
                              "wheel): versions not compared with the tested ones")
    locked = read_lock(path)
    differ, missing = lock_differences(locked, installed_versions())
    if not differ and not missing:
        return "lock", True, (f"all {len(locked)} packages of {path.name} applying here are "
                              "installed at the tested versions")
    parts = []
    if differ:
        parts.append(f"{len(differ)} differ from {path.name}: " + "; ".join(differ))
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6
                                          else "")
        parts.append(f"{len(missing)} locked packages not installed: {shown}")
    return "lock", False, (". ".join(parts) + ". `make setup` installs the tested versions "
                           "(remove .venv first to start clean)")


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
    return f"install {spec} first (the CPU wheel, see the README)"


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


def _figure_widget() -> Item:
    try:
        go = importlib.import_module("plotly.graph_objects")
        go.FigureWidget()
    except Exception as err:  # plotly >= 6 raises without anywidget
        return "FigureWidget", False, (f"cannot build one: {type(err).__name__}: {err}; live "
                                       "dashboards fall back to text")
    return "FigureWidget", True, "plotly FigureWidget builds: live dashboards use widgets"


def _setting(name: str, mode: str, when_on: str, when_off: str) -> Item:
    """Informational: whether a mode variable is set, and what that means now (always OK)."""
    value = os.environ.get(name)
    on = value is not None and value.strip().lower() in ("1", "true", "yes", "on")
    shown = "not set" if value is None else f"{name}={value}"
    return name, True, f"{shown}: {mode} {'on' if on else 'off'}, {when_on if on else when_off}"


def run_envcheck(lock: Path | None = None) -> list[Item]:
    """Every item as (name, ok, detail), in the order printed; ``lock``: the lock file
    to compare with (default: the checkout's requirements.lock)."""
    checks: list[Callable[[], Item]] = [
        _python,
        _torch,
        lambda: _package("numpy", "pip install numpy"),
        _kit,
        lambda: _package("plotly", "figures and dashboards: pip install -e '.[notebooks]'"),
        lambda: _package("ipywidgets", "sliders and live widgets: pip install -e '.[notebooks]'"),
        lambda: _package("anywidget", "plotly >= 6 widgets: pip install -e '.[notebooks]'"),
        lambda: _package("jupyterlab", "make lab: pip install -e '.[notebooks]'"),
        lambda: _package("datasets", "WikiText corpora: pip install -e '.[notebooks]'"),
        lambda: _package("psutil", "CPU memory readings fall back to /proc"),
        lambda: _package("nbval", "make test runs the notebooks: pip install -e '.[test]'"),
        _figure_widget,
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
    return CORE if core_only else CORE + NOTEBOOK_EXTRAS


def format_items(items: list[Item], required: tuple[str, ...]) -> str:
    """Aligned ``OK   name  detail`` / ``FAIL name  detail`` lines (optional items marked)."""
    width = max(len(name) for name, _, _ in items)
    lines = []
    for name, ok, detail in items:
        note = "" if ok or name in required else " [optional]"
        lines.append(f"{'OK' if ok else 'FAIL':<4} {name:<{width}}  {detail}{note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blockmem_lite envcheck",
                                     description="Check dependencies and widgets (OK/FAIL).")
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
        print(f"\n{len(failed)} required item(s) failed: {', '.join(failed)}. Install with "
              "`make setup` (or pip install -e '.[notebooks,test]').")
        return 1
    print("\nall required items OK" + (" (core only)" if args.core else ""))
    return 0
