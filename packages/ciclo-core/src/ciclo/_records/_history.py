"""History: one row per committed step, stored by column, fetched from device lazily."""

from __future__ import annotations

import os
import time as _time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from .._time._elapsed import Elapsed
from . import _host
from ._logs import Logs
from ._plot import plot_history

__all__ = ["History", "Values", "history"]

_ELAPSED_CODES = {"steps": "q", "samples": "q", "time": "d", "date": "d"}  # array typecodes
_ELAPSED_FIELDS = tuple(_ELAPSED_CODES)


class Values(list[Any]):
    """A key's values from :meth:`History.collect`: a list whose ``dtype`` is the one they
    were logged in (``float32`` for a float32 loss; ``object`` for what is not a number).

    Example:
        >>> import ciclo, numpy as np
        >>> history = ciclo.history()
        >>> history.commit(ciclo.Elapsed.create(), ciclo.logs().add_loss("loss", np.float32(2)))
        >>> history.collect("loss"), history.collect("loss").dtype
        ([2.0], dtype('float32'))
    """

    def __init__(self, values: Any, dtype: np.dtype) -> None:
        super().__init__(values)
        self.dtype = dtype


class _Column:
    """The values of one key and the rows they belong to.

    Numbers are packed in typed arrays (float32 and int32 in 4 bytes, others in 8); the row
    index array is only materialised once the column stops being a contiguous run of rows.
    """

    __slots__ = ("rows", "start", "values")

    def __init__(self, start: int, values: array[Any] | list[Any] | None = None) -> None:
        self.start = start
        self.rows: array[int] | None = None  # None while rows are start, start+1, ...
        self.values = values  # typed on the first values

    def __len__(self) -> int:
        return 0 if self.values is None else len(self.values)

    def extend(self, rows: list[int], values: list[Any]) -> None:
        """Appends ``values`` at increasing ``rows`` (all after the rows already here)."""
        end = self.start + len(self)
        if self.rows is None and (rows[0] != end or rows[-1] - rows[0] != len(rows) - 1):
            self.rows = array("q", range(self.start, end))
        if self.rows is not None:
            self.rows.extend(rows)
        packed = _pack(values)
        current = self.values
        if current is None:
            self.values = packed
        elif isinstance(current, array) and isinstance(packed, array):
            if current.typecode != packed.typecode:  # ints into floats, float32 into float64...
                code = _typecode(np.promote_types(current.typecode, packed.typecode))
                current = self.values = _from_numpy(current, code)
                packed = _from_numpy(packed, code)
            current.extend(packed)
        else:
            self.values = list(current) if isinstance(current, array) else current
            self.values.extend(packed)

    def row_indices(self) -> np.ndarray:
        if self.rows is None:
            return np.arange(self.start, self.start + len(self))
        return np.frombuffer(self.rows, dtype=np.int64)

    def take(self, positions: np.ndarray | None) -> Values:
        values = self.values if self.values is not None else []
        if isinstance(values, array):
            numbers = np.frombuffer(values, dtype=values.typecode)
            taken = numbers if positions is None else numbers[positions]
            return Values(taken.tolist(), numbers.dtype)
        kept = values if positions is None else [values[i] for i in positions.tolist()]
        return Values(kept, np.dtype(object))

    def value_at(self, row: int) -> tuple[bool, Any]:
        values = self.values if self.values is not None else []
        if self.rows is None:
            i = row - self.start
            return (True, values[i]) if 0 <= i < len(values) else (False, None)
        i = int(np.searchsorted(self.row_indices(), row))
        return (True, values[i]) if i < len(self.rows) and self.rows[i] == row else (False, None)


def _expand_blocks(values: list[Any], positions: list[int]) -> list[Any]:
    """Replaces each block (an array of rows) at ``positions`` by its rows."""
    out: list[Any] = []
    start = 0
    for position in positions:
        out.extend(values[start:position])
        out.extend(list(values[position]))
        start = position + 1
    out.extend(values[start:])
    return out


