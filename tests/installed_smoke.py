"""A smoke test of the *installed* ciclo packages, run by ``nox -s wheels`` in a fresh
virtual environment holding only the built wheels (not collected by pytest).

    python installed_smoke.py core|flax|haiku|equinox

Checks that the packages come from the wheels (site-packages, not the source tree), carry
their metadata (version, licence, ``py.typed``, entry point), and train: a managed state
with ``train_loop``, a checkpoint and its restore, and for an adapter a model of its
framework built through ``ciclo``'s lazy forwards.
"""

from __future__ import annotations

import sys
import tempfile
from importlib import metadata
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax

import ciclo

DISTRIBUTIONS = {
    "core": ("ciclo-core", "ciclo"),
    "flax": ("ciclo-flax", "ciclo_flax"),
    "haiku": ("ciclo-haiku", "ciclo_haiku"),
    "equinox": ("ciclo-equinox", "ciclo_equinox"),
}
LOSSES = {"loss": optax.softmax_cross_entropy_with_integer_labels}
METRICS = {"accuracy": lambda logits, labels: logits.argmax(-1) == labels}


def check_installed(distribution: str, module_name: str) -> None:
    module = __import__(module_name)
    location = Path(module.__file__).resolve()
    assert "site-packages" in location.parts, f"{module_name} comes from {location}"
    assert location.parent.parent.name != "src", f"{module_name} is the source tree"
    dist = metadata.distribution(distribution)
    assert module.__version__ == dist.version, (module.__version__, dist.version)
    assert (location.parent / "py.typed").is_file(), f"{module_name} has no py.typed"
    files = [str(f) for f in dist.files or []]
    assert any(f.endswith("LICENSE") for f in files), f"{distribution}: no LICENSE in {files}"
    assert dist.metadata["License-Expression"] == "MIT", dist.metadata["License-Expression"]
    direct_url = dist.read_text("direct_url.json") or ""
    assert "editable" not in direct_url, f"{distribution} is an editable install: {direct_url}"
    print(f"{distribution} {dist.version} from {location.parent}")


def classification(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int32)


def check_core() -> None:
    x, y = classification()
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]

    @ciclo.managed.train_step
    def train_step(state, batch):
        inputs, labels = batch
        logits = inputs @ state.params["w"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return ciclo.logs().add_loss("loss", loss), state

    state = ciclo.managed.ManagedState.create(params={"w": jnp.zeros((3, 2))}, tx=optax.adam(0.1))
    with tempfile.TemporaryDirectory() as directory:
        state, history, elapsed = ciclo.loop(
            state,
            batches * 3,
            {ciclo.every(1): train_step, ciclo.every(4): ciclo.checkpoint(directory)},
        )
        restored = ciclo.restore(directory, state)
    assert elapsed.steps == 12
    assert restored.elapsed.steps == 12
    np.testing.assert_array_equal(restored.state.params["w"], state.params["w"])
    assert history.collect("loss")[-1] < history.collect("loss")[0]


def check_adapter(name: str) -> None:
    assert name in ciclo.adapters.installed_adapters(), ciclo.adapters.installed_adapters()
    x, y = classification()
    common = {"losses": LOSSES, "metrics": METRICS}
    if name == "flax":
        import flax.linen as nn

        state = ciclo.create_state(nn.Dense(2), x[:1], optax.adam(0.1), **common)
    elif name == "haiku":
        import haiku as hk

        state = ciclo.create_haiku_state(
            lambda v: hk.Linear(2)(v), x[:1], optax.adam(0.1), **common
        )
    else:
        import equinox as eqx
        import jax

        linear = eqx.nn.Linear(3, 2, key=jax.random.key(0))
        state = ciclo.create_state(linear, optax.adam(0.1), vmap=True, **common)
    assert type(state).__module__.startswith(DISTRIBUTIONS[name][1]), type(state)
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 48, 16)]
    state, history, _ = ciclo.train_loop(
        state, batches * 4, test_dataset=lambda: [(x[48:], y[48:])], epoch_duration=3
    )
    assert int(state.step) == 12
    assert history.collect("accuracy_test")[-1] >= 0.75, history.collect("accuracy_test")


def main(name: str) -> None:
    check_installed(*DISTRIBUTIONS["core"])
    check_core()
    if name == "core":
        assert ciclo.adapters.installed_adapters() == []
        try:
            ciclo.create_flax_state()
        except ciclo.adapters.AdapterNotInstalledError as error:
            message = str(error)
        else:
            raise AssertionError("create_flax_state without ciclo-flax did not raise")
        assert "pip install ciclo-flax" in message, message
    else:
        check_installed(*DISTRIBUTIONS[name])
        check_adapter(name)
    print(f"smoke test of the installed {name} packages: ok")


if __name__ == "__main__":
    main(sys.argv[1])
