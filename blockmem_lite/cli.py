"""Command lines of ``python -m blockmem_lite train`` and ``... bench``.

Argument parsing only: the work is done by ``train.Trainer`` and
``bench.run_bench``. Both commands take ``--plugin FILE`` (repeatable): the
file is imported first and registers its mechanisms, which then appear in
``--help``, ``--arch`` and ``--set`` like the built-in ones. Installed
packages exposing the ``blockmem_lite.mechanisms`` entry point are found
without it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from blockmem_lite import bench, registry
from blockmem_lite.config import PRESET_NAMES, RunConfig, preset
from blockmem_lite.corpora import CorpusUnavailable, make_loaders
from blockmem_lite.models.base import build_model
from blockmem_lite.tokenizer import get_tokenizer
from blockmem_lite.train import CHECKPOINT_NAME, Trainer, load_checkpoint_file
from blockmem_lite.validation import parse_int_list

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
        origin = "" if m.source == registry.BUILTIN else f" [plugin: {m.source or 'session'}]"
        lines = [f"{m.name}: {m.summary}{origin}"]
        if with_options:
            lines += [f"    {line}" for line in m.options.describe()] or ["    (no options)"]
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


# --- train -----------------------------------------------------------------------------------
def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m blockmem_lite train", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a model from a preset; writes checkpoint.pt and history.json to --out.",
        epilog="architectures and their options (--set FIELD=VALUE):\n"
               + mechanisms_help(with_options=True))
    p.add_argument("--preset", choices=PRESET_NAMES, default="class",
                   help="model + training preset (default: class)")
    p.add_argument("--arch", default=None,
                   help=f"architecture (default: dense): {', '.join(registry.names())}")
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps")
    p.add_argument("--corpus", default=None, help="corpus name (default: the preset's)")
    p.add_argument("--out", default=None, help="output folder (default: runs/PRESET_ARCH)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any ModelConfig/TrainConfig field or mechanism option "
                        "(repeatable)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE", help=PLUGIN_HELP)
    return p


def parse_value(text: str):
    """'3' -> 3, '1e-3' -> 0.001, 'true' -> True, 'none' -> None, '4,8,16' -> (4, 8, 16)."""
    if "," in text:
        return tuple(parse_value(part) for part in text.split(",") if part.strip())
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def cli_overrides(args) -> dict:
    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r} is not allowed: expected KEY=VALUE, e.g. --set lr=1e-3")
        overrides[key.strip()] = parse_value(value)
    explicit = {"arch": args.arch, "steps": args.steps, "corpus": args.corpus,
                "device": args.device}
    overrides.update({k: v for k, v in explicit.items() if v is not None})
    return overrides


def sample_text(model, dataset, device: torch.device, tokenizer_name: str) -> str:
    """Continue the first 16 tokens of ``dataset[0]`` by 80 sampled tokens."""
    prompt = dataset[0][0][:16][None].to(device)                          # (1, 16)
    gen = torch.Generator(device=device).manual_seed(0)
    out = model.generate(prompt, 80, temperature=0.8, top_k=20, generator=gen)[0].cpu()
    tok = get_tokenizer(tokenizer_name)
    return f"{tok.decode(out[:16])!r} -> {tok.decode(out[16:])!r}"


def model_mismatch(ckpt: dict, run_cfg: RunConfig) -> list[str]:
    stored = (ckpt.get("run_config") or {}).get("model", {})
    wanted = run_cfg.model.to_dict()
    return [f"{k}={stored.get(k)!r} (checkpoint) vs {v!r} (this command)"
            for k, v in wanted.items() if k in stored and stored[k] != v]


def _trainer(args, run_cfg: RunConfig, out: Path) -> Trainer:
    train_loader, val_loader = make_loaders(run_cfg)
    trainer = Trainer(build_model(run_cfg), run_cfg.train, train_loader, val_loader,
                      run_cfg=run_cfg)
    if args.resume:
        ckpt = load_checkpoint_file(out / CHECKPOINT_NAME)
        mismatch = model_mismatch(ckpt, run_cfg)
        if mismatch:
            raise ValueError("--resume with a different model is not allowed: "
                             + "; ".join(mismatch))
        trainer._restore(ckpt)
    return trainer


def train_main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite train ...``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        load_plugins(argv)
        args = train_parser().parse_args(argv)
    except SystemExit as exit_:            # --help (0) or a bad argument (2, message printed)
        return exit_.code if isinstance(exit_.code, int) else 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        run_cfg = preset(args.preset, **cli_overrides(args))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/{run_cfg.preset}_{run_cfg.model.arch}")
    ckpt_path = out / CHECKPOINT_NAME
    if args.resume and not ckpt_path.is_file():
        print(f"error: --resume needs {ckpt_path}, which does not exist", file=sys.stderr)
        return 2
    if not args.resume and ckpt_path.exists():
        print(f"error: {ckpt_path} exists; pass --resume to continue it or choose another --out",
              file=sys.stderr)
        return 2
    run_cfg = run_cfg.replace(checkpoint_dir=str(out))
    try:
        trainer = _trainer(args, run_cfg, out)
    except (ValueError, OSError, CorpusUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n_params = sum(p.numel() for p in trainer.model.parameters())
    verb = f"resuming at step {trainer.step}" if args.resume else "training"
    print(f"{verb}: {run_cfg.model.arch} ({n_params / 1e6:.2f}M params), preset {run_cfg.preset}, "
          f"{run_cfg.train.steps} steps of {run_cfg.train.batch_size}x{run_cfg.model.seq_len} "
          f"tokens on {trainer.device}; output in {out}", flush=True)
    try:
        history = trainer.fit()
    except FloatingPointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    history.save_json(out / "history.json")
    if trainer.val_dataset is not None:
        val = (history.val_loss[-1] if history.val_step and history.val_step[-1] == trainer.step
               else trainer.evaluate())
        print(f"final val loss {val:.4f} at step {trainer.step}")
    print(f"wrote {ckpt_path} and {out / 'history.json'}")
    sample = sample_text(trainer.model, trainer.train_dataset, trainer.device,
                         run_cfg.train.tokenizer)
    print(f"sample: {sample}")
    return 130 if history.interrupted else 0


# --- bench -----------------------------------------------------------------------------------
def bench_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m blockmem_lite bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Throughput, memory and decoding-state bytes of dense and the mechanisms, "
                    "dense interleaved in the same run (PERFORMANCE.md protocol).",
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
                        help="auto: bf16 autocast on CUDA, fp32 elsewhere")
    parser.add_argument("--phases", default="auto",
                        help="comma-separated: train, decode and the special benches of the "
                             "chosen mechanisms (auto: all of them)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model (>= 3)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model (>= 5)")
    parser.add_argument("--decode-burst", type=int, default=32,
                        help="decoding steps per timed sample (default %(default)s)")
    parser.add_argument("--memory", default="saved,rss",
                        help="comma-separated: saved, rss, or none (default %(default)s)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="write the records as a JSON list to PATH")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE", help=PLUGIN_HELP)
    for opt, users in bench.shared_options().values():
        parser.add_argument(opt.flag, default=opt.default,
                            help=f"[{', '.join(users)}] {opt.help} (default %(default)s)")
    return parser


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def bench_main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite bench ...``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        load_plugins(argv)
    except ValueError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    args = bench_parser().parse_args(argv)
    options = {opt.dest: getattr(args, opt.dest) for opt, _ in bench.shared_options().values()}
    try:
        records = bench.run_bench(
            archs=_split(args.arch), seq_lens=parse_int_list("--seq-len", args.seq_len),
            batch=args.batch, d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
            vocab_size=args.vocab_size, threads=args.threads, device=args.device,
            dtype=args.dtype, phases=None if args.phases == "auto" else _split(args.phases),
            warmup=args.warmup, repeats=args.repeats, decode_burst=args.decode_burst,
            memory=_split(args.memory), options=options)
    except ValueError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    print(bench.format_table(records))
    if args.json:
        print(f"wrote {bench.write_json(records, args.json)}")
    return 0
