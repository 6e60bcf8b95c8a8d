"""NNX code as users write it (issue 21): the Flax MNIST tutorial's CNN, which takes
``rngs`` at call time, and the tutorial's own steps, which mutate a model and an optimizer
they capture, killed and resumed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import ciclo
import ciclo_flax
from ciclo.testing import accuracy, batches
from ciclo.testing import image_data as images

CE = optax.softmax_cross_entropy_with_integer_labels
CLASSES = 6


class CNN(nnx.Module):
    """The Flax NNX MNIST tutorial's CNN, as written there (smaller): its dropout layers
    hold no RNG and take ``rngs`` at call time."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.batch_norm1 = nnx.BatchNorm(8, rngs=rngs)
        self.dropout1 = nnx.Dropout(rate=0.025)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(4 * 4 * 8, 32, rngs=rngs)
        self.dropout2 = nnx.Dropout(rate=0.025)
        self.linear2 = nnx.Linear(32, CLASSES, rngs=rngs)

    def __call__(self, x, rngs: nnx.Rngs | None = None):
        x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
        x = x.reshape(x.shape[0], -1)
        x = self.dropout2(nnx.relu(self.linear1(x)), rngs=rngs)
        return self.linear2(x)


def test_the_tutorial_cnn_trains_with_rngs_passed_at_call_time():
    x, y = images(512, seed=0)
    xt, yt = images(256, seed=1)
    state = ciclo_flax.create_nnx_state(
        CNN(rngs=nnx.Rngs(0)), optax.adam(5e-3), losses={"loss": CE}, metrics={"acc": accuracy}
    )
    assert state.rngs_arg == "rngs"
    state, history, _ = ciclo.train_loop(
        state, batches(x, y, 32, epochs=3), test_dataset=lambda: batches(xt, yt, 64)
    )
    assert history.collect("acc_test")[-1] > 0.9


class Dropped(nnx.Module):
    def __init__(self):
        self.dropout = nnx.Dropout(rate=0.5)
        self.scale = nnx.Param(jnp.ones(()))

    def __call__(self, x, rngs=None):
        return self.dropout(x * self.scale, rngs=rngs)


def test_the_call_rngs_come_from_the_step_key():
    state = ciclo_flax.create_nnx_state(Dropped(), optax.sgd(0.1), losses=None, key=0)
    x = jnp.ones((4, 16))
    run = partial(state.apply, state.params, state.model_state, x)
    # apply returns (preds, model_state, sown logs), as for Linen
    a = run(training=True, key=jax.random.key(1))[0]
    b = run(training=True, key=jax.random.key(2))[0]
    again = run(training=True, key=jax.random.key(1))[0]
    assert not np.array_equal(a, b)  # a fresh mask per step
    np.testing.assert_array_equal(a, again)  # reproducible from the key
    evaluated = run(training=False, key=jax.random.key(1))[0]
    np.testing.assert_array_equal(evaluated, x)  # no dropout in evaluation


def test_rngs_arg_none_passes_nothing_and_a_wrong_name_is_an_error():
    state = ciclo_flax.create_nnx_state(Dropped(), optax.sgd(0.1), losses=None, rngs_arg=None)
    assert state.rngs_arg is None
    with pytest.raises(TypeError, match=r"rngs_arg='noise', but Dropped.__call__ takes no"):
        ciclo_flax.create_nnx_state(Dropped(), optax.sgd(0.1), losses=None, rngs_arg="noise")


# --- the tutorial's own steps, killed and resumed ------------------------------------------

OWN_STEPS = textwrap.dedent(
    """
    import jax, numpy as np, optax
    from flax import nnx
    import ciclo

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 3, rngs=rngs)
            self.dropout = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x):
            return self.dropout(self.linear(x))

    rng = np.random.default_rng(0)
    BATCHES = [
        (rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, 8)) for _ in range(12)
    ]

    @nnx.jit
    def train_step(model, optimizer, batch):
        x, y = batch

        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def train(directory, crash_at=None):
        model = Model(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)

        def step(state, batch, elapsed):  # the tutorial's step, closing over both objects
            if elapsed.steps == crash_at:
                raise RuntimeError("the machine went away")
            return ciclo.logs().add_loss("loss", train_step(model, optimizer, batch))

        tasks = {ciclo.every(1): step, ciclo.every(4): ciclo.checkpoint(directory)}
        state, history, elapsed = ciclo.loop(
            (model, optimizer), BATCHES, tasks, resume=directory
        )
        assert state[0] is model and state[1] is optimizer
        return model, optimizer, history, elapsed

    def leaves(*objects):  # params, optimizer state, RNG keys and counts
        def plain(x):
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                x = jax.random.key_data(x)
            return np.asarray(x)

        return [plain(x) for x in jax.tree_util.tree_leaves(nnx.state(objects))]
    """
)


def own_steps_namespace():
    namespace: dict = {}
    exec(compile(OWN_STEPS, "<own steps>", "exec"), namespace)
    return namespace


def test_an_nnx_own_step_run_killed_and_resumed_ends_equal_to_an_uninterrupted_one(tmp_path):
    run = own_steps_namespace()
    with pytest.raises(RuntimeError, match="went away"):
        run["train"](str(tmp_path / "resumed"), crash_at=6)
    model, optimizer, history, elapsed = run["train"](str(tmp_path / "resumed"))
    ref_model, ref_optimizer, ref_history, _ = run["train"](str(tmp_path / "uninterrupted"))
    assert elapsed.steps == 12
    assert history.collect("loss") == ref_history.collect("loss")
    for a, b in zip(
        run["leaves"](model, optimizer), run["leaves"](ref_model, ref_optimizer), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_without_importing_ciclo_flax_the_entry_point_restores_in_place(tmp_path):
    # The tutorial's code imports flax and ciclo only: core finds the in-place restore of
    # NNX objects on the flax adapter's record, loaded through the ciclo.adapters entry point.
    code = OWN_STEPS + textwrap.dedent(
        f"""
        import sys
        try:
            train({str(tmp_path)!r}, crash_at=6)
        except RuntimeError:
            pass
        model, optimizer, history, _ = train({str(tmp_path)!r})
        ref_model, ref_optimizer, ref_history, _ = train({str(tmp_path / "ref")!r})
        assert history.collect("loss") == ref_history.collect("loss")
        for a, b in zip(leaves(model, optimizer), leaves(ref_model, ref_optimizer)):
            np.testing.assert_array_equal(a, b)
        assert "ciclo_flax" in sys.modules  # loaded by the entry point, at resume only
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
