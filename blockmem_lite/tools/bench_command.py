"""``python -m blockmem_lite bench``: throughput, memory and decoding state against dense,
measured in the same run (argument parsing only: ``measure.bench.run_bench`` does the work)."""

from __future__ import annotations

import argparse
import sys

from blockmem_lite import registry
from blockmem_lite.__main__ import program
from blockmem_lite.measure import bench, roofline
from blockmem_lite.runtime import keep_freed_memory
from blockmem_lite.tools.cli import (
    PLUGIN_HELP,
    load_plugins,
    mechanisms_help,
    output_file,
    split_list,
)
from blockmem_lite.validation import check_device, check_float, check_int, parse_int_list

PROTOCOL_WARMUP, PROTOCOL_REPEATS = 3, 5          # the benchmark protocol's minimum counts
MAX_ROOFLINE_SECONDS = 60.0              # per machine probe (default: roofline.PROBE_SECONDS)


def bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{program()} bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Throughput, memory and decoding-state bytes of dense and the mechanisms, "
                    "dense interleaved in the same run (docs/MEASUREMENTS.md, The benchmark "
                    "protocol).",
        epilog="architectures:\n" + mechanisms_help(with_options=False))
    parser.add_argument("--arch", default="dense",
                        help="comma-separated architectures; dense is always measured "
                             f"({', '.join(registry.names())})")
    parser.add_argument("--seq-len", default=",".join(map(str, bench.DEFAULT_SEQ_LENS)),
                        help="comma-separated lengths T (default %(default)s)")
    parser.add_argument("--batch", type=int, default=None,
                        help=f"sequences per step (default: train max(1, "
                             f"{bench.TRAIN_TOKENS_PER_STEP} // T), decode 1)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=256, help="default: byte vocabulary")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's current setting)")
    parser.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda")
    parser.add_argument("--dtype", default="auto", choices=bench.DTYPES,
                        help="auto: on CUDA bf16 autocast (fp16 before compute capability "
                             "8.0), fp32 elsewhere")
    parser.add_argument("--phases", default="auto",
                        help="comma-separated: train, decode and the special benches of the "
                             "chosen mechanisms (auto: all of them)")
    parser.add_argument("--warmup", type=int, default=PROTOCOL_WARMUP,
                        help="untimed steps per model (default and protocol minimum: 3; fewer "
                             "makes a smoke test, and the run says so)")
    parser.add_argument("--repeats", type=int, default=PROTOCOL_REPEATS,
                        help="timed steps per model (default and protocol minimum: 5)")
    parser.add_argument("--decode-burst", type=int, default=32,
                        help="decoding steps per timed sample (default %(default)s)")
    parser.add_argument("--memory", default="saved,rss",
                        help="comma-separated: saved, rss, or none (default %(default)s)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile every model first: the per-token decode step "
                             "(compiling.compile_decoding) and the training forward/backward "
                             "(model.compile()); off by default (compiling takes seconds per "
                             "model and pays only where the step is launch-bound)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="write the records as a JSON list to PATH")
    parser.add_argument("--roofline-seconds", type=float, default=roofline.PROBE_SECONDS,
                        metavar="S", help="seconds of each of the roofline's three machine "
                                          "probes: matmul FLOP/s, copy bandwidth, launch time "
                                          "(default %(default)s)")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE", help=PLUGIN_HELP)
    for opt, users in registry.shared_bench_options().values():
        parser.add_argument(opt.flag, default=None, metavar="TEXT",
                            help=f"[{', '.join(users)}] {opt.help} (default "
                                 f"{_as_text(opt.default)})")
    return parser


def _as_text(value) -> str:
    """A typed bench value as the command line writes it: [64, 128] -> '64,128'."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def bench_options_of(args) -> dict:
    """The typed bench options the command line gave (the only place their text is parsed)."""
    return {opt.dest: opt.read(getattr(args, opt.dest))
            for opt, _ in registry.shared_bench_options().values() if getattr(args, opt.dest) is not None}


def bench_main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite bench ...``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        load_plugins(argv)
    except ValueError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    args = bench_parser().parse_args(argv)
    try:
        check_flags(args)
        options = bench_options_of(args)
        json_path = output_file("--json", args.json) if args.json is not None else None
        if args.warmup < PROTOCOL_WARMUP or args.repeats < PROTOCOL_REPEATS:
            print(f"bench: warning: --warmup {args.warmup} --repeats {args.repeats} is below the "
                  f"protocol's {PROTOCOL_WARMUP} and {PROTOCOL_REPEATS}: a smoke test, not a "
                  "measurement", file=sys.stderr)
        keep_freed_memory()          # a process that only measures (runtime.py)
        records = bench.run_bench(
            archs=split_list(args.arch), seq_lens=parse_int_list("--seq-len", args.seq_len),
            batch=args.batch, d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
            vocab_size=args.vocab_size, threads=args.threads, device=args.device,
            dtype=args.dtype, phases=None if args.phases == "auto" else split_list(args.phases),
            warmup=args.warmup, repeats=args.repeats, decode_burst=args.decode_burst,
            memory=split_list(args.memory), options=options, compile=args.compile,
            roofline_seconds=args.roofline_seconds)
    except ValueError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    print(bench.format_table(records))
    if json_path:
        print(f"wrote {bench.write_json(records, json_path)}")
    return 0


def check_flags(args) -> None:
    """The numeric flags and --device, each named as typed, before any work (``run_bench``
    checks its arguments again under their own names)."""
    most = bench.MAX_TIMED_STEPS
    for flag, value, low, high in (
            ("--warmup", args.warmup, 0, most), ("--repeats", args.repeats, 1, most),
            ("--decode-burst", args.decode_burst, 1, most), ("--batch", args.batch, 1, None),
            ("--d-model", args.d_model, 2, None), ("--n-layer", args.n_layer, 1, None),
            ("--n-head", args.n_head, 1, None), ("--vocab-size", args.vocab_size, 2, None),
            ("--threads", args.threads, 1, None)):
        if value is not None:                      # --batch and --threads: None by default
            check_int(flag, value, low, high)
    check_float("--roofline-seconds", args.roofline_seconds, 0.0, MAX_ROOFLINE_SECONDS)
    check_device("--device", args.device)
