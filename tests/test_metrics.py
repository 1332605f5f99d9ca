"""metrics: the FLOP model reproduces the quoted ceilings (docs/MEASUREMENTS.md, The FLOP model);
timing and memory helpers."""

import dataclasses

import pytest
import torch

from blockmem_lite import ModelConfig, build_model
from blockmem_lite.measure import bench_steps
from blockmem_lite.measure import metrics as M
from blockmem_lite.measure.flops import (
    dense_decode_layer_flops,
    dense_layer_flops,
    flop_ceiling,
    lm_head_flops,
    training_flops_per_token,
)
from blockmem_lite.mechanisms import armt, bcmt, cat, moc

D = 256  # the ceilings are quoted at d = 256, backbone only


def ceilings(variant_layer_flops):
    """dense / variant per-layer FLOPs at T = 1k, 4k, 16k."""
    return [flop_ceiling(dense_layer_flops(D, t), variant_layer_flops(t))
            for t in (1024, 4096, 16384)]


def quoted(values, digits):
    return [round(v, d) for v, d in zip(values, digits, strict=True)]


def cfg(arch="dense", **kw):
    """A ModelConfig of the given arch (d=64, 3 layers, T=512 unless overridden)."""
    return ModelConfig(arch, **{"d_model": 64, "n_layer": 3, "n_head": 2, "seq_len": 512, **kw})


# --- FLOP model: the quoted ceilings (docs/MEASUREMENTS.md, The FLOP model) -------------

def test_block_local_ceilings_match_performance_md():
    got = ceilings(lambda t: bcmt.block_local_layer_flops(D, 128))
    assert quoted(got, (2, 2, 1)) == [1.28, 2.24, 6.1]


def test_cat_same_width_ceilings_match_performance_md():
    # C = 64, decoder width = d, compressor depth = decoder depth / 4; the W_f
    # projection is per model, not per layer, so the backbone-only figure leaves it out.
    got = ceilings(lambda t: cat.cat_layer_flops(D, 64, t, d_decoder=D, depth_ratio=0.25))
    assert quoted(got, (1, 2, 1)) == [1.0, 1.77, 4.6]


@pytest.mark.parametrize("n_mem_tokens,d_mem", [(16, 32), (8, 64)])
def test_armt_ceilings_match_performance_md(n_mem_tokens, d_mem):
    # The quoted ceiling does not state m and d_mem; both of these settings reproduce it.
    got = ceilings(lambda t: armt.armt_layer_flops(D, 128, n_mem_tokens, d_mem))
    assert quoted(got, (2, 2, 1)) == [1.04, 1.83, 5.0]


def test_armt_ceiling_depends_on_memory_size():
    big = ceilings(lambda t: armt.armt_layer_flops(D, 128, 16, 64))
    assert quoted(big, (2, 2, 1)) != [1.04, 1.83, 5.0]


# --- FLOP model: the formulas term by term ------------------------------------------------

def test_dense_and_block_local_formulas():
    assert dense_layer_flops(256, 1024) == 24 * 256**2 + 2 * 1024 * 256
    assert dense_decode_layer_flops(256, 1024) == 24 * 256**2 + 4 * 1024 * 256
    assert bcmt.block_local_layer_flops(256, 128) == 24 * 256**2 + 2 * 128 * 256
    # a block as long as the sequence is dense attention
    assert bcmt.block_local_layer_flops(64, 512) == dense_layer_flops(64, 512)


def test_cat_armt_moc_head_formulas():
    d, c, t = 64, 8, 256
    decoder = (1 + 1 / c) * (24 * 128**2 + 2 * 128 * (c + t / c))
    assert cat.cat_decoder_layer_flops(128, c, t) == pytest.approx(decoder)
    assert cat.cat_compressor_flops(d, c, 0.5) == pytest.approx(
        0.5 * (24 * d**2 + 4 * d * (c + 1)))
    assert cat.cat_projection_flops(d, 128) == 2 * 128 * d
    s, m, dm = 32, 4, 16
    layer = ((1 + m / s) * (24 * d**2 + 2 * d * (s + m)) + 14 * d * dm
             + (m / s) * (2 * d**2 + 26 * d * dm))
    assert armt.armt_layer_flops(d, s, m, dm) == pytest.approx(layer)
    per_route = 2 * d * 17 + 4 * d**2 * 3 * 8                  # router + K/V of 3 chapters
    assert moc.moc_extra_flops(d, 17, 2, 8) == 4 * d**2 + 4 * d * 3 * 8 + per_route
    assert moc.moc_extra_flops(d, 17, 2, 8, route_every=32) == pytest.approx(
        4 * d**2 + 4 * d * 3 * 8 + per_route / 32)
    assert lm_head_flops(d, 256) == 2 * d * 256


