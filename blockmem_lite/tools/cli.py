"""What the ``train``, ``bench`` and ``reproduce`` commands share: ``--plugin`` files, the
mechanisms' help, parsing on every process of a torchrun run, exit codes, and their output
paths (checked before any work; a refused command leaves no empty folder behind).

Each command is a module of its own (``train_command``, ``bench_command``,
``reproduce_command``), so a command imports only what it runs: ``train --help`` loads
neither the lab, the bench nor plotly. Every command takes ``--plugin FILE`` (repeatable):
the file is imported first and registers its mechanisms, which then appear in ``--help``,
``--arch`` and ``--set`` like the built-in ones. Installed packages exposing the
``blockmem_lite.mechanisms`` entry point are found without it.
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
from pathlib import Path

from blockmem_lite import registry
from blockmem_lite.checkpoints import prepare_folder
from blockmem_lite.validation import fail

PLUGIN_HELP = "a .py file that registers a mechanism (repeatable); see registry.py"


# --- plugins ---------------------------------------------------------------------------------
def load_plugins(argv: list[str]) -> list[str]:
    """Import every ``--plugin FILE`` of ``argv`` (before the parser is built, so the
    plugins' mechanisms and options appear in it); returns the names they registered."""
    names = []
    for i, arg in enumerate(argv):
        if arg == "--plugin" and i + 1 < len(argv):
            names += registry.load_plugin(argv[i + 1])
        elif arg.startswith("--plugin="):
            names += registry.load_plugin(arg.partition("=")[2])
    return names


def mechanisms_help(with_options: bool) -> str:
    """One paragraph per registered mechanism: its summary, and its --set fields."""
    blocks = []
    for m in registry.mechanisms():
        source = registry.source(m.name)
        origin = "" if source == registry.BUILTIN else f" [plugin: {source or 'session'}]"
        lines = [f"{m.name}: {m.summary}{origin}"]
        if with_options:
            lines += [f"    {line}" for line in m.options.describe()] or ["    (no options)"]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def exit_code(history) -> int:
    """0 when finished; 128 + the signal's number when a signal stopped the run."""
    if not history.interrupted:
        return 0
    return 128 + int(getattr(signal, history.stopped_by or "SIGINT", signal.SIGINT))


@contextlib.contextmanager
def quiet_unless(main: bool):
    """Swallow stdout and stderr on every process but rank 0 (argparse prints by itself)."""
    if main:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def parse_command(parser_of, argv: list[str], main: bool):
    """(args, None) or (None, exit status) with the message printed (on rank 0)."""
    with quiet_unless(main):
        try:
            load_plugins(argv)
            return parser_of().parse_args(argv), None
        except SystemExit as exit_:        # --help (0) or a bad argument (2, message printed)
            return None, exit_.code if isinstance(exit_.code, int) else 2
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return None, 2


def split_list(text: str) -> list[str]:
    """'bcmt, cat,' -> ['bcmt', 'cat']: a comma-separated option's items."""
    return [part.strip() for part in text.split(",") if part.strip()]


# --- output paths ----------------------------------------------------------------------------
def check_path_given(flag: str, text: str | None) -> None:
    """An output path flag, when given, names a path: '' is refused, never read as the
    default."""
    if text is not None and not text.strip():
        fail(flag, text, "expected a path (leave the flag out for the default)")


def output_file(flag: str, text: str) -> Path:
    """The file ``flag`` names, checked before any work: a path, not a folder, in a folder
    that can be made and written."""
    check_path_given(flag, text)
    path = Path(text)
    if path.is_dir():
        fail(flag, text, "expected a file path, not a folder")
    prepare_folder(path.parent, name=f"{flag} folder")
    return path


@contextlib.contextmanager
def no_empty_folder_left(folder: Path):
    """When the block raises (a refused command), remove ``folder`` and the parents of it that
    the block made, as long as they are empty; a folder that existed before, or that holds
    anything, is never removed."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]      # deepest first
    try:
        yield
    except BaseException:
        for path in made:
            try:
                path.rmdir()                                   # an empty folder only
            except OSError:
                break
        raise
