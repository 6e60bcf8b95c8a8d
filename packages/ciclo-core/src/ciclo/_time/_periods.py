"""Periods given as arguments (an epoch's length, a patience), read and checked in one place."""

from __future__ import annotations

from ._elapsed import Elapsed, Period, as_period
from ._units import UNITS

__all__ = ["period_unit", "counted_fields", "counts"]


def period_unit(value: int | Period, what: str) -> tuple[str, float]:
    """``(unit, amount)`` of an int (steps) or a one-unit :func:`ciclo.at` period, positive.

    Args:
        value: ``1000``, ``ciclo.at(samples=60_000)`` or ``ciclo.at(time=3600)``.
        what: the argument's name, for messages (``"epoch_duration"``).

    Example:
        >>> import ciclo
        >>> period_unit(ciclo.at(samples=60_000), "epoch_duration")
        ('samples', 60000)
    """
    period = as_period(value, what)
    assert period is not None
    fields = period.fields()
    if len(fields) != 1 or "date" in fields or not next(iter(fields.values())):
        culprit = f"{what} must be a positive amount in one unit"
        raise ValueError(f"{culprit} (an int, or ciclo.at(samples=...)), got {value!r}.")
    ((unit, amount),) = fields.items()
    return unit, amount


def counted_fields(period: Period, what: str) -> dict[str, int | float]:
    """The fields of ``period``, which must count in units, not a date.

    Example:
        >>> import ciclo
        >>> counted_fields(ciclo.at(steps=100, time=60), "patience")
        {'steps': 100, 'time': 60}
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
