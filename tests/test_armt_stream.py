"""ARMT.stream (constant-memory inference) and the bench's inference sweep over total length."""

import pytest
import torch

from blockmem_lite import ModelConfig, build_model, preset
from blockmem_lite.measure import bench, bench_steps, metrics
from blockmem_lite.mechanisms import armt
from blockmem_lite.models.armt import ARMTState
from blockmem_lite.models.dense import DenseState
from blockmem_lite.tools.bench_command import bench_main

S, M, D_MEM = 8, 2, 4


def _model(**kw):
    settings = dict(segment_size=S, n_mem_tokens=M, d_mem=D_MEM, **kw)
    model = build_model(preset("tiny", arch="armt", **settings)).double().eval()
    for layer in model.memory.values():       # W_V = 0 at init would leave the memory empty
        torch.nn.init.normal_(layer.w_v.weight, std=0.3)
    return model


def _tokens(t, batch=2, seed=0):
    return torch.randint(0, 256, (batch, t), generator=torch.Generator().manual_seed(seed))


def _same_state(a: ARMTState, b: ARMTState, atol=0.0) -> None:
    assert a.position == b.position
    for m_a, m_b in zip(a.memory, b.memory, strict=True):
        assert (m_a is None) == (m_b is None)
        if m_a is not None:
            for x, y in zip(m_a, m_b, strict=True):
                assert torch.allclose(x, y, rtol=0, atol=atol)
    for c_a, c_b in zip(a.caches, b.caches, strict=True):
        assert c_a.length == c_b.length
        n = c_a.length
        assert torch.allclose(c_a.k[:, :, :n], c_b.k[:, :, :n], rtol=0, atol=atol)
        assert torch.allclose(c_a.v[:, :, :n], c_b.v[:, :, :n], rtol=0, atol=atol)


@pytest.mark.parametrize("t", [1, S - 3, S, 2 * S + 3, 4 * S])
def test_stream_equals_prefill(t):
    model = _model()
    x = _tokens(t)
    logits, state = model.prefill(x)
    last, streamed = model.stream(x)
    assert last.shape == (2, 256)
    assert torch.equal(last, logits[:, -1])
    _same_state(streamed, state)
    if t > S:
        assert streamed.memory[0] is not None and streamed.memory[0][0].abs().max() > 0


def test_stream_in_pieces_equals_one_stream_and_decoding_continues():
    model = _model()
    x = _tokens(5 * S + 1)
    whole_last, whole = model.stream(x[:, :4 * S + 2])
    last, state = None, None
    for a, b in [(0, 3), (3, S + 5), (S + 5, 2 * S), (2 * S, 4 * S + 2)]:   # splits off-segment
        last, state = model.stream(x[:, a:b], state)
    assert torch.allclose(last, whole_last, atol=1e-10)
    _same_state(state, whole, atol=1e-10)
    full = model(x).logits                                                # (B, 5S+1, V)
    pieces = []
    for t in range(4 * S + 2, x.shape[1]):
        step_logits, state = model.step(x[:, t], state)
        pieces.append(step_logits)
    assert torch.allclose(torch.stack(pieces, 1), full[:, 4 * S + 2:], atol=1e-10)


def test_stream_keeps_a_constant_state_without_gradients():
    model = _model().train()
    short_last, short = model.stream(_tokens(2 * S))
    _, long = model.stream(_tokens(12 * S + 5))
    assert short.nbytes() == long.nbytes()
    assert not short_last.requires_grad
    assert not any(t.requires_grad for t in long.tensors())
    assert all(c.capacity == S + M for c in long.caches)


def test_stream_rejects_empty_input_and_a_state_of_another_batch():
    model = _model()
    with pytest.raises(ValueError, match="T=0"):
        model.stream(torch.zeros(1, 0, dtype=torch.long))
    _, state = model.stream(_tokens(S + 2, batch=2))
    with pytest.raises(ValueError, match="batch 3.*batch 2"):
        model.stream(_tokens(4, batch=3), state)


def test_make_infer_step_streams_armt_and_prefills_dense():
    armt = build_model(preset("tiny", arch="armt", segment_size=S).model)
    dense = build_model(preset("tiny").model)
    state = bench_steps.make_infer_step(armt, 1, 3 * S + 1)()
    assert isinstance(state, ARMTState) and state.position == 3 * S + 1
    dense_state = bench_steps.make_infer_step(dense, 1, 3 * S + 1)()
    assert isinstance(dense_state, DenseState) and dense_state.position == 3 * S + 1


def test_sweep_options_parse():
    assert armt.parse_infer_lengths("none") == []
    assert armt.parse_infer_lengths("2048,65536") == [2048, 65536]
    assert armt.dense_infer_limit("auto", "cpu") == armt.CPU_DENSE_INFER_MAX
    assert armt.dense_infer_limit("auto", "cuda") is None
    assert armt.dense_infer_limit(4096, "cpu") == 4096
    assert armt.parse_dense_max("4096") == 4096 and armt.parse_dense_max("auto") == "auto"
    with pytest.raises(ValueError, match="--infer-dense-max='1,2'"):
        armt.parse_dense_max("1,2")
    with pytest.raises(ValueError, match="infer_dense_max=0"):
        armt.dense_infer_limit(0, "cpu")
    with pytest.raises(ValueError, match="--infer-len='0'"):
        armt.parse_infer_lengths("0")


