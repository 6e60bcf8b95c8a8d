"""Strategies: *where and how* a managed step runs (eagerly, jitted, over several devices).

A strategy is a small bundle of functions, like an optax transformation:

- ``place_state(state) -> state``: put the state where the strategy wants it (once, when the
  state gets the strategy).
- ``place_batch(batch) -> batch``: put a batch where the compiled step wants it (every step).
- ``compile(fn) -> fn``: turn ``fn(state, batch, broadcasts) -> (logs, state)`` into the
  callable to run (``broadcasts``: a pytree every device gets whole, ``None`` when the step
  has none).
- ``reduce_gradients(grads) -> grads`` and ``reduce_logs(logs) -> logs``: run inside the
  compiled step, between the gradient and the optimizer update (``pmap`` averages over its
  devices there; the other strategies need nothing).
- ``place_broadcasts(broadcasts) -> broadcasts``: put a step's broadcasts where the compiled
  step wants them (every call; the identity unless several processes need a global array).

and two numbers that say how much work one call does:

- ``steps_per_call``: how many batches a loop runs in one compiled call (``lax.scan``), or
  ``"auto"``: the loop picks it while it runs (see :mod:`ciclo.managed._auto`).
- ``accumulate_steps``: how many micro-batches each training batch is split into; their
  gradients are averaged into one optimizer update, equal to the update on the whole batch.

Both are options of the strategy, not of the step, because they say how a step *runs*, not
what it computes: the same ``train_step`` (yours, or one an adapter provides) runs unchanged
on one device, on a pod, fused or accumulated, and you change one object to scale it.

Strategies are looked up by name (``"eager"``, ``"jit"``, ``"data-parallel"``, ``"pmap"``,
and from :mod:`ciclo.managed._sharding` ``"fsdp"`` and ``"sharded"``); :func:`register_strategy`
adds a name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, cast

import jax
import numpy as np

from .._records._aggregate import reduce_across_devices

__all__ = [
    "Strategy",
    "eager",
    "jit",
    "data_parallel",
    "pmap",
    "register_strategy",
    "register_built_in",
    "BUILT_IN",
    "get_strategy",
    "strategy_names",
]

StepFn = Callable[..., Any]
#: A strategy's ``steps_per_call``: a positive int, or ``"auto"``.
StepsPerCall = int | Literal["auto"]


def identity(value: Any) -> Any:
    """The placement or reduction that does nothing (a strategy's default).

    Example:
        >>> identity(3)
        3
    """
    return value


class Strategy(NamedTuple):
    """How a managed step runs. Build one with a factory (:func:`jit`,
    :func:`data_parallel`, ...) or write your own and :func:`register_strategy` it.

    Attributes:
        name: the name it is known by.
        place_state: ``state -> state``, called when a state takes this strategy.
        place_batch: ``batch -> batch``, called on every batch before the step.
        compile: ``fn -> fn``, called once per step function (and ``statics`` value);
            ``fn(state, batch, broadcasts) -> (logs, state)``.
        reduce_gradients: ``grads -> grads``, inside the step before the optimizer update.
        reduce_logs: ``logs -> logs``, inside the step on the step's logs.
        steps_per_call: batches a loop runs per compiled call (1: no fusion; ``"auto"``:
            the loop picks it).
        accumulate_steps: micro-batches per training batch (1: no accumulation).
        place_broadcasts: ``broadcasts -> broadcasts``, called on a step's broadcasts before
            every call.

    Example:
        >>> import ciclo
        >>> s = ciclo.managed.jit(steps_per_call=4)
        >>> s.name, s.steps_per_call, s.accumulate_steps
        ('jit', 4, 1)
    """

    name: str
    place_state: Callable[[Any], Any]
    place_batch: Callable[[Any], Any]
    compile: Callable[[StepFn], StepFn]
    reduce_gradients: Callable[[Any], Any] = identity
    reduce_logs: Callable[[Any], Any] = identity
    steps_per_call: StepsPerCall = 1
    accumulate_steps: int = 1
    place_broadcasts: Callable[[Any], Any] = identity


def partition_spec(*axes: str) -> Any:
    """``jax.sharding.PartitionSpec(*axes)`` (typed for the strategies' modules).

    Example:
        >>> partition_spec("data") == jax.sharding.PartitionSpec("data")
        True
    """
    return jax.sharding.PartitionSpec(*axes)  # type: ignore[no-untyped-call]


def step_counts(
    strategy: str, steps_per_call: object, accumulate_steps: object
) -> tuple[StepsPerCall, int]:
    """The validated ``(steps_per_call, accumulate_steps)`` of the factory ``strategy``.

    Example:
        >>> step_counts("jit", "auto", 1)
        ('auto', 1)
    """
    counts = {"steps_per_call": steps_per_call, "accumulate_steps": accumulate_steps}
    for option, value in counts.items():
        if option == "steps_per_call" and value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            auto = ' or "auto"' if option == "steps_per_call" else ""
            raise ValueError(
                f"{strategy}({option}=...) must be a positive int{auto}, got {value!r}; "
                f"{option}=1 turns it off."
            )
    return cast(StepsPerCall, steps_per_call), cast(int, accumulate_steps)


def eager() -> Strategy:
    """Runs steps as plain Python (no compilation): for debugging with ``print``/``pdb``.

    Example:
        >>> import ciclo
        >>> ciclo.managed.eager().name
        'eager'
    """
    return Strategy("eager", identity, identity, identity)


def jit(
    *, donate: bool = False, steps_per_call: StepsPerCall = 1, accumulate_steps: int = 1
) -> Strategy:
    """Compiles steps with ``jax.jit`` on the default device.

    Args:
        donate: donate the input state's buffers to the output (saves memory; the state
            passed in must not be used afterwards).
        steps_per_call: batches a loop runs in one compiled call (``lax.scan``); schedules
            still fire on the same steps as with 1. ``"auto"``: the loop fuses as many as
            pay (1 for a step whose dispatch is a small share of its time; see
            docs/performance.md).
        accumulate_steps: split each training batch into this many micro-batches and
            average their gradients into one update (same result, less memory).

    Example:
        >>> import ciclo
        >>> ciclo.managed.jit(donate=True).name
        'jit'
    """
    steps_per_call, accumulate_steps = step_counts("jit", steps_per_call, accumulate_steps)

    def compile_step(fn: StepFn) -> StepFn:
        return jax.jit(fn, donate_argnums=(0,) if donate else ())

    return Strategy(
        "jit",
        identity,
        identity,
        compile_step,
        steps_per_call=steps_per_call,
        accumulate_steps=accumulate_steps,
    )


MSG_NOT_DIVISIBLE = (
    "{strategy}: {size}, which does not divide evenly over {shards} devices. Use a batch "
    "size that is a multiple of {shards}{per_process}, or pad the incomplete last batch to "
    "full size with rows of sample_weight 0 and count its real rows with batch_size_fn (an "
    "evaluation then equals one on every example; dropping the batch would leave them out): "
    "see 'Evaluation sets that do not divide over the devices' in docs/sharding.md."
)


def _check_divisible(strategy: str, batch: Any, shards: int, processes: int) -> None:
    """Every batch leaf with a leading axis must split evenly into ``shards`` parts."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0]:
        shape = np.shape(leaf)
        if not shape:
            continue
        rows = shape[0] * processes
        if rows % shards:
            where = f"batch leaf {jax.tree_util.keystr(path)}" if path else "the batch"
            if processes > 1:
                size = (
                    f"this process's part of {where} has {shape[0]} rows, so the global "
                    f"batch of {processes} processes has {rows}"
                )
            else:
                size = f"{where} has {rows} rows (batch size {rows})"
            multiple = shards // np.gcd(shards, processes)
            per_process = f" (per process: a multiple of {multiple})" if processes > 1 else ""
            raise ValueError(
                MSG_NOT_DIVISIBLE.format(
                    strategy=strategy, size=size, shards=shards, per_process=per_process
                )
            )


def _put_key_safe(leaf: Any, sharding: jax.sharding.Sharding) -> Any:
    if isinstance(leaf, jax.Array) and jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        data = jax.device_put(jax.random.key_data(leaf), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
    return jax.device_put(leaf, sharding)


def put_global(tree: Any, shardings: Any) -> Any:
    """``tree`` put on ``shardings`` (one sharding, or a tree of them) as global arrays.

    With several processes, every process must hold the same values (a state, broadcasts);
    typed RNG keys cannot be put across processes directly, so their raw data is.
    """
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: _put_key_safe(x, shardings), tree)
    return jax.tree.map(_put_key_safe, tree, shardings)


def broadcast_placer(replicated: jax.sharding.Sharding) -> Callable[[Any], Any]:
    """The ``place_broadcasts`` of a strategy whose step takes them replicated: nothing to do
    on one process (``jit`` moves them), global arrays on several."""

    def place_broadcasts(broadcasts: Any) -> Any:
        return broadcasts if jax.process_count() == 1 else put_global(broadcasts, replicated)

    return place_broadcasts


def check_feedable(
    strategy: str, devices: np.ndarray, axis_names: Sequence[str], names: Sequence[str]
) -> None:
    """Checks that process-local batches can be assembled along the batch axes ``names`` of
    a mesh (``devices``, an array of devices, with ``axis_names``): each position along them
    belongs to one process, and every process holds as many.

    Raises:
        ValueError: naming the mesh's axes and the fix.

    Example:
        >>> import jax, numpy as np
        >>> check_feedable("jit", np.array(jax.devices()), ["data"], ["data"])  # one process
    """
    batch_axes = [axis_names.index(name) for name in names]
    moved = np.moveaxis(devices, batch_axes, list(range(len(batch_axes))))
    positions = moved.reshape(int(np.prod(moved.shape[: len(batch_axes)])), -1)
    owners = [{device.process_index for device in row} for row in positions]
    counts: dict[int, int] = {}
    for owner in owners:
        if len(owner) == 1:
            counts[next(iter(owner))] = counts.get(next(iter(owner)), 0) + 1
    if all(len(owner) == 1 for owner in owners) and len(set(counts.values())) == 1:
        return
    shape = dict(zip(axis_names, devices.shape, strict=True))
    processes = len({device.process_index for device in devices.flat})
    others = [name for name in axis_names if name not in names]
    rest = devices.size // processes
    if len(others) == 1:
        example = f"jax.make_mesh(({processes}, {rest}), ({names[0]!r}, {others[0]!r}))"
    else:
        example = f"jax.make_mesh(({processes}, ...), ({names[0]!r}, ...))"
    raise ValueError(
        _NOT_FEEDABLE.format(
            strategy=strategy,
            shape=shape,
            names=tuple(names),
            why=(
                "a position holds devices of several processes"
                if any(len(owner) > 1 for owner in owners)
                else "the processes hold different numbers of positions"
            ),
            processes=processes,
            example=example,
        )
    )


_NOT_FEEDABLE = (
    "{strategy}: the mesh {shape} cannot be fed from process-local batches: along its batch "
    "axis {names}, {why}, so each process's part of the batch has no place of its own. Build "
    "the mesh so that the batch axis spans the {processes} processes: jax.make_mesh orders "
    "devices by process, so put the batch axis first with a size of {processes} (or a "
    "multiple of it), e.g. {example}; or split the batch over another axis (axis=...)."
)


def batch_placer(
    strategy: str, mesh: jax.sharding.Mesh, axis: str | tuple[str, ...]
) -> Callable[[Any], Any]:
    """The ``place_batch`` of a strategy that splits batches along their first axis over the
    mesh ``axis`` (one name or several), scalars replicated.

    Multi-host: each process gives its own part of the batch; the parts are assembled into
    the global batch with ``jax.make_array_from_process_local_data``.
    """
    from jax.sharding import NamedSharding

    replicated = NamedSharding(mesh, partition_spec())
    sharded = NamedSharding(mesh, partition_spec(axis))  # type: ignore[arg-type]
    names = (axis,) if isinstance(axis, str) else axis
    shards = int(np.prod([mesh.shape[name] for name in names]))
    if jax.process_count() > 1:
        check_feedable(strategy, mesh.devices, mesh.axis_names, names)

    def sharding_of(leaf: Any) -> NamedSharding:
        return sharded if np.ndim(leaf) else replicated

    # Per batch structure (tree and shapes): checked once, its shardings chosen once, so a
    # batch costs what jax.device_put(batch, sharding) costs (that very call when no leaf
    # is a scalar).
    known: dict[Any, NamedSharding | list[NamedSharding]] = {}

    def place_batch(batch: Any) -> Any:
        processes = jax.process_count()
        leaves, treedef = jax.tree_util.tree_flatten(batch)
        try:
            structure = (treedef, processes, *[np.shape(leaf) for leaf in leaves])
            shardings = known.get(structure)
        except TypeError:  # an unhashable tree: nothing cached
            structure, shardings = None, None
        if shardings is None:
            _check_divisible(strategy, batch, shards, processes)
            per_leaf = [sharding_of(leaf) for leaf in leaves]
            shardings = sharded if all(s is sharded for s in per_leaf) else per_leaf
            if structure is not None:
                if len(known) >= 64:
                    known.clear()
                known[structure] = shardings
        if processes == 1:
            if shardings is sharded:
                return jax.device_put(batch, sharded)
            return jax.tree_util.tree_unflatten(treedef, jax.device_put(leaves, shardings))
        per_leaf = shardings if isinstance(shardings, list) else [sharded] * len(leaves)
        return jax.tree_util.tree_unflatten(
            treedef,
            [
                jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]
                    sharding, np.asarray(leaf)
                )
                for sharding, leaf in zip(per_leaf, leaves, strict=True)
            ],
        )

    return place_batch


