"""Reuse distances: how many bytes a step moved since it last touched each piece of memory.

The roofline replays every operator alone, right after the step ran it, so the replay
finds the operator's data in the cache. The step itself does not always: data last
touched farther back than the last-level cache holds comes from DRAM. ``ReuseTracker``
follows a step's operators and, for each call and cache level, says how many of its
bytes are *far*: touched longer ago than that level holds.

Memory is tracked by address in blocks of ``BLOCK_BYTES``, not by tensor: a cache holds
addresses, whichever tensor lives there. A view counts only the blocks it covers, so a
decoding step that writes one new slot into its key/value cache leaves the rest of that
cache as far as it was (tracked per storage, the one-slot write made the whole cache look
freshly touched, and dense's 32 MiB cache at t = 4096 was priced as if it sat in a 32 MiB
L3 beside the weights). Blocks never touched count as far: a fresh allocation.
"""

from __future__ import annotations

import functools
import itertools
import math
from pathlib import Path

import torch

CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")   # Linux: index*/{level,type,size}
BLOCK_BYTES = 16 << 10         # the granularity of the tracking
MAX_RUNS = 4096                # contiguous runs listed per view; more: its whole span


def cache_levels(device) -> tuple[int, ...]:
    """The sizes of CPU 0's data caches from level 2 up, smallest first (sysfs; e.g.
    (1 MiB, 32 MiB)); () where unknown or not a CPU (on an accelerator a single timed call
    is mostly its launch, which the launch term already holds, so the roofline replays
    everything warm there). Level 1 is left out: a call finds little there even warm."""
    if torch.device(device).type != "cpu":
        return ()
    sizes = set()
    for folder in CPU_CACHES.glob("index*"):
        try:
            level = int((folder / "level").read_text())
            kind = (folder / "type").read_text().strip()
            size = _size((folder / "size").read_text())
        except (OSError, ValueError):
            continue
        if level >= 2 and kind in ("Data", "Unified") and size:
            sizes.add(size)
    return tuple(sorted(sizes))


def _size(text: str) -> int | None:
    """sysfs's "1024K" / "32M" / "512" in bytes (None if unreadable)."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    digits = text.rstrip("KM")
    return int(digits) * scale if digits.isdigit() else None


def byte_runs(tensor: torch.Tensor) -> list[tuple[int, int]]:
    """The contiguous (address, bytes) runs ``tensor`` covers; its whole span as one run
    when it has more than ``MAX_RUNS`` of them (e.g. a transpose of a large matrix)."""
    if tensor.numel() == 0:
        return []
    return _runs(tensor.data_ptr(), tuple(tensor.shape), tensor.stride(),
                 tensor.element_size())


def _runs(start: int, shape: tuple, stride: tuple, size: int) -> list[tuple[int, int]]:
    dims = [(n, s) for n, s in zip(shape, stride, strict=True) if n > 1 and s != 0]
    run = 1                                     # elements in one contiguous run
    while dims and dims[-1][1] == run:          # the innermost dims that are contiguous
        run *= dims.pop()[0]
    if math.prod(n for n, _ in dims) > MAX_RUNS:
        extent = sum((n - 1) * s for n, s in dims) + run
        return [(start, extent * size)]
    offsets = itertools.product(*(range(0, n * s, s) for n, s in dims))
    return [(start + sum(o) * size, run * size) for o in offsets]


def _blocks(tensor: torch.Tensor) -> range | frozenset[int]:
    """The ``BLOCK_BYTES`` blocks ``tensor`` covers, by address (a range where it is one
    contiguous run, as most are)."""
    if tensor.numel() == 0:
        return range(0)
    return _blocks_at(tensor.data_ptr(), tuple(tensor.shape), tensor.stride(),
                      tensor.element_size())


@functools.lru_cache(maxsize=1 << 16)
def _blocks_at(start: int, shape: tuple, stride: tuple, size: int) -> range | frozenset[int]:
    """``_blocks`` by layout, which fixes them: a step meets the same layouts again and
    again (weights, activations, their gradients), and listing a view's runs each time
    cost about 3 s of an ARMT training step at T=1024 (15,000 operators)."""
    spans = [range(a // BLOCK_BYTES, (a + n - 1) // BLOCK_BYTES + 1)
             for a, n in _runs(start, shape, stride, size)]
    if len(spans) == 1:
        return spans[0]
    return frozenset(itertools.chain.from_iterable(spans))


class ReuseTracker:
    """The bytes moved so far (``traffic``: each call's distinct inputs and outputs) and
    the traffic at which each block was last touched."""

    def __init__(self):
        self.traffic = 0
        self.touched: dict[int, int] = {}          # block -> traffic when last touched

    def far_bytes(self, tensors: list[torch.Tensor], levels: tuple[int, ...]) -> list[float]:
        """For each cache size in ``levels``: the bytes of ``tensors`` in blocks last
        touched more than that many bytes of traffic ago, or never."""
        return self._far([(t, _blocks(t)) for t in tensors], levels)

    def touch(self, tensors: list[torch.Tensor]) -> None:
        """Add the bytes of ``tensors`` to the traffic and mark their blocks touched now."""
        self._mark([(t, _blocks(t)) for t in tensors])

    def visit(self, tensors: list[torch.Tensor], levels: tuple[int, ...]) -> list[float]:
        """``far_bytes``, then ``touch``, each tensor's blocks listed once."""
        covered = [(t, _blocks(t)) for t in tensors]
        far = self._far(covered, levels)
        self._mark(covered)
        return far

    def _far(self, covered: list, levels: tuple[int, ...]) -> list[float]:
        far = [0.0] * len(levels)
        for tensor, blocks in covered:
            if not blocks:
                continue
            share = tensor.numel() * tensor.element_size() / len(blocks)   # bytes per block
            last = list(map(self.touched.get, blocks, itertools.repeat(-math.inf)))
            for i, size in enumerate(levels):
                since = self.traffic - size          # touched before this: past the level
                far[i] += share * sum(1 for t in last if t < since)
        return far

    def _mark(self, covered: list) -> None:
        self.traffic += sum(t.numel() * t.element_size() for t, _ in covered)
        for _, blocks in covered:
            self.touched.update(dict.fromkeys(blocks, self.traffic))
