"""``ciclo.rollback_on_nan``, the one home of a rollback: composed around the engine, it asks
the loop to stop at a fault (one agreed step with several processes); the loop's restart hook
(``__loop_restart__``) then puts the newest finite checkpoint back (as a resume does), sets
aside the later checkpoints (:func:`_set_aside_after`), moves the dataset past the skipped
batches and records the rollback in the history. A later resume is exact: the skipped
batches are counted in every checkpoint (``data.skipped``, ``loop_state.skipped_batches``).
"""

from __future__ import annotations

import math
import os
import sys
import time as _time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

import jax
import jax.numpy as jnp
import numpy as np

from .._loop._base import LoopCallbackBase
from .._loop._state import LoopState, StopKind
from .._processes._agreement import gather_to_all
from .._processes._outputs import OUTPUT_PROCESS, writes_here
from .._records._logs import PARAMS_FINITE, Logs
from . import _format, _integrity, _topology
from ._callback import Checkpoint, check_monitor
from ._resume import put_back, skip_consumed

__all__ = ["RollbackOnNaN", "StateProbe", "rollback_on_nan"]

#: How many of the latest finite values the running median of ``spike=`` is taken over
#: (few, so that it forgets the warm-up's high losses), and how many it needs before a value
#: can be a spike.
MEDIAN_WINDOW = 20
MEDIAN_MIN_VALUES = 10
#: The seconds between two looks at what the history fetched (it fetches every 0.5 s by
#: default): a step in between pays one clock read.
LOOK_SECONDS = 0.1

MSG_NO_CHECKPOINT = (
    "rollback_on_nan: no ciclo.checkpoint of this loop writes {directory!r}; put the "
    "checkpoint it rolls back to in the loop's tasks."
)
MSG_ONE_SHOT = (
    "rollback_on_nan: the dataset is a one-shot iterator ({kind}), which cannot go back; "
    "give a list, a re-iterable or a stateful dataset (ciclo.stateful_dataset)."
)
MSG_NOTHING_BEFORE = (
    "rollback_on_nan: {fault} at step {step}, and no finite checkpoint in {directory!r} "
    "is from before it; training stopped. Save checkpoints more often."
)
MSG_TOO_MANY = (
    "rollback_on_nan: {fault} at step {step}, after {count} rollbacks "
    "(max_rollbacks={most}); training stopped."
)
MSG_ROLLED_BACK = (
    "rollback_on_nan: {fault} at step {step}; rolled back to checkpoint {restored} and "
    "skipped the {skipped} batches from position {first} through the faulty one "
    "(rollback {count} of at most {most})."
)


