"""History: one row per committed step, stored by column, fetched from device lazily."""

from __future__ import annotations

import os
import time as _time
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from . import _host
from ._elapsed import Elapsed
from ._logs import Logs

__all__ = ["History", "history"]

_ELAPSED_FIELDS = ("steps", "samples", "time", "date")
_TYPECODES = {bool: "list", int: "q", float: "d"}


class _Column:
    """The values of one key and the rows they belong to.

    Scalars are packed in typed arrays (8 bytes a value); the row index array is only
    materialised once the column stops being a contiguous run of rows.
    """

    __slots__ = ("rows", "start", "values")

    def __init__(self, start: int, value: Any) -> None:
        self.start = start
        self.rows: array[int] | None = None  # None while rows are start, start+1, ...
        code = _TYPECODES.get(type(value), "list")
        self.values: array[Any] | list[Any] = [] if code == "list" else array(code)

    def append(self, row: int, value: Any) -> None:
        if self.rows is None and row != self.start + len(self.values):
            self.rows = array("q", range(self.start, self.start + len(self.values)))
        if self.rows is not None:
            self.rows.append(row)
        values = self.values
        if isinstance(values, array):
            code = _TYPECODES.get(type(value))
            if code == values.typecode or (code == "q" and values.typecode == "d"):
                values.append(value)
                return
            self.values = values = values.tolist()
        values.append(value)

    def row_indices(self) -> np.ndarray:
        if self.rows is None:
            return np.arange(self.start, self.start + len(self.values))
        return np.frombuffer(self.rows, dtype=np.int64)

    def take(self, positions: np.ndarray | None) -> list[Any]:
        values = self.values
        if positions is None:
            return values.tolist() if isinstance(values, array) else list(values)
        if isinstance(values, array):
            dtype = np.float64 if values.typecode == "d" else np.int64
            return np.frombuffer(values, dtype=dtype)[positions].tolist()
        return [values[i] for i in positions.tolist()]

    def value_at(self, row: int) -> tuple[bool, Any]:
        if self.rows is None:
            i = row - self.start
            return (0 <= i < len(self.values)), (self.values[i] if 0 <= i < len(self.values) else None)
        i = int(np.searchsorted(self.row_indices(), row))
        if i < len(self.rows) and self.rows[i] == row:
            return True, self.values[i]
        return False, None


def _as_python(value: Any) -> Any:
    """0-d arrays become Python scalars; other values are kept as they are."""
    if isinstance(value, np.ndarray | np.generic) and np.ndim(value) == 0:
        return value.item()
    return value


