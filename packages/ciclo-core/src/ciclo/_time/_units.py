"""Time units: what a loop counts in, and how an amount in a unit is written and checked.

A loop counts in three units, the fields of :class:`ciclo.Elapsed` that grow as it runs:
``steps`` (batches), ``samples`` and ``time`` (seconds of loop time). A :class:`ciclo.Period`
may also name a ``date``, which is a moment, not an amount of a unit.

Every argument that takes an amount of time goes through this module:

- :func:`check_amount`: one amount (``every(samples=64)``, a field of ``at(...)``);
- :func:`one_unit`: exactly one of ``steps=``, ``samples=``, ``time=`` (``every``, ``after``);
- :func:`period_unit`: an int (steps) or a one-unit ``at(...)`` period (an epoch's length,
  a progress bar's total);
- :func:`counted_fields`: a period counted in units, any of them (a patience period).

Other modules import these names from here; they never spell the units out.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ._elapsed import Elapsed, Period

__all__ = ["UNITS", "check_amount", "one_unit", "period_unit", "counted_fields", "counts"]

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
            f"{caller} needs exactly one period: steps, samples or time, got "
            f"{given or 'none'}. Example: {caller.rstrip('()')}(100) or "
            f"{caller.rstrip('()')}(samples=10_000)."
        )
    ((unit, value),) = given.items()
    return unit, check_amount(caller, unit, value, allow_zero=allow_zero)


def period_unit(value: int | Period, what: str) -> tuple[str, float]:
    """``(unit, amount)`` of an int (steps) or a one-unit :func:`ciclo.at` period, with a
    positive amount.

    Args:
        value: ``1000`` or ``ciclo.at(samples=60_000)`` or ``ciclo.at(time=3600)``.
        what: the argument's name, for the error message (``"epoch_duration"``).

    Raises:
        TypeError: neither an int nor a period.
        ValueError: a period with several fields, a date, or a zero amount.

    Example:
        >>> import ciclo
        >>> period_unit(1000, "epoch_duration")
        ('steps', 1000)
        >>> period_unit(ciclo.at(samples=60_000), "epoch_duration")
        ('samples', 60000)
    """
    from ._elapsed import as_period  # here, not above: _elapsed imports this module

    period = as_period(value, what)
    assert period is not None
    fields = period.fields()
    if len(fields) != 1 or "date" in fields or not next(iter(fields.values())):
        raise ValueError(
            f"{what} must be a positive amount in one unit: an int (steps) or "
            f"ciclo.at(samples=...) or ciclo.at(time=...), got {value!r}."
        )
    ((unit, amount),) = fields.items()
    return unit, amount


def counted_fields(period: Period, what: str) -> dict[str, int | float]:
    """The fields of ``period``, which must count in units (any of them), not a date.

    Example:
        >>> import ciclo
        >>> counted_fields(ciclo.at(steps=100, time=60), "patience")
        {'steps': 100, 'time': 60}
        >>> counted_fields(ciclo.at(date=0.0), "patience")
        Traceback (most recent call last):
        ValueError: patience counts steps, samples or time, not a date.
    """
    fields = period.fields()
    if "date" in fields:
        raise ValueError(f"{what} counts steps, samples or time, not a date.")
    return fields


def counts(elapsed: Elapsed) -> dict[str, int | float]:
    """``{unit: count}`` of ``elapsed`` in each unit (no date).

    Example:
        >>> import ciclo
        >>> counts(ciclo.Elapsed(steps=3, samples=96, time=1.5, date=0.0))
        {'steps': 3, 'samples': 96, 'time': 1.5}
    """
    return {unit: getattr(elapsed, unit) for unit in UNITS}
