"""Command lines of ``python -m blockmem_lite train`` and ``... bench``.

Argument parsing only: the work is done by ``train.Trainer`` and
``bench.run_bench``. Both commands take ``--plugin FILE`` (repeatable): the
file is imported first and registers its mechanisms, which then appear in
``--help``, ``--arch`` and ``--set`` like the built-in ones. Installed
packages exposing the ``blockmem_lite.mechanisms`` entry point are found
without it.

``train`` and ``reproduce`` also run under ``torchrun`` (``distributed.setup``): every
process parses the same command; rank 0 alone takes the output folder, reads the
checkpoint (and hands it to the others), writes and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import signal
import sys
from pathlib import Path

import torch

from blockmem_lite import distributed, lab, registry
from blockmem_lite.__main__ import program
from blockmem_lite.checkpoints import (
    CHECKPOINT_NAME,
    RunLock,
    RunLocked,
    load_checkpoint_file,
    prepare_folder,
)
from blockmem_lite.config import (
    PRESET_NAMES,
    RunConfig,
    TrainConfig,
    config_class,
    preset,
)
from blockmem_lite.corpora import CorpusUnavailable, load_corpus, make_loaders
from blockmem_lite.lab.parts import TrainingStopped, WorkerLost
from blockmem_lite.measure import bench, roofline
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import keep_freed_memory, seed_everything
from blockmem_lite.tokenizer import get_tokenizer
from blockmem_lite.train import CheckpointNotSaved, Trainer, check_fits_in_memory
from blockmem_lite.train.resume import RESCUE_ENV
from blockmem_lite.validation import fail, parse_int_list

PROTOCOL_WARMUP, PROTOCOL_REPEATS = 3, 5          # the benchmark protocol's minimum counts
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


# --- train -----------------------------------------------------------------------------------
def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{program()} train", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a model from a preset; writes checkpoint.pt and history.json to --out. "
                    "Ctrl-C, SIGTERM and SIGHUP stop after the current step and save both. "
                    "Several GPUs or nodes: start it with torchrun (docs/DISTRIBUTED.md)"
                    "; --set batch_size is then the global batch.",
        epilog="architectures and their options (--set FIELD=VALUE):\n"
               + mechanisms_help(with_options=True))
    p.add_argument("--preset", choices=PRESET_NAMES, default="class",
                   help="model + training preset (default: class)")
    p.add_argument("--arch", default=None,
                   help=f"architecture (default: dense): {', '.join(registry.names())}")
    p.add_argument("--steps", type=int, default=None, help="total optimizer steps")
    p.add_argument("--corpus", default=None, help="corpus name (default: the preset's)")
    p.add_argument("--paths", nargs="+", default=None, metavar="FILE",
                   help="your own text files (implies --corpus files)")
    p.add_argument("--encoding", default="utf-8", help="encoding of --paths (default utf-8)")
    p.add_argument("--local-path", default=None, metavar="DIR",
                   help="a local copy of WikiText's parquet files (wikitext-2/-103)")
    p.add_argument("--allow-fallback", action="store_true",
                   help="use the offline corpus when WikiText cannot be had")
    p.add_argument("--out", default=None, help="output folder (default: runs/PRESET_ARCH)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model's forward/backward (TrainConfig.compile; the "
                        "first step compiles, tens of seconds on a CPU)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override any ModelConfig/TrainConfig field or mechanism option "
                        "(repeatable; booleans: true/false, yes/no, on/off, 1/0)")
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


BOOLEAN_WORDS = {"true": True, "yes": True, "on": True, "1": True,
                 "false": False, "no": False, "off": False, "0": False}


def field_kinds(arch: str) -> dict[str, str]:
    """Every settable field's declared type, as text ('bool', 'tuple | None', ...)."""
    fields = [*dataclasses.fields(TrainConfig), *dataclasses.fields(config_class(arch))]
    return {f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            for f in fields}


def parse_setting(key: str, text: str, kind: str | None):
    """A ``--set`` value read by the field's type: booleans from the usual words, tuples from
    comma lists ('8' is (8,)), everything else by ``parse_value``."""
    if kind and "bool" in kind:
        word = text.strip().lower()
        if word not in BOOLEAN_WORDS:
            fail(key, text, "expected true/false, yes/no, on/off or 1/0")
        return BOOLEAN_WORDS[word]
    if kind and "tuple" in kind:
        if text.strip().lower() in ("none", "null") and "None" in kind:
            return None
        return tuple(parse_value(p) for p in text.split(",") if p.strip() and p.strip() != "()")
    return text if kind == "str" else parse_value(text)


