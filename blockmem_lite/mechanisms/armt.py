"""ARMT's registration: FLOP model, state size, the inference sweep, lab record.

``models/armt.py`` holds what the paper defines (options, memory maths, layer, the
wrapper LM, reference forward); this module holds what the kit needs to run, measure
and compare it: the FLOP model, ``state_bytes`` and
the inference sweep (``bench_inference``: ARMT's ``stream`` against dense's
``prefill`` over growing prompt lengths), then the claims and lab recipe, and ends by
registering ``armt``.
"""

from __future__ import annotations

import dataclasses

import torch

from blockmem_lite.config import ModelConfig
from blockmem_lite.labdata import state_growth
from blockmem_lite.measure.flops import layer_matmul_flops, lm_head_flops
from blockmem_lite.models.armt import ARMT, ARMTOptions
from blockmem_lite.ops.armt_memory import DPFP_NU
from blockmem_lite.registry import (
    BASELINE,
    BenchOption,
    BenchSpec,
    Claim,
    LabSpec,
    Mechanism,
    SpecialBench,
    check_int_list,
    register,
    register_bench,
    register_lab,
)
from blockmem_lite.units import fmt, human_bytes
from blockmem_lite.validation import check_non_negative, check_positive, fail, parse_int_list

# --- FLOP model ---------------------------------------------------------------------------

def armt_layer_flops(d_model: int, segment_size: int, n_mem_tokens: int, d_mem: int) -> float:
    """ARMT layer, per token:
    ``(1 + m/S)·[24·d² + 2·d·(S + m)] + 14·d·d_mem + (m/S)·(2·d² + 26·d·d_mem)``.

    m memory tokens per segment of S tokens; the read (W_Q, qᵀA with DPFP ν=3,
    so d_key = 6·d_mem) runs for every token, the write once per memory token.
    """
    check_positive("segment_size", segment_size)
    check_non_negative("n_mem_tokens", n_mem_tokens)
    check_positive("d_mem", d_mem)
    extra = n_mem_tokens / segment_size
    layer = (1.0 + extra) * (layer_matmul_flops(d_model)
                             + 2.0 * d_model * (segment_size + n_mem_tokens))
    read = 14.0 * d_model * d_mem
    write = extra * (2.0 * d_model * d_model + 26.0 * d_model * d_mem)
    return layer + read + write


def armt_decode_layer_flops(d_model: int, segment_size: int, n_mem_tokens: int,
                            d_mem: int) -> float:
    """ARMT layer, one decoding step, averaged over a segment of S tokens:
    ``24·d² + 2·d·(S + 1) + 14·d·d_mem + (m/S)·[26·d² + 2·d·(2S + m + 1) + 40·d·d_mem]``.

    A segment token at in-segment position p attends to p + 1 cached keys
    (4·d each; the mean over p = 0..S-1 is 2·d·(S + 1)) and reads the memory
    (14·d·d_mem). Once per segment the m memory tokens run through the cache
    to write: token j sees S + j + 1 keys (mean 4·d·S + 2·d·(m + 1)), reads,
    and writes (2·d² + 26·d·d_mem), amortised over the S tokens. This is the
    steady state past the first segment: it does not depend on the context.
    """
    check_positive("d_model", d_model)
    check_positive("segment_size", segment_size)
    check_non_negative("n_mem_tokens", n_mem_tokens)
    check_positive("d_mem", d_mem)
    d, s, m = d_model, segment_size, n_mem_tokens
    token = layer_matmul_flops(d) + 2.0 * d * (s + 1) + 14.0 * d * d_mem
    write = 26.0 * d * d + 2.0 * d * (2 * s + m + 1) + 40.0 * d * d_mem
    return token + (m / s) * write


