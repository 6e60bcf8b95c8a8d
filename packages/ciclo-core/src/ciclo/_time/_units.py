"""Time units: what a loop counts in, and how an amount in a unit is written and checked.

A loop counts in three units, the fields of :class:`ciclo.Elapsed` that grow as it runs:
``steps`` (batches), ``samples`` and ``time`` (seconds of loop time). A :class:`ciclo.Period`
may also name a ``date``, which is a moment, not an amount of a unit.

Every argument that takes an amount of time goes through this module:

- :func:`check_amount`: one amount (``every(samples=64)``, a field of ``at(...)``);
- :func:`one_unit`: exactly one of ``steps=``, ``samples=``, ``time=`` (``every``, ``after``);

and every argument that takes a period through :mod:`ciclo._time._periods`, which builds on
them. Other modules import these names from here; they never spell the units out.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

__all__ = ["UNITS", "check_amount", "one_unit"]

#: The units a loop counts in, in this order wherever they are listed.
UNITS = ("steps", "samples", "time")


def check_amount(caller: str, unit: str, value: object, *, allow_zero: bool) -> float:
    """``value`` as a Python int or float (NumPy scalars too), checked as an amount of
    ``unit``: a real number, positive (or zero when ``allow_zero``).

    Args:
        caller: how the user called it, for the error message (``"every()"``).
        unit: the unit (or period field) the amount counts.
        value: the amount as given.
        allow_zero: accept ``0`` (a start, a point in time) or not (a period).

    Raises:
        TypeError: not a number (a bool is not one).
        ValueError: negative, or zero without ``allow_zero``.

    Example:
        >>> check_amount("every()", "samples", np.int64(64), allow_zero=False)
        64
        >>> check_amount("every()", "steps", 0, allow_zero=False)
        Traceback (most recent call last):
        ValueError: every(): steps must be positive, got 0.
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{caller}: {unit} must be a number, got {value!r} ({type(value).__name__})."
        )
    number = int(value) if isinstance(value, numbers.Integral) else float(value)
    if unit == "steps" and not float(number).is_integer():
        raise TypeError(
            f"{caller}: steps must be a whole number, got {value!r}. For a fraction of an "
            f"epoch, count samples instead: {caller[:-2]}(samples=...)."
        )
    if number < 0 or (number == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{caller}: {unit} must be {bound}, got {value!r}.")
    return number


_NOT_ONE_PERIOD = (
    "{caller} needs exactly one period: steps, samples or time, got {given}. Example: "
    "{function}(100) or {function}(samples=10_000)."
)


def one_unit(
    caller: str, steps: Any, samples: Any, time: Any, *, allow_zero: bool = False
) -> tuple[str, float]:
    """``(unit, amount)`` from keyword arguments of which exactly one is given (not
    ``None``), its amount checked by :func:`check_amount`.

    Example:
        >>> one_unit("every()", None, 10_000, None)
        ('samples', 10000)
        >>> one_unit("every()", 2, 10, None)
        Traceback (most recent call last):
        ValueError: every() needs exactly one period: steps, samples or time, got {'steps': 2, 'samples': 10}. Example: every(100) or every(samples=10_000).
    """  # noqa: E501
    given = {u: v for u, v in zip(UNITS, (steps, samples, time), strict=True) if v is not None}
    if len(given) != 1:
        raise ValueError(
            _NOT_ONE_PERIOD.format(
                caller=caller, given=given or "none", function=caller.rstrip("()")
            )
        )
    ((unit, value),) = given.items()
    return unit, check_amount(caller, unit, value, allow_zero=allow_zero)
