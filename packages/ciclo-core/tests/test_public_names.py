"""One public name per concept: each callback under one top-level name, the function-style
one, which is its class (``ciclo.keras_bar is ciclo.callbacks.KerasBar``), so the call and
``isinstance`` are one; ``__all__`` in every public namespace; at most 150 public names; old
spellings warn for one release, naming the new one."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

import ciclo
import ciclo.testing
from ciclo._deprecated import DEPRECATED

NAMESPACES = ("ciclo", "ciclo.callbacks", "ciclo.managed", "ciclo.adapters", "ciclo.testing")

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
        "total interval plain_interval width dynamic file process running_mean exclude",
    ),
    "tqdm_bar": ("TqdmBar", "total interval file running_mean exclude process tqdm_kwargs"),
    "throughput": ("Throughput", "steps flops_per_step peak_flops prefix"),
    "writer_logger": ("WriterLogger", "writer interval process hparams close"),
    "checkpoint": (
        "Checkpoint",
        "directory keep monitor mode async_save save_on_end compilation_cache",
    ),
}


def test_at_most_150_public_names_each_namespace_with_all_that_resolves():
    total = 0
    for name in NAMESPACES:
        module = importlib.import_module(name)
        assert isinstance(module.__all__, list), f"{name} has no __all__"
        assert len(set(module.__all__)) == len(module.__all__), f"{name}.__all__ repeats"
        for public in module.__all__:
            assert hasattr(module, public), f"{name}.{public} is in __all__ but not there"
        total += len(module.__all__)
    assert total <= 150, f"{total} public names"


def test_every_callback_is_under_exactly_one_top_level_name():
    for cls_name in ciclo.callbacks.__all__:
        cls = getattr(ciclo.callbacks, cls_name)
        names = [name for name in ciclo.__all__ if getattr(ciclo, name) is cls]
        if hasattr(cls, "__loop_callback__") or hasattr(cls, "__loop_observer__"):
            assert len(names) == 1, (cls_name, names)
        else:  # writers, exceptions, helpers: in ciclo.callbacks only
            assert names == [], (cls_name, names)
    assert not set(ciclo.__all__) & set(ciclo.callbacks.__all__)


@pytest.mark.parametrize("lower", sorted(CALLBACKS))
def test_the_lowercase_name_is_the_class(lower):
    cls_name, _ = CALLBACKS[lower]
    cls = getattr(ciclo.callbacks, cls_name)
    assert inspect.isclass(getattr(ciclo, lower)), f"ciclo.{lower} is not a class"
    assert getattr(ciclo, lower) is cls
    assert lower in ciclo.__all__
    assert cls_name in ciclo.callbacks.__all__


@pytest.mark.parametrize(
    ("namespace", "old"), [(ns, old) for ns, table in DEPRECATED.items() for old in table]
)
def test_an_old_spelling_warns_naming_the_new_one(namespace, old):
    new = DEPRECATED[namespace][old]
    module_name, _, attribute = new.rpartition(".")
    advice = "it is internal now" if "._" in module_name else f"use {new}"
    module = importlib.import_module(namespace)
    assert old not in module.__all__
    with pytest.warns(
        DeprecationWarning,
        match=rf"^{re.escape(f'{namespace}.{old}')} is "
        rf"deprecated: {re.escape(advice)};",
    ):
        value = getattr(module, old)
    assert value is getattr(importlib.import_module(module_name), attribute)


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'ciclo' has no attribute 'keras_barr'"):
        ciclo.keras_barr  # noqa: B018
    assert not hasattr(ciclo.callbacks, "KerasBarr")


@pytest.mark.parametrize("lower", sorted(CALLBACKS))
def test_the_class_takes_the_documented_parameters(lower):
    cls_name, params = CALLBACKS[lower]
    cls = getattr(ciclo.callbacks, cls_name)
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
    assert isinstance(ciclo.keras_bar(10), ciclo.callbacks.KerasBar)
    assert isinstance(ciclo.early_stopping("loss", 2), ciclo.callbacks.EarlyStopping)
    stopper = ciclo.early_stopping("loss", 2, 0.1, "max")  # positional as before
    assert (stopper.min_delta, stopper.mode) == (0.1, "max")
    assert type(ciclo.checkpoint(tmp_path / "ckpt")) is ciclo.callbacks.Checkpoint


def test_validation_is_kept_and_names_the_callback_as_users_call_it():
    with pytest.raises(TypeError, match=r"writer_logger: object is not a metric writer"):
        ciclo.writer_logger(object())
    with pytest.raises(TypeError, match=r"^learning_rate_monitor\(steps=0\)"):
        ciclo.learning_rate_monitor(steps=0)
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
