"""Amounts of time (steps, samples, time) are read and checked the same way everywhere they
are given: schedules, periods, epoch lengths, progress bar totals, patience."""

from __future__ import annotations

import numpy as np
import pytest

import ciclo


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda v: ciclo.every(samples=v), r"every\(\): samples must be positive, got 0"),
        (lambda v: ciclo.after(samples=v).every(samples=v), r"every\(\): samples must be positive"),
        (
            lambda v: ciclo.train_loop(0, [], {ciclo.on_train_step: print}, epoch_duration=v),
            r"epoch_duration must be a positive amount in one unit",
        ),
        (lambda v: ciclo.keras_bar(ciclo.at(samples=v)), r"keras_bar\(total\) must be a positive"),
    ],
)
def test_a_zero_period_is_refused_wherever_it_is_given(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make(0)


def test_numpy_amounts_are_plain_numbers() -> None:
    assert repr(ciclo.every(samples=np.int64(64))) == "every(samples=64)"
    assert ciclo.at(time=np.float32(1.5)).time == 1.5
    assert ciclo.keras_bar(ciclo.at(samples=np.int64(10))).total == 10


def test_a_patience_period_counts_units_not_a_date() -> None:
    with pytest.raises(ValueError, match=r"a patience period counts steps, samples or time"):
        ciclo.early_stopping("loss", patience=ciclo.at(date=1e9))
    stopper = ciclo.early_stopping("loss", patience=ciclo.at(samples=64, time=60))
    assert stopper.patience.fields() == {"samples": 64, "time": 60}
