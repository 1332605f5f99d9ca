"""bench: MoC variants (--bank-tokens, --top-k) and the memory-read timing records."""

import json

import pytest
import torch

from blockmem_lite import ModelConfig
from blockmem_lite.measure import bench, bench_steps, metrics
from blockmem_lite.mechanisms import moc
from blockmem_lite.models.moc import MemoryRead
from blockmem_lite.tools.bench_command import bench_main, bench_parser

TINY = dict(d_model=16, n_layer=1, n_head=2, batch=1, threads=1, warmup=1, repeats=1,
            decode_burst=2, memory=("none",), progress=False)


@pytest.fixture(scope="module")
def records():
    return bench.run_bench(["moc"], [16], options={"bank_tokens": [64, 128], "top_k": [1, 2]}, **TINY)


def test_moc_variants_are_benched_with_dense_in_train_and_decode(records):
    timed = [(r["arch"], r["variant"], r["phase"]) for r in records if r["phase"] != "read"]
    variants = ["bank=64 k=1", "bank=64 k=2", "bank=128 k=1", "bank=128 k=2"]
    assert timed == [("dense", "", "train"), *[("moc", v, "train") for v in variants],
                     ("dense", "", "decode"), *[("moc", v, "decode") for v in variants]]
    train = next(r for r in records if r["variant"] == "bank=128 k=2" and r["phase"] == "train")
    assert train["overrides"] == {"n_chapters": 8, "chapter_len": 16, "top_k": 2}
    cfg = ModelConfig(arch="moc", d_model=16, n_layer=1, n_head=2, seq_len=16,
                      **train["overrides"])
    assert train["flops_per_token"] == pytest.approx(3 * metrics.flops_per_token(cfg))
    assert train["flop_ceiling"] < 1                              # MoC adds work
    decode = next(r for r in records if r["arch"] == "moc" and r["phase"] == "decode")
    assert decode["flop_ceiling"] < 1 and decode["state_bytes"] > 0   # the held route's read


def test_read_records_compare_routed_and_whole_bank_reads(records):
    reads = [r for r in records if r["phase"] == "read"]
    assert [r["variant"] for r in reads] == [
        "full bank=64", "routed bank=64 k=1", "routed bank=64 k=2",
        "full bank=128", "routed bank=128 k=1", "routed bank=128 k=2"]
    for r in reads:
        assert set(bench.RECORD_KEYS) <= set(r)
        assert r["arch"] == "moc" and r["seq_len"] == 16 and r["batch"] == 1
        assert r["tokens_per_s"] > 0 and r["memory_method"] == "none"
    full = {r["bank_tokens"]: r for r in reads if r["top_k"] is None}
    for r in (r for r in reads if r["top_k"] is not None):
        reference = full[r["bank_tokens"]]
        assert r["read_tokens"] == (r["top_k"] + 1) * 16
        assert r["ratio_vs_dense"] == pytest.approx(reference["ms_per_step"] / r["ms_per_step"])
        ceiling = reference["flops_per_token"] / r["flops_per_token"]
        assert r["flop_ceiling"] == pytest.approx(ceiling)
        assert r["frac_of_ceiling"] == pytest.approx(r["ratio_vs_dense"] / ceiling)
    assert full[128]["read_tokens"] == 128 and full[128]["ratio_vs_dense"] is None
    assert reads[0]["flops_per_token"] == pytest.approx(moc.read_flops_per_token(16, 64, 16))


def test_read_table_and_cli(tmp_path, capsys):
    path = tmp_path / "moc.json"
    code = bench_main(["--arch", "dense,moc", "--bank-tokens", "64", "--top-k", "2", "--seq-len",
                       "16", "--phases", "train,read", "--memory", "none", "--json", str(path),
                       "--d-model", "16", "--n-layer", "1", "--n-head", "2", "--batch", "1",
                       "--threads", "1", "--warmup", "1", "--repeats", "1"])
    assert code == 0
    out = capsys.readouterr().out
    assert "MoC memory read" in out and "speed-up vs full" in out
    saved = json.loads(path.read_text())
    assert [r["phase"] for r in saved] == ["train", "train", "read", "read"]
    assert "[moc]" in bench_parser().format_help()


def test_read_workloads_compute_the_reads_they_time():
    read = MemoryRead(16, 2, moc.BENCH_CHAPTER_LEN, 1e-5)
    bank, queries = torch.randn(64, 16), torch.randn(1, 16, 16)
    full, routed = moc.read_workloads(read, bank, queries, [2], 8, torch.Generator())
    assert full().shape == routed()[0].shape == (1, 16, 16)


@pytest.mark.parametrize("bank_tokens, top_k, message", [
    (100, 1, r"--bank-tokens=100 is not allowed: with --top-k=1 expected a multiple of 16"),
    (32, 2, r"--bank-tokens=32 is not allowed: with --top-k=2 .*>= 48 tokens"),
])
def test_bad_bank_options_are_clear_errors(bank_tokens, top_k, message):
    with pytest.raises(ValueError, match=message):
        moc.bank_overrides(bank_tokens, top_k)
    with pytest.raises(ValueError, match=message):        # before any timing starts
        bench.run_bench(["moc"], [8], phases=("read",),
                        options={"bank_tokens": [bank_tokens], "top_k": [top_k]}, **TINY)


def test_read_timing_interleaves_routed_reads_then_whole_bank_reads(monkeypatch):
    counts = []
    real = bench_steps.time_interleaved

    def spy(step_fns, **kw):
        counts.append(len(step_fns))
        return real(step_fns, **kw)

    monkeypatch.setattr(bench_steps, "time_interleaved", spy)
    reads = bench.run_bench(["moc"], [8], phases=("read",),
                            options={"bank_tokens": [64, 128], "top_k": [1, 2]}, **TINY)
    assert counts == [4, 2]                      # routed reads (2 k x 2 banks), then full reads
    assert {r["routing_window"] for r in reads} == {8}          # the default window, capped at T
    routed = reads[1]
    assert routed["flops_per_token"] == pytest.approx(moc.read_flops_per_token(16, 32, 8))
    assert routed["vs_smallest"] == 1.0 and reads[4]["vs_smallest"] > 0
