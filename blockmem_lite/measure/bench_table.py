"""The bench's output: a record's roofline keys, the fixed-width tables (train / decode
records with the roofline columns, one table per special benchmark) and the JSON file.
``bench`` re-exports ``text_table``, ``rss_delta`` and ``write_json``, and its
``format_table`` calls ``format_records`` with the protocol's phases (this module imports
nothing of ``bench``)."""

from __future__ import annotations

import json
from pathlib import Path

from blockmem_lite import registry
from blockmem_lite.measure import roofline
from blockmem_lite.units import fmt, human_bytes


def text_table(header: list[str], rows: list[list[str]], left_columns: int = 1) -> str:
    """The one fixed-width table of the bench: the first ``left_columns`` left-aligned."""
    rows = [header] + rows
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < left_columns else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def rss_delta(record: dict):
    peak = record.get("rss_peak_bytes")
    return peak - record["rss_base_bytes"] if peak is not None else None


def record_fields(count: roofline.StepCount | None, peaks: roofline.Peaks | None,
                  device_type: str, flops_per_step, ms_per_step: float) -> dict:
    """A bench record's roofline keys (``bench.py``'s docstring); None where missing."""
    limit = roofline.bound(count, peaks, device_type)
    ms = None if limit is None else 1000.0 * limit.seconds
    return {"peak_flops_per_s": peaks.flops_per_s if peaks else None,
            "peak_bytes_per_s": peaks.bytes_per_s if peaks else None,
            "peak_launch_s": peaks.launch_s if peaks else None,
            "flops_per_step": flops_per_step,
            "counted_flops_per_step": count.flops if count else None,
            "launches_per_step": count.launches if count else None,
            "bytes_per_step": count.bytes if count else None,
            "matmul_flops_per_s": count.flops / count.matmul_s
            if count and count.matmul_s else None,
            **{f"{term}_ms": None if limit is None else 1000.0 * getattr(limit, f"{term}_s")
               for term in roofline.TERMS},
            "roofline_bound": None if limit is None else limit.binding, "roofline_ms": ms,
            "roofline_fraction": None if ms is None or not ms_per_step else ms / ms_per_step}


def bound_ceiling_fields(ratio, baseline_roofline_ms, roofline_ms) -> dict:
    """``bound_ceiling``: dense's bound / this record's, the ratio vs dense the machine
    allows; ``frac_of_bound_ceiling``: ``ratio`` / that. None for dense and where missing."""
    if ratio is None or not baseline_roofline_ms or not roofline_ms:
        return {"bound_ceiling": None, "frac_of_bound_ceiling": None}
    ceiling = baseline_roofline_ms / roofline_ms
    return {"bound_ceiling": ceiling, "frac_of_bound_ceiling": ratio / ceiling}


