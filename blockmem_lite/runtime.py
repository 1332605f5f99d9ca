"""Where and how code runs: device choice, seeding, autocast, memory readings.

Device-agnostic by construction: ``pick_device`` prefers cuda > mps > cpu and
nothing else in the kit assumes CUDA. bf16 autocast is used only on CUDA.
Memory readings are honest for each device: CUDA's allocator counters on a
GPU, the process's resident set size (RSS) on CPU (documented as such).
"""

from __future__ import annotations

import contextlib
import os
import random
import warnings

import torch


def pick_device(preference: str = "auto") -> torch.device:
    """``auto`` -> cuda if available, else mps, else cpu; or the named device."""
    if preference != "auto":
        if preference.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={preference!r} is not allowed: CUDA is not available here; "
                             "use 'auto' or 'cpu'")
        if preference == "mps" and not _mps_available():
            raise ValueError("device='mps' is not allowed: MPS is not available here; "
                             "use 'auto' or 'cpu'")
        return torch.device(preference)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy (if present) and torch (all devices)."""
    random.seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)


def autocast_context(device: torch.device, precision: str = "auto"):
    """bf16 autocast on CUDA for ``auto``/``bf16``; a no-op elsewhere (fp32)."""
    device = torch.device(device)
    if device.type == "cuda" and precision in ("auto", "bf16"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if precision == "bf16" and device.type != "cuda":
        raise ValueError(f"precision='bf16' is not allowed on {device.type}: bf16 autocast is "
                         "used only on CUDA; use 'auto' or 'fp32'")
    return contextlib.nullcontext()


def process_rss_bytes() -> int:
    """Resident set size of this process, in bytes (psutil; /proc fallback)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def available_memory_bytes(device) -> int | None:
    """Memory a new allocation can use: free CUDA memory, or the RAM available to this
    process (the smaller of the system's and a cgroup limit's headroom); None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except ImportError:
        return None
    limit = _cgroup_headroom()
    return min(available, limit) if limit is not None else available


def _cgroup_headroom() -> int | None:
    """cgroup v2 ``memory.max - memory.current`` of this process's group, if limited."""
    root = "/sys/fs/cgroup"
    try:
        limit = open(f"{root}/memory.max").read().strip()
        used = int(open(f"{root}/memory.current").read().strip())
    except OSError:
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


def reset_peak_memory(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, method): CUDA peak allocated since the last reset, or current process RSS."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return process_rss_bytes(), "process_rss"


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so wall-clock readings are true."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def usable_workers(requested: int) -> int:
    """Data-loader workers to start: ``requested``, capped (with a warning saying so) at the
    machine's spare cores, so the training process keeps one."""
    spare = max((os.cpu_count() or 1) - 1, 0)
    if requested > spare:
        warnings.warn(f"num_workers={requested} is more than this machine's {spare} spare "
                      f"core(s); using {spare}", UserWarning, stacklevel=3)
        return spare
    return requested
