"""Sizes as people write them: "100MB" (powers of 1000), "2GiB" (of 1024), or bytes.

    parse_size("100MB")      # 100_000_000
    parse_size(4096)         # 4096
    gigabytes(300_000_000)   # "0.3 GB"
    parse_memory_limit("4GB")   # resources.max_memory: also checked against this machine

`parse_memory_limit` lives here, not in `memory_limit`, so that config validation does not
import the guard (which reads the launcher's failure marks).
"""

from __future__ import annotations

import math
import os
import re

SIZE_HINT = "a size such as '4GB', '512MB' or '2GiB', or a number of bytes"
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")
_SMALLEST_LIMIT = 10**6  # less than Python itself needs: a missing unit, most likely


def parse_size(value: object) -> int:
    """Bytes; ValueError (one sentence, without the setting's name) when `value` is not a
    size above zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) \
            or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"expected {SIZE_HINT} (got {value!r})")
    if isinstance(value, str):
        if value.strip().startswith("-"):
            raise ValueError(f"expected a size above zero, such as '4GB' (got {value!r})")
        match = _SIZE.match(value)
        if not match or match.group(2).lower() not in _UNITS | {"": 1}:
            raise ValueError(f"expected {SIZE_HINT} (got {value!r})")
        size = float(match.group(1)) * _UNITS[match.group(2).lower() or "b"]
    else:
        size = value
    if size <= 0:
        raise ValueError(f"expected a size above zero, such as '4GB' (got {value!r})")
    return int(size)


def has_unit(value: object) -> bool:
    return isinstance(value, str) and (match := _SIZE.match(value)) is not None \
        and bool(match.group(2))


def gigabytes(size: int) -> str:
    """`300_000_000` -> "0.3 GB": how limits are told."""
    value = size / 1e9
    return f"{round(value)} GB" if value >= 100 else f"{value:.3g} GB"


def physical_memory() -> int:
    """The machine's memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parse_memory_limit(value: object) -> int:
    """Bytes from `resources.max_memory`: "4GB" (powers of 1000), "2GiB" (of 1024), or a
    number of bytes. ValueError, one sentence without the key, when it is not a size
    above 1 MB that fits in this machine's memory."""
    size = parse_size(value)
    if size < _SMALLEST_LIMIT:
        hint = "" if has_unit(value) else f"; did you mean '{value}MB'?"
        raise ValueError(f"{value!r} is less than 1 MB, too little for any trial{hint}")
    total = physical_memory()
    if size > total:
        raise ValueError(f"{value!r} is more than this machine's {gigabytes(total)} of "
                         "memory; lower it, or leave it out for no limit")
    return int(size)
