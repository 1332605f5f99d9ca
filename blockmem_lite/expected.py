"""What a notebook's printed result should be: a range measured from the kit's own runs.

A notebook cell that prints a trained or measured result (a loss, a recall accuracy, a speed
ratio) follows it with ``expect(name, value, unit=..., outside=...)``. That prints the range
the kit measured for this preset over several seeds and, when the value falls outside it,
one flagged line saying what that would mean. The ranges live in
``data/expected/ranges.json``, remade by ``python -m blockmem_lite expected remake``
(``tools/expected_runs.py``), which runs the notebooks once per seed.

Two environment variables serve that command and the tests:
``BLOCKMEM_EXPECT_RECORD=FILE`` appends every ``(name, value)`` to FILE as JSON lines, and
``BLOCKMEM_EXPECT_STRICT=1`` turns a value outside its range, or a name with no range, into
an error (the test suite runs the fast-mode notebooks so); a result marked ``machine=True``
(a speed ratio, which a busy computer moves) is only flagged.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

NAME = re.compile(r"\d\d\.[a-z0-9][a-z0-9-]*")
RECORD_ENV = "BLOCKMEM_EXPECT_RECORD"
STRICT_ENV = "BLOCKMEM_EXPECT_STRICT"
# Half the seeds' spread is added on each side: three seeds rarely span what a fourth draws.
PAD_SHARE = 0.5
# At least 1% of the value on each side: another CPU's rounding moves even a result that no
# seed changes.
MIN_PAD = 0.01


class OutsideExpected(AssertionError):
    """A result outside its measured range (or with none) while BLOCKMEM_EXPECT_STRICT is set."""


def ranges_path() -> Path:
    """The stored ranges, in a checkout or an installed wheel."""
    from blockmem_lite.course import course_root

    return course_root() / "data" / "expected" / "ranges.json"


def load_ranges(path: Path | None = None) -> dict:
    """``{preset: {name: entry}}``; empty where nothing is stored yet."""
    path = ranges_path() if path is None else path
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))["presets"]


def measured_range(values: list[float], at_most: float | None = None,
                   signed: bool = False) -> tuple[float, float]:
    """The range of a result from the values of several seeds: their span, widened on each
    side by ``PAD_SHARE`` of it and by at least ``MIN_PAD`` of the value; never below zero
    for a result that was never negative (a loss, an accuracy, a ratio) unless it is
    ``signed`` (a difference, which any seed may turn negative), never above ``at_most`` for
    a result that cannot exceed it (an accuracy, a share: 1)."""
    low, high = min(values), max(values)
    pad = max(PAD_SHARE * (high - low), MIN_PAD * max(abs(low), abs(high)), 1e-12)
    high += pad
    if at_most is not None:
        high = min(high, max(at_most, max(values)))
    return (low - pad if low < 0 or signed else max(low - pad, 0.0)), high


def _number(value: float) -> str:
    return f"{value:.4g}"


def _strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _record(name: str, value: float, at_most: float | None, signed: bool) -> None:
    target = os.environ.get(RECORD_ENV)
    if target:
        row = {"name": name, "value": value}
        if at_most is not None:
            row["at_most"] = at_most
        if signed:
            row["signed"] = True
        with open(target, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


def current_preset() -> str:
    """The preset the notebook asked for last (``notebook_config``); fast mode says ``fast``."""
    from blockmem_lite import config

    if config.fast_mode():
        return "fast"
    return config.last_notebook_preset() or "class"


def expect(name: str, value: float, *, unit: str = "", outside: str,
           machine: bool = False, at_most: float | None = None, signed: bool = False) -> None:
    """Print the range measured for ``name`` under this preset and whether ``value`` is in it.

    ``outside`` says in one sentence what a value outside the range would mean; ``machine``
    marks a result that depends on the computer (a speed ratio), whose range names the machine
    it was measured on; ``at_most`` is a bound the result cannot pass (1 for an accuracy or a
    share), so the range never reads above it; ``signed`` marks a difference, whose range
    may reach below zero even when every seed measured gave a positive one. Returns nothing (a notebook cell ending in it
    shows only its line)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"name={name!r}: expected the notebook's two-digit number, a dot and "
                         "a short lowercase name, e.g. '02.loss-with-memory'")
    value = float(value)
    if not outside:
        raise ValueError(f"outside={outside!r}: say what a value outside the range would mean")
    if at_most is not None and (isinstance(at_most, bool) or not isinstance(at_most, (int, float))
                                or not math.isfinite(at_most)):
        raise ValueError(f"at_most={at_most!r}: expected None or a finite number, e.g. 1 for "
                         "an accuracy")
    _record(name, value, at_most, bool(signed))
    preset = current_preset()
    entry = load_ranges().get(preset, {}).get(name)
    suffix = f" {unit}" if unit else ""
    if entry is None:
        message = (f"(no measured range for {name!r} in preset {preset!r}; "
                   "`python -m blockmem_lite expected remake` measures one)")
        if _strict():
            raise OutsideExpected(message)
        print(message)
        return
    low, high = measured_range(list(entry["values"].values()), at_most, signed)
    where = f"{preset} preset, seeds {entry['seeds']}"
    if machine:
        where += f", measured on {entry['machine']}"
    if math.isfinite(value) and low <= value <= high:
        print(f"expected {_number(low)} to {_number(high)}{suffix} ({where}): inside")
        return
    message = (f"OUTSIDE the expected {_number(low)} to {_number(high)}{suffix} ({where}): "
               f"{_number(value)}. {outside}")
    if _strict() and not machine:
        raise OutsideExpected(f"{name}: {message}")
    print(message)