TINY = dict(d_model=32, n_layer=1, n_head=2, vocab_size=256, threads=1, warmup=1, repeats=1,
            phases=("infer",), progress=False, roofline_seconds=0.0)


def _sweep(lengths, sizes, dense_max="auto", **kw):
    options = {"infer_len": lengths, "segment_size": sizes, "infer_dense_max": dense_max}
    return bench.run_bench(["armt"], [32], options=options, **{**TINY, **kw})


def test_inference_sweep_records_and_the_dense_limit():
    records = _sweep([128, 32, 64], [8, 16], dense_max=64, memory=("none",))
    assert [(r["arch"], r["variant"], r["seq_len"]) for r in records] == [
        (arch, variant, t) for t in (32, 64, 128)
        for arch, variant in [("dense", ""), ("armt", "S=8"), ("armt", "S=16")]
        if arch == "armt" or t <= 64]
    for r in records:
        assert set(bench.RECORD_KEYS) <= r.keys()
        assert r["phase"] == "infer" and r["memory_method"] == "none" and r["tokens_per_s"] > 0
        assert r["shortest_len"] == 32 and r["memory_vs_shortest"] is None
        assert r["tokens_per_s_vs_shortest"] > 0
        assert r["flops_per_step"] == pytest.approx(r["flops_per_token"] * r["seq_len"])
        assert r["bytes_per_step"] > 0 and r["launches_per_step"] > 0     # one counted call
        assert r["roofline_bound"] in ("compute", "memory", "launch")
        assert r["roofline_fraction"] == pytest.approx(r["roofline_ms"] / r["ms_per_step"])
        if r["ratio_vs_dense"] is not None:
            assert r["bound_ceiling"] > 0 and r["frac_of_bound_ceiling"] > 0
    state = {(r["variant"], r["seq_len"]): r["state_bytes"] for r in records}
    assert state[("", 64)] == 2 * state[("", 32)]                         # dense: the KV cache
    assert state[("S=8", 32)] == state[("S=8", 128)] < state[("S=16", 128)]   # ARMT: constant
    armt_64 = [r for r in records if r["arch"] == "armt" and r["seq_len"] == 64]
    assert all(r["ratio_vs_dense"] > 0 and r["flop_ceiling"] > 0 and r["note"] is None
               for r in armt_64)
    longest = [r for r in records if r["seq_len"] == 128]
    assert all(r["ratio_vs_dense"] is None and "--infer-dense-max=64" in r["note"]
               for r in longest)
    table = bench.format_table(records)
    assert "ARMT S=8: peak(128) / peak(32)" in table and "dense not run at T=128" in table


def test_inference_sweep_measures_peak_rss_in_a_subprocess():
    records = _sweep([32], [16], memory=("rss",))
    assert [r["arch"] for r in records] == ["dense", "armt"]
    for r in records:
        assert r["memory_method"] == "rss_subprocess"
        assert r["memory_bytes"] == r["rss_peak_bytes"] > r["rss_base_bytes"] > 0
        assert r["memory_vs_shortest"] == 1.0


def test_cli_prints_the_inference_sweep(capsys):
    code = bench_main(["--arch", "armt", "--seq-len", "32", "--phases", "train,infer",
                       "--d-model", "32", "--n-layer", "1", "--n-head", "2", "--warmup", "1",
                       "--repeats", "1", "--memory", "none", "--segment-size", "16",
                       "--infer-len", "32,64"])
    out = capsys.readouterr().out
    assert code == 0
    assert "ARMT inference sweep" in out and "ARMT S=16: peak(64) / peak(32)" in out
    assert bench_main(["--arch", "armt", "--infer-len", "2k"]) == 2
    assert "--infer-len='2k'" in capsys.readouterr().err


def test_flop_model_of_a_memory_subset():
    d, s, m, dm = 64, 16, 4, 8
    plain = (1 + m / s) * (24 * d * d + 2 * d * (s + m))    # a layer that neither reads nor writes
    memory = 14 * d * dm + (m / s) * (2 * d * d + 26 * d * dm)
    head = 2 * d * 256

    def cfg(layers):
        return ModelConfig("armt", d_model=d, n_layer=4, n_head=2, seq_len=4096, segment_size=s,
                           n_mem_tokens=m, d_mem=dm, memory_layers=layers)

    flops = [metrics.flops_per_token(cfg(tuple(range(k)))) for k in range(5)]
    assert flops == pytest.approx([4 * plain + k * memory + head for k in range(5)])
    assert metrics.flops_per_token(cfg(None)) == flops[4]
    decode = metrics.flops_per_token(cfg((0,)), decode=True)
    assert decode == pytest.approx(metrics.flops_per_token(cfg(None), decode=True)
                                   - 3 * armt.armt_memory_flops(d, s, m, dm, decode=True))
