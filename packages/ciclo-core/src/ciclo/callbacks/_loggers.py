"""Loggers: ``csv_logger`` (one row per epoch, continued exactly across a resume) and
``tensorboard_logger`` (every logged step, written from the history in batches through
:class:`~ciclo.callbacks._writers.TensorBoardWriter`)."""

from __future__ import annotations

import csv
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._loop._base import LoopCallbackBase
from .._loop._state import LoopState
from .._processes._outputs import check_output_process, writes_here
from .._records import _host
from .._time._elapsed import Elapsed
from ._progress import latest_entries, named_entries
from ._running_mean import RunningMean, check_running_mean
from ._writers import TensorBoardWriter, WriterLogger

__all__ = ["CSVLogger", "csv_logger", "TensorBoardLogger", "tensorboard_logger"]

_ELAPSED_COLUMNS = ("steps", "samples", "time")
_FLOAT32_MAX = float(np.finfo(np.float32).max)

_CSV_ROWS_MISSING = (
    "csv_logger: {path!r} has {found} rows, but the checkpoint was saved after {count}: the "
    "missing rows are lost{where} (was the file replaced, or its path changed?)."
)


def _plain(value: Any) -> Any:
    """A scalar as the CSV writes it, the same whether it comes from this step's logs (a
    NumPy ``float32``) or from the history (a Python float once fetched): a float that a
    ``float32`` holds exactly is written as ``float32`` writes it (``0.4``, not
    ``0.4000000059604645``)."""
    if isinstance(value, np.generic | np.ndarray) and np.ndim(value) == 0:
        value = value.item()
    if isinstance(value, float) and abs(value) <= _FLOAT32_MAX:
        single = np.float32(value)
        if float(single) == value:
            return str(single)
    return value


