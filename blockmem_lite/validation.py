"""Checks for configuration values, shared by every config and mechanism (a leaf module).

Every failure raises ``ValueError`` with the same shape, so a user always sees
the field, the value and what is allowed::

    block_size=0 is not allowed: expected an integer >= 1
"""

from __future__ import annotations

import math


def fail(field_name: str, value, allowed: str):
    """Raise the kit's standard error for a bad value of ``field_name``."""
    raise ValueError(f"{field_name}={value!r} is not allowed: {allowed}")


def check_int(name: str, value, minimum: int, maximum: int | None = None) -> None:
    """An int (not a bool) >= ``minimum`` (and <= ``maximum`` when given)."""
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (maximum is not None and value > maximum)):
        fail(name, value, f"expected an integer >= {minimum}" if maximum is None
             else f"expected an integer in [{minimum}, {maximum}]")


def check_float(name: str, value, low: float, high: float | None = None,
                low_inclusive: bool = True) -> None:
    """A finite number in [low, high] (or (low, high] with ``low_inclusive=False``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(name, value, "expected a number")
    if not math.isfinite(value):
        upper = f"{high}]" if high is not None else "inf)"
        fail(name, value, f"expected a finite number in {'[' if low_inclusive else '('}{low}, "
                          f"{upper}")
    too_low = value < low if low_inclusive else value <= low
    if too_low or (high is not None and value > high):
        bracket = "[" if low_inclusive else "("
        upper = f"{high}]" if high is not None else "inf)"
        fail(name, value, f"expected a number in {bracket}{low}, {upper}")


def check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        fail(name, value, "expected True or False")


def check_device(name: str, value) -> None:
    """A device name the kit runs on: auto, cpu, cuda, cuda:N or mps (whether this machine
    has it is ``runtime.pick_device``'s check)."""
    index = value.removeprefix("cuda:") if isinstance(value, str) else ""
    numbered = value != index and index.isascii() and index.isdigit()         # cuda:N
    if value not in ("auto", "cpu", "cuda", "mps") and not numbered:
        fail(name, value, "expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")


def check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        fail(name, value, f"expected one of {', '.join(map(str, allowed))}")


def _number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check_positive(name: str, value) -> None:
    """A finite number > 0 (FLOP formulas and sizes)."""
    if not _number(value) or value <= 0:
        fail(name, value, "expected a positive number")


def check_non_negative(name: str, value) -> None:
    if not _number(value) or value < 0:
        fail(name, value, "expected a number >= 0")



def parse_int_list(name: str, text, minimum: int = 1) -> list[int]:
    """'256,1024' -> [256, 1024], each at least ``minimum``; ValueError naming ``name``
    otherwise (command-line sweeps, seeds)."""
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < minimum for v in values):
        example = "0,1,2" if minimum < 1 else "256,1024"
        fail(name, text, f"expected comma-separated integers >= {minimum}, e.g. {example}")
    return values
