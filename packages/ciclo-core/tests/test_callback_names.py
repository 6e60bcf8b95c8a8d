"""One public name per callback: the class is the API, and its lowercase name is the same
class (``ciclo.keras_bar is ciclo.KerasBar``), so the call and ``isinstance`` are one."""

from __future__ import annotations

import inspect

import pytest

import ciclo

#: lowercase name -> class name, and the parameters each documents, in order.
CALLBACKS = {
    "early_stopping": (
        "EarlyStopping",
        "monitor patience min_delta mode baseline restore_best_weights start_from "
        "min_delta_mode verbose file",
    ),
    "terminate_on_nan": ("TerminateOnNaN", "keys interval state_every verbose file"),
    "csv_logger": ("CSVLogger", "path separator append process running_mean"),
    "tensorboard_logger": ("TensorBoardLogger", "logdir interval process writer_kwargs"),
    "learning_rate_monitor": ("LearningRateMonitor", "schedule steps name"),
    "profiler": ("Profiler", "logdir start steps perfetto process"),
    "keras_bar": (
        "KerasBar",
        "total interval plain_interval width dynamic file process running_mean",
    ),
    "tqdm_bar": ("TqdmBar", "total interval file process running_mean tqdm_kwargs"),
    "throughput": ("Throughput", "steps flops_per_step peak_flops prefix"),
    "writer_logger": ("WriterLogger", "writer interval process hparams close"),
    "checkpoint": (
        "Checkpoint",
        "directory keep monitor mode async_save save_on_end compilation_cache",
    ),
}


@pytest.mark.parametrize("lower", sorted(CALLBACKS))
def test_the_lowercase_name_is_the_class(lower):
    cls_name, _ = CALLBACKS[lower]
    cls = getattr(ciclo, cls_name)
    assert inspect.isclass(getattr(ciclo, lower)), f"ciclo.{lower} is not a class"
    assert getattr(ciclo, lower) is cls
    assert getattr(ciclo.callbacks, lower) is cls
    assert getattr(ciclo.callbacks, cls_name) is cls


@pytest.mark.parametrize("lower", sorted(CALLBACKS))
def test_the_class_takes_the_documented_parameters(lower):
    cls_name, params = CALLBACKS[lower]
    cls = getattr(ciclo, cls_name)
    assert list(inspect.signature(cls).parameters) == params.split()
    documented = cls.__doc__ or ""
    assert "Args:" in documented, cls_name
    assert "Example:" in documented, cls_name
    for name in params.split():
        assert f"    {name}:" in documented or f"**{name}:" in documented, (cls_name, name)
    assert "see :func:" not in documented
    assert "made by :func:" not in documented


def test_a_callback_made_by_its_lowercase_name_is_an_instance_of_it(tmp_path):
    assert isinstance(ciclo.keras_bar(10), ciclo.keras_bar)
    assert isinstance(ciclo.keras_bar(10), ciclo.KerasBar)
    assert isinstance(ciclo.early_stopping("loss", 2), ciclo.EarlyStopping)
    stopper = ciclo.early_stopping("loss", 2, 0.1, "max")  # positional as before
    assert (stopper.min_delta, stopper.mode) == (0.1, "max")
    assert type(ciclo.checkpoint(tmp_path / "ckpt")) is ciclo.Checkpoint


def test_validation_is_kept_and_names_the_callback_as_users_call_it():
    with pytest.raises(TypeError, match=r"writer_logger: object is not a metric writer"):
        ciclo.writer_logger(object())
    with pytest.raises(TypeError, match=r"^learning_rate_monitor\(steps=0\)"):
        ciclo.LearningRateMonitor(steps=0)
    with pytest.raises(TypeError, match=r"^throughput\(steps=0\)"):
        ciclo.throughput(0)
    with pytest.raises(TypeError, match=r"^profiler\(steps=0\)"):
        ciclo.profiler("logs", steps=0)


def test_a_callback_class_given_uncalled_is_an_error_that_says_to_call_it():
    import numpy as np

    def step(state, batch):
        return ciclo.logs().add_loss("loss", 0.5), state

    data = [np.ones(2)] * 2
    message = r"callback KerasBar is a class, not a callback: make one and pass it, keras_bar\("
    with pytest.raises(TypeError, match=message):  # as a task of ciclo.loop
        ciclo.loop(None, data, {ciclo.every(1): [step, ciclo.keras_bar]})
    with pytest.raises(TypeError, match=message):  # in train_loop(callbacks=[...])
        ciclo.train_loop(None, data, {ciclo.every(1): step}, callbacks=[ciclo.keras_bar])
