"""MoC's registration: FLOP model, state size, bank-size bench, memory-read timing, claims.

``models/moc.py`` holds what the paper defines (options, routing and memory maths, the
memory read, the layer, the LM, reference forward); this module holds what the kit needs
to run, measure and compare it, and ends by registering ``moc``.
"""

from __future__ import annotations

import torch

from blockmem_lite.labdata import loss_gap
from blockmem_lite.measure.flops import dense_decode_layer_flops, dense_layer_flops, lm_head_flops
from blockmem_lite.models.moc import MemoryRead, MoCLM, MoCOptions, chapter_weights, memory_layers
from blockmem_lite.registry import (
    BenchOption,
    BenchSpec,
    Claim,
    LabSpec,
    Mechanism,
    SpecialBench,
    register,
    register_bench,
    register_lab,
)
from blockmem_lite.runtime import autocast_context
from blockmem_lite.units import fmt
from blockmem_lite.validation import check_positive, fail

# --- FLOP model and decoding state ----------------------------------------------------

def read_flops_per_token(d_model: int, n_keys: int, queries_per_kv: float) -> float:
    """Forward FLOPs per query of one memory read: W_Q + W_O, scores and values, K/V.

    ``n_keys`` memory tokens attended by each query; their K/V projection is
    shared by ``queries_per_kv`` queries (a routing window; a batch for a
    whole-bank read).
    """
    return 4.0 * d_model * d_model + 4.0 * d_model * n_keys \
        + 4.0 * d_model * d_model * n_keys / queries_per_kv


def moc_extra_flops(d_model: int, n_chapters: int, top_k: int, chapter_len: int,
                    route_every: int = 1) -> float:
    """What a MoC memory layer adds per token:
    ``4·d² + 4·d·(k+1)·T_ch + [2·d·n_chapters + 4·d²·(k+1)·T_ch] / route_every``.

    W_Q and W_O on every token (4·d²), the non-causal read over the shared + k
    routed chapters of ``chapter_len`` tokens (4·d per key), and, once per
    routing decision of ``route_every`` tokens (the routing window R, or T for
    the paper's per-sequence routing; 1 = per-token routing), the router and the
    K/V projection of the (k+1)·T_ch gathered memory tokens. A shorter formula that
    charges the router per token and omits that projection would miss what
    dominates at kit scale when routes are short (R = 32).
    """
    for name, value in (("d_model", d_model), ("n_chapters", n_chapters), ("top_k", top_k),
                        ("chapter_len", chapter_len), ("route_every", route_every)):
        check_positive(name, value)
    read_tokens = (top_k + 1) * chapter_len
    per_route = 2.0 * d_model * n_chapters + 4.0 * d_model * d_model * read_tokens
    return 4.0 * d_model * d_model + 4.0 * d_model * read_tokens + per_route / route_every


def route_every(cfg, seq_len: int) -> int:
    """Tokens per routing decision: the routing window, or the whole sequence."""
    return seq_len if cfg.routing == "sequence" else min(cfg.routing_window, seq_len)


def flops_per_token(cfg, seq_len: int, decode: bool = False) -> float:
    """Forward FLOPs per token: dense layers plus ``moc_extra_flops`` per memory layer.

    Decoding (``decode=True``, one step at context ``seq_len``): dense's decoding layers,
    and the same extra per memory layer: a step reads the held route's (k+1) chapters, and
    a new route (router + K/V projection of its chapters) comes once per routing window,
    or once per sequence with ``routing="sequence"`` (amortised over the context).
    """
    extra = moc_extra_flops(cfg.d_model, cfg.n_chapters, cfg.top_k, cfg.chapter_len,
                            route_every(cfg, seq_len))
    layer = dense_decode_layer_flops(cfg.d_model, seq_len) if decode \
        else dense_layer_flops(cfg.d_model, seq_len)
    return (cfg.n_layer * layer + len(memory_layers(cfg)) * extra
            + lm_head_flops(cfg.d_model, cfg.vocab_size))


def state_bytes(cfg, t: int) -> float:
    """Dense's KV cache plus, per memory layer, the K/V of the (k+1) routed chapters and the
    running routing sum (fp32)."""
    read = 2 * (cfg.top_k + 1) * cfg.chapter_len * cfg.d_model + cfg.d_model
    return 4.0 * (cfg.n_layer * 2 * t * cfg.d_model + len(memory_layers(cfg)) * read)


# --- bench: bank sizes and top-k, and the memory-read timing -----------------------------

BENCH_CHAPTER_LEN = 16           # tokens per chapter in every MoC bench variant
BANK_TOKENS_OPTION = BenchOption("--bank-tokens", [512, 8192],
                                 f"MoC bank sizes in tokens = n_chapters x {BENCH_CHAPTER_LEN} "
                                 "(comma-separated)")