def test_model_flops_sum_layers_and_head_through_the_registry():
    head = lm_head_flops(64, 256)
    assert M.flops_per_token(cfg()) == 3 * dense_layer_flops(64, 512) + head
    assert M.flops_per_token(cfg(), decode=True) == 3 * dense_decode_layer_flops(64, 512) + head
    assert M.flops_per_token(cfg(), 128) == 3 * dense_layer_flops(64, 128) + head
    assert M.flops_per_token(cfg("honly", block_size=32)) == (
        3 * bcmt.block_local_layer_flops(64, 32) + head)
    assert M.flops_per_token(cfg("armt", segment_size=128, n_mem_tokens=4, d_mem=16)) == (
        pytest.approx(3 * armt.armt_layer_flops(64, 128, 4, 16) + head))
    moc_cfg = cfg("moc", n_chapters=17, top_k=2, chapter_len=8, routing="sequence")
    assert M.flops_per_token(moc_cfg) == pytest.approx(                # one memory layer, 1
        3 * dense_layer_flops(64, 512) + moc.moc_extra_flops(64, 17, 2, 8, 512) + head)
    assert M.flops_per_token(moc_cfg, decode=True) == pytest.approx(   # the route amortised
        3 * dense_decode_layer_flops(64, 512) + moc.moc_extra_flops(64, 17, 2, 8, 512) + head)


def test_model_flops_cat_counts_compressor_depth_projection_and_wide_head():
    got = M.flops_per_token(cfg("cat", n_layer=8, seq_len=256, chunk_size=16, decoder_width=2))
    expected = (8 * cat.cat_decoder_layer_flops(128, 16, 256)
                + 2 * (24 * 64**2 + 4 * 64 * 17)          # compressor depth max(1, 8 // 4) = 2
                + cat.cat_projection_flops(64, 128) + lm_head_flops(128, 256))
    assert got == pytest.approx(expected)


def test_window_longer_than_sequence_is_capped():
    long_block = cfg("honly", n_layer=2, seq_len=128, block_size=128)
    assert M.flops_per_token(long_block, 100) == M.flops_per_token(cfg(n_layer=2), 100)


def test_training_flops_and_ceiling():
    assert training_flops_per_token(10.0) == 30.0
    assert flop_ceiling(5.0, 5.0) == 1.0
    assert flop_ceiling(6.0, 2.0) == 3.0


def test_cat_decode_flops_count_chunk_vectors_and_half_the_own_chunk():
    c, t, width = 16, 4096, 128
    layer = (1 + 1 / c) * (24 * width**2 + 4 * width * (t / c + c / 2))
    assert cat.cat_decode_layer_flops(width, c, t) == pytest.approx(layer)
    wide = cfg("cat", n_layer=4, seq_len=t, chunk_size=c, decoder_width=2)
    compressor = 24 * 64**2 + 4 * 64 * (c + 1)                 # one layer (4 // 4)
    assert M.flops_per_token(wide, decode=True) == pytest.approx(
        4 * layer + compressor + 2 * width * 64 + 2 * width * 256)
    # at long context the decode step costs far less than dense's 4·t·d per key
    dense = M.flops_per_token(cfg(n_layer=4, seq_len=t), decode=True)
    same_width = M.flops_per_token(cfg("cat", n_layer=4, seq_len=t, chunk_size=c,
                                       decoder_width=1), decode=True)
    assert same_width < dense / 2


