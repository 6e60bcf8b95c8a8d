"""The managed API: a state that knows its optimizer and strategy, and steps that use them."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import operator
import zlib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]

from .._loop._returns import NO_CHANGE, parse_return
from .._loop._state import LoopState
from .._records._aggregate import merge_micro_logs
from .._records._logs import Logs
from ._ema import ema_fields, update_ema
from ._precision import (
    LossScale,
    apply_scaled_gradients,
    cast_floating,
    precision_fields,
    run_in_compute_dtype,
    scale_loss,
    unscale_gradients,
)
from ._strategies import Strategy, get_strategy, identity

__all__ = ["ManagedState", "ManagedStep", "train_step", "step"]

S = TypeVar("S", bound="ManagedState")

_REGISTERED: set[type] = set()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManagedState:
    """A training state that is a pytree: ``step``, ``params``, the optimizer ``tx`` and its
    ``opt_state``, a ``strategy``, an RNG ``key``, and extra fields of your own.

    Extra fields are declared, never made up by a typo:

    - **Subclass** it (as a ``@dataclasses.dataclass(frozen=True, kw_only=True)``) to add
      typed fields (the recommended way); mark fields that are not arrays with
      ``dataclasses.field(metadata={"static": True})``.
    - On a plain ``ManagedState``, declare them when you create it:
      ``create(..., extra={"batch_stats": stats})``; they read as attributes
      (``state.batch_stats``) and :meth:`replace` changes them. The shorthand
      ``create(..., batch_stats=stats)`` declares one too, unless the name is a close match
      of a field or an option of ``create`` (``stratgey=``): that is an error naming the
      match (use ``extra=`` to mean it).
    - :meth:`replace` only changes fields and declared extra fields: an unknown name
      (``replace(parmas=...)``) is an error naming the close match.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> state = ciclo.managed.ManagedState.create(
        ...     params={"w": jnp.zeros(3)}, tx=optax.sgd(0.1), strategy="jit",
        ...     extra={"seen": jnp.zeros((), jnp.int32)},
        ... )
        >>> int(state.step), state.strategy.name, int(state.replace(seen=3).seen)
        (0, 'jit', 3)
        >>> state.replace(parmas={})
        Traceback (most recent call last):
        ...
        TypeError: ManagedState.replace() got an unknown field 'parmas'; did you mean 'params'? ...
    """

    step: jax.Array
    params: Any
    opt_state: Any
    key: jax.Array | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tx: optax.GradientTransformation | None = dataclasses.field(
        default=None, metadata={"static": True}
    )
    strategy: Strategy = dataclasses.field(default=cast(Strategy, None), metadata={"static": True})
    #: The moving average of ``params`` (``create(..., ema=decay)``), else ``None``.
    ema_params: Any = None
    ema_decay: float | None = dataclasses.field(default=None, metadata={"static": True})
    #: Mixed precision (``create(..., compute_dtype=..., loss_scale=...)``).
    compute_dtype: Any = dataclasses.field(default=None, metadata={"static": True})
    loss_scale: LossScale | None = None

    #: Whether :meth:`create` takes unknown keywords as extra fields (adapter states: no).
    keyword_extras: ClassVar[bool] = True

    def __post_init__(self) -> None:
        cls = type(self)
        if cls not in _REGISTERED:
            _register(cls)

    @classmethod
    def create(
        cls: type[S],
        *,
        params: Any,
        tx: optax.GradientTransformation | None,
        strategy: str | Strategy = "jit",
        key: jax.Array | int | None = None,
        compute_dtype: Any = None,
        loss_scale: float | str | LossScale | None = None,
        ema: float | None = None,
        **fields: Any,
    ) -> S:
        """Builds a state with ``step=0`` and ``opt_state = tx.init(params)``.

        Args:
            params: the trainable parameters (any pytree of arrays).
            tx: an optax optimizer (``None`` for a state that is only evaluated).
            strategy: a strategy name (``"eager"``, ``"jit"``, ``"data-parallel"``...) or a
                :class:`~ciclo.managed.Strategy`.
            key: an RNG key (or an int seed) for steps that need randomness.
            compute_dtype: mixed precision: the dtype managed steps compute in (e.g.
                ``jnp.bfloat16``); ``params`` and ``opt_state`` stay as they are (float32),
                the step casts the parameters and the batch's floating-point arrays to it,
                and its logs are float32. ``None``: compute in the parameters' dtype.
            loss_scale: for ``float16``: a number (static), ``"dynamic"`` or a
                :class:`~ciclo.managed.LossScale`; ``None`` (default) scales nothing.
            ema: keep ``ema_params``, the moving average of the parameters with this decay
                (e.g. ``0.999``), updated after each optimizer update; ``train_loop``
                evaluates it too (entries ``<name>_test_ema``). ``None``: no average.
            **fields: values of subclass fields; ``extra={name: value}`` declares extra
                fields (and so does an unknown keyword that is no close match of a field
                or option name).

        Raises:
            TypeError: for a keyword that is a close match of a field or option, e.g.
                ``stratgey=``: "did you mean 'strategy'?".
        """
        if tx is not None and not isinstance(tx, optax.GradientTransformation):
            raise TypeError(f"tx must be an optax optimizer such as optax.adam(1e-3), got {tx!r}.")
        if isinstance(key, bool) or not (
            key is None or isinstance(key, int) or _is_random_key(key)
        ):
            raise TypeError(
                f"{cls.__name__}.create(key={key!r}): key must be a JAX random key such as "
                f"jax.random.key(0), an int seed, or None; got {type(key).__name__}."
            )
        if isinstance(key, int):
            key = jax.random.key(key)
        set_by_create = sorted({"step", "opt_state"} & set(fields))
        if set_by_create:
            raise TypeError(
                _SET_BY_CREATE.format(
                    cls=cls.__name__,
                    names=" or ".join(repr(n) for n in set_by_create),
                    fix=", ".join(f"{n}=..." for n in set_by_create),
                )
            )
        _declare_fields(cls)
        own = {f.name for f in dataclasses.fields(cls)}
        extra = dict(fields.pop("extra", None) or {})
        known = {k: v for k, v in fields.items() if k in own}
        unknown = [k for k in fields if k not in own]
        candidates = sorted(own | _create_options(cls))
        for name in unknown:
            # A name a subclass's create() takes and passes on (apply_fn=) is no typo.
            others = [c for c in candidates if c != name]
            if not cls.keyword_extras or close_match(name, others):
                where = f"{cls.__name__}.create()"
                hint = cls.keyword_extras
                raise unknown_name_error(where, "keyword", name, candidates, extra_hint=hint)
            extra[name] = fields[name]
        extra = {name: _keep_static(value) for name, value in extra.items()}
        state = cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params) if tx is not None else None,
            key=key,
            extra=extra,
            tx=tx,
            strategy=get_strategy(strategy),
            **{**precision_fields(compute_dtype, loss_scale), **ema_fields(params, ema), **known},
        )
        return cast(S, state.strategy.place_state(state))

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: extra fields declared at create().
        if name.startswith("__") or name == "extra":
            raise AttributeError(name)
        extra = self.__dict__.get("extra", {})
        if name in extra:
            value = extra[name]
            return value.value if type(value) is StaticFunction else value
        names = [f.name for f in dataclasses.fields(self)] + list(extra)
        match = close_match(name, names)
        raise AttributeError(
            f"{type(self).__name__} has no field {name!r}"
            + (f"; did you mean {match!r}?" if match else "")
            + f" Extra fields: {sorted(extra)}."
        )

    def replace(self: S, **changes: Any) -> S:
        """A copy with some fields (or declared extra fields) changed.

        Raises:
            TypeError: for a name that is neither a field nor a declared extra field
                (``replace(parmas=...)``: "did you mean 'params'?").
        """
        own = _FIELD_NAMES.get(type(self)) or _field_names(type(self))
        extra_changes = {k: v for k, v in changes.items() if k not in own}
        if extra_changes:
            extra = self.extra
            for name in extra_changes:
                if name not in extra:
                    raise unknown_name_error(
                        f"{type(self).__name__}.replace()",
                        "field",
                        name,
                        sorted(own | set(extra)),
                        extra_hint=None,
                    )
            changes = {k: v for k, v in changes.items() if k in own}
            changes["extra"] = {
                **extra,
                **{name: _keep_static(value) for name, value in extra_changes.items()},
            }
        return dataclasses.replace(self, **changes)

    def apply_gradients(self: S, grads: Any) -> S:
        """One optimizer update of ``params`` with ``grads``; increments ``step``."""
        if self.tx is None:
            raise ValueError(
                "this state has no optimizer (tx=None); create it with tx=optax.adam(...) "
                "to train it."
            )
        updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
        params = optax.apply_updates(self.params, updates)
        updated = self.replace(step=self.step + 1, params=params, opt_state=opt_state)
        return cast(S, update_ema(updated))

    def ema_state(self: S) -> S | None:
        """This state with its averaged parameters (``ema_params``) in place of ``params``,
        to evaluate them; ``None`` when it keeps no average (``create(..., ema=None)``).

        Example:
            >>> import ciclo, jax.numpy as jnp, optax
            >>> state = ciclo.managed.ManagedState.create(
            ...     params={"w": jnp.ones(2)}, tx=optax.sgd(0.1), ema=0.99
            ... )
            >>> state.ema_state().params["w"].tolist()
            [1.0, 1.0]
        """
        if self.ema_decay is None or self.ema_params is None:
            return None
        return self.replace(params=self.ema_params)

    def compute_inputs(self, batch: Any) -> Any:
        """The batch as a managed step computes on it: with a ``compute_dtype``, its
        floating-point arrays cast to it (integer arrays as they are); the batch itself
        otherwise. Adapter states cast only the model's inputs (the targets stay as they
        are, and the losses are computed in float32)."""
        return cast_floating(batch, self.compute_dtype)

    def step_key(self, *names: str | int) -> jax.Array:
        """A key for this step: ``key`` folded with ``step`` (and ``names``), so each step
        gets a different one, reproducible from the seed."""
        if self.key is None:
            raise ValueError(
                "this state has no RNG key; create it with key=0 (or a jax.random.key)."
            )
        key = jax.random.fold_in(self.key, self.step)
        for name in names:
            key = jax.random.fold_in(
                key, zlib.crc32(name.encode()) if isinstance(name, str) else name
            )
        return key

    def with_strategy(self: S, strategy: str | Strategy, **options: Any) -> S:
        """The same state under another strategy (its arrays placed for it).

        Args:
            strategy: a name (``"jit"``, ``"data-parallel"``, ``"pmap"``...) or a
                :class:`~ciclo.managed.Strategy`.
            **options: options of the named strategy's factory, e.g. ``steps_per_call=8``
                or ``accumulate_steps=4``.

        Example:
            >>> import ciclo, jax.numpy as jnp, optax
            >>> state = ciclo.managed.ManagedState.create(params={"w": jnp.zeros(3)}, tx=None)
            >>> state = state.with_strategy("data-parallel", steps_per_call=8)
            >>> state.strategy.name, state.strategy.steps_per_call
            ('data-parallel', 8)
        """
        new = self.replace(strategy=get_strategy(strategy, **options))
        return cast(S, new.strategy.place_state(new))


def close_match(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``name`` (a likely typo of it), or ``None``.

    Example:
        >>> close_match("parmas", ["params", "step", "tx"])
        'params'
    """
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_name_error(
    where: str, kind: str, name: str, candidates: Sequence[str], *, extra_hint: bool | None
) -> TypeError:
    """The error for an unknown keyword or field ``name`` given to ``where``, naming the
    close match among ``candidates`` if there is one.

    ``extra_hint``: ``True`` adds how to declare an extra field of that name on purpose
    (``extra=``), ``None`` how to declare one at all, ``False`` lists the accepted names.

    Example:
        >>> print(unknown_name_error("f()", "keyword", "stratgey", ["strategy"], extra_hint=False))
        f() got an unknown keyword 'stratgey'; did you mean 'strategy'? It takes: ['strategy'].
    """
    match = close_match(name, candidates)
    message = f"{where} got an unknown {kind} {name!r}" + (
        f"; did you mean {match!r}?" if match else "."
    )
    if extra_hint is True:
        message += (
            f" To add an extra field of that name on purpose, pass extra={{{name!r}: ...}} "
            f"(or declare it in a subclass)."
        )
    elif extra_hint is None:
        message += (
            f" Fields are declared, not added by replace(): declare {name!r} as a field of a "
            f"subclass, or at create(..., extra={{{name!r}: ...}})."
        )
    else:
        message += f" It takes: {sorted(candidates)}."
    return TypeError(message)


