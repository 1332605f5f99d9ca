"""Where the course's own files are: the notebooks, their figures and the runs the kit
ships, found the same way from a source checkout, an installed wheel or a notebook copied
anywhere.

In a checkout they are the repository's folders. A wheel carries them as package data in
``blockmem_lite/_course/`` (``setup.py`` copies them there when the wheel is built: the
main notebooks, the student exercises, the figures, the shipped class run and JupyterLab's
settings; never the solutions). ``copy_notebooks`` (``blockmem-lite notebooks DIR``) copies
a student's set out of either, ready to open.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
PACKAGED = PACKAGE / "_course"            # in an installed wheel
CHECKOUT = PACKAGE.parent                 # a source checkout's root
# What a student gets, as globs relative to the course root (setup.py packs the same, and
# the shipped runs and JupyterLab's settings besides).
STUDENT_FILES = ("notebooks/*.ipynb", "notebooks/exercises/*.ipynb", "notebooks/figures/*.svg")
PACKAGED_FILES = STUDENT_FILES + ("data/expected/ranges.json",
                                  "data/reproduce/*/results.json", "data/reproduce/*/report.md",
                                  "data/reproduce/*/sweeps/*.json", "jupyter/overrides.json")
FIGURES = ("bcmt", "cat", "armt", "moc")


def course_root() -> Path:
    """The folder that holds ``notebooks/``, ``data/reproduce/`` and ``jupyter/``."""
    if (CHECKOUT / "pyproject.toml").is_file() and (CHECKOUT / "notebooks").is_dir():
        return CHECKOUT
    if (PACKAGED / "notebooks").is_dir():
        return PACKAGED
    raise FileNotFoundError(
        f"this install of blockmem_lite has no notebooks: neither {CHECKOUT / 'notebooks'} "
        f"(a source checkout) nor {PACKAGED / 'notebooks'} (an installed wheel) exists; "
        "reinstall the kit from its wheel or its repository")


def shipped_runs() -> Path | None:
    """The folder of the runs the kit ships (``<preset>_cpu/results.json`` and sweeps);
    None in an install that carries no course."""
    try:
        return course_root() / "data" / "reproduce"
    except FileNotFoundError:
        return None


def figure_path(name: str) -> Path:
    """The SVG of one mechanism's header figure (``name`` in ``FIGURES``)."""
    if name not in FIGURES:
        raise ValueError(f"figure={name!r} is not one of the kit's figures: expected one of "
                         f"{', '.join(FIGURES)}")
    return course_root() / "notebooks" / "figures" / f"{name}.svg"


def show_figure(name: str):
    """The mechanism's header figure for a notebook cell, wherever the notebook lives."""
    from IPython.display import SVG
    return SVG(filename=str(figure_path(name)))


def student_files(root: Path | None = None) -> list[Path]:
    """The notebooks, exercises and figures a student gets, relative to the course root."""
    root = course_root() if root is None else root
    return sorted(path.relative_to(root) for pattern in STUDENT_FILES for path in root.glob(pattern))


def copy_notebooks(dest: Path, overwrite: bool = False) -> tuple[list[Path], list[Path]]:
    """Copy the student's notebooks, exercises and figures into ``dest``/notebooks.

    A file already there that differs is the student's work: it is kept unless
    ``overwrite``. Returns (copied, kept), both relative to ``dest``."""
    root, dest = course_root(), Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f"DIR={str(dest)!r} is a file: name a folder to copy the "
                                 "notebooks into")
    copied, kept = [], []
    for relative in student_files(root):
        source, target = root / relative, dest / relative
        if target.exists() and filecmp.cmp(source, target, shallow=False):
            continue
        if target.exists() and not overwrite:
            kept.append(target.relative_to(dest))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        copied.append(target.relative_to(dest))
    return copied, kept


def lab_settings_target(prefix: Path | None = None) -> Path:
    """Where JupyterLab reads the environment's settings overrides."""
    prefix = Path(sys.prefix) if prefix is None else prefix
    return prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json"


def install_lab_settings(prefix: Path | None = None) -> str:
    """Put the kit's JupyterLab settings (widget state saved with a notebook) into the
    environment, as ``make lab`` does; never over settings of the user's own."""
    source, target = course_root() / "jupyter" / "overrides.json", lab_settings_target(prefix)
    if target.exists() and not filecmp.cmp(source, target, shallow=False):
        return (f"kept your JupyterLab settings in {target}; the kit's are in {source} "
                "(they make JupyterLab save widget state, so a reopened notebook shows its figures)")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return f"JupyterLab settings: {target}"
