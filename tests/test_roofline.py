"""The roofline's three terms: the operator counter, the probes and the bound they set."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from blockmem_lite.measure import opcount, roofline

PEAKS = roofline.Peaks(flops_per_s=1e9, bytes_per_s=1e8, dtype="fp32", matmul_n=1,
                       copy_bytes=1, seconds=0.0, launch_s=1e-5)


def count(**fields):
    base = dict(launches=10, heavy_ops=2, views=0, heavy_s=0.0, heavy_flops=0.0,
                other_bytes=0.0, host_share=0.0)
    return opcount.StepCount(**{**base, **fields})


def test_the_counter_sorts_operators_into_heavy_views_and_others():
    a, b = torch.randn(32, 16), torch.randn(16, 8)

    def step():
        c = a @ b                     # mm: heavy, replayed
        c = c.t()                     # a view: no launch
        return (c * 2).sum()          # two launches of other operators

    c = opcount.count_step(step, "cpu")
    assert (c.heavy_ops, c.views, c.launches, c.other_launches) == (1, 1, 3, 2)
    assert c.heavy_flops == 2 * 32 * 16 * 8 and c.heavy_s > 0 and c.other_s > 0
    # mul reads c (8x32) and writes its product; sum reads that and writes a scalar
    assert c.other_bytes == 4 * (8 * 32 + 8 * 32) + 4 * (8 * 32 + 1)
    assert 0.0 <= c.host_share <= 1.0


def test_a_call_is_priced_at_its_fastest_replay_in_the_run():
    a = torch.randn(64, 64)
    cache = opcount.ReplayCache()
    first = opcount.count_step(lambda: [a @ a for _ in range(3)], "cpu", cache)
    assert len(cache) == 1 and first.heavy_ops == 3
    assert first.heavy_s == pytest.approx(3 * next(iter(cache.values())))
    (key,) = cache
    cache[key] = 1.0                                       # a slow moment, then a later replay
    opcount.count_step(lambda: a @ a, "cpu", cache)
    assert len(cache) == 1 and cache[key] < 1.0            # the same signature: the faster one
    assert first.priced(cache).heavy_s == pytest.approx(3 * cache[key])
    opcount.count_step(lambda: a[:, :32] @ a[:32], "cpu", cache)
    assert len(cache) == 2


def test_the_sweep_prices_every_call_of_a_phase_again_on_fresh_tensors():
    a, acc = torch.randn(64, 64), torch.zeros(4)
    cache = opcount.ReplayCache()
    first = opcount.count_step(lambda: a @ a, "cpu", cache, caches=())
    second = opcount.count_step(lambda: acc.add_(1), "cpu", cache, caches=())
    mm, add = (key for key, _, _ in first.tally + second.tally)
    cache[mm] = cache[add] = 1.0                    # both counted in a slow moment
    swept = opcount.sweep(cache, [mm, add], "cpu")
    assert swept == 2 and cache[mm] < 1.0 and cache[add] < 1.0
    assert first.priced(cache).heavy_s == pytest.approx(cache[mm])
    assert torch.equal(acc, torch.full((4,), 2.0))  # the step's own tensors are left alone
    assert cache.replays[mm] == 2                   # the count's replay, then the sweep's
    cache[mm] = 1.0
    assert opcount.sweep(cache, [add], "cpu") == 1 and cache[mm] == 1.0   # only those asked


def test_the_sweep_times_its_shape_check_as_the_replays_first_call():
    a, other = torch.randn(256, 256), torch.zeros(1 << 18)     # 256 KiB, 1 MiB
    cache = opcount.ReplayCache()
    opcount.count_step(lambda: (a @ a, other.add_(1)), "cpu", cache, caches=(64 << 10,))
    (key,) = [key for key in cache if "mm" in key[0][0]]
    assert key[1] == 1                              # replayed cold: one call per timed round

    class Calls(TorchDispatchMode):
        mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Calls.mm += func is torch.ops.aten.mm.default
            return func(*args, **(kwargs or {}))
    with Calls():
        assert opcount.sweep(cache, [key], "cpu") == 1
    assert Calls.mm == 1 + opcount.SWEEP_ROUNDS     # the check, then the timed rounds only


def test_the_sweep_takes_the_calls_that_make_up_most_of_a_step():
    cache = opcount.ReplayCache()
    cache.update({"big": 1.0, "mid": 0.5, "small": 0.01})
    step = count(tally=(("small", 10, False), ("big", 6, True), ("mid", 3, False)))
    assert step.costliest_calls(cache, share=0.9) == ["big", "mid"]   # 6 + 1.5 of 7.6 s
    assert step.costliest_calls(cache, share=0.5) == ["big"]
    assert step.costliest_calls(cache, share=1.0) == ["big", "mid", "small"]


def test_a_call_whose_work_depends_on_its_values_keeps_the_price_of_its_count():
    mask, x = torch.tensor([True, False, True, True]), torch.randn(4, 8)
    cache = opcount.ReplayCache()
    count = opcount.count_step(lambda: x[mask], "cpu", cache, caches=())
    keys = [key for key, _, _ in count.tally]
    for key in keys:
        cache[key] = 1.0
    swept = opcount.sweep(cache, keys, "cpu")
    kept = [key for key in keys if cache[key] == 1.0]
    assert kept and swept == len(keys) - len(kept)      # all-False mask: another shape
    assert all(key not in cache.calls for key in kept)  # and never swept again


def test_swept_tensors_keep_the_layout_of_the_step():
    base = torch.randn(3, 1)
    layouts = [base.expand(3, 5), torch.randn(5, 3).t(), torch.zeros(0, 4),
               torch.arange(6).view(2, 3), torch.ones(2, dtype=torch.bool)]
    for tensor in layouts:
        made = opcount._materialise(opcount._template(tensor), torch.Generator())
        assert (made.shape, made.stride(), made.dtype) == \
            (tensor.shape, tensor.stride(), tensor.dtype)
        if not tensor.dtype.is_floating_point:
            assert not made.any()                       # an index is always in range
        elif made.numel():
            assert 0.5 <= made.min() and made.max() < 1.0


def test_operators_that_write_are_replayed_on_copies():
    a, out = torch.randn(8, 8), torch.zeros(8, 8)
    c = opcount.count_step(lambda: torch.mm(a, a, out=out), "cpu")
    assert c.heavy_ops == 0 and c.launches == 1 and c.other_bytes == 2 * 8 * 8 * 4
    assert torch.equal(out, a @ a)                          # written once, by the step itself
    acc = torch.zeros(4)
    opcount.count_step(lambda: acc.add_(1), "cpu", caches=())
    assert torch.equal(acc, torch.full((4,), 2.0))   # count_step's two calls; replays: copies
    opcount.count_step(lambda: acc.add_(1), "cpu", caches=(1 << 20,))
    assert torch.equal(acc, torch.full((4,), 5.0))   # and a third: the reuse distances


def test_a_count_over_several_steps_is_per_step():
    a = torch.randn(4, 4)
    c = opcount.count_step(lambda: [a + 1 for _ in range(6)], "cpu", steps=3)
    assert c.launches == 2 and c.other_bytes == pytest.approx(2 * 2 * 16 * 4)


def test_a_call_whose_data_the_step_touched_longer_ago_than_the_cache_holds_is_replayed_cold():
    a, b = torch.zeros(512, 1024), torch.zeros(512, 1024)          # 2 MiB each
    calls = []

    def step():                  # in place: each call reads and writes one tensor, 2 MiB
        calls.append(1)
        a.add_(1)                # 0 MiB since a was last touched (the previous call's end)
        b.add_(1)                # 4 MiB since b was
        a.add_(1)                # 2 MiB since a was
    cache = opcount.ReplayCache()
    c = opcount.count_step(step, "cpu", cache, caches=(3 << 20,))
    assert len(calls) == 3                            # profiler, reuse distances, counter
    assert (c.launches, c.cold_launches) == (3, 1)
    assert sorted(tier for _, tier in cache) == [0, 1]          # one signature, both ways
    assert cache.flush[3 << 20].numel() * 4 == 2 * (3 << 20)    # twice the cache, read first
    two_levels = opcount.ReplayCache()
    c = opcount.count_step(step, "cpu", two_levels, caches=(3 << 20, 1 << 20))
    assert c.cold_launches == 2                       # b past both levels, the second a past one
    assert sorted(tier for _, tier in two_levels) == [0, 1, 2]
    assert sorted(two_levels.flush) == [1 << 20, 3 << 20]
    assert opcount.count_step(step, "cpu", caches=(5 << 20,)).cold_launches == 0
    calls.clear()
    assert opcount.count_step(step, "cpu", caches=()).cold_launches == 0
    assert len(calls) == 2                            # no reuse distances: no second call


def test_small_far_data_is_not_replayed_cold():
    a, b = torch.zeros(16, 1024), torch.zeros(16, 1024)            # 64 KiB each
    c = opcount.count_step(lambda: (a.add_(1), b.add_(1), a.add_(1)), "cpu",
                           caches=(100 << 10,))
    assert c.cold_launches == 0          # below MIN_COLD_BYTES: the flush, not the data


class _Event:
    """A raw profiler event as ``_top_level_operator_ns`` reads it."""

    def __init__(self, name, thread, start, duration):
        self._values = name, thread, start, duration

    def name(self):
        return self._values[0]

    def start_thread_id(self):
        return self._values[1]

    def start_ns(self):
        return self._values[2]

    def duration_ns(self):
        return self._values[3]


def test_operators_are_timed_once_however_nested_and_per_thread():
    events = [_Event("aten::linear", 1, 0, 100),          # its addmm lies inside: 100
              _Event("aten::addmm", 1, 10, 80),
              _Event("aten::add", 1, 150, 20),            # 20 more, after a gap
              _Event("aten::mul", 1, 160, 30),            # overlaps add's end: 20 more
              _Event("python_function", 1, 300, 500),     # not an operator
              _Event("aten::mm", 2, 0, 50)]               # another thread: its own 50
    assert opcount._top_level_operator_ns(events) == 100 + 20 + 20 + 50


def test_the_raw_events_give_the_profilers_own_top_level_time():
    """Same figure as summing ``prof.events()``'s operators that no operator called."""
    layer = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64, requires_grad=True)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with prof:
        layer(x).relu().sum().backward()

    def called_by_an_operator(event):
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        return parent is not None
    parsed_us = sum(e.time_range.elapsed_us() for e in prof.events()
                    if e.name.startswith("aten::") and not called_by_an_operator(e))
    raw_ns = opcount._top_level_operator_ns(prof.profiler.kineto_results.events())
    assert raw_ns > 0 and raw_ns / 1e3 == pytest.approx(parsed_us, rel=1e-6)


