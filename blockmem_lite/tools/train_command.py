"""``python -m blockmem_lite train``: train a model from a preset, with checkpoints and resume.

Argument parsing and reporting only: the work is done by ``train.Trainer``. It also runs
under ``torchrun`` (``distributed.setup``): every process parses the same command; rank 0
alone takes the output folder, reads the checkpoint (and hands it to the others), writes
and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from blockmem_lite import distributed, registry
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
from blockmem_lite.corpora import CORPUS_NAMES, CorpusUnavailable, load_corpus, make_loaders
from blockmem_lite.models.base import ModelExited, build_model
from blockmem_lite.runtime import seed_everything
from blockmem_lite.tokenizer import get_tokenizer
from blockmem_lite.tools.cli import (
    PLUGIN_HELP,
    check_path_given,
    exit_code,
    mechanisms_help,
    no_empty_folder_left,
    parse_command,
)
from blockmem_lite.train import CheckpointNotSaved, Trainer, check_fits_in_memory, resume
from blockmem_lite.validation import check_choice, fail


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
    device = distributed.device_for(run_cfg.train.device, distributed.current())
    check_fits_in_memory(run_cfg.model, device)       # before anything is built
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


def train_main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite train ...`` (also under torchrun); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        world = distributed.env_world()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args, status = parse_command(train_parser, argv, world.is_main)
    if args is None:
        return status
    try:
        check_path_given("--out", args.out)
        if args.corpus is not None:
            check_choice("--corpus", args.corpus, CORPUS_NAMES)
        run_cfg = preset(args.preset, **cli_overrides(args))
        distributed.check_batch_size(run_cfg.train.batch_size, world.world_size)  # before any work
        out = Path(args.out or f"runs/{run_cfg.preset}_{run_cfg.model.arch}")
        run_cfg = run_cfg.replace(checkpoint_dir=str(out))
        with no_empty_folder_left(out):
            if not world.distributed:
                return _train_in(args, run_cfg, out, distributed.SINGLE,
                                 _claimable_checkpoint(args, run_cfg, out))
            world = distributed.setup(run_cfg.train.device)
            try:
                return _train_ranks(args, run_cfg, out, world)
            finally:
                distributed.shutdown()     # waits for every process: none leaves before rank 0
    except (ValueError, RunLocked) as e:
        if world.is_main:
            print(f"error: {e}", file=sys.stderr)
        return 2


def _claimable_checkpoint(args, run_cfg: RunConfig, out: Path) -> dict | None:
    """``out`` made and checked free of another live run (``Trainer.fit`` takes its lock:
    the command claims it once), then the checkpoint to resume from, None for a new run."""
    RunLock(prepare_folder(out, name="--out")).check()
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
    resume.check_finite_weights(ckpt, ckpt_path)          # before the corpus loads
    resume.check_finite_optimizer(ckpt, ckpt_path)
    for warning in resume_check(ckpt, run_cfg):
        print(f"warning: {warning}", file=sys.stderr)
    return ckpt


def _train_ranks(args, run_cfg: RunConfig, out: Path, world: distributed.World) -> int:
    """Several processes: rank 0 checks the folder and reads the checkpoint, every process
    gets it (or rank 0's error), then all train together."""
    ckpt = world.on_main(lambda: _claimable_checkpoint(args, run_cfg, out))
    return _train_in(args, run_cfg, out, world, ckpt)


def _train_in(args, run_cfg: RunConfig, out: Path, world: distributed.World,
              ckpt: dict | None) -> int:
    """The run itself; its fit takes ``out``'s lock (rank 0)."""
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


def _rescue_note(error, rescued: Path | None, trainer: Trainer) -> str:
    """What became of the final state when its checkpoint did not fit on the disk."""
    if not getattr(error, "disk_full", False):
        return ""
    if rescued is None:
        return f"the final state is lost: {trainer.rescue_problem}\n"
    return (f"the final state was saved instead to {rescued}: move it into place once there "
            f"is room, or continue from it with --out {rescued.parent} --resume\n")


def _keep_trained(trainer: Trainer, out: Path, since: int) -> str:
    """After the model's code ended the run: the steps trained since step ``since`` saved
    (checkpoint and history), in words; '' when none was trained."""
    if trainer.step == since:
        return ""
    try:
        kept = f"the model of step {trainer.step} was saved to {trainer.save_checkpoint()}"
    except (OSError, RuntimeError, FloatingPointError) as err:
        kept = f"the model of step {trainer.step} could not be saved ({err})"
    return f"{kept}; {_save_history(trainer.history, out)}\n"


def _fit_and_report(trainer: Trainer, run_cfg: RunConfig, out: Path, world, say) -> int:
    start = trainer.step
    try:
        history = trainer.fit()
    except distributed.PeerLost as e:                   # raised on every surviving process
        print(f"error: {e}", file=sys.stderr)
        if world.is_main:
            print(_save_history(trainer.checkpoint_history or trainer.history, out),
                  file=sys.stderr)
        return 1
    except (FloatingPointError, CheckpointNotSaved) as e:      # raised on every process
        rescued = trainer.rescue_checkpoint() if getattr(e, "disk_full", False) else None
        if world.is_main:
            print(f"error: {e}\n{_rescue_note(e, rescued, trainer)}"
                  f"{_save_history(trainer.checkpoint_history or trainer.history, out)}",
                  file=sys.stderr)
        return 1
    except ModelExited as e:               # perhaps on this process alone: no collective save
        kept = _keep_trained(trainer, out, start) if not world.distributed else ""
        print(f"error: {e}\n{kept}", end="", file=sys.stderr)
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
    return exit_code(history)
