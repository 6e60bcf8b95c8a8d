"""How a step reads its batch: ``(inputs, targets[, sample_weight])`` tuples or mappings
(:class:`BatchFormat`), unpacked into a :class:`Batch`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["Batch", "BatchFormat"]

_BAD_TUPLE = (
    "{step}: a batch tuple must be (inputs, targets[, sample_weight]), got a {kind} of "
    "{items} items; nest several inputs: ((x1, x2), targets)."
)
_NO_INPUTS = (
    "{step}: cannot find inputs and targets in a batch of type {kind}; give (inputs, "
    "targets[, sample_weight]) or a dict with keys {keys} (create_state(..., "
    "inputs_key=..., targets_key=...))."
)
_MISSING_KEYS = (
    "{step}: the batch has keys {keys} but not {missing}. Name the keys when creating the "
    "state: create_state(..., inputs_key=..., targets_key=...) (now {now})."
)


class Batch(NamedTuple):
    """A batch unpacked by :meth:`BatchFormat.unpack`."""

    inputs: Any
    targets: Any = None
    sample_weight: Any = None


@dataclasses.dataclass(frozen=True)
class BatchFormat:
    """How batches are read: tuples ``(inputs, targets)`` / ``(inputs, targets,
    sample_weight)``, or mappings with these keys.

    Attributes:
        inputs_key: the mapping key of the model inputs; a tuple of keys passes a dict of
            those entries to the model.
        targets_key: the mapping key of the targets.
        sample_weight_key: the mapping key of the per-example weights (optional in a batch).
    """

    inputs_key: str | tuple[str, ...] = "inputs"
    targets_key: str = "targets"
    sample_weight_key: str = "sample_weight"

    def unpack(self, batch: Any, *, step: str, targets: bool = True) -> Batch:
        """Splits ``batch`` into :class:`Batch` ``(inputs, targets, sample_weight)``.

        Args:
            batch: the batch given to a step.
            step: the step's name, for error messages.
            targets: whether the step needs targets. Without (``predict_step``), a batch
                that is neither a tuple nor a mapping is the inputs itself, and targets in
                a tuple or mapping are ignored.
        """
        if isinstance(batch, Mapping):
            return self._unpack_mapping(batch, step=step, targets=targets)
        if isinstance(batch, tuple | list):
            if not targets and len(batch) in (1, 2, 3):
                return Batch(batch[0])
            if len(batch) == 2:
                return Batch(batch[0], batch[1])
            if len(batch) == 3:
                return Batch(batch[0], batch[1], batch[2])
            kind = type(batch).__name__
            raise ValueError(_BAD_TUPLE.format(step=step, kind=kind, items=len(batch)))
        if not targets:
            return Batch(batch)
        kind = type(batch).__name__
        raise TypeError(_NO_INPUTS.format(step=step, kind=kind, keys=self._keys_text()))

    def _unpack_mapping(self, batch: Mapping[str, Any], *, step: str, targets: bool) -> Batch:
        input_keys = (self.inputs_key,) if isinstance(self.inputs_key, str) else self.inputs_key
        wanted = [*input_keys, self.targets_key] if targets else list(input_keys)
        missing = [key for key in wanted if key not in batch]
        if missing:
            raise KeyError(
                _MISSING_KEYS.format(
                    step=step, keys=sorted(batch), missing=missing, now=self._keys_text()
                )
            )
        if isinstance(self.inputs_key, str):
            inputs = batch[self.inputs_key]
        else:
            inputs = {key: batch[key] for key in self.inputs_key}
        if not targets:
            return Batch(inputs)
        return Batch(inputs, batch[self.targets_key], batch.get(self.sample_weight_key))

    def _keys_text(self) -> str:
        return (
            f"inputs_key={self.inputs_key!r}, targets_key={self.targets_key!r}, "
            f"sample_weight_key={self.sample_weight_key!r}"
        )