def data_parallel(
    *,
    mesh: jax.sharding.Mesh | None = None,
    axis: str = "data",
    donate: bool = False,
    steps_per_call: StepsPerCall = 1,
    accumulate_steps: int = 1,
) -> Strategy:
    """Data parallelism with ``jax.jit`` and ``NamedSharding`` over a ``Mesh``: each batch
    is split along its first axis over the mesh's ``axis``, the state is replicated, and
    arrays go in and come out as ordinary global ``jax.Array`` s (nothing to replicate or
    unreplicate). Gradients and logs are those of the whole (global) batch.

    Multi-host: after ``jax.distributed.initialize()``, every process feeds its *own* part
    of each batch (e.g. its shard of the dataset); they are assembled into the global batch
    with ``jax.make_array_from_process_local_data``. Logs are global, the same on every
    process. Every process must run the same loop (same schedules, same number of
    batches). ``elapsed.samples`` counts the rows this process fed; to count global
    samples, pass ``batch_size_fn=lambda b: len(b[0]) * jax.process_count()`` to the loop.

    Args:
        mesh: the device mesh (default: every device on one ``axis``). A mesh with more
            axes works too: the batch is split along ``axis``, everything else replicated.
        axis: the name of the mesh's data axis.
        donate: donate the input state's buffers (see :func:`jit`).
        steps_per_call: batches per compiled call (see :func:`jit`).
        accumulate_steps: micro-batches per training batch (see :func:`jit`).

    Example:
        >>> import ciclo
        >>> ciclo.managed.data_parallel().name
        'data-parallel'
    """
    from jax.sharding import NamedSharding

    steps_per_call, accumulate_steps = step_counts(
        "data_parallel", steps_per_call, accumulate_steps
    )
    mesh = data_mesh("data_parallel", mesh, axis)
    replicated = NamedSharding(mesh, partition_spec())

    def place_state(state: Any) -> Any:
        return put_global(state, replicated)

    def compile_step(fn: StepFn) -> StepFn:
        # The state stays replicated (a state made elsewhere is moved in); logs come back
        # replicated, so every process can read them.
        return jax.jit(
            fn,
            in_shardings=(replicated, None, replicated),
            out_shardings=replicated,
            donate_argnums=(0,) if donate else (),
        )

    return Strategy(
        "data-parallel",
        place_state,
        batch_placer("data-parallel", mesh, axis),
        compile_step,
        steps_per_call=steps_per_call,
        accumulate_steps=accumulate_steps,
        place_broadcasts=broadcast_placer(replicated),
    )


