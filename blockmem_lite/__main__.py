"""Command line: ``python -m blockmem_lite COMMAND ...`` (or the console script
``blockmem-lite COMMAND ...``; usage lines name whichever ran, ``program()``), COMMAND one of
``COMMANDS`` below (envcheck, train, bench, reproduce, exercises, site, gpucheck, sweep,
expected).

Each subcommand is a ``main(argv)`` function in its own module of ``tools/``
(``tools/train_command.py``, ...), imported only when used, so a command loads only what it
runs and ``envcheck`` works even when extras are missing. ``exercises grade`` is ``grading.main``
and ``exercises release`` is ``release.main`` (both import exercises).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

COMMANDS = {   # name: (module, function, help)
    "envcheck": ("blockmem_lite.tools.envcheck", "main",
                 "check dependencies and widgets (OK/FAIL per item)"),
    "notebooks": ("blockmem_lite.tools.notebooks", "main",
                  "copy the notebooks, exercises and figures into a folder, ready to open"),
    "train": ("blockmem_lite.tools.train_command", "train_main",
              "train a model from a preset, with checkpoints and resume"),
    "bench": ("blockmem_lite.tools.bench_command", "bench_main",
              "throughput / memory / state bytes vs dense, same run"),
    "reproduce": ("blockmem_lite.tools.reproduce_command", "reproduce_main",
                  "every mechanism on the same work; the papers' claims beside ours"),
    "exercises": ("blockmem_lite.tools.exercises", "main",
                  "build|check|strip|grade|release student notebooks"),
    "site": ("blockmem_lite.tools.site", "main",
             "static HTML pages of the notebooks, with outputs"),
    "gpucheck": ("blockmem_lite.tools.gpucheck", "main",
                 "check the GPU path in one short run (one table, OK/FAIL per check)"),
    "sweep": ("blockmem_lite.lab.recall_sweep", "main",
              "recall against one memory's size, beside its analytic capacity"),
    "expected": ("blockmem_lite.tools.expected_runs", "main",
                 "remake|show the ranges notebooks print after their results"),
}
SUBCOMMANDS = {   # (command, subcommand): (module, function); grading sits above exercises
    ("exercises", "grade"): ("blockmem_lite.tools.grading", "main"),
    ("exercises", "release"): ("blockmem_lite.tools.release", "main"),
}


SCRIPT = "blockmem-lite"   # the console script (pyproject.toml [project.scripts])


def program(argv0: str | None = None) -> str:
    """The name usage lines give the kit: ``blockmem-lite`` when the console script runs
    (``argv0``, default ``sys.argv[0]``), else ``python -m blockmem_lite`` (also in pytest or
    a notebook)."""
    argv0 = (sys.argv or [""])[0] if argv0 is None else argv0
    return SCRIPT if Path(argv0).stem == SCRIPT else "python -m blockmem_lite"


def usage() -> str:
    prog = program()
    lines = [f"usage: {prog} COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", f"`{prog} COMMAND --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}: expected one of {', '.join(COMMANDS)}\n", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    module_name, function = COMMANDS[name][:2]
    sub = rest[0] if rest else None
    if (name, sub) in SUBCOMMANDS:
        (module_name, function), rest = SUBCOMMANDS[name, sub], rest[1:]
    command = getattr(importlib.import_module(module_name), function)
    try:
        return int(command(rest) or 0)
    except RuntimeError as err:
        if not _model_exited(err):
            raise
        print(f"error: {err}", file=sys.stderr)
        return 1


def _model_exited(err: BaseException) -> bool:
    """Whether ``err`` says a model's code called sys.exit (``models.base.ModelExited``; that
    module is loaded once a model ran, and not imported here: envcheck runs without torch)."""
    base = sys.modules.get("blockmem_lite.models.base")
    return base is not None and isinstance(err, base.ModelExited)


if __name__ == "__main__":
    sys.exit(main())
