"""Async saves of one process: the loop copies the state to host memory at the step and
ciclo's own writer thread writes it, so the loop goes on while the save is written, and the
checkpoint holds the state of the step that saved, whatever the loop does afterwards."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


@pytest.fixture
def held_writes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Makes each checkpoint's last stage (orbax's atomic rename) wait until ``release`` is
    set (30 s at most), and records the thread it ran on and whether it waited in vain."""
    from orbax.checkpoint._src.path import atomicity

    finalize = atomicity.AtomicRenameTemporaryPath.finalize
    held: dict[str, Any] = {"release": threading.Event(), "threads": [], "timed_out": False}

    async def slow_finalize(self: Any) -> None:
        held["threads"].append(threading.current_thread().name)
        if not held["release"].wait(timeout=30):
            held["timed_out"] = True
        await finalize(self)

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", slow_finalize)
    return held


def test_the_loop_steps_on_while_a_save_is_written_and_the_save_holds_its_step(
    tmp_path: Path, held_writes: dict[str, Any]
) -> None:
    step = jax.jit(lambda w: w + 1.0, donate_argnums=0)  # the saved buffers are donated
    ckpt = ciclo.checkpoint(tmp_path, keep=None)

    def train(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> Any:
        if elapsed.steps == 5:  # four steps after the save: the write may now end
            held_writes["release"].set()
        state["n"] += 1  # a NumPy leaf updated in place
        return None, {"w": step(state["w"]), "n": state["n"]}

    state = {"w": jnp.zeros(3), "n": np.zeros(2)}
    tasks = {ciclo.every(1): train, (lambda elapsed: elapsed.steps == 1): ckpt}
    final, _, _ = ciclo.loop(state, range(8), tasks)
    assert not held_writes["timed_out"]  # the loop reached step 5 while checkpoint 2 was held
    assert held_writes["threads"][0].startswith("ciclo-checkpoint")
    assert ckpt.all_steps() == [2, 8]
    saved = ciclo.restore(tmp_path, {"w": jnp.zeros(3), "n": np.zeros(2)}, step=2).state
    np.testing.assert_array_equal(saved["w"], [2.0, 2.0, 2.0])  # not the later values
    np.testing.assert_array_equal(saved["n"], [2.0, 2.0])  # nor the in-place updates
    np.testing.assert_array_equal(final["w"], [8.0, 8.0, 8.0])


def test_a_synchronous_save_is_written_on_the_loops_thread(
    tmp_path: Path, held_writes: dict[str, Any]
) -> None:
    held_writes["release"].set()
    ciclo.loop(0, range(2), {ciclo.every(1): ciclo.checkpoint(tmp_path, async_save=False)})
    assert held_writes["threads"]
    assert set(held_writes["threads"]) == {threading.current_thread().name}


def test_all_steps_waits_for_the_save_being_written(
    tmp_path: Path, held_writes: dict[str, Any]
) -> None:
    ckpt = ciclo.checkpoint(tmp_path, keep=None)
    found: list[list[int]] = []

    def look(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> None:
        if elapsed.steps == 2:
            threading.Timer(0.2, held_writes["release"].set).start()
            found.append(ckpt.all_steps())  # checkpoint 2 is being written

    ciclo.loop(0, range(3), {ciclo.every(1): look, (lambda e: e.steps == 1): ckpt})
    assert found == [[2]]


def test_a_save_failing_on_the_writer_thread_is_raised_at_the_next_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orbax.checkpoint._src.path import atomicity

    written = threading.Event()

    async def full_disk(self: Any) -> None:
        written.set()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", full_disk)
    seen: list[int] = []
    ckpt = ciclo.checkpoint(tmp_path)

    def step(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> None:
        seen.append(elapsed.steps)
        if elapsed.steps == 1:  # checkpoint 1 (saved at the end of step 0) fails meanwhile
            assert written.wait(timeout=30)
            # all_steps waits for the write to end (it keeps the error): the failure has
            # surely reached the writer's record, however slow the (low-priority) thread
            ckpt.all_steps()

    tasks = {ciclo.every(1): step, ciclo.every(1000): ckpt}
    with pytest.raises(
        RuntimeError,
        match=r"writing checkpoint 1 to .* failed: OSError\(28, 'No space.*"
        r"Make the directory writable",
    ):
        ciclo.loop(0, range(50), tasks)
    assert seen[-1] <= 2  # raised at the end of the step after the save, or the one after


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's nice value: Linux")
def test_a_small_save_is_written_at_the_loop_priority_a_large_one_below_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny checkpoint written at a lower priority waited several steps on a busy machine.
    from ciclo._checkpoint import _format, _writer

    write, niceness = _format.write, []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return write(*args, **kwargs)

    monkeypatch.setattr(_format, "write", recorded)
    loop_priority = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for size in (4, _writer.SMALL_WRITE // 4 + 1):  # float32: 16 bytes, just over the bound
        ckpt = ciclo.checkpoint(tmp_path / str(size), compilation_cache=False)
        ciclo.loop(jnp.zeros(size), [np.ones(1)] * 2, {ciclo.every(1): ckpt}, stop_signals=())
    assert niceness[0] == loop_priority
    assert niceness[-1] == min(loop_priority + _writer.NICENESS, 19)


class _Interrupted:
    """A writer whose write is under way when a second Ctrl-C interrupts the wait."""

    def running(self) -> bool:
        return True

    def finish(self) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize("committed", [True, False])
def test_a_second_ctrl_c_says_left_incomplete_only_of_a_checkpoint_not_committed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    committed: bool,
) -> None:
    from ciclo._checkpoint import _writer

    monkeypatch.setattr(_writer, "abandon_writes", lambda: None)  # keeps this process's logs
    ckpt = ciclo.checkpoint(tmp_path, compilation_cache=False)
    ckpt._writer, ckpt._last_step = _Interrupted(), 7  # type: ignore[assignment]
    if committed:  # orbax renamed the step's directory into place: the write was complete
        (tmp_path / "7").mkdir()
    with pytest.raises(KeyboardInterrupt):
        ckpt.wait()
    said = "interrupted while writing checkpoint 7" in capsys.readouterr().err
    assert said is not committed
    ckpt._writer = None
    ckpt.close()
