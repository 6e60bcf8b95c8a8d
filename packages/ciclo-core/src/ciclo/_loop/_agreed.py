"""The decisions of an outermost loop of several processes, agreed without blocking a step.

Steps and samples (all processes' samples) are computed alike everywhere, so step and
sample schedules and decisions on the identical history take effect at once. What differs
per process (its clock, a requested stop, Ctrl-C, its sample count) is published at each
*round* and read one round later, so no step waits unless a process is a round behind:
``elapsed.time`` becomes process 0's clock and a stop anywhere stops every process at the
same step. SIGTERM under JAX's preemption service stops at the step its sync point names.

Rounds come every ``agree_every`` steps, or by default :func:`round_spacing` apart (0.1 to
0.5 s of process 0's steps, at most :data:`MAX_ROUND_STEPS`): a decision takes effect one to
two rounds after it was due. The first round and the end are exchanged with waiting.
"""

from __future__ import annotations

import dataclasses
import signal
import time as _time
from collections.abc import Callable
from typing import Any

from .._processes._agreement import Agreement, preemption_reached, preemption_service_on
from .._time._elapsed import Elapsed, elapse
from .._time._phases import FIRST_STEP
from ._state import LoopState, StopKind

__all__ = ["AgreedDecisions", "round_spacing"]

#: The default cadence's seconds between two rounds: at least, at most, and the share of
#: process 0's time its rounds may take. On 2 processes on 2 CPU cores a round (~2 ms of
#: calls) cost each 5-8 ms of steps: 5% of the run 0.1 s apart (benchmarks/NOTES.md).
ROUND_SECONDS, MAX_ROUND_SECONDS, ROUND_SHARE = 0.1, 0.5, 0.005
#: The most steps between two rounds with the default cadence.
MAX_ROUND_STEPS = 10_000


def round_spacing(round_seconds: float) -> float:
    """The seconds between two rounds of the default cadence after one that took
    ``round_seconds`` on process 0: 0.1, or more, so that rounds take at most 0.5% of its
    time (0.5 at most).

    Example:
        >>> round_spacing(0.0002), round_spacing(0.002), round_spacing(0.05)
        (0.1, 0.4, 0.5)
    """
    return min(MAX_ROUND_SECONDS, max(ROUND_SECONDS, round_seconds / ROUND_SHARE))


_SAMPLES_DIFFER = (
    "the processes drew different numbers of samples by step {step} ({counts}): with several "
    "processes, each one feeds an equal part of every global batch, and batch_size_fn counts "
    "the process's own part"
)
_LENGTHS_DIFFER = (
    "the datasets of the processes have different lengths: the dataset of {done} ended "
    "after {first} batches, while {more} still had batches. Give every process the same "
    "number of batches (or stop the loop with stop=)."
)