def armt_memory_flops(d_model: int, segment_size: int, n_mem_tokens: int, d_mem: int,
                      decode: bool = False) -> float:
    """The memory path inside ``armt_layer_flops`` (or ``armt_decode_layer_flops``), per token:
    ``14·d·d_mem + (m/S)·(2·d² + 26·d·d_mem)`` (decode: ``40·d·d_mem`` in the write term,
    since the m memory tokens also read). An unwrapped layer costs the ARMT layer minus this.
    """
    check_positive("d_model", d_model)
    check_positive("segment_size", segment_size)
    check_non_negative("n_mem_tokens", n_mem_tokens)
    check_positive("d_mem", d_mem)
    d, per_write = d_model, (40.0 if decode else 26.0) * d_model * d_mem
    return 14.0 * d * d_mem + (n_mem_tokens / segment_size) * (2.0 * d * d + per_write)


def flops_per_token(cfg, seq_len: int, decode: bool = False) -> float:
    """Forward FLOPs per token: ARMT layers where memory is, plain segmented layers elsewhere
    (no read or write), plus the head. A segment longer than the sequence is the sequence."""
    segment = cfg.segment_size if decode else min(cfg.segment_size, seq_len)
    args = (cfg.d_model, segment, cfg.n_mem_tokens, cfg.d_mem)
    layer = armt_decode_layer_flops(*args) if decode else armt_layer_flops(*args)
    wrapped = cfg.n_layer if cfg.memory_layers is None else len(cfg.memory_layers)
    unwrapped = cfg.n_layer - wrapped
    return (cfg.n_layer * layer - unwrapped * armt_memory_flops(*args, decode=decode)
            + lm_head_flops(cfg.d_model, cfg.vocab_size))


# --- bench: segment sizes, and the inference sweep over total length ------------------------

CPU_DENSE_INFER_MAX = 16384      # infer_dense_max "auto" off CUDA


def parse_infer_lengths(text: str) -> list[int]:
    """'--infer-len' text -> lengths; 'none' -> [] (no sweep)."""
    if str(text).strip().lower() == "none":
        return []
    return parse_int_list("--infer-len", text)


def parse_dense_max(text: str):
    """'--infer-dense-max' text -> "auto" or one length."""
    if str(text).strip().lower() == "auto":
        return "auto"
    values = parse_int_list("--infer-dense-max", text)
    if len(values) != 1:
        fail("--infer-dense-max", text, "expected 'auto' or one integer >= 1")
    return values[0]


def dense_infer_limit(value, device) -> int | None:
    """The longest prompt dense reads (None: no limit): ``value`` is "auto" (every length on
    CUDA, ``CPU_DENSE_INFER_MAX`` elsewhere) or a length."""
    if value == "auto":
        return None if torch.device(device).type == "cuda" else CPU_DENSE_INFER_MAX
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail("infer_dense_max", value, "expected 'auto' or one integer >= 1")
    return value


INFER_LEN_OPTION = BenchOption(
    "--infer-len", [2048, 8192, 65536],
    "ARMT inference sweep: prompt lengths read by ARMT.stream (constant memory) next to dense's "
    "prefill (comma-separated; 'none' skips the sweep)", parse=parse_infer_lengths,
    check=lambda lengths: check_int_list("infer_len", lengths, allow_empty=True))
INFER_DENSE_MAX_OPTION = BenchOption(
    "--infer-dense-max", "auto",
    "longest prompt dense reads in the ARMT inference sweep (auto: every length on CUDA, "
    "16384 elsewhere: a 65,536-token dense prefill takes minutes on a laptop CPU)",
    parse=parse_dense_max, check=lambda value: dense_infer_limit(value, "cpu"))