def data_mesh(
    strategy: str, mesh: jax.sharding.Mesh | None, axis: str | tuple[str, ...]
) -> jax.sharding.Mesh:
    """``mesh``, checked to have the data ``axis``; by default every device on that axis."""
    from jax.sharding import AxisType

    names = (axis,) if isinstance(axis, str) else tuple(axis)
    if mesh is None:
        if len(names) != 1:
            raise ValueError(
                f"{strategy}(axis={axis!r}): several data axes need a mesh that has them; "
                f"pass mesh=jax.make_mesh(...)."
            )
        # Auto axes: the compiler propagates shardings, so single-device code runs unchanged.
        return jax.make_mesh((jax.device_count(),), names, axis_types=(AxisType.Auto,))
    missing = [name for name in names if name not in mesh.axis_names]
    if missing:
        raise ValueError(
            f"{strategy}(axis={axis!r}): the mesh has axes {mesh.axis_names}; pass the "
            f"name of its data axis, e.g. {strategy}(mesh=mesh, axis={mesh.axis_names[0]!r})."
        )
    return mesh


def pmap(
    *,
    axis_name: str = "batch",
    devices: Sequence[jax.Device] | None = None,
    steps_per_call: StepsPerCall = 1,
    accumulate_steps: int = 1,
) -> Strategy:
    """One compiled replica per local device with ``jax.pmap``, for code written for it
    (e.g. steps that call ``lax.pmean(x, "batch")`` themselves). Prefer
    :func:`data_parallel`: JAX now implements ``pmap`` on top of ``jit`` and ``shard_map``
    and recommends sharding for new code.

    Each batch is split along its first axis over the devices; inside the step,
    gradients and logs (losses, metrics) are averaged with ``lax.pmean`` and outputs are
    gathered back into the whole batch. The state is handed back as ordinary arrays
    (nothing to replicate or unreplicate); state changes other than ``params`` are those of
    the first device, so average per-device statistics yourself
    (``lax.pmean(stats, axis_name)``). One host only: for several, use
    :func:`data_parallel`.

    Args:
        axis_name: the ``pmap`` axis name your code may use in collectives.
        devices: the devices to run on (default: ``jax.local_devices()``).
        steps_per_call: batches per compiled call (see :func:`jit`).
        accumulate_steps: micro-batches per training batch (see :func:`jit`); each device
            splits its part of the batch.

    Example:
        >>> import ciclo
        >>> ciclo.managed.pmap().name
        'pmap'
    """
    from jax.sharding import Mesh, NamedSharding

    steps_per_call, accumulate_steps = step_counts("pmap", steps_per_call, accumulate_steps)
    device_list = list(devices) if devices is not None else jax.local_devices()
    count = len(device_list)
    replicated = NamedSharding(Mesh(np.array(device_list), (axis_name,)), partition_spec())

    def place_state(state: Any) -> Any:
        return jax.device_put(state, replicated)

    def split(leaf: Any) -> Any:
        if not np.ndim(leaf):
            return np.broadcast_to(leaf, (count,))
        leaf = leaf if hasattr(leaf, "reshape") else np.asarray(leaf)
        return leaf.reshape(count, -1, *leaf.shape[1:])

    def place_batch(batch: Any) -> Any:
        _check_divisible("pmap", batch, count, 1)
        return jax.tree.map(split, batch)

    def compile_step(fn: StepFn) -> StepFn:
        pmapped: StepFn = jax.pmap(
            fn, axis_name=axis_name, in_axes=(None, 0, None), out_axes=None, devices=device_list
        )
        return pmapped

    def reduce_gradients(grads: Any) -> Any:
        return jax.lax.pmean(grads, axis_name)  # type: ignore[no-untyped-call]

    def reduce_logs(logs: Any) -> Any:
        return reduce_across_devices(logs, axis_name)

    return Strategy(
        "pmap",
        place_state,
        place_batch,
        compile_step,
        reduce_gradients=reduce_gradients,
        reduce_logs=reduce_logs,
        steps_per_call=steps_per_call,
        accumulate_steps=accumulate_steps,
    )


