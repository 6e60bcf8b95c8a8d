"""The adapter conformance suite: the checks every adapter passes (see ``ciclo.testing``)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

try:
    import pytest
except ImportError as error:  # pragma: no cover - pytest is a test dependency
    raise ImportError(
        "ciclo.testing runs the adapter conformance suite with pytest: pip install pytest"
    ) from error

from .._checkpoint._callback import checkpoint
from .._checkpoint._restore import restore
from .._loops._loop import loop
from .._loops._predict import predict_loop
from .._loops._train import train_loop
from .._plugins._discovery import adapter_for, get_adapter, registered_extras
from .._records._logs import Logs
from .._time._schedules import every
from ..adapters import AdapterState, mean_metric

__all__ = [
    "CLASSES",
    "CHECKS",
    "FEATURES",
    "AdapterConformance",
    "accuracy",
    "classification_data",
    "sample_inputs",
]

#: The size of the inputs of the conformance problem: ``(batch, FEATURES)`` float32.
FEATURES = 16
#: The number of classes: targets are int32 labels in ``[0, CLASSES)``.
CLASSES = 4

CE = optax.softmax_cross_entropy_with_integer_labels
#: The batch size of every check, so that the checks share their compiled steps.
BATCH = 16


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example accuracy of ``logits`` for integer ``labels``."""
    return logits.argmax(-1) == labels