def bench_inference(options: dict, bench) -> list[dict]:
    """Read prompts of growing total length: ARMT (``stream``) vs dense (``prefill``).

    Forward only, no grad, random (batch, T) prompts; one call = one whole prompt
    (``bench_steps.make_infer_step``). Dense (while T <= ``--infer-dense-max``) and
    ARMT with every segment size, at every length, are timed interleaved in one
    loop, so ratios across models *and lengths* are same-run ratios. Memory per
    entry: on CUDA the peak allocated over one call with only that model built
    (weights included); on CPU, with the "rss" memory method, the peak RSS of a
    fresh process reading one prompt.

    Records (by increasing T): phase ``"infer"``, ``ratio_vs_dense`` (tokens/s
    over dense's at the same T, None where dense was not run), ``state_bytes``
    (what is kept to continue: ARMT's constant state, dense's KV cache) and
    extra keys ``memory_vs_shortest`` / ``tokens_per_s_vs_shortest`` (this entry
    over the same entry at the shortest length: the constant-memory and
    flat-throughput targets), ``note`` (why dense is missing, or None) and the roofline
    keys of one call (one whole prompt), the bound ceiling against dense at the same T.
    """
    lengths = sorted(set(options["infer_len"]))
    if not lengths:
        return []
    sizes = options["segment_size"]
    dense_max = dense_infer_limit(options["infer_dense_max"], bench.device)
    batch = bench.batch or 1
    runs = [(seq_len, entry) for seq_len in lengths
            for entry in _infer_entries(bench, seq_len, sizes, dense_max)]
    memories = [bench.infer_memory(entry.cfg, batch, seq_len) for seq_len, entry in runs]
    models = [bench.build(entry.cfg) for _, entry in runs]
    state_bytes: dict[int, int] = {}
    steps = [_keeping_state_bytes(bench.infer_step(model, batch, seq_len), state_bytes, i)
             for i, (model, (seq_len, _)) in enumerate(zip(models, runs, strict=True))]
    bench.log(f"infer T={lengths} batch={batch}: timing {len(runs)} (model, length) pairs "
              f"interleaved, {bench.warmup} warm-up + {bench.repeats} timed pass(es)")
    timings = bench.time(steps, [batch * seq_len for seq_len, _ in runs])
    dense_tps = {seq_len: timing.tokens_per_s
                 for (seq_len, entry), timing in zip(runs, timings, strict=True)
                 if entry.arch == BASELINE}
    costs = [bench.step_cost(step, tokens=batch * seq_len,
                             flops_per_token=bench.flops(entry.cfg, seq_len))
             for step, (seq_len, entry) in zip(steps, runs, strict=True)]
    dense_ms = {seq_len: bench.roofline_fields(cost["flops_per_step"], cost["count"],
                                               timing.ms_per_step)["roofline_ms"]
                for (seq_len, entry), cost, timing in zip(runs, costs, timings, strict=True)
                if entry.arch == BASELINE}
    records = []
    for i, (seq_len, entry) in enumerate(runs):
        baseline = entry.arch == BASELINE
        flops = bench.flops(entry.cfg, seq_len)
        dense_flops = bench.flops(dataclasses.replace(entry.cfg, arch=BASELINE), seq_len)
        ratio = timings[i].tokens_per_s / dense_tps[seq_len] \
            if seq_len in dense_tps and not baseline else None
        records.append(bench.record(
            arch=entry.arch, variant=entry.variant, phase="infer", seq_len=seq_len, batch=batch,
            timing=timings[i], ratio=ratio,
            ceiling=None if baseline else bench.ceiling(dense_flops, flops), flops=flops,
            memory=memories[i], state_bytes=state_bytes[i],
            model_fields={k: getattr(entry.cfg, k) for k in ("d_model", "n_layer", "n_head",
                                                              "vocab_size")},
            params=models[i].num_params(), overrides=entry.overrides,
            note=None if baseline else _dense_skipped_note(bench, batch, seq_len, dense_max),
            baseline_roofline_ms=None if baseline else dense_ms.get(seq_len), **costs[i]))
    _add_growth(records)
    return records


def _infer_entries(bench, seq_len: int, segment_sizes, dense_max) -> list:
    entries = []
    if dense_max is None or seq_len <= dense_max:
        entries.append(bench.entry(BASELINE, seq_len))
    for size in segment_sizes:
        entry = bench.entry("armt", max(seq_len, size), f"S={size}", {"segment_size": size})
        entries.append(entry)
    return entries


