"""Logs: nested collection -> name -> value, attribute access, and a JAX pytree."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


def test_adders_and_attribute_access():
    logs = (
        ciclo.logs()
        .add_loss("loss", 0.5)
        .add_metric("accuracy", 0.9)
        .add_stateful_metric("mean_loss", 0.6)
        .add_output("logits", [1, 2])
        .add_entry("custom", "lr", 1e-3)
    )
    assert logs == {
        "losses": {"loss": 0.5},
        "metrics": {"accuracy": 0.9},
        "stateful_metrics": {"mean_loss": 0.6},
        "outputs": {"logits": [1, 2]},
        "custom": {"lr": 1e-3},
    }
    assert logs.losses.loss == 0.5
    assert logs.custom.lr == 1e-3
    assert isinstance(logs, dict)


def test_constructed_from_a_dict_gets_attribute_access():
    logs = ciclo.Logs({"metrics": {"accuracy": 1.0}})
    assert logs.metrics.accuracy == 1.0
    logs["losses"] = {"loss": 2.0}
    assert logs.losses.loss == 2.0


def test_missing_attributes_say_what_exists():
    logs = ciclo.logs().add_metric("accuracy", 1.0)
    with pytest.raises(AttributeError, match=r"no collection 'losses'; collections: \['metrics'\]"):
        _ = logs.losses
    with pytest.raises(AttributeError, match=r"no entry 'acc'.*\['accuracy'\]"):
        _ = logs.metrics.acc


def test_entry_value_bare_and_dotted():
    logs = ciclo.logs().add_loss("loss", 1.0).add_metric("accuracy", 0.5).add_metric("loss", 2.0)
    assert logs.entry_value("accuracy") == 0.5
    assert logs.entry_value("losses.loss") == 1.0
    assert logs.entry_value("metrics.loss") == 2.0
    with pytest.raises(KeyError, match=r"'loss' is ambiguous.*'losses.loss', 'metrics.loss'"):
        logs.entry_value("loss")
    with pytest.raises(KeyError, match=r"no log entry 'recall'; entries: .*'metrics.accuracy'"):
        logs.entry_value("recall")
    with pytest.raises(KeyError, match=r"no log entry 'metrics.recall'"):
        logs.entry_value("metrics.recall")


def test_merge_and_updates():
    logs = ciclo.logs().add_metric("a", 1).add_metric("b", 2)
    logs.merge({"metrics": {"b": 3}, "losses": {"loss": 4}})
    assert logs == {"metrics": {"a": 1, "b": 3}, "losses": {"loss": 4}}
    assert logs.losses.loss == 4
    logs.updates = ciclo.logs().add_metric("c", 5)
    assert logs.metrics.c == 5
    logs.updates = None
    assert logs.merge(None) is logs
    with pytest.raises(TypeError, match="collection 'metrics' is a float"):
        logs.merge({"metrics": 1.0})


def test_merge_copies_collections_it_takes():
    source = {"metrics": {"a": 1}}
    logs = ciclo.logs().merge(source)
    logs.add_metric("b", 2)
    assert source == {"metrics": {"a": 1}}


def test_entries_and_copy():
    logs = ciclo.logs().add_loss("loss", 1.0).add_metric("accuracy", 0.5)
    assert sorted(logs.entries()) == [("losses", "loss", 1.0), ("metrics", "accuracy", 0.5)]
    copy = logs.copy()
    copy.add_metric("recall", 0.1)
    assert "recall" not in logs.metrics
    assert isinstance(copy, ciclo.Logs)
    assert copy.metrics.accuracy == 0.5


def test_logs_pass_through_jit_intact():
    @jax.jit
    def produce(x):
        return ciclo.logs().add_loss("loss", jnp.sum(x)).add_output("y", 2 * x)

    @jax.jit
    def consume(logs):
        return logs.add_metric("double_loss", 2 * logs.losses.loss)

    out = consume(produce(jnp.arange(3.0)))
    assert isinstance(out, ciclo.Logs)
    assert sorted(out) == ["losses", "metrics", "outputs"]
    assert float(out.losses.loss) == 3.0
    assert float(out.metrics.double_loss) == 6.0
    np.testing.assert_array_equal(out.outputs.y, [0.0, 2.0, 4.0])
    assert out.entry_value("y").shape == (3,)


def test_logs_pytree_structure_and_paths():
    logs = ciclo.logs().add_metric("b", 2.0).add_loss("a", 1.0)
    leaves, treedef = jax.tree_util.tree_flatten(logs)
    assert leaves == [1.0, 2.0]  # collections and names in sorted order
    rebuilt = jax.tree_util.tree_unflatten(treedef, [10.0, 20.0])
    assert isinstance(rebuilt, ciclo.Logs)
    assert rebuilt.losses.a == 10.0
    assert rebuilt.metrics.b == 20.0
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(logs)]
    assert paths == ["['losses']['a']", "['metrics']['b']"]
    doubled = jax.tree_util.tree_map(lambda v: 2 * v, logs)
    assert doubled.metrics.b == 4.0


def test_logs_stack_through_scan():
    def body(carry, x):
        return carry + x, ciclo.logs().add_loss("loss", carry * x)

    _, stacked = jax.lax.scan(body, 1.0, jnp.arange(4.0))
    assert isinstance(stacked, ciclo.Logs)
    np.testing.assert_array_equal(stacked.losses.loss, [0.0, 1.0, 4.0, 12.0])
