"""``python -m blockmem_lite gpucheck``: the GPU path, checked in one short run.

The kit is written device-agnostic and tested on CPU; this command runs every
path that only a GPU takes (bf16 autocast, CUDA memory counters, the CUDA RNG in
checkpoints) and prints one table, a row per check: step, arch, result (OK,
FAIL or SKIP), a figure, its seconds and its time budget. Every check is
isolated: one that raises or misses its criterion is a FAIL row with a one-line
reason and the others still run. Exit status 1 if any row FAILs, else 0.

Steps (sizes for one GPU; ``--tiny``: small sizes, the logic on a CPU in seconds):

1. ``autocast`` (every registered arch): the ``gpu`` preset's model (B=8,
   T=1024) forward + backward under bf16 autocast: the logits are bf16, the loss
   finite and within 2% of the fp32 loss of the same batch, every gradient
   finite; then a prefill and 8 decoding steps under autocast give finite logits.
   On a CPU the same runs under CPU bf16 autocast, a rehearsal only.
2. ``cached`` (every arch): in fp32 (matmul precision "highest"), after adding
   N(0, 0.02) noise to every parameter (so zero-initialised paths, e.g. BCMT's
   W_p, are exercised): prefill T/2 - 3 tokens, decode the rest step by step
   (T = 512, crossing block, segment and chunk boundaries); every logit equals
   the full forward's within ``CACHED_TOLERANCE`` x max(1, max |logit|).
3. ``train`` (dense and BCMT): the ``gpu`` preset on the offline corpus (pydoc
   topics, no network), 60 AdamW steps at the preset's precision (bf16 from compute
   capability 8.0, fp16 with a GradScaler before):
   the loss falls (the mean of the last 10 steps at most 0.8 x the first loss);
   the figure gives tokens/s (median of the second half of the steps) and peak memory.
4. ``bench`` (every arch): ``bench.run_bench`` of dense and the arch (the last
   value of each default sweep, e.g. L=128) at T = 1024 and 4096, train and
   decode, d=256, 4 layers, the protocol's 3 warm-up and 5 timed steps, CUDA
   memory (``cuda_max_allocated``) and the roofline; one row per record.
5. ``rng``: a checkpoint's CUDA RNG state round trip (train one step, save, draw,
   load, draw again: the same numbers). SKIP without CUDA.
6. ``flex`` (BCMT's block mask, CAT's mask): where ``torch.nn.attention.flex_attention``
   exists, compiled FlexAttention against the kit's SDPA form of the same
   attention (BCMT: blocks reshaped into the batch; CAT: ``per_chunk_attention``)
   on the same q, k, v (B=4, 4 heads of 64, T=4096, bf16): the outputs agree
   (``FLEX_TOLERANCE``, relative to 1 + |sdpa|) and forward + backward are timed
   interleaved (3 warm-up calls: the compilation; 10 timed); the figure says
   which is faster. A measurement only: the models keep SDPA (see docs/LAB.md). On a
   CPU (no FlexAttention backward there) the agreement is checked forward only, in
   eager mode, without timing.

Time: the budgets add up to about 4.5 minutes on one H100-class GPU (an estimate;
the flex rows' compilation is the least certain part); the whole run is meant to
finish in under 5 minutes.
``--tiny`` on a 2-core CPU takes well under a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from blockmem_lite import registry
from blockmem_lite.config import preset
from blockmem_lite.corpora import load_corpus, make_loaders
from blockmem_lite.measure import bench, bench_steps
from blockmem_lite.models.base import build_model
from blockmem_lite.nn import attention
from blockmem_lite.runtime import (
    autocast_context,
    pick_device,
    precision_note,
    seed_everything,
    synchronize,
)
from blockmem_lite.tools.cli import output_file
from blockmem_lite.train import Callback, Trainer
from blockmem_lite.units import fmt, human_bytes
from blockmem_lite.validation import check_device, fail

RESULTS = ("OK", "FAIL", "SKIP")
TARGET_S = 300.0                       # the whole run, on one H100-class GPU
CACHED_TOLERANCE = 2e-4                # |cached - full| <= this x max(1, max |logit|), fp32
LOSS_AGREEMENT = 0.02                  # |bf16 loss - fp32 loss| <= this x fp32 loss
LOSS_FALL = 0.8                        # mean of the last 10 losses <= this x the first loss
FLEX_TOLERANCE = {"bf16": 2e-2, "fp32": 1e-4}   # on |flex - sdpa| / (1 + |sdpa|)
TRAIN_ARCHS = (registry.BASELINE, "bcmt")
FLEX_MASKS = ("bcmt", "cat")           # whose masks the flex step measures
NO_CUDA = ("no CUDA device here: gpucheck checks the GPU path. Run it on a machine with a "
           "GPU, or pass --device cpu (add --tiny for a rehearsal of its logic in seconds).")


@dataclass(frozen=True)
class Sizes:
    """How big each step runs: ``FULL`` on a GPU, ``TINY`` for a CPU rehearsal."""

    preset: str
    batch: int                    # autocast step (at the preset's seq_len)
    cached_len: int
    train_steps: int
    train_lr: float
    train_warmup: int
    bench_lens: tuple[int, ...]
    bench_d: int
    bench_layers: int
    bench_heads: int
    bench_batch: int | None
    bench_warmup: int
    bench_repeats: int
    bench_burst: int
    roofline_seconds: float
    flex_batch: int
    flex_heads: int
    flex_head_dim: int
    flex_len: int
    flex_block: int               # BCMT's L
    flex_chunk: int               # CAT's C
    budgets: dict                 # step -> seconds per check on an H100-class GPU


FULL = Sizes(preset="gpu", batch=8, cached_len=512, train_steps=60,
             train_lr=1e-3, train_warmup=10, bench_lens=(1024, 4096), bench_d=256,
             bench_layers=4, bench_heads=4, bench_batch=None, bench_warmup=3, bench_repeats=5,
             bench_burst=32, roofline_seconds=0.25, flex_batch=4, flex_heads=4,
             flex_head_dim=64, flex_len=4096, flex_block=128, flex_chunk=16,
             budgets={"autocast": 5.0, "cached": 4.0, "train": 20.0, "bench": 20.0,
                      "rng": 3.0, "flex": 25.0})
TINY = Sizes(preset="tiny", batch=2, cached_len=32, train_steps=40,
             train_lr=3e-3, train_warmup=4, bench_lens=(256, 512), bench_d=32, bench_layers=1,
             bench_heads=2, bench_batch=2, bench_warmup=1, bench_repeats=1, bench_burst=2,
             roofline_seconds=0.0, flex_batch=1, flex_heads=2, flex_head_dim=16, flex_len=64,
             flex_block=8, flex_chunk=4, budgets=FULL.budgets)


class CheckFailed(Exception):
    """A check ran but missed its criterion; the message is the row's figure."""