def _dense_skipped_note(bench, batch: int, seq_len: int, dense_max) -> str | None:
    if dense_max is None or seq_len <= dense_max:
        return None
    width = 2 if bench.precision in ("bf16", "fp16") else 4
    kv = 2 * bench.base["n_layer"] * batch * seq_len * bench.base["d_model"] * width
    return (f"dense not run at T={seq_len} on {bench.device.type}: above --infer-dense-max="
            f"{dense_max} (its quadratic prefill takes minutes per pass here); its KV cache "
            f"alone would hold {human_bytes(kv)}")


def _keeping_state_bytes(step, sizes: dict, index: int):
    """``step`` that stores the returned state's bytes in ``sizes[index]`` (state then freed)."""
    def run() -> None:
        sizes[index] = step().nbytes()
    return run


def _add_growth(records: list[dict]) -> None:
    """``memory_vs_shortest`` and ``tokens_per_s_vs_shortest`` per (arch, variant)."""
    shortest: dict[tuple[str, str], dict] = {}
    for r in records:                                      # records come by increasing length
        first = shortest.setdefault((r["arch"], r["variant"]), r)
        r["shortest_len"] = first["seq_len"]
        r["tokens_per_s_vs_shortest"] = r["tokens_per_s"] / first["tokens_per_s"]
        r["memory_vs_shortest"] = (r["memory_bytes"] / first["memory_bytes"]
                                   if r["memory_bytes"] and first["memory_bytes"] else None)


