"""Human-readable numbers: bytes, durations, throughput and memory readings.

The one place the kit turns measurements into text; the trainer's progress
lines, the live dashboard, the bench table and the figures all use it.

    human_bytes(1536)                      -> "1.5 KiB"
    human_duration(3723)                   -> "1:02:03"   (time elapsed, a stopwatch)
    time_left(1148)                        -> "about 19 min 08 s left"   (never a clock time)
    human_rate(12_345)                     -> "12.3k tok/s"
    human_memory(412 * 2**20, "process_rss") -> "412 MiB RSS"

Bytes use binary units (1 KiB = 1024 B) with one decimal below 10 and none
above; missing readings (None, NaN, inf) print as ``-`` or ``?``, never crash.
"""

from __future__ import annotations

import math
from numbers import Real

MEMORY_LABELS = {
    "process_rss": "RSS",
    "cuda_max_allocated": "CUDA peak",
    "rss_subprocess": "RSS (fresh process)",
    "saved_tensors": "saved for backward",
    "model_tensors": "model tensors",
}

_BYTE_STEPS = ((" B", 0), (" KiB", None), (" MiB", None), (" GiB", None), (" TiB", None))
_RATE_STEPS = (("", 0), ("k", 1), ("M", 2))


def _check_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name}={value!r} is not allowed: expected a number or None")


def _is_missing(name: str, value) -> bool:
    """True for None, NaN and inf; ValueError naming ``name`` for anything not a number."""
    if value is None:
        return True
    _check_number(name, value)
    return not math.isfinite(value)


def _fixed(value: float, decimals: int | None) -> str:
    """``value`` with ``decimals`` decimals; None means one below 10 and none above."""
    if decimals is None:
        decimals = 1 if abs(value) < 9.95 else 0
    return f"{value:.{decimals}f}"


def _scaled(value: float, base: float, steps: tuple) -> str:
    """``value`` in the first unit of ``steps`` ((suffix, decimals), smallest first) where
    it prints below ``base`` (so 1023.9 KiB becomes 1.0 MiB, not 1024 KiB)."""
    for suffix, decimals in steps[:-1]:
        text = _fixed(value, decimals)
        if abs(float(text)) < base:
            return text + suffix
        value /= base
    suffix, decimals = steps[-1]
    return _fixed(value, decimals) + suffix


def human_bytes(n) -> str:
    """Binary units: ``512 B``, ``1.5 KiB``, ``412 MiB``, ``3.0 GiB``; None -> ``-``."""
    if _is_missing("n", n):
        return "-"
    return _scaled(float(n), 1024, _BYTE_STEPS)


def human_duration(seconds) -> str:
    """``0:07``, ``12:05``, ``1:02:03`` (rounded to the second); None, NaN, inf or < 0 -> ``?``."""
    if _is_missing("seconds", seconds) or seconds < 0:
        return "?"
    hours, rest = divmod(int(round(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def duration_words(seconds) -> str:
    """A duration that cannot be read as a clock time: ``8 s``, ``19 min 08 s``,
    ``1 h 02 min``; None, NaN, inf or < 0 -> ``?``."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def time_left(seconds) -> str:
    """``about 19 min 08 s left`` (``time left unknown`` without an estimate)."""
    words = duration_words(seconds)
    return "time left unknown" if words == "?" else f"about {words} left"


def human_rate(tokens_per_s) -> str:
    """``950 tok/s``, ``12.3k tok/s``, ``1.25M tok/s``; None (or NaN, inf) -> ``? tok/s``."""
    if _is_missing("tokens_per_s", tokens_per_s):
        return "? tok/s"
    return _scaled(float(tokens_per_s), 1000, _RATE_STEPS) + " tok/s"


def memory_label(method: str | None) -> str:
    """How a memory reading was taken, in words: ``process_rss`` -> ``RSS``,
    ``cuda_max_allocated`` -> ``CUDA peak``; unknown methods with underscores as
    spaces; None or "" -> ""."""
    if method is None:
        return ""
    if not isinstance(method, str):
        raise ValueError(f"method={method!r} is not allowed: expected a string such as "
                         f"{', '.join(MEMORY_LABELS)}, or None")
    return MEMORY_LABELS.get(method, method.replace("_", " "))


def human_memory(n, method: str | None) -> str:
    """A reading and how it was taken: ``412 MiB RSS``, ``1.2 GiB CUDA peak``."""
    return f"{human_bytes(n)} {memory_label(method)}".rstrip()


def format_progress(rec: dict) -> str:
    """One readable line for a step record or an eval record (missing keys are skipped)."""
    total = rec.get("total_steps")
    width = len(str(total)) if total else 1
    parts = [f"step {rec.get('step', '?'):>{width}}/{total}" if total else f"step {rec.get('step')}"]
    if "val_loss" in rec:
        parts.append(f"val_loss {rec['val_loss']:.4f}")
    if "loss" in rec:
        parts.append(f"loss {rec['loss']:.4f}")
    if rec.get("aux_loss"):
        parts.append(f"aux {rec['aux_loss']:.4f}")
    if "lr" in rec:
        parts.append(f"lr {rec['lr']:.2e}")
    if "tokens_per_s" in rec:
        parts.append(human_rate(rec["tokens_per_s"]))
    if "memory_bytes" in rec:
        parts.append("mem " + human_memory(rec["memory_bytes"], rec.get("memory_method")))
    timing = []
    if "elapsed_s" in rec:
        timing.append(f"{human_duration(rec['elapsed_s'])} elapsed")
    if "eta_s" in rec:
        timing.append(time_left(rec["eta_s"]))
    if timing:
        parts.append(", ".join(timing))
    return " | ".join(parts)


def fmt(value, spec: str, missing: str = "-") -> str:
    """``format(value, spec)``, or ``missing`` for None (table cells)."""
    return missing if value is None else format(value, spec)
