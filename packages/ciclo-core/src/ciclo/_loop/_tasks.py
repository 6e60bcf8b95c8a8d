"""A loop's ``tasks`` argument, read once: ``{schedule: callback | [callbacks]}`` as a list
of ``(Schedule, [Callback])``, and the hooks its callbacks implement when the engine
returns (a restart) and at the loop's end."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._time._schedules import NamedSchedule, Schedule, as_schedule
from ._callback import Callback, as_callback
from ._hooks import EndHook, RestartHook
from ._naming import callback_name
from ._state import LoopState

__all__ = ["Tasks", "normalize_tasks", "as_callback_list", "run_end_hooks", "restart"]

Tasks = Mapping[Any, Any]

_NAMED_SCHEDULE_IN_LOOP = (
    "tasks key {schedule!r} is a named schedule: it belongs to ciclo.train_loop, test_loop or "
    "predict_loop, which know when it happens. In loop(), use a schedule such as "
    "ciclo.every(1)."
)
_NAME_IN_LOOP = (
    "tasks key {schedule!r} is a name, but loop() needs schedules such as ciclo.every(1). "
    "Named schedules (on_train_step, ...) belong to ciclo.train_loop / test_loop / "
    "predict_loop."
)


def as_callback_list(value: Any) -> list[Callback]:
    """``None``, a callback, or a list or tuple of them, as a list of :class:`Callback`.

    Example:
        >>> [c.name for c in as_callback_list([print, len])]
        ['print', 'len']
    """
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [as_callback(v) for v in value]
    return [as_callback(value)]


def normalize_tasks(tasks: Tasks | None) -> list[tuple[Schedule, list[Callback]]]:
    """``{schedule: callback | [callbacks]}`` as a list of ``(Schedule, [Callback])``.

    The caller's mapping is read, never changed.

    Example:
        >>> import ciclo
        >>> [(s, [c.name for c in cs]) for s, cs in normalize_tasks({ciclo.every(2): print})]
        [(every(steps=2), ['print'])]
    """
    if tasks is None:
        return []
    if not isinstance(tasks, Mapping):
        raise TypeError(
            f"tasks must be a dict {{schedule: callback or [callbacks]}}, got "
            f"{type(tasks).__name__}. Example: {{ciclo.every(1): train_step}}."
        )
    out: list[tuple[Schedule, list[Callback]]] = []
    for schedule, callbacks in tasks.items():
        if isinstance(schedule, NamedSchedule):
            raise TypeError(_NAMED_SCHEDULE_IN_LOOP.format(schedule=schedule))
        if isinstance(schedule, str):
            raise TypeError(_NAME_IN_LOOP.format(schedule=schedule))
        out.append((as_schedule(schedule), as_callback_list(callbacks)))
    return out


def run_end_hooks(hooks: list[EndHook], loop_state: LoopState, error: BaseException | None) -> None:
    """Calls ``__loop_end__(loop_state, error)`` of each hook; a hook failing during an error
    is noted on that error, otherwise raised with a note naming it."""
    for owner in hooks:
        try:
            owner.__loop_end__(loop_state, error)
        except Exception as hook_error:
            if error is None:
                hook_error.add_note(f"(in ciclo callback {callback_name(owner)}.__loop_end__)")
                raise
            error.add_note(f"(and {callback_name(owner)}.__loop_end__ failed: {hook_error!r})")


def restart(hooks: list[RestartHook], loop_state: LoopState) -> Iterable[Any] | None:
    """After the engine returned: the batches to run the engine on again, from the first
    hook that put the loop back to an earlier point (``__loop_restart__``), or ``None``
    when the loop ends."""
    for owner in hooks:
        try:
            batches = owner.__loop_restart__(loop_state)
        except Exception as error:
            error.add_note(f"(in ciclo callback {callback_name(owner)}.__loop_restart__)")
            raise
        if batches is not None:
            return batches
    return None
