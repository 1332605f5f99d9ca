"""Where and how code runs: device choice, seeding, autocast, memory readings.

Device-agnostic by construction: ``pick_device`` prefers cuda > mps > cpu and
nothing else in the kit assumes CUDA. Autocast is used only on CUDA, and
``resolve_precision`` picks its dtype by the card: bf16 where the card has fast bf16
(compute capability >= 8.0, Ampere and later), fp16 with a ``GradScaler`` on older cards
(a T4, an RTX 20xx: bf16 there is emulated, slowly and silently), fp32 off CUDA.
Memory readings are honest for each device: CUDA's allocator counters on a
GPU; elsewhere a training step's own tensors (weights, gradients, optimizer state and
the activations saved for backward), counted tensor by tensor, because the process's
resident set size also holds whatever earlier runs in the same kernel left behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import warnings
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import torch

CGROUP_ROOT = "/sys/fs/cgroup"           # where the cgroup hierarchies are mounted
PROC_SELF_CGROUP = "/proc/self/cgroup"   # this process's groups


@contextlib.contextmanager
def environment(values: dict):
    """``os.environ`` with ``values`` set (a None value removes the variable) inside the
    block, and every one of them as it was after it (a kernel started inside inherits them)."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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


def device_summary(preference: str = "auto") -> str:
    """One line for a notebook's first cell: the device it will run on, and what that means."""
    device = pick_device(preference)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        what = f"cuda: {props.name}, {props.total_memory / 2**30:.0f} GiB"
    elif device.type == "mps":
        what = "mps: the Apple GPU"
    else:
        what = (f"cpu, {torch.get_num_threads()} threads: every notebook's class preset is sized "
                "for this; only the gpu preset wants a GPU")
    return f"device {what} (torch {torch.__version__})"


def matmul_flops_per_second(device: str = "cpu", size: int = 512, seconds: float = 0.2) -> float:
    """This device's rate on fp32 ``size`` x ``size`` matmuls, timed for about ``seconds``."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b                                            # warm-up
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < seconds:
        a @ b
        calls += 1
    synchronize(torch.device(device))
    return 2.0 * size ** 3 * calls / (time.perf_counter() - start)


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


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
FAST_BF16_CAPABILITY = (8, 0)          # Ampere and later: bf16 tensor cores
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cuda_capability(device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device, e.g. (7, 5) for a T4."""
    return tuple(torch.cuda.get_device_capability(torch.device(device)))


def resolve_precision(device, precision: str = "auto",
                      capability: tuple[int, int] | None = None) -> str:
    """What ``precision`` means on ``device``: "bf16", "fp16" or "fp32" (the module docstring).

    ``auto``: bf16 on CUDA at ``capability`` >= FAST_BF16_CAPABILITY (default: the card's
    own), fp16 on older CUDA cards, fp32 elsewhere. ``bf16`` / ``fp16`` only on CUDA; an
    explicit ``bf16`` on an older card runs, with a warning that it is emulated.
    """
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not allowed: expected one of "
                         f"{', '.join(map(repr, PRECISIONS))}")
    if device.type != "cuda":
        if precision in AUTOCAST_DTYPES:
            raise ValueError(f"precision={precision!r} is not allowed on {device.type}: "
                             f"{precision} autocast is used only on CUDA; use 'auto' or 'fp32'")
        return "fp32"
    if precision not in ("auto", "bf16"):
        return precision
    capability = tuple(capability or cuda_capability(device))
    if capability >= FAST_BF16_CAPABILITY:
        return "bf16"
    if precision == "bf16":
        warnings.warn(f"precision='bf16' on a card of compute capability {capability}: bf16 is "
                      "emulated there (slow); 'auto' picks fp16 with a GradScaler",
                      UserWarning, stacklevel=2)
        return "bf16"
    return "fp16"


def autocast_for(device, resolved: str):
    """The autocast context of a resolved precision ("bf16", "fp16"; "fp32": none) on
    ``device``, without the CUDA-only rule (tests rehearse fp16 on CPU with it)."""
    dtype = AUTOCAST_DTYPES.get(resolved)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


