"""What a new user met (issue 41, items 4-10 and the leftovers): each a clear message or
a documented behaviour."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

BATCHES = [np.ones((2, 1), np.float32)] * 4


def train_step(state, batch):
    return ciclo.logs().add_loss("loss", jnp.mean(batch)), state


@pytest.mark.parametrize(
    ("keyword", "hint"),
    [
        ("validation_data", r"Keras' validation_data= is test_dataset="),
        ("batch_size", r"Keras' batch_size= is the size of the batches you give in train_dataset"),
        ("verbose", r"Keras' verbose= is a bar: callbacks=\[ciclo.keras_bar\(\)\]"),
        ("shuffle", r"Keras' shuffle= is a function returning each epoch's batches"),
        ("steps_per_epoch", r"Keras' steps_per_epoch= is epoch_duration="),
    ],
)
def test_keras_keywords_of_train_loop_name_ciclos_counterpart(keyword, hint):
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{keyword}'\. {hint}"):
        ciclo.train_loop(None, BATCHES, {ciclo.on_train_step: train_step}, **{keyword: 1})


def test_a_resume_that_replays_train_loops_epochs_names_them_and_the_recipe(tmp_path, capsys):
    # issue 41, item 5: not "a Passes cannot seek".
    def run(epochs):
        ckpt = ciclo.checkpoint(tmp_path, async_save=False)
        tasks = {ciclo.on_train_step: train_step}
        return ciclo.train_loop(
            None, lambda: BATCHES, tasks, epochs=epochs, callbacks=[ckpt], resume=ckpt
        )

    run(2)
    capsys.readouterr()
    assert run(3)[2].steps == 12
    assert (
        "replaying 8 batches: the epochs of train_dataset cannot seek (docs/loops.md: Shuffling "
        "each epoch)." in capsys.readouterr().err
    )


def test_an_extra_field_that_is_no_array_is_static_metadata(tmp_path):
    # issue 41, item 8: label="run-a" failed at the first step with a raw JAX TypeError.
    import optax

    @ciclo.managed.train_step
    def step(state, batch):
        return ciclo.logs().add_loss("loss", jnp.sum(state.params["w"] * batch))

    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.ones(1)}, tx=optax.sgd(0.1), label="run-a", seen=jnp.zeros(())
    )
    assert state.label == "run-a"
    assert jax.tree.leaves(state.extra) == [state.seen]
    ckpt = ciclo.checkpoint(tmp_path, async_save=False)
    state, _, _ = ciclo.loop(state, BATCHES, {ciclo.every(1): [step, ckpt]}, resume=ckpt)
    assert state.label == "run-a"
    assert state.replace(label="run-b").label == "run-b"
    with pytest.raises(TypeError, match=r"extra field 'tags' holds strings: give arrays, or wrap"):
        ciclo.managed.ManagedState.create(params={}, tx=None, tags={"a": "x"})


def test_resume_stopped_without_resume_is_an_error():
    match = r"loop\(resume_stopped=True\) continues a run: give resume=its directory\."
    with pytest.raises(ValueError, match=match):
        ciclo.loop(None, BATCHES, {ciclo.every(1): train_step}, resume_stopped=True)
    with pytest.raises(ValueError, match=match):
        ciclo.train_loop(None, BATCHES, {ciclo.on_train_step: train_step}, resume_stopped=True)


def test_training_in_float16_without_a_loss_scale_is_an_error():
    import optax

    create = ciclo.managed.ManagedState.create
    with pytest.raises(
        ValueError, match=r"float16 underflows gradients: give loss_scale='dynamic'"
    ):
        create(params={"w": jnp.ones(1)}, tx=optax.sgd(0.1), compute_dtype=jnp.float16)
    create(params={"w": jnp.ones(1)}, tx=None, compute_dtype=jnp.float16)  # evaluation only
    create(params={"w": jnp.ones(1)}, tx=optax.sgd(0.1), compute_dtype=jnp.float16, loss_scale=1.0)