_FIELD_NAMES: dict[type, frozenset[str]] = {}
_CREATE_OPTIONS: dict[type, frozenset[str]] = {}


def _field_names(cls: type) -> frozenset[str]:
    names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


def _create_options(cls: type) -> frozenset[str]:
    """The named keywords of ``cls.create`` (every class up the MRO), for close matches."""
    options = _CREATE_OPTIONS.get(cls)
    if options is None:
        names: set[str] = set()
        for klass in cls.__mro__:
            create = klass.__dict__.get("create")
            if isinstance(create, classmethod):
                parameters = inspect.signature(create.__func__).parameters.values()
                names |= {p.name for p in parameters if p.kind is p.KEYWORD_ONLY}
        options = _CREATE_OPTIONS[cls] = frozenset(names)
    return options


class StaticFunction:
    """A function held in a state's extra fields (``apply_fn=module.apply``): static
    pytree data with no leaves, compared by identity, so it is never moved to a device nor
    traced. Attribute access on the state returns the function itself."""

    __slots__ = ("value",)

    def __init__(self, value: Callable[..., Any]) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StaticFunction) and other.value is self.value

    def __repr__(self) -> str:
        return f"StaticFunction({self.value!r})"


jax.tree_util.register_pytree_node(
    StaticFunction, lambda static: ((), static), lambda static, _: static
)