def bank_overrides(bank_tokens: int, top_k: int) -> dict:
    """ModelConfig overrides for a bank of ``bank_tokens`` tokens read with ``top_k``."""
    n_chapters = bank_tokens // BENCH_CHAPTER_LEN
    if bank_tokens % BENCH_CHAPTER_LEN or n_chapters - 1 < top_k:
        fail("--bank-tokens", bank_tokens,
             f"with --top-k={top_k} expected a multiple of {BENCH_CHAPTER_LEN} holding the "
             f"shared chapter and at least {top_k} routable ones "
             f"(>= {(top_k + 1) * BENCH_CHAPTER_LEN} tokens)")
    return {"n_chapters": n_chapters, "chapter_len": BENCH_CHAPTER_LEN, "top_k": top_k}


def _sweep(options: dict) -> tuple[list[int], list[int]]:
    """The bank sizes (``--bank-tokens``) and the swept ``top_k`` knob's values."""
    return list(options["bank_tokens"]), list(options["top_k"])


def bench_variants(options: dict) -> list[tuple[str, dict]]:
    """Every (bank size, k) pair, labelled ``bank=512 k=8``."""
    banks, top_ks = _sweep(options)
    return [(f"bank={n} k={k}", bank_overrides(n, k)) for n in banks for k in top_ks]


