"""The adapter conformance suite: the checks every ciclo adapter passes.

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

from .adapters._conformance import CHECKS as CHECKS
from .adapters._conformance import CLASSES as CLASSES
from .adapters._conformance import FEATURES as FEATURES
from .adapters._conformance import AdapterConformance as AdapterConformance
from .adapters._conformance import accuracy as accuracy
from .adapters._conformance import batches as batches
from .adapters._conformance import classification_data as classification_data
from .adapters._conformance import image_data as image_data
from .adapters._conformance import sample_inputs as sample_inputs