class CSVLogger(LoopCallbackBase):
    """Writes a CSV file with one row per epoch (Keras' ``CSVLogger``).

    Columns: ``steps``, ``samples``, ``time`` (the count of the row, as in the history),
    then the latest value of every scalar loss and metric, evaluation entries included
    (``loss``, ``accuracy``, ``accuracy_test``...), as the bars and ``history.collect`` give
    them at that step; ``running_mean=True`` writes Keras' epoch means instead. A column
    that appears later (the first evaluation) widens the header; earlier rows leave it empty.

    With ``ciclo.checkpoint``, a checkpoint holds the file's path and how many rows it had;
    a run resumed from it keeps those rows and drops the ones the interrupted run wrote after
    the checkpoint (the resumed run writes them again, equal): each row appears exactly
    once, even after a kill. A resumed file that lacks rows the checkpoint counts (replaced,
    or another path) is a warning naming the file the interrupted run wrote.

    Args:
        path: the file to write.
        separator: the field separator.
        append: continue an existing file instead of replacing it (a resumed run continues
            its file without it).
        process: the process that writes (``None``: every process, each to ``path``).
        running_mean: write what Keras' ``CSVLogger`` writes, as the bars'
            ``running_mean=True`` shows: each training loss and metric averaged over the
            epoch (weighted by samples; in :func:`ciclo.loop`, over the loop so far, the
            entries logged when the logger is called being the training ones), evaluation
            entries and ``stateful_metrics`` as they are. The means are read from the
            history when a row is written, and a resumed run averages the whole epoch.

    Use it as ``callbacks=[ciclo.csv_logger("log.csv")]`` in :func:`ciclo.train_loop` (a row
    at each epoch end), or under a schedule in :func:`ciclo.loop` (a row at each call).

    Example:
        >>> import ciclo, numpy as np, pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "log.csv"
        >>> def step(state, batch):
        ...     return ciclo.logs().add_loss("loss", 0.25), state
        >>> tasks = {ciclo.every(1): step, ciclo.every(2): ciclo.csv_logger(path)}
        >>> _ = ciclo.loop(None, [np.ones(2)] * 4, tasks)
        >>> path.read_text().splitlines()[0]
        'steps,samples,time,loss'
    """

    __loop_observer__ = True  # reads the loop only: runs once per fused group
    #: Only with ``running_mean=True``: the means start again at each epoch, and the
    #: entries in the logs right after a training step are the training ones.
    on_epoch_begin: Callable[[Any, Any, Elapsed, LoopState], None]
    on_train_batch_end: Callable[[Any, Any, Elapsed, LoopState], None]

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        separator: str = ",",
        append: bool = False,
        process: int | None = 0,
        running_mean: bool = False,
    ) -> None:
        self.path = Path(path)
        self.separator = separator
        self.process = check_output_process(process, "csv_logger")
        self.running_mean = check_running_mean(running_mean, "csv_logger")
        self._means = RunningMean() if running_mean else None
        self._from_step: int | None = None  # where the means start (the epoch's first step)
        self._in_train_loop = False
        if running_mean:
            self.on_epoch_begin = self._epoch_begins
            self.on_train_batch_end = self._training_step_ends
        self.columns: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self._loaded = not append
        if writes_here(self.process):
            _check_writable(self.path)

    def _read(self) -> tuple[list[str], list[dict[str, Any]]]:
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f, delimiter=self.separator)
                return list(reader.fieldnames or []), list(reader)
        return [], []

    def _load(self) -> None:
        """With ``append=True``, continues the rows already in the file."""
        self._loaded = True
        self.columns, self.rows = self._read()

    # --- a checkpoint holds how many rows the file had: a resumed run continues there -------
    def state_dict(self) -> dict[str, Any]:
        """The rows written so far (their count) and the columns: saved with a checkpoint."""
        if not self._loaded and writes_here(self.process):
            self._load()
        state: dict[str, Any] = {
            "rows": len(self.rows),
            "columns": list(self.columns),
            "path": os.path.abspath(self.path),
        }
        if self._means is not None:  # a run resumed within an epoch averages all of it
            state["means_from"] = self._from_step
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues the file of a resumed run: keeps the rows written up to the checkpoint
        and drops those the interrupted run wrote after it (the resumed run writes them
        again), so each row appears exactly once."""
        self._loaded = True
        self._from_step = state.get("means_from")
        if not writes_here(self.process):
            return
        count, columns = int(state["rows"]), [str(c) for c in state["columns"]]
        _, rows = self._read()
        if len(rows) < count:
            before = str(state.get("path", os.path.abspath(self.path)))
            where = "" if before == os.path.abspath(self.path) else f" (they are in {before!r})"
            warnings.warn(
                _CSV_ROWS_MISSING.format(
                    path=str(self.path), found=len(rows), count=count, where=where
                ),
                stacklevel=2,
            )
        self.columns = columns
        self.rows = [{c: row.get(c, "") for c in columns} for row in rows[:count]]
        self._write_all()

    def write(self, loop_state: LoopState) -> None:
        """Adds a row: the count and the latest value of every scalar loss and metric."""
        if not writes_here(self.process):
            return
        if not self._loaded:
            self._load()
        elapsed = loop_state.elapsed
        row: dict[str, Any] = {c: getattr(elapsed, c) for c in _ELAPSED_COLUMNS}
        # one text per value, wherever it comes from: a resumed file equals an uninterrupted one
        row.update({k: _plain(v) for k, v in self._values(loop_state).items()})
        self.rows.append(row)
        new = [c for c in row if c not in self.columns]
        if new or not self.path.exists():
            self.columns += new
            self._write_all()
        else:
            with self.path.open("a", newline="") as f:
                self._writer(f).writerow(row)

    def _values(self, loop_state: LoopState) -> dict[str, Any]:
        """The row's values on the host: the latest of each entry, or with
        ``running_mean`` the mean of each training entry over the epoch (as the bars')."""
        latest = latest_entries(loop_state)
        if self._means is None:
            return named_entries(_host.to_host(latest))
        if self._from_step is None:  # no epoch began in this loop: since the loop began
            self._from_step = loop_state.initial_elapsed.steps
        if not self._in_train_loop:  # ciclo.loop: the logs of its call are training entries
            self._means.note(loop_state)
        return named_entries(self._means.values(loop_state, latest, False, self._from_step))

    def _epoch_begins(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        """``on_epoch_begin`` with ``running_mean=True``: the means start again."""
        assert self._means is not None
        self._means.restart(loop_state)
        self._from_step = loop_state.elapsed.steps

    def _training_step_ends(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        """``on_train_batch_end`` with ``running_mean=True``: the entries logged so far in
        this step are training entries (evaluations are added after it)."""
        assert self._means is not None
        self._in_train_loop = True
        self._means.note(loop_state)

    def _writer(self, f: Any) -> csv.DictWriter[str]:
        return csv.DictWriter(f, self.columns, delimiter=self.separator, restval="")

    def _write_all(self) -> None:
        # A new column appeared (e.g. the first evaluation): rewrite with the wider header.
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            writer = self._writer(f)
            writer.writeheader()
            writer.writerows(self.rows)
        tmp.replace(self.path)

    def __loop_callback__(self, loop_state: LoopState) -> None:
        self.write(loop_state)

    def on_epoch_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> None:
        self.write(loop_state)


def _check_writable(path: Path) -> None:
    """Refuses a CSV path that cannot be written, at once rather than at the first row."""
    if not path.parent.exists():
        raise FileNotFoundError(f"csv_logger: the directory of {str(path)!r} does not exist.")
    if path.is_dir():
        raise IsADirectoryError(f"csv_logger: {str(path)!r} is a directory; give a file's path.")
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".ciclo-write-test-"):
            pass
    except OSError as error:
        raise PermissionError(f"csv_logger: cannot write in {str(path.parent)!r}.") from error


csv_logger = CSVLogger
"""Another name of :class:`CSVLogger` (the same class)."""


class TensorBoardLogger(WriterLogger):
    """Writes every scalar log entry to TensorBoard event files (with tensorboardX).

    It writes the rows of the loop's history, so values are fetched once (by the history,
    in batches) and each scalar appears at its row's step (tag ``collection/name``, e.g.
    ``losses/loss``, ``metrics/accuracy_test``). Rows are written at most every
    ``interval`` seconds, at each epoch end, and when the loop ends (which closes the file;
    in :func:`ciclo.loop` too). A resumed run hides the events that the interrupted run
    wrote after the checkpoint (``purge_step``). It is :class:`ciclo.writer_logger` with a
    :class:`ciclo.callbacks.TensorBoardWriter`.

    Needs the extra: ``pip install 'ciclo-core[tensorboard]'``.

    Args:
        logdir: the directory of the event files (``tensorboard --logdir``).
        interval: seconds between writes during training.
        process: the process that writes (``None``: every process).
        **writer_kwargs: passed to ``tensorboardX.SummaryWriter``.

    Use it in ``callbacks=[...]`` of :func:`ciclo.train_loop`, or under a schedule (or
    spread with ``**``) in :func:`ciclo.loop`.

    Example:
        >>> import ciclo, tempfile
        >>> logger = ciclo.tensorboard_logger(tempfile.mkdtemp())  # doctest: +SKIP
    """

    _owner = "tensorboard_logger"

    def __init__(
        self,
        logdir: str | os.PathLike[str],
        *,
        interval: float = 5.0,
        process: int | None = 0,
        **writer_kwargs: Any,
    ) -> None:
        self.logdir = str(logdir)
        super().__init__(
            TensorBoardWriter(logdir, **writer_kwargs),
            interval=interval,
            process=process,
            close=True,
        )

    @property
    def writer(self) -> Any:
        """The ``tensorboardX.SummaryWriter`` (opened on first use)."""
        return self.metric_writer.summary_writer

    def close(self) -> None:
        """Flushes and closes the event file (a later write opens a new one)."""
        self.metric_writer.close()

    def on_train_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> None:
        self.end(loop_state)


tensorboard_logger = TensorBoardLogger
"""Another name of :class:`TensorBoardLogger` (the same class)."""
