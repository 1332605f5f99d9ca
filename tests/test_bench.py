"""bench: records, same-run ratios, ceilings, state bytes, registry, table, JSON and CLI."""

import json

import pytest
import torch

from blockmem_lite import ModelConfig, registry
from blockmem_lite.measure import bench, bench_steps, metrics, roofline
from blockmem_lite.measure.flops import flop_ceiling
from blockmem_lite.models.dense import DenseLM
from blockmem_lite.tools.bench_command import bench_main, bench_options_of, bench_parser
from blockmem_lite.units import human_bytes
from blockmem_lite.validation import parse_int_list

TINY = dict(d_model=32, n_layer=2, n_head=2, batch=2, threads=1, warmup=1, repeats=1,
            decode_burst=2, progress=False, roofline_seconds=0.0)
TINY_ARGS = ["--d-model", "32", "--n-layer", "2", "--n-head", "2", "--batch", "2",
             "--threads", "1", "--warmup", "1", "--repeats", "1", "--decode-burst", "2",
             "--roofline-seconds", "0"]

KEY_TYPES = {
    "arch": str, "variant": str, "phase": str, "seq_len": int, "batch": int,
    "tokens_per_s": float, "ms_per_step": float, "ratio_vs_dense": (float, type(None)),
    "flop_ceiling": (float, type(None)), "frac_of_ceiling": (float, type(None)),
    "memory_bytes": (int, type(None)), "memory_method": str, "state_bytes": (int, type(None)),
    "device": str, "dtype": str, "threads": int, "torch_version": str,
    "saved_bytes": (int, type(None)), "rss_peak_bytes": (int, type(None)),
    "rss_base_bytes": (int, type(None)), "flops_per_token": (float, type(None)),
    "flops_per_step": (float, type(None)), "bytes_per_step": (float, type(None)),
    "roofline_bound": (str, type(None)), "roofline_ms": (float, type(None)),
    "roofline_fraction": (float, type(None)), "peak_flops_per_s": (float, type(None)),
    "peak_bytes_per_s": (float, type(None)), "peak_launch_s": (float, type(None)),
    "counted_flops_per_step": (float, type(None)), "launches_per_step": (int, type(None)),
    "matmul_flops_per_s": (float, type(None)), "compute_ms": (float, type(None)),
    "memory_ms": (float, type(None)), "launch_ms": (float, type(None)),
    "bound_ceiling": (float, type(None)), "frac_of_bound_ceiling": (float, type(None)),
}


@pytest.fixture(scope="module")
def dense_records():
    return bench.run_bench(["dense"], [16, 32], memory=("saved",), **TINY)


def _block_local(d_model, n_layer, seq_len, vocab_size=256):
    return metrics.flops_per_token(ModelConfig("honly", d_model=d_model, n_layer=n_layer,
                                               n_head=2, seq_len=max(seq_len, 8),
                                               vocab_size=vocab_size, block_size=8), seq_len)


@pytest.fixture
def twin_arch():
    """A second benchable arch (dense weights, block-local FLOP model) with an option,
    registered like a plugin and removed afterwards."""
    def variants(options):
        return [(f"L={n}", {}) for n in options["twin_len"]]

    def flops(cfg, seq_len, decode):
        return None if decode else _block_local(cfg.d_model, cfg.n_layer, seq_len)

    entry = registry.register(registry.Mechanism(
        name="twin", model=DenseLM, summary="dense weights under another name", flops=flops))
    registry.register_bench("twin", registry.BenchSpec(
        options=(registry.BenchOption("--twin-len", [8, 16], "twin block lengths"),),
        variants=variants))
    yield entry
    registry.unregister("twin")


def test_records_have_every_key_with_the_right_type(dense_records):
    assert len(dense_records) == 4          # 2 lengths x 2 phases
    for record in dense_records:
        assert set(bench.RECORD_KEYS) <= set(record)
        for key, kind in KEY_TYPES.items():
            assert isinstance(record[key], kind), (key, record[key])
        assert record["device"] == "cpu" and record["dtype"] == "fp32"
        assert record["threads"] == 1 and record["batch"] == 2
        assert record["torch_version"] == torch.__version__
        assert record["tokens_per_s"] > 0
    assert {(r["phase"], r["seq_len"]) for r in dense_records} == {
        ("train", 16), ("train", 32), ("decode", 16), ("decode", 32)}