_REGISTRY: dict[str, Callable[..., Strategy]] = {}
# One instance per factory and options, so aliases share compiled steps.
_INSTANCES: dict[tuple[Callable[..., Strategy], tuple[tuple[str, Any], ...]], Strategy] = {}


def register_strategy(
    name: str, factory: Callable[..., Strategy], *, replace: bool = False
) -> None:
    """Makes ``factory(**options)`` available as ``strategy=name``.

    Args:
        name: the name ``strategy=`` takes.
        factory: ``(**options) -> Strategy``.
        replace: allow replacing a built-in strategy (``"jit"``...): every state created
            with ``strategy=name`` afterwards gets the new one.

    Example:
        >>> import ciclo
        >>> ciclo.managed.register_strategy("jit-donate", lambda: ciclo.managed.jit(donate=True))
        >>> ciclo.managed.get_strategy("jit-donate").name
        'jit'
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"a strategy name must be a non-empty string, got {name!r}.")
    if not callable(factory):
        raise TypeError(
            f"register_strategy({name!r}, factory): factory must be a callable returning a "
            f"ciclo.managed.Strategy, got {factory!r}."
        )
    if name in BUILT_IN and not replace:
        raise ValueError(_BUILT_IN_NAME.format(name=name))
    _REGISTRY[name] = factory


#: The names of ciclo's own strategies, which register_strategy replaces only when told.
BUILT_IN: set[str] = set()


def register_built_in(name: str, factory: Callable[..., Strategy]) -> None:
    """Registers one of ciclo's own strategies (see :data:`BUILT_IN`)."""
    register_strategy(name, factory)
    BUILT_IN.add(name)


