"""The comparison lab's bench: every entry and variant timed against dense in one process
(same-run ratios, ``measure.bench``), and the decoding state after t tokens measured next
to each mechanism's analytic model."""

from __future__ import annotations

import dataclasses

import torch

from blockmem_lite import registry
from blockmem_lite.measure import bench, bench_steps, roofline
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import pick_device, seed_everything

BENCH_WEIGHT = {"train": 4, "decode": 1, "state": 1}   # the bench's parts, as the progress
                                                       # bar counts them (about their shares
                                                       # of a class bench's time)


def bench_entries(entries: list, sizes: dict, progress) -> dict:
    """Every entry and variant (``run.Entry``) timed interleaved with dense at each of the
    lab's ``sizes["bench_lens"]`` (the machine measured first, so the records carry the
    roofline), then the decoding state curves; ``progress.within`` follows the phases."""
    first = entries[0].cfg
    base = dict(d_model=first.d_model, n_layer=first.n_layer, n_head=first.n_head,
                vocab_size=first.vocab_size)
    device = pick_device(entries[0].run.train.device)
    precision = bench.resolve_dtype("auto", device)
    ctx = bench.BenchContext(base, list(sizes["bench_lens"]), None, device, precision,
                             torch.get_num_threads(), sizes["warmup"], sizes["repeats"],
                             sizes["decode_burst"], ("saved",), False,
                             roofline.measure_peaks(device, precision))
    records, phases = [], [(t, phase) for t in sizes["bench_lens"] for phase in bench.PHASES]
    weights = [BENCH_WEIGHT[phase] for _, phase in phases] + [BENCH_WEIGHT["state"]]
    for i, (seq_len, phase) in enumerate(phases):
        progress.within(sum(weights[:i]) / sum(weights), f"bench: T={seq_len} {phase}")
        extra = (ctx.warmup + ctx.repeats) * ctx.burst if phase == "decode" else 0
        timed = _variants(entries, seq_len + extra)
        if phase == "decode" and bench.counted_decode_tokens(ctx, timed) > extra:
            extra = bench.counted_decode_tokens(ctx, timed)      # the roofline's count
            timed = _variants(entries, seq_len + extra)
        records += bench.bench_phase(ctx, timed, phase, seq_len,
                                     bench.default_batch(phase, seq_len))
    progress.within(sum(weights[:-1]) / sum(weights), "bench: decoding state curves")
    return {"records": records, "state": state_curves(entries, sizes["state_lens"])}


def _variants(entries: list, seq_len: int) -> list[bench.Entry]:
    """Every entry and variant at ``seq_len``; the record's variant names the entry when
    it is not its arch's own (e.g. "iso-FLOP (moc)"), then the variant (e.g. "C=16")."""
    out = []
    for entry in entries:
        own = entry.label[len(entry.arch):].strip() if entry.label != entry.arch else ""
        for variant, overrides in entry.variants():
            cfg = dataclasses.replace(entry.cfg, seq_len=max(seq_len, entry.cfg.seq_len),
                                      **overrides)
            out.append(bench.Entry(entry.arch, f"{own} {variant}".strip(), overrides, cfg))
    return out


def state_curves(entries: list, lengths) -> dict:
    """Decoding state bytes after t tokens, measured (prefill) and analytic, per entry."""
    curves = {}
    for entry in entries:
        mechanism = registry.get(entry.arch)
        for variant, overrides in entry.variants():
            label = f"{entry.label} {variant}".strip()
            measured, analytic = [], []
            for t in lengths:
                cfg = dataclasses.replace(entry.cfg, seq_len=max(t, entry.cfg.seq_len),
                                          **overrides)
                seed_everything(0)
                model = build_model(cfg)
                measured.append(int(bench_steps.prefill_state(model, 1, t).nbytes()))
                analytic.append(mechanism.state_bytes(cfg, t) if mechanism.state_bytes
                                else None)
            curves[label] = {"t": list(lengths), "measured": measured,
                             "analytic": analytic}
    return curves