def _keep_static(value: Any) -> Any:
    """``value`` as a :class:`StaticFunction` when it is a function, a method or a
    ``functools.partial`` (callable pytrees such as Equinox modules stay data)."""
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return StaticFunction(value)
    if isinstance(value, functools.partial):
        return StaticFunction(value)
    return value


class _Meta:
    """The static fields of a state, as its pytree node data: hashed once. A jitted step
    hashes and compares the node data of its arguments at every call; a state carries its
    ``_Meta`` through flatten/unflatten, so a step's state compares by identity."""

    __slots__ = ("_hash", "fields", "values")

    def __init__(self, names: tuple[str, ...], values: tuple[Any, ...]) -> None:
        self.values = values
        self._hash = hash(values)
        #: The static part of an unflattened state's ``__dict__``.
        self.fields = {**dict(zip(names, values, strict=True)), "__ciclo_meta__": self}

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, _Meta):
            return NotImplemented
        return self._hash == other._hash and self.values == other.values

    def __repr__(self) -> str:
        return repr(self.values)


def _declare_fields(cls: type) -> None:
    """Makes the annotated fields of undecorated subclasses fields (as in the original
    ciclo, whose states were flax ``struct`` dataclasses): each class up the MRO that
    annotates fields without being a dataclass itself becomes a
    ``dataclass(frozen=True, kw_only=True)``, so ``create`` checks them like the built-in
    ones."""
    if cls in _DECLARED:
        return
    for klass in reversed(cls.__mro__):
        if (
            issubclass(klass, ManagedState)
            and inspect.get_annotations(klass)
            and "__dataclass_fields__" not in klass.__dict__
        ):
            dataclasses.dataclass(frozen=True, kw_only=True)(klass)
    _DECLARED.add(cls)


