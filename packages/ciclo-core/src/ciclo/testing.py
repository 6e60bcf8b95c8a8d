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

from ._processes._loopback import LoopbackRun as LoopbackRun
from ._processes._loopback import free_port as free_port
from ._processes._loopback import join_loopback as join_loopback
from ._processes._loopback import run_on_loopback as run_on_loopback
from .adapters._conformance import CHECKS as CHECKS
from .adapters._conformance import CLASSES as CLASSES
from .adapters._conformance import FEATURES as FEATURES
from .adapters._conformance import AdapterConformance as AdapterConformance
from .adapters._conformance import accuracy as accuracy
from .adapters._conformance import batches as batches
from .adapters._conformance import classification_data as classification_data
from .adapters._conformance import image_data as image_data
from .adapters._conformance import sample_inputs as sample_inputs