def autocast_context(device: torch.device, precision: str = "auto"):
    """Autocast at ``resolve_precision(device, precision)``; a no-op for fp32."""
    return autocast_for(device, resolve_precision(device, precision))


def grad_scaler(device, resolved: str):
    """A ``torch.amp.GradScaler`` for fp16 (its gradients would underflow unscaled); None
    for bf16 and fp32, whose exponent range is fp32's."""
    if resolved != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)


def precision_note(device, resolved: str) -> str:
    """One phrase saying which precision runs and why, e.g. for a T4: "fp16 autocast with a
    GradScaler (compute capability 7.5 has no fast bf16)"."""
    device = torch.device(device)
    if resolved == "fp32":
        return "fp32"
    why = ""
    if device.type == "cuda":
        capability = cuda_capability(device)
        fast = capability >= FAST_BF16_CAPABILITY
        why = f" (compute capability {capability[0]}.{capability[1]} " \
              f"{'has' if fast else 'has no'} fast bf16)"
    scaler = " with a GradScaler" if resolved == "fp16" else ""
    return f"{resolved} autocast{scaler}{why}"


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


class SavedTensorCounter:
    """Bytes of the tensors autograd saves for backward inside ``with counter:``.

    Tensors are counted once per storage (views of one buffer count once); the storages
    of ``exclude`` (e.g. the parameters) are skipped. Inside the block the counter keeps
    each saved tensor alive, so a freed buffer cannot reuse a counted address; it lets
    go of them when the block ends.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._skipped = {t.untyped_storage().data_ptr() for t in exclude}
        self._storages: dict[tuple[int, str], int] = {}
        self._keep_alive: list[torch.Tensor] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    @property
    def bytes(self) -> int:
        return sum(self._storages.values())

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        # A detached alias: returning ``tensor`` itself would tie a saved output to its own
        # graph node, a cycle that keeps the activations alive when no backward runs.
        alias = tensor.detach()
        storage = alias.untyped_storage()
        if storage.data_ptr() not in self._skipped:
            self._storages.setdefault((storage.data_ptr(), str(alias.device)), storage.nbytes())
            self._keep_alive.append(alias)
        return alias

    def __enter__(self) -> SavedTensorCounter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._keep_alive.clear()


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of ``tensors``, each storage once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors if isinstance(t, torch.Tensor)}
    return sum(storages.values())


def training_memory(device: torch.device, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, saved_bytes: int) -> tuple[int, str]:
    """(bytes, method) a training step held.

    On CUDA the allocator's peak since ``reset_peak_memory`` ("cuda_max_allocated").
    Elsewhere the step's own tensors ("model_tensors"): weights, gradients, optimizer
    state and ``saved_bytes`` of activations saved for backward (``SavedTensorCounter``).
    It does not depend on what ran before in the same process, as the process's resident
    memory does; it leaves out the temporaries that live for one operation only.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    parameters = list(model.parameters())
    state = [value for per_parameter in optimizer.state.values()
             for value in per_parameter.values()]
    held = tensor_bytes(parameters) + tensor_bytes(p.grad for p in parameters) + \
        tensor_bytes(state)
    return held + saved_bytes, "model_tensors"


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
    that size page-faults on every 4 KiB it writes. At the class models' sizes that is
    thousands of faults a training step, their number varying from step to step with the
    allocator's state, so the step time wanders by up to about a tenth. With every allocation
    from the heap (``M_MMAP_MAX`` 0) and up to ``KEPT_HEAP_BYTES`` of it kept free
    (``M_TRIM_THRESHOLD``), no step after the first faults. The price: the process's
    resident memory stays near its peak (the heap's top goes back past that threshold, but
    memory freed below a live allocation never does), which is why only processes that
    only train and measure call it (the bench command, its timed subprocesses,
    ``reproduce``, the lab's workers). A notebook kernel keeps the system's allocator,
    whatever it trains or benches (``tests/test_runtime.py``). CUDA tensors are untouched
    (their caching allocator already keeps memory). Set the environment variable
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
