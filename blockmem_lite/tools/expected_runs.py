"""``python -m blockmem_lite expected``: measure and show the ranges notebooks print.

``expected remake`` runs each chosen notebook once per seed (BLOCKMEM_SEED), headless, with
``BLOCKMEM_EXPECT_RECORD`` set, and stores every recorded result's range in
``data/expected/ranges.json`` (``blockmem_lite/expected.py`` reads it). ``expected show``
prints what is stored.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from blockmem_lite.expected import load_ranges, measured_range, ranges_path
from blockmem_lite.runtime import environment

DEFAULT_SEEDS = (0, 1, 2)
BOUNDS = ("at_most", "signed")       # what an expect call says of its range, recorded with it
PRESETS = ("fast", "class")


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    remake = commands.add_parser("remake", help="run notebooks once per seed and store ranges")
    remake.add_argument("--preset", choices=PRESETS, default="fast",
                        help="fast (BLOCKMEM_FAST=1, about a minute a run) or class")
    remake.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS),
                        help="at least 3 seeds (default 0 1 2)")
    remake.add_argument("--notebooks", nargs="+", default=None,
                        help="two-digit notebook numbers (default: every notebook that "
                             "calls expect)")
    remake.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    commands.add_parser("show", help="print the stored ranges")
    return parser


def notebooks_that_expect() -> list[str]:
    """The numbers of the main notebooks whose cells call ``expect``."""
    from blockmem_lite.course import course_root

    folder = course_root() / "notebooks"
    return [path.name[:2] for path in sorted(folder.glob("[0-9][0-9]_*.ipynb"))
            if "expect(" in path.read_text(encoding="utf-8")]


def notebook_file(number: str) -> Path:
    """The main notebook numbered ``number`` ("02")."""
    from blockmem_lite.course import course_root

    folder = course_root() / "notebooks"
    found = sorted(folder.glob(f"{number}_*.ipynb"))
    if len(number) != 2 or not number.isdigit() or not found:
        known = ", ".join(sorted(p.name[:2] for p in folder.glob("[0-9][0-9]_*.ipynb")))
        raise SystemExit(f"--notebooks: {number!r} is not a notebook number; expected one "
                         f"of {known}")
    return found[0]


def run_notebook(path: Path, preset: str, seed: int, timeout: int) -> list[dict]:
    """Execute one notebook with ``seed``; the results its ``expect`` calls recorded.

    Its runs folder (``BLOCKMEM_RUNS``) is a fresh one, so every seed trains what it prints
    instead of reading what an earlier run stored."""
    import nbformat
    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory() as scratch:
        record = Path(scratch) / "record.jsonl"
        env = {"BLOCKMEM_SEED": str(seed), "BLOCKMEM_EXPECT_RECORD": str(record),
               "BLOCKMEM_RUNS": str(Path(scratch) / "runs"),
               "BLOCKMEM_HEADLESS": "1", "PLOTLY_RENDERER": "json",
               "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "BLOCKMEM_FAST": "1" if preset == "fast" else "0"}
        with environment(env):
            notebook = nbformat.read(path, as_version=4)
            NotebookClient(notebook, timeout=timeout,
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        print(f"  slowest cells: {slowest_cells(notebook)}", flush=True)
        if not record.is_file():
            return []
        return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]


def slowest_cells(notebook, count: int = 3) -> str:
    """``"nb07-22 120 s, nb07-31 45 s, ..."``: the ``count`` longest cells of an executed
    notebook, from the timestamps nbclient records in each cell's metadata."""
    from datetime import datetime

    seconds = {}
    for cell in notebook.cells:
        stamps = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in stamps and "shell.execute_reply" in stamps:
            begin, end = (datetime.fromisoformat(stamps[key].replace("Z", "+00:00"))
                          for key in ("iopub.execute_input", "shell.execute_reply"))
            seconds[cell.get("id", "?")] = (end - begin).total_seconds()
    longest = sorted(seconds.items(), key=lambda item: item[1], reverse=True)[:count]
    return ", ".join(f"{cell_id} {s:.0f} s" for cell_id, s in longest) or "(no timings)"


