"""``ManagedState``: a training state that knows its optimizer and strategy (the steps that
use it are in ``_step.py``)."""

from __future__ import annotations

import dataclasses
import operator
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]

from ._ema import ema_fields, update_ema
from ._fields import (
    close_match,
    create_options,
    declare_fields,
    field_names,
    unknown_name_error,
)
from ._precision import LossScale, cast_floating, precision_fields
from ._static import Static, keep_static, shared
from ._strategies import Strategy, get_strategy
from ._trainable import keep_frozen, masked_optimizer, trainable_mask

__all__ = ["ManagedState"]

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
    #: Which params train (``create(..., trainable=...)``); ``None``: all.
    trainable: Any = dataclasses.field(default=None, metadata={"static": True})

    #: Whether :meth:`create` takes unknown keywords as extra fields (adapter states: no).
    keyword_extras: ClassVar[bool] = True

    def __post_init__(self) -> None:
        cls = type(self)
        if cls not in _REGISTERED:
            register_state(cls)
            _REGISTERED.add(cls)

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
        trainable: Any = None,
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
            loss_scale: for ``float16`` (required to train in it): a number (static),
                ``"dynamic"`` or a :class:`~ciclo.managed.LossScale`; ``None`` (default)
                scales nothing.
            ema: keep ``ema_params``, the moving average of the parameters with this decay
                (e.g. ``0.999``), updated after each optimizer update; ``train_loop``
                evaluates it too (entries ``<name>_test_ema``). ``None``: no average.
            trainable: which params train, by name (``/``-joined paths, e.g.
                ``"head/kernel"``): a regex searched in each name (``"^head/"``) or a
                function of the name. The others are frozen: no update, no optimizer
                state, no gradient computed. ``None`` (default): all train.
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
        declare_fields(cls, ManagedState)
        own = {f.name for f in dataclasses.fields(cls)}
        extra = dict(fields.pop("extra", None) or {})
        known = {k: v for k, v in fields.items() if k in own}
        unknown = [k for k in fields if k not in own]
        candidates = sorted(own | create_options(cls))
        for name in unknown:
            # A name a subclass's create() takes and passes on (apply_fn=) is no typo.
            others = [c for c in candidates if c != name]
            if not cls.keyword_extras or close_match(name, others):
                where = f"{cls.__name__}.create()"
                hint = cls.keyword_extras
                raise unknown_name_error(where, "keyword", name, candidates, extra_hint=hint)
            extra[name] = fields[name]
        extra = {name: keep_static(value, f"extra field {name!r}") for name, value in extra.items()}
        state = cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=None,
            key=key,
            extra=extra,
            tx=tx,
            strategy=get_strategy(strategy),
            **{
                **precision_fields(compute_dtype, loss_scale, tx is not None),
                **ema_fields(params, ema),
                **known,
            },
        )
        return state.with_trainable(trainable)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: extra fields declared at create().
        if name.startswith("__") or name == "extra":
            raise AttributeError(name)
        extra = self.__dict__.get("extra", {})
        if name in extra:
            value = extra[name]
            return value.value if type(value) is Static else value
        names = [f.name for f in dataclasses.fields(self)] + list(extra)
        match = close_match(name, names)
        hint = f"; did you mean {match!r}?" if match else ""
        raise AttributeError(
            _NO_FIELD.format(cls=type(self).__name__, name=name, hint=hint, extra=sorted(extra))
        )

    def replace(self: S, **changes: Any) -> S:
        """A copy with some fields (or declared extra fields) changed.

        Raises:
            TypeError: for a name that is neither a field nor a declared extra field
                (``replace(parmas=...)``: "did you mean 'params'?").
        """
        own = field_names(type(self))
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
                **{
                    n: keep_static(value, f"extra field {n!r}")
                    for n, value in extra_changes.items()
                },
            }
        return dataclasses.replace(self, **changes)

    def apply_gradients(self: S, grads: Any) -> S:
        """One optimizer update of ``params`` with ``grads``; increments ``step``."""
        if self.tx is None:
            raise ValueError(
                "this state has no optimizer (tx=None); create it with tx=optax.adam(...) "
                "to train it."
            )
        mask = trainable_mask(self.params, self.trainable)
        tx = masked_optimizer(self.tx, mask)
        updates, opt_state = tx.update(grads, self.opt_state, self.params)
        params = keep_frozen(mask, optax.apply_updates(self.params, updates), self.params)
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

    def with_trainable(self: S, trainable: Any) -> S:
        """The same state training only the params ``trainable`` selects (see
        :meth:`create`; ``None``: all), with a new optimizer state, ``tx.init`` of them:
        moments and schedule counts restart, as for a new optimizer. ``step`` is kept.

        Example:
            >>> import ciclo, jax.numpy as jnp, optax
            >>> params = {"body": jnp.ones(2), "head": jnp.ones(2)}
            >>> state = ciclo.managed.ManagedState.create(
            ...     params=params, tx=optax.adam(0.1), trainable="^head"
            ... )
            >>> state = state.apply_gradients({"body": jnp.ones(2), "head": jnp.ones(2)})
            >>> state.params["body"].tolist(), state.with_trainable(None).trainable
            ([1.0, 1.0], None)
        """
        mask = trainable_mask(self.params, trainable)
        tx = masked_optimizer(self.tx, mask)
        opt_state = tx.init(self.params) if tx is not None else None
        new = self.replace(trainable=trainable, opt_state=opt_state)
        return cast(S, new.strategy.place_state(new))

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


