"""How the processes of a job agree on the loop's decisions.

With several processes (``jax.distributed``), every process runs the same loop, and every
control decision (a schedule firing, an evaluation, a checkpoint, a stop for any reason)
must be taken at the same step everywhere: a process that acts alone pairs mismatched
collectives, and the job hangs. The outermost loop of each process therefore publishes a
small record at agreed steps (rounds) through JAX's coordination service (the distributed
client's key-value store), and reads the others' one round later, when they are already
there: every process derives the same decisions from the same records, and no step waits
for another process in the common case (``ciclo._loop._agreed`` says what is decided). A
preemption notice (SIGTERM) goes through JAX's own preemption sync point
(:func:`jax.experimental.multihost_utils.reached_preemption_sync_point`).

A fault never hangs the job: an exception on one process is published, and the others end
with an error naming it, at their next exchange or, when a collective blocks them, through a
heartbeat thread; a process that dies without a word (a crash, SIGKILL) is detected when its
heartbeat stops. Both within ``fault_timeout`` seconds.

With one process nothing here runs: :func:`start_agreement` returns ``None``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

import jax
from jax.experimental import multihost_utils

__all__ = [
    "Agreement",
    "ProcessFailedError",
    "coordination_client",
    "end_agreement",
    "fault_of_another_process",
    "gather_to_all",
    "preemption_reached",
    "preemption_service_on",
    "running_agreement",
    "start_agreement",
]

#: Steps whose exchanges share a key directory, deleted as one when no longer read.
EXCHANGES_PER_BLOCK = 1000
#: Seconds between two heartbeats (and two looks for a published fault).
HEARTBEAT_SECONDS = 1.0
#: Seconds a process blocked in a collective is given to notice a fault by itself, before
#: its heartbeat thread ends it.
GRACE_SECONDS = 3.0

_loops_started = 0  # outermost multi-process loops started by this process (names their keys)
_active: Agreement | None = None  # the agreement of the running outermost loop
_exit_registered = False  # whether a lost process made this one skip JAX's shutdown
_gathers = 0  # calls of gather_to_all by this process (names their keys)


class ProcessFailedError(RuntimeError):
    """Another process of the job failed (or stopped answering), so this one ends too.

    Example:
        >>> str(ProcessFailedError("process 1 failed: ValueError('x')"))
        "process 1 failed: ValueError('x')"
    """


def coordination_client() -> Any:
    """The client of JAX's coordination service (the key-value store and barriers that
    ``jax.distributed.initialize`` sets up), or ``None`` without ``jax.distributed``.

    >>> coordination_client() is None  # a single process, no jax.distributed
    True
    """
    from jax._src import distributed  # the one accessor JAX has (orbax uses it too)

    return distributed.global_state.client


def preemption_service_on() -> bool:
    """Whether JAX's preemption service runs (it then owns SIGTERM: a notice reaching any
    process is propagated to all, and :func:`preemption_reached` answers at one step).

    >>> preemption_service_on()
    False
    """
    from jax._src import distributed

    return distributed.global_state.preemption_sync_manager is not None


def preemption_reached(step: int) -> bool:
    """Whether every process has reached the step at which a preemption notice (SIGTERM on
    any process) stops the job; ``False`` without the preemption service.

    >>> preemption_reached(0)
    False
    """
    try:
        return multihost_utils.reached_preemption_sync_point(step)
    except RuntimeError:  # the preemption service is disabled
        return False


def gather_to_all(name: str, value: Any, *, timeout: float = 60.0) -> list[Any]:
    """``value`` (JSON-serialisable) of every process, in process order; every process must
    call it with the same ``name``, once. With one process: ``[value]``.

    >>> gather_to_all("doc", {"a": 1})
    [{'a': 1}]
    """
    client = coordination_client()
    count = jax.process_count()
    if client is None or count == 1:
        return [value]
    global _gathers
    _gathers += 1  # every process gathers in the same order: the n-th gather has one name
    me = jax.process_index()
    prefix = f"ciclo/gather/{_gathers}/{name}/"
    client.key_value_set(prefix + str(me), json.dumps(value))
    out = []
    for process in range(count):
        if process == me:
            out.append(value)
            continue
        try:
            raw = client.blocking_key_value_get(prefix + str(process), int(timeout * 1000))
        except Exception as error:
            raise ProcessFailedError(
                f"process {process} did not send its part of {name!r} within {timeout:g} s"
            ) from error
        out.append(json.loads(raw))
    return out


_PROCESS_DID_NOT_REACH = (
    "process {process} did not reach {what} of the loop within {timeout:g} s (this is process "
    "{me}): it failed, hangs, or runs a different loop. Its own log says why; raise "
    "fault_timeout= if its steps are that slow."
)
_NO_SIGN_OF_LIFE = (
    "process {other} gave no sign of life for {timeout:g} s (this is process {me}, whose error "
    "follows from it): it crashed or was killed. Its own log says why."
)


class Agreement:
    """The exchanges of one outermost loop across the processes of a job.

    Every process calls :meth:`exchange` at the same steps with a small JSON record and gets
    the records of all processes, in process order. :meth:`fail` publishes this process's
    error; :meth:`close` ends the heartbeat.

    Args:
        name: the loop's name, the same on every process (the n-th outermost loop).
        every: the number of steps between two rounds of exchanges, or ``None`` to let
            process 0 choose it from the speed of the steps (see ``ciclo._loop._agreed``).
        timeout: seconds to wait for another process before calling it failed.
    """

    def __init__(self, name: str, *, every: int | None, timeout: float) -> None:
        self.client = coordination_client()
        self.process = jax.process_index()
        self.count = jax.process_count()
        self.every = every
        self.timeout = timeout
        self._prefix = f"ciclo/{name}/"
        self._block: int | None = None
        self._mine: dict[int | str | None, dict[str, Any]] = {}  # this process's records
        self._next_key: str | None = None
        self._noticed = threading.Event()  # the main thread saw another process's fault
        self._closed = threading.Event()
        self._beats = threading.Thread(target=self._beat, name="ciclo-heartbeat", daemon=True)
        self._beats.start()

    # --- the exchange ---------------------------------------------------------------------
    # Exchanges are numbered (rounds, or "end"); each process writes its record under the
    # number, and reads the others' when it needs them. Writing never waits; reading waits
    # only for a process that has not written yet.
    def _key(self, number: int | str) -> str:
        block = number // EXCHANGES_PER_BLOCK if isinstance(number, int) else number
        return f"{self._prefix}{block}/{number}/"

    def post(self, number: int | str, record: dict[str, Any]) -> None:
        """Publishes this process's ``record`` for exchange ``number`` (without waiting)."""
        self.client.key_value_set(self._key(number) + str(self.process), json.dumps(record))
        self._mine[number] = record
        self._mine.pop(number - 2 if isinstance(number, int) else None, None)
        if isinstance(number, int):
            following = number + 1
            self._next_key = self._key(following) + str(self.process)
            block = number // EXCHANGES_PER_BLOCK
            if block != self._block:
                # Every process has read the records of two blocks ago (it is writing this
                # one's, and reads at most one exchange back): process 0 drops them.
                if self.process == 0 and self._block is not None and block >= 2:
                    with contextlib.suppress(Exception):
                        self.client.key_value_delete(f"{self._prefix}{block - 2}/")
                self._block = block

    def read(self, number: int | str, *, what: str) -> list[dict[str, Any]]:
        """Every process's record for exchange ``number``, in process order (this process
        must have posted its own); ``what`` names the moment in errors ("step 120")."""
        key = self._key(number)
        records: list[dict[str, Any]] = []
        for process in range(self.count):
            if process == self.process:
                records.append(self._mine[number])
                continue
            try:
                raw = self.client.blocking_key_value_get(
                    key + str(process), int(self.timeout * 1000)
                )
            except Exception as error:
                self._noticed.set()
                _skip_jax_shutdown_at_exit(1, self)
                raise ProcessFailedError(
                    _PROCESS_DID_NOT_REACH.format(
                        process=process, what=what, timeout=self.timeout, me=self.process
                    )
                ) from error
            other = json.loads(raw)
            if "fault" in other:
                self._noticed.set()
                _skip_jax_shutdown_at_exit(1, self)  # the failed one skips it: no barrier to meet
                raise ProcessFailedError(f"process {process} failed: {other['fault']}")
            records.append(other)
        return records

    def exchange(self, number: int | str, record: dict[str, Any]) -> list[dict[str, Any]]:
        """Publishes ``record`` for exchange ``number`` and returns every process's record
        for it (waits for all)."""
        self.post(number, record)
        return self.read(number, what=f"exchange {number}")

    def fail(self, error: BaseException) -> None:
        """Publishes this process's error, so the others end too instead of waiting."""
        if isinstance(error, ProcessFailedError):
            return  # another process failed first; it already said so
        # The others end on this fault, process 0 with the coordination service: JAX's
        # shutdown at this process's exit would then abort it (SIGABRT, a C++ trace) instead
        # of letting it end with its own error's status.
        # Process 0 holds the service: at its exit it waits (a little) for the others to
        # end first, so that they end with their own errors too.
        _skip_jax_shutdown_at_exit(_exit_status(error), self)
        with contextlib.suppress(Exception):
            earlier = self._published_fault()
            if earlier is not None:  # a collective that failed with it: name the cause
                error.add_note(f"(ciclo: {earlier}; this process's error follows from it.)")
                return
        fault = json.dumps({"fault": f"{type(error).__name__}: {error}", "process": self.process})
        for key in (f"{self._prefix}fault", self._next_key):
            if key is not None:
                with contextlib.suppress(Exception):  # the key exists, or the service is gone
                    self.client.key_value_set(key, fault)

    def lost_process(self) -> ProcessFailedError | None:
        """After an error on this process (a collective that failed, say): whether another
        process is gone, having stopped beating. Waits until each other process shows a
        sign of life (a heartbeat, about a second) or ``timeout`` passes; returns the error
        that names the silent process, or ``None``."""
        with contextlib.suppress(Exception):
            if self._published_fault() is not None:
                return None  # another process failed first, and said so
        others = [p for p in range(self.count) if p != self.process]
        first = {p: self._heartbeat(p) for p in others}
        start = time.monotonic()
        while True:
            others = [p for p in others if self._heartbeat(p) in (first[p], "")]
            if not others:
                return None
            if time.monotonic() - start > self.timeout:
                _skip_jax_shutdown_at_exit(1, self)
                return ProcessFailedError(
                    _NO_SIGN_OF_LIFE.format(other=others[0], timeout=self.timeout, me=self.process)
                )
            time.sleep(0.1)

    def _heartbeat(self, process: int) -> str:
        try:
            return str(self.client.key_value_try_get(f"{self._prefix}alive/{process}"))
        except Exception:  # not beating yet, or the service is gone
            return ""

    def close(self) -> None:
        """Ends the heartbeat; the others see this process as done, not silent."""
        self._closed.set()
        with contextlib.suppress(Exception):
            self.client.key_value_set(
                f"{self._prefix}alive/{self.process}", "done", allow_overwrite=True
            )

    def wait_for_the_others(self, *, seconds: float) -> None:
        """Waits until every other process has ended its loop (or ``seconds``): the process
        that hosts the coordination service keeps it up until they end on their own."""
        deadline = time.monotonic() + seconds
        others = [p for p in range(self.count) if p != self.process]
        while others and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                alive = self.client.key_value_try_get(f"{self._prefix}alive/{others[0]}")
                if alive == "done":
                    others.pop(0)
                    continue
            time.sleep(0.05)
        time.sleep(0.2)  # their os._exit follows their "done" at once

    # --- the heartbeat --------------------------------------------------------------------
    def _beat(self) -> None:
        """Beats, and ends this process when another one failed or went silent while this
        one's main thread is blocked (in a collective that will never complete)."""
        seen: dict[int, tuple[str, float]] = {}
        beat = 0
        while not self._closed.wait(HEARTBEAT_SECONDS):
            beat += 1
            try:
                self.client.key_value_set(
                    f"{self._prefix}alive/{self.process}", str(beat), allow_overwrite=True
                )
                problem = self._published_fault() or self._silent_process(seen)
            except Exception:
                if self._closed.is_set():
                    return
                problem = "the coordination service stopped answering"
            if problem is None:
                continue
            if self._closed.wait(GRACE_SECONDS) or self._noticed.is_set():
                return  # the main thread ended the loop, or raised the error itself
            print(
                f"ciclo: {problem}; process {self.process} is blocked waiting for it and "
                f"ends now (exit status 1).",
                file=sys.stderr,
                flush=True,
            )
            if self.process == 0:  # it holds the service: the others end first
                self.wait_for_the_others(seconds=GRACE_SECONDS + 2 * HEARTBEAT_SECONDS)
            os._exit(1)

    def _published_fault(self) -> str | None:
        try:
            raw = self.client.key_value_try_get(f"{self._prefix}fault")
        except Exception:  # not found: no fault
            return None
        fault = json.loads(raw)
        if fault.get("process") == self.process:
            return None
        return f"process {fault.get('process')} failed: {fault.get('fault')}"

    def _silent_process(self, seen: dict[int, tuple[str, float]]) -> str | None:
        now = time.monotonic()
        for process in range(self.count):
            if process == self.process:
                continue
            try:
                value = self.client.key_value_try_get(f"{self._prefix}alive/{process}")
            except Exception:
                value = ""  # not beating yet
            if value == "done":
                continue
            last = seen.get(process)
            if last is None or last[0] != value:
                seen[process] = (value, now)
            elif now - last[1] > self.timeout:
                return f"process {process} gave no sign of life for {self.timeout:g} s"
        return None


