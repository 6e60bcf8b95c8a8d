"""The callback convention: what a loop calls, with which arguments, and what it may return."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, default_batch_size

__all__ = [
    "LoopState",
    "LoopCallback",
    "LoopCallbackBase",
    "Callback",
    "callback_name",
    "as_callback",
    "NO_CHANGE",
]

#: Marks "the callback did not return a state" (``None`` cannot: it may be a state part).
NO_CHANGE: Any = type("NoChange", (), {"__repr__": lambda self: "NO_CHANGE"})()


class LoopState:
    """What a loop knows at the current step; handed to callbacks that take 4 arguments
    and to objects implementing ``__loop_callback__``.

    Attributes:
        state: the current state.
        batch: the current batch.
        history: the :class:`History` being written.
        elapsed: the count before the current batch.
        logs: the logs produced at this step so far.
        accumulated_logs: the latest value of every entry seen in this loop.
        metadata: free-form data of the loop (e.g. which loop this is).
        stop_iteration: set to ``True`` to end the loop after this step.
        stop_reason: why the loop stopped (set with ``stop_iteration``, e.g. ``"stopped by
            SIGTERM"``), or ``None``.
        batch_size_fn: ``batch -> int``, how the loop counts the samples of a batch.
        tasks: the running loop's tasks, normalised to ``[(Schedule, [Callback])]`` (read
            only; checkpoints reach the schedules and stateful callbacks through it).
        dataset: the dataset the loop iterates, as given to it.
        initial_elapsed: the count the loop started from (for a resumed loop: the count the
            interrupted loop had started from), so ``elapsed.steps -
            initial_elapsed.steps`` batches were drawn from ``dataset``.
        resumed: ``True`` when the loop continued a run from a checkpoint.
    """

    __slots__ = (
        "_step_end",
        "accumulated_logs",
        "batch",
        "batch_size_fn",
        "dataset",
        "elapsed",
        "history",
        "initial_elapsed",
        "logs",
        "metadata",
        "resumed",
        "state",
        "stop_iteration",
        "stop_reason",
        "tasks",
    )

    def __init__(
        self,
        state: Any,
        history: History,
        elapsed: Elapsed,
        metadata: Any = None,
        batch_size_fn: Callable[[Any], int] | None = None,
        *,
        tasks: Sequence[tuple[Any, list[Callback]]] = (),
        dataset: Any = None,
    ) -> None:
        self.state = state
        self.batch: Any = None
        self.history = history
        self.elapsed = elapsed
        self.logs = Logs()
        self.accumulated_logs = Logs()
        self.metadata = metadata
        self.stop_iteration = False
        self.stop_reason: str | None = None
        self.batch_size_fn: Callable[[Any], int] = batch_size_fn or default_batch_size
        self.tasks = list(tasks)
        self.dataset = dataset
        self.initial_elapsed = elapsed
        self.resumed = False
        self._step_end: list[Callable[[LoopState], None]] = []

    def at_step_end(self, fn: Callable[[LoopState], None]) -> None:
        """Runs ``fn(loop_state)`` once, when the current step is over: after every callback
        of the step ran and its logs were committed to history, with ``elapsed`` counting
        the step. A consistent end-of-step view, e.g. for a checkpoint."""
        if fn not in self._step_end:
            self._step_end.append(fn)

    def run_step_end(self) -> None:
        """Runs (and clears) what :meth:`at_step_end` queued; called by the loop."""
        hooks, self._step_end = self._step_end, []
        for fn in hooks:
            try:
                fn(self)
            except Exception as error:
                error.add_note(
                    f"(in ciclo step-end hook {callback_name(fn)} at step {self.elapsed.steps})"
                )
                raise

    def elapsed_after_step(self) -> Elapsed:
        """The count once the current batch is done (``elapsed`` counts up to before it).

        Outside a step (in ``on_start`` / ``on_end``, where there is no batch) this is
        ``elapsed`` itself.
        """
        if self.batch is None:
            return self.elapsed
        return self.elapsed.update(self.batch_size_fn(self.batch))


@runtime_checkable
class LoopCallback(Protocol):
    """An object a loop can call: it gets the :class:`LoopState` and returns what a
    function callback may return (``None``, logs, a state, or a tuple)."""

    def __loop_callback__(self, loop_state: LoopState) -> Any: ...


class LoopCallbackBase:
    """Convenience base for callback objects: they can be spread into ``tasks`` with
    ``**`` (they map their default schedule to themselves).

    Example:
        >>> import ciclo
        >>> class Printer(ciclo.LoopCallbackBase):
        ...     def __loop_callback__(self, loop_state):
        ...         print(loop_state.elapsed.steps)
        >>> tasks = {**Printer()}  # {ciclo.always(): printer}
    """

    def default_schedule(self) -> Any:
        from .._time._schedules import always

        return always()

    def __loop_callback__(self, loop_state: LoopState) -> Any:
        raise NotImplementedError

    def keys(self) -> list[Any]:
        if not hasattr(self, "_spread_schedule"):
            self._spread_schedule = self.default_schedule()
        return [self._spread_schedule]

    def __getitem__(self, key: Any) -> Any:
        if key is not getattr(self, "_spread_schedule", None):
            raise KeyError(key)
        return self


_ARG_NAMES = ("state", "batch", "elapsed", "loop_state")


def callback_name(fn: Any) -> str:
    """A readable name of a callback for error messages."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def positional_arity(fn: Callable[..., Any]) -> int:
    name = callback_name(fn)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise TypeError(
            f"cannot read the signature of callback {name}; wrap it in a def taking the first "
            f"0-4 of (state, batch, elapsed, loop_state)."
        ) from None
    params = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in params if p.default is p.empty]
    example = (
        f"Example: def {getattr(fn, '__name__', 'callback')}(state, batch, elapsed, "
        f"loop_state): ..."
    )
    if len(required) > 4:
        raise TypeError(
            f"callback {name}{signature} needs {len(required)} positional arguments, but a "
            f"loop passes at most 4: the first 0-4 of (state, batch, elapsed, loop_state). "
            f"{example}"
        )
    keyword_only = [
        p.name
        for p in signature.parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    ]
    if keyword_only:
        raise TypeError(
            f"callback {name}{signature} needs keyword-only arguments {keyword_only}, but a "
            f"loop passes only positional ones: the first 0-4 of (state, batch, elapsed, "
            f"loop_state). Give them defaults or bind them with functools.partial."
        )
    if any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
        return 4
    return min(len(params), 4)


