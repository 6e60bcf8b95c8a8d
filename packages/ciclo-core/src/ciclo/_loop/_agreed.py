"""The outermost loop of a job of several processes: one place where its control decisions
are agreed.

Every decision of a loop is a function of what ``elapsed`` counts and of the stops that
callbacks and signals request. With several processes, :class:`agreed_elapse` makes both the
same on every process:

- ``elapsed.steps`` is counted alike everywhere; ``elapsed.samples`` counts the samples of
  *all* processes (each process's batch times the number of processes, checked equal at each
  agreement); ``elapsed.time`` and ``elapsed.date`` are process 0's clock as of the latest
  agreement. So every schedule (steps, samples or time), the epoch and evaluation clock of
  ``train_loop`` and ``stop=`` decide the same at the same step.
- A stop requested on any process (``loop_state.stop_iteration = True`` by a callback, early
  stopping, ``terminate_on_nan``, Ctrl-C) is a request (:class:`AgreedLoopState`): every
  process stops at the next agreement, at the same step, with the same ``stop_reason``.
- A preemption notice (SIGTERM to any process) stops every process at the step JAX's
  preemption sync point picks; the loop then exits with status 143 everywhere.

An agreement is one small exchange through JAX's coordination service before each batch is
drawn, every ``agree_every`` steps (1 by default: every decision is taken at exactly the step a
single process takes it). With ``agree_every=N``, time-based schedules and requested stops
take effect up to ``N - 1`` steps late, the same step on every process.
"""

from __future__ import annotations

import dataclasses
import signal
import time as _time
from collections.abc import Callable, Iterable
from typing import Any

from .._processes._agreement import Agreement, preemption_reached
from .._time._elapsed import Elapsed, Period, elapse
from ._state import LoopState

__all__ = ["AgreedLoopState", "agreed_elapse"]


class AgreedLoopState(LoopState):
    """A :class:`LoopState` whose stop is agreed between processes: setting
    ``stop_iteration`` (or ``stop_reason``) records this process's request, and reading
    them gives what the processes agreed (``False`` / ``None`` until they do)."""

    __slots__ = ("_agreed_reason", "_agreed_stop", "process_count", "requested", "requested_reason")

    def __init__(self, *args: Any, process_count: int, **kwargs: Any) -> None:
        self._agreed_stop = False
        self._agreed_reason: str | None = None
        self.requested = False
        self.requested_reason: str | None = None
        self.process_count = process_count
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def stop_iteration(self) -> bool:
        return self._agreed_stop

    @stop_iteration.setter
    def stop_iteration(self, value: bool) -> None:
        if value:
            self.requested = True

    @property  # type: ignore[override]
    def stop_reason(self) -> str | None:
        return self._agreed_reason

    @stop_reason.setter
    def stop_reason(self, value: str | None) -> None:
        if self._agreed_stop:
            self._agreed_reason = value
        else:
            self.requested_reason = value

    def agree_stop(self, reason: str | None) -> None:
        """Every process stops here, for ``reason``."""
        self._agreed_stop = True
        self._agreed_reason = reason

    def elapsed_after_step(self) -> Elapsed:
        if self.batch is None:
            return self.elapsed
        return dataclasses.replace(
            self.elapsed,
            steps=self.elapsed.steps + 1,
            samples=self.elapsed.samples + self.batch_size_fn(self.batch) * self.process_count,
        )