def test_dense_is_the_baseline(dense_records):
    for record in dense_records:
        assert record["arch"] == "dense" and record["variant"] == ""
        assert record["ratio_vs_dense"] is None and record["frac_of_ceiling"] is None
        assert record["flop_ceiling"] == 1.0


def test_train_memory_is_saved_tensors_and_decode_has_none(dense_records):
    for record in dense_records:
        if record["phase"] == "train":
            assert record["memory_method"] == "saved_tensors"
            assert record["memory_bytes"] == record["saved_bytes"] > 0
            assert record["state_bytes"] is None
        else:
            assert record["memory_method"] == "none" and record["memory_bytes"] is None


def test_default_batch_keeps_train_tokens_per_step_fixed():
    for t in (16, 256, 4096):
        assert bench.default_batch("train", t) * t == bench.TRAIN_TOKENS_PER_STEP
    assert bench.default_batch("train", 8192) == 1
    assert bench.default_batch("decode", 256) == 1


def test_train_saved_bytes_grow_with_t(dense_records):
    train = {r["seq_len"]: r for r in dense_records if r["phase"] == "train"}
    assert train[32]["saved_bytes"] == pytest.approx(2 * train[16]["saved_bytes"], rel=1e-3)


def test_decode_state_bytes_match_the_kv_cache(dense_records):
    decode = {r["seq_len"]: r for r in dense_records if r["phase"] == "decode"}
    for t, record in decode.items():
        # 2 (k and v) * t * d * n_layer * 4 bytes (fp32) * batch; KVCache capacity = t exactly
        assert record["state_bytes"] == 2 * t * 32 * 2 * 4 * record["batch"]
    assert decode[32]["state_bytes"] == 2 * decode[16]["state_bytes"]


def test_train_flops_are_three_forwards(dense_records):
    record = next(r for r in dense_records if r["phase"] == "train" and r["seq_len"] == 32)
    forward = metrics.flops_per_token(ModelConfig(d_model=32, n_layer=2, n_head=2, seq_len=32))
    assert record["flops_per_token"] == pytest.approx(3 * forward)


def test_variants_are_interleaved_with_dense_and_get_ratios(twin_arch, monkeypatch):
    counts = []
    real = bench_steps.time_interleaved

    def spy(step_fns, **kw):
        counts.append(len(step_fns))
        return real(step_fns, **kw)

    monkeypatch.setattr(bench_steps, "time_interleaved", spy)
    records = bench.run_bench(["twin"], [32], memory=("none",), **TINY)
    # dense + L=8 + L=16 together: train in one timing run, decode in one per block
    assert counts == [3] * (1 + bench.DECODE_BLOCKS)
    assert [(r["arch"], r["variant"]) for r in records if r["phase"] == "train"] == [
        ("dense", ""), ("twin", "L=8"), ("twin", "L=16")]
    dense = {r["phase"]: r for r in records if r["arch"] == "dense"}
    for r in (r for r in records if r["arch"] == "twin"):
        expected = r["tokens_per_s"] / dense[r["phase"]]["tokens_per_s"]
        assert r["ratio_vs_dense"] == pytest.approx(expected)
        assert r["memory_method"] == "none" and r["memory_bytes"] is None
        if r["phase"] == "train":
            ceiling = flop_ceiling(
                metrics.flops_per_token(ModelConfig(d_model=32, n_layer=2, n_head=2, seq_len=32)),
                _block_local(32, 2, 32))
            assert r["flop_ceiling"] == pytest.approx(ceiling) and ceiling > 1
            assert r["frac_of_ceiling"] == pytest.approx(r["ratio_vs_dense"] / ceiling)
        else:
            assert r["flop_ceiling"] is None and r["frac_of_ceiling"] is None


def test_arch_options_reach_the_variants_from_the_cli(twin_arch, tmp_path, capsys):
    path = tmp_path / "twin.json"
    code = bench_main(["--arch", "twin", "--twin-len", "4", "--seq-len", "16", "--phases",
                       "train", "--memory", "none", "--json", str(path), *TINY_ARGS])
    assert code == 0
    records = json.loads(path.read_text())
    assert [(r["arch"], r["variant"]) for r in records] == [("dense", ""), ("twin", "L=4")]
    assert "[twin] twin block lengths" in bench_parser().format_help()