class RollbackOnNaN(LoopCallbackBase):
    """Rolls the run back to its newest finite checkpoint when the monitored loss is NaN
    or infinite (or, with ``spike=k``, more than ``k`` times its running median), skips
    the batches from that checkpoint's data position through the one where the fault
    appeared, and continues.

    The state, ``elapsed``, history, schedules, stateful callbacks and data position all
    come back from the checkpoint, as on a resume. The rollback is recorded in the
    history, in one row at the step it went back to: ``rollbacks`` (how many so far),
    ``skipped_batches`` (how many this one skipped), ``skipped_from`` (the data position
    of the first) and ``fault_step``. Later checkpoints keep the skipped batches, so a run
    killed after a rollback resumes to the same result as one never killed. Checkpoints
    of the abandoned steps are renamed ``<step>.rolled-back`` (kept, never deleted).

    It checks without a device sync of its own: it reads the values the history has
    fetched (every ``fetch_interval``, 0.5 s by default; it looks every 0.1 s, and at the
    loop's end), so a fault is noticed a few steps late: a checkpoint that a fault among the
    values not read yet may need is not evicted by ``keep`` until they are read (one
    process). Besides ``monitor`` it reads ``params_finite``, which a managed train step
    logs, so a NaN that reaches the parameters but not the loss (NaN inputs through a
    ReLU) rolls back too; for a plain step, ``state_every=N`` checks the state itself every
    N steps (a compiled reduction, read once ready). The checkpoint it goes back to
    was written at or before the faulty step, so the faulty update is never kept. After
    ``max_rollbacks`` rollbacks the next fault stops training, as
    :class:`ciclo.terminate_on_nan` does. With several processes, the stop and the
    rollback happen at one agreed step, and the faulty step is the first one on any
    process.

    Args:
        checkpoint: the ``ciclo.checkpoint`` the loop writes (or its directory); it must
            be in the loop's tasks.
        monitor: the log entry to watch (``"loss"``, ``"losses.loss"``).
        spike: also roll back when the value is more than ``spike`` times the median of
            its last 20 finite values (once 10 were seen; values above a median <= 0
            are not spikes); ``None``: only non-finite values. Choose it above the
            largest such ratio of a healthy run (``max(loss[i] / median(loss[i-20:i]))``
            of its history; 3 to 10 for most losses).
        state_every: for a step that logs no ``params_finite`` (not a managed train
            step), check the state for NaN or inf every that many steps.
        max_rollbacks: how many rollbacks a run may make; the fault after them stops it.
        verbose: print each rollback and the stop.
        file: where to print (stdout by default).

    Use it after the train step, on every step (``{ciclo.every(1): [train_step,
    rollback]}``), or in ``train_loop(callbacks=[ckpt, rollback])``. The dataset must be
    able to go back: a sequence, a stateful dataset, or an iterable that yields the same
    batches each time.

    Example:
        >>> import ciclo, tempfile
        >>> ckpt = ciclo.checkpoint(tempfile.mkdtemp())
        >>> ciclo.rollback_on_nan(ckpt, spike=10.0).max_rollbacks
        3
    """

    __loop_observer__ = True  # reads the history only: runs once per fused group

    def __init__(
        self,
        checkpoint: Checkpoint | str | os.PathLike[str],
        *,
        monitor: str = "loss",
        spike: float | None = None,
        max_rollbacks: int = 3,
        state_every: int | None = None,
        verbose: bool = True,
        file: IO[str] | None = None,
    ) -> None:
        self._probe = StateProbe("rollback_on_nan", state_every)
        if not isinstance(checkpoint, Checkpoint | str | os.PathLike):
            raise TypeError(
                f"rollback_on_nan(checkpoint={checkpoint!r}): give the ciclo.checkpoint."
            )
        check_monitor("rollback_on_nan", monitor)
        if spike is not None and (
            isinstance(spike, bool)
            or not isinstance(spike, int | float)
            or not (1 < spike < math.inf)  # NaN too
        ):
            raise ValueError(f"rollback_on_nan(spike={spike!r}): spike must be a number > 1.")
        if (
            isinstance(max_rollbacks, bool)
            or not isinstance(max_rollbacks, int)
            or max_rollbacks < 0
        ):
            raise ValueError(
                f"rollback_on_nan(max_rollbacks={max_rollbacks!r}): expected an int >= 0."
            )
        self.directory = _format.checkpoint_path(checkpoint)
        self.monitor, self.spike, self.max_rollbacks = monitor, spike, max_rollbacks
        self.verbose, self.file = verbose, file
        self._loop: LoopState | None = None  # the loop whose history is being scanned
        self._key: str | None = None  # the monitor's "collection.name"
        self._scanned = 0  # the first history row not scanned yet
        self._window: deque[float] = deque(maxlen=MEDIAN_WINDOW)
        self._fault: tuple[int, str] | None = None  # (step, what) of the first fault seen
        self._next_look = 0.0  # when to look at the history again (time.monotonic)
        self._scanned_step = 0  # the first step whose monitored value is not scanned yet

    def __repr__(self) -> str:
        return (
            f"rollback_on_nan({self.directory!r}, monitor={self.monitor!r}, "
            f"spike={self.spike!r}, max_rollbacks={self.max_rollbacks})"
        )

    # --- the check, at each step -----------------------------------------------------------
    def __loop_callback__(self, loop_state: LoopState) -> None:
        if self._loop is not loop_state:
            self._start(loop_state)
        if self._key is None:  # at the first step that logs (the same on every process)
            self._key = self._key_in(loop_state.logs, loop_state)
            if self._key is None:
                return
        probed = self._probe.fault(loop_state)  # at the same steps on every process
        if self._fault is not None:
            return
        now = _time.monotonic()
        if now >= self._next_look:
            self._next_look = now + LOOK_SECONDS
            self._fault = self._scan(loop_state, fetch=False)
        self._fault = self._fault or probed
        if self._fault is not None:
            step, what = self._fault
            loop_state.request_stop(
                f"rollback_on_nan: rolling back: {what} at step {step}", kind=StopKind.ROLLBACK
            )

    def on_train_batch_end(
        self, state: Any, batch: Any, elapsed: Any, loop_state: LoopState
    ) -> None:
        self.__loop_callback__(loop_state)

    def _start(self, loop_state: LoopState) -> None:
        """A new loop (or the same one after a rollback): checks what a rollback needs, and
        scans this run's rows of the history from the first."""
        self._checkpoint_in(loop_state)
        dataset = loop_state.inputs.dataset
        if not _topology.is_stateful_dataset(dataset) and isinstance(dataset, Iterator):
            raise TypeError(MSG_ONE_SHOT.format(kind=type(dataset).__name__))
        self._loop, self._fault, self._next_look = loop_state, None, 0.0
        elapsed = loop_state.elapsed
        self._scanned = loop_state.history.run_start(
            loop_state.initial_elapsed.steps, elapsed.steps
        )
        self._window.clear()
        self._probe.reset()
        self._scanned_step = elapsed.steps
        _integrity.hold(self.directory, self._held)

    def _held(self, steps: list[int]) -> list[bool]:
        """Which of the checkpoints ``steps`` ``keep`` must not evict yet: each one before
        whose next checkpoint a value is not scanned yet (a fault there needs it). With
        several processes none (each process's orbax would evict apart)."""
        if jax.process_count() > 1:
            return [False] * len(steps)
        return [b > self._scanned_step for b in steps[1:]] + [False]

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        _integrity.release(self.directory)

    def _checkpoint_in(self, loop_state: LoopState) -> Checkpoint:
        """The ``ciclo.checkpoint`` of the loop that writes :attr:`directory`."""
        for _, callbacks in loop_state.inputs.tasks:
            for callback in callbacks:
                fn = getattr(callback, "fn", callback)
                for owner in (fn, getattr(fn, "__self__", None)):
                    if isinstance(owner, Checkpoint) and owner.directory == self.directory:
                        return owner
        raise ValueError(MSG_NO_CHECKPOINT.format(directory=self.directory))

    def _key_in(self, logs: Logs, loop_state: LoopState) -> str | None:
        """The ``collection.name`` of the monitor in ``logs`` (``None`` while the step has
        logged nothing yet)."""
        if not any(logs.values()):
            return None
        try:
            logs.entry_value(self.monitor)
        except KeyError as error:
            step = loop_state.elapsed.steps
            raise KeyError(
                f"rollback_on_nan(monitor={self.monitor!r}) at step {step}: {error.args[0]}"
            ) from None
        if "." in self.monitor:
            return self.monitor
        return next(f"{c}.{self.monitor}" for c, entries in logs.items() if self.monitor in entries)

    def _scan(self, loop_state: LoopState, *, fetch: bool) -> tuple[int, str] | None:
        """The first fault in the rows not scanned yet that the history holds on the host
        (all of them with ``fetch``): ``(step, what)``, or ``None``."""
        assert self._key is not None
        start, flag = self._scanned, ".".join(PARAMS_FINITE)
        steps, _, columns = loop_state.history.numeric_since(start, [self._key, flag], fetch=fetch)
        rows, values = columns.get(self._key, (np.zeros(0, int), np.zeros(0)))
        flag_rows, flags = columns.get(flag, (np.zeros(0, int), np.zeros(0)))
        bad = flag_rows[flags == 0]
        window = self._window
        for row, value in zip(rows.tolist(), values.tolist(), strict=True):
            if bad.size and bad[0] <= row:
                break
            self._scanned = row + 1
            what = None
            if not math.isfinite(value):
                what = f"{self.monitor} is {value}"
            elif self.spike is not None and len(window) >= MEDIAN_MIN_VALUES:
                median = float(np.median(window))
                if median > 0 and value > self.spike * median:
                    what = (
                        f"{self.monitor} is {value:.6g}, more than {self.spike:g} times its "
                        f"running median {median:.6g}"
                    )
            if what is not None:
                return int(steps[row - start]), what
            window.append(value)
            self._scanned_step = int(steps[row - start]) + 1  # a fault is past this row
        if bad.size:
            self._scanned = int(bad[0]) + 1
            return int(steps[bad[0] - start]), "the parameters are NaN or inf"
        return None

    # --- the rollback, once the engine has returned -----------------------------------------
    def __loop_restart__(self, loop_state: LoopState) -> Iterable[Any] | None:
        """Rolls back when the loop stopped for it, or when it ran to its end with a fault
        not noticed yet (every process, at the same step); returns the batches to run from
        the checkpoint on, or ``None`` when the loop ends (no fault; after
        ``max_rollbacks``; no checkpoint to go back to)."""
        if loop_state.stop_iteration and loop_state.stop_kind is not StopKind.ROLLBACK:
            return None  # another callback's stop: the run ends as it asked
        if self._loop is not loop_state or self._key is None:
            return None  # it never ran in this loop, or the monitor was never logged
        probed = self._probe.fault(loop_state, wait=True)
        if self._fault is None:  # not noticed yet (here): every value is fetched now
            scanned = self._scan(loop_state, fetch=True), probed
            self._fault = min((f for f in scanned if f is not None), default=None)
        faults = [f for f in gather_to_all("rollback_on_nan fault", self._fault) if f is not None]
        if not faults:
            return None
        step, what = min((int(s), str(w)) for s, w in faults)
        count = self._rollbacks(loop_state)
        if count >= self.max_rollbacks:
            self._stop(loop_state, MSG_TOO_MANY, fault=what, step=step, count=count)
            return None
        checkpoint = self._checkpoint_in(loop_state)
        checkpoint.wait()
        found = self._newest_finite(loop_state, step)
        restored = min(gather_to_all("rollback_on_nan checkpoint", found))
        if restored < 0:
            self._stop(loop_state, MSG_NOTHING_BEFORE, fault=what, step=step)
            return None
        contents = self._read(loop_state, restored)
        # The data position of the faulty step's batch, counted before the state goes back.
        fault_position = step - loop_state.initial_elapsed.steps + loop_state.skipped_batches
        _set_aside_after(checkpoint, restored)
        put_back(contents, self.directory, loop_state)
        data = contents.fields["data"]
        skipped = fault_position + 1 - data["position"]
        loop_state.skipped_batches = data["skipped"] + skipped
        batches = _reposition(loop_state.inputs.dataset, data, fault_position + 1)
        row = Logs().add_metrics(
            rollbacks=count + 1,
            skipped_batches=skipped,
            skipped_from=data["position"],
            fault_step=step,
        )
        loop_state.history.commit(loop_state.elapsed, row)
        loop_state.stop_iteration = False
        self._loop = None  # the next step scans the restored history afresh
        self._say(
            MSG_ROLLED_BACK.format(
                fault=what,
                step=step,
                restored=restored,
                skipped=skipped,
                first=data["position"],
                count=count + 1,
                most=self.max_rollbacks,
            )
        )
        return batches

    def _rollbacks(self, loop_state: LoopState) -> int:
        """How many rollbacks the run made (its history's latest ``rollbacks``)."""
        _, _, columns = loop_state.history.numeric_since(0, ["metrics.rollbacks"])
        if "metrics.rollbacks" not in columns:
            return 0
        values = columns["metrics.rollbacks"][1]
        return int(values[-1]) if len(values) else 0

    def _newest_finite(self, loop_state: LoopState, step: int) -> int:
        """The newest checkpoint of a finite state written at or before ``step`` (it holds
        ``step`` steps or fewer: the faulty update is not in it); -1 when none is."""
        manager = _format.open_reader(self.directory, must_exist=False)
        if manager is None:
            return -1
        try:
            steps = _integrity.steps_on_disk(manager, self.directory)
            finite = [s for s in steps if s <= step and _integrity.is_finite_step(manager, s)]
        finally:
            manager.close()
        return max(finite, default=-1)

    def _read(self, loop_state: LoopState, step: int) -> _format.Contents:
        manager = _format.open_reader(self.directory, must_exist=True)
        try:
            return _format.read(manager, self.directory, step, loop_state.state)
        finally:
            manager.close()

    def _stop(self, loop_state: LoopState, message: str, **fields: Any) -> None:
        text = message.format(directory=self.directory, most=self.max_rollbacks, **fields)
        loop_state.apply_stop(
            text, StopKind.NAN
        )  # the loop stopped already, at the same step everywhere
        self._say(text)

    def _say(self, text: str) -> None:
        if self.verbose and writes_here(OUTPUT_PROCESS):
            print(text, file=self.file if self.file is not None else sys.stdout, flush=True)


