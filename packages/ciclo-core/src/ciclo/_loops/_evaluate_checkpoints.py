"""``ciclo.evaluate_checkpoints``: the standalone evaluator of a training run's checkpoints."""

from __future__ import annotations

import os
import time as _time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._checkpoint import _format, _restore
from .._records._aggregate import rename_logs
from .._records._history import History
from .._records._logs import Logs
from ._evaluation import dataset_factory
from ._test import evaluate_dataset

__all__ = ["evaluate_checkpoints"]

DatasetFactory = Callable[[], Iterable[Any]]


def _datasets(dataset: Any) -> dict[str | None, DatasetFactory]:
    """``{name or None: factory}``: ``None`` for a single dataset (entries keep their names)."""
    if isinstance(dataset, Mapping):
        if not dataset:
            raise ValueError("evaluate_checkpoints: dataset is an empty dict; give a function.")
        sets: dict[str | None, Any] = {}
        for name, factory in dataset.items():
            if not isinstance(name, str) or not name:
                raise TypeError(
                    f"evaluate_checkpoints: dataset names must be strings, got {name!r}."
                )
            sets[name] = factory
    else:
        sets = {None: dataset}
    return {
        name: dataset_factory(
            factory,
            "dataset" if name is None else f"dataset[{name!r}]",
            "for each checkpoint",
            who="evaluate_checkpoints: ",
        )
        for name, factory in sets.items()
    }


def _saved_steps(path: str) -> list[int]:
    """The steps of the complete checkpoints in ``path`` (none while it does not exist)."""
    manager = _format.open_reader(path, must_exist=False)
    if manager is None:
        return []
    try:
        return sorted(int(step) for step in manager.all_steps())
    finally:
        manager.close()


def _marker_path(path: str, final_marker: str | os.PathLike[str] | None) -> str | None:
    if final_marker is None:
        return None
    marker = os.fspath(final_marker)
    return marker if os.path.isabs(marker) or "://" in path else os.path.join(path, marker)


def evaluate_checkpoints(
    directory: str | os.PathLike[str],
    state: Any,
    dataset: DatasetFactory | Iterable[Any] | Mapping[str, DatasetFactory | Iterable[Any]],
    tasks: Mapping[Any, Any] | None = None,
    *,
    callbacks: Sequence[Any] | None = None,
    follow: bool = False,
    timeout: float | None = None,
    poll_interval: float = 10.0,
    final_marker: str | os.PathLike[str] | None = None,
    final_step: int | None = None,
    history: History | None = None,
    batch_size_fn: Callable[[Any], int] | None = None,
    stop: int | None = None,
) -> History:
    """Evaluates every checkpoint in ``directory`` in step order (with ``follow``, each new one
    as it appears): the standalone evaluator beside a training job.

    Each is restored into ``state`` (:func:`ciclo.restore`) and evaluated with
    :func:`ciclo.test_loop`: one history row per checkpoint, at its ``elapsed``.

    Args:
        directory: the checkpoint directory (or a :class:`ciclo.checkpoint`).
        state: a state built like the saved one (structure, shardings, ``test_step``).
        dataset: a function returning a fresh dataset, a re-iterable dataset, or a dict
            ``{name: ...}`` of several (entries renamed ``<entry>_<name>``).
        tasks, callbacks, batch_size_fn: as in :func:`ciclo.test_loop`.
        follow: keep polling every ``poll_interval`` seconds, until ``final_marker`` exists
            (a file in ``directory`` or an absolute path), a checkpoint of ``final_step`` or
            later is evaluated, or ``timeout`` seconds pass without a new one.
        history: a history to append to (steps it holds are skipped).
        stop: evaluate only this many batches of each dataset.

    Example:
        >>> import ciclo, jax.numpy as jnp, numpy as np, tempfile
        >>> directory = tempfile.mkdtemp()
        >>> train = {
        ...     ciclo.every(1): lambda state, batch: state + batch.sum(),
        ...     ciclo.every(2): ciclo.checkpoint(directory, keep=None, save_on_end=False),
        ... }
        >>> _ = ciclo.loop(jnp.zeros(()), [np.ones(2)] * 5, train)
        >>> def test_step(state, batch):
        ...     return ciclo.logs().add_metric("score", state * batch.mean())
        >>> history = ciclo.evaluate_checkpoints(
        ...     directory, jnp.zeros(()), lambda: [np.ones(3)], {ciclo.on_test_step: test_step}
        ... )
        >>> history.collect("steps", "score")
        ([1, 3, 5], [2.0, 6.0, 10.0])
    """
    path = _format.checkpoint_path(directory)
    sets = _datasets(dataset)
    if poll_interval <= 0:
        raise ValueError(f"evaluate_checkpoints(poll_interval={poll_interval!r}) must be > 0.")
    if timeout is not None and timeout < 0:
        raise ValueError(f"evaluate_checkpoints(timeout={timeout!r}) must be >= 0 or None.")
    marker = _marker_path(path, final_marker)
    history = History() if history is None else history
    done = set(history.collect("steps")) if len(history) else set()
    last = max(done) if done else None
    if not follow and not _saved_steps(path):
        _format.open_reader(path, must_exist=True)  # raises the error that says what is missing

    def evaluate(step: int) -> bool:
        try:
            restored = _restore.restore(path, state, step=step)
        except FileNotFoundError:  # deleted by the trainer's keep=... since it was listed
            return False
        logs = Logs()
        for name, factory in sets.items():
            _, set_logs, _ = evaluate_dataset(
                restored.state,
                factory(),
                tasks,
                "the dataset of evaluate_checkpoints"
                + ("" if name is None else f" (dataset[{name!r}])"),
                callbacks=callbacks,
                batch_size_fn=batch_size_fn,
                stop=stop,
            )
            logs.merge(set_logs if name is None else rename_logs(set_logs, name))
        history.commit(restored.elapsed, logs)
        return True

    waited_since = _time.monotonic()
    while True:
        finished = marker is not None and os.path.exists(marker)
        for step in _saved_steps(path):
            if step in done or (last is not None and step < last):
                continue
            if evaluate(step):
                done.add(step)
                last = step
                waited_since = _time.monotonic()
                if final_step is not None and step >= final_step:
                    return history
        if not follow or finished:
            return history
        waited = _time.monotonic() - waited_since
        if timeout is not None and waited >= timeout:
            return history
        wait = poll_interval if timeout is None else min(poll_interval, timeout - waited)
        _time.sleep(max(wait, 0.0))
