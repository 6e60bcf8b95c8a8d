"""Typos in field and option names are errors that name the close match."""

import dataclasses

import jax.numpy as jnp
import optax
import pytest

import ciclo
from ciclo.adapters import FunctionState
from ciclo.managed import ManagedState


def make_state(**fields):
    return ManagedState.create(params={"w": jnp.zeros(3)}, tx=optax.sgd(0.1), **fields)


def test_replace_with_a_typo_names_the_field():
    with pytest.raises(TypeError, match=r"'parmas'; did you mean 'params'\?"):
        make_state().replace(parmas={"w": jnp.ones(3)})


def test_create_with_a_typo_names_the_option():
    with pytest.raises(TypeError, match=r"'stratgey'; did you mean 'strategy'\?"):
        make_state(stratgey="eager")


def test_extra_fields_are_declared_at_create_and_replaced_by_name():
    state = make_state(extra={"steps": jnp.zeros(())}, seen=jnp.zeros((), jnp.int32))
    assert sorted(state.extra) == ["seen", "steps"]  # `steps` is close to `step`: extra= says so
    state = state.replace(seen=state.seen + 2)
    assert int(state.seen) == 2
    with pytest.raises(TypeError, match=r"unknown field 'unseen'.*declare 'unseen'"):
        state.replace(unseen=1)
    with pytest.raises(AttributeError, match=r"no field 'sen'; did you mean 'seen'\?"):
        _ = state.sen


def test_a_keyword_close_to_a_field_is_not_an_extra_field():
    with pytest.raises(TypeError, match=r"'steps'; did you mean 'step'\?.*extra=\{'steps'"):
        make_state(steps=jnp.zeros(()))


def test_subclass_fields_are_declared():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Counting(ManagedState):
        seen: jnp.ndarray = dataclasses.field(default_factory=lambda: jnp.zeros((), jnp.int32))

    state = Counting.create(params={}, tx=None, seen=jnp.ones((), jnp.int32))
    assert int(state.replace(seen=state.seen + 1).seen) == 2
    with pytest.raises(TypeError, match=r"'sen'; did you mean 'seen'\?"):
        Counting.create(params={}, tx=None, sen=1)
    with pytest.raises(TypeError, match=r"'sen'; did you mean 'seen'\?"):
        state.replace(sen=1)


def test_adapter_states_take_declared_fields_only():
    def apply_fn(params, model_state, x, *, training, key):
        return x, model_state

    options = {"apply_fn": apply_fn, "params": {}, "tx": None, "losses": None}
    with pytest.raises(TypeError, match=r"'stratgey'; did you mean 'strategy'\?"):
        FunctionState.create(**options, stratgey="eager")
    with pytest.raises(TypeError, match=r"'inputs_kye'; did you mean 'inputs_key'\?"):
        FunctionState.create(**options, inputs_kye="x")
    with pytest.raises(TypeError, match=r"unknown keyword 'anything'"):
        FunctionState.create(**options, anything=1)


def test_check_options_names_the_factory_and_the_match():
    def create_state(model, *, strategy="jit", **options):
        ciclo.adapters.check_options(options, create_state)
        return options

    assert create_state(None, inputs_key="x") == {"inputs_key": "x"}
    with pytest.raises(TypeError, match=r"create_state\(\) got an unknown keyword 'stratgey'; "):
        create_state(None, stratgey="eager")


def test_unflattened_states_keep_their_fields_and_static_data():
    import jax

    state = make_state(seen=jnp.zeros(()))
    leaves, treedef = jax.tree_util.tree_flatten(state)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert again == state
    assert again.strategy is state.strategy
    assert float(again.seen) == 0.0
    assert jax.tree_util.tree_structure(again) == treedef