def classification_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` examples of a small, well-separated classification problem:
    ``(inputs (n, FEATURES) float32, labels (n,) int32)``."""
    centers = np.random.default_rng(1234).normal(size=(CLASSES, FEATURES)).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=n).astype(np.int32)
    inputs = centers[labels] + 0.5 * rng.normal(size=(n, FEATURES)).astype(np.float32)
    return inputs.astype(np.float32), labels


def image_data(n: int, seed: int, classes: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """``n`` small 8x8 one-channel images (NHWC), a class template plus noise, and their
    labels: the data on which the adapters' training tests compare frameworks."""
    templates = np.random.default_rng(0).normal(size=(classes, 8, 8, 1)).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n).astype(np.int32)
    noise = rng.normal(size=(n, 8, 8, 1)).astype(np.float32)
    return templates[labels] + noise, labels


def batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, epochs: int = 1
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(x, y)`` in batches of ``batch_size`` (an incomplete last batch is dropped)."""
    for _ in range(epochs):
        for i in range(0, len(x) - batch_size + 1, batch_size):
            yield x[i : i + batch_size], y[i : i + batch_size]


def sample_inputs(batch_size: int = 2) -> np.ndarray:
    """Inputs to initialize a model for the conformance problem with."""
    return classification_data(batch_size, seed=99)[0]


# Shared across checks so that states built with them hit the same compiled steps.
ADAM = optax.adam(1e-2)
SGD = optax.sgd(0.1)
LOSSES = {"loss": CE}
TWO_LOSSES = {"loss": CE, "again": CE}
METRICS = {"accuracy": accuracy, "exact_accuracy": mean_metric(accuracy)}

#: Every check, by name (the names used in ``skip``).
CHECKS = (
    "create_state",
    "steps_as_methods",
    "steps_as_loop_callbacks",
    "train_loop",
    "no_retrace",
    "convergence",
    "rng",
    "model_state",
    "sample_weights",
    "mapping_batches",
    "losses_and_metrics",
    "losses_with_params",
    "data_parallel",
    "resume_from_arrays",
    "checkpoint",
)


def _leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(_plain(leaf)) for leaf in jax.tree_util.tree_leaves(tree)]


def _plain(leaf: Any) -> Any:
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf)
    return leaf


def _assert_trees_close(
    a: Any, b: Any, what: str, *, rtol: float = 1e-7, atol: float = 0.0
) -> None:
    structure_a: Any = jax.tree_util.tree_structure(a)
    assert structure_a == jax.tree_util.tree_structure(b), what
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=what)


def _differs(a: Any, b: Any) -> bool:
    return any(
        x.shape != y.shape or not np.allclose(x, y)
        for x, y in zip(_leaves(a), _leaves(b), strict=True)
    )


def _batches(n_batches: int, batch_size: int, seed: int) -> Iterator[tuple[Any, Any]]:
    x, y = classification_data(n_batches * batch_size, seed=seed)
    for i in range(n_batches):
        yield x[i * batch_size : (i + 1) * batch_size], y[i * batch_size : (i + 1) * batch_size]


class AdapterConformance:
    """The checks every ciclo adapter passes. Subclass it in a test file:

    Example::

        import ciclo.testing, ciclo_flax, flax.linen as nn

        class MLP(nn.Module):  # dropout and batch norm, FEATURES inputs, CLASSES outputs
            @nn.compact
            def __call__(self, x, training: bool):
                x = nn.Dense(32)(x)
                x = nn.BatchNorm(use_running_average=not training)(x)
                x = nn.Dropout(0.5, deterministic=not training)(nn.relu(x))
                return nn.Dense(ciclo.testing.CLASSES)(x)

        class TestFlaxConformance(ciclo.testing.AdapterConformance):
            adapter = "flax"

            def make_model(self):
                return MLP()

            def create_state(self, model, **kwargs):
                return ciclo_flax.create_state(model, ciclo.testing.sample_inputs(), **kwargs)

    The model classifies ``(batch, FEATURES)`` float32 inputs into ``CLASSES`` logits and
    must use dropout (rate >= 0.3) and batch normalization, so that RNG and mutable model
    state are checked. ``create_state`` receives ``tx``, ``losses``, ``metrics``, ``key``,
    ``strategy`` and batch options (``inputs_key``...) as keywords and passes them on.

    Attributes:
        adapter: the adapter's entry-point name (``"flax"``).
        skip: ``{check name: reason}`` for checks that cannot apply to this adapter; a
            reason is required. Names are listed in ``ciclo.testing.CHECKS``.
    """

    adapter: ClassVar[str]
    skip: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, reason in cls.skip.items():
            if name not in CHECKS:
                raise ValueError(
                    f"{cls.__name__}.skip names an unknown check {name!r}; checks: {CHECKS}."
                )
            if not isinstance(reason, str) or not reason.strip():
                raise ValueError(
                    f"{cls.__name__}.skip[{name!r}] needs a written reason, e.g. "
                    f"skip = {{{name!r}: 'why this check cannot apply to this adapter'}}."
                )

    # --- what an adapter provides ----------------------------------------------------------
    def make_model(self) -> Any:
        """A fresh model with dropout and batch norm for the conformance problem."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_model(self).")

    def create_state(self, model: Any, **kwargs: Any) -> AdapterState:
        """The adapter's ``create_state`` for ``model``, passing ``**kwargs`` on."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement create_state(self, model, **kwargs)."
        )

    # --- helpers ---------------------------------------------------------------------------
    def _check(self, name: str) -> None:
        reason = self.skip.get(name)
        if reason:
            pytest.skip(f"{self.adapter} adapter skips {name!r}: {reason}")

    def state(self, **overrides: Any) -> AdapterState:
        """A state of a fresh model with the suite's defaults (adam, cross-entropy, accuracy,
        key 0, jit), overridden by ``overrides``."""
        kwargs: dict[str, Any] = {
            "tx": ADAM,
            "losses": LOSSES,
            "metrics": METRICS,
            "key": 0,
            "strategy": "jit",
        }
        kwargs.update(overrides)
        return self.create_state(self.make_model(), **kwargs)

    # --- checks ----------------------------------------------------------------------------
    def test_create_state(self) -> None:
        """create_state builds an AdapterState (a pytree with a fresh optimizer), the adapter
        is registered and picked for the model by ciclo.create_state, and it registers
        nothing on import (its extras are on its record)."""
        self._check("create_state")
        model = self.make_model()
        state = self.create_state(model, tx=ADAM, losses=LOSSES, metrics=METRICS, key=0)
        assert isinstance(state, AdapterState), type(state)
        assert int(state.step) == 0
        assert state.strategy.name == "jit"
        assert state.key is not None
        params = jax.tree_util.tree_leaves(state.params)
        assert params, "no parameters"
        assert all(jnp.issubdtype(p.dtype, jnp.floating) for p in params)
        assert jax.tree_util.tree_leaves(state.model_state), "no model state: batch norm?"
        leaves, treedef = jax.tree_util.tree_flatten(state)
        rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
        assert type(rebuilt) is type(state)
        assert get_adapter(self.adapter).name == self.adapter
        assert adapter_for(model).name == self.adapter
        # One plugin mechanism: an adapter's extras are on its record, not registered on
        # import (core reads the record's when it needs them).
        framework = self.adapter.split(".")[0]
        on_import = [t for t in registered_extras() if t.__module__.split(".")[0] == framework]
        assert not on_import, f"registered on import: {on_import}; declare them on the Adapter"

    def test_steps_as_methods(self) -> None:
        """``logs, state = state.train_step(batch)``, and test/predict steps the same way."""
        self._check("steps_as_methods")
        state = self.state()
        x, y = classification_data(BATCH, seed=1)
        logs, trained = state.train_step((x, y))
        assert isinstance(logs, Logs)
        assert logs.losses.loss.shape == ()
        assert logs.metrics.accuracy.shape == ()
        assert int(trained.step) == 1
        assert _differs(trained.params, state.params), "train_step did not change params"
        logs, tested = trained.test_step((x, y))
        assert set(logs) == {"losses", "metrics", "stateful_metrics"}
        assert int(tested.step) == 1
        _assert_trees_close(tested.params, trained.params, "test_step changed params")
        out, predicted = trained.predict_step(x)
        assert out.outputs.predictions.shape == (BATCH, CLASSES)
        out_from_batch, _ = trained.predict_step((x, y))
        _assert_trees_close(out, out_from_batch, "predict_step on (x, y) vs x", rtol=1e-6)
        assert int(predicted.step) == 1

    def test_steps_as_loop_callbacks(self) -> None:
        """The steps of a state work as ``ciclo.loop`` callbacks on the loop's state."""
        self._check("steps_as_loop_callbacks")
        state = self.state()
        state, history, elapsed = loop(
            state,
            _batches(3, BATCH, seed=2),
            {every(1): state.train_step},
            on_start=state.reset_step,
        )
        assert int(state.step) == 3
        assert elapsed.steps == 3
        assert len(history.collect("loss")) == 3
        tested, history, _ = loop(
            state,
            _batches(2, BATCH, seed=3),
            {every(1): [type(state).test_step, state.predict_step]},
        )
        assert int(tested.step) == 3
        assert len(history.collect("accuracy")) == 2
        assert [p.shape for p in history.collect("predictions")] == [(BATCH, CLASSES)] * 2

    def test_train_loop(self) -> None:
        """``ciclo.train_loop`` trains and evaluates after each epoch with the state's own
        steps; ``ciclo.predict_loop`` collects the predictions."""
        self._check("train_loop")
        state, history, elapsed = train_loop(
            self.state(),
            list(_batches(8, BATCH, seed=4)),
            test_dataset=lambda: _batches(2, BATCH, seed=5),
            epoch_duration=4,
            stop=8,
        )
        assert int(state.step) == 8
        assert elapsed.steps == 8
        steps, accuracy = history.collect("steps", "accuracy_test")
        assert steps == [3, 7], f"evaluations after steps {steps}, expected after 4 and 8"
        assert all(0.0 <= a <= 1.0 for a in accuracy)
        _, outputs, _ = predict_loop(state, _batches(2, BATCH, seed=5))
        assert outputs, "predict_loop collected no outputs"

    def test_no_retrace(self) -> None:
        """The second and later calls of each step reuse the compiled step (the state a
        step returns has the structure of the one it got)."""
        self._check("no_retrace")
        state = self.state()
        calls: list[bool] = []
        cls = type(state)
        original = cls.apply

        def counting_apply(self: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs.get("training", False))
            return original(self, *args, **kwargs)

        x, y = classification_data(BATCH, seed=6)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cls, "apply", counting_apply)
            for step in ("train_step", "test_step", "predict_step"):
                _, state = getattr(state, step)((x, y))
                after_first = len(calls)
                for _ in range(2):
                    _, state = getattr(state, step)((x, y))
                assert len(calls) == after_first, f"{step} traced again on a later call"

    def test_convergence(self) -> None:
        """Training on a small classification problem reaches high accuracy."""
        self._check("convergence")
        state = self.state()
        state, _, _ = loop(state, _batches(150, BATCH, seed=7), {every(1): state.train_step})
        _, history, _ = loop(state, _batches(16, BATCH, seed=8), {every(1): state.test_step})
        test_accuracy = float(np.mean(history.collect("accuracy")))
        assert test_accuracy >= 0.9, test_accuracy

    def test_rng(self) -> None:
        """Dropout gets a different key at every step, reproducible from the seed; evaluation
        is deterministic."""
        self._check("rng")
        batch = classification_data(BATCH, seed=9)
        state = self.state()
        loss = float(state.train_step(batch)[0].losses.loss)
        assert float(state.train_step(batch)[0].losses.loss) == loss, "not reproducible"
        assert float(self.state().train_step(batch)[0].losses.loss) == loss, "seed not followed"
        later = state.replace(step=state.step + 1)
        assert float(later.train_step(batch)[0].losses.loss) != loss, "same dropout every step"
        other_key = state.replace(key=jax.random.key(12345))
        assert float(other_key.train_step(batch)[0].losses.loss) != loss, "key ignored"
        evaluation = float(state.test_step(batch)[0].losses.loss)
        assert float(later.test_step(batch)[0].losses.loss) == evaluation
        trained_a = self._train(self.state(), 3)
        trained_b = self._train(self.state(), 3)
        _assert_trees_close(trained_a.params, trained_b.params, "same seed, other params")

    def _train(self, state: AdapterState, steps: int, seed: int = 10) -> AdapterState:
        for batch in _batches(steps, BATCH, seed=seed):
            _, state = state.train_step(batch)
        return state

    def test_model_state(self) -> None:
        """Mutable model state (batch-norm statistics) changes in training and is frozen in
        evaluation, where an example's prediction does not depend on the rest of the batch."""
        self._check("model_state")
        state = self.state()
        x, y = classification_data(BATCH, seed=11)
        _, trained = state.train_step((x, y))
        assert _differs(trained.model_state, state.model_state), "model_state not updated"
        _, tested = trained.test_step((x, y))
        _, predicted = trained.predict_step(x)
        _assert_trees_close(tested.model_state, trained.model_state, "test_step changed it")
        _assert_trees_close(predicted.model_state, trained.model_state, "predict_step did")
        others = classification_data(BATCH, seed=111)[0]
        mixed = np.concatenate([x[:2], others[2:]])
        whole = trained.predict_step(x)[0].outputs.predictions
        among_others = trained.predict_step(mixed)[0].outputs.predictions
        np.testing.assert_allclose(whole[:2], among_others[:2], rtol=1e-4, atol=1e-5)

    def test_sample_weights(self) -> None:
        """Zero-weight examples change neither the logs nor the gradients."""
        self._check("sample_weights")
        state = self.state()
        x, y = classification_data(BATCH, seed=12)
        half = BATCH // 2
        w = np.array([1.0] * half + [0.0] * half, np.float32)
        weighted, _ = state.test_step((x, y, w))
        preds = state.predict_step(x)[0].outputs.predictions[:half]
        first_half_loss = float(jnp.mean(CE(preds, jnp.asarray(y[:half]))))
        assert float(weighted.losses.loss) == pytest.approx(first_half_loss, rel=1e-5)
        first_half_accuracy = float(jnp.mean(accuracy(preds, jnp.asarray(y[:half]))))
        assert float(weighted.metrics.accuracy) == pytest.approx(first_half_accuracy, abs=1e-6)
        scaled, _ = state.test_step((x, y, 3 * w))
        _assert_trees_close(weighted, scaled, "weights are normalized", rtol=1e-5, atol=1e-6)
        wrong = y.copy()
        wrong[half:] = (wrong[half:] + 1) % CLASSES
        _, a = state.train_step((x, y, w))
        _, b = state.train_step((x, wrong, w))
        _, c = state.train_step((x, wrong))
        _assert_trees_close(a.params, b.params, "zero-weight targets changed gradients")
        assert _differs(a.params, c.params)

    def test_mapping_batches(self) -> None:
        """Dict batches give the same result as tuples; their keys are chosen at create_state."""
        self._check("mapping_batches")
        state = self.state()
        x, y = classification_data(BATCH, seed=13)
        w = np.linspace(0.0, 1.0, BATCH).astype(np.float32)
        logs_a, _ = state.test_step({"inputs": x, "targets": y, "sample_weight": w})
        logs_b, _ = state.test_step((x, y, w))
        _assert_trees_close(logs_a, logs_b, "dict vs tuple logs", rtol=1e-6)
        by_key = self.state(inputs_key="image", targets_key="label", sample_weight_key="weight")
        out, _ = by_key.predict_step({"image": x, "label": y})
        expected, _ = state.predict_step(x)
        _assert_trees_close(out, expected, "predictions with chosen keys", rtol=1e-6)

    def test_losses_and_metrics(self) -> None:
        """Several losses are logged and summed into the objective; stateful metrics
        accumulate over evaluation batches and reset."""
        self._check("losses_and_metrics")
        x, y = classification_data(BATCH, seed=14)
        x2, y2 = classification_data(BATCH, seed=141)
        one = self.state(tx=SGD)
        two = self.state(tx=SGD, losses=TWO_LOSSES)
        _, after_one = one.train_step((x, y))
        logs, after_two = two.train_step((x, y))
        assert set(logs.losses) == set(TWO_LOSSES)

        def delta(after: AdapterState, before: AdapterState) -> Any:
            return jax.tree_util.tree_map(lambda p, q: p - q, after.params, before.params)

        twice = jax.tree_util.tree_map(lambda d: 2 * d, delta(after_one, one))
        _assert_trees_close(delta(after_two, two), twice, "2 losses", rtol=1e-4, atol=1e-6)

        state = self.state()
        first, state = state.test_step((x, y))
        second, state = state.test_step((x2, y2))
        mean = (float(first.metrics.accuracy) + float(second.metrics.accuracy)) / 2
        assert float(second.stateful_metrics.exact_accuracy) == pytest.approx(mean, abs=1e-6)
        _, state = state.reset_step()
        logs, _ = state.test_step((x2, y2))
        assert float(logs.stateful_metrics.exact_accuracy) == pytest.approx(
            float(logs.metrics.accuracy), abs=1e-6
        )

    def test_losses_with_params(self) -> None:
        """A loss that asks for ``params`` by name gets the differentiated parameters: the
        gradient of ``0.5 * c * |params|^2`` is ``c * params`` (weight decay)."""
        self._check("losses_with_params")
        decay = 0.1

        def l2(preds: Any, targets: Any, params: Any) -> Any:
            return 0.5 * decay * sum(jnp.sum(p**2) for p in jax.tree_util.tree_leaves(params))

        state = self.state(tx=optax.sgd(1.0), losses={"l2": l2})
        x, y = classification_data(BATCH, seed=15)
        logs, trained = state.train_step((x, y))
        assert float(logs.losses.l2) == pytest.approx(float(l2(None, None, state.params)))
        expected = jax.tree_util.tree_map(lambda p: p - decay * p, state.params)
        _assert_trees_close(trained.params, expected, "l2 gradient", rtol=1e-5, atol=1e-7)

    def test_data_parallel(self) -> None:
        """``strategy="data-parallel"`` over every device computes what ``"jit"`` does."""
        self._check("data_parallel")
        devices = jax.device_count()
        if devices < 2:
            pytest.skip(
                "needs several devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
            )
        batch_size = BATCH if BATCH % devices == 0 else 2 * devices
        # SGD: Adam would turn float noise in a zero gradient (a bias before batch norm)
        # into a full step, so the comparison would test rounding, not the strategy.
        jit_state = self.state(tx=SGD)
        parallel = self.state(tx=SGD, strategy="data-parallel")
        assert parallel.strategy.name == "data-parallel"
        for batch in _batches(2, batch_size, seed=15):
            jit_logs, jit_state = jit_state.train_step(batch)
            parallel_logs, parallel = parallel.train_step(batch)
        tol = {"rtol": 1e-4, "atol": 1e-5}
        _assert_trees_close(parallel_logs, jit_logs, "train logs", **tol)
        _assert_trees_close(parallel.params, jit_state.params, "params", **tol)
        _assert_trees_close(parallel.model_state, jit_state.model_state, "model state", **tol)
        batch = classification_data(batch_size, seed=16)
        _assert_trees_close(
            parallel.test_step(batch)[0], jit_state.test_step(batch)[0], "test", **tol
        )

    def test_resume_from_arrays(self) -> None:
        """A state is all in its arrays: rebuilt from host copies of its leaves (as a
        checkpoint restores it), it trains on exactly as the original."""
        self._check("resume_from_arrays")
        state = self._train(self.state(), 2)
        leaves, treedef = jax.tree_util.tree_flatten(state)
        saved = [np.asarray(_plain(leaf)) for leaf in leaves]
        restored_leaves = [
            jax.random.wrap_key_data(jnp.asarray(s), impl=jax.random.key_impl(leaf))
            if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
            else jnp.asarray(s)
            for s, leaf in zip(saved, leaves, strict=True)
        ]
        restored = jax.tree_util.tree_unflatten(treedef, restored_leaves)
        continued = self._train(state, 2, seed=17)
        resumed = self._train(restored, 2, seed=17)
        _assert_trees_close(resumed.params, continued.params, "resumed params", rtol=1e-6)
        _assert_trees_close(resumed.model_state, continued.model_state, "resumed model state")
        assert int(resumed.step) == 4

    def test_checkpoint(self) -> None:
        """A run interrupted after 4 steps with a ``ciclo.checkpoint`` and resumed from it
        (``resume=``) ends exactly like an uninterrupted run of 8 steps, history included;
        ``ciclo.restore`` gives the same state back."""
        self._check("checkpoint")
        batches = list(_batches(8, BATCH, seed=7))
        reference, reference_history, _ = train_loop(self.state(), batches, stop=8)
        with tempfile.TemporaryDirectory() as tmp:
            directory = f"{tmp}/run"
            for stop in (4, 8):  # the second run resumes from the first one's checkpoint
                resumed, history, elapsed = train_loop(
                    self.state(),
                    batches,
                    callbacks=[checkpoint(directory, async_save=False)],
                    epoch_duration=2,
                    stop=stop,
                    resume=directory,
                )
            restored = restore(directory, self.state())
        assert elapsed.steps == 8
        assert int(resumed.step) == 8
        _assert_trees_close(resumed.params, reference.params, "resumed params", rtol=1e-6)
        _assert_trees_close(resumed.model_state, reference.model_state, "resumed model state")
        assert history.collect("steps", "loss") == reference_history.collect("steps", "loss")
        assert restored.elapsed.steps == 8
        _assert_trees_close(restored.state.params, resumed.params, "restored params", rtol=0)
