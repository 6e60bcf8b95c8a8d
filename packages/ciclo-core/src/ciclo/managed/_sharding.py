"""Sharded strategies (``"fsdp"``, ``"sharded"``): ``jax.jit`` with ``NamedSharding`` s, each
state array placed by its ``PartitionSpec`` (:func:`partition_specs`), the batch split over
the data axis; XLA inserts the gathers and reductions.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import jax
import numpy as np

from .._plugins._discovery import extras, register_extra
from ._strategies import (
    StepFn,
    StepsPerCall,
    Strategy,
    batch_placer,
    broadcast_placer,
    data_mesh,
    partition_spec,
    put_global,
    register_built_in,
    step_counts,
)

__all__ = ["sharded", "fsdp", "partition_specs", "register_partition_metadata", "key_path"]

PartitionSpec = jax.sharding.PartitionSpec
SpecReader = Callable[[Any], "PartitionSpec | None"]
RuleFn = Callable[[str, Any], "PartitionSpec | None"]
Rules = Sequence[tuple[str, Any]] | Mapping[str, Any] | RuleFn
# Rules compiled: (path, leaf) -> (spec, where the spec comes from) | None.
Matcher = Callable[[str, Any], "tuple[Any, str] | None"]

_BROKEN_ADAPTER = "ciclo: adapter {name!r} failed to load ({error}); its metadata is ignored."


def _readers() -> dict[type, SpecReader]:
    """The partition metadata readers (registered, then adapters'); a broken adapter warns."""
    table, broken = extras("partition_metadata")
    for name, error in broken.items():
        warnings.warn(_BROKEN_ADAPTER.format(name=name, error=error), RuntimeWarning, stacklevel=4)
    return table


def register_partition_metadata(node_type: type, spec_of: SpecReader) -> None:
    """Teaches the sharded strategies to read the partitioning metadata of ``node_type`` nodes.

    Args:
        node_type: a pytree node class wrapping annotated arrays (subclasses match too), as
            Flax's ``nn.Partitioned``.
        spec_of: ``node -> PartitionSpec | None``; rules given to the strategy take precedence.

    Example:
        >>> import ciclo, jax
        >>> class Sharded:  # a pytree node holding one array and its axis names
        ...     def __init__(self, value, names):
        ...         self.value, self.names = value, names
        >>> jax.tree_util.register_pytree_node(
        ...     Sharded, lambda n: ((n.value,), n.names), lambda names, v: Sharded(v[0], names)
        ... )
        >>> ciclo.managed.register_partition_metadata(
        ...     Sharded, lambda node: jax.sharding.PartitionSpec(*node.names)
        ... )
        >>> params = {"w": Sharded(jax.numpy.zeros((8, 2)), ("data", None))}
        >>> ciclo.managed.partition_specs(params)["w"].value == jax.sharding.PartitionSpec("data")
        True
    """
    register_extra("partition_metadata", node_type, spec_of, argument="spec_of")


def _reader(readers: dict[type, SpecReader], node: Any) -> SpecReader | None:
    for node_type, spec_of in readers.items():
        if isinstance(node, node_type):
            return spec_of
    return None


def key_path(path: Sequence[Any]) -> str:
    """A pytree key path as the ``'/'``-joined string rules match (``params/dense/kernel``).

    Example:
        >>> import ciclo, jax
        >>> (path, _), = jax.tree_util.tree_flatten_with_path({"dense": [0.0]})[0]
        >>> ciclo.managed.key_path(path)
        'dense/0'
    """
    parts = []
    for i, key in enumerate(path):
        if isinstance(key, jax.tree_util.GetAttrKey):
            if i == 0 and key.name == "extra":
                continue
            parts.append(key.name)
        elif isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            parts.append(str(key.key))
        else:
            parts.append(str(key))
    return "/".join(parts)


def _matcher(rules: Rules | None, strategy: str) -> Matcher:
    """``rules`` as one function ``(path, leaf) -> (spec, where it comes from) | None``."""
    if rules is None:
        return lambda path, leaf: None
    if callable(rules):
        fn = rules

        def by_function(path: str, leaf: Any) -> tuple[Any, str] | None:
            spec = fn(path, leaf)
            return None if spec is None else (spec, "the rules function")

        return by_function
    pairs = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
    compiled = []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise TypeError(f"{strategy}: rule {i} is {pair!r}; a rule is a pair (regex, spec).")
        pattern, spec = pair
        if not isinstance(pattern, str):
            raise TypeError(f"{strategy}: rule {i} has pattern {pattern!r}; use a regex string.")
        if not isinstance(spec, PartitionSpec):
            raise TypeError(f"{strategy}: rule {pattern!r} maps to {spec!r}, not a PartitionSpec.")
        try:
            compiled.append((re.compile(pattern), spec))
        except re.error as error:
            raise ValueError(
                f"{strategy}: rule {pattern!r} is not a valid regex: {error}"
            ) from None

    def by_rules(path: str, leaf: Any) -> tuple[Any, str] | None:
        for regex, spec in compiled:
            if regex.search(path):
                return spec, f"rule {regex.pattern!r}"
        return None

    return by_rules


def _axis_names(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def _fit(
    spec: PartitionSpec, shape: tuple[int, ...], mesh: jax.sharding.Mesh
) -> tuple[list[Any], str | None]:
    """``spec`` as one entry per dimension, or the reason it does not fit ``shape``."""
    entries = list(spec)
    if len(entries) > len(shape):
        return entries, f"has {len(entries)} entries but the array has {len(shape)} dimensions"
    for d, entry in enumerate(entries):
        names = _axis_names(entry)
        for name in names:
            if name not in mesh.axis_names:
                return entries, f"names axis {name!r}, but the mesh has axes {mesh.axis_names}"
        size = int(np.prod([mesh.shape[name] for name in names]))
        if shape[d] % size:
            return entries, (
                f"splits dimension {d} (size {shape[d]}) over {size} devices "
                f"({'x'.join(names)}), which does not divide it"
            )
    return entries + [None] * (len(shape) - len(entries)), None


def _add_fsdp(
    entries: list[Any], shape: tuple[int, ...], axis: str | tuple[str, ...], size: int
) -> list[Any]:
    """Splits the largest unsplit dimension that divides by ``size`` over ``axis``."""
    names = _axis_names(axis)
    if any(name in _axis_names(entry) for entry in entries for name in names):
        return entries
    candidates = [d for d, entry in enumerate(entries) if entry is None and shape[d] % size == 0]
    if not candidates:
        return entries
    best = max(candidates, key=lambda d: (shape[d], -d))
    entries = list(entries)
    entries[best] = axis
    return entries


def partition_specs(
    tree: Any,
    rules: Rules | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
    fsdp_axis: str | tuple[str, ...] | None = None,
    strategy: str = "partition_specs",
) -> Any:
    """The ``PartitionSpec`` of every array in ``tree``, as the sharded strategies place it.

    The first of ``rules`` whose regex searches the array's :func:`key_path` wins, else its
    partitioning metadata, else replicated; with ``fsdp_axis``, the largest unsplit dimension
    that divides is split over it too. A spec that does not fit is an error, except under
    ``opt_state`` (replicated).

    Args:
        tree: any pytree, e.g. a :class:`~ciclo.managed.ManagedState`.
        rules: ``[(regex, PartitionSpec), ...]``, a dict, or ``(path, leaf) -> spec | None``.
        mesh: the mesh (default: every device on an axis ``"data"``).
        fsdp_axis: the data axis to split parameters over as well, or None.
        strategy: the name errors mention.

    Example:
        >>> import ciclo, jax, jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec as P
        >>> params = {"dense": {"kernel": jnp.zeros((4, 16)), "bias": jnp.zeros(16)}}
        >>> specs = ciclo.managed.partition_specs(params, [("kernel", P(None, "data"))])
        >>> specs == {"dense": {"bias": P(), "kernel": P(None, "data")}}
        True
    """
    mesh = data_mesh(strategy, mesh, "data") if mesh is None else mesh
    return _partition_specs(tree, _matcher(rules, strategy), mesh, fsdp_axis, strategy)


def _partition_specs(
    tree: Any,
    match: Matcher,
    mesh: jax.sharding.Mesh,
    fsdp_axis: str | tuple[str, ...] | None,
    strategy: str,
) -> Any:
    readers = _readers()
    fsdp_size = (
        int(np.prod([mesh.shape[name] for name in _axis_names(fsdp_axis)]))
        if fsdp_axis is not None
        else 0
    )

    def leaf_spec(name: str, leaf: Any, annotated: Any, lenient: bool) -> PartitionSpec:
        shape = tuple(np.shape(leaf))
        dtype = getattr(leaf, "dtype", None)
        if not shape or (dtype is not None and jax.numpy.issubdtype(dtype, jax.dtypes.prng_key)):
            return cast(PartitionSpec, partition_spec())
        found = match(name, leaf)
        if found is None and annotated is not None:
            found = (annotated, "its partitioning metadata")
        entries: list[Any] = [None] * len(shape)
        if found is not None:
            spec, source = found
            if not isinstance(spec, PartitionSpec):
                raise TypeError(f"{strategy}: {source} gives {name} {spec!r}, not a PartitionSpec.")
            fitted, problem = _fit(spec, shape, mesh)
            if problem is None:
                entries = fitted
            elif not lenient:
                raise ValueError(
                    f"{strategy}: {source} gives {name} (shape {shape}) the spec {spec}, which "
                    f"{problem}; change the rule or the mesh."
                )
        if fsdp_axis is not None:
            entries = _add_fsdp(entries, shape, fsdp_axis, fsdp_size)
        while entries and entries[-1] is None:
            entries.pop()
        return cast(PartitionSpec, partition_spec(*entries))

    leaves, treedef = jax.tree_util.tree_flatten(tree)
    is_annotated = (lambda node: _reader(readers, node) is not None) if readers else None
    nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_annotated)[0]
    specs: list[PartitionSpec] = []
    for path, node in nodes:
        reader = _reader(readers, node) if readers else None
        if reader is not None:
            inner = jax.tree_util.tree_leaves(node)
            annotated = reader(node)
        else:
            inner, annotated = [node], None
        name = key_path(path)
        lenient = bool(path) and key_path(path[:1]) == "opt_state"
        specs += [leaf_spec(name, leaf, annotated, lenient) for leaf in inner]
    if len(specs) != len(leaves):  # an annotated node flattened differently: a reader bug
        raise RuntimeError(f"{strategy}: found {len(specs)} arrays, expected {len(leaves)}.")
    return jax.tree_util.tree_unflatten(treedef, specs)


def sharded(
    mesh: jax.sharding.Mesh | None = None,
    rules: Rules | None = None,
    *,
    axis: str | tuple[str, ...] = "data",
    fsdp: bool = False,
    donate: bool = False,
    steps_per_call: StepsPerCall = 1,
    accumulate_steps: int = 1,
) -> Strategy:
    """Model parallelism from rules: each state array placed by :func:`partition_specs`.

    The batch is split along its first axis over ``axis`` and ``jax.jit`` compiles the step
    with those shardings; results equal ``"jit"``. Use ``AxisType.Auto`` mesh axes.

    Args:
        mesh: the device mesh (default: every device on ``axis``).
        rules: ``[(regex, PartitionSpec), ...]`` (or a dict, or a function) matched against
            paths like ``params/dense1/kernel``; the first match wins.
        axis: the mesh axis (or axes) the batch is split over.
        fsdp: also split each array over ``axis`` (see :func:`fsdp`).
        donate, steps_per_call, accumulate_steps: see :func:`~ciclo.managed.jit`.

    Example:
        >>> import ciclo, jax
        >>> from jax.sharding import AxisType, PartitionSpec as P
        >>> mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
        >>> strategy = ciclo.managed.sharded(mesh, [("kernel", P(None, "model"))])
        >>> strategy.name
        'sharded'
    """
    return _sharded("sharded", mesh, rules, axis, fsdp, donate, steps_per_call, accumulate_steps)


def fsdp(
    mesh: jax.sharding.Mesh | None = None,
    rules: Rules | None = None,
    *,
    axis: str | tuple[str, ...] = "data",
    donate: bool = False,
    steps_per_call: StepsPerCall = 1,
    accumulate_steps: int = 1,
) -> Strategy:
    """Fully sharded data parallelism: :func:`sharded` with ``fsdp=True``.

    Each state array is split over ``axis`` along its largest dimension that divides by the
    axis's size (replicated when none does); ``rules`` may split over other axes too.

    Args:
        mesh: the device mesh (default: every device on ``axis``).
        rules: as in :func:`sharded`.
        axis: the data axis (or axes).
        donate, steps_per_call, accumulate_steps: see :func:`~ciclo.managed.jit`.

    Example:
        >>> import ciclo, jax.numpy as jnp, optax
        >>> state = ciclo.managed.ManagedState.create(
        ...     params={"w": jnp.zeros((64, 8))}, tx=optax.sgd(0.1), strategy="fsdp"
        ... )
        >>> state.params["w"].sharding.spec == jax.sharding.PartitionSpec("data")
        True
    """
    return _sharded("fsdp", mesh, rules, axis, True, donate, steps_per_call, accumulate_steps)


def _sharded(
    name: str,
    mesh: jax.sharding.Mesh | None,
    rules: Rules | None,
    axis: str | tuple[str, ...],
    fsdp: bool,
    donate: bool,
    steps_per_call: StepsPerCall,
    accumulate_steps: int,
) -> Strategy:
    from jax.sharding import NamedSharding

    steps_per_call, accumulate_steps = step_counts(name, steps_per_call, accumulate_steps)
    mesh = data_mesh(name, mesh, axis)
    match = _matcher(rules, name)  # checks the rules now, not at the first step
    replicated = NamedSharding(mesh, partition_spec())
    fsdp_axis = axis if fsdp else None

    def shardings_of(state: Any) -> Any:
        specs = _partition_specs(state, match, mesh, fsdp_axis, name)
        return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)

    def place_state(state: Any) -> Any:
        return put_global(state, shardings_of(state))

    def compile_step(fn: StepFn) -> StepFn:
        cache: dict[Any, tuple[StepFn, list[Any]]] = {}

        def run(state: Any, batch: Any, broadcasts: Any) -> Any:
            leaves, treedef = jax.tree_util.tree_flatten(state)
            key = (treedef, tuple(np.shape(leaf) for leaf in leaves))
            entry = cache.get(key)
            if entry is None:
                shardings = shardings_of(state)
                compiled: StepFn = jax.jit(
                    fn,
                    in_shardings=(shardings, None, replicated),
                    out_shardings=(replicated, shardings),
                    donate_argnums=(0,) if donate else (),
                )
                entry = cache[key] = (compiled, jax.tree_util.tree_leaves(shardings))
            jitted, targets = entry
            try:
                return jitted(state, batch, broadcasts)
            except ValueError:
                # jit does not move sharded arguments: place a state made elsewhere
                if all(
                    getattr(leaf, "sharding", target) == target
                    for leaf, target in zip(leaves, targets, strict=True)
                ):
                    raise
                placed = put_global(leaves, targets)
                state = jax.tree_util.tree_unflatten(treedef, placed)
                return jitted(state, batch, broadcasts)

        return run

    return Strategy(
        name,
        place_state,
        batch_placer(name, mesh, axis),
        compile_step,
        steps_per_call=steps_per_call,
        accumulate_steps=accumulate_steps,
        place_broadcasts=broadcast_placer(replicated),
    )


register_built_in("sharded", sharded)
register_built_in("fsdp", fsdp)
