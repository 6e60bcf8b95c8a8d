"""How a resumed run reaches its data position: a sequence, an object iterated by index and a
dataset with ``state_dict``/``load_state_dict`` seek at once (no batch before the position is
read again); any other dataset is replayed, and one line says so with the count."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ciclo

STEPS, CRASH_AT = 12, 8
CONSUMED = 7  # every(3) saves after the steps counted 0, 3, 6: the last before the crash


def train(tmp_path: Path, dataset: Any, *, crash: bool) -> tuple[Any, ciclo.Elapsed]:
    def step(state: Any, batch: Any, elapsed: ciclo.Elapsed) -> Any:
        if crash and elapsed.steps == CRASH_AT:
            raise RuntimeError("killed")
        return state * 2 + float(np.asarray(batch).sum())

    ckpt = ciclo.checkpoint(tmp_path / "ckpt", async_save=False, compilation_cache=False)
    state, _, elapsed = ciclo.loop(
        np.float64(0.0), dataset, {ciclo.every(1): step, ciclo.every(3): ckpt}, resume=ckpt
    )
    return state, elapsed


def batch(i: int) -> np.ndarray:
    return np.full(2, i, np.float64)


class RecordedSequence(Sequence):
    """A sequence of batches that records the indices read."""

    def __init__(self) -> None:
        self.read: list[int] = []

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < STEPS:
            raise IndexError(i)
        self.read.append(i)
        return batch(i)


class Indexed:
    """Iterated by Python through ``__getitem__`` (no ``__iter__``, no ``__len__``)."""

    def __init__(self) -> None:
        self.read: list[int] = []

    def __getitem__(self, i: int) -> np.ndarray:
        if i >= STEPS:
            raise IndexError(i)
        self.read.append(i)
        return batch(i)


class Seekable:
    """The ``state_dict``/``load_state_dict`` convention: ``iter()`` starts at the position."""

    def __init__(self) -> None:
        self.position = 0
        self.read: list[int] = []

    def __iter__(self) -> Iterator[np.ndarray]:
        while self.position < STEPS:
            self.read.append(self.position)
            self.position += 1
            yield batch(self.position - 1)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def reference() -> float:
    state = 0.0
    for i in range(STEPS):
        state = state * 2 + float(batch(i).sum())
    return state


@pytest.mark.parametrize(
    "make",
    [RecordedSequence, Indexed, Seekable],
    ids=["sequence", "iterated-by-index", "state_dict"],
)
def test_a_dataset_that_can_seek_is_not_replayed(tmp_path, capsys, make):
    with pytest.raises(RuntimeError, match="killed"):
        train(tmp_path, make(), crash=True)
    capsys.readouterr()
    dataset = make()
    state, elapsed = train(tmp_path, dataset, crash=False)
    assert elapsed.steps == STEPS
    assert state == reference()
    assert dataset.read == list(range(CONSUMED, STEPS))  # the consumed ones never read again
    assert "replaying" not in capsys.readouterr().err


def test_a_dataset_that_cannot_seek_is_replayed_and_one_line_says_so(tmp_path, capsys):
    def generator() -> Iterator[np.ndarray]:
        for i in range(STEPS):
            drawn.append(i)
            yield batch(i)

    drawn: list[int] = []
    with pytest.raises(RuntimeError, match="killed"):
        train(tmp_path, generator(), crash=True)
    capsys.readouterr()
    drawn.clear()
    state, elapsed = train(tmp_path, generator(), crash=False)
    assert (elapsed.steps, state) == (STEPS, reference())
    assert drawn == list(range(STEPS))  # the consumed batches drawn again, then dropped
    lines = [line for line in capsys.readouterr().err.splitlines() if "replaying" in line]
    assert lines == [
        f"ciclo: reaching the checkpoint's data position by replaying {CONSUMED} batches: a "
        "generator cannot seek (a sequence of batches, or a dataset with "
        "state_dict()/load_state_dict(), seeks at once)."
    ]


def test_a_mapping_is_not_taken_for_an_indexed_dataset():
    from ciclo._checkpoint._resume import iterated_by_index

    class Table(dict):
        pass

    assert not iterated_by_index({0: 1})
    assert not iterated_by_index(Table())
    assert not iterated_by_index([1, 2])  # a list has __iter__: resumed as a sequence
    assert iterated_by_index(Indexed())
