"""``ciclo.checkpoint``: save everything a run needs to continue, with orbax-checkpoint."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import warnings
import weakref
from typing import Any

import jax

from .._loop._base import LoopCallbackBase
from .._loop._state import LoopState
from .._processes._agreement import fault_of_another_process
from .._processes._outputs import OUTPUT_PROCESS, writes_here
from .._records import _host
from .._time._phases import CHECKPOINT, marked
from .._time._schedules import Schedule, every
from . import _codec, _format, _integrity, _items, _lock, _writer
from ._compilation_cache import release_compilation_cache, use_compilation_cache

__all__ = ["Checkpoint", "checkpoint", "check_monitor"]

_MODES = ("min", "max")
_FIX = (
    "Make the directory writable (or free space), or give ciclo.checkpoint another "
    "directory; the previous checkpoints are intact."
)


def _prepare_directory(path: str) -> None:
    """Creates ``path`` and checks that files can be written in it (local paths only)."""
    if "://" in path:
        return
    what = "is not writable" if os.path.isdir(path) else "cannot be created"
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".ciclo-write-test-"):
            pass
    except FileExistsError:
        raise NotADirectoryError(
            f"checkpoint directory {path!r} is a file. Give ciclo.checkpoint a directory."
        ) from None
    except OSError as error:
        raise PermissionError(
            f"checkpoint directory {path!r} {what} ({error.strerror}): give ciclo.checkpoint "
            f"a directory you can write to."
        ) from error


def check_monitor(owner: str, monitor: Any) -> None:
    """Raises when ``monitor`` (an argument of ``owner``) is not a log entry's name."""
    if not isinstance(monitor, str) or not monitor:
        raise TypeError(
            f"{owner}(monitor={monitor!r}): monitor must be the name of a log entry, "
            f"e.g. 'loss' or 'metrics.accuracy'."
        )


_NOT_FINITE = (
    "ciclo.checkpoint: the state of step {step} holds NaN or inf; written, but resume and "
    "rollback_on_nan pass over it."
)
_NO_MONITORED_ENTRY = (
    "ciclo.checkpoint(monitor={monitor!r}): no log entry {monitor!r} by step {step} "
    "({missing}). Logged entries: {logged}. Monitor an entry your callbacks log, and "
    "schedule the checkpoint where it is logged (e.g. after the evaluation)."
)
_CHECKPOINTS_OF_LATER_STEPS = (
    "checkpoint directory {directory!r} already holds checkpoints of later steps {later} "
    "than this run's step {step}: they come from another run. Resume from them "
    "(resume=...), or use another directory."
)
_PASSED_OVER_SET_ASIDE = (
    "ciclo.checkpoint: the checkpoints {present} in {directory!r}, passed over on resume "
    "({reasons}), were set aside as {moved} (not deleted): this run writes those steps anew."
)


