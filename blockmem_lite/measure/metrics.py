"""What a model costs: FLOPs per token by the analytic model, and memory as measured.

* **FLOP model** (forward, per token; a multiply-add counts 2):
  ``flops_per_token(cfg)`` asks the registry for the mechanism's own formula
  (each mechanism module holds one; ``flops.py`` the shared dense pieces).
  Training costs 3x the forward. ``iso_flop_dense_config`` matches a dense
  model's depth to any mechanism's FLOPs.
* **Memory**: on CUDA ``max_memory_allocated`` after ``reset_peak_memory_stats``
  (method ``"cuda_max_allocated"``); on CPU the bytes of tensors saved for
  backward, deduplicated by storage (``"saved_tensors"``, deterministic), and
  the peak RSS of a *fresh* Python subprocess (``"rss_subprocess"``, the real
  figure, which includes the interpreter + torch baseline).

How the bench times a step is ``bench_steps``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from blockmem_lite import registry
from blockmem_lite.config import ModelConfig
from blockmem_lite.measure.bench_steps import (
    make_decode_step,
    make_infer_step,
    make_train_step,
    prepared_for_bench,
)
from blockmem_lite.measure.flops import dense_layer_flops
from blockmem_lite.models.base import build_model
from blockmem_lite.runtime import (
    SavedTensorCounter,
    keep_freed_memory,
    seed_everything,
    synchronize,
)

# --------------------------------------------------------------------------------------
# FLOP model: each mechanism registers its own formula (``flops.py`` holds the shared parts)
# --------------------------------------------------------------------------------------

def flops_per_token(cfg: ModelConfig, seq_len: int | None = None,
                    decode: bool = False) -> float | None:
    """Forward FLOPs per token of the model ``cfg`` describes, LM head included.

    ``seq_len``: the context (default ``cfg.seq_len``); ``decode=True``: one
    decoding step at that context. None where the mechanism has no FLOP model
    (or none for decoding). Training costs ``flops.training_flops_per_token``.
    """
    cfg = getattr(cfg, "model", cfg)
    mechanism = registry.get(cfg.arch)
    if mechanism.flops is None:
        return None
    return mechanism.flops(cfg, seq_len or cfg.seq_len, decode)


def iso_flop_dense_config(cfg: ModelConfig) -> ModelConfig:
    """A dense config with more layers and (nearly) the forward FLOPs per token of ``cfg``.

    Dense layers n = n_layer + (what ``cfg`` costs beyond a dense model of its depth)
    / (one dense layer's FLOPs), rounded to the nearest integer (halves up); width,
    heads, seq_len and vocabulary are kept. Works for any mechanism with a FLOP model.
    """
    cfg = getattr(cfg, "model", cfg)
    dense = dataclasses.replace(cfg, arch=registry.BASELINE)
    extra = flops_per_token(cfg) - flops_per_token(dense)
    n_layer = cfg.n_layer + math.floor(extra / dense_layer_flops(cfg.d_model, cfg.seq_len) + 0.5)
    return dataclasses.replace(dense, n_layer=max(1, n_layer))


# --------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------

def saved_tensor_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs.

    ``runtime.SavedTensorCounter``: tensors deduplicated by storage (views of one buffer
    count once), storages of ``exclude`` (e.g. ``model.parameters()``) skipped, so the
    figure is the activation memory a backward pass keeps. Deterministic for a given fn.
    """
    with SavedTensorCounter(exclude) as counter:
        fn()
    return counter.bytes


def cuda_peak_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """``torch.cuda.max_memory_allocated`` over ``fn()``, after resetting the peak."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device={str(device)!r} is not allowed: cuda_peak_bytes needs CUDA")
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


PROC_SELF_STATUS = Path("/proc/self/status")   # Linux: VmHWM, this program's peak RSS


def max_rss_bytes() -> int:
    """Peak RSS of this process so far, in bytes.

    Linux: ``VmHWM`` from /proc/self/status, the high-water mark of the running
    program only (``ru_maxrss`` keeps the *parent's* peak across fork + exec,
    which would hide the child's own figure). Other Unixes: ``ru_maxrss``, in
    bytes on macOS, KiB elsewhere. Windows (no ``resource``): psutil's peak
    working set.
    """
    try:
        for line in PROC_SELF_STATUS.read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024                        # reported in kB
    except OSError:                                                      # no /proc
        pass
    try:
        import resource
    except ImportError:                                                  # Windows
        return _peak_working_set_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _peak_working_set_bytes() -> int:
    """psutil's ``peak_wset`` (Windows' peak RSS); where psutil has no peak field, the
    current RSS (a lower bound of the peak)."""
    import psutil

    info = psutil.Process().memory_info()
    return int(getattr(info, "peak_wset", info.rss))


@dataclass
class RssReading:
    """Peak RSS of a fresh subprocess, before and after the measured phase.

    ``base_bytes``: after importing torch + blockmem_lite and building the
    model (interpreter, libraries, weights). ``peak_bytes``: at the end, the
    lifetime peak including the baseline. ``delta_bytes`` = the phase's growth.
    """

    peak_bytes: int
    base_bytes: int

    @property
    def delta_bytes(self) -> int:
        return self.peak_bytes - self.base_bytes


RSS_PHASES = ("train", "decode", "infer")
_CHILD_CODE = "from blockmem_lite.measure.metrics import _rss_child_main; _rss_child_main()"


def _check_rss_spec(spec: dict) -> None:
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
        raise ValueError(f"spec={spec!r} is not allowed: expected a dict with a 'model' dict "
                         "(ModelConfig fields), 'phase', 'batch' and 'seq_len'")
    if spec.get("phase") not in RSS_PHASES:
        raise ValueError(f"spec['phase']={spec.get('phase')!r} is not allowed: expected one of "
                         f"{', '.join(RSS_PHASES)}")
    for key in ("batch", "seq_len"):
        value = spec.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"spec[{key!r}]={value!r} is not allowed: expected an integer >= 1")


def peak_rss_subprocess(spec: dict, timeout: float = 600.0) -> RssReading:
    """Run one measured phase in a fresh Python process and read its peak RSS.

    ``spec``: ``model`` (``ModelConfig.to_dict()``), ``plugins`` (files the child
    loads first, for plugin mechanisms; optional), ``phase`` ("train":
    forward+backward steps; "decode": prefill of ``seq_len`` tokens then
    decoding steps; "infer": ``make_infer_step`` calls), ``batch``,
    ``seq_len``, and optionally ``steps`` (2), ``burst`` (decode steps per
    call, 1), ``threads``, ``seed`` (0). The child runs on the CPU in fp32.
    The peak includes the interpreter + torch baseline (hundreds of MiB);
    ``RssReading.delta_bytes`` removes it.
    """
    _check_rss_spec(spec)
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["PYTHONIOENCODING"] = "utf-8"          # its errors read whatever the code page
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD_CODE], input=json.dumps(spec),
                              capture_output=True, encoding="utf-8", errors="replace",
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"RSS subprocess timed out after {timeout:.0f} s for "
                           f"phase={spec['phase']!r}, seq_len={spec['seq_len']}, "
                           f"batch={spec['batch']}; lower seq_len/batch or raise timeout") from err
    if done.returncode != 0:
        raise RuntimeError(f"RSS subprocess failed (exit code {done.returncode}) for "
                           f"phase={spec['phase']!r}, seq_len={spec['seq_len']}:\n"
                           f"{done.stderr.strip()[-2000:]}")
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return RssReading(peak_bytes=int(result["peak_bytes"]),
                          base_bytes=int(result["base_bytes"]))
    except (IndexError, ValueError, KeyError) as err:
        raise RuntimeError(f"RSS subprocess printed no reading; stdout was {done.stdout!r}, "
                           f"stderr was {done.stderr.strip()[-2000:]!r}") from err


def _rss_child_main() -> None:
    """Child side of ``peak_rss_subprocess``: spec JSON on stdin, reading JSON on stdout."""
    spec = json.loads(sys.stdin.read())
    keep_freed_memory()                        # as the timed process (runtime.py)
    for path in spec.get("plugins", []):
        registry.load_plugin(path)
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    seed = int(spec.get("seed", 0))
    steps = int(spec.get("steps", 2))
    seed_everything(seed)
    cfg = ModelConfig.from_dict(spec["model"])
    model = prepared_for_bench(build_model(cfg), cfg)
    base = max_rss_bytes()
    if spec["phase"] == "train":
        step = make_train_step(model, spec["batch"], spec["seq_len"], seed=seed)
    elif spec["phase"] == "infer":
        step = make_infer_step(model, spec["batch"], spec["seq_len"], seed=seed)
    else:
        step = make_decode_step(model, spec["batch"], spec["seq_len"], n_calls=steps,
                                burst=int(spec.get("burst", 1)), seed=seed)
    for _ in range(steps):
        step()
    print(json.dumps({"peak_bytes": max_rss_bytes(), "base_bytes": base}))

