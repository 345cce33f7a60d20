"""Sizes and rates.

Rates are GB/s (10**9 bytes per second) everywhere, as the published figures are. Sizes are
bytes; on input they may carry a unit: KiB MiB GiB TiB (powers of 1024) or KB MB GB TB
(powers of 1000), as IOR and DataWarp write them.
"""

from __future__ import annotations

import re

GB = 1e9  # bytes in one GB, the unit of every rate

_UNITS = {
    "": 1, "B": 1,
    "K": 1024, "KIB": 1024, "KB": 1000,
    "M": 1024**2, "MIB": 1024**2, "MB": 1000**2,
    "G": 1024**3, "GIB": 1024**3, "GB": 1000**3,
    "T": 1024**4, "TIB": 1024**4, "TB": 1000**4,
    "P": 1024**5, "PIB": 1024**5, "PB": 1000**5,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text) -> float:
    """Bytes in `text` ("1MiB", "512KiB", "8GiB", 4096). Raises ValueError with the reason."""
    if isinstance(text, bool):
        raise ValueError("a size, not true/false")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise ValueError(f"'{text}' is not a size such as 1MiB, 512KiB or 4096")
        unit = match.group(2).upper()
        if unit not in _UNITS:
            raise ValueError(f"unknown unit '{match.group(2)}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
        value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"a size must be positive, got {text}")
    return value


def format_size(nbytes: float) -> str:
    """Shortest exact binary spelling: 1048576 -> '1MiB', 3000 -> '3000B'."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{int(nbytes // factor)}{unit}"
    return f"{int(nbytes)}B"