def test_unknown_arch_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match=r"arch='nope' is not allowed: known architectures.*dense"):
        bench.run_bench(["nope"], [16], **TINY)
    assert bench_main(["--arch", "dense,nope", "--seq-len", "16"]) == 2
    assert "known architectures are" in capsys.readouterr().err


def test_an_arch_without_a_flop_model_benches_without_ceilings():
    registry.register(registry.Mechanism(name="noflops", model=DenseLM, summary="no FLOP model"))
    try:
        records = bench.run_bench(["noflops"], [16], memory=("none",), phases=("train",), **TINY)
    finally:
        registry.unregister("noflops")
    mine = [r for r in records if r["arch"] == "noflops"]
    assert len(mine) == 1 and mine[0]["ratio_vs_dense"] > 0
    assert mine[0]["flop_ceiling"] is None and mine[0]["flops_per_token"] is None


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="phases=.*special phases come with"):
        bench.run_bench(["dense"], [16], phases=("infer",), **TINY)
    with pytest.raises(ValueError, match="options=.*block_size"):
        bench.run_bench(["dense"], [16], options={"block_len": "8"}, **TINY)
    with pytest.raises(ValueError, match="memory"):
        bench.run_bench(["dense"], [16], memory=("gpu",), **TINY)
    with pytest.raises(ValueError, match="dtype='bf16' is not allowed: bf16 autocast is used only on CUDA, not on cpu"):
        bench.run_bench(["dense"], [16], dtype="bf16", device="cpu", **TINY)
    with pytest.raises(ValueError, match="seq_len='16,x'"):
        parse_int_list("seq_len", "16,x")


def test_table_has_the_columns_and_one_row_per_record(dense_records):
    table = bench.format_table(dense_records)
    for column in ("tok/s", "ms/step", "x dense", "ceiling", "% ceil", "memory", "method",
                   "state"):
        assert column in table
    assert table.count("saved_tensors") >= 2
    assert human_bytes(dense_records[0]["memory_bytes"]) in table
    assert "dtype=fp32" in table and "threads=" in table
    rows = [line for line in table.splitlines() if line.startswith("dense ")]
    assert len(rows) == len(dense_records)


def test_cli_writes_a_json_list_of_records(tmp_path, capsys):
    path = tmp_path / "out" / "bench.json"
    code = bench_main(["--seq-len", "16", "--memory", "saved", "--json", str(path), *TINY_ARGS])
    assert code == 0
    records = json.loads(path.read_text())
    assert isinstance(records, list) and len(records) == 2
    assert all(set(bench.RECORD_KEYS) <= set(r) for r in records)
    out = capsys.readouterr().out
    assert "tok/s" in out and str(path) in out


def test_rss_subprocess_is_the_primary_cpu_memory_figure():
    (record,) = bench.run_bench(["dense"], [16], phases=("train",), memory=("saved", "rss"),
                                **TINY)
    assert record["memory_method"] == "rss_subprocess"
    assert record["memory_bytes"] == record["rss_peak_bytes"] >= record["rss_base_bytes"] > 0
    assert record["saved_bytes"] > 0


def test_bcmt_and_honly_share_the_block_size_option():
    parser = bench_parser()
    args = parser.parse_args(["--arch", "bcmt,honly", "--block-size", "8,16"])
    assert bench_options_of(args)["block_size"] == [8, 16]
    assert registry.bench_variants("bcmt", {"block_size": [8, 16]}) == [
        ("L=8", {"block_size": 8}), ("L=16", {"block_size": 16})]
    records = bench.run_bench(["bcmt", "honly"], [32], d_model=32, n_layer=1, n_head=2,
                              warmup=1, repeats=1, memory=("saved",), phases=("decode",),
                              options={"block_size": [8]}, progress=False)
    state = {r["arch"]: r["state_bytes"] for r in records}
    assert state["dense"] > state["honly"] > 0
    assert {r["variant"] for r in records if r["arch"] != "dense"} == {"L=8"}