def _pack(values: list[Any]) -> array[Any] | list[Any]:
    """Numbers (Python or NumPy scalars) packed in a typed array; anything else in a list."""
    if len(values) == 1:  # a host value committed at once (a row's): no NumPy round trip
        kind = type(values[0])
        if kind is float:
            return array("d", values)
        if kind is int and -(2**63) <= values[0] < 2**63:
            return array("q", values)
    try:
        packed = np.asarray(values)
    except (ValueError, TypeError):  # ragged arrays and the like: kept in a list
        packed = np.asarray(None)
    numeric = packed.ndim == 1 and packed.dtype.kind in "iuf"
    # unsigned values past int64's range are kept exact, as Python ints in a list
    if numeric and (packed.dtype.kind != "u" or not packed.size or packed.max() < 2**63):
        return _from_numpy(packed, _typecode(packed.dtype))
    return [
        v.item() if isinstance(v, np.generic) or getattr(v, "ndim", None) == 0 else v
        for v in values
    ]


def _typecode(dtype: np.dtype) -> str:
    """How numbers of ``dtype`` are kept: float32 and int32 as they are (an ``array``'s
    typecode is NumPy's character code), other floats as float64, other ints as int64."""
    if dtype in (np.float32, np.int32):
        return str(dtype.char)
    return "d" if dtype.kind == "f" else "q"


def _to_numpy(values: array[Any]) -> np.ndarray:
    return np.frombuffer(values, dtype=values.typecode).copy()


def _from_numpy(values: Any, typecode: str) -> array[Any]:
    """``values`` (a NumPy array, a typed ``array``, a list) as a typed array of ``typecode``."""
    return array(typecode, np.ascontiguousarray(values, dtype=typecode).tobytes())


class _Transit(NamedTuple):
    """A batch of committed values on its way to the host: the rows and values per key
    (for keys in ``sent``, only the last value), the stacked blocks' positions, and the
    chunks sent per key (see ``_host.send_stacked``)."""

    gathered: dict[tuple[str, str], tuple[list[int], list[Any]]]
    blocks: dict[tuple[str, str], list[int]]
    sent: dict[tuple[str, str], _host.Chunks]


_NOT_STACKED = (
    "commit_many: log entry {entry!r} has shape {shape}; every value must be stacked along "
    "axis 0 with one row per elapsed ({count} rows)."
)