class AgreedDecisions:
    """The agreement of one outermost loop of several processes, consulted by the loop
    (see the module docstring): it pauses the loop's :class:`~ciclo.elapse` before the
    batches of its rounds, and arbitrates ``loop_state.request_stop``.

    Args:
        agreement: the exchanges of this loop (``ciclo._processes._agreement``).
        loop_state: the loop's state; its stops are routed here.
        received: the signals that stopped the loop (the list ``stop_gracefully_on``
            yields), shared by every process once a signal stopped one.
    """

    def __init__(
        self, agreement: Agreement, loop_state: LoopState, received: list[signal.Signals]
    ) -> None:
        self.agreement = agreement
        self.loop_state = loop_state
        self.received = received
        self.count = agreement.count
        self.requested = False
        self.requested_reason: str | None = None
        self.requested_kind = StopKind.CALLBACK
        self.preemption = preemption_service_on()
        self.round = 0
        self.first_round = 0  # the round read without a round before it (waits for all)
        self.next_round = 0
        self.round_every = agreement.every or 1
        self.local_samples = 0
        self.clock = (0.0, 0.0)  # this process's own (time, date) when the loop started
        self.last_round = (0, 0.0)  # (step, wall time) of process 0's previous round
        self.round_seconds = 0.0  # what the last round (not a first one) took on this process
        loop_state.arbitrate_stops(self)

    # --- set-up ------------------------------------------------------------------------------
    def batch_size_fn(self, local: Callable[[Any], int]) -> Callable[[Any], int]:
        """The loop's ``batch_size_fn`` for its global count: each process's samples times
        the number of processes (the local count is kept to check that they agree)."""

        def global_size(batch: Any) -> int:
            size = local(batch)
            self.local_samples += size
            return size * int(self.count)

        return global_size

    def attach(self, steps: elapse) -> None:
        """Pauses ``steps`` (built with ``clock=False``) before the batch of each round."""
        self.clock = (steps.elapsed.time, steps.elapsed.date)
        self.next_round = steps.elapsed.steps
        steps.pause_before(self.next_round, self._before_batch)

    def restart(self, steps: elapse) -> None:
        """The loop runs again from an earlier point (a rollback, agreed at the step where
        every process stopped): the stop it agreed on is done with, and ``steps`` (the
        batches from that point) pause before their first batch for a round."""
        self.requested, self.requested_reason = False, None
        self.first_round = self.round  # waits for everyone: the round before asked the stop
        self.attach(steps)

    # --- what the loop state asks (StopArbiter) ----------------------------------------------
    def request(self, reason: str | None, kind: StopKind) -> None:
        self.requested, self.requested_kind = True, kind
        if reason is not None:
            self.requested_reason = reason

    def request_reason(self, reason: str | None) -> None:
        self.requested_reason = reason

    def elapsed_after(self, elapsed: Elapsed, batch_size: int) -> Elapsed:
        return dataclasses.replace(
            elapsed, steps=elapsed.steps + 1, samples=elapsed.samples + batch_size * self.count
        )

    # --- the rounds ----------------------------------------------------------------------------
    def _before_batch(self, steps: elapse) -> None:
        step = steps.elapsed.steps
        if step >= self.next_round:
            self._round(steps, step)
        if self.preemption and preemption_reached(step):
            self._stop_everywhere(
                f"stopped by a preemption notice (SIGTERM) at step {step}",
                StopKind.INTERRUPTED,
                "SIGTERM",
            )
        steps.pause_before(step + 1 if self.preemption else self.next_round, self._before_batch)

    def _record(self, step: int, ended: int | None) -> dict[str, Any]:
        own_time, own_date = self.clock
        now = _time.time()
        record: dict[str, Any] = {
            "time": own_time + (now - own_date),
            "date": now,
            "samples": self.local_samples,
            "stop": self.requested,
            "reason": self.requested_reason,
            "kind": str(self.requested_kind),
            "signal": self.received[0].name if self.received else None,
            "ended": ended,
        }
        if self.agreement.process == 0:
            record["every"] = self._proposed_every(step, now)
        phases = self.loop_state.phases
        if phases is not None:  # a ledger watches: each process's seconds in steps (stragglers)
            record["step_seconds"] = phases.stepped + phases.seconds[FIRST_STEP]
        return record

    def _proposed_every(self, step: int, now: float) -> int:
        if self.agreement.every is not None:
            return self.agreement.every
        last_step, last_time = self.last_round
        self.last_round = (step, now)
        if step <= last_step:
            return 1
        per_second = (step - last_step) / max(now - last_time, 1e-9)
        return max(1, min(MAX_ROUND_STEPS, round(round_spacing(self.round_seconds) * per_second)))

    def _round(self, steps: elapse, step: int) -> None:
        number = self.round
        self.round += 1
        record = self._record(step, ended=None)
        started = _time.perf_counter()
        self.agreement.post(number, record)
        # The first round waits for everyone (the processes start together): what a round
        # costs is timed on later ones, which read the round before, published a round ago.
        previous = number if number == self.first_round else number - 1
        records = self.agreement.read(previous, what=f"step {step}")
        self.round_seconds = _time.perf_counter() - started if previous != number else 0.0
        if self.loop_state.phases is not None:
            self.loop_state.phases.peers = [
                float(record.get("step_seconds", 0.0)) for record in records
            ]
        self.round_every = int(records[0]["every"])
        self.next_round = step + self.round_every
        self._apply(steps, records, step)

    def _apply(self, steps: elapse, records: list[dict[str, Any]], step: int) -> None:
        samples = [record["samples"] for record in records]
        if number_of_values(samples) > 1 and all(r["ended"] is None for r in records):
            counts = ", ".join(f"process {p}: {n}" for p, n in enumerate(samples))
            raise ValueError(_SAMPLES_DIFFER.format(step=step, counts=counts))
        ends = [record["ended"] for record in records]
        if any(end is not None for end in ends):
            self._raise_lengths_differ(ends)
        steps.set_clock(records[0]["time"], records[0]["date"])
        requests = [process for process, record in enumerate(records) if record["stop"]]
        if requests:
            reason = records[requests[0]]["reason"]
            if reason is not None and len(requests) < len(records):
                reason = f"{reason} (on process {requests[0]})"
            signals = [record["signal"] for record in records if record["signal"]]
            kind = StopKind(records[requests[0]]["kind"])
            self._stop_everywhere(reason, kind, signals[0] if signals else None)

    def _stop_everywhere(self, reason: str | None, kind: StopKind, signal_name: str | None) -> None:
        self.loop_state.apply_stop(reason, kind)
        if signal_name is not None:
            self.received[:] = [signal.Signals[signal_name]]
        raise StopIteration

    # --- the end -------------------------------------------------------------------------------
    def finish(self, step: int) -> None:
        """The loop ended at ``step`` (its data, ``stop=`` or an agreed stop): checks with
        every process that they all ended there, and agrees on a stop requested since the
        last round (its reason and signal are kept; the loop is over anyway)."""
        # A process whose data ends early also posts its end under the next round, which
        # the others read instead of waiting for it.
        record = self._record(step, ended=step)
        self.agreement.post(self.round, record)
        records = self.agreement.exchange("end", record)
        self._raise_lengths_differ([r["ended"] for r in records])
        requests = [process for process, r in enumerate(records) if r["stop"]]
        if requests and not self.loop_state.stop_iteration:
            signals = [r["signal"] for r in records if r["signal"]]
            if signals:
                self.received[:] = [signal.Signals[signals[0]]]
            first = records[requests[0]]
            self.loop_state.apply_stop(first["reason"], StopKind(first["kind"]))

    def _raise_lengths_differ(self, ends: list[int | None]) -> None:
        if number_of_values(ends) <= 1:
            return
        ended = [e for e in ends if e is not None]
        done = ", ".join(f"process {p}" for p, e in enumerate(ends) if e == min(ended))
        more = ", ".join(f"process {p}" for p, e in enumerate(ends) if e != min(ended))
        raise RuntimeError(_LENGTHS_DIFFER.format(done=done, first=min(ended), more=more))


def number_of_values(values: list[Any]) -> int:
    """How many different values ``values`` holds.

    >>> number_of_values([3, 3, None])
    2
    """
    return len(set(values))
