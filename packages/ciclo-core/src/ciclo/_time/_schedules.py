"""Schedules: *when* a callback runs. A schedule is any ``Elapsed -> bool``.

``every(n)`` fires once per call that reaches a new boundary ``0, n, 2n, ...`` (step 0
included); stateful schedules have ``state_dict()``/``load_state_dict()``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, cast

from ._elapsed import Elapsed, Period, as_period
from ._units import one_unit

__all__ = [
    "Due",
    "Schedule",
    "NamedSchedule",
    "every",
    "after",
    "piecewise",
    "always",
    "never",
    "as_schedule",
    "named_moment",
]


class Due(NamedTuple):
    """When a schedule can fire next (:meth:`Schedule.next_due`): once the count reaches
    ``steps``, ``samples`` or ``time`` (whichever comes first), or at every later step.

    Example:
        >>> import ciclo
        >>> ciclo.every(10).next_due(ciclo.Elapsed(steps=3, samples=96, time=0.0, date=0.0))
        Due(steps=10, samples=inf, every_step=False, time=inf)
    """

    steps: float = math.inf
    samples: float = math.inf
    every_step: bool = False
    time: float = math.inf


#: The plan of a schedule that fires at every later step.
EVERY_STEP = Due(every_step=True)
#: The plan of a schedule that never fires again.
NOT_AGAIN = Due()


class Schedule:
    """Base class of ciclo's schedules; combine them with ``&``, ``|`` and ``~``.

    Combinators always evaluate both sides, so stateful schedules stay in step.

    Example:
        >>> import ciclo
        >>> s = ciclo.every(2) & ~ciclo.every(4)
        >>> [s(ciclo.Elapsed(steps=i, samples=i, time=0.0, date=0.0)) for i in range(6)]
        [False, False, True, False, False, False]
    """

    def __call__(self, elapsed: Elapsed) -> bool:
        raise NotImplementedError

    def __and__(self, other: Callable[[Elapsed], bool]) -> Schedule:
        return _Combined(all, (self, as_schedule(other)), "&")

    def __rand__(self, other: Callable[[Elapsed], bool]) -> Schedule:
        return _Combined(all, (as_schedule(other), self), "&")

    def __or__(self, other: Callable[[Elapsed], bool]) -> Schedule:
        return _Combined(any, (self, as_schedule(other)), "|")

    def __ror__(self, other: Callable[[Elapsed], bool]) -> Schedule:
        return _Combined(any, (as_schedule(other), self), "|")

    def __invert__(self) -> Schedule:
        return _Not(self)

    def children(self) -> tuple[Schedule, ...]:
        """Schedules this one is built from (for saving state)."""
        return ()

    def next_due(self, elapsed: Elapsed) -> Due | None:
        """When this schedule can fire next, asked right after a call; ``None``: at every step.

        A loop skips the calls that cannot fire and reports them with :meth:`passed`.
        """
        return None

    def passed(self, elapsed: Elapsed) -> None:
        """The loop went past ``elapsed`` without a call, as planned: update what it remembers."""

    def state_dict(self) -> dict[str, Any]:
        """What this schedule remembers, as plain Python values."""
        return {"children": [c.state_dict() for c in self.children()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned."""
        for child, child_state in zip(self.children(), state["children"], strict=True):
            child.load_state_dict(child_state)


class _Function(Schedule):
    def __init__(self, fn: Callable[[Elapsed], bool]) -> None:
        self.fn = fn

    def __call__(self, elapsed: Elapsed) -> bool:
        return bool(self.fn(elapsed))

    def __repr__(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))


def as_schedule(value: Callable[[Elapsed], bool]) -> Schedule:
    """Wraps any ``Elapsed -> bool`` callable as a :class:`Schedule`."""
    if isinstance(value, Schedule):
        return value
    if not callable(value):
        raise TypeError(f"a schedule must be a function Elapsed -> bool, got {value!r}.")
    return _Function(value)


