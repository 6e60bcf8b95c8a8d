"""``lazy_state``: a run's initial state, built only when no checkpoint replaces it.

A resume only traces ``new_state`` (``jax.make_jaxpr``) for the shapes, dtypes and
placement to restore into; each array's placement is the sharding of the ``device_put`` or
``jit`` that made it, or its type's; an array placed nowhere stays uncommitted.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import jax
from jax.extend import core as jex_core

T = TypeVar("T")

_NOT_CALLABLE = (
    "ciclo.lazy_state(fn) takes a function of no arguments returning the initial state, got "
    "{got!r}: pass lazy_state(new_state), not lazy_state(new_state())."
)
_NOT_ARRAYS = (
    "ciclo.lazy_state({fn!r}): a resume traces the function: return a pytree of arrays and "
    "numbers (other values in its static part), or give the built state."
)
_UNPLACED = (
    "ciclo.lazy_state: {path} is sharded over {mesh}, whose devices the function never names: "
    "place the state with jax.device_put inside it, or run the loop inside jax.set_mesh(mesh)."
)


class LazyState(Generic[T]):
    """A run's initial state, built by ``build()`` only when no checkpoint replaces it.

    Give it to ``ciclo.loop`` or ``ciclo.train_loop`` in place of a state, with ``resume=``;
    the state must be a pytree of arrays.

    Args:
        build: a function of no arguments returning the initial state.

    Example:
        >>> import ciclo, jax, jax.numpy as jnp, numpy as np, tempfile
        >>> def new_state():
        ...     return {"w": jnp.zeros(3)}
        >>> @jax.jit
        ... def train_step(state, batch):
        ...     return None, {"w": state["w"] + batch}
        >>> directory = tempfile.mkdtemp()
        >>> run = lambda stop: ciclo.loop(
        ...     ciclo.lazy_state(new_state), [np.ones(3)] * 10,
        ...     {ciclo.every(1): train_step, ciclo.every(2): ciclo.checkpoint(directory)},
        ...     stop=stop, resume=directory,
        ... )
        >>> _ = run(4)  # a fresh start: new_state() is built
        >>> state, _, elapsed = run(6)  # a resume: new_state is only traced
        >>> elapsed.steps, state["w"].tolist()
        (6, [6.0, 6.0, 6.0])
    """

    def __init__(self, build: Callable[[], T]) -> None:
        if not callable(build):
            raise TypeError(_NOT_CALLABLE.format(got=build))
        try:
            inspect.signature(build).bind()
        except TypeError:
            raise TypeError(
                _NOT_CALLABLE.format(got=build) + " Bind its arguments first."
            ) from None
        except ValueError:  # no signature to read (some builtins): called as it is
            pass
        self.build = build
        self._shapes: Any = None

    def __repr__(self) -> str:
        return f"lazy_state({getattr(self.build, '__qualname__', self.build)!r})"

    def shapes(self) -> Any:
        """The state ``build()`` would return, with each array a ``jax.ShapeDtypeStruct``
        carrying the sharding it would have (``None``: the default device, uncommitted).
        Traced once, then kept."""
        if self._shapes is None:
            try:
                closed, shapes = jax.make_jaxpr(self.build, return_shape=True)()
            except TypeError as error:
                if "not a valid JAX type" in str(error):
                    error.add_note(_NOT_ARRAYS.format(fn=self.build))
                raise
            self._shapes = _placed(closed, shapes)
        return self._shapes


lazy_state = LazyState


def is_shapes(tree: Any) -> bool:
    """Whether ``tree`` (a state) holds ``jax.ShapeDtypeStruct`` leaves: the shapes of a
    lazy state, not yet restored or built."""
    return any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree_util.tree_leaves(tree))


def _placed(closed: Any, shapes: Any) -> Any:
    """``shapes`` (what ``closed``, a traced program of no inputs, returns) with each
    sharding concrete: the one of the operation that produced the output, else the one its
    type names, on the concrete mesh of the same shape the program uses."""
    made: dict[Any, Any] = {}  # output variable -> the concrete sharding where it is made
    for eqn in closed.jaxpr.eqns:
        for outvar, sharding in zip(eqn.outvars, _out_shardings(eqn, made), strict=False):
            if isinstance(sharding, jax.Device):
                sharding = jax.sharding.SingleDeviceSharding(sharding)
            if _concrete(sharding):
                made[outvar] = sharding
    meshes = {mesh.abstract_mesh: mesh for mesh in _meshes(closed.jaxpr)}
    ambient = _ambient_mesh()
    if ambient is not None:
        meshes.setdefault(ambient.abstract_mesh, ambient)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    placed = []
    for (path, leaf), outvar in zip(leaves, closed.jaxpr.outvars, strict=True):
        sharding = made.get(outvar) if isinstance(outvar, jex_core.Var) else None
        if sharding is None and leaf.sharding is not None:
            mesh = getattr(leaf.sharding, "mesh", None)
            concrete = meshes.get(mesh) if mesh is not None else None
            if concrete is None:
                where = f"the array {jax.tree_util.keystr(path)}" if path else "the state"
                raise ValueError(_UNPLACED.format(path=where, mesh=mesh))
            sharding = jax.sharding.NamedSharding(
                concrete, leaf.sharding.spec, memory_kind=leaf.sharding.memory_kind
            )
        placed.append(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding))  # type: ignore[no-untyped-call]
    return jax.tree_util.tree_unflatten(treedef, placed)


def _out_shardings(eqn: Any, made: dict[Any, Any]) -> list[Any]:
    """The shardings ``eqn`` gives its outputs: a ``device_put``'s or a ``jit``'s own; else,
    for one output computed from one placed input, of the same shape (an elementwise
    operation) or its key (``random_wrap``), the input's."""
    params = eqn.params
    if "devices" in params:  # device_put
        return list(params["devices"])
    if "out_shardings" in params:  # jit
        return list(params["out_shardings"])
    inputs = [v for v in eqn.invars if isinstance(v, jex_core.Var) and v in made]
    if len(eqn.outvars) != 1 or len(inputs) != 1:
        return []
    source, out = inputs[0].aval, eqn.outvars[0].aval
    if (
        getattr(out, "shape", None) == getattr(source, "shape", ())
        or eqn.primitive.name == "random_wrap"
    ):
        return [made[inputs[0]]]
    return []


def _concrete(sharding: Any) -> bool:
    return isinstance(sharding, jax.sharding.Sharding) and not isinstance(
        getattr(sharding, "mesh", None), jax.sharding.AbstractMesh
    )


def _meshes(jaxpr: Any) -> Iterator[jax.sharding.Mesh]:
    """Every concrete mesh the shardings of ``jaxpr``'s operations name, nested ones too."""
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                mesh = getattr(item, "mesh", None)
                if isinstance(mesh, jax.sharding.Mesh):
                    yield mesh
                inner = getattr(item, "jaxpr", None)  # a ClosedJaxpr, or a Jaxpr's own
                if isinstance(item, jex_core.ClosedJaxpr):
                    yield from _meshes(item.jaxpr)
                elif isinstance(item, jex_core.Jaxpr):
                    yield from _meshes(item)
                elif isinstance(inner, jex_core.Jaxpr):
                    yield from _meshes(inner)


def _ambient_mesh() -> jax.sharding.Mesh | None:
    """The concrete mesh of ``jax.set_mesh(...)`` around the loop, if any."""
    get_mesh = getattr(jax.sharding, "get_mesh", None)
    if get_mesh is None:
        return None
    mesh = get_mesh()
    return mesh if isinstance(mesh, jax.sharding.Mesh) and not mesh.empty else None
