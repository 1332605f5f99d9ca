"""``python -m blockmem_lite envcheck``: is this environment ready for the kit and its notebooks?

Prints one aligned line per item, ``OK`` or ``FAIL`` with a detail, and
exits 1 when a required item fails. Required: Python >= 3.10, torch, numpy
and the kit itself (a tiny model runs a forward pass); the notebook extras
(plotly, ipywidgets, anywidget, jupyterlab, datasets) too unless ``--core``.
Optional items (psutil, nbval, a plotly ``FigureWidget``, the mode
variables) are reported but never change the exit code: without a
FigureWidget the live dashboards fall back to text.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

MIN_PYTHON = (3, 10)
CORE = ("python", "torch", "numpy", "kit")
NOTEBOOK_EXTRAS = ("plotly", "ipywidgets", "anywidget", "jupyterlab", "datasets")
OPTIONAL = ("psutil", "nbval", "FigureWidget", "BLOCKMEM_FAST", "BLOCKMEM_HEADLESS")

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


def _python() -> Item:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info[:2] >= MIN_PYTHON
    need = "" if ok else f" (need >= {'.'.join(map(str, MIN_PYTHON))})"
    return "python", ok, f"{version}{need} at {sys.executable}"


def _torch() -> Item:
    name, ok, detail = _package("torch", "install torch==2.13.0 first, see the README")
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


def run_envcheck() -> list[Item]:
    """Every item as (name, ok, detail), in the order printed."""
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
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    items = run_envcheck()
    required = required_items(args.core)
    print(format_items(items, required))
    failed = [name for name, ok, _ in items if not ok and name in required]
    if failed:
        print(f"\n{len(failed)} required item(s) failed: {', '.join(failed)}. Install with "
              "`make setup` (or pip install -e '.[notebooks,test]').")
        return 1
    print("\nall required items OK" + (" (core only)" if args.core else ""))
    return 0
