"""NNX objects restored in place when a loop resumes.

The Flax NNX tutorial's steps mutate a model and an optimizer they capture (``train_step(
model, optimizer, batch)`` called from a closure). When such a run is resumed with
``ciclo.loop((model, optimizer), ..., resume=directory)``, the checkpoint's values are copied
into those objects with ``nnx.update`` instead of into new ones that the steps never see.
Core finds the table on the adapter's record (``ciclo_flax.adapter.restore_in_place``).
"""

from __future__ import annotations

from typing import Any

from flax import nnx

__all__ = ["RESTORE_IN_PLACE"]


def _update_object(original: Any, restored: Any) -> None:
    """Copies the values of the NNX object ``restored`` into ``original``, as a resumed loop
    does to the model and optimizer its steps capture.

    Example:
        >>> from flax import nnx
        >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        >>> restored = nnx.Linear(2, 1, rngs=nnx.Rngs(1))
        >>> _update_object(model, restored)
        >>> bool((model.kernel[...] == restored.kernel[...]).all())
        True
    """
    nnx.update(original, nnx.state(restored))


def _update_variable(original: Any, restored: Any) -> None:
    original.set_value(restored.get_value())


#: NNX's objects (modules, optimizers, metrics: every ``nnx.Pytree``) and variables, each
#: with how a resumed loop updates it in place (``Adapter.restore_in_place``).
RESTORE_IN_PLACE: dict[type, Any] = {
    getattr(nnx, "Pytree", None) or nnx.Object: _update_object,
    nnx.Variable: _update_variable,
}