rollback_on_nan = RollbackOnNaN
"""Another name of :class:`RollbackOnNaN` (the same class)."""


@jax.jit
def _finite(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([jnp.isfinite(leaf).all() for leaf in leaves]).all()


class StateProbe:
    """The NaN guards' check of the state itself, for steps that log no ``params_finite``:
    every ``every`` steps (the same steps on every process) a compiled reduction says
    whether the state's floating arrays are all finite; read once ready, or waited for a
    step later (the device may lag far behind), so a fault is seen within a step or two."""

    def __init__(self, owner: str, every: int | None) -> None:
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, int) or every < 1
        ):
            raise ValueError(f"{owner}(state_every={every!r}): expected an int >= 1 or None.")
        self.every, self._next = every, 0
        self._pending: deque[tuple[int, jax.Array]] = deque()

    def reset(self) -> None:
        self._next = 0
        self._pending.clear()

    def fault(self, loop_state: LoopState, *, wait: bool = False) -> tuple[int, str] | None:
        """``(step, what)`` for the first step found with a non-finite state, else ``None``."""
        step = loop_state.elapsed.steps
        if self.every is not None and step >= self._next:
            self._next = step + self.every
            leaves = [
                leaf
                for leaf in jax.tree.leaves(loop_state.state)
                if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.inexact)
            ]
            if leaves:
                self._pending.append((step, _finite(leaves)))
        while self._pending:
            checked, finite = self._pending[0]
            if not (wait or checked < step or finite.is_ready()):  # type: ignore[attr-defined]
                return None
            self._pending.popleft()
            if not finite:
                self._pending.clear()
                return checked, "the state is NaN or inf"
        return None