def read_workloads(read: MemoryRead, bank: torch.Tensor, queries: torch.Tensor,
                   top_ks: list[int], window: int, generator: torch.Generator) -> list:
    """[whole-bank read, routed read for each k] as zero-argument functions (call under no_grad).

    Each routed read gets random routes (one per sequence and window) from ``generator``.
    """
    batch, seq_len, _ = queries.shape
    n_chapters = bank.shape[0] // BENCH_CHAPTER_LEN
    n_windows = -(-seq_len // window)
    fns = [lambda: read.read_whole_bank(queries, bank)]
    for k in top_ks:
        probs = torch.rand(batch, n_windows, n_chapters, generator=generator).to(bank.device)
        ids, weights = chapter_weights(probs, k, MoCOptions.routed_scale)   # (B, W, k+1)
        fns.append(lambda ids=ids, weights=weights:
                   read(queries, bank, ids, weights, window, strategy="gather"))
    return fns


def bench_memory_read(options: dict, bench) -> list[dict]:
    """Time the routed memory read against reading the whole bank, as the bank grows.

    Forward only, no grad, (batch, T) queries, T = the bench's first length,
    width and heads from the bench. Routed: each routing window (the default
    ``routing_window``, capped at T) gathers the shared + k chapters of 16
    tokens, projects them to K/V and reads them in one batched SDPA (the
    ``"gather"`` path: its cost does not depend on the bank size). Whole bank:
    K/V of every bank token once, then every query attends to all of them.
    Router cost is not included. Two interleaved groups: all routed reads (each
    runs after another routed read, so its time is not inflated by the caches a
    whole-bank read has just flushed), then all whole-bank reads: the fine
    comparison (routed time vs bank size) is interleaved; the speed-up over the
    whole-bank read spans two groups run back to back, which drift cannot hide
    at its orders of magnitude.

    Records: phase ``"read"``, variant ``"full bank=N"`` (the reference) and
    ``"routed bank=N k=k"`` whose ``ratio_vs_dense`` is its speed-up over the
    whole-bank read of the same bank; extra keys ``bank_tokens``, ``top_k``
    (None for the full read), ``read_tokens`` (memory tokens each query
    attends to), ``routing_window``.
    """
    banks, top_ks = _sweep(options)
    for n in banks:
        for k in top_ks:
            bank_overrides(n, k)                                          # clear errors first
    d_model, seq_len, batch = bench.base["d_model"], bench.seq_lens[0], bench.batch or 1
    window = min(MoCOptions.routing_window, seq_len)
    generator = torch.Generator().manual_seed(0)
    read = MemoryRead(d_model, bench.base["n_head"], BENCH_CHAPTER_LEN, 1e-5).to(bench.device)
    queries = torch.randn(batch, seq_len, d_model, generator=generator).to(bench.device)
    bank_list, full_fns, routed_fns = [], [], []
    for n in banks:
        bank = (0.02 * torch.randn(n, d_model, generator=generator)).to(bench.device)
        bank_list.append(bank)
        full_fn, *routed = read_workloads(read.eval(), bank, queries, top_ks, window, generator)
        full_fns.append(full_fn)
        routed_fns += routed

    def inference(fn):
        def run():
            with torch.no_grad(), autocast_context(bench.device, bench.precision):
                fn()
        return run

    bench.log(f"MoC read: banks {banks} x k {top_ks}: routed reads interleaved, then "
              "whole-bank reads interleaved")
    routed_timings = iter(bench.time([inference(f) for f in routed_fns], batch * seq_len))
    full_timings = iter(bench.time([inference(f) for f in full_fns], batch * seq_len))
    params = sum(p.numel() for p in read.parameters())
    records = []
    for n in banks:
        full = next(full_timings)
        full_flops = read_flops_per_token(d_model, n, batch * seq_len)
        rows = [(full, f"full bank={n}", None, n, full_flops, None, None)]
        for k in top_ks:
            routed, n_read = next(routed_timings), (k + 1) * BENCH_CHAPTER_LEN
            flops = read_flops_per_token(d_model, n_read, window)
            rows.append((routed, f"routed bank={n} k={k}", k, n_read, flops,
                         full.ms_per_step / routed.ms_per_step, full_flops / flops))
        for timing, variant, k, n_read, flops, ratio, ceiling in rows:
            records.append(bench.record(
                arch="moc", variant=variant, phase="read", seq_len=seq_len, batch=batch,
                timing=timing, ratio=ratio, ceiling=ceiling, flops=flops, memory={},
                state_bytes=None, model_fields={"d_model": d_model, "n_layer": 1,
                                                "n_head": read.n_head, "vocab_size": None},
                params=n * d_model + params, overrides={"bank_tokens": n, "top_k": k},
                bank_tokens=n, top_k=k, read_tokens=n_read, routing_window=window))
    smallest = _read_smallest(records)
    for r in records:                   # routed time over the same k at the smallest bank
        r["vs_smallest"] = (r["ms_per_step"] / smallest[r["top_k"]]
                            if r["top_k"] is not None else None)
    return records


def _read_smallest(records: list[dict]) -> dict:
    smallest = {}
    for r in records:
        if r["top_k"] is not None:
            smallest.setdefault(r["top_k"], r["ms_per_step"])
    return smallest


READ_COLUMNS = (
    ("read", lambda r: "full" if r["top_k"] is None else "routed"),
    ("bank tokens", lambda r: str(r["bank_tokens"])),
    ("k", lambda r: "-" if r["top_k"] is None else str(r["top_k"])),
    ("keys/query", lambda r: str(r["read_tokens"])),
    ("ms", lambda r: f"{r['ms_per_step']:.3f}"),
    ("x smallest bank", lambda r: fmt(r.get("vs_smallest"), ".2f")),
    ("speed-up vs full", lambda r: fmt(r["ratio_vs_dense"], ".1f")),
    ("ideal (chapters/k)", lambda r: "-" if r["top_k"] is None
     else f"{r['bank_tokens'] / BENCH_CHAPTER_LEN / r['top_k']:.0f}"),
)


def _read_title(records: list[dict]) -> str:
    first = records[0]
    return (f"MoC memory read (forward, batch={first['batch']}, T={first['seq_len']}, routing "
            f"window={first['routing_window']}, chapter_len={BENCH_CHAPTER_LEN})")


def _read_footer(records: list[dict]) -> list[str]:
    return ["x smallest bank: routed time / routed time at the smallest bank (target <= 1.2); "
            "speed-up vs full: whole-bank read time / routed time (target >= 0.5 x ideal)"]


# --- the lab's record: claims and recipe (registry.register_lab) ---

PAPER = "MoC: Mixture of Chapters (Tibrewal, Saha, Meda, Singh, Moturi)"
ISO = "dense iso-FLOP (moc)"
CLAIMS = (
    Claim("moc.loss_vs_iso_flop", PAPER, "2603.21096", "Table 1",
          "validation loss, MoC minus the iso-FLOP dense model", 2.79 - 2.86, "nats",
          "pretraining; MoC 2.79, vanilla iso-FLOP 2.86", "better than dense at equal FLOPs",
          kit=lambda r: loss_gap(r, "moc", ISO), holds=lambda gap: gap < 0.0),
    Claim("moc.loss_vs_backbone", PAPER, "2603.21096", "Table 1",
          "validation loss, MoC minus its backbone alone", 2.79 - 2.92, "nats",
          "pretraining; MoC 2.79, vanilla backbone-only 2.92", "better than its backbone",
          kit=lambda r: loss_gap(r, "moc", "dense"), holds=lambda gap: gap < 0.0),
    Claim("moc.forgetting", PAPER, "2603.21096", "Table 2",
          "BoolQ change after instruction tuning, MoC", 0.24, "pp",
          "vs -6.24 pp for the iso-FLOP vanilla model", "less forgetting", comparable=False,
          note="needs MMLU / BoolQ and instruction tuning; notebook 09 measures fact retention "
               "at kit scale instead (not reproduced there)"),
)


register(Mechanism(
    name="moc", model=MoCLM, options=MoCOptions, flops=flops_per_token,
    state_bytes=state_bytes,
    summary="mixture of chapters: a learned memory bank in chapters, read by cross-attention "
            "after a router picks the top-k"))
register_bench("moc", BenchSpec(options=(BANK_TOKENS_OPTION,), variants=bench_variants,
                                specials=(SpecialBench("read", bench_memory_read, READ_COLUMNS,
                                                       _read_title, _read_footer),)))
register_lab("moc", LabSpec(iso_flop_baseline=True, claims=CLAIMS))