INFER_COLUMNS = (
    ("arch", lambda r: r["arch"]), ("variant", lambda r: r["variant"] or "-"),
    ("T", lambda r: str(r["seq_len"])), ("tok/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
    ("x dense", lambda r: fmt(r["ratio_vs_dense"], ".2f")),
    ("tok/s vs shortest", lambda r: f"{r['tokens_per_s_vs_shortest']:.2f}"),
    ("peak memory", lambda r: human_bytes(r["memory_bytes"])),
    ("peak vs shortest", lambda r: fmt(r["memory_vs_shortest"], ".3f")),
    ("rss delta", lambda r: human_bytes(r["rss_peak_bytes"] - r["rss_base_bytes"]
                                        if r.get("rss_peak_bytes") is not None else None)),
    ("state", lambda r: human_bytes(r["state_bytes"])), ("method", lambda r: r["memory_method"]),
)


def _infer_title(records: list[dict]) -> str:
    return (f"ARMT inference sweep (forward, no grad, batch={records[0]['batch']}): ARMT reads "
            "the prompt with stream() (segment by segment), dense with prefill()")


def _infer_footer(records: list[dict]) -> list[str]:
    longest = {(r["arch"], r["variant"]): r for r in records}        # by increasing length
    lines = [f"ARMT {r['variant']}: peak({r['seq_len']}) / peak({r['shortest_len']}) = "
             f"{fmt(r['memory_vs_shortest'], '.3f')} (target <= 1.1); tok/s({r['seq_len']}) / "
             f"tok/s({r['shortest_len']}) = {r['tokens_per_s_vs_shortest']:.2f} (target: flat)"
             for r in longest.values() if r["arch"] == "armt" and r["seq_len"] > r["shortest_len"]]
    notes = sorted({r["note"] for r in records if r.get("note")})
    return [*lines, *notes,
            "peak memory: rss_subprocess = peak RSS of a fresh process incl. the interpreter+torch "
            "baseline (rss delta = growth after import + model build); cuda_max_allocated = CUDA "
            "peak incl. weights. state = what is kept to continue (ARMT: KV of one segment + A, z;"
            " dense: KV cache)."]


# --- decoding state -----------------------------------------------------------------------

def state_bytes(cfg, t: int) -> float:
    """Per wrapped layer: one cache of S + M slots (``2·(S+M)·d``) and A, z (``K·d + K``,
    K = 6·d_mem); unwrapped layers keep the cache only (fp32). Constant in t."""
    wrapped = cfg.n_layer if cfg.memory_layers is None else len(cfg.memory_layers)
    key = 2 * DPFP_NU * cfg.d_mem
    cache = 2 * (cfg.segment_size + cfg.n_mem_tokens) * cfg.d_model
    return 4.0 * (cfg.n_layer * cache + wrapped * (key * cfg.d_model + key))


# --- the lab's record: claims and recipe (registry.register_lab) ---

def lab_start(cfg, trained: dict):
    """ARMT wraps a pretrained model: the lab's trained dense model when there is one."""
    backbone = trained.get(BASELINE)
    if backbone is None:
        return ARMT(cfg)
    settings = {name: getattr(cfg, name) for name in ARMTOptions.field_names()
                if name != "backbone"}
    return ARMT.wrap(backbone, seq_len=cfg.seq_len, **settings)


def flop_saving_of_a_layer_subset() -> float:
    """1 - FLOPs(memory in 20% of the layers) / FLOPs(memory in all), on the follow-up's public
    config (Llama-3.2-1B: d 2048, 16 layers, vocab 128,256; segment 1024, 32 memory tokens,
    d_mem 64); the FLOP model is the kit's."""
    shape = dict(d_model=2048, n_layer=16, n_head=32, seq_len=1024, vocab_size=128256,
                 segment_size=1024, n_mem_tokens=32, d_mem=64)
    every = flops_per_token(ModelConfig("armt", **shape), 1024)
    some = flops_per_token(ModelConfig("armt", **shape, memory_layers=(6, 7, 8)), 1024)
    return 1.0 - some / every


PAPER = "ARMT: Associative Recurrent Memory Transformer (Rodkin, Kuratov, Bulatov, Burtsev)"
CLAIMS = (
    Claim("armt.babilong", PAPER, "2407.04841", "abstract",
          "BABILong QA1 accuracy over 50M tokens", 79.9, "%", "GPT-2 backbone, segment 512, "
          "curriculum to 32 segments", "single-fact QA over 50M tokens", comparable=False,
          note="needs a pretrained LM and 50M-token contexts; the lab's MQAR beyond the "
               "segment, at up to 8x the trained length (the memory-pays table), is the "
               "nearest probe at kit scale"),
    Claim("armt.constant_memory", PAPER, "OpenReview cWVbffpjs7", "follow-up, per the paper "
          "summary (not verified)", "decoding state, longest over shortest length", 1.0,
          "x", "up to 64k tokens", "a constant state (within 10%)",
          kit=lambda r: state_growth(r, "armt"), holds=lambda growth: growth <= 1.1,
          note="kit: the measured decoding state over the lab's lengths"),
    Claim("armt.flop_saving", PAPER, "OpenReview cWVbffpjs7", "follow-up, per the paper "
          "summary (not verified)", "FLOP saving with memory in ~20% of the layers", 30.0,
          "%", "Llama-3.2-1B wrapped", "about 30% fewer FLOPs",
          kit=lambda r: 100 * flop_saving_of_a_layer_subset(), holds=lambda saving: saving >= 25,
          note="the kit's FLOP model on the public 1B config (memory in 3 of 16 layers)"),
)


def memory_slots(cfg, n_pairs: int) -> int:
    """The slot model of the associative memory: each of a segment's M memory tokens writes
    one key-value association, a query reads by its DPFP key, and at most K = 2 nu d_mem
    keys stay apart (independent rows of A); so min(M, K) slots (0 with no memory layer)."""
    if cfg.memory_layers == ():
        return 0
    return min(cfg.n_mem_tokens, 2 * DPFP_NU * cfg.d_mem)


register(Mechanism(
    name="armt", model=ARMT, options=ARMTOptions, flops=flops_per_token,
    state_bytes=state_bytes,
    summary="associative recurrent memory: segments, a per-layer delta-rule memory matrix "
            "carried across them, around a (pretrained) backbone"))
register_bench("armt", BenchSpec(
    options=(INFER_LEN_OPTION, INFER_DENSE_MAX_OPTION),
    specials=(SpecialBench("infer", bench_inference, INFER_COLUMNS, _infer_title,
                           _infer_footer),)))
register_lab("armt", LabSpec(start=lab_start, memory_slots=memory_slots, recall_curriculum=True,
                             twin=lambda cfg: dataclasses.replace(cfg, memory_layers=()),
                             claims=CLAIMS))
