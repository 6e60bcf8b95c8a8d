"""NNX objects restored in place when a loop resumes.

The Flax NNX tutorial's steps mutate a model and an optimizer they capture (``train_step(
model, optimizer, batch)`` called from a closure). When such a run is resumed with
``ciclo.loop((model, optimizer), ..., resume=directory)``, the checkpoint's values are copied
into those objects with ``nnx.update`` instead of into new ones that the steps never see.
"""

from __future__ import annotations

from typing import Any

import ciclo

__all__ = ["register"]


def _update_object(original: Any, restored: Any) -> None:
    from flax import nnx

    nnx.update(original, nnx.state(restored))


def _update_variable(original: Any, restored: Any) -> None:
    original.set_value(restored.get_value())


def register() -> None:
    """Registers NNX's objects (modules, optimizers, metrics: every ``nnx.Pytree``) and
    variables with :func:`ciclo.adapters.register_restore_in_place` (done on ``import
    ciclo_flax``, and by core through the ``ciclo.restore_in_place`` entry point when a loop
    resumes with flax imported).

    Example:
        >>> import ciclo_flax  # registers them
        >>> from flax import nnx
        >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        >>> restored = nnx.Linear(2, 1, rngs=nnx.Rngs(1))
        >>> _update_object(model, restored)  # what a resumed loop does to the state's model
        >>> bool((model.kernel[...] == restored.kernel[...]).all())
        True
    """
    from flax import nnx

    base = getattr(nnx, "Pytree", None) or nnx.Object
    ciclo.adapters.register_restore_in_place(base, _update_object)
    ciclo.adapters.register_restore_in_place(nnx.Variable, _update_variable)


register()  # on import of ciclo_flax
