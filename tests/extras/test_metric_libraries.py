"""Loss and metric objects of jax_metrics, clu.metrics and flax.nnx.metrics in every
adapter's ``create_state``: they train on digits, and their values equal the plain
callables' (sample-weighted in the test loop, fused steps and data-parallel included)."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

import ciclo

clu_metrics = pytest.importorskip("clu.metrics")
jm = pytest.importorskip("jax_metrics")
nnx = pytest.importorskip("flax.nnx")

STEPS, BATCH = 150, 64


def digits():
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


X_TRAIN, Y_TRAIN, X_TEST, Y_TEST = digits()


def batches():
    rng = np.random.default_rng(0)
    while True:
        rows = rng.choice(len(X_TRAIN), BATCH, replace=False)
        yield X_TRAIN[rows], Y_TRAIN[rows]


def eval_batches(size=100):  # 100: the last batch is smaller, sample weighting matters
    return [(X_TEST[i : i + size], Y_TEST[i : i + size]) for i in range(0, 360, size)]


def plain_accuracy(logits, labels):
    return logits.argmax(-1) == labels


LOSSES = {"loss": jm.losses.Crossentropy()}
METRICS = {
    "accuracy": plain_accuracy,
    "optax_loss": optax.softmax_cross_entropy_with_integer_labels,
    "jm_accuracy": jm.metrics.Accuracy(),
    "clu_accuracy": clu_metrics.Accuracy,
    # a Collection: one entry per metric; Average.from_output reads the step's loss
    **{
        "clu": clu_metrics.Collection.create(
            clu_col_accuracy=clu_metrics.Accuracy,
            clu_loss=clu_metrics.Average.from_output("loss"),
        )
    },
    "nnx_accuracy": nnx.metrics.Accuracy(),
    "nnx_loss": nnx.metrics.Average("loss"),
}
LIBRARY_ACCURACIES = ["jm_accuracy", "clu_accuracy", "clu_col_accuracy", "nnx_accuracy"]


def make_state(adapter: str, strategy: str | ciclo.managed.Strategy = "jit"):
    tx = optax.adam(1e-2)
    common = {"losses": LOSSES, "metrics": METRICS, "key": 0, "strategy": strategy}
    if adapter == "linen":
        import flax.linen as nn

        import ciclo_flax

        class MLP(nn.Module):
            @nn.compact
            def __call__(self, x):
                return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))

        return ciclo_flax.create_state(MLP(), X_TRAIN[:1], tx, **common)
    if adapter == "nnx":
        import ciclo_flax

        class NNXMLP(nnx.Module):
            def __init__(self, rngs):
                self.hidden = nnx.Linear(64, 64, rngs=rngs)
                self.out = nnx.Linear(64, 10, rngs=rngs)

            def __call__(self, x):
                return self.out(jax.nn.relu(self.hidden(x)))

        return ciclo_flax.create_nnx_state(NNXMLP(nnx.Rngs(0)), tx, **common)
    if adapter == "haiku":
        import haiku as hk

        import ciclo_haiku

        def mlp(x):
            return hk.nets.MLP([64, 10])(x)

        return ciclo_haiku.create_state(mlp, X_TRAIN[:1], tx, **common)
    import equinox as eqx

    import ciclo_equinox

    model = eqx.nn.MLP(64, 10, 64, 1, key=jax.random.key(0))
    return ciclo_equinox.create_state(model, tx, vmap=True, **common)


def train(state, eval_size=100):
    return ciclo.train_loop(
        state,
        batches(),
        test_dataset=lambda: eval_batches(eval_size),
        epoch_duration=STEPS,
        stop=STEPS,
    )


@pytest.mark.parametrize("adapter", ["linen", "nnx", "haiku", "equinox"])
def test_library_losses_and_metrics_train_and_equal_the_plain_ones(adapter):
    _, history, _ = train(make_state(adapter))
    accuracy = history.collect("accuracy_test")[-1]
    assert accuracy > 0.9  # the usual accuracy of this MLP on digits
    for name in LIBRARY_ACCURACIES:
        np.testing.assert_allclose(history.collect(f"{name}_test")[-1], accuracy, rtol=1e-5)
    # the jax_metrics loss trained the model and equals optax's, in training and in test
    np.testing.assert_allclose(
        history.collect("loss_test")[-1], history.collect("optax_loss_test")[-1], rtol=1e-5
    )
    for name in ("clu_loss", "nnx_loss"):
        np.testing.assert_allclose(
            history.collect(f"{name}_test")[-1], history.collect("loss_test")[-1], rtol=1e-5
        )
    train_rows = history.collect("loss", "optax_loss", "jm_accuracy", "accuracy")
    for loss, optax_loss, jm_accuracy, plain in zip(*train_rows, strict=True):
        np.testing.assert_allclose(loss, optax_loss, rtol=1e-5)
        np.testing.assert_allclose(jm_accuracy, plain, rtol=1e-5)


def test_sample_weighted_over_the_whole_test_set():
    state, _, _ = train(make_state("linen"))
    logs = ciclo.test_loop(state, eval_batches())[1]
    whole = ciclo.test_loop(state, [(X_TEST, Y_TEST)])[1]  # one batch: the whole set
    for name in ("accuracy", "loss", *LIBRARY_ACCURACIES, "clu_loss", "nnx_loss"):
        np.testing.assert_allclose(logs.entry_value(name), whole.entry_value(name), rtol=1e-5)


@pytest.mark.parametrize(
    "strategy",
    [ciclo.managed.jit(steps_per_call=4), "data_parallel"],
    ids=["fused", "data_parallel"],
)
def test_fused_and_data_parallel(strategy):
    _, history, _ = train(make_state("linen", strategy), eval_size=120)  # 8 devices
    accuracy = history.collect("accuracy_test")[-1]
    for name in LIBRARY_ACCURACIES:
        np.testing.assert_allclose(history.collect(f"{name}_test")[-1], accuracy, rtol=1e-5)
    np.testing.assert_allclose(
        history.collect("loss"), history.collect("optax_loss"), rtol=1e-4, atol=1e-6
    )