PHASE_COLUMNS = (
    ("arch", lambda r: r["arch"]), ("variant", lambda r: r["variant"] or "-"),
    ("phase", lambda r: r["phase"]), ("T", lambda r: str(r["seq_len"])),
    ("batch", lambda r: str(r["batch"])), ("tok/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
    ("ms/step", lambda r: f"{r['ms_per_step']:.2f}"),
    ("x dense", lambda r: fmt(r["ratio_vs_dense"], ".2f")),
    ("ceiling", lambda r: fmt(r["flop_ceiling"], ".2f")),
    ("% ceil", lambda r: _percent(r.get("frac_of_ceiling"))),
    ("memory", lambda r: human_bytes(r["memory_bytes"])), ("method", lambda r: r["memory_method"]),
    ("saved", lambda r: human_bytes(r.get("saved_bytes"))),
    ("rss delta", lambda r: human_bytes(rss_delta(r))),
    ("state", lambda r: human_bytes(r["state_bytes"])),
    ("bound", lambda r: r.get("roofline_bound") or "-"),
    ("% roof", lambda r: _percent(r.get("roofline_fraction"))),
    ("roof ceil", lambda r: fmt(r.get("bound_ceiling"), ".2f")),
)
ROOFLINE_COLUMNS = ("bound", "% roof", "roof ceil")      # absent when not counted
PHASE_LEGEND = (
    "x dense: tokens/s ratio to dense in the same run; ceiling: analytic FLOP ratio "
    "dense/variant; % ceil = x dense / ceiling.\n"
    "memory methods: rss_subprocess = peak RSS of a fresh process incl. the interpreter+torch "
    "baseline (rss delta = growth after import + model build); saved_tensors = activations "
    "saved for backward; cuda_max_allocated = CUDA peak.\n"
    "train = forward+backward, no optimizer step; decode ms/step is per token step; "
    "state = decoding state bytes at t = T.")
ROOFLINE_LEGEND = (
    "bound: the largest of the roofline's terms for the counted step (compute: its matmul "
    "FLOPs at the matmul probe's speed; memory: its other operators' bytes at the copy "
    "probe's bandwidth; launch: its operators x the launch probe); % roof = bound / measured "
    "time; roof ceil = dense's bound / this one's (the ratio vs dense the machine allows).")


NOISE = 0.05      # how far a record's share of its roofline ceiling moves between runs of
                  # the same code on a shared 2-core VM (docs/MEASUREMENTS.md, Roofline)
WHAT_THE_BOUND_LEAVES_OUT = {
    "compute": "their matmuls ran faster per FLOP than dense's (GFLOP/s in brackets), and "
               "the compute term prices both at the matmul probe's one speed",
    "memory": "the memory term prices every byte at a large copy's bandwidth, and the small "
              "tensors a mechanism adds stay in the cache, where they move faster",
    "launch": "the launch term prices a bare dispatch, not the Python around each operator "
              "of a model's forward",
}


def ceiling_notes(records: list[dict]) -> list[str]:
    """Lines naming the records above their roofline ceiling ([] when none): within the
    machine's noise, or grouped by the simplification of the bound the excess points at."""
    groups: dict[str, list[str]] = {}
    for r in records:
        if (r.get("frac_of_bound_ceiling") or 0) > 1.0:
            reason, name = _reason(records, r)
            groups.setdefault(reason, []).append(name)
    lines = [f"above the roofline ceiling within the machine's noise (about {100 * NOISE:.0f} "
             f"points here): {', '.join(groups['noise'])}"] if "noise" in groups else []
    return lines + [f"above the roofline ceiling: {', '.join(groups[term])}; "
                    f"{WHAT_THE_BOUND_LEAVES_OUT[term]}" for term in roofline.TERMS if term in groups]


def _reason(records: list[dict], record: dict) -> tuple[str, str]:
    """("noise" or the term the bound misprices, the record's name in the notes)."""
    name = (f"{record['arch']} {record['variant'] or ''} {record['phase']} "
            f"T={record['seq_len']} ({100 * record['frac_of_bound_ceiling']:.0f}%)"
            ).replace("  ", " ")
    if record["frac_of_bound_ceiling"] <= 1.0 + NOISE:
        return "noise", name
    if record["roofline_bound"] == "launch":
        return "launch", name
    dense = next((r for r in records if r.get("ratio_vs_dense") is None
                  and (r["phase"], r["seq_len"]) == (record["phase"], record["seq_len"])), {})
    own, dense_speed = record.get("matmul_flops_per_s"), dense.get("matmul_flops_per_s")
    if own and dense_speed and own > (1.0 + NOISE) * dense_speed:
        return "compute", f"{name[:-1]}, {own / 1e9:,.0f} vs {dense_speed / 1e9:,.0f})"
    return "memory", name


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def roofline_header(record: dict) -> str:
    """``  matmul=… GFLOP/s  copy=… GB/s  launch=… us`` from a record's measured peaks ('' if
    none)."""
    flops, bandwidth = record.get("peak_flops_per_s"), record.get("peak_bytes_per_s")
    if flops is None or bandwidth is None:
        return ""
    launch = record.get("peak_launch_s")
    return (f"  matmul={flops / 1e9:,.1f} GFLOP/s  copy={bandwidth / 1e9:,.1f} GB/s"
            + ("" if launch is None else f"  launch={1e6 * launch:.1f} us"))


def _columns_table(records: list[dict], columns, left_columns: int) -> str:
    return text_table([name for name, _ in columns],
                      [[cell(r) for _, cell in columns] for r in records], left_columns)


def format_records(records: list[dict], phases: tuple[str, ...], specials_of) -> str:
    """Every record as readable tables: the ``phases`` (train / decode) with a header and
    legend, then one table per special benchmark (laid out by its mechanism's columns;
    ``specials_of(archs)``: ``bench.special_benches``). ``bench.format_table`` passes them."""
    if not records:
        return "(no records)"
    first = records[0]
    parts = [f"device={first['device']} ({first.get('machine', '?')})  dtype={first['dtype']}  "
             f"threads={first['threads']}  torch={first['torch_version']}  "
             f"load={fmt(first.get('load_avg_1m'), '.2f')}"
             + ("  compiled (torch.compile)" if first.get("compiled") else "")
             + roofline_header(first)]
    main = [r for r in records if r["phase"] in phases]
    if main:
        counted = any(r.get("roofline_bound") for r in main)     # run_bench(roofline_seconds=None)
        columns = [c for c in PHASE_COLUMNS if counted or c[0] not in ROOFLINE_COLUMNS]
        parts += [_columns_table(main, columns, 3), PHASE_LEGEND]
        parts += [ROOFLINE_LEGEND] if counted else []
    archs = list(dict.fromkeys(r["arch"] for r in records if r["arch"] in registry.names()))
    for name, (_, special) in specials_of(archs).items():
        own = [r for r in records if r["phase"] == name]
        if own:
            parts += ["", special.title(own), _columns_table(own, special.columns, 2),
                      *special.footer(own)]
    return "\n".join(parts + ceiling_notes(records))


def write_json(records: list[dict], path: str | Path) -> Path:
    """Write the records as a JSON list of dicts (no wrapper)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2), encoding="utf-8")
    return path
