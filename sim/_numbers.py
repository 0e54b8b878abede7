"""Numbers from callers and from records: finite reals only (canonical JSON itself is
knowledge's)."""

from __future__ import annotations

import math
import numbers
from typing import Any, TypeGuard


def finite_floats(values: Any) -> list[float] | None:
    """A caller's sequence of real numbers (numpy's too; not bools, not text) as finite floats, else
    None."""
    if isinstance(values, (str, bytes)):
        return None
    try:
        out = [value if type(value) is float else _real(value) for value in values]
    except (TypeError, OverflowError):  # not a sequence of reals; an int beyond every float
        return None
    return out if all(map(math.isfinite, out)) else None


def _real(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(
        value, (float, int, numbers.Real)
    ):  # np.float64 is a float
        raise TypeError(f"{value!r} is not a real number")
    return float(value)


def is_number(value: Any) -> TypeGuard[float]:
    """A finite int or float, but not a bool (JSON has no bool/number confusion; Python does)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