def _exit_status(error: BaseException) -> int:
    """The status a process ends with when ``error`` leaves it (as Python would)."""
    if isinstance(error, SystemExit):
        code = error.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(error, KeyboardInterrupt):
        return 128 + 2
    return 1


def fault_of_another_process() -> ProcessFailedError | None:
    """The error naming another process's published fault, when the running outermost loop
    of several processes has one (a collective of this process then failed because of it:
    that error says less than this one); else ``None``."""
    agreement = _active
    if agreement is None:
        return None
    try:
        fault = agreement._published_fault()
    except Exception:
        return None
    if fault is None:
        return None
    agreement._noticed.set()
    _skip_jax_shutdown_at_exit(1, agreement)  # the failed one skips it: no barrier to meet
    return ProcessFailedError(fault)


def _skip_jax_shutdown_at_exit(status: int, agreement: Agreement) -> None:
    """A process of the job is gone (or goes because this one failed): JAX's shutdown at
    exit would wait for it at a barrier until the coordination service's heartbeat timeout
    (100 s by default), or abort when the service goes. Ends this process with ``status``
    first, once the other exit handlers registered after JAX's have run. Process 0, which
    holds the service, first waits a few seconds for the others of ``agreement`` to end
    (else they would abort when the service goes)."""
    global _exit_registered
    if _exit_registered:
        return
    _exit_registered = True

    def exit_now() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if agreement.process == 0:
            agreement.wait_for_the_others(seconds=GRACE_SECONDS + 2 * HEARTBEAT_SECONDS)
        os._exit(status)

    atexit.register(exit_now)