_DECLARED: set[type] = set()


def _is_static(field: dataclasses.Field[Any]) -> bool:
    """A static field: ``metadata={"static": True}``, or flax's
    ``struct.field(pytree_node=False)``."""
    return bool(field.metadata.get("static", False)) or field.metadata.get("pytree_node") is False


def _register(cls: type) -> None:
    """Registers ``cls`` as a pytree: data fields are children, static fields the node data.

    Unflattening (a compiled step's output state) fills the instance's ``__dict__``
    directly, without ``__init__``: the fields were checked when the state was built, and
    a frozen dataclass's ``__init__`` costs microseconds per step.
    """
    fields = dataclasses.fields(cls)
    meta = tuple(f.name for f in fields if _is_static(f))
    data = tuple(f.name for f in fields if not _is_static(f))
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in data)
    new, set_attribute = object.__new__, object.__setattr__

    def node_data(state: Any) -> _Meta:
        values = state.__dict__
        cached: _Meta | None = values.get("__ciclo_meta__")
        if cached is None:
            cached = values["__ciclo_meta__"] = _Meta(meta, tuple(values[n] for n in meta))
        return cached

    children = operator.itemgetter(*data)  # one C call (data has at least 5 fields)

    def flatten(state: Any) -> tuple[tuple[Any, ...], _Meta]:
        values = state.__dict__
        return children(values), values.get("__ciclo_meta__") or node_data(state)

    def flatten_with_keys(state: Any) -> tuple[list[tuple[Any, Any]], _Meta]:
        values = state.__dict__
        return [(k, values[n]) for k, n in zip(keys, data, strict=True)], node_data(state)

    def unflatten(aux: _Meta, children: Iterable[Any]) -> Any:
        state: Any = new(cls)
        values = aux.fields.copy()
        values.update(zip(data, children, strict=True))
        set_attribute(state, "__dict__", values)
        return state

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    _REGISTERED.add(cls)


StepFunction = Callable[..., tuple[Any, Any]]