class Callback:
    """A callback ready to run: the user's function or object, called with the right
    arguments, its result validated and normalised to ``(logs, state)``."""

    __slots__ = ("arity", "fn", "method", "name", "observer")

    def __init__(self, fn: Any) -> None:
        self.method: Callable[..., Any]
        self.fn = fn
        self.name = callback_name(fn)
        owner = getattr(fn, "__self__", fn)  # a bound method's object
        self.observer = bool(getattr(owner, "__loop_observer__", False))
        if isinstance(fn, LoopCallback):
            self.method = fn.__loop_callback__
            self.arity = -1
        elif callable(fn):
            self.method = fn
            self.arity = positional_arity(fn)
        else:
            raise TypeError(
                f"{fn!r} is not a callback: give a function taking the first 0-4 of "
                f"(state, batch, elapsed, loop_state), or an object with a "
                f"__loop_callback__(loop_state) method."
            )

    def __call__(self, loop_state: LoopState) -> tuple[Logs | None, Any]:
        if self.arity < 0:
            out = self.method(loop_state)
        else:
            args = (loop_state.state, loop_state.batch, loop_state.elapsed, loop_state)
            out = self.method(*args[: self.arity])
        return self.parse(out)

    def parse(self, out: Any) -> tuple[Logs | None, Any]:
        """Validates a return value; returns ``(logs or None, state or NO_CHANGE)``."""
        if out is None:
            return None, NO_CHANGE
        if isinstance(out, tuple):
            if len(out) == 2:
                logs, state = out
                outputs = None
            elif len(out) == 3:
                outputs, logs, state = out
            else:
                raise TypeError(
                    f"callback {self.name} returned a tuple of {len(out)} items; a callback "
                    f"returns (logs, state), (outputs, logs, state), logs, a state or None."
                )
            logs = self._as_logs(logs, "the logs part of its tuple")
            if outputs is not None:
                logs = logs if logs is not None else Logs()
                if isinstance(outputs, Mapping):
                    for key, value in outputs.items():
                        logs.add_output(key, value)
                else:
                    logs.add_output("outputs", outputs)
            return logs, (NO_CHANGE if state is None else state)
        if isinstance(out, Mapping):
            return self._as_logs(out, "a dict"), NO_CHANGE
        return None, out

    def _as_logs(self, value: Any, what: str) -> Logs | None:
        if value is None or isinstance(value, Logs):
            return value
        if isinstance(value, Mapping) and all(isinstance(v, Mapping) for v in value.values()):
            return Logs(value)
        raise TypeError(
            f"callback {self.name} returned {what} that is not logs: {_describe(value)}. Logs "
            f"are ciclo.logs() or a dict {{collection: {{name: value}}}}, e.g. "
            f"{{'metrics': {{'accuracy': acc}}}}. To return a new state on its own, return "
            f"(None, state)."
        )


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        return f"a dict with keys {list(value)[:5]}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}"


def as_callback(fn: Any) -> Callback:
    """Wraps a function or a ``__loop_callback__`` object as a :class:`Callback`."""
    return fn if isinstance(fn, Callback) else Callback(fn)