class History:
    """The record of a loop: one row per committed step, with its ``elapsed`` and logs.

    Values stay on device when committed and are fetched in batches (every ``max_pending``
    commits, ``fetch_interval`` seconds after the first, or when read), landing in the
    columns once the device has computed them: neither a commit nor a fetch waits.

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

    def __init__(self, *, fetch_interval: float = 0.5, max_pending: int = 256) -> None:
        self.fetch_interval = fetch_interval
        self.max_pending = max_pending
        # Every row has its elapsed fields: dense columns from row 0.
        self._set_elapsed({field: array(code) for field, code in _ELAPSED_CODES.items()})
        self._columns: dict[str, _Column] = {}  # "collection.name" -> column
        self._missing_hints: list[Callable[[str], str | None]] = []  # see hint_missing
        self._lookup: dict[str, dict[str, _Column]] = {}  # the same, by collection and name
        self._num_rows = 0
        # Committed values not yet fetched: (collection, name) -> (rows, values).
        self._pending: dict[tuple[str, str], tuple[list[int], list[Any]]] = {}
        self._blocks: dict[tuple[str, str], list[int]] = {}  # positions of stacked blocks
        self._num_pending = 0  # commits waiting
        self._pending_since = 0.0
        self._transit: _Transit | None = None  # the batch sent, not landed yet

    # --- writing -------------------------------------------------------------------------
    # Committed values wait on device per key; `fetch` moves them to the host in bulk.
    def _set_elapsed(self, columns: dict[str, array[Any]]) -> None:
        self._elapsed_columns = columns
        self._rows: list[Elapsed] = []  # rows committed since: their fields join in bulk

    def _elapsed(self) -> dict[str, array[Any]]:
        """The elapsed columns of every row: a commit keeps its ``Elapsed`` (one append;
        four cost 0.45 µs a step more, benchmarks/NOTES.md), whose fields join them here."""
        rows, self._rows = self._rows, []
        for field in _ELAPSED_FIELDS:
            self._elapsed_columns[field].fromlist(list(map(attrgetter(field), rows)))
        return self._elapsed_columns

    def commit(self, elapsed: Elapsed, logs: Mapping[str, Mapping[str, Any]] | None) -> None:
        """Adds one row: the ``elapsed`` fields and every log entry ``collection.name``."""
        self._rows.append(elapsed)
        row = self._num_rows
        self._num_rows = row + 1
        if row & 255 == 255:  # the kept rows join the columns every 256 rows
            self._elapsed()
        if not logs:
            return
        if not self._num_pending:
            if self._transit is None and not any(
                _host.is_device_array(v) for values in logs.values() for v in values.values()
            ):  # host values only, nothing waiting: stored at once
                self._store(
                    {(c, n): ([row], [v]) for c, values in logs.items() for n, v in values.items()},
                    {},
                )
                return
            self._pending_since = _time.monotonic()
        pending = self._pending
        for collection, values in logs.items():
            for name, value in values.items():
                slot = pending.get((collection, name))
                if slot is None:
                    slot = pending[(collection, name)] = ([], [])
                slot[0].append(row)
                slot[1].append(value)
        self._num_pending = waiting = self._num_pending + 1
        # The clock is read every 16 commits (trivial-step benchmark: once per step costs more).
        if waiting >= self.max_pending:
            self._send()
        elif waiting & 15 == 0:
            if _time.monotonic() - self._pending_since >= self.fetch_interval:
                self._send()
            elif self._transit is not None and _host.is_landed(*self._transit.sent.values()):
                self._land()

    def commit_many(
        self, elapsed: Sequence[Elapsed], logs: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """Adds ``len(elapsed)`` rows from logs whose values are stacked along axis 0
        (as returned by several steps fused in one call); split on the host when fetched."""
        count = len(elapsed)
        stacked = [((c, n), v) for c, values in logs.items() for n, v in values.items()]
        for (collection, name), value in stacked:
            shape = np.shape(value)  # reads `.shape`: no transfer for device arrays
            if shape[:1] != (count,):
                raise ValueError(
                    _NOT_STACKED.format(entry=f"{collection}.{name}", shape=shape, count=count)
                )
        first = self._num_rows
        self._rows.extend(elapsed)
        self._elapsed()  # a group's rows join the columns at once
        self._num_rows = first + count
        if not self._num_pending:
            self._pending_since = _time.monotonic()
        for key, block in stacked:
            rows, values = self._pending.setdefault(key, ([], []))
            rows.extend(range(first, first + count))
            self._blocks.setdefault(key, []).append(len(values))
            values.append(block)
        self._num_pending += 1
        if (
            self._num_pending >= self.max_pending
            or _time.monotonic() - self._pending_since >= self.fetch_interval
        ):
            self._send()

    def add_to_last_row(self, logs: Mapping[str, Mapping[str, Any]]) -> None:
        """Adds entries the last row does not hold yet (what a step owed when a stop cut
        it, run by the resumed loop: ``train_loop``'s evaluation).

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.commit(ciclo.Elapsed.create(), ciclo.logs().add_loss("loss", 1.0))
            >>> history.add_to_last_row(ciclo.logs().add_metric("acc_test", 0.5))
            >>> history.collect("loss", "acc_test")
            ([1.0], [0.5])
        """
        self.fetch()
        row = self._num_rows - 1
        if row < 0:
            raise ValueError("add_to_last_row: the history has no row yet.")
        entries = {(c, n): ([row], [v]) for c, values in logs.items() for n, v in values.items()}
        held = [f"{c}.{n}" for c, n in entries if self._column_for((c, n), row).value_at(row)[0]]
        if held:
            raise ValueError(f"add_to_last_row: the last row already holds {held}.")
        self._store(entries, {}, _host.to_host({k: v for k, (_, v) in entries.items()}))

    def fetch(self) -> None:
        """Fetches all pending device values to the host (batched, see ``_host.to_host``)."""
        self._send()
        self._land()

    def _send(self) -> None:
        """Sends the pending values towards the host (a column's backlog of same-shaped
        device values as one stack), after landing the batch sent before."""
        if self._transit is not None:
            self._land()
        if not self._num_pending:
            return
        pending, blocks = self._pending, self._blocks
        self._pending, self._blocks, self._num_pending = {}, {}, 0
        sent = {}
        for key, (rows, values) in pending.items():
            chunks = None if key in blocks else _host.send_stacked(values)
            if chunks is None:  # fetched one by one when landed: their copies start now
                _host.start_copies(values)
            else:
                sent[key] = chunks
                pending[key] = (rows, values[-1:])  # the last (latest_since), not all alive
        self._transit = _Transit(pending, blocks, sent)

    def _land(self) -> None:
        """Puts the batch sent into the columns (waiting for what the device still owes)."""
        transit, self._transit = self._transit, None
        if transit is None:
            return
        gathered, sent = transit.gathered, transit.sent
        values_by_key: dict[tuple[str, str], Any] = {
            key: _host.land_stacked(chunks) for key, chunks in sent.items()
        }
        rest = {key: values for key, (_, values) in gathered.items() if key not in sent}
        if rest:
            values_by_key.update(_host.to_host(rest))
        self._store(gathered, transit.blocks, values_by_key)

    def _store(
        self,
        gathered: dict[tuple[str, str], tuple[list[int], list[Any]]],
        blocks: dict[tuple[str, str], list[int]],
        values_by_key: dict[tuple[str, str], Any] | None = None,
    ) -> None:
        """Extends the columns by ``gathered`` (``values_by_key``: their values on the host,
        when ``gathered`` holds device values)."""
        if values_by_key is None:
            values_by_key = {key: values for key, (_, values) in gathered.items()}
        for pair, (rows, _) in gathered.items():
            values = values_by_key[pair]
            if pair in blocks:
                values = _expand_blocks(values, blocks[pair])
            self._column_for(pair, rows[0]).extend(rows, values)

    def _column_for(self, key: tuple[str, str], first_row: int) -> _Column:
        collection, name = key
        columns = self._lookup.get(collection)
        if columns is None:
            columns = self._lookup[collection] = {}
        column = columns.get(name)
        if column is None:
            column = columns[name] = self._columns[f"{collection}.{name}"] = _Column(first_row)
        return column

    # --- saving and loading ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every row, as plain Python values and NumPy arrays (for checkpoints).

        Pending device values are fetched first. Numeric columns come out as NumPy copies,
        other columns as lists; :meth:`load_state_dict` takes the result back.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.commit(ciclo.Elapsed.create(), ciclo.logs().add_metric("loss", 0.5))
            >>> copy = ciclo.history()
            >>> copy.load_state_dict(history.state_dict())
            >>> copy.collect("loss")
            [0.5]
        """
        self.fetch()
        return {
            "num_rows": self._num_rows,
            "elapsed": {field: _to_numpy(values) for field, values in self._elapsed().items()},
            "columns": {
                key: {
                    "start": column.start,
                    "rows": None if column.rows is None else _to_numpy(column.rows),
                    "values": _to_numpy(column.values)
                    if isinstance(column.values, array)
                    else list(column.values or ()),
                }
                for key, column in self._columns.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replaces every row by those of a :meth:`state_dict` (pending values are dropped)."""
        self._pending, self._blocks, self._num_pending = {}, {}, 0
        self._transit = None
        self._num_rows = int(state["num_rows"])
        elapsed = state["elapsed"]
        self._set_elapsed({f: _from_numpy(elapsed[f], c) for f, c in _ELAPSED_CODES.items()})
        self._columns, self._lookup = {}, {}
        for key, saved in state["columns"].items():
            column = _Column(int(saved["start"]))
            rows = saved["rows"]
            column.rows = None if rows is None else _from_numpy(rows, "q")
            values = saved["values"]
            kind = getattr(getattr(values, "dtype", None), "kind", None)
            numeric = kind in ("f", "i", "u")
            column.values = (
                _from_numpy(values, _typecode(values.dtype)) if numeric else list(values)
            )
            collection, name = key.split(".", 1)
            self._columns[key] = self._lookup.setdefault(collection, {})[name] = column

    # --- reading -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._num_rows

    def keys(self) -> list[str]:
        """Every key that appears in some row: ``elapsed.<field>`` and ``collection.name``."""
        self.fetch()
        return [f"elapsed.{f}" for f in _ELAPSED_FIELDS] + list(self._columns)

    def _column(self, key: str) -> _Column:
        if key.startswith("elapsed.") and key[8:] in _ELAPSED_FIELDS:
            return _Column(0, self._elapsed()[key[8:]])  # a value in every row
        return self._columns[key]

    def _resolve(self, key: str) -> str:
        # A bare name resolves across collections and `elapsed` alike: a metric named
        # "steps" makes "steps" ambiguous rather than silently shadowed.
        columns = self._columns
        if key in columns or (key.startswith("elapsed.") and key[8:] in _ELAPSED_FIELDS):
            return key
        candidates = [k for k in columns if k.split(".", 1)[1] == key]
        if key in _ELAPSED_FIELDS:
            candidates.insert(0, f"elapsed.{key}")
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            raise KeyError(
                f"history key {key!r} is ambiguous; it could be any of {candidates}. "
                f"Ask for one of them by its full name."
            )
        available = sorted([f"elapsed.{f}" for f in _ELAPSED_FIELDS] + list(columns))
        hints = [text for hint in self._missing_hints if (text := hint(key))]
        raise KeyError(
            " ".join([f"history has no key {key!r}; available keys: {available}.", *hints])
        )

    def hint_missing(self, hint: Callable[[str], str | None]) -> None:
        """Adds ``hint(key) -> str | None`` to the error of a ``collect`` of a key no row
        has: the one who was to log it says why it did not (``train_loop`` says why an
        evaluation never ran). Hints are not saved with the history.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> history.hint_missing(lambda key: "Logged at the end." if key == "f1" else None)
            >>> history.collect("f1")
            Traceback (most recent call last):
            KeyError: "history has no key 'f1'; available keys: [...]. Logged at the end."
        """
        self._missing_hints.append(hint)

    def collect(self, *keys: str) -> Any:
        """Values of ``keys`` over the rows where all of them exist.

        A key is a full ``collection.name``, an elapsed field (``steps``, ``samples``,
        ``time``, ``date``), or a bare name found in exactly one collection.
        Returns one list per key (a tuple of lists, or a single list for one key), each a
        :class:`Values` whose ``dtype`` says how its values were logged.
        """
        if not keys:
            raise ValueError('collect() needs at least one key, e.g. collect("steps", "loss").')
        self.fetch()
        columns = [self._column(self._resolve(k)) for k in keys]
        if all(c.rows is None for c in columns):  # contiguous runs: intersect as ranges
            lo = max(c.start for c in columns)
            hi = min(c.start + len(c) for c in columns)
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
        out: dict[str, dict[str, Any]] = {"elapsed": {}}
        for field, values in self._elapsed().items():
            out["elapsed"][field] = values[row]
        for key, column in self._columns.items():
            present, value = column.value_at(row)
            if present:
                collection, name = key.split(".", 1)
                out.setdefault(collection, {})[name] = value
        return out

    def __iter__(self) -> Iterator[dict[str, dict[str, Any]]]:
        for row in range(self._num_rows):
            yield self[row]

    def run_start(self, first: int, last: int) -> int:
        """The first row of the loop now writing, whose steps run from ``first`` to
        ``last``: the trailing rows whose steps lie in that range and never decrease.

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> for steps in (0, 1, 2, 0, 1):  # a second loop restarted at step 0
            ...     history.commit(ciclo.Elapsed.create(steps=steps), None)
            >>> history.run_start(0, 1), history.run_start(1, 1), history.run_start(0, 0)
            (3, 4, 5)
        """
        steps = np.frombuffer(self._elapsed()["steps"], dtype=np.int64)
        outside = np.flatnonzero((steps < first) | (steps > last))
        drops = np.flatnonzero(steps[1:] < steps[:-1]) + 1
        del steps  # releases the buffer, so the column can grow again
        begin = int(outside[-1]) + 1 if len(outside) else 0
        return max(begin, int(drops[-1]) if len(drops) else 0)

    def numeric_since(
        self, row: int, keys: Sequence[str], *, fetch: bool = True
    ) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """The rows from ``row`` on, on the host (``fetch=False`` leaves pending values on
        device): their ``steps``, ``samples`` and, for each numeric key of ``keys``, its
        ``(rows, values)`` (copies).

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> for steps in range(3):
            ...     logs = ciclo.logs().add_loss("loss", float(steps))
            ...     history.commit(ciclo.Elapsed.create(steps=steps, samples=4 * steps), logs)
            >>> steps, samples, columns = history.numeric_since(1, ["losses.loss"])
            >>> steps.tolist(), samples.tolist(), columns["losses.loss"][1].tolist()
            ([1, 2], [4, 8], [1.0, 2.0])
        """
        if fetch:
            self.fetch()
        elapsed = self._elapsed()
        steps = np.frombuffer(elapsed["steps"], dtype=np.int64)[row:].copy()
        samples = np.frombuffer(elapsed["samples"], dtype=np.int64)[row:].copy()
        columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for key in keys:
            column = self._columns.get(key)
            if column is None or not isinstance(column.values, array):
                continue
            values = np.frombuffer(column.values, dtype=column.values.typecode)
            if column.rows is None:
                start = max(row - column.start, 0)
                rows = np.arange(column.start + start, column.start + len(values))
            else:
                indices = np.frombuffer(column.rows, dtype=np.int64)
                start = int(np.searchsorted(indices, row, side="left"))
                rows = indices[start:].copy()
                del indices
            columns[key] = (rows, values[start:].astype(np.float64))
            del values
        return steps, samples, columns

    def latest_since(self, row: int) -> Logs:
        """The latest value of every entry committed at ``row`` or later (values not
        fetched yet stay on device; nothing is fetched).

        Example:
            >>> import ciclo
            >>> history = ciclo.history()
            >>> for steps, name in enumerate(["a", "b", "a"]):
            ...     logs = ciclo.logs().add_metric(name, float(steps))
            ...     history.commit(ciclo.Elapsed.create(steps=steps), logs)
            >>> history.latest_since(1)
            {'metrics': {'b': 1.0, 'a': 2.0}}
        """
        found: dict[tuple[str, str], tuple[int, Any]] = {}
        for collection, columns in self._lookup.items():
            for name, column in columns.items():
                if column.values is None or not len(column):
                    continue
                end = column.start + len(column) - 1
                last = column.rows[-1] if column.rows is not None else end
                if last >= row:
                    found[(collection, name)] = (last, column.values[-1])
        waiting = [(self._pending, self._blocks)]
        if self._transit is not None:
            waiting.insert(0, (self._transit.gathered, self._transit.blocks))
        for pending, all_blocks in waiting:
            for pair, (rows, values) in pending.items():
                if rows[-1] >= row:
                    value = values[-1]
                    blocks = all_blocks.get(pair)
                    if blocks and blocks[-1] == len(values) - 1:
                        value = value[-1]  # the last row of a stacked block
                    found[pair] = (rows[-1], value)
        out = Logs()
        for (collection, name), (_, value) in sorted(found.items(), key=lambda kv: kv[1][0]):
            out.add_entry(collection, name, value)
        return out

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
            >>> history.plot("loss", "accuracy_test", path="run.png")  # doctest: +SKIP
        """
        return plot_history(self.collect, keys, path=path, x=x, title=title)

    def __repr__(self) -> str:
        return f"History({self._num_rows} rows, keys={sorted(self._columns)})"


def history(**kwargs: Any) -> History:
    """Creates an empty :class:`History` (see its options)."""
    return History(**kwargs)
