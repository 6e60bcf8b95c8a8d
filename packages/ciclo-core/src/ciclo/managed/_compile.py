"""What a managed step compiles: one step as a strategy runs it (gradients of the summed
losses, accumulation over micro-batches, the optimizer update, the strategy's reductions),
and several steps fused into one ``lax.scan``."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._records._aggregate import merge_micro_logs
from .._records._logs import PARAMS_FINITE, Logs
from ._auto import AutoFusion, power_of_2_parts
from ._precision import (
    all_finite,
    apply_scaled_gradients,
    run_in_compute_dtype,
    scale_loss,
    unscale_gradients,
)
from ._strategies import Strategy
from ._trainable import trainable_mask, trainable_part, with_part

__all__ = ["StepFunction", "step_body", "fuse", "run_group"]

#: ``fn(state, batch, broadcasts) -> (logs, state)``: a step's body, as compiled.
StepFunction = Callable[..., tuple[Any, Any]]
#: ``run(state, batch, broadcasts, statics) -> (logs, state)``: the user's step function,
#: its return parsed.
RunStep = Callable[[Any, Any, Any, Any], tuple[Logs, Any]]


def step_body(
    run: RunStep, name: str, *, differentiate: bool, strategy: Strategy, statics: Hashable
) -> StepFunction:
    """One step as ``strategy`` runs it, before compilation: ``(state, batch, broadcasts)
    -> (logs, state)``, with ``statics`` fixed. ``differentiate``: a train step (gradients
    of the sum of ``logs.losses`` w.r.t. ``params``, then the optimizer update); ``name``
    names the step in errors."""
    if not differentiate:

        def evaluate(state: Any, batch: Any, broadcasts: Any) -> tuple[Logs, Any]:
            logs, new_state = run_in_compute_dtype(
                lambda s, b: run(s, b, broadcasts, statics), state, batch
            )
            return strategy.reduce_logs(logs), new_state

        return evaluate

    def train(state: Any, batch: Any, broadcasts: Any) -> tuple[Logs, Any]:
        grads, logs, new_state = _gradients(
            lambda s, b: run(s, b, broadcasts, statics),
            name,
            state,
            batch,
            strategy.accumulate_steps,
        )
        new_state = apply_scaled_gradients(new_state, strategy.reduce_gradients(grads))
        # One scalar, computed here: a NaN that reaches the parameters but not the loss.
        finite = all_finite(new_state.params).astype(jnp.int32)
        return strategy.reduce_logs(logs).add_entry(*PARAMS_FINITE, finite), new_state

    return train


def _gradients(
    run: Callable[[Any, Any], tuple[Logs, Any]],
    name: str,
    state: Any,
    batch: Any,
    micro_steps: int,
) -> tuple[Any, Logs, Any]:
    """Gradients of the total loss w.r.t. ``params``, the logs and the new state; with
    ``micro_steps > 1`` the mean over that many micro-batches of ``batch``."""

    # Only the trainable part is differentiated (trainable=): frozen params are constants.
    mask = trainable_mask(state.params, getattr(state, "trainable", None))
    part = trainable_part(state.params, mask)

    def objective(part: Any, current: Any, batch: Any) -> tuple[jax.Array, Any]:
        # Under a compute_dtype, the cast of params is inside what is differentiated:
        # the gradients are taken w.r.t. (and come back in the dtype of) params.
        params = with_part(state.params, mask, part)
        logs, new_state = run_in_compute_dtype(run, current.replace(params=params), batch)
        loss = scale_loss(state, _total_loss(name, logs))
        return loss, (logs, new_state.replace(params=state.params))

    _check_real_params(name, part)
    gradient = jax.grad(objective, has_aux=True)
    if micro_steps == 1:
        grads, (logs, new_state) = gradient(part, state, batch)
        grads = with_part(state.params, mask, grads, jnp.zeros_like)  # frozen: zeros
        return unscale_gradients(state, grads), logs, new_state

    micro_batches, rows = _split_batch(name, batch, micro_steps)

    def accumulate(carry: Any, micro_batch: Any) -> tuple[Any, Logs]:
        total, current = carry
        grads, (logs, new_state) = gradient(part, current, micro_batch)
        return (jax.tree.map(jnp.add, total, grads), new_state), logs

    zeros = jax.tree.map(jnp.zeros_like, part)
    (total, new_state), logs = jax.lax.scan(accumulate, (zeros, state), micro_batches)
    grads = with_part(
        state.params, mask, jax.tree.map(lambda g: g / micro_steps, total), jnp.zeros_like
    )
    return unscale_gradients(state, grads), merge_micro_logs(logs, rows), new_state


def fuse(body: StepFunction, *, last_row: bool = False) -> StepFunction:
    """``body(state, batch, broadcasts)`` as ``fused(state, batches, broadcasts)``: one
    ``lax.scan`` over the stacked batches, returning the stacked logs and the last state;
    ``last_row``: ``((stacked logs, the last row's), state)`` (a loop's group: a pair
    first, so a strategy's output shardings for ``(logs, state)`` still apply)."""

    def fused(state: Any, batches: tuple[Any, ...], broadcasts: Any) -> Any:
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)

        def scan_step(state: Any, batch: Any) -> tuple[Any, Logs]:
            logs, state = body(state, batch, broadcasts)
            return state, logs

        state, logs = jax.lax.scan(scan_step, state, stacked)
        if last_row:
            return (logs, jax.tree.map(lambda x: x[-1], logs)), state
        return logs, state

    return fused


def run_group(
    run: Callable[[Any, tuple[Any, ...]], Any],
    state: Any,
    batches: Sequence[Any],
    auto: AutoFusion | None,
) -> tuple[Logs, Any, Logs]:
    """A loop's group as calls ``run(state, part) -> ((stacked logs, last row), state)``:
    one call under a fixed K; under ``auto``, calls of powers of 2 (so few sizes compile),
    timed as its dispatch. Returns ``(the logs joined along rows, the last state, the last
    row's logs)``.

    Example:
        >>> import jax.numpy as jnp
        >>> def run(state, part):
        ...     rows = jnp.stack(part)
        ...     return (rows, rows[-1]), state + len(part)
        >>> logs, state, last = run_group(run, 0, [1.0, 2.0, 3.0], None)
        >>> logs.tolist(), state, float(last)
        ([1.0, 2.0, 3.0], 3, 3.0)
    """
    if auto is not None:
        return auto.timed(_run_in_parts, run, state, batches, power_of_2_parts(len(batches)))  # type: ignore[no-any-return]
    return _run_in_parts(run, state, batches, [len(batches)])


def _run_in_parts(
    run: Callable[[Any, tuple[Any, ...]], Any], state: Any, batches: Sequence[Any], parts: list[int]
) -> tuple[Logs, Any, Logs]:
    stacked, start, last = [], 0, Logs()
    for size in parts:
        (logs, last), state = run(state, tuple(batches[start : start + size]))
        stacked.append(logs)
        start += size
    return (stacked[0] if len(stacked) == 1 else _join_rows(stacked)), state, last


@jax.jit
def _join_rows(stacked: list[Logs]) -> Logs:
    """Stacked logs of consecutive calls, as one (rows along the first axis)."""
    return jax.tree.map(lambda *rows: jnp.concatenate(rows), *stacked)  # type: ignore[no-any-return]


_NOT_DIVISIBLE = (
    "managed train step {name}: accumulate_steps={parts} splits each batch into {parts} "
    "micro-batches, but batch leaf {leaf} has {rows} rows (per device under pmap), which is "
    "not a multiple of {parts}. Use a batch size divisible by {parts} (times the device "
    "count under pmap)."
)


def _split_batch(name: str, batch: Any, parts: int) -> tuple[Any, int]:
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
            where = jax.tree_util.keystr(path) or "(the batch)"
            raise ValueError(
                _NOT_DIVISIBLE.format(name=name, parts=parts, leaf=where, rows=leaf.shape[0])
            )
        rows.add(leaf.shape[0] // parts)
        return jnp.moveaxis(leaf.reshape(leaf.shape[0] // parts, parts, *leaf.shape[1:]), 1, 0)

    micro = jax.tree_util.tree_map_with_path(split, batch)
    return micro, (rows.pop() if len(rows) == 1 else -1)


_INTEGER_PARAMS = (
    "managed train step {name}: params hold integer leaves {leaves}, and gradients need "
    "real-valued (float) params. Make them floats, e.g. jnp.asarray(w, jnp.float32), or keep "
    "values that are not trained out of params: ManagedState.create(..., extra={{...}})."
)


def _check_real_params(name: str, params: Any) -> None:
    """Raises a ``TypeError`` naming the integer (or boolean) leaves of ``params``."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    integer = [
        f"{jax.tree_util.keystr(path)} ({jnp.result_type(leaf).name})"
        for path, leaf in leaves
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
    ]
    if integer:
        raise TypeError(_INTEGER_PARAMS.format(name=name, leaves=integer[:5]))


_NO_LOSS = (
    "managed train step {name} logged no loss, so there is nothing to differentiate. Add "
    "one: logs.add_loss('loss', loss) (a scalar); a flat dict {{name: value}} returned as "
    "logs is read as metrics, not losses."
)
_LOSS_NOT_SCALAR = (
    "managed train step {name}: loss {loss!r} has shape {shape}, but a loss must be a "
    "scalar. Reduce it first, e.g. logs.add_loss({loss!r}, per_example_loss.mean())."
)


def _total_loss(name: str, logs: Logs) -> jax.Array:
    losses = logs.get("losses")
    if not losses:
        raise ValueError(_NO_LOSS.format(name=name))
    total = jnp.zeros((), jnp.float32)
    for loss, value in losses.items():
        value = jnp.asarray(value)
        if value.shape != ():
            raise ValueError(_LOSS_NOT_SCALAR.format(name=name, loss=loss, shape=value.shape))
        total = total + value
    return total