class _Combined(Schedule):
    def __init__(
        self, reduce: Callable[[list[bool]], bool], parts: tuple[Schedule, ...], symbol: str
    ) -> None:
        self.reduce, self.parts, self.symbol = reduce, parts, symbol

    def __call__(self, elapsed: Elapsed) -> bool:
        return self.reduce([part(elapsed) for part in self.parts])

    def next_due(self, elapsed: Elapsed) -> Due | None:
        # The first count at which a part can fire; a part firing at every step makes `|` do
        # so too, and leaves `&` to the other parts.
        dues = [due for part in self.parts if (due := part.next_due(elapsed)) is not None]
        rest = [due for due in dues if not due.every_step]
        if len(dues) < len(self.parts):
            return None
        if not rest or (len(rest) < len(dues) and self.reduce is any):
            return EVERY_STEP
        steps, samples, _, time = map(min, zip(*rest, strict=True))
        return Due(steps=steps, samples=samples, time=time)

    def passed(self, elapsed: Elapsed) -> None:
        for part in self.parts:
            part.passed(elapsed)

    def children(self) -> tuple[Schedule, ...]:
        return self.parts

    def __repr__(self) -> str:
        return "(" + f" {self.symbol} ".join(map(repr, self.parts)) + ")"


class _Not(Schedule):
    def __init__(self, inner: Schedule) -> None:
        self.inner = inner

    def __call__(self, elapsed: Elapsed) -> bool:
        return not self.inner(elapsed)

    def children(self) -> tuple[Schedule, ...]:
        return (self.inner,)

    def __repr__(self) -> str:
        return f"~{self.inner!r}"


class _Every(Schedule):
    """Fires once per boundary ``offset + k * period`` reached (k >= 0)."""

    def __init__(self, unit: str, period: float, offset: float = 0) -> None:
        self.unit, self.period, self.offset = unit, period, offset
        self._last: float | None = None  # the count of the previous call
        self._each_step = unit == "steps" and period == 1 and offset == 0

    def _index(self, value: float) -> int:
        return math.floor((value - self.offset) / self.period)

    def __call__(self, elapsed: Elapsed) -> bool:
        value: float = getattr(elapsed, self.unit)
        last, self._last = self._last, value
        if self._each_step and type(value) is int:  # every(1): every new step count fires
            return value >= 0 and value != last
        index = self._index(value)
        if index < 0:
            return False
        if last is None or value < last:
            # fresh, or the count went back: fire only exactly on a boundary
            return value - self.offset == index * self.period
        return index > self._index(last)

    def next_due(self, elapsed: Elapsed) -> Due | None:
        if self._each_step:
            return EVERY_STEP
        boundary = self.offset + (self._index(getattr(elapsed, self.unit)) + 1) * self.period
        return Due(**cast(dict[str, Any], {self.unit: boundary}))  # in its unit

    def passed(self, elapsed: Elapsed) -> None:
        self._last = getattr(elapsed, self.unit)

    def state_dict(self) -> dict[str, Any]:
        return {"last": self._last}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._last = state["last"]

    def __repr__(self) -> str:
        start = f"after({self.unit}={self.offset}).every" if self.offset else "every"
        return f"{start}({self.unit}={self.period})"


def every(
    steps: int | None = None, *, samples: int | None = None, time: float | None = None
) -> Schedule:
    """Fires once each time the count crosses a multiple of the period (0 included).

    Example:
        >>> import ciclo
        >>> s = ciclo.every(samples=100)
        >>> counts = (0, 64, 128, 192, 256)
        >>> [s(ciclo.Elapsed(steps=0, samples=n, time=0.0, date=0.0)) for n in counts]
        [True, False, True, False, True]
    """
    unit, period = one_unit("every()", steps, samples, time)
    return _Every(unit, period)


class _After(Schedule):
    def __init__(self, unit: str, start: float) -> None:
        self.unit, self.start = unit, start

    def __call__(self, elapsed: Elapsed) -> bool:
        return bool(getattr(elapsed, self.unit) >= self.start)

    def next_due(self, elapsed: Elapsed) -> Due | None:
        if getattr(elapsed, self.unit) >= self.start:
            return EVERY_STEP
        return Due(**cast(dict[str, Any], {self.unit: self.start}))

    def every(
        self, steps: int | None = None, *, samples: int | None = None, time: float | None = None
    ) -> Schedule:
        """Fires at ``start``, ``start + n``, ``start + 2n``... in the given unit."""
        unit, period = one_unit("after().every()", steps, samples, time)
        if unit != self.unit:
            raise ValueError(
                f"after({self.unit}=...).every() must count in the same unit, got {unit}; "
                f"combine units with &."
            )
        return _Every(unit, period, offset=self.start)

    def __repr__(self) -> str:
        return f"after({self.unit}={self.start})"


