"""``python -m blockmem_lite bench``: throughput, memory and state bytes vs dense, same run.

The protocol (PERFORMANCE.md): same width/depth/vocab/dtype for every model;
dense is timed in the same process, interleaved with every variant (A B A B
…), so ``ratio_vs_dense`` is immune to the ±20% drift of a shared machine;
each ratio is shown next to its analytic FLOP ceiling (``metrics.py``).

Phases:

* ``train``: forward + backward on (batch, T) with the LM loss; **no optimizer
  step** (it costs the same for every architecture of a size); gradients are
  cleared after every step. Default batch: ``max(1, 4096 // T)`` sequences, so
  every length does about the same work per step.
* ``decode``: after a prefill of t = T tokens, the time of ``model.step``
  (tokens/s of decoding, batch 1 by default). Each timed sample runs
  ``decode_burst`` steps; ``ms_per_step`` is per token step. ``state_bytes`` is
  ``state.nbytes()`` after a prefill of exactly t tokens.
* ``read`` (MoC only, always with ``--arch moc``): the routed memory read vs
  reading the whole bank, as the bank grows (``bench_memory_read``).
* ``infer`` (ARMT only, with ``--arch armt`` unless ``--infer-len none``):
  prompts of growing total length read by ``ARMT.stream`` vs dense's
  ``prefill``, tokens/s and peak memory per length (``bench_inference``).

Memory (one ``memory_bytes`` + ``memory_method`` per record, the other figures
under extra keys):

* ``"cuda_max_allocated"`` on CUDA: peak allocated during one step (decode:
  prefill + steps), after ``reset_peak_memory_stats``;
* ``"rss_subprocess"`` on CPU when ``rss`` is requested: the peak RSS of a fresh
  subprocess running the phase, *including* the interpreter + torch baseline;
  ``rss_base_bytes`` is that process's peak right after import + model build,
  so ``rss_peak_bytes - rss_base_bytes`` is what the phase added;
* ``"saved_tensors"`` on CPU when only ``saved`` is requested (train only):
  bytes of activations saved for backward (parameters excluded), deterministic;
* ``"none"`` when nothing applies (``--memory none``; decode with ``saved`` only).

Extra record keys: ``saved_bytes``, ``rss_peak_bytes``, ``rss_base_bytes``
(None when not measured), ``flops_per_token`` (analytic; train = 3 × forward),
``ms_per_step``, ``frac_of_ceiling``, ``step_times_ms`` (every timed sample; decode:
per token step, like ``ms_per_step``), ``machine``, ``d_model``,
``n_layer``, ``n_head``, ``vocab_size``, ``params``, ``overrides``, ``warmup``,
``repeats``, ``load_avg_1m`` (the machine's 1-minute load average when the record
was made: a busy shared machine slows multi-threaded kernels a lot, which the
same-run ratios cancel but absolute tokens/s do not).

Later mechanisms add themselves with ``register_bench`` (variants + FLOP
model + their CLI options), and appear in the same command and records.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from blockmem_lite import metrics
from blockmem_lite.config import ModelConfig
from blockmem_lite.models import available_archs, build_model, moc
from blockmem_lite.runtime import pick_device, seed_everything
from blockmem_lite.units import human_bytes

PHASES = ("train", "decode")
MEMORY_CHOICES = ("saved", "rss", "none")
DTYPES = ("auto", "fp32", "bf16")
TRAIN_TOKENS_PER_STEP = 4096     # default train batch = max(1, this // T)
DEFAULT_SEQ_LENS = (256, 1024, 4096)
RECORD_KEYS = ("arch", "variant", "phase", "seq_len", "batch", "tokens_per_s", "ms_per_step",
               "ratio_vs_dense", "flop_ceiling", "frac_of_ceiling", "memory_bytes",
               "memory_method", "state_bytes", "device", "dtype", "threads", "torch_version")


# --------------------------------------------------------------------------------------
# Registry: which architectures the bench knows, their variants, FLOP models and options
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchOption:
    """A command-line option an architecture adds, e.g. ``--block-len 64,128``."""

    flag: str
    default: str
    help: str

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class BenchArch:
    """How to bench one architecture.

    ``variants(options) -> [(label, ModelConfig overrides)]``: ``options`` maps
    every registered option's ``dest`` to its string value.
    ``flops(cfg, seq_len, phase) -> forward FLOPs per token`` (a
    ``metrics.model_flops_per_token`` call) or None where no model exists.
    ``extra(options, run) -> [records]`` (optional): more records of the arch's
    own (e.g. MoC's memory-read timing), made once per bench; ``run`` holds
    d_model, n_layer, n_head, vocab_size, seq_len (the first length), batch
    (given, else 1), device, precision, threads, warmup, repeats, memory, progress.
    """

    name: str
    variants: Callable[[dict], list[tuple[str, dict]]]
    flops: Callable[[ModelConfig, int, str], float | None]
    options: tuple[BenchOption, ...] = ()
    extra: Callable[[dict, dict], list[dict]] | None = None


BENCH_ARCHS: dict[str, BenchArch] = {}


def register_bench(name: str, variants: Callable[[dict], list[tuple[str, dict]]],
                   flops: Callable[[ModelConfig, int, str], float | None],
                   options: tuple[BenchOption, ...] = (),
                   extra: Callable[[dict, dict], list[dict]] | None = None) -> BenchArch:
    """Make ``bench`` know architecture ``name`` (also a ``models`` registry name)."""
    entry = BenchArch(name, variants, flops, tuple(options), extra)
    BENCH_ARCHS[name] = entry
    return entry


def _dense_flops(cfg: ModelConfig, seq_len: int, phase: str) -> float:
    return metrics.model_flops_per_token("dense", d_model=cfg.d_model, n_layer=cfg.n_layer,
                                         seq_len=seq_len, vocab_size=cfg.vocab_size,
                                         decode=phase == "decode")


register_bench("dense", variants=lambda options: [("", {})], flops=_dense_flops)

BLOCK_LEN_OPTION = BenchOption("--block-len", "64,128",
                               "block sizes L for bcmt / honly (comma-separated)")


def _block_variants(options: dict) -> list[tuple[str, dict]]:
    return [(f"L={n}", {"block_size": n})
            for n in parse_int_list("--block-len", options["block_len"])]


def _block_flops(family: str):
    def flops(cfg: ModelConfig, seq_len: int, phase: str) -> float:
        return metrics.model_flops_per_token(family, d_model=cfg.d_model, n_layer=cfg.n_layer,
                                             seq_len=seq_len, vocab_size=cfg.vocab_size,
                                             block_len=cfg.block_size,
                                             decode=phase == "decode")
    return flops


register_bench("bcmt", variants=_block_variants, flops=_block_flops("bcmt"),
               options=(BLOCK_LEN_OPTION,))
register_bench("honly", variants=_block_variants, flops=_block_flops("block_local"),
               options=(BLOCK_LEN_OPTION,))

# --- MoC: bank sizes and top-k (models/moc.py); plus the memory-read timing ---
MOC_CHAPTER_LEN = 16             # tokens per chapter in every MoC bench variant
BANK_OPTION = BenchOption("--bank", "512,8192",
                          f"MoC bank sizes in tokens = n_chapters x {MOC_CHAPTER_LEN} "
                          "(comma-separated)")
TOPK_OPTION = BenchOption("--topk", "8", "MoC routed chapters per decision (comma-separated)")
READ_KEYS = ("d_model", "n_head", "seq_len", "batch", "device", "precision", "threads",
             "warmup", "repeats", "progress")


def moc_bank_overrides(bank_tokens: int, top_k: int) -> dict:
    """ModelConfig overrides for a bank of ``bank_tokens`` tokens read with ``top_k``."""
    n_chapters = bank_tokens // MOC_CHAPTER_LEN
    if bank_tokens % MOC_CHAPTER_LEN or n_chapters - 1 < top_k:
        raise ValueError(f"--bank={bank_tokens} is not allowed with --topk={top_k}: expected a "
                         f"multiple of {MOC_CHAPTER_LEN} holding the shared chapter and at least "
                         f"{top_k} routable ones (>= {(top_k + 1) * MOC_CHAPTER_LEN} tokens)")
    return {"n_chapters": n_chapters, "chapter_len": MOC_CHAPTER_LEN, "top_k": top_k}


def _moc_variants(options: dict) -> list[tuple[str, dict]]:
    return [(f"bank={n} k={k}", moc_bank_overrides(n, k))
            for n in parse_int_list("--bank", options["bank"])
            for k in parse_int_list("--topk", options["topk"])]


def _moc_flops(cfg: ModelConfig, seq_len: int, phase: str) -> float | None:
    return None if phase == "decode" else moc.flops_per_token(cfg, seq_len)


def _moc_read_records(options: dict, run: dict) -> list[dict]:
    return bench_memory_read(parse_int_list("--bank", options["bank"]),
                             parse_int_list("--topk", options["topk"]),
                             **{key: run[key] for key in READ_KEYS})


register_bench("moc", variants=_moc_variants, flops=_moc_flops,
               options=(BANK_OPTION, TOPK_OPTION), extra=_moc_read_records)


def _read_workloads(read, bank, queries, top_ks: list[int], window: int, generator) -> list:
    """[whole-bank read, routed read for each k] as zero-argument functions (call under no_grad).

    Each routed read gets random routes (one per sequence and window) from ``generator``.
    """
    batch, seq_len, _ = queries.shape
    n_chapters = bank.shape[0] // MOC_CHAPTER_LEN
    n_windows = -(-seq_len // window)
    fns = [lambda: read.read_whole_bank(queries, bank)]
    for k in top_ks:
        probs = torch.rand(batch, n_windows, n_chapters, generator=generator).to(bank.device)
        ids, weights = moc.chapter_weights(probs, k, ModelConfig.routed_scale)  # (B, W, k+1)
        fns.append(lambda ids=ids, weights=weights:
                   read(queries, bank, ids, weights, window, strategy="gather"))
    return fns


def bench_memory_read(bank_sizes, top_ks, *, d_model: int = 256, n_head: int = 4,
                      seq_len: int = 256, batch: int = 1, device="cpu", precision: str = "fp32",
                      threads: int = 1, warmup: int = 3, repeats: int = 5,
                      progress: bool = False, routing_window: int | None = None) -> list[dict]:
    """Time MoC's routed memory read against reading the whole bank, as the bank grows.

    Forward only, no grad, (batch, seq_len) queries. Routed: each routing
    window (``routing_window``, default ``ModelConfig.routing_window``, capped
    at seq_len; seq_len = one route per sequence, the paper's read) gathers the
    shared + k chapters of 16 tokens, projects them to K/V and reads them in one
    batched SDPA (the ``"gather"`` path: its cost does not depend on the bank
    size). Whole bank: K/V of every bank token once, then every query attends
    to all of them. Router cost is not included. Two interleaved groups: all
    routed reads (each runs after another routed read, so its time is not
    inflated by the caches a whole-bank read has just flushed), then all
    whole-bank reads. So the fine comparison (routed time vs bank size) is
    interleaved; the speed-up over the whole-bank read spans two groups run
    back to back, which drift cannot hide at its orders of magnitude.
    Records: phase ``"read"``, variant
    ``"full bank=N"`` (the reference) and ``"routed bank=N k=k"`` whose
    ``ratio_vs_dense`` is its speed-up over the whole-bank read of the same
    bank; extra keys ``bank_tokens``, ``top_k`` (None for the full read),
    ``read_tokens`` (memory tokens each query attends to), ``routing_window``.
    """
    from blockmem_lite.runtime import autocast_context

    device = torch.device(device)
    window = min(routing_window or ModelConfig.routing_window, seq_len)
    generator = torch.Generator().manual_seed(0)
    read = moc.MemoryRead(d_model, n_head, MOC_CHAPTER_LEN, 1e-5).to(device).eval()
    queries = torch.randn(batch, seq_len, d_model, generator=generator).to(device)
    banks, full_fns, routed_fns = [], [], []
    for n in bank_sizes:
        for k in top_ks:
            moc_bank_overrides(n, k)                                      # clear errors first
        bank = (0.02 * torch.randn(n, d_model, generator=generator)).to(device)
        banks.append(bank)
        full_fn, *routed = _read_workloads(read, bank, queries, list(top_ks), window, generator)
        full_fns.append(full_fn)
        routed_fns += routed

    def timed(fns: list):
        def inference(fn):
            def run():
                with torch.no_grad(), autocast_context(device, precision):
                    fn()
            return run

        times = metrics.time_interleaved([inference(f) for f in fns], warmup=warmup,
                                         repeats=repeats, device=device)
        return iter([metrics.summarize_times(t, batch * seq_len) for t in times])

    _log(progress, f"MoC read: banks {list(bank_sizes)} x k {list(top_ks)}: routed reads "
                   "interleaved, then whole-bank reads interleaved")
    routed_timings, full_timings = timed(routed_fns), timed(full_fns)
    records = []
    for n, bank in zip(bank_sizes, banks, strict=True):
        full = next(full_timings)
        full_flops = moc.read_flops_per_token(d_model, n, batch * seq_len)
        records.append(_read_record(full, f"full bank={n}", n, None, n, full_flops, None,
                                    None, read, bank, batch, seq_len, window, device, precision,
                                    threads, warmup, repeats))
        for k in top_ks:
            routed = next(routed_timings)
            n_read = (k + 1) * MOC_CHAPTER_LEN
            flops = moc.read_flops_per_token(d_model, n_read, window)
            records.append(_read_record(routed, f"routed bank={n} k={k}", n, k, n_read, flops,
                                        full.ms_per_step / routed.ms_per_step,
                                        full_flops / flops, read, bank, batch, seq_len, window,
                                        device, precision, threads, warmup, repeats))
    return records


def _read_record(timing, variant: str, bank_tokens: int, top_k, read_tokens: int, flops: float,
                 ratio, ceiling, read, bank, batch: int, seq_len: int, window: int, device,
                 precision: str, threads: int, warmup: int, repeats: int) -> dict:
    """One bench record (every ``RECORD_KEYS`` key) for a memory-read workload."""
    return {
        "arch": "moc", "variant": variant, "phase": "read", "seq_len": seq_len, "batch": batch,
        "tokens_per_s": timing.tokens_per_s, "ms_per_step": timing.ms_per_step,
        "ratio_vs_dense": ratio, "flop_ceiling": ceiling,
        "frac_of_ceiling": ratio / ceiling if ratio is not None else None,
        "memory_bytes": None, "memory_method": "none", "state_bytes": None,
        "device": device.type, "dtype": precision, "threads": threads,
        "torch_version": torch.__version__, "machine": _machine(device),
        "flops_per_token": flops, "step_times_ms": [1000.0 * t for t in timing.times_s],
        "saved_bytes": None, "rss_peak_bytes": None, "rss_base_bytes": None,
        "d_model": read.q.in_features, "n_layer": 1, "n_head": read.n_head, "vocab_size": None,
        "params": bank.numel() + sum(p.numel() for p in read.parameters()),
        "overrides": {"bank_tokens": bank_tokens, "top_k": top_k},
        "warmup": warmup, "repeats": repeats, "load_avg_1m": _load_average(),
        "bank_tokens": bank_tokens, "top_k": top_k, "read_tokens": read_tokens,
        "routing_window": window,
    }


def format_read_table(records: list[dict]) -> str:
    """MoC's memory-read records as a table: time vs bank size, routed vs whole bank."""
    reads = [r for r in records if r["phase"] == "read"]
    if not reads:
        return ""
    smallest = {}
    for r in reads:
        if r["top_k"] is not None:
            smallest.setdefault(r["top_k"], r["ms_per_step"])
    header = ["read", "bank tokens", "k", "keys/query", "ms", "x smallest bank",
              "speed-up vs full", "ideal (chapters/k)"]
    rows = [header]
    for r in reads:
        routed = r["top_k"] is not None
        rows.append(["routed" if routed else "full", str(r["bank_tokens"]),
                     str(r["top_k"]) if routed else "-", str(r["read_tokens"]),
                     f"{r['ms_per_step']:.3f}",
                     f"{r['ms_per_step'] / smallest[r['top_k']]:.2f}" if routed else "-",
                     _fmt(r["ratio_vs_dense"], ".1f"),
                     f"{r['bank_tokens'] / MOC_CHAPTER_LEN / r['top_k']:.0f}" if routed else "-"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    first = reads[0]
    return "\n".join([f"MoC memory read (forward, batch={first['batch']}, T={first['seq_len']}, "
                      f"routing window={first['routing_window']}, chapter_len={MOC_CHAPTER_LEN})",
                      *lines,
                      "x smallest bank: routed time / routed time at the smallest bank (target "
                      "<= 1.2); speed-up vs full: whole-bank read time / routed time (target >= "
                      "0.5 x ideal)"])


# --- ARMT: segment sizes S (models/armt.py); plus the inference sweep over total length ---
SEGMENT_OPTION = BenchOption("--segment", "128,256", "segment sizes S for armt (comma-separated)")
INFER_LEN_OPTION = BenchOption(
    "--infer-len", "2048,8192,65536",
    "ARMT inference sweep: prompt lengths read by ARMT.stream (constant memory) next to dense's "
    "prefill (comma-separated; 'none' skips the sweep)")
INFER_DENSE_MAX_OPTION = BenchOption(
    "--infer-dense-max", "auto",
    "longest prompt dense reads in the ARMT inference sweep (auto: every length on CUDA, "
    "16384 elsewhere: a 65,536-token dense prefill takes minutes on a laptop CPU)")
CPU_DENSE_INFER_MAX = 16384      # --infer-dense-max auto off CUDA
INFER_KEYS = ("d_model", "n_layer", "n_head", "vocab_size", "batch", "device", "precision",
              "threads", "warmup", "repeats", "memory", "progress")


def _armt_variants(options: dict) -> list[tuple[str, dict]]:
    parse_infer_lengths(options["infer_len"])            # bad sweep options fail before timing
    dense_infer_limit(options["infer_dense_max"], "cpu")
    return [(f"S={n}", {"segment_size": n})
            for n in parse_int_list("--segment", options["segment"])]


def _armt_flops(cfg: ModelConfig, seq_len: int, phase: str) -> float:
    return metrics.model_flops_per_token("armt", d_model=cfg.d_model, n_layer=cfg.n_layer,
                                         seq_len=seq_len, vocab_size=cfg.vocab_size,
                                         segment_len=cfg.segment_size,
                                         n_mem_tokens=cfg.n_mem_tokens, d_mem=cfg.d_mem,
                                         decode=phase == "decode")


def parse_infer_lengths(text: str) -> list[int]:
    """'--infer-len' value -> lengths; 'none' -> [] (no sweep)."""
    if str(text).strip().lower() == "none":
        return []
    return parse_int_list("--infer-len", text)


def dense_infer_limit(text: str, device) -> int | None:
    """'--infer-dense-max' value -> the longest dense prompt (None: no limit)."""
    if str(text).strip().lower() == "auto":
        return None if torch.device(device).type == "cuda" else CPU_DENSE_INFER_MAX
    values = parse_int_list("--infer-dense-max", text)
    if len(values) != 1:
        raise ValueError(f"--infer-dense-max={text!r} is not allowed: expected 'auto' or one "
                         "integer >= 1")
    return values[0]


def _armt_infer_records(options: dict, run: dict) -> list[dict]:
    lengths = parse_infer_lengths(options["infer_len"])
    if not lengths:
        return []
    return bench_inference(lengths, parse_int_list("--segment", options["segment"]),
                           dense_max=dense_infer_limit(options["infer_dense_max"], run["device"]),
                           **{key: run[key] for key in INFER_KEYS})


register_bench("armt", variants=_armt_variants, flops=_armt_flops,
               options=(SEGMENT_OPTION, INFER_LEN_OPTION, INFER_DENSE_MAX_OPTION),
               extra=_armt_infer_records)


def bench_inference(lengths, segment_sizes, *, d_model: int = 256, n_layer: int = 4,
                    n_head: int = 4, vocab_size: int = 256, batch: int = 1, device="cpu",
                    precision: str = "fp32", threads: int = 1, warmup: int = 3,
                    repeats: int = 5, memory=("rss",), dense_max: int | None = None,
                    progress: bool = False) -> list[dict]:
    """Read prompts of growing total length: ARMT (``stream``) vs dense (``prefill``).

    Forward only, no grad, random (batch, T) prompts; one call = one whole
    prompt (``metrics.make_infer_step``). Dense (while T <= ``dense_max``) and
    ARMT with every segment size, at every length, are timed interleaved in
    one loop, so ratios across models *and lengths* are same-run ratios.
    Memory per entry: on CUDA the peak allocated over one call with only that
    model built (weights included); on CPU, when ``memory`` holds "rss", the
    peak RSS of a fresh subprocess reading one prompt.
    Records (by increasing T): phase ``"infer"``, ``ratio_vs_dense`` (tokens/s
    over dense's at the same T, None where dense was not run), ``state_bytes``
    (what is kept to continue: ARMT's constant state, dense's KV cache) and
    extra keys ``memory_vs_shortest`` / ``tokens_per_s_vs_shortest`` (this
    entry over the same entry at the shortest length: the constant-memory and
    flat-throughput targets) and ``note`` (why dense is missing, or None).
    """
    device = torch.device(device)
    lengths = sorted(set(lengths))
    base = dict(d_model=d_model, n_layer=n_layer, n_head=n_head, vocab_size=vocab_size)
    runs = [(seq_len, entry) for seq_len in lengths
            for entry in _infer_entries(base, seq_len, segment_sizes, dense_max)]
    mems = [_infer_memory(entry, batch, seq_len, device=device, precision=precision,
                          memory=memory, threads=threads) for seq_len, entry in runs]
    models = [_build(entry.cfg, device) for _, entry in runs]
    sizes: dict[int, int] = {}
    steps = [_keeping_state_bytes(metrics.make_infer_step(model, batch, seq_len,
                                                          precision=precision), sizes, i)
             for i, (model, (seq_len, _)) in enumerate(zip(models, runs, strict=True))]
    _log(progress, f"infer T={lengths} batch={batch}: timing {len(runs)} (model, length) pairs "
                   f"interleaved, {warmup} warm-up + {repeats} timed pass(es)")
    times = metrics.time_interleaved(steps, warmup=warmup, repeats=repeats, device=device)
    timings = [metrics.summarize_times(t, batch * seq_len)
               for t, (seq_len, _) in zip(times, runs, strict=True)]
    dense_tps = {seq_len: timing.tokens_per_s
                 for (seq_len, entry), timing in zip(runs, timings, strict=True)
                 if entry.arch == "dense"}
    records = []
    for i, (seq_len, entry) in enumerate(runs):
        note = _dense_skipped_note(base, batch, seq_len, dense_max, device, precision)
        records.append(_infer_record(entry, models[i], timings[i], mems[i], sizes[i],
                                     dense_tps.get(seq_len), note, batch, seq_len, device,
                                     precision, threads, warmup, repeats))
    _add_growth(records)
    return records


def _infer_entries(base: dict, seq_len: int, segment_sizes, dense_max) -> list[Entry]:
    entries = []
    if dense_max is None or seq_len <= dense_max:
        entries.append(Entry("dense", "", {}, ModelConfig(arch="dense", seq_len=seq_len, **base)))
    for size in segment_sizes:
        overrides = {"segment_size": size}
        entries.append(Entry("armt", f"S={size}", overrides,
                             ModelConfig(arch="armt", seq_len=max(seq_len, size), **base,
                                         **overrides)))
    return entries


def _dense_skipped_note(base: dict, batch: int, seq_len: int, dense_max, device,
                        precision: str) -> str | None:
    if dense_max is None or seq_len <= dense_max:
        return None
    width = 2 if precision == "bf16" else 4
    kv = 2 * base["n_layer"] * batch * seq_len * base["d_model"] * width
    return (f"dense not run at T={seq_len} on {device.type}: above --infer-dense-max="
            f"{dense_max} (its quadratic prefill takes minutes per pass here); its KV cache "
            f"alone would hold {human_bytes(kv)}")


def _keeping_state_bytes(step: Callable[[], object], sizes: dict, index: int):
    """``step`` that stores the returned state's bytes in ``sizes[index]`` (state then freed)."""
    def run() -> None:
        sizes[index] = step().nbytes()
    return run


def _infer_memory(entry: Entry, batch: int, seq_len: int, *, device, precision: str,
                  memory, threads: int) -> dict:
    """Peak memory of one inference call of ``entry``, with no other model built."""
    out = {"memory_bytes": None, "memory_method": "none", "saved_bytes": None,
           "rss_peak_bytes": None, "rss_base_bytes": None}
    if "none" in memory:
        return out
    if device.type == "cuda":
        model = _build(entry.cfg, device)
        step = metrics.make_infer_step(model, batch, seq_len, precision=precision)
        out.update(memory_bytes=metrics.cuda_peak_bytes(step, device),
                   memory_method="cuda_max_allocated")
        del model, step
    elif "rss" in memory:
        spec = {"model": dataclasses.asdict(entry.cfg), "phase": "infer", "batch": batch,
                "seq_len": seq_len, "steps": 1, "threads": threads}
        reading = metrics.peak_rss_subprocess(spec)
        out.update(memory_bytes=reading.peak_bytes, memory_method="rss_subprocess",
                   rss_peak_bytes=reading.peak_bytes, rss_base_bytes=reading.base_bytes)
    return out


def _infer_record(entry: Entry, model, timing, mem: dict, state_bytes: int, dense_tps,
                  note, batch: int, seq_len: int, device, precision: str, threads: int,
                  warmup: int, repeats: int) -> dict:
    """One bench record (every ``RECORD_KEYS`` key) for one inference entry."""
    flops = BENCH_ARCHS[entry.arch].flops(entry.cfg, seq_len, "infer")
    dense_flops = _dense_flops(entry.cfg, seq_len, "infer")
    is_dense = entry.arch == "dense"
    ratio = timing.tokens_per_s / dense_tps if dense_tps and not is_dense else None
    ceiling = None if is_dense else metrics.flop_ceiling(dense_flops, flops)
    return {
        "arch": entry.arch, "variant": entry.variant, "phase": "infer", "seq_len": seq_len,
        "batch": batch, "tokens_per_s": timing.tokens_per_s, "ms_per_step": timing.ms_per_step,
        "ratio_vs_dense": ratio, "flop_ceiling": ceiling,
        "frac_of_ceiling": ratio / ceiling if ratio is not None else None,
        **mem, "state_bytes": state_bytes,
        "device": device.type, "dtype": precision, "threads": threads,
        "torch_version": torch.__version__, "machine": _machine(device),
        "flops_per_token": flops, "step_times_ms": [1000.0 * t for t in timing.times_s],
        "d_model": entry.cfg.d_model, "n_layer": entry.cfg.n_layer, "n_head": entry.cfg.n_head,
        "vocab_size": entry.cfg.vocab_size, "params": model.num_params(),
        "overrides": entry.overrides, "warmup": warmup, "repeats": repeats,
        "load_avg_1m": _load_average(), "note": None if is_dense else note,
    }


def _add_growth(records: list[dict]) -> None:
    """``memory_vs_shortest`` and ``tokens_per_s_vs_shortest`` per (arch, variant)."""
    shortest: dict[tuple[str, str], dict] = {}
    for r in records:                                      # records come by increasing length
        first = shortest.setdefault((r["arch"], r["variant"]), r)
        r["shortest_len"] = first["seq_len"]
        r["tokens_per_s_vs_shortest"] = r["tokens_per_s"] / first["tokens_per_s"]
        r["memory_vs_shortest"] = (r["memory_bytes"] / first["memory_bytes"]
                                   if r["memory_bytes"] and first["memory_bytes"] else None)


def format_infer_table(records: list[dict]) -> str:
    """The inference sweep as a table, with ARMT's peak(longest)/peak(shortest) lines."""
    infer = [r for r in records if r["phase"] == "infer"]
    if not infer:
        return ""
    header = ["arch", "variant", "T", "tok/s", "x dense", "tok/s vs shortest", "peak memory",
              "peak vs shortest", "rss delta", "state", "method"]
    rows = [header]
    for r in infer:
        delta = (r["rss_peak_bytes"] - r["rss_base_bytes"]
                 if r.get("rss_peak_bytes") is not None else None)
        rows.append([r["arch"], r["variant"] or "-", str(r["seq_len"]),
                     f"{r['tokens_per_s']:,.0f}", _fmt(r["ratio_vs_dense"], ".2f"),
                     f"{r['tokens_per_s_vs_shortest']:.2f}", human_bytes(r["memory_bytes"]),
                     _fmt(r["memory_vs_shortest"], ".3f"), human_bytes(delta),
                     human_bytes(r["state_bytes"]), r["memory_method"]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i >= 2 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    first = infer[0]
    longest = {(r["arch"], r["variant"]): r for r in infer}        # by increasing length
    summary = []
    for r in longest.values():
        if r["arch"] == "armt" and r["seq_len"] > r["shortest_len"]:
            summary.append(f"ARMT {r['variant']}: peak({r['seq_len']}) / peak({r['shortest_len']})"
                           f" = {_fmt(r['memory_vs_shortest'], '.3f')} (target <= 1.1); "
                           f"tok/s({r['seq_len']}) / tok/s({r['shortest_len']}) = "
                           f"{r['tokens_per_s_vs_shortest']:.2f} (target: flat)")
    notes = sorted({r["note"] for r in infer if r.get("note")})
    return "\n".join([f"ARMT inference sweep (forward, no grad, batch={first['batch']}): ARMT "
                      "reads the prompt with stream() (segment by segment), dense with prefill()",
                      *lines, *summary, *notes,
                      "peak memory: rss_subprocess = peak RSS of a fresh process incl. the "
                      "interpreter+torch baseline (rss delta = growth after import + model "
                      "build); cuda_max_allocated = CUDA peak incl. weights. state = what is "
                      "kept to continue (ARMT: KV of one segment + A, z; dense: KV cache)."])

CHUNK_OPTION = BenchOption("--chunk", "4,8,16,32", "CAT chunk sizes C (comma-separated)")
DECODER_WIDTH_OPTION = BenchOption("--decoder-width", "1,2",
                                   "CAT decoder width multipliers (1 = iso-width, 2 = the paper)")


def _cat_variants(options: dict) -> list[tuple[str, dict]]:
    return [(f"C={c} w={w}", {"chunk_size": c, "decoder_width": w})
            for w in parse_int_list("--decoder-width", options["decoder_width"])
            for c in parse_int_list("--chunk", options["chunk"])]


def _cat_flops(cfg: ModelConfig, seq_len: int, phase: str) -> float:
    return metrics.model_flops_per_token(
        "cat", d_model=cfg.d_model, n_layer=cfg.n_layer, seq_len=seq_len,
        vocab_size=cfg.vocab_size, chunk_size=cfg.chunk_size,
        d_decoder=cfg.d_model * cfg.decoder_width,
        compressor_layers=cfg.compressor_layers or None, decode=phase == "decode")


register_bench("cat", variants=_cat_variants, flops=_cat_flops,
               options=(CHUNK_OPTION, DECODER_WIDTH_OPTION))


def parse_int_list(name: str, text: str) -> list[int]:
    """'256,1024' -> [256, 1024]; ValueError naming ``name`` otherwise."""
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{name}={text!r} is not allowed: expected comma-separated "
                         "integers >= 1, e.g. 256,1024")
    return values


def resolve_archs(names) -> list[str]:
    """Validate architecture names against the models and the bench registry."""
    names = [names] if isinstance(names, str) else list(names)
    known = available_archs()
    resolved = []
    for name in names:
        if name not in known:
            raise ValueError(f"arch={name!r} is not allowed: known architectures are "
                             f"{', '.join(known)}")
        if name not in BENCH_ARCHS:
            raise ValueError(f"arch={name!r} has no bench entry: benchable architectures are "
                             f"{', '.join(sorted(BENCH_ARCHS))}")
        if name not in resolved:
            resolved.append(name)
    if not resolved:
        raise ValueError(f"arch={names!r} is not allowed: give at least one of "
                         f"{', '.join(sorted(BENCH_ARCHS))}")
    return resolved


def default_options() -> dict:
    """Every registered option's default value, by ``dest``."""
    return {opt.dest: opt.default for entry in BENCH_ARCHS.values() for opt in entry.options}


# --------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------

@dataclass
class Entry:
    """One model under test at one length: dense or a variant."""

    arch: str
    variant: str
    overrides: dict
    cfg: ModelConfig


def _entries(archs: list[str], base: dict, seq_len: int, options: dict) -> list[Entry]:
    """Dense first (the baseline, always measured), then every variant of every arch."""
    entries = [Entry("dense", "", {}, ModelConfig(arch="dense", seq_len=seq_len, **base))]
    for arch in archs:
        if arch == "dense":
            continue
        for label, overrides in BENCH_ARCHS[arch].variants(options):
            cfg = ModelConfig(**{**base, "arch": arch, "seq_len": seq_len, **overrides})
            entries.append(Entry(arch, label, dict(overrides), cfg))
    return entries


def _build(cfg: ModelConfig, device: torch.device):
    seed_everything(0)
    return build_model(cfg).to(device)


def _machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"


def _load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"[bench] {message}", file=sys.stderr, flush=True)


def _memory(entry: Entry, model, phase: str, batch: int, seq_len: int, *, device, precision,
            memory: tuple[str, ...], threads: int, burst: int) -> dict:
    """The memory figures of one entry: primary bytes + method, and the extra keys."""
    out = {"memory_bytes": None, "memory_method": "none", "saved_bytes": None,
           "rss_peak_bytes": None, "rss_base_bytes": None}
    if "none" in memory:
        return out
    if "saved" in memory and phase == "train":
        forward = metrics.make_train_forward(model, batch, seq_len, precision=precision)
        out["saved_bytes"] = metrics.saved_tensor_bytes(forward, exclude=model.parameters())
    if device.type == "cuda":
        if phase == "train":
            fn = metrics.make_train_step(model, batch, seq_len, precision=precision)
        else:
            def fn():
                metrics.make_decode_step(model, batch, seq_len, n_calls=1, burst=burst,
                                         precision=precision)()
        out["memory_bytes"] = metrics.cuda_peak_bytes(fn, device)
        out["memory_method"] = "cuda_max_allocated"
        return out
    if "rss" in memory:
        spec = {"model": dataclasses.asdict(entry.cfg), "phase": phase, "batch": batch,
                "seq_len": seq_len, "steps": 2, "burst": burst, "threads": threads}
        reading = metrics.peak_rss_subprocess(spec)
        out.update(memory_bytes=reading.peak_bytes, memory_method="rss_subprocess",
                   rss_peak_bytes=reading.peak_bytes, rss_base_bytes=reading.base_bytes)
    elif out["saved_bytes"] is not None:
        out.update(memory_bytes=out["saved_bytes"], memory_method="saved_tensors")
    return out


def _state_bytes(model, batch: int, seq_len: int, precision: str) -> int:
    """``state.nbytes()`` after a prefill of exactly ``seq_len`` tokens."""
    return int(metrics.prefill_state(model, batch, seq_len, precision=precision).nbytes())


def _bench_phase(entries: list[Entry], phase: str, seq_len: int, batch: int, *, device,
                 precision: str, threads: int, warmup: int, repeats: int,
                 burst: int, memory: tuple[str, ...], progress: bool) -> list[dict]:
    """Time every entry interleaved at one (phase, length); then memory; then records."""
    models = [_build(e.cfg, device) for e in entries]
    if phase == "train":
        steps = [metrics.make_train_step(m, batch, seq_len, precision=precision) for m in models]
        tokens_per_call = batch * seq_len
    else:
        steps = [metrics.make_decode_step(m, batch, seq_len, n_calls=warmup + repeats,
                                          burst=burst, precision=precision) for m in models]
        tokens_per_call = batch * burst
    _log(progress, f"T={seq_len} {phase} batch={batch}: timing {len(entries)} model(s) "
                   f"interleaved, {warmup} warm-up + {repeats} timed round(s)")
    times = metrics.time_interleaved(steps, warmup=warmup, repeats=repeats, device=device)
    del steps
    timings = [metrics.summarize_times(t, tokens_per_call) for t in times]
    dense_timing = timings[0]
    dense_flops = BENCH_ARCHS["dense"].flops(entries[0].cfg, seq_len, phase)
    records = []
    for entry, model, timing in zip(entries, models, timings, strict=True):
        label = f"{entry.arch} {entry.variant}".strip()
        _log(progress, f"T={seq_len} {phase} {label}: {timing.tokens_per_s:,.0f} tok/s; memory")
        mem = _memory(entry, model, phase, batch, seq_len, device=device, precision=precision,
                      memory=memory, threads=threads, burst=burst)
        flops = BENCH_ARCHS[entry.arch].flops(entry.cfg, seq_len, phase)
        is_dense = entry.arch == "dense"
        ratio = None if is_dense else timing.tokens_per_s / dense_timing.tokens_per_s
        ceiling = (metrics.flop_ceiling(dense_flops, flops)
                   if flops is not None and dense_flops is not None else None)
        if phase == "train" and flops is not None:
            flops = metrics.training_flops_per_token(flops)
        per_call = burst if phase == "decode" else 1
        records.append({
            "arch": entry.arch, "variant": entry.variant, "phase": phase, "seq_len": seq_len,
            "batch": batch, "tokens_per_s": timing.tokens_per_s,
            "ms_per_step": timing.ms_per_step / per_call,
            "ratio_vs_dense": ratio, "flop_ceiling": ceiling,
            "frac_of_ceiling": ratio / ceiling if ratio is not None and ceiling else None,
            **mem,
            "state_bytes": (_state_bytes(model, batch, seq_len, precision)
                            if phase == "decode" else None),
            "device": device.type, "dtype": precision, "threads": threads,
            "torch_version": torch.__version__, "machine": _machine(device),
            "flops_per_token": flops,
            "step_times_ms": [1000.0 * t / per_call for t in timing.times_s],
            "d_model": entry.cfg.d_model, "n_layer": entry.cfg.n_layer,
            "n_head": entry.cfg.n_head, "vocab_size": entry.cfg.vocab_size,
            "params": model.num_params(), "overrides": entry.overrides,
            "warmup": warmup, "repeats": repeats, "load_avg_1m": _load_average(),
        })
    return records


def default_batch(phase: str, seq_len: int) -> int:
    """Train: ``max(1, 4096 // T)`` (the same tokens per step at every T); decode: 1."""
    return max(1, TRAIN_TOKENS_PER_STEP // seq_len) if phase == "train" else 1


def _resolve_dtype(dtype: str, device: torch.device) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed: expected one of {', '.join(DTYPES)}")
    if dtype == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if dtype == "bf16" and device.type != "cuda":
        raise ValueError(f"dtype='bf16' is not allowed on {device.type}: bf16 autocast is used "
                         "only on CUDA; use 'auto' or 'fp32'")
    return dtype


def _check_choices(name: str, values, allowed) -> tuple[str, ...]:
    values = tuple([values] if isinstance(values, str) else values)
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ValueError(f"{name}={values!r} is not allowed: expected one or more of "
                         f"{', '.join(allowed)}")
    return values


def run_bench(archs=("dense",), seq_lens=DEFAULT_SEQ_LENS, *, batch: int | None = None,
              d_model: int = 256, n_layer: int = 4, n_head: int = 4, vocab_size: int = 256,
              threads: int | None = None, device: str = "auto", dtype: str = "auto",
              phases=PHASES, warmup: int = 3, repeats: int = 5, decode_burst: int = 32,
              memory=("saved", "rss"), options: dict | None = None,
              progress: bool = True) -> list[dict]:
    """Benchmark dense and every variant of ``archs``; one record per (arch, variant, phase, T).

    ``batch`` None: train ``max(1, 4096 // T)``, decode 1. ``memory``: any of
    "saved", "rss", or "none" (see the module docstring for which figure is
    primary). ``options``: architecture options by ``dest`` (defaults from
    the registry). Progress goes to stderr.
    """
    archs = resolve_archs(archs)
    seq_lens = list(seq_lens)
    if not seq_lens or any(isinstance(t, bool) or not isinstance(t, int) or t < 1
                           for t in seq_lens):
        raise ValueError(f"seq_lens={seq_lens!r} is not allowed: expected integers >= 1")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch={batch!r} is not allowed: expected an integer >= 1 or None")
    phases = _check_choices("phases", phases, PHASES)
    memory = _check_choices("memory", memory, MEMORY_CHOICES)
    metrics.check_timing_counts(warmup, repeats)
    if decode_burst < 1:
        raise ValueError(f"decode_burst={decode_burst!r} is not allowed: expected an integer >= 1")
    dev = pick_device(device)
    precision = _resolve_dtype(dtype, dev)
    opts = {**default_options(), **(options or {})}
    base = dict(d_model=d_model, n_layer=n_layer, n_head=n_head, vocab_size=vocab_size)
    records: list[dict] = []
    with metrics.pinned_threads(threads) as n_threads:
        for seq_len in seq_lens:
            for phase in phases:
                # decoding runs past t = seq_len by the timed steps: configs must cover that
                # (CAT's chunk-index table is sized by seq_len)
                extra = (warmup + repeats) * decode_burst if phase == "decode" else 0
                entries = _entries(archs, base, seq_len + extra, opts)
                b = batch or default_batch(phase, seq_len)
                records += _bench_phase(entries, phase, seq_len, b, device=dev,
                                        precision=precision, threads=n_threads,
                                        warmup=warmup, repeats=repeats, burst=decode_burst,
                                        memory=memory, progress=progress)
        run = dict(base, seq_len=seq_lens[0], batch=batch or 1, device=dev, precision=precision,
                   threads=n_threads, warmup=warmup, repeats=repeats, memory=memory,
                   progress=progress)
        for arch in archs:
            if BENCH_ARCHS[arch].extra is not None:
                records += BENCH_ARCHS[arch].extra(opts, run)
    return records


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


TABLE_COLUMNS = ("arch", "variant", "phase", "T", "batch", "tok/s", "ms/step", "x dense",
                 "ceiling", "% ceil", "memory", "method", "saved", "rss delta", "state")


def _row(r: dict) -> list[str]:
    rss_delta = (r["rss_peak_bytes"] - r["rss_base_bytes"]
                 if r.get("rss_peak_bytes") is not None else None)
    frac = r.get("frac_of_ceiling")
    return [r["arch"], r["variant"] or "-", r["phase"], str(r["seq_len"]), str(r["batch"]),
            f"{r['tokens_per_s']:,.0f}", f"{r['ms_per_step']:.2f}",
            _fmt(r["ratio_vs_dense"], ".2f"), _fmt(r["flop_ceiling"], ".2f"),
            "-" if frac is None else f"{100 * frac:.0f}%",
            human_bytes(r["memory_bytes"]), r["memory_method"],
            human_bytes(r.get("saved_bytes")), human_bytes(rss_delta),
            human_bytes(r["state_bytes"])]


def format_table(records: list[dict]) -> str:
    """A readable fixed-width table of bench records, with a header and a legend."""
    if not records:
        return "(no records)"
    rows = [list(TABLE_COLUMNS)] + [_row(r) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    lines = ["  ".join(cell.rjust(w) if i >= 3 else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    first = records[0]
    header = (f"device={first['device']} ({first.get('machine', '?')})  dtype={first['dtype']}  "
              f"threads={first['threads']}  torch={first['torch_version']}  "
              f"load={_fmt(first.get('load_avg_1m'), '.2f')}")
    legend = ("x dense: tokens/s ratio to dense in the same run; ceiling: analytic FLOP ratio "
              "dense/variant; % ceil = x dense / ceiling.\n"
              "memory methods: rss_subprocess = peak RSS of a fresh process incl. the "
              "interpreter+torch baseline (rss delta = growth after import + model build); "
              "saved_tensors = activations saved for backward; cuda_max_allocated = CUDA peak.\n"
              "train = forward+backward, no optimizer step; decode ms/step is per token step; "
              "state = decoding state bytes at t = T.")
    return "\n".join([header, *lines, legend])


def write_json(records: list[dict], path: str | Path) -> Path:
    """Write the records as a JSON list of dicts (no wrapper)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2))
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m blockmem_lite bench",
        description="Throughput, memory and decoding-state bytes of dense and the mechanisms, "
                    "dense interleaved in the same run (PERFORMANCE.md protocol).")
    parser.add_argument("--arch", default="dense",
                        help="comma-separated architectures; dense is always measured "
                             f"(benchable: {', '.join(sorted(BENCH_ARCHS))})")
    parser.add_argument("--seq-len", default=",".join(map(str, DEFAULT_SEQ_LENS)),
                        help="comma-separated lengths T (default %(default)s)")
    parser.add_argument("--batch", type=int, default=None,
                        help=f"sequences per step (default: train max(1, {TRAIN_TOKENS_PER_STEP}"
                             " // T), decode 1)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=256, help="default: byte vocabulary")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's current setting)")
    parser.add_argument("--device", default="auto", help="auto (cuda > mps > cpu), cpu, cuda")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="auto: bf16 autocast on CUDA, fp32 elsewhere")
    parser.add_argument("--phases", default="train,decode", help="comma-separated: train,decode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model (>= 3)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per model (>= 5)")
    parser.add_argument("--decode-burst", type=int, default=32,
                        help="decoding steps per timed sample (default %(default)s)")
    parser.add_argument("--memory", default="saved,rss",
                        help="comma-separated: saved, rss, or none (default %(default)s)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="write the records as a JSON list to PATH")
    for opt, users in _shared_options().values():
        parser.add_argument(opt.flag, default=opt.default,
                            help=f"[{', '.join(users)}] {opt.help} (default %(default)s)")
    return parser


def _shared_options() -> dict[str, tuple[BenchOption, list[str]]]:
    """Each option once (architectures may share one, e.g. --block-len), with its users."""
    out: dict[str, tuple[BenchOption, list[str]]] = {}
    for entry in BENCH_ARCHS.values():
        for opt in entry.options:
            out.setdefault(opt.flag, (opt, []))[1].append(entry.name)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = {opt.dest: getattr(args, opt.dest) for opt, _ in _shared_options().values()}
    try:
        records = run_bench(
            archs=[a.strip() for a in args.arch.split(",") if a.strip()],
            seq_lens=parse_int_list("seq_len", args.seq_len), batch=args.batch,
            d_model=args.d_model, n_layer=args.n_layer, n_head=args.n_head,
            vocab_size=args.vocab_size, threads=args.threads, device=args.device,
            dtype=args.dtype, phases=[p.strip() for p in args.phases.split(",") if p.strip()],
            warmup=args.warmup, repeats=args.repeats, decode_burst=args.decode_burst,
            memory=[m.strip() for m in args.memory.split(",") if m.strip()], options=options)
    except ValueError as err:
        print(f"bench: error: {err}", file=sys.stderr)
        return 2
    print(format_table(records))
    if any(r["phase"] == "read" for r in records):
        print(format_read_table(records))
    if any(r["phase"] == "infer" for r in records):
        print(format_infer_table(records))
    if args.json:
        print(f"wrote {write_json(records, args.json)}")
    return 0
