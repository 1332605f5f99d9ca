"""``blockmem-lite notebooks DIR``: the course's notebooks, exercises and figures copied out
of the installed kit (a wheel or a checkout), ready to open in JupyterLab."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blockmem_lite import course
from blockmem_lite.__main__ import program


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{program()} notebooks",
        description="Copy the course's notebooks (main and exercises, not the solutions) and "
        "their figures into DIR/notebooks, and the kit's JupyterLab settings into this "
        "environment. Files you changed are kept.")
    p.add_argument("dir", metavar="DIR", type=Path, help="the folder to copy into (made if missing)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace notebooks you changed with the kit's (your answers are lost)")
    p.add_argument("--no-lab-settings", action="store_true",
                   help="leave this environment's JupyterLab settings alone")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        copied, kept = course.copy_notebooks(args.dir, overwrite=args.overwrite)
    except OSError as error:
        print(f"blockmem-lite notebooks: {error}", file=sys.stderr)
        return 2
    settings = None if args.no_lab_settings else _lab_settings()
    folder = args.dir / "notebooks"
    print(f"{len(copied)} file(s) copied to {folder}" + (" (all up to date)" if not copied else ""))
    if kept:
        print(f"kept {len(kept)} file(s) you changed (--overwrite replaces them): "
              + ", ".join(str(path) for path in kept))
    if settings:
        print(settings)
    print(f"open them with:  jupyter lab --notebook-dir={folder}")
    return 0


def _lab_settings() -> str:
    """The kit's JupyterLab settings put into this environment, or why they could not be
    (a system Python a user may not write to): the notebooks work without them."""
    try:
        return course.install_lab_settings()
    except OSError as error:
        return (f"JupyterLab settings not written ({error.strerror}: {course.lab_settings_target()})"
                ": notebooks run, but a reopened one shows no figures until it runs again")