_BAD_AGREE_EVERY = (
    "agree_every={every!r}: expected None (the default: the processes agree every 0.1-0.5 s, "
    "however long a step takes) or an int >= 1, the number of steps between two rounds of "
    "agreement"
)


def start_agreement(*, every: int | None, timeout: float) -> Agreement | None:
    """The agreement of an outermost loop starting now, or ``None`` with one process, without
    ``jax.distributed``, or inside another loop (whose decisions are already agreed).

    >>> start_agreement(every=None, timeout=60.0) is None  # one process
    True
    """
    global _loops_started, _active
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(_BAD_AGREE_EVERY.format(every=every))
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(
            f"fault_timeout={timeout!r}: expected a number of seconds > 0, how long a process "
            "waits for another before ending the job with an error (default 60)"
        )
    if _active is not None or jax.process_count() == 1 or coordination_client() is None:
        return None
    _loops_started += 1
    _active = Agreement(f"loop{_loops_started}", every=every, timeout=float(timeout))
    return _active


def running_agreement() -> Agreement | None:
    """The agreement of the outermost loop running now (``None`` with one process): what a
    thread that must end the job (``ciclo.watchdog``'s) publishes its fault through.

    >>> running_agreement() is None
    True
    """
    return _active


def end_agreement(agreement: Agreement) -> None:
    """Ends ``agreement`` (the loop is over, normally or not)."""
    global _active
    agreement.close()
    if _active is agreement:
        _active = None
