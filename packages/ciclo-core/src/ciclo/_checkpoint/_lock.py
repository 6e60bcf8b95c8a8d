"""One writer per checkpoint directory: a lock file that ``ciclo.checkpoint`` takes.

The lock is the file ``.ciclo-writer.lock`` in the directory, created atomically
(``O_CREAT | O_EXCL``) and holding ``{"host", "pid", "since"}`` of the process that writes.
Only the process that writes outputs (process 0, see :mod:`.._processes._outputs`) takes it:
the other processes of a multi-process run save through orbax too, but they are the same run.

A lock of a process that is gone on the same host is taken over with a warning logged
(logger ``"ciclo"``: every resume after a kill does it); one of another host is always in
use (its pid cannot be checked): delete it by hand if that run is gone. Within one process
the lock is shared. URLs (``gs://...``) are not locked: object stores have no atomic
create-if-absent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from typing import Any

__all__ = ["LOCK_NAME", "acquire", "release", "holder"]

#: The lock file's name inside the checkpoint directory.
LOCK_NAME = ".ciclo-writer.lock"

_log = logging.getLogger("ciclo")
_held: dict[str, int] = {}  # directory -> how many holders in this process


def _lock_path(directory: str) -> str:
    return os.path.join(directory, LOCK_NAME)


def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}


def holder(directory: str) -> dict[str, Any] | None:
    """What the lock file of ``directory`` says (``None``: no lock; ``{}``: unreadable)."""
    try:
        with open(_lock_path(directory)) as f:
            found = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _create(directory: str) -> bool:
    try:
        fd = os.open(_lock_path(directory), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(_me(), f)
    return True


def _take_over(directory: str, stale: dict[str, Any]) -> None:
    """Removes the stale lock ``stale``, unless another process took it over meanwhile
    (one process at a time, through a second lock file)."""
    guard = _lock_path(directory) + ".takeover"
    try:
        fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        time.sleep(0.05)  # another process is taking it over: look again
        try:
            if time.time() - os.path.getmtime(guard) > 10:  # its taker was killed meanwhile
                os.remove(guard)
        except FileNotFoundError:
            pass
        return
    os.close(fd)
    try:
        if holder(directory) == stale:
            os.remove(_lock_path(directory))
    except FileNotFoundError:
        pass
    finally:
        os.remove(guard)


def acquire(directory: str) -> bool:
    """Makes this process the one writer of ``directory``; ``False`` when not locked (a URL).

    Raises:
        RuntimeError: another live process writes to ``directory`` (named by host and pid).
    """
    if "://" in directory:
        return False
    if _held.get(directory):
        _held[directory] += 1
        return True
    _take(directory)
    _held[directory] = 1
    return True


_IN_USE = (
    "checkpoint directory {directory!r} is in use by another run: process {pid} on host "
    "{host!r}{started} writes to it (lock file {lock!r}): give this run another directory, "
    "or stop the other one; if it is gone, delete the lock file."
)


def _take(directory: str) -> None:
    for _ in range(20):  # a lock released or taken over between two looks: look again
        if _create(directory):
            return
        found = holder(directory)
        if not found:  # released meanwhile, or being written: look again
            time.sleep(0.05)
            continue
        host, pid = found.get("host"), found.get("pid")
        if host == socket.gethostname() and pid == os.getpid():
            return  # this process already writes here
        if host == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
            _log.warning(
                "ciclo.checkpoint: taking over the stale lock of checkpoint directory %r, "
                "left by process %s on %s, which no longer runs.",
                directory,
                pid,
                host,
            )
            _take_over(directory, found)
            continue
        since = found.get("since")
        started = (
            time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since))
            if isinstance(since, int | float)
            else ""
        )
        raise RuntimeError(
            _IN_USE.format(
                directory=directory,
                pid=pid,
                host=host,
                started=started,
                lock=_lock_path(directory),
            )
        )
    raise RuntimeError(f"checkpoint directory {directory!r}: other runs keep taking its lock.")


def release(directory: str) -> None:
    """Gives up one hold of :func:`acquire`; the last one removes the lock file."""
    if "://" in directory or not _held.get(directory):
        return
    _held[directory] -= 1
    if _held[directory]:
        return
    del _held[directory]
    found = holder(directory)
    if found and found.get("host") == socket.gethostname() and found.get("pid") == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            os.remove(_lock_path(directory))
