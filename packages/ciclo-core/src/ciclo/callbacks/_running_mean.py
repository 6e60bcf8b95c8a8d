"""``running_mean=True``: each training loss and metric as its sample-weighted mean since the
epoch began (Keras' ``Progbar``), read from the history when a bar redraws.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._loop._state import LoopState
from .._records import _host
from .._records._history import History

__all__ = ["RunningMean", "check_running_mean"]

_AVERAGED = ("losses", "metrics")
_NOT_A_BOOL = "{what}: running_mean must be True or False, got {value!r}."

Key = tuple[str, str]


def check_running_mean(value: Any, what: str) -> bool:
    """``value`` if it is a bool, else a ``TypeError``.

    Example:
        >>> check_running_mean(True, "keras_bar")
        True
    """
    if not isinstance(value, bool):
        raise TypeError(_NOT_A_BOOL.format(what=what, value=value))
    return value


def _training_entries(logs: Mapping[str, Mapping[str, Any]]) -> dict[Key, Any]:
    out: dict[Key, Any] = {}
    for collection in _AVERAGED:
        for name, value in logs.get(collection, {}).items():
            if (
                getattr(value, "shape", ()) == ()
                and not isinstance(value, str | bytes | bool)
                and getattr(getattr(value, "dtype", None), "kind", "f") in "iuf"
            ):  # numbers (a flag or a text is shown as it is)
                out[(collection, name)] = value
    return out


class RunningMean:
    """The running sums ``[weighted sum, weight, sum, count]`` of one bar, per training entry."""

    def __init__(self) -> None:
        self.training: set[Key] = set()  # entries seen in the logs right after a training step
        self._history: History | None = None  # whose rows the sums hold
        self._cursor = 0  # the first row of that history not summed yet
        self._sums: dict[Key, np.ndarray] = {}
        self._kept: list[tuple[float, dict[Key, Any]]] = []  # calls by hand, still on device

    def restart(self, loop_state: LoopState) -> None:
        """A period (an epoch) begins at the current step, whose row is not committed yet."""
        self._history = loop_state.history
        self._cursor = len(loop_state.history)
        self._sums.clear()

    def note(self, loop_state: LoopState) -> None:
        """Right after a training step: its losses and metrics are training entries."""
        self.training.update(_training_entries(loop_state.logs))

    def keep(self, loop_state: LoopState) -> None:
        """A call by hand (``bar(elapsed, logs)``): keep the values (on device) until a redraw."""
        entries = _training_entries(loop_state.logs)
        self.training.update(entries)
        after = loop_state.elapsed_after_step()
        self._kept.append((float(after.samples - loop_state.elapsed.samples), entries))

    def to_fetch(self, loop_state: LoopState, by_hand: bool) -> Any:
        """The device values a redraw needs: the current step's training values, or those kept."""
        if by_hand:
            kept, self._kept = self._kept, []
            return kept
        if loop_state.batch is None:  # on_start / on_end: no training step now
            return {}
        return {k: v for k, v in _training_entries(loop_state.logs).items() if k in self.training}

    def means(
        self, loop_state: LoopState, fetched: Any, by_hand: bool, from_step: int
    ) -> dict[Key, float]:
        """The mean of each training entry over the period, this step included."""
        current: dict[Key, Any] = {}
        current_weight = 0.0
        if by_hand:
            for weight, entries in fetched:
                for key, value in entries.items():
                    self._add(key, np.asarray([float(value)]), np.asarray([weight]))
        else:
            self._read_history(loop_state, from_step)
            current = fetched
            if loop_state.batch is not None:
                after = loop_state.elapsed_after_step()
                current_weight = float(after.samples - loop_state.elapsed.samples)
        out = {}
        for key in self.training:
            acc = self._sums.get(key, np.zeros(4))
            if key in current:
                value = float(current[key])
                acc = acc + np.array([value * current_weight, current_weight, value, 1.0])
            weighted, weight, total, count = acc.tolist()
            if count:
                out[key] = weighted / weight if weight > 0 else total / count
        return out

    def values(
        self, loop_state: LoopState, latest: Mapping[Key, Any], by_hand: bool, from_step: int
    ) -> dict[Key, Any]:
        """``latest`` on the host (one transfer), training entries replaced by their means."""
        host, fetched = _host.to_host((dict(latest), self.to_fetch(loop_state, by_hand)))
        host.update(self.means(loop_state, fetched, by_hand, from_step))
        return dict(host)

    def _read_history(self, loop_state: LoopState, from_step: int) -> None:
        """Adds the rows committed since the last read, up to the current step's."""
        history = loop_state.history
        if self._history is not history:  # no epoch began in this loop (yet)
            self._history = history
            self._cursor = history.run_start(from_step, loop_state.elapsed.steps)
            self._sums.clear()
        keys = sorted(self.training)
        steps, samples, columns = history.numeric_since(self._cursor, [f"{c}.{n}" for c, n in keys])
        now, before = loop_state.elapsed.steps, loop_state.elapsed.samples
        end = int(np.searchsorted(steps, now, side="left"))  # rows of earlier steps
        if not end:
            return
        # a row's weight: its step's samples, up to the next row of a later step
        following = np.searchsorted(np.append(steps, now), steps[:end], side="right")
        weights = (np.append(samples, before)[following] - samples[:end]).astype(np.float64)
        for collection, name in keys:
            found = columns.get(f"{collection}.{name}")
            if found is None:
                continue
            rows, values = found
            taken = rows < self._cursor + end
            self._add((collection, name), values[taken], weights[rows[taken] - self._cursor])
        self._cursor += end

    def _add(self, key: Key, values: np.ndarray, weights: np.ndarray) -> None:
        if not len(values):
            return
        update = np.array(
            [(values * weights).sum(), weights.sum(), values.sum(), float(len(values))]
        )
        self._sums[key] = self._sums.get(key, np.zeros(4)) + update