def _step_arity(fn: StepFunction) -> int:
    """How many of ``(state, batch, broadcasts, statics)`` a step function takes."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return 4
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return max(2, min(len(positional), 4))


class ManagedStep:
    """A step that runs under its state's strategy; made by :func:`train_step` or :func:`step`.

    Call it as ``logs, state = my_step(state, batch)``, as a method
    (``state.train_step(batch)``) when defined in a :class:`ManagedState` subclass, or put it
    in a loop's tasks: as a loop callback it always runs on the loop's current state.

    Under a strategy with ``steps_per_call=K``, a loop runs up to K consecutive batches in
    one compiled call (see :func:`ciclo.loop` for how it groups them); :meth:`many` does the
    same for your own loops. Under ``accumulate_steps=N`` a train step splits each batch
    into N micro-batches and makes one optimizer update from their averaged gradients.

    Broadcasts and statics: a step function may take two more positional arguments,
    ``fn(state, batch, broadcasts, statics)``. ``broadcasts`` is a pytree of arrays that
    every device gets whole (a teacher's parameters, a lookup table, a loss weight);
    ``statics`` is a hashable value fixed at compile time (a mode string, a tuple of
    flags): Python may branch on it, and each distinct value compiles the step once (an
    equal value reuses the compiled step). Pass them in a call,
    ``my_step(state, batch, broadcasts, statics)``, or bind them for a loop with
    :meth:`bind`; both default to ``None``.
    """

    __name__: str
    __qualname__: str

    def __init__(
        self,
        fn: StepFunction,
        *,
        differentiate: bool,
        broadcasts: Any = None,
        statics: Hashable = None,
        compiled: dict[tuple[Strategy, bool, Hashable], StepFunction] | None = None,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.differentiate = differentiate
        self.arity = _step_arity(fn)
        self.broadcasts = broadcasts
        self.statics = statics
        # Shared by the steps bind() makes: one compilation per strategy and statics.
        self._compiled = {} if compiled is None else compiled
        # This step's own calls without arguments, by strategy (see __call__).
        self._calls: dict[Strategy, Callable[[Any, Any], tuple[Logs, Any]]] = {}
        self._defined_in: type | None = None  # the class whose body holds it
        self._inherited: dict[type, ManagedStep] = {}  # as read from subclasses (__get__)

    def bind(self, broadcasts: Any = None, statics: Hashable = None) -> ManagedStep:
        """The same step with ``broadcasts`` and ``statics`` fixed: what a loop runs.

        The bound step shares this step's compiled versions; binding another ``statics``
        value compiles once more, an equal one does not. Arguments given in a call still
        take precedence.

        Example:
            >>> import ciclo, jax.numpy as jnp
            >>> @ciclo.managed.step
            ... def scaled(state, batch, broadcasts, statics):
            ...     value = batch.sum() * broadcasts["scale"]
            ...     return ciclo.logs().add_metric(statics, value), state
            >>> state = ciclo.managed.ManagedState.create(params={}, tx=None)
            >>> step = scaled.bind({"scale": jnp.array(2.0)}, statics="total")
            >>> logs, state = step(state, jnp.ones(3))
            >>> float(logs.metrics.total)
            6.0
        """
        self._check_args(broadcasts, statics)
        return ManagedStep(
            self.fn,
            differentiate=self.differentiate,
            broadcasts=broadcasts,
            statics=statics,
            compiled=self._compiled,
        )

    def _check_args(self, broadcasts: Any, statics: Any) -> None:
        given = [
            name
            for name, value, position in (("broadcasts", broadcasts, 3), ("statics", statics, 4))
            if value is not None and self.arity < position
        ]
        if given:
            raise TypeError(
                f"managed step {self.__name__} was given {' and '.join(given)}, but it takes "
                f"only {('state', 'batch', 'broadcasts')[: self.arity]}. Define it as "
                f"def {self.__name__}(state, batch, broadcasts, statics): ..."
            )
        if statics is not None:
            try:
                hash(statics)
            except TypeError:
                raise TypeError(
                    f"managed step {self.__name__}: statics must be hashable (it is static "
                    f"under jit), got {type(statics).__name__} {statics!r}. Use a tuple, a "
                    f"string, a number or a frozen dataclass; put arrays in broadcasts."
                ) from None

    def _args(self, broadcasts: Any, statics: Any) -> tuple[Any, Any]:
        """The broadcasts and statics of a call: those given, else the bound ones."""
        if broadcasts is None:
            broadcasts = self.broadcasts
        if statics is None:
            statics = self.statics
        self._check_args(broadcasts, statics)
        return broadcasts, statics

    def _run(self, state: Any, batch: Any, broadcasts: Any, statics: Any) -> tuple[Logs, Any]:
        out = self.fn(state, batch, *(broadcasts, statics)[: self.arity - 2])
        if type(out) is tuple and len(out) == 2 and type(out[0]) is Logs and out[1] is not None:
            return out[0], out[1]  # the common (logs, state)
        logs, new_state = parse_return(out, f"managed step {self.__name__}", "managed step")
        return (Logs() if logs is None else logs), (state if new_state is NO_CHANGE else new_state)

    def _gradients(
        self, state: Any, batch: Any, broadcasts: Any, statics: Any, micro_steps: int
    ) -> tuple[Any, Logs, Any]:
        """Gradients of the total loss w.r.t. ``params``, the logs and the new state; with
        ``micro_steps > 1`` the mean over that many micro-batches of ``batch``."""

        def run(current: Any, batch: Any) -> tuple[Logs, Any]:
            return self._run(current, batch, broadcasts, statics)

        def objective(params: Any, current: Any, batch: Any) -> tuple[jax.Array, Any]:
            # Under a compute_dtype, the cast of params is inside what is differentiated:
            # the gradients are taken w.r.t. (and come back in the dtype of) params.
            logs, new_state = run_in_compute_dtype(run, current.replace(params=params), batch)
            loss = scale_loss(state, _total_loss(self, logs))
            return loss, (logs, new_state.replace(params=state.params))

        _check_real_params(self, state.params)
        gradient = jax.grad(objective, has_aux=True)
        if micro_steps == 1:
            grads, (logs, new_state) = gradient(state.params, state, batch)
            return unscale_gradients(state, grads), logs, new_state

        micro_batches, rows = _split_batch(self, batch, micro_steps)

        def accumulate(carry: Any, micro_batch: Any) -> tuple[Any, Logs]:
            total, current = carry
            grads, (logs, new_state) = gradient(state.params, current, micro_batch)
            return (jax.tree.map(jnp.add, total, grads), new_state), logs

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        (total, new_state), logs = jax.lax.scan(accumulate, (zeros, state), micro_batches)
        grads = jax.tree.map(lambda g: g / micro_steps, total)
        return unscale_gradients(state, grads), merge_micro_logs(logs, rows), new_state

    def _body(self, strategy: Strategy, statics: Hashable) -> StepFunction:
        """One step as ``strategy`` runs it, before compilation: ``(state, batch,
        broadcasts) -> (logs, state)``, with ``statics`` fixed."""
        if not self.differentiate:

            def run(state: Any, batch: Any, broadcasts: Any) -> tuple[Logs, Any]:
                logs, new_state = run_in_compute_dtype(
                    lambda s, b: self._run(s, b, broadcasts, statics), state, batch
                )
                return strategy.reduce_logs(logs), new_state

            return run

        def train(state: Any, batch: Any, broadcasts: Any) -> tuple[Logs, Any]:
            grads, logs, new_state = self._gradients(
                state, batch, broadcasts, statics, strategy.accumulate_steps
            )
            grads = strategy.reduce_gradients(grads)
            return strategy.reduce_logs(logs), apply_scaled_gradients(new_state, grads)

        return train

    def compiled_for(
        self, strategy: Strategy, *, fused: bool = False, statics: Hashable = None
    ) -> StepFunction:
        """The step compiled for ``strategy`` and ``statics`` (cached), taking ``(state,
        batch, broadcasts)``; ``fused=True``: the version that takes a tuple of batches and
        returns stacked logs (see :meth:`many`)."""
        key = (strategy, fused, statics)
        compiled = self._compiled.get(key)
        if compiled is None:
            body = self._body(strategy, statics)
            compiled = self._compiled[key] = strategy.compile(_fuse(body) if fused else body)
        return compiled

    def __call__(
        self, state: Any, batch: Any, broadcasts: Any = None, statics: Hashable = None
    ) -> tuple[Logs, Any]:
        if broadcasts is None and statics is None:
            # The per-step path: one lookup of the call prepared for this strategy.
            try:
                run = self._calls.get(state.strategy)
            except (AttributeError, TypeError):
                run = None
            if run is not None:
                return run(state, batch)
        strategy = self._strategy_of(state)
        if broadcasts is None and statics is None:
            run = self._calls[strategy] = self._prepared(strategy)
            return run(state, batch)
        broadcasts, statics = self._args(broadcasts, statics)
        return self.compiled_for(strategy, statics=statics)(
            state, strategy.place_batch(batch), strategy.place_broadcasts(broadcasts)
        )

    def _prepared(self, strategy: Strategy) -> Callable[[Any, Any], tuple[Logs, Any]]:
        """``(state, batch) -> (logs, state)`` with the bound broadcasts and statics: the
        compiled step, and only the placements that do something."""
        compiled = self.compiled_for(strategy, statics=self.statics)
        place_batch, place_broadcasts = strategy.place_batch, strategy.place_broadcasts
        broadcasts = self.broadcasts
        if broadcasts is not None:
            return lambda state, batch: compiled(
                state, place_batch(batch), place_broadcasts(broadcasts)
            )
        if place_batch is identity:
            return lambda state, batch: compiled(state, batch, None)
        return lambda state, batch: compiled(state, place_batch(batch), None)

    def many(
        self,
        state: Any,
        batches: Sequence[Any],
        broadcasts: Any = None,
        statics: Hashable = None,
    ) -> tuple[Logs, Any]:
        """Runs one step per batch in a single compiled call (``lax.scan``).

        Args:
            state: a :class:`ManagedState`.
            batches: batches of identical shapes.
            broadcasts, statics: as in a single call (the same for every batch).

        Returns:
            ``(logs, state)``: every log value stacked along a new first axis (one row per
            batch), and the state after the last batch.

        Example:
            >>> import ciclo, jax.numpy as jnp, optax
            >>> @ciclo.managed.step
            ... def count(state, batch):
            ...     return ciclo.logs().add_metric("sum", batch.sum()), state
            >>> state = ciclo.managed.ManagedState.create(params={}, tx=None)
            >>> logs, state = count.many(state, [jnp.ones(2), 2 * jnp.ones(2)])
            >>> logs.metrics.sum.tolist()
            [2.0, 4.0]
        """
        strategy = self._strategy_of(state)
        broadcasts, statics = self._args(broadcasts, statics)
        batches = tuple(batches)
        if not batches:
            raise ValueError(f"{self.__name__}.many(state, batches) needs at least one batch.")
        first = _shapes(batches[0])
        for i, batch in enumerate(batches[1:], 1):
            if _shapes(batch) != first:
                raise ValueError(
                    f"{self.__name__}.many: batch {i} has shapes {_shapes(batch)[1]}, but "
                    f"batch 0 has {first[1]}; fused steps need batches of the same shapes "
                    f"(drop or pad the incomplete last batch)."
                )
        placed = tuple(strategy.place_batch(batch) for batch in batches)
        return self.compiled_for(strategy, fused=True, statics=statics)(
            state, placed, strategy.place_broadcasts(broadcasts)
        )

    def lower(
        self, state: Any, batch: Any, broadcasts: Any = None, statics: Hashable = None
    ) -> Any:
        """The compiled call of one step on ``state`` and ``batch``, lowered and not run (a
        ``jax.stages.Lowered``, as ``jax.jit(f).lower`` gives): ``.compile().cost_analysis()``
        gives its FLOPs (see :func:`ciclo.callbacks.compiled_flops`).

        Example:
            >>> import ciclo, jax.numpy as jnp
            >>> @ciclo.managed.step
            ... def total(state, batch):
            ...     return ciclo.logs().add_metric("total", batch.sum()), state
            >>> state = ciclo.managed.ManagedState.create(params={}, tx=None)
            >>> type(total.lower(state, jnp.ones(3))).__name__
            'Lowered'
        """
        strategy = self._strategy_of(state)
        broadcasts, statics = self._args(broadcasts, statics)
        compiled = self.compiled_for(strategy, statics=statics)
        lower = getattr(compiled, "lower", None) or jax.jit(compiled).lower  # eager: not jitted
        return lower(state, strategy.place_batch(batch), strategy.place_broadcasts(broadcasts))

    def __loop_lower__(self, loop_state: LoopState) -> Any:
        return self.lower(loop_state.state, loop_state.batch)

    def _strategy_of(self, state: Any) -> Strategy:
        strategy = getattr(state, "strategy", None)
        if not isinstance(strategy, Strategy):
            raise TypeError(
                f"managed step {self.__name__} needs a ciclo.managed.ManagedState (with a "
                f"strategy), got {type(state).__name__}. Create one with "
                f"ciclo.managed.ManagedState.create(params=..., tx=...)."
            )
        return strategy

    def __loop_callback__(self, loop_state: LoopState) -> tuple[Logs, Any]:
        return self(loop_state.state, loop_state.batch)

    def __loop_steps_per_call__(self, loop_state: LoopState) -> int:
        strategy = getattr(loop_state.state, "strategy", None)
        return strategy.steps_per_call if isinstance(strategy, Strategy) else 1

    def __loop_callback_many__(
        self, loop_state: LoopState, batches: Sequence[Any]
    ) -> tuple[Logs, Any]:
        return self.many(loop_state.state, batches)

    def __set_name__(self, owner: type, name: str) -> None:
        if self._defined_in is None:
            self._defined_in = owner

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            if owner is None or self._defined_in in (None, owner):
                return self
            return self._as_read_from(owner)
        return _BoundStep(self, instance)

    def _as_read_from(self, owner: type) -> ManagedStep:
        """This step as ``owner.train_step`` for a subclass ``owner``: the same step
        (sharing its compiled calls), named after ``owner`` in errors (``NNXState.train_step``,
        not the base class's name)."""
        step = self._inherited.get(owner)
        if step is None:
            step = ManagedStep(
                self.fn,
                differentiate=self.differentiate,
                broadcasts=self.broadcasts,
                statics=self.statics,
                compiled=self._compiled,
            )
            step.__qualname__ = f"{owner.__qualname__}.{self.__name__}"
            step._defined_in = owner
            self._inherited[owner] = step
        return step

    def __repr__(self) -> str:
        kind = "train_step" if self.differentiate else "step"
        return f"<ciclo.managed.{kind} {self.__name__}>"


class _BoundStep:
    """``state.train_step``: callable with a batch; as a loop callback it uses the loop's
    current state, not the one it was read from."""

    __slots__ = ("instance", "step")

    def __init__(self, step: ManagedStep, instance: Any) -> None:
        self.step, self.instance = step, instance

    @property
    def __name__(self) -> str:  # type: ignore[override]
        return self.step.__name__

    def __getattr__(self, name: str) -> Any:
        # Computed when asked (error messages), not at every `state.train_step`.
        if name == "__qualname__":
            return f"{type(self.instance).__name__}.{self.step.__name__}"
        raise AttributeError(name)

    def __call__(
        self, batch: Any = None, broadcasts: Any = None, statics: Hashable = None
    ) -> tuple[Logs, Any]:
        if broadcasts is None and statics is None:  # the per-step path (see ManagedStep)
            instance = self.instance
            try:
                run = self.step._calls.get(instance.strategy)
            except (AttributeError, TypeError):
                run = None
            if run is not None:
                return run(instance, batch)
        return self.step(self.instance, batch, broadcasts, statics)

    def many(
        self, batches: Sequence[Any], broadcasts: Any = None, statics: Hashable = None
    ) -> tuple[Logs, Any]:
        """:meth:`ManagedStep.many` on this state."""
        return self.step.many(self.instance, batches, broadcasts, statics)

    def bind(self, broadcasts: Any = None, statics: Hashable = None) -> _BoundStep:
        """:meth:`ManagedStep.bind`, still a method of this state (a loop callback that runs
        on the loop's current state)."""
        return _BoundStep(self.step.bind(broadcasts, statics), self.instance)

    def __loop_callback__(self, loop_state: LoopState) -> tuple[Logs, Any]:
        return self.step(loop_state.state, loop_state.batch)

    def __loop_steps_per_call__(self, loop_state: LoopState) -> int:
        return self.step.__loop_steps_per_call__(loop_state)

    def __loop_callback_many__(
        self, loop_state: LoopState, batches: Sequence[Any]
    ) -> tuple[Logs, Any]:
        return self.step.many(loop_state.state, batches)

    def __loop_lower__(self, loop_state: LoopState) -> Any:
        return self.step.lower(loop_state.state, loop_state.batch)


def _shapes(batch: Any) -> tuple[Any, list[tuple[int, ...]]]:
    leaves, treedef = jax.tree_util.tree_flatten(batch)
    return treedef, [tuple(np.shape(leaf)) for leaf in leaves]


def _fuse(body: StepFunction) -> StepFunction:
    """``body(state, batch, broadcasts)`` as ``fused(state, batches, broadcasts)``: one
    ``lax.scan`` over the stacked batches, returning the stacked logs and the last state."""

    def fused(state: Any, batches: tuple[Any, ...], broadcasts: Any) -> tuple[Logs, Any]:
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)

        def scan_step(state: Any, batch: Any) -> tuple[Any, Logs]:
            logs, state = body(state, batch, broadcasts)
            return state, logs

        state, logs = jax.lax.scan(scan_step, state, stacked)
        return logs, state

    return fused


def _split_batch(step: ManagedStep, batch: Any, parts: int) -> tuple[Any, int]:
    """``batch`` as ``parts`` micro-batches stacked on a new first axis, and their rows.

    Micro-batch ``j`` takes rows ``j, j + parts, ...``: when each device's share of a
    sharded batch divides by ``parts``, it splits locally, with no communication.
    """
    rows: set[int] = set()

    def split(path: Any, leaf: Any) -> Any:
        leaf = jnp.asarray(leaf)
        if leaf.ndim == 0:
            return jnp.broadcast_to(leaf, (parts,))
        if leaf.shape[0] % parts:
            raise ValueError(
                f"managed train step {step.__name__}: accumulate_steps={parts} splits each "
                f"batch into {parts} micro-batches, but batch leaf "
                f"{jax.tree_util.keystr(path) or '(the batch)'} has {leaf.shape[0]} rows "
                f"(per device under pmap), which is not a multiple of {parts}. Use a batch "
                f"size divisible by {parts} (times the device count under pmap)."
            )
        rows.add(leaf.shape[0] // parts)
        return jnp.moveaxis(leaf.reshape(leaf.shape[0] // parts, parts, *leaf.shape[1:]), 1, 0)

    micro = jax.tree_util.tree_map_with_path(split, batch)
    return micro, (rows.pop() if len(rows) == 1 else -1)


def _is_random_key(key: Any) -> bool:
    """A typed JAX key (``jax.random.key``) or a raw one (``jax.random.PRNGKey``: uint32)."""
    dtype = getattr(key, "dtype", None)
    if dtype is None:
        return False
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return True
    return bool(dtype == np.uint32 and np.shape(key)[-1:] == (2,))


_SET_BY_CREATE = (
    "{cls}.create() does not take {names}: it sets step=0 and opt_state=tx.init(params) "
    "itself. To start from another step or optimizer state, create the state, then "
    "state.replace({fix}) (or restore a checkpoint with ciclo.restore)."
)

_INTEGER_PARAMS = (
    "managed train step {name}: params hold integer leaves {leaves}, and gradients need "
    "real-valued (float) params. Make them floats, e.g. jnp.asarray(w, jnp.float32), or keep "
    "values that are not trained out of params: ManagedState.create(..., extra={{...}})."
)


def _check_real_params(step: ManagedStep, params: Any) -> None:
    """Raises a ``TypeError`` naming the integer (or boolean) leaves of ``params``."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    integer = [
        f"{jax.tree_util.keystr(path)} ({jnp.result_type(leaf).name})"
        for path, leaf in leaves
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
    ]
    if integer:
        raise TypeError(_INTEGER_PARAMS.format(name=step.__name__, leaves=integer[:5]))


def _total_loss(step: ManagedStep, logs: Logs) -> jax.Array:
    losses = logs.get("losses")
    if not losses:
        raise ValueError(
            f"managed train step {step.__name__} logged no loss, so there is nothing to "
            f"differentiate. Add one: logs.add_loss('loss', loss) (a scalar); a flat dict "
            f"{{name: value}} returned as logs is read as metrics, not losses."
        )
    total = jnp.zeros((), jnp.float32)
    for name, value in losses.items():
        value = jnp.asarray(value)
        if value.shape != ():
            raise ValueError(
                f"managed train step {step.__name__}: loss {name!r} has shape {value.shape}, "
                f"but a loss must be a scalar. Reduce it first, e.g. "
                f"logs.add_loss({name!r}, per_example_loss.mean())."
            )
        total = total + value
    return total


def train_step(fn: StepFunction) -> ManagedStep:
    """Decorates ``fn(state, batch) -> (logs, state)``: ciclo differentiates the sum of
    ``logs.losses`` w.r.t. ``state.params``, applies the optimizer (other changes ``fn``
    makes to the state are kept) and runs it under ``state.strategy``.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> @ciclo.managed.train_step
        ... def train_step(state, batch):
        ...     x, y = batch
        ...     loss = jnp.mean((x @ state.params["w"] - y) ** 2)
        ...     return ciclo.logs().add_loss("loss", loss), state
        >>> state = ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1))
        >>> logs, state = train_step(state, (jnp.ones((4, 2)), jnp.ones(4)))
        >>> int(state.step)
        1
    """
    _check_step_function(fn, "train_step")
    return ManagedStep(fn, differentiate=True)


def step(fn: StepFunction) -> ManagedStep:
    """Decorates ``fn(state, batch) -> (logs, state)`` to run under ``state.strategy``
    without gradients (evaluation, prediction, metric updates).

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> @ciclo.managed.step
        ... def test_step(state, batch):
        ...     return ciclo.logs().add_metric("mean", batch.mean()), state
        >>> state = ciclo.managed.ManagedState.create(params={}, tx=None)
        >>> logs, _ = test_step(state, jnp.ones(4))
        >>> float(logs.metrics.mean)
        1.0
    """
    _check_step_function(fn, "step")
    return ManagedStep(fn, differentiate=False)


def _check_step_function(fn: Any, decorator: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"ciclo.managed.{decorator}({fn!r}): expected the step function to decorate, got "
            f"{type(fn).__name__}. Use it as a decorator: @ciclo.managed.{decorator} above "
            f"def {decorator}(state, batch): ..."
        )