def test_flop_model_errors_name_the_parameter():
    with pytest.raises(ValueError, match="seq_len=0"):
        dense_layer_flops(64, 0)
    with pytest.raises(ValueError, match="variant_flops=0"):
        flop_ceiling(1.0, 0)
    with pytest.raises(ValueError, match="block_size=0"):
        bcmt.block_local_layer_flops(64, 0)
    with pytest.raises(ValueError, match="route_every=0"):
        moc.moc_extra_flops(64, 17, 2, 8, route_every=0)


def test_iso_flop_dense_config_works_for_any_mechanism_with_a_flop_model():
    wide = cfg("cat", n_layer=4, seq_len=256, chunk_size=16, decoder_width=2)
    dense = M.iso_flop_dense_config(wide)
    assert dense.arch == "dense" and dense.n_layer > wide.n_layer
    gap = lambda n: abs(M.flops_per_token(dataclasses.replace(dense, n_layer=n))  # noqa: E731
                        - M.flops_per_token(wide))
    assert gap(dense.n_layer) <= min(gap(dense.n_layer - 1), gap(dense.n_layer + 1))


# --- timing ----------------------------------------------------------------------------

def test_time_interleaved_alternates_and_counts():
    calls = []
    fns = [lambda: calls.append("A"), lambda: calls.append("B")]
    times = bench_steps.time_interleaved(fns, warmup=2, repeats=3)
    assert calls == ["A", "B"] * 5
    assert [len(t) for t in times] == [3, 3]
    assert all(t >= 0 for row in times for t in row)


def test_summarize_times_uses_the_median():
    timing = bench_steps.summarize_times([1.0, 2.0, 100.0], tokens_per_step=10)
    assert timing.tokens_per_s == 5.0
    assert timing.ms_per_step == 2000.0


def test_measure_tokens_per_s_pins_and_restores_threads():
    before = torch.get_num_threads()
    seen = []
    timing = bench_steps.measure_tokens_per_s(lambda: seen.append(torch.get_num_threads()), 100,
                                    warmup=1, repeats=5, threads=1)
    assert seen == [1] * 6
    assert torch.get_num_threads() == before
    assert timing.tokens_per_s > 0 and len(timing.times_s) == 5


def test_timing_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats=0"):
        bench_steps.time_interleaved([lambda: None], warmup=1, repeats=0)
    with pytest.raises(ValueError, match="warmup=-1"):
        bench_steps.time_interleaved([lambda: None], warmup=-1, repeats=1)
    with pytest.raises(ValueError, match="threads=0"):
        with bench_steps.pinned_threads(0):
            pass


# --- workloads ---------------------------------------------------------------------------

def tiny_model(seq_len=32):
    return build_model(ModelConfig(d_model=32, n_layer=2, n_head=2, seq_len=seq_len))


def test_train_step_makes_and_clears_gradients():
    model = tiny_model()
    grads = []
    model.head.weight.register_hook(lambda g: grads.append(g.abs().sum().item()))
    bench_steps.make_train_step(model, batch=2, seq_len=16)()
    assert grads and grads[0] > 0
    assert all(p.grad is None for p in model.parameters())


def test_decode_step_state_is_sized_for_the_timed_calls():
    model = tiny_model()
    step = bench_steps.make_decode_step(model, batch=1, context_len=16, n_calls=3, burst=2)
    for _ in range(3):
        step()
    with pytest.raises(ValueError, match="KV cache is full"):
        step()


# --- memory ------------------------------------------------------------------------------

def test_saved_tensor_bytes_dedups_storages_and_excludes():
    a = torch.randn(1000, requires_grad=True)
    view = a.view(10, 100)
    fn = lambda: (view * a.view(10, 100)).sum()  # noqa: E731  (saves both views of a)
    assert M.saved_tensor_bytes(fn) == 1000 * 4
    assert M.saved_tensor_bytes(fn, exclude=[a]) == 0
    assert M.saved_tensor_bytes(lambda: a.detach() * 2) == 0   # no graph, nothing saved