def cli_overrides(args) -> dict:
    pairs = []
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r} is not allowed: expected KEY=VALUE, e.g. --set lr=1e-3")
        pairs.append((key.strip(), value))
    arch = args.arch or dict(pairs).get("arch") or registry.BASELINE
    kinds = field_kinds(arch)
    overrides = {key: parse_setting(key, value, kinds.get(key)) for key, value in pairs}
    corpus = args.corpus or ("files" if args.paths else None)
    explicit = {"arch": args.arch, "steps": args.steps, "corpus": corpus, "device": args.device,
                "compile": True if getattr(args, "compile", False) else None}
    overrides.update({k: v for k, v in explicit.items() if v is not None})
    return overrides


def sample_text(model, dataset, device: torch.device, tokenizer_name: str, context: int) -> str:
    """Continue the first 16 tokens of ``dataset[0]`` by up to 80 sampled tokens, staying
    within the model's ``context`` (its seq_len)."""
    prompt = dataset[0][0][:min(16, context - 1)][None].to(device)        # (1, P)
    new = max(1, min(80, context - prompt.shape[1]))
    gen = torch.Generator(device=device).manual_seed(0)
    out = model.generate(prompt, new, temperature=0.8, top_k=20, generator=gen)[0].cpu()
    tok = get_tokenizer(tokenizer_name)
    cut = prompt.shape[1]
    return f"{tok.decode(out[:cut])!r} -> {tok.decode(out[cut:])!r}"


def model_mismatch(ckpt: dict, run_cfg: RunConfig) -> list[str]:
    stored = (ckpt.get("run_config") or {}).get("model", {})
    wanted = run_cfg.model.to_dict()
    return [f"{k}={stored.get(k)!r} (checkpoint) vs {v!r} (this command)"
            for k, v in wanted.items() if k in stored and stored[k] != v]


# settings a resumed run must share with its checkpoint, or its curve is not the same run's
RESUME_MUST_MATCH = ("batch_size", "lr", "min_lr_ratio", "warmup_steps", "weight_decay",
                     "beta1", "beta2", "grad_clip", "seed", "corpus", "tokenizer",
                     "val_fraction", "precision")


def resume_check(ckpt: dict, run_cfg: RunConfig) -> list[str]:
    """Refuse (ValueError) a resume that changes the model or the optimisation, or asks for no
    more steps than done; returns warnings (a longer schedule)."""
    problems = model_mismatch(ckpt, run_cfg)
    stored = (ckpt.get("run_config") or {}).get("train") or ckpt.get("train_config", {})
    wanted = dataclasses.asdict(run_cfg.train)
    problems += [f"{k}={stored[k]!r} (checkpoint) vs {wanted[k]!r} (this command)"
                 for k in RESUME_MUST_MATCH if k in stored and stored[k] != wanted[k]]
    if problems:
        raise ValueError("--resume with different settings is not allowed (use the "
                         "checkpoint's, or train into a new --out): " + "; ".join(problems))
    step, steps = int(ckpt["step"]), run_cfg.train.steps
    if steps <= step:
        raise ValueError(f"--steps {steps} is not allowed with --resume: the checkpoint is at "
                         f"step {step}; expected more than {step}")
    old = stored.get("steps")
    if old is not None and old != steps:
        return [f"the LR schedule now spans {steps} steps instead of {old}: the resumed curve "
                f"is not the one a single run of {steps} steps would give"]
    return []


def _corpus(args, run_cfg: RunConfig):
    return load_corpus(run_cfg.train.corpus, paths=args.paths, local_path=args.local_path,
                       allow_fallback=args.allow_fallback, encoding=args.encoding)


def _trainer(args, run_cfg: RunConfig, ckpt: dict | None) -> Trainer:
    """Seeded before the model is built, so two identical commands train identically."""
    check_fits_in_memory(run_cfg.model,
                         distributed.device_for(run_cfg.train.device, distributed.current()))
    train_loader, val_loader = make_loaders(run_cfg, corpus=_corpus(args, run_cfg))
    seed_everything(run_cfg.train.seed)
    trainer = Trainer(build_model(run_cfg), run_cfg, train_loader, val_loader)
    if ckpt is not None:
        trainer.restore(ckpt, Path(run_cfg.train.checkpoint_dir) / CHECKPOINT_NAME)
    return trainer


def _save_history(history, out: Path) -> str:
    try:
        return f"wrote {history.save_json(out / 'history.json')}"
    except OSError as err:
        return f"history.json could not be written either ({err.strerror or err})"


