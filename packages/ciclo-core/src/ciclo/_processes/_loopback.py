"""A job of several processes on one machine (loopback), for tests and benchmarks of
multi-process code (``jax.distributed`` with gloo for CPU collectives).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["LoopbackRun", "free_port", "join_loopback", "run_on_loopback"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now (for the job's coordinator).

    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def join_loopback(process: int, count: int, port: int, *, timeout: int = 60) -> None:
    """Makes this process process ``process`` of a ``count``-process job on 127.0.0.1:``port``.

    Call it before any other JAX call.

    Example::

        ciclo.testing.join_loopback(int(sys.argv[1]), 2, int(sys.argv[2]))
    """
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    address = f"127.0.0.1:{port}"
    jax.distributed.initialize(
        coordinator_address=address,
        coordinator_bind_address=address,
        num_processes=count,
        process_id=process,
        initialization_timeout=timeout,
    )


class LoopbackRun(NamedTuple):
    """What :func:`run_on_loopback` returns."""

    codes: list[int]  #: each process's exit status
    outputs: list[str]  #: each process's stdout and stderr
    seconds: float  #: from the start of the first process to the end of the last


def run_on_loopback(
    commands: Sequence[Sequence[str]],
    *,
    devices_per_process: int = 1,
    timeout: float = 150.0,
    env: Mapping[str, str] | None = None,
) -> LoopbackRun:
    """Runs one command per process on the CPU and waits; past ``timeout``, ``TimeoutError``.

    >>> import sys
    >>> run = run_on_loopback([[sys.executable, "-c", "print(1)"]] * 2)
    >>> run.codes, [out.strip() for out in run.outputs]
    ([0, 0], ['1', '1'])
    """
    environment = {
        **os.environ,
        **(env or {}),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
    }
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            list(command),
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in commands
    ]
    outputs = []
    try:
        for proc in procs:
            left = max(1.0, timeout - (time.monotonic() - start))
            outputs.append(proc.communicate(timeout=left)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
            proc.communicate()
        raise TimeoutError(
            f"the {len(procs)}-process job did not end within {timeout:g} s (it hangs)"
        ) from None
    return LoopbackRun([p.returncode for p in procs], outputs, time.monotonic() - start)
