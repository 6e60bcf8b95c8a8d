"""Time units: what a loop counts in (``steps``, ``samples``, ``time``), and how an amount
of one is checked. Other modules import these names; they never spell the units out.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

__all__ = ["UNITS", "check_amount", "one_unit"]

#: The units a loop counts in, in this order wherever they are listed.
UNITS = ("steps", "samples", "time")


def check_amount(caller: str, unit: str, value: object, *, allow_zero: bool) -> float:
    """``value`` as a Python int or float, checked as an amount of ``unit`` (``> 0``, or ``>= 0``).

    Args:
        caller: how the user called it, for messages (``"every()"``).
        unit: the unit (or period field) the amount counts.
        value: the amount as given.
        allow_zero: accept ``0`` (a start) or not (a period).

    Example:
        >>> check_amount("every()", "samples", np.int64(64), allow_zero=False)
        64
        >>> check_amount("every()", "steps", 0, allow_zero=False)
        Traceback (most recent call last):
        ValueError: every(): steps must be positive, got 0.
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        kind = type(value).__name__
        raise TypeError(f"{caller}: {unit} must be a number, got {value!r} ({kind}).")
    number = int(value) if isinstance(value, numbers.Integral) else float(value)
    if unit == "steps" and not float(number).is_integer():
        raise TypeError(f"{caller}: steps must be a whole number, got {value!r}; or count samples.")
    if number < 0 or (number == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{caller}: {unit} must be {bound}, got {value!r}.")
    return number


_NOT_ONE_PERIOD = "{} needs exactly one period: steps, samples or time, got {}."


def one_unit(
    caller: str, steps: Any, samples: Any, time: Any, *, allow_zero: bool = False
) -> tuple[str, float]:
    """``(unit, amount)`` of the one keyword argument given (not ``None``), checked.

    Example:
        >>> one_unit("every()", None, 10_000, None)
        ('samples', 10000)
    """
    given = {u: v for u, v in zip(UNITS, (steps, samples, time), strict=True) if v is not None}
    if len(given) != 1:
        raise ValueError(_NOT_ONE_PERIOD.format(caller, given or "none"))
    ((unit, value),) = given.items()
    return unit, check_amount(caller, unit, value, allow_zero=allow_zero)