def _exit_code(history) -> int:
    """0 when finished; 128 + the signal's number when a signal stopped the run."""
    if not history.interrupted:
        return 0
    return 128 + int(getattr(signal, history.stopped_by or "SIGINT", signal.SIGINT))


@contextlib.contextmanager
def _quiet_unless(main: bool):
    """Swallow stdout and stderr on every process but rank 0 (argparse prints by itself)."""
    if main:
        yield
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def _parse(parser_of, argv: list[str], main: bool):
    """(args, None) or (None, exit status) with the message printed (on rank 0)."""
    with _quiet_unless(main):
        try:
            load_plugins(argv)
            return parser_of().parse_args(argv), None
        except SystemExit as exit_:        # --help (0) or a bad argument (2, message printed)
            return None, exit_.code if isinstance(exit_.code, int) else 2
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return None, 2


def train_main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite train ...`` (also under torchrun); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        world = distributed.env_world()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args, status = _parse(train_parser, argv, world.is_main)
    if args is None:
        return status
    try:
        run_cfg = preset(args.preset, **cli_overrides(args))
        distributed.check_batch_size(run_cfg.train.batch_size, world.world_size)  # before any work
        out = Path(args.out or f"runs/{run_cfg.preset}_{run_cfg.model.arch}")
        run_cfg = run_cfg.replace(checkpoint_dir=str(out))
        if not world.distributed:
            with RunLock(prepare_folder(out, name="--out")):
                return _train_in(args, run_cfg, out, distributed.SINGLE,
                                 _read_checkpoint(args, run_cfg, out))
        world = distributed.setup(run_cfg.train.device)
        try:
            return _train_ranks(args, run_cfg, out, world)
        finally:
            distributed.shutdown()     # waits for every process: none leaves before rank 0
    except (ValueError, RunLocked) as e:
        if world.is_main:
            print(f"error: {e}", file=sys.stderr)
        return 2


def _read_checkpoint(args, run_cfg: RunConfig, out: Path) -> dict | None:
    """The checkpoint to resume from (None for a new run), checked against this command."""
    ckpt_path = out / CHECKPOINT_NAME
    if args.resume and not ckpt_path.is_file():
        raise ValueError(f"--resume needs {ckpt_path}, which does not exist")
    if not args.resume and ckpt_path.exists():
        raise ValueError(f"{ckpt_path} exists; pass --resume to continue it or choose another "
                         "--out")
    if not args.resume:
        return None
    try:
        ckpt = load_checkpoint_file(ckpt_path)
    except OSError as e:
        raise ValueError(str(e)) from None
    for warning in resume_check(ckpt, run_cfg):
        print(f"warning: {warning}", file=sys.stderr)
    return ckpt


def _train_ranks(args, run_cfg: RunConfig, out: Path, world: distributed.World) -> int:
    """Several processes: rank 0 takes the folder and reads the checkpoint, every process
    gets it (or rank 0's error), then all train together."""
    lock = RunLock(out)

    def claim():
        prepare_folder(out, name="--out")
        lock.acquire()
        try:
            return _read_checkpoint(args, run_cfg, out)
        except BaseException:
            lock.release()
            raise

    ckpt = world.on_main(claim)
    try:
        return _train_in(args, run_cfg, out, world, ckpt)
    finally:
        if world.is_main:
            lock.release()


def _train_in(args, run_cfg: RunConfig, out: Path, world: distributed.World,
              ckpt: dict | None) -> int:
    """The run itself, with ``out`` locked by this process (rank 0)."""
    say = print if world.is_main else (lambda *a, **k: None)
    try:
        trainer = _trainer(args, run_cfg, ckpt)
    except (OSError, CorpusUnavailable) as e:
        raise ValueError(str(e)) from None
    n_params = sum(p.numel() for p in trainer.model.parameters())
    verb = f"resuming at step {trainer.step}" if ckpt is not None else "training"
    where = (f"{trainer.device} x {world.world_size} processes (each "
             f"{run_cfg.train.batch_size // world.world_size} rows)"
             if world.distributed else f"{trainer.device}")
    say(f"{verb}: {run_cfg.model.arch} ({n_params / 1e6:.2f}M params), preset {run_cfg.preset}, "
        f"{run_cfg.train.steps} steps of {run_cfg.train.batch_size}x{run_cfg.model.seq_len} "
        f"tokens on {where}; output in {out}", flush=True)
    return _fit_and_report(trainer, run_cfg, out, world, say)