class Checkpoint(LoopCallbackBase):
    """A callback that saves the whole run with orbax-checkpoint, so that it can continue
    exactly where it was (``loop(..., resume=directory)``) or be restored
    (:func:`ciclo.restore`, :func:`ciclo.restore_best`).

    Each checkpoint holds the state pytree (with its RNG keys), ``elapsed``, the history,
    the state of every schedule and of every callback with ``state_dict()`` /
    ``load_state_dict()`` (early stopping...), the loop's latest logs and the data
    position. It is taken at the end of the step in which the callback fires, after every
    callback of that step, and is named after the count of steps it holds
    (``elapsed.steps``). Writing is atomic: a run killed while writing leaves the
    previous checkpoints intact.

    On resume, the batches the run had consumed are skipped: a dataset with
    ``state_dict()``/``load_state_dict()`` loads its state, a sequence seeks by index, any
    other iterable is replayed (docs/checkpointing.md).

    Use it under any schedule of ``ciclo.loop`` (``{ciclo.every(1000): ckpt}``; spread in
    with ``**ckpt`` it saves every 10 minutes of loop time), in ``train_loop`` too
    (``tasks={ciclo.every(1000): ckpt}``); in ``train_loop(callbacks=[ckpt])`` it saves at
    the end of each epoch. One run writes a directory: a second one is an error at once
    (a lock file, ``.ciclo-writer.lock``, holds the writer's host and pid). It also saves
    when the loop ends (after Ctrl-C or SIGTERM too, see ``loop(stop_signals=...)``).

    Args:
        directory: where to save; created if needed (local path or an orbax-supported URL
            such as ``gs://...``). An unwritable directory is an error right away.
        keep: how many checkpoints to keep (``None``: all). Without ``monitor``, the
            latest ``keep``; with it, the best ``keep`` by the monitored value, plus the
            latest (to resume from).
        monitor: the log entry that ranks checkpoints (``"loss"``, ``"metrics.acc"``...),
            read from the loop's latest logs; an error if it was never logged by the time
            the checkpoint fires.
        mode: ``"min"`` (lower is better) or ``"max"``.
        async_save: write in the background: the loop only waits while arrays are copied
            to host memory. A failed background write is raised at the end of the next
            step, never lost.
        save_on_end: also save when the loop ends normally (a stop by a signal or by a
            callback always saves).
        compilation_cache: JAX's persistent compilation cache, so that a resumed run loads
            what the interrupted run compiled: ``True`` keeps it in
            ``<directory>/compilation_cache``, a path elsewhere, ``False`` leaves JAX's cache
            alone (as one you set in JAX). It takes effect when the checkpoint is made (make
            it before the state) and ends with its loop.

    It is path-like (``os.fspath(ckpt)`` is its directory), so it can be given where a
    checkpoint directory is expected: ``loop(..., resume=ckpt)``, ``ciclo.restore(ckpt, ...)``.

    Attributes:
        directory: the absolute checkpoint directory.
        compilation_cache: the compilation cache directory in use (ciclo's, or the one you
            set in JAX), or ``None``.
        monitor, mode, keep, async_save, save_on_end: as given.

    Example:
        >>> import ciclo, jax.numpy as jnp, numpy as np, tempfile
        >>> ckpt = ciclo.checkpoint(tempfile.mkdtemp(), keep=1)
        >>> def train_step(state, batch):
        ...     return ciclo.logs().add_loss("loss", state.sum()), state + 1.0
        >>> tasks = {ciclo.every(1): train_step, ciclo.every(2): ckpt}
        >>> state, history, elapsed = ciclo.loop(jnp.zeros(2), [np.ones((1,))] * 3, tasks)
        >>> ckpt.all_steps()
        [3]
        >>> state, history, elapsed = ciclo.loop(  # continues after the saved steps
        ...     jnp.zeros(2), [np.ones((1,))] * 5, tasks, resume=ckpt)
        >>> elapsed.steps, history.collect("loss")
        (5, [0.0, 2.0, 4.0, 6.0, 8.0])
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        keep: int | None = 2,
        monitor: str | None = None,
        mode: str = "min",
        async_save: bool = True,
        save_on_end: bool = True,
        compilation_cache: bool | str | os.PathLike[str] = True,
    ) -> None:
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(
                f"checkpoint(keep={keep!r}): keep must be a positive int (how many "
                f"checkpoints to keep) or None to keep all."
            )
        if mode not in _MODES:
            raise ValueError(
                f"checkpoint(mode={mode!r}): mode must be 'min' (lower {monitor or 'value'} "
                f"is better) or 'max'."
            )
        for name, flag in (("async_save", async_save), ("save_on_end", save_on_end)):
            if not isinstance(flag, bool):
                raise TypeError(f"checkpoint({name}={flag!r}): expected True or False.")
        if monitor is not None:
            check_monitor("checkpoint", monitor)
        self.directory = _format.checkpoint_path(directory)
        self.keep, self.monitor, self.mode = keep, monitor, mode
        self.async_save, self.save_on_end = async_save, save_on_end
        _prepare_directory(self.directory)
        self.compilation_cache = use_compilation_cache(compilation_cache, self.directory)
        self._locked = False
        self._unlock_at_exit: Any = None
        self._lock()
        self._manager: Any = None
        self._writer: _writer.Writer | _writer.InCaller | None = None  # writes the saves
        self._one_process = True  # whether a save copies the state to host memory
        self._last_step: int | None = None  # the last step saved (or found saved)
        self._end_step: int | None = None  # saved at a loop's end, unasked: replaceable
        self._loop: LoopState | None = None  # the loop checked for checkpoints of later steps
        self._ended: LoopState | None = None  # a loop that ended: later saves are synchronous

    def _lock(self) -> None:
        """Makes this process the one writer of the directory (see :mod:`._lock`), until
        the loop's end, :meth:`close` or the process's exit."""
        if self._locked or not writes_here(OUTPUT_PROCESS):
            return
        self._locked = _lock.acquire(self.directory)
        if self._locked:
            self._unlock_at_exit = weakref.finalize(self, _lock.release, self.directory)

    def _unlock(self) -> None:
        if self._locked:
            self._locked = False
            self._unlock_at_exit()

    def __repr__(self) -> str:
        return f"checkpoint({self.directory!r}, keep={self.keep}, monitor={self.monitor!r})"

    def __fspath__(self) -> str:
        return self.directory

    # --- the callback -------------------------------------------------------------------------
    def default_schedule(self) -> Schedule:
        """Spread with ``**`` into ``tasks``, a checkpoint saves every 10 minutes of loop time."""
        return every(time=600)

    def __loop_callback__(self, loop_state: LoopState) -> None:
        self._raise_failed_save()
        loop_state.at_step_end(self._save_at_step_end)

    def on_epoch_end(self, state: Any, batch: Any, elapsed: Any, loop_state: LoopState) -> None:
        """Saves at the end of each epoch (``train_loop`` registers it by name)."""
        self.__loop_callback__(loop_state)

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        """At the loop's end: saves the final state (always after a stop signal or a
        callback's stop, else when ``save_on_end``), then waits for the writes to finish,
        raising if one failed. A background save that failed since the last step does not
        keep the final state from being saved (then only a warning says it failed). After
        an error, only waits. Ends the compilation cache this checkpoint set."""
        release_compilation_cache(self.compilation_cache)
        with marked(loop_state.phases, CHECKPOINT):  # blocking time: ledger, watchdog
            self._end(loop_state, error)

    def _end(self, loop_state: LoopState, error: BaseException | None) -> None:
        if error is not None:
            try:
                self._wait_quietly(error)
            finally:
                self._unlock()
            return
        if loop_state.finished:  # a finished run, resumed: nothing to save
            self._unlock()
            return
        stopped = loop_state.stop_reason is not None
        final = stopped or self.save_on_end
        try:
            earlier: RuntimeError | None = None
            try:
                self.wait()
            except RuntimeError as failure:  # a background save failed in the last steps
                if not final:
                    raise
                earlier = failure
            if final and self._save(loop_state, monitored=False):
                self._end_step = self._last_step
            elif (
                loop_state.ending is not None
                and self._last_step == loop_state.elapsed.steps
                and writes_here(OUTPUT_PROCESS)
            ):
                # This step was saved already (an epoch's end that ended the run): it
                # records the ending too, so that the finished run stays finished.
                self.wait()
                _format.record_ending(self.directory, loop_state.elapsed.steps, loop_state.ending)
            self._ended = loop_state
            self.wait()
            if earlier is not None:  # the final state is saved: the failure lost nothing
                warnings.warn(
                    f"{earlier} The final state was saved as checkpoint {self._last_step}.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        finally:
            self._unlock()
        if stopped and self._last_step == loop_state.elapsed.steps:
            loop_state.stop_reason = (
                f"{loop_state.stop_reason} (checkpoint {self._last_step} saved in {self.directory})"
            )

    # --- saving -------------------------------------------------------------------------------
    def _save_at_step_end(self, loop_state: LoopState) -> None:
        with marked(loop_state.phases, CHECKPOINT):  # blocking time: ledger, watchdog
            self._save(loop_state, monitored=self.monitor is not None)

    def _open(self) -> Any:
        if self._manager is None:
            # One process holds its arrays whole: a save copies them to host memory, and
            # an async one is written by ciclo's thread. With several processes orbax's
            # save holds barriers across processes, which must run on the loop's thread:
            # orbax's own async save then copies the local shards and writes in its threads.
            self._one_process = jax.process_count() == 1
            in_thread = self.async_save and self._one_process
            self._manager = _format.open_writer(
                self.directory,
                keep=self.keep,
                monitor=self.monitor,
                mode=self.mode,
                async_save=self.async_save and not in_thread,
            )
            self._writer = _writer.Writer() if in_thread else _writer.InCaller(self._manager)
        return self._manager

    def _monitored_value(self, loop_state: LoopState) -> float:
        assert self.monitor is not None
        try:
            value = loop_state.accumulated_logs.entry_value(self.monitor)
        except KeyError as error:
            logged = [f"{c}.{n}" for c, n, _ in loop_state.accumulated_logs.entries()]
            raise KeyError(
                _NO_MONITORED_ENTRY.format(
                    monitor=self.monitor,
                    step=loop_state.elapsed.steps,
                    missing=error.args[0],
                    logged=logged,
                )
            ) from None
        value = _host.to_host(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"ciclo.checkpoint(monitor={self.monitor!r}): the entry is not a scalar "
                f"({type(value).__name__} {getattr(value, 'shape', '')}); monitor a scalar."
            ) from None

    def _save(self, loop_state: LoopState, *, monitored: bool) -> bool:
        """Saves ``loop_state`` as checkpoint ``elapsed.steps``; ``False`` if it exists.

        A save asked for by the callback (from ``on_end`` in ``train_loop``, after the
        evaluation) replaces the one the loop's end made at the same step unasked."""
        step = loop_state.elapsed.steps
        value = self._monitored_value(loop_state) if monitored else None
        self._lock()
        manager = self._open()
        self.wait()  # orbax's save would wait for the previous one too; this names its error
        if self._loop is not loop_state:
            self._loop, self._end_step = loop_state, None
            for item in _items.task_items(loop_state.inputs.tasks).values():
                item.checkpoint_at(self.directory, resumed=False)  # the ledger's heartbeat
            if writes_here(OUTPUT_PROCESS):
                _integrity.remove_empty_steps(self.directory)
            manager.reload()
            self._set_aside_passed_over(manager)
            later = [s for s in _integrity.steps_on_disk(manager, self.directory) if s > step]
            if later:
                raise FileExistsError(
                    _CHECKPOINTS_OF_LATER_STEPS.format(
                        directory=self.directory, later=sorted(later)[:5], step=step
                    )
                )
        if step == self._last_step or step in manager.all_steps():
            if self._ended is loop_state and step == self._end_step:
                manager.delete(step)
                self._end_step = None
            else:
                self._last_step = step
                return False
        snapshot = _format.snapshot(loop_state, host_copy=self._one_process)
        finite = _codec.all_finite(snapshot.items.get("state"))
        # Said now, not at the next start (a rollback_on_nan of this directory reports it).
        if not finite and not _integrity.is_held(self.directory) and writes_here(OUTPUT_PROCESS):
            warnings.warn(_NOT_FINITE.format(step=step), RuntimeWarning, stacklevel=2)
        assert self._writer is not None
        try:
            write = functools.partial(
                _format.write,
                manager,
                snapshot,
                value=value,
                monitor=self.monitor,
                mode=self.mode,
                finite=finite,
            )
            self._writer.start(write, small=snapshot.nbytes < _writer.SMALL_WRITE)
        except _format.WriteFailed as error:
            raise self._failure(step, error) from error
        self._last_step = step
        if not self.async_save or self._ended is loop_state:
            self.wait()  # nothing would wait for a save after the loop's end
        else:
            loop_state.at_step_end(self._poll)
        return True

    def _poll(self, loop_state: LoopState) -> None:
        """At each step's end while a background save runs: raises its error as soon as it
        failed (never blocks)."""
        if self._saving():
            loop_state.at_step_end(self._poll)
        else:
            self.wait()

    def _saving(self) -> bool:
        """Whether a save is being written in the background (never blocks)."""
        return self._writer is not None and self._writer.running()

    def _set_aside_passed_over(self, manager: Any) -> None:
        """Renames the checkpoints that this process's resume passed over (damaged, or of a
        non-finite state), at the resumed run's first save: it writes their steps anew, and
        orbax's ``keep`` must neither count them nor evict the checkpoint resumed from for
        them. They are kept, never deleted."""
        passed = _integrity.passed_over(self.directory)
        present = [s for s in _integrity.steps_on_disk(manager, self.directory) if s in passed]
        if not present or "://" in self.directory:
            return
        moved = [
            _integrity.set_aside(self.directory, s, passed[s].replace("-", "")) for s in present
        ]
        warnings.warn(
            _PASSED_OVER_SET_ASIDE.format(
                present=present,
                directory=self.directory,
                reasons=", ".join(passed[s] for s in present),
                moved=[os.path.basename(m) for m in moved],
            ),
            RuntimeWarning,
            stacklevel=2,
        )
        manager.reload()

    def rewind(self, step: int) -> None:
        """Forgets the saves after ``step``: the run went back to checkpoint ``step``, and
        the checkpoints after it were set aside (``rollback_on_nan``)."""
        if self._manager is not None:
            self._manager.reload()
        if self._last_step is not None and self._last_step > step:
            self._last_step = step
        self._end_step = None

    # --- waiting and errors -------------------------------------------------------------------
    def _raise_failed_save(self) -> None:
        """Raises the error of a background save that failed; never blocks."""
        if not self._saving():
            self.wait()

    def wait(self) -> None:
        """Blocks until the checkpoints being written are on disk.

        Raises:
            RuntimeError: a background save failed (the checkpoint was not written).
        """
        try:
            if self._writer is not None:
                self._writer.finish()
        except KeyboardInterrupt:  # a second Ctrl-C: the process ends, the write with it
            if self._saving():
                _writer.abandon_writes()
                # orbax commits a step by renaming its directory: a complete one is there
                step_directory = os.path.join(self.directory, str(self._last_step))
                if writes_here(OUTPUT_PROCESS) and not os.path.isdir(step_directory):
                    print(
                        f"ciclo.checkpoint: interrupted while writing checkpoint "
                        f"{self._last_step} to {self.directory!r}: it is left incomplete (a "
                        f"later run cleans it up); the checkpoints before it are intact.",
                        file=sys.stderr,
                        flush=True,
                    )
            raise
        except Exception as error:
            failed, self._last_step = self._last_step, None  # not on disk: may be saved again
            raise self._failure(failed, error) from error

    def _failure(self, step: int | None, error: Exception) -> BaseException:
        """The error to raise for a write of checkpoint ``step`` that failed with ``error``."""
        fault = fault_of_another_process()  # its collectives failed with it
        if fault is not None:
            return fault
        cause = error.__cause__ if isinstance(error, _format.WriteFailed) else error
        return RuntimeError(
            f"ciclo.checkpoint: writing checkpoint {step} to {self.directory!r} failed: "
            f"{cause!r}. {_FIX}"
        )

    def _wait_quietly(self, error: BaseException) -> None:
        try:
            self.wait()
        except RuntimeError as failure:
            error.add_note(str(failure))

    def close(self) -> None:
        """Waits for the writes to finish and releases orbax's resources."""
        try:
            try:
                self.wait()
            finally:
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
                if self._manager is not None:
                    self._manager.close()
                    self._manager = None
        finally:
            self._unlock()

    def all_steps(self) -> list[int]:
        """The steps of the checkpoints in the directory, oldest first (after the save
        being written, if any, has ended)."""
        if self._writer is not None:
            self._writer.join()
        return sorted(self._open().all_steps())


checkpoint = Checkpoint
"""Another name of :class:`Checkpoint` (the same class)."""
