"""Progress bars: ``keras_bar`` (the Keras line) and ``tqdm_bar``.

A bar counts in steps, samples or seconds (``total=1000``, ``ciclo.at(samples=60_000)``,
``ciclo.at(time=3600)``), redraws at most every ``interval`` seconds and fetches the values
it shows (through ``_host.to_host``) only when it redraws, so the steps in between run
without a device sync.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import re
import sys
import time as _time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any, NamedTuple

from .._loop._base import LoopCallbackBase, called_by_hand
from .._loop._state import LoopState
from .._processes._outputs import OUTPUT_PROCESS, check_output_process, writes_here
from .._records import _host
from .._time._elapsed import Elapsed, Period
from .._time._periods import period_unit
from ._running_mean import RunningMean, check_running_mean

__all__ = ["KerasBar", "keras_bar", "TqdmBar", "tqdm_bar", "latest_entries", "named_entries"]

MSG_NO_TOTAL = (
    "{what}() was given no total, and the loop has no stop nor a dataset with len(): pass "
    "{what}(1000) (steps) or {what}(ciclo.at(samples=600)), or give the loop a stop."
)

_SHOWN = ("losses", "metrics", "stateful_metrics")
#: Left out of a bar's line unless asked for: the ledger's seconds (``ciclo.goodput``).
EXCLUDED = ("goodput_*",)


def latest_entries(loop_state: LoopState) -> dict[tuple[str, str], Any]:
    """The latest value of each scalar loss and metric seen in the loop (this step's
    included), by ``(collection, name)``, still on device."""
    latest: dict[tuple[str, str], Any] = {}
    for logs in (loop_state.accumulated_logs, loop_state.logs):
        for collection in _SHOWN:
            for name, value in logs.get(collection, {}).items():
                if getattr(value, "shape", ()) == () and not isinstance(value, str):
                    latest[(collection, name)] = value
    return latest


def named_entries(entries: Mapping[tuple[str, str], Any]) -> dict[str, Any]:
    """Entries by name (``collection.name`` when two collections share a name), sorted."""
    names = [name for _, name in entries]
    return {
        (name if names.count(name) == 1 else f"{collection}.{name}"): value
        for (collection, name), value in sorted(entries.items(), key=lambda kv: kv[0][1])
    }


class Frame(NamedTuple):
    """What a bar shows at one redraw."""

    position: float  #: how far the run is, in the bar's unit
    values: Mapping[str, Any]  #: the losses and metrics, on the host
    eta: float | None  #: seconds left (``None``: not known yet)
    run: tuple[float, float]  #: the seconds and the count this bar has seen
    final: bool  #: the last redraw


class _Bar(LoopCallbackBase):
    """What both bars share: the unit, the throttle, and fetching on redraw only.

    Hooks: ``on_train_batch_end`` (update), ``on_epoch_end`` (redraw with the evaluation's
    values), ``on_train_end`` (the final line), and with ``running_mean=True``
    ``on_epoch_begin`` (the means start again). Used in ``ciclo.loop`` (``**bar`` or under
    a schedule), the bar updates on each call and draws its final line once the count
    reaches ``total``.
    """

    __loop_observer__ = True  # reads the loop only: runs once per fused group
    #: Only with ``running_mean=True`` (so that a bar without it changes nothing at an
    #: epoch's start, e.g. where fused steps are grouped).
    on_epoch_begin: Callable[[Any, Any, Elapsed, LoopState], None]

    def __init__(
        self,
        total: int | Period | None,
        interval: float,
        file: IO[str] | None,
        what: str,
        process: int | None = OUTPUT_PROCESS,
        running_mean: bool = False,
        exclude: Iterable[str] = EXCLUDED,
    ) -> None:
        self.what = what
        patterns = [exclude] if isinstance(exclude, str) else list(exclude)
        if not all(isinstance(p, str) for p in patterns):
            raise TypeError(
                f"{what}(exclude={exclude!r}): give names or patterns, e.g. 'goodput_*'."
            )
        self._excluded = re.compile("|".join(map(fnmatch.translate, patterns)) or "(?!)").match
        self._overrun = False  # whether a step ran past the total (said once)
        # Without a total, the loop tells it when the bar is first called (see _read_total).
        self.total_from_loop = total is None
        if total is None:
            self.unit, self.total = "steps", math.inf
        else:
            self.unit, self.total = period_unit(total, f"{what}(total)")
        self.running_mean = check_running_mean(running_mean, what)
        self._means = RunningMean() if running_mean else None
        self._from_step: int | None = None  # where the means start without an epoch
        if running_mean:
            self.on_epoch_begin = self._epoch_begins
        self.process = check_output_process(process, what)
        if interval < 0:
            raise ValueError(f"{what}: interval must be >= 0 seconds, got {interval!r}.")
        self.interval = interval
        self._file = file
        self._origin: tuple[float, float, Elapsed] | None = None  # (clock, count, elapsed)
        self._last_draw = -math.inf
        self._next_check = -math.inf  # monotonic time before which no redraw is due
        # Off on the processes that do not write: they finish at once, and never fetch.
        self.finished = not writes_here(self.process)

    @property
    def file(self) -> IO[str]:
        return self._file if self._file is not None else sys.stdout

    def _read_total(self, loop_state: LoopState) -> None:
        """The total of a bar given none: the loop's ``stop`` (in its unit), else the
        dataset's ``len()`` in steps (the smaller one when both count steps)."""
        self.total_from_loop = False
        stop = loop_state.inputs.stop
        unit = total = None
        if stop is not None:
            # a stop in several units leaves it to the dataset
            with contextlib.suppress(TypeError, ValueError):
                unit, total = period_unit(stop, "stop")
        try:
            length: int | None = len(loop_state.inputs.dataset)
        except TypeError:
            length = None
        if length is not None and unit in (None, "steps"):
            end = loop_state.initial_elapsed.steps + length
            unit, total = "steps", end if total is None else min(total, end)
        if unit is None or total is None:
            raise TypeError(MSG_NO_TOTAL.format(what=self.what))
        self.unit, self.total = unit, total

    def _count(self, elapsed: Elapsed) -> float:
        return float(getattr(elapsed, self.unit))

    def _count_after_step(self, loop_state: LoopState) -> float:
        """``_count(loop_state.elapsed_after_step())``; for steps without building it."""
        if self.unit == "steps":
            return float(loop_state.steps_after_step())
        return self._count(loop_state.elapsed_after_step())

    def update(
        self,
        loop_state: LoopState,
        *,
        force: bool = False,
        final: bool = False,
        training: bool = False,
    ) -> None:
        """Counts the current step; redraws when ``interval`` has passed (or when forced).
        ``training``: called right after a training step (its logs are training entries)."""
        if self.finished:
            if training and not self._overrun and self._origin is not None:
                self._overrun = self._count(loop_state.elapsed) >= self.total
                if self._overrun:
                    warnings.warn(
                        f"{self.what}: the loop runs past the bar's total ({self.total:g} "
                        f"{self.unit}); give the run's length, or no total.",
                        stacklevel=2,
                    )
            return
        if self.total_from_loop:
            self._read_total(loop_state)
        now = _time.monotonic()
        if self._origin is not None and not (final or force) and now < self._next_check:
            return  # the common case: not due yet, nothing to compute
        redraw_interval = self._redraw_interval()
        due = final or force or now - self._last_draw >= redraw_interval
        if self._origin is not None and not due:
            # Not due before the next redraw time; the interval (which depends on the
            # output, a terminal or not) is asked again at least every `interval` seconds.
            self._next_check = min(self._last_draw + redraw_interval, now + self.interval)
            return
        after = loop_state.elapsed_after_step()
        count = self._count(after)
        if self._origin is None:
            self._origin = (now, count, loop_state.elapsed)
        if not due:
            return
        self._last_draw = now
        self._next_check = now + self.interval  # the redraw interval is never below it
        values = self._values(loop_state, training)
        clock, first_count, first = self._origin
        if self.unit == "time":
            eta: float | None = max(self.total - count, 0.0)
        else:  # the rate since the first update, which leaves out compiling the first step
            rate = (now - clock) / (count - first_count) if count > first_count else None
            eta = None if rate is None else rate * max(self.total - count, 0.0)
        run = (after.time - first.time, count - self._count(first))
        self._draw(Frame(count, values, eta, run, final))
        self.finished = final

    def _values(self, loop_state: LoopState, training: bool) -> dict[str, Any]:
        """The values to show, on the host: the latest of each entry, or with
        ``running_mean`` the mean of each training entry over the epoch."""
        excluded = self._excluded
        latest = {k: v for k, v in latest_entries(loop_state).items() if not excluded(k[1])}
        means = self._means
        if means is None:
            return named_entries(_host.to_host(latest))
        by_hand = called_by_hand(loop_state)
        if training:
            means.note(loop_state)
        if self._from_step is None:  # no epoch began before: see _epoch_begins
            self._from_step = (
                loop_state.elapsed.steps  # a train_loop resumed within an epoch
                if self._in_train_loop
                else loop_state.initial_elapsed.steps  # ciclo.loop: since the loop began
            )
        values = means.values(loop_state, latest, by_hand, self._from_step)
        return named_entries({k: v for k, v in values.items() if not excluded(k[1])})

    def _redraw_interval(self) -> float:
        """Seconds between redraws; never below ``interval``."""
        return self.interval

    def _draw(self, frame: Frame) -> None:
        raise NotImplementedError

    # --- hooks -----------------------------------------------------------------------------
    _in_train_loop = False  # whether on_train_batch_end updates the bar

    def __loop_callback__(self, loop_state: LoopState) -> None:
        if self._means is not None and not self.finished and called_by_hand(loop_state):
            self._means.keep(loop_state)  # by hand: no history keeps the values
        if self.total_from_loop:
            self._read_total(loop_state)
        if self.unit == "steps":  # _count_after_step, inlined (once per step)
            final = loop_state.elapsed.steps + (loop_state.batch is not None) >= self.total
        else:
            final = self._count_after_step(loop_state) >= self.total
        if not final and self._origin is not None and _time.monotonic() < self._next_check:
            return  # update's common case, inlined: not due yet
        self.update(loop_state, final=final, training=True)

    def on_train_batch_end(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        self._in_train_loop = True
        self.update(loop_state, training=True)

    def _epoch_begins(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        """``on_epoch_begin`` with ``running_mean=True``: the means start again."""
        if self._means is not None and not self.finished:
            self._means.restart(loop_state)
            self._from_step = loop_state.elapsed.steps

    def on_epoch_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> None:
        # Shows the evaluation's values; at the last step the final line follows anyway.
        if self.total_from_loop:
            self._read_total(loop_state)
        if self._count_after_step(loop_state) < self.total:
            self.update(loop_state, force=True)

    def on_train_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> None:
        self.update(loop_state, final=True)


def _format_value(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:.4f}" if abs(number) > 1e-3 or number == 0 else f"{number:.4e}"


def _format_eta(seconds: float) -> str:
    whole = round(seconds)
    if whole >= 3600:
        return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"
    if whole >= 60:
        return f"{whole // 60}:{whole % 60:02d}"
    return f"{whole}s"


def _format_per_unit(seconds: float, unit: str) -> str:
    if seconds >= 1:
        return f"{seconds:.0f}s/{unit}"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f}ms/{unit}"
    return f"{seconds * 1e6:.0f}us/{unit}"


class KerasBar(_Bar):
    """A Keras-style progress line for a run of ``total`` steps, samples or seconds::

        80/100 [=======================>......] - ETA: 2s - accuracy: 0.6148 - loss: 1.5371
        100/100 [==============================] - 5s 50ms/step - accuracy: 0.9 - loss: 0.31

    It shows the latest value of every scalar loss and metric (evaluation entries once they
    exist) and reaches ``total/total`` when the run ends; it fetches values only to redraw.

    Args:
        total: an int (steps) or ``ciclo.at(samples=...)`` / ``ciclo.at(time=seconds)``;
            by default the loop's ``stop``, else ``len(dataset)`` steps.
        interval: seconds between redraws on a terminal.
        plain_interval: seconds between lines when not on a terminal (also one per epoch).
        width: characters of the bar.
        dynamic: redraw in place (``\\r``); by default on a terminal or a notebook.
        file: where to write (``sys.stdout`` by default).
        process: the process that draws the bar (0), or ``None`` for every process.
        running_mean: show Keras' values: training entries averaged over the epoch so far,
            weighted by samples, read from the loop's history (no step waits for the device).
        exclude: entries left out, by name or pattern (``"val_*"``); by default the
            ledger's seconds, ``goodput_*``.

    Put it in ``callbacks=[...]`` of :func:`ciclo.train_loop`, or spread it into the tasks of
    :func:`ciclo.loop` after the training step.

    Example:
        >>> import ciclo, io, numpy as np
        >>> out = io.StringIO()
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", 0.5), state
        >>> _ = ciclo.loop(
        ...     None, [np.ones(2)] * 4,
        ...     {ciclo.every(1): train_step, **ciclo.keras_bar(4, file=out)},
        ... )
        >>> out.getvalue().splitlines()[-1].startswith("4/4 [======")
        True
    """

    def __init__(
        self,
        total: int | Period | None = None,
        *,
        interval: float = 0.1,
        plain_interval: float = 10.0,
        width: int = 30,
        dynamic: bool | None = None,
        file: IO[str] | None = None,
        process: int | None = OUTPUT_PROCESS,
        running_mean: bool = False,
        exclude: Iterable[str] = EXCLUDED,
    ) -> None:
        super().__init__(total, interval, file, "keras_bar", process, running_mean, exclude)
        self.plain_interval = plain_interval
        self.width = width
        self._dynamic = dynamic
        self._line_length = 0

    @property
    def dynamic(self) -> bool:
        """Whether the line is redrawn in place (a terminal or a notebook)."""
        if self._dynamic is not None:
            return self._dynamic
        isatty = getattr(self.file, "isatty", None)
        return bool(isatty and isatty()) or "ipykernel" in sys.modules

    def _redraw_interval(self) -> float:
        return self.interval if self.dynamic else max(self.interval, self.plain_interval)

    def line(self, frame: Frame) -> str:
        """The text of the line: ``80/100 [=====>....] - ETA: 42s - loss: 1.5371``."""
        count, values, eta, (seconds, progress), final = frame
        total = self.total
        count = min(count, total)  # the last batch may overshoot a samples or time total
        if self.unit == "time":
            digits = 0 if total >= 10 else 1
            counter = f"{count:.{digits}f}s/{total:.{digits}f}s"
        else:
            digits = len(str(int(total)))
            counter = f"{int(count):{digits}d}/{int(total)}"
        done = int(self.width * min(count / total, 1.0))
        bar = ("=" * (done - 1) + ("=" if count >= total else ">")) if done else ""
        parts = [f"{counter} [{bar}{'.' * (self.width - done)}]"]
        if final:
            timing = f"{seconds:.0f}s"
            if self.unit != "time" and progress > 0:
                unit = "step" if self.unit == "steps" else "sample"
                timing += " " + _format_per_unit(seconds / progress, unit)
            parts.append(timing)
        elif eta is not None:
            parts.append(f"ETA: {_format_eta(eta)}")
        parts += [f"{name}: {_format_value(value)}" for name, value in values.items()]
        return " - ".join(parts)

    def _draw(self, frame: Frame) -> None:
        text = self.line(frame)
        final = frame.final
        file = self.file
        if self.dynamic:
            padding = " " * max(self._line_length - len(text), 0)
            file.write(f"\r{text}{padding}" + ("\n" if final else ""))
            self._line_length = 0 if final else len(text)
        else:
            file.write(text + "\n")
        file.flush()


keras_bar = KerasBar
"""Another name of :class:`KerasBar` (the same class)."""


class TqdmBar(_Bar):
    """A `tqdm <https://tqdm.github.io>`_ bar for a run of ``total`` steps, samples or
    seconds, with the latest losses and metrics as its postfix (or, with
    ``running_mean=True``, Keras' values: see :class:`KerasBar`).

    Args:
        total: steps, or ``ciclo.at(samples=...)`` / ``ciclo.at(time=...)``, as in
            :class:`KerasBar`.
        interval: seconds between redraws.
        file: where to write (tqdm's default, stderr, when ``None``).
        running_mean: training entries averaged over the epoch, as in :class:`KerasBar`.
        exclude: entries left out, as in :class:`KerasBar`.
        process: the process that draws the bar (0), or ``None`` for every process.
        **tqdm_kwargs: passed to ``tqdm`` (``desc``, ``ncols``, ``leave``...).

    Example:
        >>> import ciclo
        >>> bar = ciclo.tqdm_bar(ciclo.at(samples=60_000), desc="train")
        >>> bar.unit, bar.total
        ('samples', 60000)
    """

    by_hand_arguments = ("batch", "logs")  # bar(elapsed, batch), as in the original ciclo

    def __init__(
        self,
        total: int | Period | None = None,
        *,
        interval: float = 0.1,
        file: IO[str] | None = None,
        running_mean: bool = False,
        exclude: Iterable[str] = EXCLUDED,
        process: int | None = OUTPUT_PROCESS,
        **tqdm_kwargs: Any,
    ) -> None:
        super().__init__(total, interval, file, "tqdm_bar", process, running_mean, exclude)
        self.tqdm_kwargs = tqdm_kwargs
        self.bar: Any = None

    def _draw(self, frame: Frame) -> None:
        count, values, _, run, final = frame
        if self.bar is None:
            from tqdm.auto import tqdm

            unit = {"steps": "step", "samples": "sample", "time": "s"}[self.unit]
            total = self.total if self.unit == "time" else int(self.total)
            kwargs = {"unit": unit, "mininterval": self.interval, "dynamic_ncols": True}
            start = count - run[1]  # where this run started (a resumed run starts late)
            self.bar = tqdm(
                total=total,
                initial=start if self.unit == "time" else int(start),
                file=self._file,
                **{**kwargs, **self.tqdm_kwargs},
            )
        bar = self.bar
        step = min(count, self.total) - bar.n
        bar.update(step if self.unit == "time" else int(step))
        bar.set_postfix({name: _format_value(v) for name, v in values.items()}, refresh=False)
        bar.refresh()
        if final:
            bar.close()


tqdm_bar = TqdmBar
"""Another name of :class:`TqdmBar` (the same class)."""