def test_the_host_share_is_the_time_outside_every_operator():
    a = torch.randn(4, 4)

    def mostly_python():
        total = 0
        for i in range(200_000):
            total += i
        return a + 1
    assert opcount.host_share(mostly_python, "cpu") > 0.9
    big = torch.randn(512, 512)
    assert opcount.host_share(lambda: big @ big @ big, "cpu") < 0.5


def test_on_a_cpu_the_terms_add_and_the_largest_binds():
    limit = roofline.bound(count(heavy_s=0.002, other_s=0.001, host_share=0.25), PEAKS,
                           "cpu", step_s=0.004)
    assert (limit.compute_s, limit.memory_s) == (0.002, 0.001)
    assert limit.launch_s == pytest.approx(0.25 * 0.004)     # the Python around the operators
    assert limit.seconds == pytest.approx(0.002 + 0.001 + 0.001)
    assert limit.binding == "compute"
    assert roofline.bound(count(other_s=0.5), PEAKS, "cpu", 1.0).binding == "memory"
    assert roofline.bound(count(host_share=0.6), PEAKS, "cpu", 1.0).binding == "launch"


def test_on_an_accelerator_launches_overlap_the_devices_work():
    busy = roofline.bound(count(heavy_s=0.01, other_s=0.001), PEAKS, "cuda", 0.02)
    assert busy.seconds == pytest.approx(0.011) and busy.binding == "compute"
    launch_bound = roofline.bound(count(launches=5000, heavy_s=0.01), PEAKS, "cuda", 0.06)
    assert launch_bound.seconds == pytest.approx(5000 * 1e-5) and launch_bound.binding == "launch"


