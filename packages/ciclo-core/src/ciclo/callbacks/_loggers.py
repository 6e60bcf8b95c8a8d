"""Loggers: ``csv_logger`` (one row per epoch) and ``tensorboard_logger`` (every logged
step, written from the history in batches)."""

from __future__ import annotations

import csv
import math
import os
import time as _time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._loop._hooks import LoopCallbackBase
from .._loop._state import LoopState
from .._records import _host
from .._time._elapsed import Elapsed
from ._progress import display_values

__all__ = ["csv_logger", "tensorboard_logger", "CSVLogger", "TensorBoardLogger"]

_ELAPSED_COLUMNS = ("steps", "samples", "time")


class CSVLogger(LoopCallbackBase):
    """Writes one CSV row per call; see :func:`csv_logger`."""

    __loop_observer__ = True  # reads the loop only: runs once per fused group

    def __init__(self, path: str | os.PathLike[str], *, separator: str, append: bool) -> None:
        self.path = Path(path)
        self.separator = separator
        self.columns: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self._loaded = not append
        if not self.path.parent.exists():
            raise FileNotFoundError(
                f"csv_logger: the directory of {str(self.path)!r} does not exist; create it "
                f"first (e.g. os.makedirs({str(self.path.parent)!r}, exist_ok=True))."
            )

    def _load(self) -> None:
        """With ``append=True``, continues the rows already in the file."""
        self._loaded = True
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f, delimiter=self.separator)
                self.columns = list(reader.fieldnames or [])
                self.rows = list(reader)
        else:
            self.rows, self.columns = [], []

    def write(self, loop_state: LoopState) -> None:
        """Adds a row: the count and the latest value of every scalar loss and metric."""
        if not self._loaded:
            self._load()
        elapsed = loop_state.elapsed
        row: dict[str, Any] = {c: getattr(elapsed, c) for c in _ELAPSED_COLUMNS}
        row.update(_host.to_host(display_values(loop_state)))
        self.rows.append(row)
        new = [c for c in row if c not in self.columns]
        if new or not self.path.exists():
            self.columns += new
            self._write_all()
        else:
            with self.path.open("a", newline="") as f:
                self._writer(f).writerow(row)

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


def csv_logger(
    path: str | os.PathLike[str], *, separator: str = ",", append: bool = False
) -> CSVLogger:
    """Writes a CSV file with one row per epoch (Keras' ``CSVLogger``).

    Columns: ``steps``, ``samples``, ``time`` (the count of the row, as in the history),
    then the latest value of every scalar loss and metric, evaluation entries included
    (``loss``, ``accuracy``, ``accuracy_test``...). A column that appears later (the first
    evaluation) widens the header; earlier rows leave it empty.

    Args:
        path: the file to write.
        separator: the field separator.
        append: continue an existing file (a resumed run) instead of replacing it.

    Returns:
        a callback object: ``callbacks=[ciclo.csv_logger("log.csv")]`` in
        :func:`ciclo.train_loop` (a row at each epoch end), or under a schedule in
        :func:`ciclo.loop` (a row at each call).

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
    return CSVLogger(path, separator=separator, append=append)


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool | int | float | np.generic) or (
        isinstance(value, np.ndarray) and value.size == 1
    ):
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    return None


class TensorBoardLogger(LoopCallbackBase):
    """Writes history rows as TensorBoard scalars; see :func:`tensorboard_logger`."""

    __loop_observer__ = True  # reads the loop only: runs once per fused group

    def __init__(
        self, logdir: str | os.PathLike[str], interval: float, writer_kwargs: Mapping[str, Any]
    ) -> None:
        self.logdir = str(logdir)
        self.interval = interval
        self.writer_kwargs = dict(writer_kwargs)
        self._writer: Any = None
        self._next_row: int | None = None
        self._last = -math.inf
        _import_tensorboardx()  # fail at creation, not mid-run

    @property
    def writer(self) -> Any:
        """The ``tensorboardX.SummaryWriter`` (opened on first use)."""
        if self._writer is None:
            self._writer = _import_tensorboardx()(self.logdir, **self.writer_kwargs)
        return self._writer

    def write(self, loop_state: LoopState, *, force: bool = True) -> None:
        """Writes the history rows committed since the last write."""
        history = loop_state.history
        if self._next_row is None:
            self._next_row = len(history)
        now = _time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        end = len(history)
        if end <= self._next_row:
            return
        writer = self.writer
        for index in range(self._next_row, end):
            row = history[index]  # the first read fetches pending values in one transfer
            elapsed = row.get("elapsed", {})
            step, walltime = int(elapsed.get("steps", index)), elapsed.get("date")
            for collection, entries in row.items():
                if collection in ("elapsed", "outputs"):
                    continue
                for name, value in entries.items():
                    scalar = _scalar(value)
                    if scalar is not None:
                        writer.add_scalar(f"{collection}/{name}", scalar, step, walltime=walltime)
        self._next_row = end
        writer.flush()

    def close(self) -> None:
        """Flushes and closes the event file (a later write opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # --- hooks ---------------------------------------------------------------------------
    def __loop_callback__(self, loop_state: LoopState) -> None:
        self.write(loop_state, force=False)

    def on_train_begin(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        self._next_row = len(loop_state.history)

    def on_train_batch_end(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        self.write(loop_state, force=False)

    def on_epoch_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> None:
        self.write(loop_state)

    def on_train_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> None:
        self.write(loop_state)
        self.close()


def _import_tensorboardx() -> Any:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ImportError(
            "ciclo.tensorboard_logger needs tensorboardX: pip install 'ciclo-core[tensorboard]'"
        ) from None
    return SummaryWriter


def tensorboard_logger(
    logdir: str | os.PathLike[str], *, interval: float = 5.0, **writer_kwargs: Any
) -> TensorBoardLogger:
    """Writes every scalar log entry to TensorBoard event files (with tensorboardX).

    It writes the rows of the loop's history, so values are fetched once (by the history,
    in batches) and each scalar appears at its row's step (tag ``collection/name``, e.g.
    ``losses/loss``, ``metrics/accuracy_test``). Rows are written at most every
    ``interval`` seconds, at each epoch end, and at the end of training (which closes the
    file).

    Needs the extra: ``pip install 'ciclo-core[tensorboard]'``.

    Args:
        logdir: the directory of the event files (``tensorboard --logdir``).
        interval: seconds between writes during training.
        **writer_kwargs: passed to ``tensorboardX.SummaryWriter``.

    Returns:
        a callback object for ``callbacks=[...]`` of :func:`ciclo.train_loop`; in
        :func:`ciclo.loop`, put it under a schedule and pass ``on_end=logger.on_train_end``.

    Example:
        >>> import ciclo, tempfile
        >>> logger = ciclo.tensorboard_logger(tempfile.mkdtemp())  # doctest: +SKIP
    """
    return TensorBoardLogger(logdir, interval, writer_kwargs)
