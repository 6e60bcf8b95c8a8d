"""The writers of a checkpoint callback's saves, one interface (``start``, ``running``,
``join``, ``finish``, ``close``) for the one save path of ``ciclo.checkpoint``:
:class:`Writer`, ciclo's own background thread (async saves of one process), and
:class:`InCaller`, which writes on the loop's thread (synchronous saves, and the saves of
several processes, whose orbax barriers must run there; orbax's own async save then goes on
in its threads).

An async save of one process takes a host copy of the checkpoint at the step
(:func:`._format.snapshot`) and hands the write (orbax's synchronous save) to the thread, so
that the loop is blocked only for the copy; a write running when Python exits is finished
first. A large write runs at a lower CPU priority than the loop (Linux): measured on 2 busy cores
(``benchmarks/checkpoint_in_training.py``), that halved the time the step after a save
took over a plain step, the write's share of the machine. A small one (under
:data:`SMALL_WRITE` bytes of arrays) runs at the loop's priority, on a thread of its own: on
a busy machine a thread at a lower priority waits, and a tiny checkpoint stayed uncommitted
for several steps (issue 41).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

__all__ = ["Writer", "InCaller", "NICENESS", "SMALL_WRITE", "abandon_writes"]

#: The nice value of the writer's thread for large writes (Linux): below the loop's priority.
NICENESS = 10
#: The bytes of arrays under which a write runs at the loop's priority.
SMALL_WRITE = 1 << 20


def _lower_priority() -> None:
    """Runs the writer's thread at a lower CPU priority than the loop's (on Linux, where a
    thread has a nice value of its own), so that on a busy machine the loop's steps come
    first and the write fills the idle time."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)


class Writer:
    """Runs one write at a time on a thread of its own; its error is kept until
    :meth:`finish` raises it.

    Example:
        >>> writer = Writer()
        >>> writer.start(lambda: None)
        >>> writer.finish(); writer.running()
        False
        >>> writer.start(lambda: 1 / 0)
        >>> writer.finish()
        Traceback (most recent call last):
        ...
        ZeroDivisionError: division by zero
        >>> writer.finish()  # raised once
        >>> writer.close()
    """

    def __init__(self) -> None:
        self._executors: dict[bool, ThreadPoolExecutor] = {}  # by whether writes are small
        self._job: Future[object] | None = None

    def start(self, write: Callable[[], object], *, small: bool = False) -> None:
        """Starts ``write()`` on the writer's thread (a ``small`` one at the caller's
        priority); the previous write must be finished."""
        if self._job is not None:
            raise RuntimeError("ciclo: a checkpoint write started before the previous finished")
        if small not in self._executors:
            self._executors[small] = ThreadPoolExecutor(
                1,
                thread_name_prefix="ciclo-checkpoint",
                initializer=None if small else _lower_priority,
            )
        self._job = self._executors[small].submit(write)

    def running(self) -> bool:
        """Whether a write is under way (never blocks)."""
        return self._job is not None and not self._job.done()

    def join(self) -> None:
        """Blocks until the write under way, if any, has ended; keeps its error for
        :meth:`finish`."""
        if self._job is not None:
            wait([self._job])

    def finish(self) -> None:
        """Blocks until the write under way, if any, has ended; raises its error, once."""
        job = self._job
        if job is None:
            return
        try:
            job.result()
        finally:
            if job.done():  # not when the wait itself was interrupted (Ctrl-C)
                self._job = None

    def close(self) -> None:
        """Finishes the write under way (raising its error) and ends the thread."""
        try:
            self.finish()
        finally:
            for executor in self._executors.values():
                executor.shutdown(wait=True)
            self._executors.clear()


class InCaller:
    """Runs each write at once on the caller's thread; what ``manager`` (an orbax
    ``CheckpointManager``) goes on writing in its own threads is waited for by
    :meth:`finish`, which raises its error."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def start(self, write: Callable[[], object], *, small: bool = False) -> None:
        write()

    def running(self) -> bool:
        return bool(self.manager.is_saving_in_progress())

    def join(self) -> None:  # nothing to join: finish waits for orbax's threads
        pass

    def finish(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.finish()


def abandon_writes() -> None:
    """The process ends while orbax writes (a second Ctrl-C during a save): orbax's threads
    then fail as the interpreter shuts down, and their tracebacks say nothing the user does
    not know. Silences orbax's logs and the errors of threads other than the main one."""
    for name in ("absl", "asyncio"):
        logging.getLogger(name).disabled = True
    previous = threading.excepthook

    def quiet(args: Any) -> None:
        if args.thread is threading.main_thread():
            previous(args)

    threading.excepthook = quiet