def after(
    steps: int | None = None, *, samples: int | None = None, time: float | None = None
) -> _After:
    """Fires on every call once the count reached the start (``after(10)``: from step 10
    on); ``.every(n)`` fires every ``n`` from the start.

    Example:
        >>> import ciclo
        >>> s = ciclo.after(10).every(5)
        >>> [i for i in range(30) if s(ciclo.Elapsed(steps=i, samples=i, time=0.0, date=0.0))]
        [10, 15, 20, 25]
    """
    unit, start = one_unit("after()", steps, samples, time, allow_zero=True)
    return _After(unit, start)


def _as_at(period: Period) -> str:
    fields = ", ".join(f"{unit}={amount:g}" for unit, amount in period.fields().items())
    return f"ciclo.at({fields})"


_STARTS_OUT_OF_ORDER = "piecewise(): {0} was reached before {1}; write starts in the order reached."


class _Piecewise(Schedule):
    def __init__(self, pieces: list[tuple[Period, Schedule]], *, check_order: bool) -> None:
        self.pieces = pieces
        self.check_order = check_order  # mixed units: each call checks the order reached

    def __call__(self, elapsed: Elapsed) -> bool:
        active = None
        unreached = None
        for start, schedule in self.pieces:
            fired = schedule(elapsed)  # every piece sees every call, to stay in step
            if start.reached_by(elapsed):
                if self.check_order and unreached is not None:
                    raise ValueError(_STARTS_OUT_OF_ORDER.format(_as_at(start), _as_at(unreached)))
                active = fired
            elif unreached is None:
                unreached = start
        return bool(active)

    def children(self) -> tuple[Schedule, ...]:
        return tuple(s for _, s in self.pieces)

    def __repr__(self) -> str:
        return f"piecewise({self.pieces!r})"


def piecewise(
    pieces: Mapping[int | Period, Callable[[Elapsed], bool]],
) -> Schedule:
    """The schedule whose start (steps, or an :func:`at` period) was reached last fires.

    Example:
        >>> import ciclo
        >>> s = ciclo.piecewise({0: ciclo.every(1), 3: ciclo.every(2)})
        >>> [i for i in range(8) if s(ciclo.Elapsed(steps=i, samples=i, time=0.0, date=0.0))]
        [0, 1, 2, 4, 6]
    """
    if not pieces:
        raise ValueError("piecewise() needs at least one {start: schedule} piece.")
    parsed: list[tuple[Period, Schedule]] = []
    for start, schedule in pieces.items():
        period = as_period(start, "a piecewise start")
        assert period is not None
        parsed.append((period, as_schedule(schedule)))
    starts = [period.fields() for period, _ in parsed]
    one_unit = all(len(f) == 1 for f in starts) and len({next(iter(f)) for f in starts}) == 1
    if one_unit:
        values = [next(iter(f.values())) for f in starts]
        if any(b <= a for a, b in itertools.pairwise(values)):
            raise ValueError(f"piecewise() starts must be increasing, got {values}; reorder them.")
    return _Piecewise(parsed, check_order=not one_unit)


class _Constant(Schedule):
    def __init__(self, value: bool) -> None:
        self.value = value

    def __call__(self, elapsed: Elapsed) -> bool:
        return self.value

    def next_due(self, elapsed: Elapsed) -> Due | None:
        return EVERY_STEP if self.value else NOT_AGAIN

    def __repr__(self) -> str:
        return "always()" if self.value else "never()"


def always() -> Schedule:
    """Fires on every call.

    Example:
        >>> import ciclo
        >>> ciclo.always()(ciclo.Elapsed.create())
        True
    """
    return _Constant(True)


def never() -> Schedule:
    """Never fires (:func:`always`'s opposite).

    Example:
        >>> import ciclo
        >>> elapsed = ciclo.Elapsed.create()
        >>> ciclo.never()(elapsed), ciclo.always()(elapsed)
        (False, True)
    """
    return _Constant(False)


_MOMENTS: dict[str, NamedSchedule] = {}


class NamedSchedule:
    """A moment of a predefined loop (``ciclo.on_epoch_end``): a ``tasks`` key, or a method name.

    Example:
        >>> import ciclo
        >>> ciclo.on_epoch_end.name
        'on_epoch_end'
    """

    __slots__ = ("doc", "name")

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.doc = doc
        _MOMENTS.setdefault(name, self)

    def __repr__(self) -> str:
        return f"ciclo.{self.name}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (named_moment, (self.name,))


def named_moment(name: str) -> NamedSchedule:
    """The :class:`NamedSchedule` called ``name`` (how a pickled one is restored).

    Example:
        >>> import ciclo
        >>> named_moment("on_epoch_end") is ciclo.on_epoch_end
        True
    """
    return _MOMENTS[name]
