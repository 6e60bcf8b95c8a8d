"""What a callback or a step returns, read in one place: ``None``, logs, a state, ``(logs,
state)`` or ``(outputs, logs, state)`` (:func:`parse_return`), and the one check of what
counts as logs (:func:`as_logs`, :func:`is_logs`), for callbacks and managed steps alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._records._logs import Logs
from ._naming import describe

__all__ = ["COLLECTIONS", "NO_CHANGE", "as_logs", "is_logs", "parse_return"]

#: The collections ciclo itself writes and reads. A dict returned on its own (not in a
#: tuple) is logs only when every key is one of these (Haiku params, ``{"linear": {"w":
#: ...}}``, are not logs).
COLLECTIONS = frozenset({"losses", "metrics", "stateful_metrics", "outputs"})

#: Marks "the step returned no state" (``None`` cannot: it may be a state part).
NO_CHANGE: Any = type("NoChange", (), {"__repr__": lambda self: "NO_CHANGE"})()

_LOGS_HELP = (
    "Logs are ciclo.logs(), a dict {collection: {name: value}} (e.g. {'metrics': "
    "{'accuracy': acc}}) or, in a tuple, a flat dict {name: array} (read as metrics)."
)
_NOT_A_STATE = (
    "{who} returned a {kind} ({text!r}), which cannot be a state ({described}): a {caller} "
    "returns (logs, state), (outputs, logs, state), logs, a state (a pytree) or None. {logs_help}"
)
_DICT_NOT_LOGS = (
    "{who} returned a dict that is not logs: {described}. {logs_help} Returned on its own, a "
    "dict is logs only when keyed by ciclo's collections {collections}. To return a new state "
    "on its own, return (None, state)."
)


def as_logs(value: Any, not_logs: Callable[[Any], str]) -> Logs:
    """``value``, found in the logs slot of a returned tuple, as :class:`Logs`: a ``Logs``
    as is, a dict ``{collection: {name: value}}`` converted, a flat dict ``{name: array}``
    read as metrics (as the original ciclo's Flax example returns); anything else raises
    ``TypeError(not_logs(value))``. The one check of what callbacks and managed steps
    return as logs.

    Example:
        >>> as_logs({"metrics": {"accuracy": 1.0}}, lambda v: "not logs")
        {'metrics': {'accuracy': 1.0}}
        >>> as_logs({"loss": 0.5, "accuracy": 1.0}, lambda v: "not logs")
        {'metrics': {'loss': 0.5, 'accuracy': 1.0}}
        >>> as_logs(0.5, lambda v: f"not logs: {describe(v)}")
        Traceback (most recent call last):
        TypeError: not logs: float 0.5
    """
    if isinstance(value, Logs):
        return value
    if isinstance(value, Mapping):
        nested = [isinstance(v, Mapping) for v in value.values()]
        if all(nested):
            return Logs(value)
        if not any(nested):
            return Logs({"metrics": value})
    raise TypeError(not_logs(value))


def is_logs(value: Any) -> bool:
    """Whether ``value``, returned on its own, is logs: a :class:`Logs`, or a dict whose
    keys are all ciclo's :data:`COLLECTIONS`, each holding a dict (``{}``: empty logs).

    Example:
        >>> is_logs({"metrics": {"accuracy": 1.0}}), is_logs({"linear": {"w": 1.0}})
        (True, False)
    """
    if isinstance(value, Logs):
        return True
    return isinstance(value, Mapping) and all(
        k in COLLECTIONS and isinstance(v, Mapping) for k, v in value.items()
    )


def parse_return(out: Any, who: str, kind: str = "callback") -> tuple[Logs | None, Any]:
    """What a callback or a step returned, as ``(logs or None, state or NO_CHANGE)``.

    The rules (one place for callbacks and managed steps): ``None`` changes nothing; a
    plain tuple is ``(logs, state)`` or ``(outputs, logs, state)`` (a NamedTuple, or any
    tuple subclass, is a state, never unpacked), its logs read by :func:`as_logs` and its
    outputs added to the ``outputs`` collection; a single value is logs when
    :func:`is_logs` says so; a list or a string is an error; another dict is an error
    (it is neither logs nor, by position, a state); anything else, falsy or not, is the
    state. ``who`` names the culprit in errors (``"callback train_step"``), ``kind`` what
    it is (``"callback"``, ``"managed step"``).

    Example:
        >>> from typing import NamedTuple
        >>> class TrainingState(NamedTuple):
        ...     params: dict
        ...     opt_state: tuple
        >>> parse_return(TrainingState({}, ()), "callback update")
        (None, TrainingState(params={}, opt_state=()))
        >>> parse_return(({"loss": 0.5}, 1), "callback step")
        ({'metrics': {'loss': 0.5}}, 1)
    """
    if out is None:
        return None, NO_CHANGE
    if type(out) is tuple:
        if len(out) == 2:
            logs, state = out
            outputs = None
        elif len(out) == 3:
            outputs, logs, state = out
        else:
            raise TypeError(
                f"{who} returned a tuple of {len(out)} items; a {kind} returns (logs, state), "
                f"(outputs, logs, state), logs, a state or None."
            )
        if logs is not None:
            lead = (
                f"{who} returned the logs part of its tuple that is not logs"
                if kind == "callback"
                else f"{who} must return (logs, state); the logs part of its tuple is not logs"
            )
            logs = as_logs(
                logs,
                lambda bad: (
                    f"{lead}: {describe(bad)}. {_LOGS_HELP} To return a new state on its "
                    f"own, return (None, state)."
                ),
            )
        if outputs is not None:
            logs = Logs() if logs is None else logs
            if isinstance(outputs, Mapping):
                for key, value in outputs.items():
                    logs.add_output(key, value)
            else:
                logs.add_output("outputs", outputs)
        return logs, (NO_CHANGE if state is None else state)
    if is_logs(out):
        return (out if isinstance(out, Logs) else Logs(out)), NO_CHANGE
    if isinstance(out, list | str | bytes | set | frozenset):
        raise TypeError(
            _NOT_A_STATE.format(
                who=who,
                kind=type(out).__name__,
                text=str(out)[:40],
                described=describe(out),
                caller=kind,
                logs_help=_LOGS_HELP,
            )
        )
    if isinstance(out, Mapping):
        raise TypeError(
            _DICT_NOT_LOGS.format(
                who=who,
                described=describe(out),
                logs_help=_LOGS_HELP,
                collections=sorted(COLLECTIONS),
            )
        )
    return None, out
