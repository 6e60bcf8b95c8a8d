"""The data of the examples: scikit-learn's digits (1797 8x8 images, shipped with
scikit-learn, no download), split once, and a shuffling batch loader that can seek (so a
resumed run continues exactly, see ``checkpoint_resume.py``)."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np

TEST_SIZE = 360  # divides by 8 devices and by the evaluation batch size


def digits(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)``: 1437 training and 360 test images as
    ``(n, 64)`` float32 in [0, 1] with int32 labels, split at random with ``seed``."""
    pixels, labels = _load_digits()
    x = (pixels / 16.0).astype(np.float32)
    y = labels.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    test, train = order[:TEST_SIZE], order[TEST_SIZE:]
    return x[train], y[train], x[test], y[test]


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels ``(1797, 64)`` and labels, as ``sklearn.datasets.load_digits``
    returns them: read from the file scikit-learn ships, without importing scikit-learn,
    whose import (SciPy's statistics with it) costs about 0.9 s of each example's start,
    half of a resume's (``benchmarks/restart.py``). ``load_digits`` reads that file too, and
    is called when it is not where it has always been."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if spec is not None and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
        if path.is_file():
            table = np.loadtxt(path, delimiter=",")
            return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data, data.target


class Batches:
    """Endless shuffled epochs of ``(x, y)`` batches of ``batch_size`` (the last incomplete
    batch of each epoch is dropped, so every batch has the same shape).

    Implements ``state_dict()`` / ``load_state_dict()``: a checkpoint saves the position and
    a resumed loop continues from the next batch, with the same shuffling.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int = 0) -> None:
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.position = 0  # batches handed out so far

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        per_epoch = len(self.x) // self.batch_size
        while True:
            epoch, index = divmod(self.position, per_epoch)
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.x))
            rows = order[index * self.batch_size : (index + 1) * self.batch_size]
            self.position += 1
            yield self.x[rows], self.y[rows]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def eval_batches(
    x: np.ndarray, y: np.ndarray, batch_size: int = 120
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The evaluation set in batches (the last one may be smaller)."""
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)]


def parse_args(description: str | None, steps: int, **extra: object) -> argparse.Namespace:
    """``--steps`` (and the given extra options, ``--name default``) of an example."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help="training steps")
    for name, default in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return parser.parse_args()
