"""Named schedules: *moments* of the predefined loops (``on_epoch_end``, ``on_train_step``...),
keys of their ``tasks`` and names of callback objects' hook methods.
"""

from __future__ import annotations

import difflib
import functools

from .._time._schedules import NamedSchedule

__all__ = [
    "NamedSchedule",
    "NAMED_SCHEDULES",
    "STATE_METHODS",
    "moments",
    "named_schedule",
    "owner",
]


# The one list of moments: (name, the loops that run it, when), in the order they run.
_MOMENTS = (
    ("on_train_begin", "train", "once, before the first training step"),
    (
        "on_reset_step",
        "train test predict",
        "resets stateful metrics: at each epoch begin, and before each evaluation or prediction",
    ),
    ("on_epoch_begin", "train", "before the first step of each epoch"),
    ("on_train_batch_begin", "train", "before each training step"),
    ("on_train_step", "train", "the training step"),
    ("on_train_batch_end", "train", "after each training step"),
    ("on_test_begin", "test", "once, before the first evaluation batch"),
    ("on_test_batch_begin", "test", "before each evaluation step"),
    ("on_test_step", "test", "the evaluation step"),
    ("on_test_batch_end", "test", "after each evaluation step"),
    ("on_test_end", "test", "once, after the last evaluation batch (logs: the aggregated metrics)"),
    ("on_epoch_end", "train", "after the step that completes an epoch (after its evaluation)"),
    ("on_train_end", "train", "once, after the last training step"),
    ("on_predict_begin", "predict", "once, before the first prediction batch"),
    ("on_predict_batch_begin", "predict", "before each prediction step"),
    ("on_predict_step", "predict", "the prediction step"),
    ("on_predict_batch_end", "predict", "after each prediction step"),
    ("on_predict_end", "predict", "once, after the last prediction batch"),
)

#: Every named schedule, by name.
NAMED_SCHEDULES: dict[str, NamedSchedule] = {
    name: NamedSchedule(name, doc) for name, _, doc in _MOMENTS
}

_LOOPS = {name: tuple(loops.split()) for name, loops, _ in _MOMENTS}
_OWNER_TEXT = {
    "train": "train_loop",
    "test": "test_loop (or train_loop's evaluation)",
    "predict": "predict_loop",
}


@functools.cache
def moments(*loops: str) -> tuple[str, ...]:
    """The names of the moments that any of ``loops`` (``"train"``, ``"test"``...) runs, in order.

    Example:
        >>> moments("test")[:3]
        ('on_reset_step', 'on_test_begin', 'on_test_batch_begin')
    """
    return tuple(name for name, owners in _LOOPS.items() if set(owners) & set(loops))


def owner(name: str) -> str:
    """Which loop runs the moment ``name``, in words (for error messages).

    Example:
        >>> owner("on_epoch_end"), owner("on_reset_step")
        ('train_loop', 'every loop')
    """
    owners = _LOOPS[name]
    return "every loop" if len(owners) == len(_OWNER_TEXT) else _OWNER_TEXT[owners[0]]


# The public names (re-exported as ciclo.on_epoch_end, ...).
on_train_begin = NAMED_SCHEDULES["on_train_begin"]
on_epoch_begin = NAMED_SCHEDULES["on_epoch_begin"]
on_reset_step = NAMED_SCHEDULES["on_reset_step"]
on_train_batch_begin = NAMED_SCHEDULES["on_train_batch_begin"]
on_train_step = NAMED_SCHEDULES["on_train_step"]
on_train_batch_end = NAMED_SCHEDULES["on_train_batch_end"]
on_test_begin = NAMED_SCHEDULES["on_test_begin"]
on_test_batch_begin = NAMED_SCHEDULES["on_test_batch_begin"]
on_test_step = NAMED_SCHEDULES["on_test_step"]
on_test_batch_end = NAMED_SCHEDULES["on_test_batch_end"]
on_test_end = NAMED_SCHEDULES["on_test_end"]
on_epoch_end = NAMED_SCHEDULES["on_epoch_end"]
on_train_end = NAMED_SCHEDULES["on_train_end"]
on_predict_begin = NAMED_SCHEDULES["on_predict_begin"]
on_predict_batch_begin = NAMED_SCHEDULES["on_predict_batch_begin"]
on_predict_step = NAMED_SCHEDULES["on_predict_step"]
on_predict_batch_end = NAMED_SCHEDULES["on_predict_batch_end"]
on_predict_end = NAMED_SCHEDULES["on_predict_end"]

#: The state's methods that register under a named schedule (when the state has them).
STATE_METHODS = {
    "on_train_step": "train_step",
    "on_test_step": "test_step",
    "on_predict_step": "predict_step",
    "on_reset_step": "reset_step",
}


def named_schedule(key: NamedSchedule | str) -> NamedSchedule:
    """The named schedule for ``key`` (one or its name); an unknown name suggests close ones."""
    if isinstance(key, NamedSchedule):
        return key
    found = NAMED_SCHEDULES.get(key)
    if found is not None:
        return found
    close = difflib.get_close_matches(key, NAMED_SCHEDULES, n=3)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else " See ciclo.on_*."
    raise ValueError(f"unknown named schedule {key!r}.{hint}")