def test_decoding_is_timed_in_blocks_from_a_fresh_prefill(dense_records, monkeypatch):
    for r in dense_records:                         # repeats=1: one round per block
        blocks = bench.DECODE_BLOCKS if r["phase"] == "decode" else 1
        assert len(r["step_times_ms"]) == blocks
    prefills = []
    real = bench_steps.prefill_state
    monkeypatch.setattr(bench_steps, "prefill_state",
                        lambda model, batch, t, **kw: prefills.append(t) or real(model, batch,
                                                                               t, **kw))
    bench.run_bench(["dense"], [16], phases=("decode",), memory=("none",),
                    **{**TINY, "roofline_seconds": None})
    assert prefills == [16] * (bench.DECODE_BLOCKS + 1)   # every block from t = T; the state


# --- roofline --------------------------------------------------------------------------------

def test_records_carry_a_consistent_roofline(dense_records):
    for r in dense_records:
        assert r["peak_flops_per_s"] > 0 and r["peak_bytes_per_s"] > 0 and r["peak_launch_s"] > 0
        tokens = r["batch"] * (r["seq_len"] if r["phase"] == "train" else 1)
        assert r["flops_per_step"] == pytest.approx(r["flops_per_token"] * tokens)
        assert r["launches_per_step"] > 0 and r["bytes_per_step"] > 0
        assert r["counted_flops_per_step"] > 0 and r["matmul_flops_per_s"] > 0
        terms = {term: r[f"{term}_ms"] for term in roofline.TERMS}
        assert all(ms > 0 for ms in terms.values())
        assert r["roofline_ms"] == pytest.approx(sum(terms.values()))       # a CPU: they add
        assert r["roofline_bound"] == max(terms, key=terms.get)
        assert r["roofline_fraction"] == pytest.approx(r["roofline_ms"] / r["ms_per_step"])
        assert r["bound_ceiling"] is None and r["frac_of_bound_ceiling"] is None   # dense


def test_the_bound_ceiling_is_the_ratio_of_the_two_bounds():
    records = bench.run_bench(["honly"], [32], memory=("none",), options={"block_size": [8]},
                              **TINY)
    for phase in bench.PHASES:
        dense, honly = (r for r in records if r["phase"] == phase)
        assert honly["bound_ceiling"] == pytest.approx(dense["roofline_ms"] / honly["roofline_ms"])
        assert honly["frac_of_bound_ceiling"] == pytest.approx(
            honly["ratio_vs_dense"] / honly["bound_ceiling"])
    table = bench.format_table(records)
    assert "roof ceil" in table and "% roof ceil" not in table   # the notes say it


def test_the_header_gives_the_measured_peaks_and_the_table_the_bound(dense_records):
    table = bench.format_table(dense_records)
    header = table.splitlines()[0]
    flops, bandwidth = dense_records[0]["peak_flops_per_s"], dense_records[0]["peak_bytes_per_s"]
    assert f"matmul={flops / 1e9:,.1f} GFLOP/s" in header
    assert f"copy={bandwidth / 1e9:,.1f} GB/s" in header
    assert "bound" in table and "% roof" in table


def test_by_default_a_bench_call_has_no_probes_and_no_roofline_keys():
    untold = {key: value for key, value in TINY.items() if key != "roofline_seconds"}
    (record,) = bench.run_bench(["dense"], [16], phases=("train",), memory=("none",), **untold)
    assert record["flops_per_step"] > 0
    for key in ("roofline_bound", "roofline_ms", "roofline_fraction", "peak_flops_per_s",
                "peak_bytes_per_s", "peak_launch_s", "bytes_per_step", "launches_per_step",
                "compute_ms", "bound_ceiling"):
        assert record[key] is None, key
    table = bench.format_table([record])
    assert "matmul=" not in table
    header = table.splitlines()[1].split()
    assert "% ceil" in table and not {"bound", "roof"} & set(header)   # no empty columns
    assert "roof ceil" not in table and "bound:" not in table               # nor their legend


def test_with_probes_the_table_has_the_roofline_columns_and_their_legend(dense_records):
    table = bench.format_table(dense_records)
    assert {"bound", "roof"} <= set(table.splitlines()[1].split())
    assert "bound: the largest of the roofline's terms" in table



def test_measure_peaks_is_brief_and_positive():
    peaks = roofline.measure_peaks("cpu", "fp32", 0.0, matmul_n=128, copy_bytes=1 << 20)
    assert peaks.flops_per_s > 0 and peaks.bytes_per_s > 0 and peaks.dtype == "fp32"
    assert peaks.matmul_n == 128 and peaks.copy_bytes == 1 << 20 and peaks.seconds < 5
