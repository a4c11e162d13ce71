"""Byte units. GiB (2**30) and GB (10**9) are distinct and always labelled."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from .errors import KvsizeError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

_UNITS = {
    "": 1, "b": 1,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "kb": KB, "mb": MB, "gb": GB, "tb": TB,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


# Larger than any GPU or KV budget by far; above it a size is a typo (and floats would round it).
MAX_SIZE_BYTES = 1 << 50  # 1 PiB


def parse_bytes(text: str | int | float, field: str, allow_zero: bool = False) -> int:
    """'10GiB' -> 10737418240; '80GB' -> 80000000000; '1e9' -> 1000000000. Exact (no float rounding),
    a whole number of bytes, greater than zero (or zero where allowed) and at most 1 PiB."""
    return parse_size(text, field, allow_zero, round_down=False)[0]


def parse_size(text: str | int | float, field: str, allow_zero: bool = False,
               round_down: bool = True) -> tuple[int, str | None]:
    """A size as parse_bytes reads it; a size with a fraction of a byte (23.47GiB, as engines print
    GiB) is rounded down to whole bytes where `round_down`, with a note that says so."""
    if isinstance(text, bool):
        raise KvsizeError(f"{field} must be a size in bytes such as 10GiB, got {text!r}")
    if isinstance(text, (int, float)):
        if isinstance(text, float) and not math.isfinite(text):
            raise KvsizeError(f"{field} must be a finite size such as 10GiB, got {text!r}")
        value, unit = Decimal(text), ""
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise KvsizeError(
                f"{field} must be a size such as 10GiB, 512MiB or 80GB (GiB = 2^30 bytes, GB = 10^9), got {text!r}"
            )
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise KvsizeError(f"{field}: unknown unit {match.group(2)!r}; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB")
        try:
            value = Decimal(match.group(1))
        except InvalidOperation:
            raise KvsizeError(f"{field} must be a size such as 10GiB, got {text!r}") from None
    if not (value > 0 or (allow_zero and value == 0)):
        raise KvsizeError(f"{field} must be {'zero or more' if allow_zero else 'greater than zero'}, got {text!r}")
    if value and not -30 <= value.adjusted() <= 30:
        # far outside any size (and Decimal's exponent range once scaled): refused before any arithmetic
        raise KvsizeError(f"{field} {str(text)[:40]!r} is out of range: give a size from 1 byte to 1 PiB")
    total = value * _UNITS[unit]
    if total > MAX_SIZE_BYTES:
        raise KvsizeError(f"{field} {text!r} is above 1 PiB, the largest size kvsize accepts".strip())
    if total != total.to_integral_value():
        if not round_down or not unit or int(total) == 0:
            hint = f"e.g. {text}GiB" if not unit else "a whole number of bytes"
            raise KvsizeError(f"{field} {text!r} is not a whole number of bytes; give {hint}")
        whole = int(total)  # Decimal's int() truncates toward zero: down, for a positive size
        return whole, f"{field} {str(text).strip()} is {total:,} bytes; kvsize uses {whole:,} (rounded down to whole bytes)"
    return int(total), None


def ceil_fraction(x: Fraction) -> int:
    """The smallest integer at least x, for exact byte fractions."""
    return -(-x.numerator // x.denominator)


def round_up(value: int, multiple: int) -> int:
    return cdiv(value, multiple) * multiple


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def parse_assignments(text: str | None, option: str, form: str, example: str) -> dict[str, float]:
    """'a=1.5,b=2' -> {'a': 1.5, 'b': 2.0}, in order; a malformed item names `option` and `form`."""
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            sep = ""
        else:
            if not math.isfinite(number):
                raise KvsizeError(f"{option}: {item!r} needs a finite number, e.g. {example}")
        if not sep:
            raise KvsizeError(f"{option}: {item!r} must look like {form}, e.g. {example}")
        out[key] = number
    return out
