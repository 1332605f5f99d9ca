"""The roofline's three terms: the operator count, the probes and the bound they set."""

import pytest
import torch

from blockmem_lite.measure import bench_table, roofline

PEAKS = roofline.Peaks(flops_per_s=1e9, bytes_per_s=1e8, dtype="fp32", matmul_n=1,
                       copy_bytes=1, seconds=0.0, launch_s=1e-5)


def count(launches=10, flops=0.0, bytes=0.0, matmul_s=0.0):
    return roofline.StepCount(launches, flops, bytes, matmul_s)


def test_the_count_sorts_operators_into_matmuls_views_and_others():
    a, b = torch.randn(32, 16), torch.randn(16, 8)

    def step():
        c = a @ b                     # mm: the compute term
        c = c.t()                     # a view: no launch
        return (c * 2).sum()          # two launches of other operators

    c = roofline.count_step(step, "cpu")
    assert c.launches == 3
    assert c.flops == 2 * 32 * 16 * 8 and c.matmul_s > 0
    # mul reads c (8x32) and writes its product; sum reads that and writes a scalar
    assert c.bytes == 4 * (8 * 32 + 8 * 32) + 4 * (8 * 32 + 1)


def test_the_count_sees_the_backward_and_a_causal_kernel_skips_half():
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    forward = roofline.count_step(lambda: layer(x), "cpu")
    both = roofline.count_step(lambda: layer(x).sum().backward(), "cpu")
    assert forward.flops == 2 * 4 * 16 * 8
    assert both.flops == 3 * forward.flops            # the backward: two more matmuls
    q = torch.randn(1, 2, 64, 8)
    full = roofline.count_step(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), "cpu")
    causal = roofline.count_step(lambda: torch.nn.functional.scaled_dot_product_attention(
        q, q, q, is_causal=True), "cpu")
    assert full.flops > 0 and causal.flops == pytest.approx(full.flops / 2)


def test_a_count_over_several_steps_is_per_step():
    a = torch.randn(8, 8)
    c = roofline.count_step(lambda: [a @ a + 1 for _ in range(6)], "cpu", steps=3)
    assert c.launches == 4 and c.flops == 2 * 2 * 8 ** 3


def test_a_tensor_read_twice_counts_once():
    a = torch.randn(100)
    assert roofline.count_step(lambda: a + a, "cpu").bytes == 2 * 4 * 100
    assert roofline.count_step(lambda: a.add_(1), "cpu").bytes == 4 * 100   # in place


def test_on_a_cpu_the_terms_add_and_the_largest_binds():
    limit = roofline.bound(count(launches=100, flops=2e6, bytes=1e5), PEAKS, "cpu")
    assert limit.compute_s == pytest.approx(0.002) and limit.memory_s == pytest.approx(0.001)
    assert limit.launch_s == pytest.approx(0.001)
    assert limit.seconds == pytest.approx(0.004) and limit.binding == "compute"
    assert roofline.bound(count(bytes=1e6), PEAKS, "cpu").binding == "memory"
    assert roofline.bound(count(launches=10_000), PEAKS, "cpu").binding == "launch"


def test_on_an_accelerator_launches_overlap_the_devices_work():
    busy = roofline.bound(count(flops=1e7, bytes=1e5), PEAKS, "cuda")
    assert busy.seconds == pytest.approx(0.011) and busy.binding == "compute"
    launch_bound = roofline.bound(count(launches=5000, flops=1e7), PEAKS, "cuda")
    assert launch_bound.seconds == pytest.approx(5000 * 1e-5)
    assert launch_bound.binding == "launch"


def test_a_missing_figure_gives_no_bound():
    assert roofline.bound(None, PEAKS, "cpu") is None
    assert roofline.bound(count(), None, "cpu") is None
    fields = bench_table.record_fields(None, PEAKS, "cpu", 1e6, 2.0)
    assert fields["roofline_ms"] is None and fields["roofline_bound"] is None


def test_a_records_fields_carry_the_terms_and_the_steps_own_matmul_speed():
    fields = bench_table.record_fields(count(launches=100, flops=2e6, bytes=1e5, matmul_s=0.004),
                                    PEAKS, "cpu", 2.1e6, ms_per_step=8.0)
    assert fields["roofline_ms"] == pytest.approx(4.0) and fields["roofline_fraction"] == 0.5
    assert fields["matmul_flops_per_s"] == pytest.approx(5e8)
    assert (fields["compute_ms"], fields["launches_per_step"]) == (pytest.approx(2.0), 100)


def test_the_probes_measure_each_limit():
    peaks = roofline.measure_peaks("cpu", seconds=0.0, matmul_n=64, copy_bytes=1 << 16)
    assert 0 < peaks.launch_s < 1e-3                   # microseconds, not a whole batch
    assert peaks.flops_per_s > 0 and peaks.bytes_per_s > 0
    with pytest.raises(ValueError, match="matmul_n"):
        roofline.measure_peaks("cpu", seconds=0.0, matmul_n=-1)


def test_the_bound_ceiling_fields():
    assert bench_table.bound_ceiling_fields(0.9, 2.0, 4.0) == {
        "bound_ceiling": 0.5, "frac_of_bound_ceiling": 1.8}
    assert bench_table.bound_ceiling_fields(None, 2.0, 4.0)["bound_ceiling"] is None     # dense
    assert bench_table.bound_ceiling_fields(0.9, None, 4.0)["frac_of_bound_ceiling"] is None


def _record(arch, frac, bound="compute", speed=None, ratio=1.0):
    return dict(arch=arch, variant="", phase="train", seq_len=256, ratio_vs_dense=ratio,
                frac_of_bound_ceiling=frac, roofline_bound=bound, matmul_flops_per_s=speed,
                peak_flops_per_s=150e9)


def test_a_record_above_its_ceiling_is_called_noise_or_given_what_the_bound_leaves_out():
    dense = _record("dense", None, speed=120e9, ratio=None)
    under, noisy = _record("bcmt", 0.97, speed=118e9), _record("honly", 1.04, speed=300e9)
    wide, local = _record("cat", 1.3, speed=210e9), _record("bcmt", 1.2, speed=121e9)
    chatty = _record("moc", 1.2, bound="launch")
    assert bench_table.ceiling_notes([dense, under]) == []
    noise, compute, memory, launch = bench_table.ceiling_notes(
        [dense, under, noisy, wide, local, chatty])
    assert "within the machine's noise" in noise and "honly train T=256 (104%)" in noise
    assert "bcmt" not in noise and "cat" not in noise
    assert "cat train T=256 (130%, 210 vs 120)" in compute and "faster per FLOP" in compute
    assert "bcmt train T=256 (120%)" in memory and "in the cache" in memory
    assert "moc train T=256 (120%)" in launch and "Python around each operator" in launch
