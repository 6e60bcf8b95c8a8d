# ruff: noqa: E501
"""The bad-input suite of the adapters (ciclo-flax linen and nnx, ciclo-haiku,
ciclo-equinox): each case is one line, ``(name, call, error type, match)``; ``match``
asserts that the error names the culprit (the message's start) and the fix (its end).
The core cases are in packages/ciclo-core/tests/test_bad_inputs.py."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest

jax = pytest.importorskip("jax")
ciclo_flax = pytest.importorskip("ciclo_flax")
ciclo_haiku = pytest.importorskip("ciclo_haiku")
ciclo_equinox = pytest.importorskip("ciclo_equinox")

import equinox as eqx  # noqa: E402
import flax.linen as nn  # noqa: E402
import haiku as hk  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import ciclo  # noqa: E402

X = jnp.zeros((4, 3))
Y = jnp.zeros((4, 2))


def MSE(preds: Any, targets: Any) -> Any:
    return jnp.mean((preds - targets) ** 2)


LIN = nn.Dense(2)
NNX = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
HK = hk.transform(lambda x: hk.Linear(2)(x))
EQX = eqx.nn.Linear(3, 2, key=jax.random.key(0))

# fmt: off
CASES = [
    ('flax_module_int', lambda: ciclo_flax.create_state(3, X, optax.sgd(0.1), losses={"mse": MSE}), TypeError, r"ciclo_flax\.create_state\ needs\ a\ flax\.linen\.Mo"),
    ('flax_tx_int', lambda: ciclo_flax.create_state(LIN, X, 3, losses={"mse": MSE}), TypeError, r"tx\ must\ be\ an\ optax\ optimizer\ such\ as\ optax\.a"),
    ('flax_losses_list', lambda: ciclo_flax.create_state(LIN, X, optax.sgd(0.1), losses=[MSE]), TypeError, r"losses\ must\ be\ a\ dict\ \{name:\ fn\(preds,\ target.*cross_entropy_with_integer_labels\}\."),
    ('flax_losses_value_int', lambda: ciclo_flax.create_state(LIN, X, optax.sgd(0.1), losses={"mse": 3}), TypeError, r"losses\['mse'\]\ must\ be\ fn\(preds,\ targets\),\ got.*cross_entropy_with_integer_labels\}\."),
    ('flax_metrics_list', lambda: ciclo_flax.create_state(LIN, X, optax.sgd(0.1), losses={"mse": MSE}, metrics=[MSE]), TypeError, r"metrics\ must\ be\ a\ dict\ \{name:\ fn\(preds,\ targe.*bels:\ logits\.argmax\(\-1\)\ ==\ labels\}\."),
    ('flax_strategy_bad', lambda: ciclo_flax.create_state(LIN, X, optax.sgd(0.1), losses={"mse": MSE}, strategy="nope"), ValueError, r"unknown\ strategy\ 'nope';\ known\ strategies:\ \['.*d\.register_strategy\(name,\ factory\)\."),
    ('flax_training_arg_missing', lambda: ciclo_flax.create_state(LIN, X, optax.sgd(0.1), losses={"mse": MSE}, training_arg="train"), TypeError, r"training_arg='train',\ but\ Dense\.__call__\ take.*s\ training_arg=None\ to\ set\ no\ flag\."),
    ('flax_unknown_option', lambda: ciclo_flax.create_state(LIN, X, optax.sgd(0.1), losses={"mse": MSE}, learning_rate=0.1), TypeError, r"ciclo_flax\.create_state\(\)\ got\ an\ unknown\ keyw.*'training_arg',\ 'tx',\ 'variables'\]\."),
    ('flax_batch_not_tuple', lambda: ciclo.loop(ciclo_flax.create_state(LIN, X, optax.sgd(0.1), losses={"mse": MSE}), [X], {ciclo.every(1): lambda state, batch: state.train_step(batch)}), TypeError, r"FlaxState\.train_step:\ cannot\ find\ inputs\ and\ .*\ inputs_key=\.\.\.,\ targets_key=\.\.\.\)\)\."),
    ('flax_sample_inputs_other_features', lambda: ciclo.loop(ciclo_flax.create_state(LIN, jnp.zeros((4, 5)), optax.sgd(0.1), losses={"mse": MSE}), [(X, Y)], {ciclo.every(1): lambda state, batch: state.train_step(batch)}), ValueError, r"ciclo_flax:\ Dense's\ parameters\ do\ not\ fit\ this\ batch's\ inputs\ \(shapes\ \(4,\ 3\)\).*wrong\ feature\ count.*ciclo_flax\.create_state\(module,\ x_train\[:1\],\ tx,\ \.\.\.\)\."),
    ('nnx_model_int', lambda: ciclo_flax.create_nnx_state(3, optax.sgd(0.1), losses={"mse": MSE}), TypeError, r"ciclo_flax\.create_nnx_state\ needs\ a\ flax\.nnx\..*ate_state\(module,\ inputs,\ tx,\ \.\.\.\)\."),
    ('nnx_tx_int', lambda: ciclo_flax.create_nnx_state(NNX, 3, losses={"mse": MSE}), TypeError, r"tx\ must\ be\ an\ optax\ optimizer\ such\ as\ optax\.a"),
    ('nnx_losses_list', lambda: ciclo_flax.create_nnx_state(NNX, optax.sgd(0.1), losses=[MSE]), TypeError, r"losses\ must\ be\ a\ dict\ \{name:\ fn\(preds,\ target.*cross_entropy_with_integer_labels\}\."),
    ('nnx_strategy_bad', lambda: ciclo_flax.create_nnx_state(NNX, optax.sgd(0.1), losses={"mse": MSE}, strategy="nope"), ValueError, r"unknown\ strategy\ 'nope';\ known\ strategies:\ \['.*d\.register_strategy\(name,\ factory\)\."),
    ('nnx_unknown_option', lambda: ciclo_flax.create_nnx_state(NNX, optax.sgd(0.1), losses={"mse": MSE}, learning_rate=0.1), TypeError, r"ciclo_flax\.create_nnx_state\(\)\ got\ an\ unknown\ .*'trainable',\ 'training_arg',\ 'tx',\ 'wrt'\]\."),
    ('nnx_training_arg_missing', lambda: ciclo_flax.create_nnx_state(NNX, optax.sgd(0.1), losses={"mse": MSE}, training_arg="train"), TypeError, r"training_arg='train',\ but\ Linear\.__call__\ tak.*s\ training_arg=None\ to\ set\ no\ flag\."),
    ('haiku_model_int', lambda: ciclo_haiku.create_state(3, X, optax.sgd(0.1), losses={"mse": MSE}), TypeError, r"ciclo_haiku\.create_state\ needs\ a\ function\ usi.*te\(forward,\ x\[:1\],\ tx,\ losses=\.\.\.\)\."),
    ('haiku_tx_int', lambda: ciclo_haiku.create_state(HK, X, 3, losses={"mse": MSE}), TypeError, r"tx\ must\ be\ an\ optax\ optimizer\ such\ as\ optax\.a"),
    ('haiku_losses_list', lambda: ciclo_haiku.create_state(HK, X, optax.sgd(0.1), losses=[MSE]), TypeError, r"losses\ must\ be\ a\ dict\ \{name:\ fn\(preds,\ target.*cross_entropy_with_integer_labels\}\."),
    ('haiku_strategy_bad', lambda: ciclo_haiku.create_state(HK, X, optax.sgd(0.1), losses={"mse": MSE}, strategy="nope"), ValueError, r"unknown\ strategy\ 'nope';\ known\ strategies:\ \['.*d\.register_strategy\(name,\ factory\)\."),
    ('haiku_unknown_option', lambda: ciclo_haiku.create_state(HK, X, optax.sgd(0.1), losses={"mse": MSE}, learning_rate=0.1), TypeError, r"ciclo_haiku\.create_state\(\)\ got\ an\ unknown\ key.*argets_key',\ 'trainable',\ 'training_arg',\ 'tx'\]\."),
    ('haiku_training_arg_missing', lambda: ciclo_haiku.create_state(HK, X, optax.sgd(0.1), losses={"mse": MSE}, training_arg="train"), TypeError, r"training_arg='train',\ but\ the\ model\ function\ .*s\ training_arg=None\ to\ set\ no\ flag\."),
    ('haiku_sample_inputs_other_features', lambda: ciclo.loop(ciclo_haiku.create_state(HK, jnp.zeros((4, 5)), optax.sgd(0.1), losses={"mse": MSE}), [(X, Y)], {ciclo.every(1): lambda state, batch: state.train_step(batch)}), ValueError, r"ciclo_haiku: the parameters do not fit this batch's inputs \(shapes \(4, 3\)\).*give it a sample of the real inputs\. Haiku: .*does not match shape"),
    ('eqx_built_for_other_features', lambda: ciclo.loop(ciclo_equinox.create_state(eqx.nn.Linear(5, 2, key=jax.random.key(0)), optax.sgd(0.1), losses={"mse": MSE}, vmap=True), [(X, Y)], {ciclo.every(1): lambda state, batch: state.train_step(batch)}), TypeError, r"ciclo_equinox: Linear does not run on this batch's inputs \(shapes \(4, 3\)\): it was built for inputs of another shape \(a wrong feature count\?\)\. Equinox: dot_general"),
    ('eqx_model_int', lambda: ciclo_equinox.create_state(3, optax.sgd(0.1), losses={"mse": MSE}), TypeError, r"ciclo_equinox\.create_state\ needs\ an\ equinox\.M.*\ use\ ciclo\.adapters\.FunctionState\)\."),
    ('eqx_tx_int', lambda: ciclo_equinox.create_state(EQX, 3, losses={"mse": MSE}), TypeError, r"tx\ must\ be\ an\ optax\ optimizer\ such\ as\ optax\.a"),
    ('eqx_losses_list', lambda: ciclo_equinox.create_state(EQX, optax.sgd(0.1), losses=[MSE]), TypeError, r"losses\ must\ be\ a\ dict\ \{name:\ fn\(preds,\ target.*cross_entropy_with_integer_labels\}\."),
    ('eqx_strategy_bad', lambda: ciclo_equinox.create_state(EQX, optax.sgd(0.1), losses={"mse": MSE}, strategy="nope"), ValueError, r"unknown\ strategy\ 'nope';\ known\ strategies:\ \['.*d\.register_strategy\(name,\ factory\)\."),
    ('eqx_unknown_option', lambda: ciclo_equinox.create_state(EQX, optax.sgd(0.1), losses={"mse": MSE}, learning_rate=0.1), TypeError, r"ciclo_equinox\.create_state\(\)\ got\ an\ unknown\ k.*egy',\ 'targets_key',\ 'trainable',\ 'tx',\ 'vmap'\]\."),
    ('eqx_vmap_str', lambda: ciclo_equinox.create_state(EQX, optax.sgd(0.1), losses={"mse": MSE}, vmap="yes"), TypeError, r"vmap\ must\ be\ True\ or\ False,\ got\ 'yes'\."),
    ('eqx_key_arg_missing', lambda: ciclo_equinox.create_state(EQX, optax.sgd(0.1), losses={"mse": MSE}, key_arg="rng"), TypeError, r"key_arg='rng',\ but\ Linear\.__call__\ takes\ no\ a.*Pass\ key_arg=None\ to\ pass\ no\ randomness"),
]
# fmt: on


def test_the_adapter_suite_covers_each_adapter() -> None:
    names = [name for name, *_ in CASES]
    assert len(set(names)) == len(names)
    for prefix in ("flax_", "nnx_", "haiku_", "eqx_"):
        assert sum(name.startswith(prefix) for name in names) >= 5


@pytest.mark.parametrize(("name", "call", "error", "match"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_to_an_adapter_gets_an_error_naming_the_culprit_and_the_fix(
    name: str, call: Any, error: type[BaseException], match: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error) as info:
            call()
    assert re.search(match, str(info.value), re.DOTALL), f"{name}: {info.value}"