def strategy_names() -> list[str]:
    """The registered strategy names."""
    return sorted(_REGISTRY)


def get_strategy(strategy: str | Strategy, **options: Any) -> Strategy:
    """The :class:`Strategy` for a name (one shared instance per name and options), or the
    strategy itself.

    Args:
        strategy: a registered name or a :class:`Strategy`.
        **options: keyword options of the name's factory, e.g. ``steps_per_call=8``.

    Example:
        >>> import ciclo
        >>> ciclo.managed.get_strategy("data-parallel", steps_per_call=8).steps_per_call
        8
    """
    if isinstance(strategy, Strategy):
        if options:
            raise TypeError(
                f"options {sorted(options)} only apply to a strategy given by name; for a "
                f"Strategy object use strategy._replace(...) or call its factory with them."
            )
        return strategy
    if not isinstance(strategy, str):
        raise TypeError(
            f"strategy must be a name such as 'jit' or a ciclo.managed.Strategy, got {strategy!r}."
        )
    name = strategy
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown strategy {name!r}; known strategies: {strategy_names()}. "
            f"Add your own with ciclo.managed.register_strategy(name, factory)."
        )
    factory = _REGISTRY[name]
    key: Any = (factory, tuple(sorted(options.items())))
    try:
        return _INSTANCES[key]
    except TypeError:  # an unhashable option (a list of devices): not shared
        key = None
    except KeyError:
        pass
    try:
        made = factory(**options)
    except TypeError as error:
        if not options:
            raise
        raise TypeError(
            f"strategy {name!r} does not take the options {sorted(options)}: {error}"
        ) from None
    if not isinstance(made, Strategy):
        raise TypeError(
            f"the factory registered for strategy {name!r} returned {made!r}, not a "
            f"ciclo.managed.Strategy."
        )
    if key is not None:
        _INSTANCES[key] = made
    return made


register_built_in("eager", eager)
register_built_in("jit", jit)
register_built_in("data-parallel", data_parallel)
register_built_in("data_parallel", data_parallel)
register_built_in("pmap", pmap)
# The original ciclo's names of the donating strategies: the same instances as
# get_strategy("jit", donate=True), so they share compiled steps.
register_built_in("jit_donate", functools.partial(get_strategy, "jit", donate=True))
register_built_in(
    "data_parallel_donate", functools.partial(get_strategy, "data_parallel", donate=True)
)


_BUILT_IN_NAME = (
    "register_strategy({name!r}, factory): {name!r} is a built-in strategy, and registering "
    "another factory under its name would change what strategy={name!r} means everywhere. "
    "Choose another name, or pass replace=True to replace it."
)