def _rescue_note(error, rescued: Path | None) -> str:
    """What became of the final state when its checkpoint did not fit on the disk."""
    if not getattr(error, "disk_full", False):
        return ""
    if rescued is None:
        return (f"no other folder had room for the final state, so it is lost (set "
                f"{RESCUE_ENV} to a folder on another disk to keep it next time)\n")
    return (f"the final state was saved instead to {rescued}: move it into place once there "
            f"is room, or continue from it with --out {rescued.parent} --resume\n")


def _fit_and_report(trainer: Trainer, run_cfg: RunConfig, out: Path, world, say) -> int:
    try:
        history = trainer.fit()
    except distributed.PeerLost as e:                   # raised on every surviving process
        print(f"error: {e}", file=sys.stderr)
        if world.is_main:
            print(_save_history(trainer.history, out), file=sys.stderr)
        return 1
    except (FloatingPointError, CheckpointNotSaved) as e:      # raised on every process
        rescued = trainer.rescue_checkpoint() if getattr(e, "disk_full", False) else None
        if world.is_main:
            print(f"error: {e}\n{_rescue_note(e, rescued)}{_save_history(trainer.history, out)}",
                  file=sys.stderr)
        return 1
    saved = _save_history(history, out) if world.is_main else ""
    if trainer.val_dataset is not None and not history.interrupted:
        val = (history.val_loss[-1] if history.val_step and history.val_step[-1] == trainer.step
               else trainer.evaluate())                      # all-reduced: every rank calls it
        say(f"final val loss {val:.4f} at step {trainer.step}")
    say(f"wrote {out / CHECKPOINT_NAME}; {saved}")
    if not history.interrupted and world.is_main:
        sample = sample_text(trainer.model, trainer.train_dataset, trainer.device,
                             run_cfg.train.tokenizer, run_cfg.model.seq_len)
        print(f"sample: {sample}")
    return _exit_code(history)


# --- bench -----------------------------------------------------------------------------------
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
                        metavar="S", help="seconds of each machine probe (matmul FLOP/s, copy "
                                          "bandwidth) for the roofline (default %(default)s)")
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
    try:
        options = bench_options_of(args)
        json_path = _json_target(args.json) if args.json else None
        if args.warmup < PROTOCOL_WARMUP or args.repeats < PROTOCOL_REPEATS:
            print(f"bench: warning: --warmup {args.warmup} --repeats {args.repeats} is below the "
                  f"protocol's {PROTOCOL_WARMUP} and {PROTOCOL_REPEATS}: a smoke test, not a "
                  "measurement", file=sys.stderr)
        records = bench.run_bench(
            archs=_split(args.arch), seq_lens=parse_int_list("--seq-len", args.seq_len),
            batch=args.batch, d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
            vocab_size=args.vocab_size, threads=args.threads, device=args.device,
            dtype=args.dtype, phases=None if args.phases == "auto" else _split(args.phases),
            warmup=args.warmup, repeats=args.repeats, decode_burst=args.decode_burst,
            memory=_split(args.memory), options=options, compile=args.compile,
            roofline_seconds=args.roofline_seconds)
    except ValueError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    print(bench.format_table(records))
    if json_path:
        print(f"wrote {bench.write_json(records, json_path)}")
    return 0


def _json_target(text: str) -> Path:
    """The --json path, checked before any timing: its folder creatable, itself not a folder."""
    path = Path(text)
    if path.is_dir():
        fail("--json", text, "expected a file path, not a folder")
    prepare_folder(path.parent, name="--json folder")
    return path


# --- reproduce -------------------------------------------------------------------------------
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
                   help="fast (CI, minutes), class (a 2-core laptop, well under an hour), gpu")
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
    args, status = _parse(reproduce_parser, argv, world.is_main)
    if args is None:
        return status
    out = Path(args.out or f"runs/reproduce_{args.preset}")
    say = print if world.is_main else (lambda *a, **k: None)
    try:
        if args.steps is not None and args.steps < 1:
            fail("--steps", args.steps, "expected an integer >= 1")
        if args.seed is not None and args.seed < 0:
            fail("--seed", args.seed, "expected an integer >= 0")
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
            world.on_main(claim)
            try:
                results = lab.reproduce(args.preset, out,
                                        _split(args.arch) if args.arch else None, corpus,
                                        steps=args.steps, workers=args.workers,
                                        seed=args.seed)
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
        return _exit_code(stop.history) if isinstance(stop, TrainingStopped) else 130
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