def test_a_missing_figure_gives_no_bound():
    assert roofline.bound(None, PEAKS, "cpu", 1.0) is None
    assert roofline.bound(count(), None, "cpu", 1.0) is None
    assert roofline.bound(count(), PEAKS, "cpu", None) is None


def test_the_launch_probe_measures_one_small_operator():
    peaks = roofline.measure_peaks("cpu", seconds=0.0, matmul_n=64, copy_bytes=1 << 16)
    assert 0 < peaks.launch_s < 1e-3                   # microseconds, not a whole batch
    assert peaks.flops_per_s > 0 and peaks.bytes_per_s > 0


def test_the_bound_ceiling_fields():
    assert roofline.bound_ceiling_fields(0.9, 2.0, 4.0) == {
        "bound_ceiling": 0.5, "frac_of_bound_ceiling": 1.8}
    assert roofline.bound_ceiling_fields(None, 2.0, 4.0)["bound_ceiling"] is None     # dense
    assert roofline.bound_ceiling_fields(0.9, None, 4.0)["frac_of_bound_ceiling"] is None


def test_a_record_above_its_roofline_ceiling_is_named_under_the_table():
    base = dict(arch="cat", variant="C=4", phase="decode", seq_len=256)
    fine, high = {**base, "frac_of_bound_ceiling": 1.04}, {**base, "frac_of_bound_ceiling": 1.2}
    assert roofline.ceiling_breaches([fine, {**base, "frac_of_bound_ceiling": None}]) == []
    assert roofline.ceiling_breaches([fine, high]) == [high]
    (line,) = roofline.breach_lines([fine, high])
    assert "above 105% of the roofline ceiling" in line and "cat C=4 decode T=256 (120%)" in line
    assert roofline.breach_lines([fine]) == []