def machine() -> str:
    """A short description of this computer, stored with every range."""
    from blockmem_lite.runtime import pick_device

    device = pick_device("auto")
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return f"a {os.cpu_count()}-core {platform.machine()} CPU"


def collect(notebooks: list[str], preset: str, seeds: list[int], timeout: int) -> dict:
    """``{name: {seed: value}}`` over every notebook and seed, with progress lines; a name
    whose ``expect`` gave ``at_most`` or ``signed`` also has it, under that key."""
    values: dict[str, dict] = {}
    total, done = len(notebooks) * len(seeds), 0
    for number in notebooks:
        path = notebook_file(number)
        for seed in seeds:
            started = time.monotonic()
            for row in run_notebook(path, preset, seed, timeout):
                values.setdefault(row["name"], {})[seed] = row["value"]
                for bound in BOUNDS:
                    if bound in row:
                        values[row["name"]][bound] = row[bound]
            done += 1
            print(f"[{done}/{total}] {path.name} seed {seed}: "
                  f"{time.monotonic() - started:.0f} s", flush=True)
    return values


def store(values: dict, notebooks: list[str], preset: str, seeds: list[int],
          path: Path | None = None) -> Path:
    """Replace the chosen notebooks' ranges for ``preset``; keep every other entry."""
    path = ranges_path() if path is None else path
    presets = load_ranges(path)
    kept = {name: entry for name, entry in presets.get(preset, {}).items()
            if name.split(".")[0] not in notebooks}
    where = machine()
    for name, recorded in sorted(values.items()):
        by_seed = {seed: value for seed, value in recorded.items() if seed not in BOUNDS}
        if set(by_seed) != set(seeds):
            raise SystemExit(f"{name}: recorded for seeds {sorted(by_seed)} only, not all of "
                             f"{seeds}; a result must be printed on every seed's run")
        low, high = measured_range(list(by_seed.values()), recorded.get("at_most"),
                                   recorded.get("signed", False))
        kept[name] = {"low": low, "high": high, "seeds": _seed_span(seeds),
                      "values": {str(s): v for s, v in sorted(by_seed.items())},
                      "machine": where, "date": date.today().isoformat()}
    presets[preset] = dict(sorted(kept.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"about": "Ranges the notebooks print after their results; remade by "
                         "`python -m blockmem_lite expected remake` (blockmem_lite/expected.py)",
                "presets": presets}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    temporary.replace(path)
    return path


def _seed_span(seeds: list[int]) -> str:
    ordered = sorted(seeds)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(map(str, ordered))


def show() -> None:
    for preset, entries in load_ranges().items():
        print(f"{preset}:")
        for name, entry in entries.items():
            values = ", ".join(f"{v:.4g}" for v in entry["values"].values())
            print(f"  {name:40s} {entry['low']:.4g} to {entry['high']:.4g}  "
                  f"(seeds {entry['seeds']}: {values})")


def main(argv: list[str] | None = None) -> int:
    from blockmem_lite.__main__ import program

    args = _parser(f"{program()} expected").parse_args(argv)
    if args.command == "show":
        show()
        return 0
    if len(set(args.seeds)) < 3 or min(args.seeds) < 0:
        raise SystemExit(f"--seeds: {args.seeds} gives no range; expected at least 3 "
                         "different seeds of 0 or more")
    if args.notebooks is None:
        args.notebooks = notebooks_that_expect()
    for number in args.notebooks:
        notebook_file(number)          # a wrong number fails before any run starts
    values = collect(args.notebooks, args.preset, args.seeds, args.timeout)
    path = store(values, args.notebooks, args.preset, args.seeds)
    print(f"{len(values)} results of {len(args.notebooks)} notebooks stored in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