def test_saved_tensor_bytes_is_deterministic_and_linear_in_t_for_dense():
    model = tiny_model(seq_len=128)
    sizes = {}
    for t in (32, 64, 128):
        forward = bench_steps.make_train_forward(model, batch=2, seq_len=t)
        first = M.saved_tensor_bytes(forward, exclude=model.parameters())
        assert M.saved_tensor_bytes(forward, exclude=model.parameters()) == first
        sizes[t] = first
    # flash SDPA saves O(T) activations: doubling T doubles the bytes (to 0.1%)
    assert sizes[64] == pytest.approx(2 * sizes[32], rel=1e-3)
    assert sizes[128] == pytest.approx(2 * sizes[64], rel=1e-3)


def test_saved_tensor_bytes_sees_the_quadratic_reference_attention():
    model = tiny_model(seq_len=128)
    params = list(model.parameters())

    def saved(t):
        x = torch.randint(0, 256, (2, t))
        return M.saved_tensor_bytes(lambda: model(x, x, reference=True).loss, exclude=params)

    s32, s64, s128 = saved(32), saved(64), saved(128)
    excess_small, excess_big = s64 - 2 * s32, s128 - 2 * s64    # the T^2 part only
    assert excess_small > 0
    assert excess_big == pytest.approx(4 * excess_small, rel=0.01)


def test_max_rss_bytes_is_a_peak_of_the_current_rss():
    from blockmem_lite.runtime import process_rss_bytes

    current = process_rss_bytes()
    assert M.max_rss_bytes() >= current > 10 * 2**20


def test_peak_rss_subprocess_reads_a_fresh_process():
    spec = {"model": {"d_model": 32, "n_layer": 2, "n_head": 2, "seq_len": 64},
            "phase": "train", "batch": 2, "seq_len": 64, "threads": 1}
    reading = M.peak_rss_subprocess(spec, timeout=300)
    assert isinstance(reading.peak_bytes, int) and isinstance(reading.base_bytes, int)
    assert reading.peak_bytes >= reading.base_bytes > 50 * 2**20   # torch alone is > 50 MiB
    assert reading.delta_bytes == reading.peak_bytes - reading.base_bytes


def test_peak_rss_subprocess_errors_are_clear():
    with pytest.raises(ValueError, match="phase"):
        M.peak_rss_subprocess({"model": {}, "phase": "generate", "batch": 1, "seq_len": 8})
    with pytest.raises(ValueError, match="batch"):
        M.peak_rss_subprocess({"model": {}, "phase": "train", "batch": 0, "seq_len": 8})
    bad_model = {"model": {"d_model": 30, "n_head": 4}, "phase": "train", "batch": 1,
                 "seq_len": 8}
    with pytest.raises(RuntimeError, match="n_head=4"):
        M.peak_rss_subprocess(bad_model, timeout=300)


def test_cuda_peak_bytes_refuses_cpu():
    with pytest.raises(ValueError, match="needs CUDA"):
        M.cuda_peak_bytes(lambda: None, "cpu")



def test_bcmt_flops_add_the_gate_to_block_local():
    d, L, T = 256, 128, 1024
    extra = bcmt.bcmt_layer_flops(d, L, T) - bcmt.block_local_layer_flops(d, L)
    # the gate on U (2·d²) dominates; per-block terms and the N x N mix are small
    assert 2 * d * d < extra < 2.1 * d * d
    head = lm_head_flops(d, 256)
    dense = M.flops_per_token(cfg(d_model=d, n_layer=4, n_head=4, seq_len=T)) - head
    with_memory = M.flops_per_token(cfg("bcmt", d_model=d, n_layer=4, n_head=4, seq_len=T,
                                        block_size=L)) - head
    assert flop_ceiling(dense, with_memory) == pytest.approx(1.185, abs=0.005)


def test_saved_tensor_bytes_frees_the_activations():
    import gc
    import weakref

    layer = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64, requires_grad=True)
    outputs = []

    def fn():
        y = torch.sigmoid(layer(x))       # sigmoid saves its own output
        outputs.append(weakref.ref(y))
        return y

    assert M.saved_tensor_bytes(fn) > 0
    gc.collect()
    assert outputs[0]() is None, "the saved activation outlived saved_tensor_bytes"