class History:
    """The record of a loop: one row per committed step, with its ``elapsed`` and logs.

    Values stay on device when committed and are fetched in batches, at most every
    ``fetch_interval`` seconds or when read, so committing never forces a per-step sync.

    Example:
        >>> import ciclo
        >>> history = ciclo.history()
        >>> elapsed = ciclo.Elapsed.create()
        >>> for i in range(3):
        ...     history.commit(elapsed, ciclo.logs().add_metric("loss", 1.0 / (i + 1)))
        ...     elapsed = elapsed.update(batch_size=8)
        >>> history.collect("steps", "loss")
        ([0, 1, 2], [1.0, 0.5, 0.3333333333333333])
    """

    def __init__(self, *, fetch_interval: float = 0.5, max_pending: int = 4096) -> None:
        self.fetch_interval = fetch_interval
        self.max_pending = max_pending
        self._columns: dict[str, _Column] = {}
        self._num_rows = 0
        self._pending: list[tuple[int, list[tuple[str, Any]]]] = []
        self._pending_since = 0.0

    # --- writing -------------------------------------------------------------------------
    def commit(self, elapsed: Elapsed, logs: Mapping[str, Mapping[str, Any]] | None) -> None:
        """Adds one row: the ``elapsed`` fields and every log entry ``collection.name``."""
        row = self._num_rows
        self._num_rows += 1
        entries = [(f"elapsed.{f}", getattr(elapsed, f)) for f in _ELAPSED_FIELDS]
        on_device = False
        if logs:
            for collection, values in logs.items():
                for name, value in values.items():
                    entries.append((f"{collection}.{name}", value))
                    on_device = on_device or _host.is_device_array(value)
        if on_device or self._pending:
            self._defer(row, entries)
        else:
            self._store(row, entries)

    def commit_many(self, elapsed: Sequence[Elapsed], logs: Mapping[str, Mapping[str, Any]]) -> None:
        """Adds ``len(elapsed)`` rows from logs whose values are stacked along axis 0
        (as returned by several steps fused in one call); split on the host when fetched."""
        count = len(elapsed)
        stacked = [(f"{c}.{n}", v) for c, values in logs.items() for n, v in values.items()]
        for key, value in stacked:
            if getattr(value, "shape", (count,))[:1] != (count,):
                raise ValueError(
                    f"commit_many: log entry {key!r} has shape {getattr(value, 'shape', None)}; "
                    f"every value must be stacked along axis 0 with {count} rows."
                )
        first = self._num_rows
        self._num_rows += count
        self._defer(first, [("__stacked__", (list(elapsed), stacked))])

    def _defer(self, row: int, entries: list[tuple[str, Any]]) -> None:
        if not self._pending:
            self._pending_since = _time.monotonic()
        self._pending.append((row, entries))
        if (
            len(self._pending) >= self.max_pending
            or _time.monotonic() - self._pending_since >= self.fetch_interval
        ):
            self.fetch()

    def _store(self, row: int, entries: list[tuple[str, Any]]) -> None:
        columns = self._columns
        for key, value in entries:
            value = _as_python(value)
            column = columns.get(key)
            if column is None:
                column = columns[key] = _Column(row, value)
            column.append(row, value)

    def fetch(self) -> None:
        """Fetches all pending device values to the host in one transfer."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        pending = _host.to_host(pending)
        for row, entries in pending:
            if entries and entries[0][0] == "__stacked__":
                elapsed_list, stacked = entries[0][1]
                for i, elapsed in enumerate(elapsed_list):
                    step_entries = [(f"elapsed.{f}", getattr(elapsed, f)) for f in _ELAPSED_FIELDS]
                    step_entries += [(key, value[i]) for key, value in stacked]
                    self._store(row + i, step_entries)
            else:
                self._store(row, entries)

    # --- reading -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._num_rows

    def keys(self) -> list[str]:
        """Every ``collection.name`` key that appears in some row."""
        self.fetch()
        return list(self._columns)

    def _resolve(self, key: str) -> str:
        columns = self._columns
        if key in columns:
            return key
        if key in _ELAPSED_FIELDS:
            return f"elapsed.{key}"
        candidates = [k for k in columns if k.split(".", 1)[1] == key]
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            raise KeyError(
                f"history key {key!r} is ambiguous; it could be any of {candidates}. "
                f"Ask for one of them by its full name."
            )
        raise KeyError(f"history has no key {key!r}; available keys: {sorted(columns)}")

    def collect(self, *keys: str) -> Any:
        """Values of ``keys`` over the rows where all of them exist.

        A key is a full ``collection.name``, an elapsed field (``steps``, ``samples``,
        ``time``, ``date``), or a bare name found in exactly one collection.
        Returns one list per key (a tuple of lists, or a single list for one key).
        """
        if not keys:
            raise ValueError('collect() needs at least one key, e.g. collect("steps", "loss").')
        self.fetch()
        columns = [self._columns[self._resolve(k)] for k in keys]
        if all(c.rows is None for c in columns):  # contiguous runs: intersect as ranges
            lo = max(c.start for c in columns)
            hi = min(c.start + len(c.values) for c in columns)
            out = [c.take(np.arange(lo - c.start, max(hi, lo) - c.start)) for c in columns]
        else:
            rows = columns[0].row_indices()
            for c in columns[1:]:
                rows = np.intersect1d(rows, c.row_indices(), assume_unique=True)
            out = [c.take(np.searchsorted(c.row_indices(), rows)) for c in columns]
        return out[0] if len(keys) == 1 else tuple(out)

    def __getitem__(self, row: int) -> dict[str, dict[str, Any]]:
        """Row ``row`` as ``{collection: {name: value}}`` (``elapsed`` included)."""
        self.fetch()
        if row < 0:
            row += self._num_rows
        if not 0 <= row < self._num_rows:
            raise IndexError(f"history row {row} out of range ({self._num_rows} rows)")
        out: dict[str, dict[str, Any]] = {}
        for key, column in self._columns.items():
            present, value = column.value_at(row)
            if present:
                collection, name = key.split(".", 1)
                out.setdefault(collection, {})[name] = value
        return out

    def __iter__(self) -> Iterator[dict[str, dict[str, Any]]]:
        for row in range(self._num_rows):
            yield self[row]

    def last_logs(self) -> Logs:
        """The logs of the last row, without ``elapsed``."""
        if not self._num_rows:
            return Logs()
        row = self[-1]
        row.pop("elapsed", None)
        return Logs(row)

    def plot(
        self,
        *keys: str | Sequence[str],
        path: str | os.PathLike[str] | None = None,
        x: str = "steps",
        title: str | None = None,
    ) -> Any:
        """Plots log entries over the run with matplotlib (``pip install 'ciclo-core[plot]'``).

        Args:
            *keys: entries as for :meth:`collect`, one panel each; a tuple of keys shares a
                panel (``("loss", "loss_test")``).
            path: where to save the figure (a ``.png`` writes a PNG).
            x: the x axis: ``"steps"``, ``"samples"`` or ``"time"``.
            title: a title for the figure.

        Returns:
            the ``matplotlib.figure.Figure``.

        Example:
            >>> fig = history.plot("loss", ("accuracy", "accuracy_test"), path="run.png")
        """
        from ._plot import plot_history

        return plot_history(self, keys, path=path, x=x, title=title)

    def __repr__(self) -> str:
        return f"History({self._num_rows} rows, keys={sorted(self._columns)})"


def history(**kwargs: Any) -> History:
    """Creates an empty :class:`History` (see its options)."""
    return History(**kwargs)