def _reposition(dataset: Any, data: Mapping[str, Any], position: int) -> Iterable[Any]:
    """``dataset`` from batch ``position`` on, going back to the checkpoint's position
    (``data``) first (see :func:`._resume.skip_consumed`); a stateful dataset loads the
    checkpoint's state and draws the skipped batches."""
    source = skip_consumed(dataset, position, data["state"])
    if data["state"] is None:
        return source
    iterator = iter(source)
    for _ in range(position - data["position"]):
        try:
            next(iterator)
        except StopIteration:
            return ()  # the data ends among the skipped batches
    return iterator


def _set_aside_after(checkpoint: Checkpoint, step: int) -> None:
    """Puts the checkpoints of steps after ``step`` out of the way of the run (it went back
    to checkpoint ``step``: they hold the abandoned steps): renamed ``<step>.rolled-back``
    (kept, never deleted), or deleted on a URL, where nothing can be renamed. With several
    processes every process calls it at the same step; process 0 renames."""
    checkpoint.wait()
    gather_to_all("checkpoint set aside: ready", step)  # no process reads them any more
    if writes_here(OUTPUT_PROCESS):
        from etils import epath  # type: ignore[import-untyped]

        for path in epath.Path(checkpoint.directory).iterdir():
            if not path.name.isdigit() or int(path.name) <= step:
                continue
            if "://" in checkpoint.directory:
                path.rmtree()
            else:
                _integrity.set_aside(checkpoint.directory, int(path.name), "rolled-back")
    gather_to_all("checkpoint set aside: done", step)  # the others wait for the renames
    checkpoint.rewind(step)
