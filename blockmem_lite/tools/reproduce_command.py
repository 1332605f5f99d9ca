"""``python -m blockmem_lite reproduce``: the comparison lab from the command line.

Every architecture on the same data, budget and seed; ``lab.reproduce`` does the work, this
module parses, claims the output folder and reports. It also runs under ``torchrun``: the
models train with every process, rank 0 writes and measures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from blockmem_lite import distributed, lab, registry
from blockmem_lite.__main__ import program
from blockmem_lite.checkpoints import RunLock, RunLocked, prepare_folder
from blockmem_lite.config import PRESET_NAMES, preset
from blockmem_lite.corpora import CORPUS_NAMES, CorpusUnavailable, load_corpus
from blockmem_lite.lab.parts import TrainingStopped, WorkerLost
from blockmem_lite.runtime import keep_freed_memory
from blockmem_lite.tools.cli import (
    PLUGIN_HELP,
    check_path_given,
    exit_code,
    mechanisms_help,
    no_empty_folder_left,
    parse_command,
    split_list,
)
from blockmem_lite.validation import check_choice, fail


def reproduce_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{program()} reproduce",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train every architecture on the same data, budget and seed; measure "
                    "validation loss, same-run speed and memory vs dense, decoding state and "
                    "recall vs distance; write OUT/results.json, OUT/report.md (with the papers' "
                    "claims beside the kit's) and OUT/plots/. Interrupted, it continues where it "
                    "stopped.",
        epilog="architectures:\n" + mechanisms_help(with_options=False))
    p.add_argument("--preset", choices=PRESET_NAMES, default="fast",
                   help="fast (CI, minutes), class (a 2-core laptop, about an hour), gpu")
    p.add_argument("--arch", default=None,
                   help=f"comma-separated (default: every registered one: "
                        f"{', '.join(registry.names())})")
    p.add_argument("--corpus", default=None, help="corpus name (default: offline)")
    p.add_argument("--paths", nargs="+", default=None, metavar="FILE",
                   help="your own text files (implies --corpus files)")
    p.add_argument("--steps", type=int, default=None, help="training steps per model "
                                                          "(default: the preset's lab size)")
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="the language models' seed (default: the preset's); another seed "
                        "makes another run, so give it its own --out")
    p.add_argument("--lm-seeds", type=int, default=None, metavar="N",
                   help="seeds per language model (default: the preset's, 3 in class); the "
                        "claims are judged on the seed band, so 1 is quicker and decides "
                        "nothing within another seed's reach")
    p.add_argument("--out", default=None, help="output folder (default: runs/reproduce_PRESET)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes training the recall models side by side (default: one "
                        "per CPU thread on a CPU, none on an accelerator; 0: in this process)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE", help=PLUGIN_HELP)
    return p


def reproduce_main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite reproduce ...`` (also under torchrun: the models train with
    every process, rank 0 writes and measures); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        world = distributed.env_world()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args, status = parse_command(reproduce_parser, argv, world.is_main)
    if args is None:
        return status
    out = Path(args.out or f"runs/reproduce_{args.preset}")
    say = print if world.is_main else (lambda *a, **k: None)
    try:
        check_path_given("--out", args.out)
        if args.corpus is not None:
            check_choice("--corpus", args.corpus, CORPUS_NAMES)
        if args.workers is not None and args.workers < 0:
            fail("--workers", args.workers, "expected an integer >= 0 (0 or 1: train in this "
                                            "process; leave it out for one per CPU thread)")
        if args.steps is not None and args.steps < 1:
            fail("--steps", args.steps, "expected an integer >= 1")
        if args.seed is not None and args.seed < 0:
            fail("--seed", args.seed, "expected an integer >= 0")
        if args.lm_seeds is not None and args.lm_seeds < 1:
            fail("--lm-seeds", args.lm_seeds, "expected an integer >= 1")
        distributed.check_batch_size(preset(args.preset).train.batch_size, world.world_size)
        corpus = load_corpus(args.corpus or ("files" if args.paths else "offline"),
                             paths=args.paths)
        world = distributed.setup(preset(args.preset).train.device)
        keep_freed_memory()          # this process only trains and measures (runtime.py)
        lock = RunLock(out)

        def claim():                                  # rank 0 alone writes into --out
            prepare_folder(out, name="--out")
            lock.acquire()

        try:
            with no_empty_folder_left(out):           # a refused run leaves no empty --out
                world.on_main(claim)
                try:
                    results = lab.reproduce(args.preset, out,
                                            split_list(args.arch) if args.arch else None,
                                            corpus, steps=args.steps, workers=args.workers,
                                            seed=args.seed, lm_seeds=args.lm_seeds)
                    if world.is_main:
                        _write_plots(results, out)
                finally:
                    if world.is_main:
                        lock.release()
        finally:
            distributed.shutdown()                    # waits for every process, then leaves
    except (FloatingPointError, WorkerLost) as e:     # a training broke, or its worker died
        say(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, OSError, RunLocked, CorpusUnavailable) as e:
        say(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:                 # 128 + the signal's number, as train
        say(f"stopped; the finished measurements are kept in {out / lab.RESULTS_NAME}: "
            "run the same command again to continue", file=sys.stderr)
        return exit_code(stop.history) if isinstance(stop, TrainingStopped) else 130
    say(f"wrote {out / lab.RESULTS_NAME}, {out / 'report.md'} and {out / 'plots'}")
    say(lab.summary(results))
    return 0


def _write_plots(results: dict, out: Path) -> None:
    """The report's plots, when plotly (the notebooks extra) is installed; then the report
    again, linking them."""
    try:
        from blockmem_lite.lab import figures as lab_figures
    except ImportError as err:
        print(f"no plots written ({err}); the JSON and report.md are complete", file=sys.stderr)
        return
    lab_figures.write_plots(results, out)
    lab.write_report(results, out)