class agreed_elapse(elapse):
    """:class:`~ciclo._time._elapsed.elapse` for the outermost loop of a job of several
    processes: counts are global, the clock is process 0's, and the processes agree before
    drawing a batch (see the module docstring)."""

    def __init__(
        self,
        dataset: Iterable[Any],
        *,
        stop: int | Period | None,
        initial: Elapsed,
        batch_size_fn: Callable[[Any], int] | None,
        agreement: Agreement,
        loop_state: AgreedLoopState,
    ) -> None:
        super().__init__(dataset, stop=stop, initial=initial, batch_size_fn=batch_size_fn)
        self._agreement = agreement
        self._loop_state = loop_state
        self._start = self.elapsed.steps
        self._local_samples = 0
        self._clock = (self.elapsed.time, self.elapsed.date)  # this process's own clock
        #: The signals that stopped the loop (the list ``stop_gracefully_on`` yields): an
        #: agreed stop by a signal on any process is recorded here on every process.
        self.received: list[signal.Signals] = []

    def _count(self, elapsed: Elapsed, batch: Any) -> Elapsed:
        size = self._batch_size_fn(batch)
        self._local_samples += size
        return dataclasses.replace(
            elapsed,
            steps=elapsed.steps + 1,
            samples=elapsed.samples + size * self._agreement.count,
        )

    def __next__(self) -> tuple[Elapsed, Any]:
        if self._has_pending:
            self.elapsed = self._count(self.elapsed, self._pending)
            self._has_pending, self._pending = False, None
        step = self.elapsed.steps
        if (step - self._start) % self._agreement.every == 0:
            self._agree(step, ended=None)
        if preemption_reached(step):
            self._stop_everywhere(
                f"stopped by a preemption notice (SIGTERM) at step {step}", "SIGTERM"
            )
        if self._stop is not None and self._stop.reached_by(self.elapsed):
            raise StopIteration
        try:
            self._pending = batch = next(self._iterator)
        except StopIteration:
            every = self._agreement.every
            self._agree(self._start + ((step - self._start) // every + 1) * every, ended=step)
            raise
        self._has_pending = True
        return self.elapsed, batch

    def finish(self) -> Elapsed:
        if self._has_pending:
            self.elapsed = self._count(self.elapsed, self._pending)
            self._pending, self._has_pending = None, False
        return self.elapsed

    def _agree(self, step: int, *, ended: int | None) -> None:
        """Exchanges this process's view at ``step`` and acts on what all processes sent."""
        loop_state = self._loop_state
        own_time, own_date = self._clock
        now = _time.time()
        record = {
            "time": own_time + (now - own_date),
            "date": now,
            "samples": self._local_samples,
            "stop": loop_state.requested,
            "reason": loop_state.requested_reason,
            "signal": self.received[0].name if self.received else None,
            "ended": ended,
        }
        records = self._agreement.exchange(step, record)
        samples = [r["samples"] for r in records]
        if len(set(samples)) > 1:
            counts = ", ".join(f"process {p}: {n}" for p, n in enumerate(samples))
            raise ValueError(
                f"the processes drew different numbers of samples by step {step} ({counts}): "
                "with several processes, each one feeds an equal part of every global batch, "
                "and batch_size_fn counts the process's own part"
            )
        ends = [r["ended"] for r in records]
        if any(e is not None for e in ends) and len(set(ends)) > 1:
            done = ", ".join(f"process {p}" for p, e in enumerate(ends) if e is not None)
            more = ", ".join(f"process {p}" for p, e in enumerate(ends) if e is None)
            raise RuntimeError(
                f"the datasets of the processes have different lengths: the dataset of "
                f"{done} ended after {min(e for e in ends if e is not None)} batches, while "
                f"{more} still had batches. Give every process the same number of batches "
                f"(or stop the loop with stop=)."
            )
        self.elapsed = dataclasses.replace(
            self.elapsed, time=records[0]["time"], date=records[0]["date"]
        )
        requests = [process for process, other in enumerate(records) if other["stop"]]
        if requests:
            reason = records[requests[0]]["reason"]
            if reason is not None and len(requests) < len(records):
                reason = f"{reason} (on process {requests[0]})"
            signals = [r["signal"] for r in records if r["signal"]]
            self._stop_everywhere(reason, signals[0] if signals else None)

    def _stop_everywhere(self, reason: str | None, signal_name: str | None) -> None:
        self._loop_state.agree_stop(reason)
        if signal_name is not None:
            self.received[:] = [signal.Signals[signal_name]]
        raise StopIteration
