"""Reuse distances by address (measure/reuse.py): what the roofline prices cold."""

import pytest
import torch

from blockmem_lite.measure import reuse
from blockmem_lite.measure.reuse import BLOCK_BYTES, ReuseTracker, byte_runs


def test_a_contiguous_tensor_is_one_run_and_a_strided_view_one_per_row():
    x = torch.zeros(4, 8, 16)
    assert byte_runs(x) == [(x.data_ptr(), x.numel() * 4)]
    head_slice = x[:, :3]                                     # 4 runs of 3 x 16 floats
    assert byte_runs(head_slice) == [(x.data_ptr() + i * 8 * 16 * 4, 3 * 16 * 4)
                                     for i in range(4)]
    assert byte_runs(x.expand(2, 4, 8, 16)) == byte_runs(x)   # a broadcast dim: the same bytes
    assert byte_runs(x[:0]) == []


def test_a_view_with_too_many_runs_counts_as_its_span(monkeypatch):
    x = torch.zeros(64, 32)
    t = x.t()                                                 # 32 x 64 runs of one float
    assert len(byte_runs(t)) == 64 * 32
    monkeypatch.setattr(reuse, "MAX_RUNS", 16)
    assert byte_runs(t) == [(x.data_ptr(), x.numel() * 4)]


def test_one_slot_written_into_a_cache_leaves_the_rest_of_it_far():
    """Dense decoding: a one-token write into each head of the key cache does not bring
    the cache's earlier slots back into the cache."""
    keys = torch.zeros(1, 4, 4096, 64)                        # 4 MiB, 1 MiB per head
    other = torch.zeros(2 << 20)                              # 8 MiB moved in between
    tracker = ReuseTracker()
    levels = (10 << 20,)
    tracker.touch([keys])
    tracker.touch([other])
    assert tracker.far_bytes([keys], levels) == [0]          # 8 MiB ago: not yet past 10 MiB
    tracker.touch([other])                                    # 16 MiB ago: far
    new_slot = keys[:, :, 4095:4096]
    tracker.touch([new_slot])
    [far] = tracker.far_bytes([keys[:, :, :4095]], levels)
    filled_bytes = 4 * 4095 * 64 * 4
    assert far >= filled_bytes - 8 * BLOCK_BYTES   # all but the blocks of the written slots
                                                   # (and any shared with ``other``)
    assert tracker.far_bytes([new_slot], levels) == [0]
    assert tracker.far_bytes([torch.zeros(1 << 16)], levels)[0] > 0   # never touched: far


def test_far_bytes_are_counted_against_each_cache_level():
    a, b = torch.zeros(1 << 18), torch.zeros(1 << 19)        # 1 MiB, 2 MiB
    tracker = ReuseTracker()
    tracker.touch([a])
    tracker.touch([b])                                        # a: 2 MiB ago
    past_1_mib, past_4_mib = tracker.far_bytes([a, b], (1 << 20, 4 << 20))
    assert past_1_mib == pytest.approx(1 << 20, abs=BLOCK_BYTES)   # a (a block it may
    assert past_4_mib == 0                                          # share with b: near)


def test_traffic_is_the_bytes_each_call_moved():
    tracker = ReuseTracker()
    a, b = torch.zeros(256), torch.zeros(512)
    tracker.touch([a, b])
    tracker.touch([a])
    assert tracker.traffic == (256 + 512 + 256) * 4


def test_the_cache_levels_are_the_data_caches_linux_lists_from_level_2(tmp_path, monkeypatch):
    for index, level, kind, size in (("index0", 1, "Data", "32K"),
                                     ("index1", 1, "Instruction", "32K"),
                                     ("index2", 2, "Unified", "1024K"),
                                     ("index3", 3, "Unified", "32768K")):
        (tmp_path / index).mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / index / name).write_text(f"{value}\n")
    monkeypatch.setattr(reuse, "CPU_CACHES", tmp_path)
    assert reuse.cache_levels("cpu") == (1 << 20, 32 << 20)
    assert reuse.cache_levels("meta") == ()                     # not a CPU: warm replays
    monkeypatch.setattr(reuse, "CPU_CACHES", tmp_path / "absent")
    assert reuse.cache_levels("cpu") == ()
