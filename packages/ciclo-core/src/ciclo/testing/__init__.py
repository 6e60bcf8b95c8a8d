"""Testing tools: the adapter conformance suite (the checks every ciclo adapter passes),
and a job of several processes on one machine for tests of multi-process code
(:func:`run_on_loopback`, :func:`join_loopback`; see docs/multihost.md).

Importing this module imports pytest (``import ciclo`` does not). An adapter runs the whole
suite by subclassing :class:`AdapterConformance` in a test file with two methods (a model
with dropout and batch norm for a small classification problem, and how to build its state);
skipping a check needs a written reason in ``skip``. See ``docs/adapters.md``.

Example::

    import ciclo.testing, ciclo_flax

    class TestFlaxConformance(ciclo.testing.AdapterConformance):
        adapter = "flax"

        def make_model(self):
            return MLP()  # dropout + batch norm, FEATURES inputs, CLASSES outputs

        def create_state(self, model, **kwargs):
            return ciclo_flax.create_state(model, ciclo.testing.sample_inputs(), **kwargs)
"""

import typing as _typing

from .._deprecated import deprecated_getattr as _deprecated_getattr
from .._processes._loopback import free_port, join_loopback, run_on_loopback
from ._conformance import (
    CHECKS,
    CLASSES,
    FEATURES,
    AdapterConformance,
    accuracy,
    batches,
    image_data,
    sample_inputs,
)

# fmt: off
__all__ = [
    "AdapterConformance", "CHECKS", "FEATURES", "CLASSES", "sample_inputs", "accuracy",
    "image_data", "batches", "run_on_loopback", "join_loopback", "free_port",
]
# fmt: on

if not _typing.TYPE_CHECKING:  # old spellings warn for one release (ciclo/_deprecated.py)
    __getattr__ = _deprecated_getattr(__name__)