@dataclass
class Check:
    """One isolated check: ``run()`` returns its rows as (step, result, figure) triples."""

    step: str
    arch: str
    budget_s: float
    run: Callable[[], list[tuple[str, str, str]]]


@dataclass
class Row:
    step: str
    arch: str
    result: str
    figure: str
    seconds: float | None          # the check's time, on its first row only
    budget_s: float | None


# --------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------

def _bf16_autocast(device: torch.device):
    """bf16 autocast: the kit's on CUDA; elsewhere torch's own (a rehearsal only)."""
    if device.type == "cuda":
        return autocast_context(device, "bf16")
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _model_cfg(arch: str, sizes: Sizes, seq_len: int | None = None):
    cfg = preset(sizes.preset, arch=arch).model
    return dataclasses.replace(cfg, seq_len=seq_len) if seq_len else cfg


def _peak(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    return f", peak {human_bytes(torch.cuda.max_memory_allocated(device))} (cuda_max_allocated)"


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def check_autocast(arch: str, device: torch.device, sizes: Sizes) -> list[tuple[str, str, str]]:
    """Forward + backward and a short decode under bf16 autocast (module docstring, step 1)."""
    cfg = _model_cfg(arch, sizes)
    seed_everything(0)
    model = build_model(cfg).to(device)
    tokens = bench_steps.random_tokens(sizes.batch, cfg.seq_len + 1, cfg.vocab_size, device)
    x, y = tokens[:, :-1], tokens[:, 1:]                                   # (B, T) each
    model.train()
    with torch.no_grad():
        fp32_loss = float(model(x, y).loss)
    _reset_peak(device)
    with _bf16_autocast(device):
        out = model(x, y)
    out.loss.backward()
    loss = float(out.loss.detach())
    bad = [n for n, p in model.named_parameters()
           if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    if out.logits.dtype != torch.bfloat16:
        raise CheckFailed(f"logits are {out.logits.dtype} under bf16 autocast, not bfloat16")
    if not torch.isfinite(out.loss) or bad:
        raise CheckFailed(f"loss {loss:.4f}; non-finite gradients in {len(bad)} tensors "
                          f"({', '.join(bad[:3])})")
    if abs(loss - fp32_loss) > LOSS_AGREEMENT * abs(fp32_loss):
        raise CheckFailed(f"bf16 loss {loss:.4f} vs fp32 {fp32_loss:.4f}: more than "
                          f"{LOSS_AGREEMENT:.0%} apart")
    model.zero_grad(set_to_none=True)
    model.eval()
    prompt = cfg.seq_len // 2
    with torch.no_grad(), _bf16_autocast(device):
        logits, state = model.prefill(x[:, :prompt], max_len=prompt + 8)
        steps = [model.step(x[:, prompt + i], state)[0] for i in range(8)]
    if not all(bool(torch.isfinite(t).all()) for t in (logits, *steps)):
        raise CheckFailed("non-finite logits in the prefill or the 8 decoding steps under "
                          "bf16 autocast")
    note = "" if device.type == "cuda" else " (cpu bf16 autocast: a rehearsal)"
    return [("autocast", "OK", f"loss bf16 {loss:.4f} vs fp32 {fp32_loss:.4f}, grads finite, "
                               f"decode finite{_peak(device)}{note}")]


@contextlib.contextmanager
def _highest_matmul_precision():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def check_cached(arch: str, device: torch.device, sizes: Sizes) -> list[tuple[str, str, str]]:
    """Prefill + step-by-step decode == the full forward, fp32 (module docstring, step 2)."""
    cfg = _model_cfg(arch, sizes, sizes.cached_len)
    seed_everything(0)
    model = build_model(cfg).to(device).eval()
    t, prompt = cfg.seq_len, cfg.seq_len // 2 - 3
    x = bench_steps.random_tokens(2, t, cfg.vocab_size, device)               # (2, T)
    with torch.no_grad(), _highest_matmul_precision():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
        full = model(x).logits                                             # (2, T, V)
        logits, state = model.prefill(x[:, :prompt], max_len=t)
        pieces = [logits]
        for i in range(prompt, t):
            step_logits, state = model.step(x[:, i], state)
            pieces.append(step_logits[:, None])
        cached = torch.cat(pieces, dim=1)
    scale = max(1.0, float(full.abs().max()))
    worst = float((cached - full).abs().max())
    figure = (f"max |cached - full| {worst:.2e} <= {CACHED_TOLERANCE:.0e} x {scale:.2f} "
              f"(prefill {prompt}, {t - prompt} steps, fp32)")
    if not worst <= CACHED_TOLERANCE * scale:
        raise CheckFailed(figure.replace("<=", "exceeds"))
    return [("cached", "OK", figure)]


class _Quiet(Callback):
    """No progress lines: the table says it all."""


def check_training(arch: str, device: torch.device, sizes: Sizes) -> list[tuple[str, str, str]]:
    """A short training run on the offline corpus (module docstring, step 3)."""
    run_cfg = preset(sizes.preset, arch=arch, steps=sizes.train_steps, lr=sizes.train_lr,
                     warmup_steps=sizes.train_warmup, corpus="offline", device=str(device),
                     log_every=sizes.train_steps)
    train_loader, _ = make_loaders(run_cfg, corpus=load_corpus("offline"))
    seed_everything(run_cfg.train.seed)
    trainer = Trainer(build_model(run_cfg), run_cfg, train_loader, None,
                      callbacks=[_Quiet()])
    history = trainer.fit()
    losses = history.loss
    last = statistics.mean(losses[-10:])
    speed = statistics.median(history.tokens_per_s[len(history.tokens_per_s) // 2:])
    memory = max(history.memory_bytes) if history.memory_bytes else None
    precision = precision_note(device, trainer.precision)
    figure = (f"loss {losses[0]:.3f} -> {last:.3f} in {len(losses)} steps of "
              f"{run_cfg.train.batch_size}x{run_cfg.model.seq_len} tokens ({precision}), "
              f"{speed:,.0f} tok/s, memory {human_bytes(memory)} "
              f"({history.memory_method or '?'})")
    if not last <= LOSS_FALL * losses[0]:
        raise CheckFailed(f"the loss did not fall: {figure}")
    return [("train", "OK", figure)]


def bench_options() -> dict:
    """The last value of each default bench sweep (one variant per mechanism, e.g. L=128)."""
    return {dest: value[-1:] if isinstance(value, list) else value
            for dest, value in registry.default_bench_options().items()}


def check_bench(arch: str, device: torch.device, sizes: Sizes) -> list[tuple[str, str, str]]:
    """Dense and ``arch`` benched in one run (module docstring, step 4); a row per record."""
    records = bench.run_bench(
        [arch], list(sizes.bench_lens), batch=sizes.bench_batch, d_model=sizes.bench_d,
        n_layer=sizes.bench_layers, n_head=sizes.bench_heads, device=str(device),
        phases=bench.PHASES, warmup=sizes.bench_warmup, repeats=sizes.bench_repeats,
        decode_burst=sizes.bench_burst, memory=("saved",), options=bench_options(),
        progress=False, roofline_seconds=sizes.roofline_seconds)
    own = [r for r in records if r["arch"] == arch]
    wanted = {(phase, t) for phase in bench.PHASES for t in sizes.bench_lens}
    missing = wanted - {(r["phase"], r["seq_len"]) for r in own}
    if missing:
        raise CheckFailed(f"no record for {sorted(missing)}")
    rows = []
    for r in own:
        figure = (f"{r['tokens_per_s']:,.0f} tok/s, x dense {fmt(r['ratio_vs_dense'], '.2f')} "
                  f"(ceiling {fmt(r['flop_ceiling'], '.2f')}), roofline "
                  f"{fmt(r['roofline_fraction'], '.0%')} ({r['roofline_bound'] or '-'}), "
                  f"memory {human_bytes(r['memory_bytes'])} ({r['memory_method']}), "
                  f"state {human_bytes(r['state_bytes'])}")
        problem = not r["tokens_per_s"] > 0 or (
            device.type == "cuda" and not (r["memory_method"] == "cuda_max_allocated"
                                           and r["memory_bytes"]))
        label = f"{r['arch']} {r['variant']}".strip()
        rows.append((f"bench {r['phase']} T={r['seq_len']}", "FAIL" if problem else "OK",
                     figure if label == arch else f"{label}: {figure}"))
    return rows


def rng_round_trip(device: torch.device) -> str:
    """Train one step, save a checkpoint, draw on ``device``, load it, draw again: the
    same numbers, or CheckFailed. Returns the figure."""
    run_cfg = preset("tiny", steps=1, device=str(device), corpus="offline")
    train_loader, _ = make_loaders(run_cfg, corpus=load_corpus("offline", max_chars=20_000))
    trainer = Trainer(build_model(run_cfg), run_cfg, train_loader, None,
                      callbacks=[_Quiet()])
    trainer.fit()
    with tempfile.TemporaryDirectory() as folder:
        path = trainer.save_checkpoint(Path(folder) / "checkpoint.pt")
        first = torch.randn(16, device=device)
        trainer.load_checkpoint(path)
        again = torch.randn(16, device=device)
        saved = torch.load(path, map_location="cpu", weights_only=False)["rng"]
    key = "cuda" if device.type == "cuda" else "torch"
    if key not in saved:
        raise CheckFailed(f"the checkpoint holds no {key!r} RNG state (keys: {sorted(saved)})")
    if not torch.equal(first, again):
        raise CheckFailed(f"the {device.type} RNG draws differ after loading the checkpoint")
    return f"{device.type} RNG restored from the checkpoint: the same 16 draws"


def check_rng(device: torch.device, sizes: Sizes) -> list[tuple[str, str, str]]:
    """The CUDA RNG state through a checkpoint (module docstring, step 5)."""
    if device.type != "cuda":
        return [("rng", "SKIP", f"no CUDA on {device.type}: the CUDA RNG state is saved only "
                                "on CUDA (the round trip's logic is tested on the CPU RNG)")]
    return [("rng", "OK", rng_round_trip(device))]


def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def _flex_case(name: str, sizes: Sizes, device: torch.device, dtype: torch.dtype):
    """(q, k, v, the SDPA form, the boolean mask) of BCMT's or CAT's attention."""
    from blockmem_lite.masks import block_causal_mask, cat_mask
    from blockmem_lite.ops.cat_attention import per_chunk_attention
    from blockmem_lite.ops.cat_layout import n_slots

    b, h, hd, t = sizes.flex_batch, sizes.flex_heads, sizes.flex_head_dim, sizes.flex_len
    if name == "bcmt":
        size, n = sizes.flex_block, t // sizes.flex_block
        mask = block_causal_mask(t, size, device=device)                   # (T, T)

        def sdpa(q, k, v):                       # blocks into the batch, 4-D, causal SDPA
            blocks = [z.reshape(b, h * n, size, hd) for z in (q, k, v)]
            return attention(*blocks, causal=True).reshape(b, h, t, hd)
        length = t
    else:
        chunks = t // sizes.flex_chunk
        length = n_slots(chunks, sizes.flex_chunk)
        mask = cat_mask(chunks, sizes.flex_chunk, device=device)           # (S, S)

        def sdpa(q, k, v):
            return per_chunk_attention(q, k, v, chunks, sizes.flex_chunk)
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, h, length, hd, generator=gen).to(device, dtype)
               for _ in range(3))
    return q, k, v, sdpa, mask


def check_flex(name: str, device: torch.device, sizes: Sizes) -> list[tuple[str, str, str]]:
    """FlexAttention vs the kit's SDPA form of ``name``'s mask (module docstring, step 6)."""
    if not flex_available():
        return [("flex", "SKIP", f"torch {torch.__version__} has no "
                                 "torch.nn.attention.flex_attention")]
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cuda = device.type == "cuda"
    precision = "bf16" if cuda else "fp32"
    dtype = torch.bfloat16 if cuda else torch.float32
    q, k, v, sdpa, mask = _flex_case(name, sizes, device, dtype)
    length = q.shape[2]
    block_mask = create_block_mask(lambda b, h, qi, ki: mask[qi, ki], None, None, length,
                                   length, device=str(device))
    flex = torch.compile(flex_attention, dynamic=False) if cuda else flex_attention
    leaves = [t.requires_grad_(cuda) for t in (q, k, v)]      # CPU: no FlexAttention backward
    with contextlib.ExitStack() as stack:
        if not cuda:
            stack.enter_context(torch.no_grad())
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        want, got = sdpa(*leaves), flex(*leaves, block_mask=block_mask)
    got, want = got.detach().float(), want.detach().float()
    worst = float(((got - want).abs() / (1 + want.abs())).max())
    tolerance = FLEX_TOLERANCE[precision]
    agree = (f"max |flex - sdpa| / (1 + |sdpa|) {worst:.1e} ({precision}, T={sizes.flex_len}, "
             f"S={length})")
    if not worst <= tolerance:
        raise CheckFailed(f"{agree} exceeds {tolerance:.0e}")
    if not cuda:
        return [("flex", "OK", f"{agree}; forward only, eager: timing needs CUDA "
                               "(no FlexAttention backward on a CPU)")]
    def step(fn):
        def run():
            fn(*leaves).float().sum().backward()
            for t in leaves:
                t.grad = None
        return run

    sdpa_t, flex_t = bench_steps.time_interleaved(
        [step(sdpa), step(lambda a, b_, c: flex(a, b_, c, block_mask=block_mask))],
        warmup=3, repeats=10, device=device)
    sdpa_ms, flex_ms = 1000 * statistics.median(sdpa_t), 1000 * statistics.median(flex_t)
    verdict = "flex faster" if flex_ms < sdpa_ms else "SDPA faster"
    return [("flex", "OK", f"{agree}; fwd+bwd sdpa {sdpa_ms:.2f} ms, flex {flex_ms:.2f} ms: "
                           f"{verdict} ({sdpa_ms / flex_ms:.2f}x)")]


# --------------------------------------------------------------------------------------
# The plan and the runner
# --------------------------------------------------------------------------------------

def archs() -> list[str]:
    """Every registered architecture, the baseline first."""
    names = registry.names()
    return [registry.BASELINE] + [n for n in names if n != registry.BASELINE]


STEPS = ("autocast", "cached", "train", "bench", "rng", "flex")


def plan(device: torch.device, sizes: Sizes, only=STEPS) -> list[Check]:
    """Every check of the steps in ``only``, in order. The checks call the module's
    functions when run (so a test can plant a failure by replacing one)."""
    budget = sizes.budgets
    module = sys.modules[__name__]

    def call(name: str, *args):
        return lambda: getattr(module, name)(*args, device, sizes)

    checks = [Check("autocast", a, budget["autocast"], call("check_autocast", a)) for a in archs()]
    checks += [Check("cached", a, budget["cached"], call("check_cached", a)) for a in archs()]
    checks += [Check("train", a, budget["train"], call("check_training", a))
               for a in TRAIN_ARCHS if a in registry.names()]
    checks += [Check("bench", a, budget["bench"], call("check_bench", a)) for a in archs()]
    checks.append(Check("rng", "-", budget["rng"], call("check_rng")))
    checks += [Check("flex", name, budget["flex"], call("check_flex", name))
               for name in FLEX_MASKS if name in registry.names()]
    return [c for c in checks if c.step in only]


def one_line(error: BaseException) -> str:
    """``Type: first line of the message`` (CheckFailed: the message), at most 240 chars."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    line = text if isinstance(error, CheckFailed) else f"{type(error).__name__}: {text}"
    return line if len(line) <= 240 else line[:237] + "..."


def run_checks(checks: list[Check], device: torch.device, progress: bool = True) -> list[Row]:
    """Run every check isolated; a raised error is a FAIL row with its one-line reason."""
    rows: list[Row] = []
    for check in checks:
        if progress:
            print(f"[gpucheck] {check.step} {check.arch} (budget {check.budget_s:.0f} s)",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            produced = check.run()
            synchronize(device)
        except Exception as error:                      # isolation: the rest still runs
            produced = [(check.step, "FAIL", one_line(error))]
        seconds = time.perf_counter() - start
        for i, (step, result, figure) in enumerate(produced):
            rows.append(Row(step, check.arch, result, figure, seconds if i == 0 else None,
                            check.budget_s if i == 0 else None))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def format_rows(rows: list[Row]) -> str:
    """The one table: step, arch, result, figure, seconds, budget."""
    body = [[r.step, r.arch, r.result, r.figure, fmt(r.seconds, ".1f"), fmt(r.budget_s, ".0f")]
            for r in rows]
    return bench.text_table(["step", "arch", "result", "figure", "seconds", "budget"], body,
                            left_columns=4)


def summary(rows: list[Row], total_s: float, device: torch.device, tiny: bool) -> str:
    counts = {k: sum(r.result == k for r in rows) for k in RESULTS}
    budget = sum(r.budget_s or 0 for r in rows)
    target = ("--tiny: a CPU rehearsal of the logic" if tiny else
              f"target under {TARGET_S:.0f} s on one H100-class GPU; budgets add up to "
              f"{budget:.0f} s")
    return (f"{counts['OK']} OK, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP in "
            f"{total_s:.1f} s on {device.type} ({bench.machine(device)}, torch "
            f"{torch.__version__}); {target}")


def to_json(rows: list[Row], total_s: float, device: torch.device, tiny: bool) -> dict:
    return {"device": device.type, "machine": bench.machine(device),
            "torch_version": torch.__version__, "tiny": tiny, "total_s": total_s,
            "target_s": TARGET_S, "rows": [dataclasses.asdict(r) for r in rows]}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m blockmem_lite gpucheck",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check the GPU path in one short run (under 5 minutes on one GPU): bf16 "
                    "autocast for every architecture, cached == full forward in fp32, a short "
                    "training run of dense and BCMT on the offline corpus, the bench at "
                    "T=1024 and 4096 with CUDA memory and the roofline, the CUDA RNG in "
                    "checkpoints, FlexAttention against SDPA. One table; exit 1 if any check "
                    "fails.")
    p.add_argument("--device", default=None,
                   help="cuda (the default when available), cuda:N, or cpu (a rehearsal)")
    p.add_argument("--tiny", action="store_true",
                   help="small sizes, so the logic runs on a CPU in seconds (the tests use it)")
    p.add_argument("--only", default=",".join(STEPS), metavar="STEP,...",
                   help=f"run only these steps (default: all of {','.join(STEPS)})")
    p.add_argument("--out", default=None, metavar="FILE.json", help="also write the table as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m blockmem_lite gpucheck ...``; returns the exit status."""
    try:
        args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    if args.device is None and not torch.cuda.is_available():
        print(f"gpucheck: {NO_CUDA}", file=sys.stderr)
        return 2
    try:
        if args.device is not None:
            check_device("--device", args.device)
        device = pick_device(args.device or "cuda")
        only = [s.strip() for s in args.only.split(",") if s.strip()]
        if not only or set(only) - set(STEPS):
            fail("--only", args.only, f"expected steps among {', '.join(STEPS)}")
        path = output_file("--out", args.out) if args.out is not None else None
    except ValueError as err:
        print(f"gpucheck: error: {err}", file=sys.stderr)
        return 2
    sizes = TINY if args.tiny else FULL
    start = time.perf_counter()
    rows = run_checks(plan(device, sizes, only), device)
    total = time.perf_counter() - start
    print(format_rows(rows))
    print(summary(rows, total, device, args.tiny))
    if path is not None:
        try:
            path.write_text(json.dumps(to_json(rows, total, device, args.tiny), indent=2),
                            encoding="utf-8")
        except OSError as err:              # the table above is the result: still shown
            print(f"gpucheck: error: --out={args.out!r} could not be written "
                  f"({err.strerror or err})", file=sys.stderr)
            return 2
        print(f"wrote {path}")
    return 1 if any(r.result == "FAIL" for r in rows) else 0