def _is_random_key(key: Any) -> bool:
    """A typed JAX key (``jax.random.key``) or a raw one (``jax.random.PRNGKey``: uint32)."""
    dtype = getattr(key, "dtype", None)
    if dtype is None:
        return False
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return True
    return bool(dtype == np.uint32 and np.shape(key)[-1:] == (2,))


_NO_FIELD = "{cls} has no field {name!r}{hint} Extra fields: {extra}."

_SET_BY_CREATE = (
    "{cls}.create() does not take {names}: it sets step=0 and opt_state=tx.init(params) "
    "itself. To start from another step or optimizer state, create the state, then "
    "state.replace({fix}) (or restore a checkpoint with ciclo.restore)."
)


def _is_static(field: dataclasses.Field[Any]) -> bool:
    """A static field: ``metadata={"static": True}``, or flax's
    ``struct.field(pytree_node=False)``."""
    return bool(field.metadata.get("static", False)) or field.metadata.get("pytree_node") is False


#: The key of a state's :class:`Static` node data in its ``__dict__``.
_NODE_DATA = "__ciclo_static__"

_UNHASHABLE_STATIC = (
    "{cls}: the static field {name!r} holds an unhashable {type} ({value!r}), and a compiled "
    "step hashes static fields to find its compiled version. Make it hashable (a tuple, a "
    "frozen dataclass), hold it in a ciclo.adapters.Static (compared by identity), or make "
    "it a data field (arrays)."
)


def register_state(cls: type) -> None:
    """Registers the state class ``cls`` as a pytree: data fields are its children, its
    static fields one :class:`Static` (hashed once per state, and shared by states with
    equal static fields: a compiled step's output state carries the one it was compiled
    for, so the step finds its compiled version by identity, with no Python call).

    Unflattening (a compiled step's output state) fills the instance's ``__dict__``
    directly, without ``__init__``: the fields were checked when the state was built, and
    a frozen dataclass's ``__init__`` costs microseconds per step (as would
    ``jax.tree_util.register_dataclass``, which calls it).
    """
    fields = dataclasses.fields(cls)
    meta = tuple(f.name for f in fields if _is_static(f))
    data = tuple(f.name for f in fields if not _is_static(f))
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in data)
    new, set_attribute = object.__new__, object.__setattr__
    # The static part of an unflattened state's __dict__, by the id of its node data (a
    # loop's steps unflatten with the same one); the entry holds the node data, so that id
    # is not reused while it is cached, and no Python __hash__ runs per step.
    static_parts: dict[int, tuple[Static, dict[str, Any]]] = {}

    def node_data(state: Any) -> Static:
        values = state.__dict__
        static: Static | None = values.get(_NODE_DATA)
        if static is None:
            static = Static(tuple(values[n] for n in meta))
            if not static.hashable:
                _raise_unhashable(cls, meta, static.value)
            static = values[_NODE_DATA] = shared(static)
        return static

    children = operator.itemgetter(*data)  # one C call (data has at least 5 fields)

    def flatten(state: Any) -> tuple[tuple[Any, ...], Static]:
        values = state.__dict__
        return children(values), values.get(_NODE_DATA) or node_data(state)

    def flatten_with_keys(state: Any) -> tuple[list[tuple[Any, Any]], Static]:
        values = state.__dict__
        return [(k, values[n]) for k, n in zip(keys, data, strict=True)], node_data(state)

    def unflatten(static: Static, children: Iterable[Any]) -> Any:
        cached = static_parts.get(id(static))
        if cached is None or cached[0] is not static:
            if len(static_parts) >= 64:
                static_parts.clear()
            part = dict(zip(meta, static.value, strict=True))
            part[_NODE_DATA] = static
            cached = static_parts[id(static)] = (static, part)
        state: Any = new(cls)
        values = cached[1].copy()
        values.update(zip(data, children, strict=True))
        set_attribute(state, "__dict__", values)
        return state

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


def _raise_unhashable(cls: type, names: tuple[str, ...], values: tuple[Any, ...]) -> None:
    for name, value in zip(names, values, strict=True):
        try:
            hash(value)
        except TypeError:
            raise TypeError(
                _UNHASHABLE_STATIC.format(
                    cls=cls.__name__, name=name, type=type(value).__name__, value=value
                )
            ) from None
