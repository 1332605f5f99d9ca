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
from pathlib import Path, PurePosixPath

import torch

CGROUP_ROOT = "/sys/fs/cgroup"           # where the cgroup hierarchies are mounted
PROC_SELF_CGROUP = "/proc/self/cgroup"   # this process's groups


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
    process: the smallest of the system's available RAM, the headroom of every cgroup (v1 or
    v2) limit above this process and of its address-space limit (``ulimit -v``); None if
    none is known. A limit the check does not see is an OOM kill without a message."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    readings = (_system_available(), _cgroup_headroom(), _address_space_headroom())
    known = [r for r in readings if r is not None]
    return min(known) if known else None


def _system_available() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


# cgroup v2: <root>/<group>/memory.max; v1: <root>/memory/<group>/memory.limit_in_bytes;
# (limit file, usage file, the memory.stat key of reclaimable page cache)
_CGROUP_FILES = {"v2": ("", "memory.max", "memory.current", "inactive_file"),
                 "v1": ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                        "total_inactive_file")}


def _cgroup_headroom() -> int | None:
    """The smallest ``limit - (usage - inactive page cache)`` of this process's memory cgroup
    and its ancestors, v2 and v1 (None: no limit found). The group's own folder is read
    where the host's hierarchy is mounted, the mount point itself where a container's is."""
    found = []
    for version, group in _cgroup_groups().items():
        sub, limit_name, usage_name, inactive_key = _CGROUP_FILES[version]
        base = Path(CGROUP_ROOT) / sub if sub else Path(CGROUP_ROOT)
        rel = PurePosixPath(group.lstrip("/"))
        for folder in dict.fromkeys([base / rel, *(base / p for p in rel.parents)]):
            room = _headroom(folder, limit_name, usage_name, inactive_key)
            if room is not None:
                found.append(room)
    return min(found) if found else None


def _cgroup_groups() -> dict[str, str]:
    """{"v2": group, "v1": group of the memory controller} from ``/proc/self/cgroup``."""
    try:
        lines = Path(PROC_SELF_CGROUP).read_text().splitlines()
    except OSError:
        return {}
    groups = {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            groups["v2"] = parts[2]
        elif "memory" in parts[1].split(","):
            groups["v1"] = parts[2]
    return groups


def _headroom(folder: Path, limit_name: str, usage_name: str, inactive_key: str) -> int | None:
    """``limit - (usage - inactive page cache)`` of one cgroup folder; None when unlimited
    or unreadable (the kernel reclaims inactive page cache before it kills)."""
    try:
        limit = (folder / limit_name).read_text().strip()
        used = int((folder / usage_name).read_text().strip())
    except (OSError, ValueError):
        return None
    if limit == "max" or not limit.isdigit():
        return None
    try:
        stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines()
                    if len(line.split()) == 2)
        cache = int(stat.get(inactive_key, 0))
    except (OSError, ValueError):
        cache = 0
    return max(int(limit) - max(used - cache, 0), 0)


def _address_space_headroom() -> int | None:
    """``RLIMIT_AS`` (``ulimit -v``) minus this process's virtual size; None: unlimited."""
    try:
        import resource
    except ImportError:                   # Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        import psutil

        size = int(psutil.Process().memory_info().vms)
    except ImportError:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    return max(soft - size, 0)


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


# --- freed memory kept for reuse ---------------------------------------------------------------
KEEP_FREED_MEMORY_ENV = "BLOCKMEM_KEEP_FREED_MEMORY"   # "0": leave the C allocator as it is
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4                # glibc's mallopt parameters (malloc.h)
KEPT_HEAP_BYTES = 1 << 30                              # free heap kept before any goes back
_kept_freed_memory: bool | None = None


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for the next tensor rather than hand it back
    to the system; True where it applied (once per process; glibc on Linux only).

    glibc serves a large allocation (a tensor over 128 KiB to 32 MiB, by its own moving
    threshold) with a fresh ``mmap`` and unmaps it when freed, so the next step's tensor of
    that size page-faults on every 4 KiB it writes. Measured on the class models (d=128,
    T=256, 16 sequences, 2 cores): 1,300-32,000 faults a training step at about 1 us each,
    varying from step to step with the allocator's state, so dense's step swung between
    about 220 and 250 ms. With every allocation from the heap (``M_MMAP_MAX`` 0) and up to
    ``KEPT_HEAP_BYTES`` of it kept free (``M_TRIM_THRESHOLD``), no step after the first
    faults. The price: the process's resident memory stays at its peak. CUDA tensors are
    untouched (their caching allocator already keeps memory). Set the environment variable
    ``BLOCKMEM_KEEP_FREED_MEMORY=0`` to leave the allocator alone.
    """
    global _kept_freed_memory
    if _kept_freed_memory is None:
        _kept_freed_memory = _set_glibc_malloc() if os.environ.get(
            KEEP_FREED_MEMORY_ENV, "1") != "0" else False
    return _kept_freed_memory


def _set_glibc_malloc() -> bool:
    import ctypes
    import platform
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, KEPT_HEAP_BYTES))
