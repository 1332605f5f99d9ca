"""Reuse distances by address (measure/reuse.py): what the roofline prices cold."""

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
    tracker = ReuseTracker(cache_bytes=10 << 20)
    tracker.touch([keys])
    tracker.touch([other])
    assert tracker.far_bytes([keys]) == 0                     # 8 MiB ago: not yet past 10 MiB
    tracker.touch([other])                                    # 16 MiB ago: far
    new_slot = keys[:, :, 4095:4096]
    tracker.touch([new_slot])
    filled = keys[:, :, :4095]
    far = tracker.far_bytes([filled])
    per_head = 1 << 20
    assert far >= 4 * (per_head - BLOCK_BYTES) * 4095 / 4096  # all but the written blocks
    assert tracker.far_bytes([new_slot]) == 0
    assert tracker.far_bytes([torch.zeros(1 << 16)]) > 0      # never touched: far


def test_traffic_is_the_bytes_each_call_moved():
    tracker = ReuseTracker(cache_bytes=1 << 20)
    a, b = torch.zeros(256), torch.zeros(512)
    tracker.touch([a, b])
    tracker.touch([a])
    assert tracker.traffic == (256 + 512 + 256) * 4


def test_the_last_level_cache_is_the_largest_linux_lists(tmp_path, monkeypatch):
    for index, size in (("index0", "32K"), ("index2", "1024K"), ("index3", "32768K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    monkeypatch.setattr(reuse, "CPU_CACHES", tmp_path)
    assert reuse.last_level_cache_bytes("cpu") == 32 << 20
    assert reuse.last_level_cache_bytes("meta") is None           # not a CPU: warm replays
    monkeypatch.setattr(reuse, "CPU_CACHES", tmp_path / "absent")
    assert reuse.last_level_cache_bytes("cpu") is None
