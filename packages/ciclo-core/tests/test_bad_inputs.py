# ruff: noqa: E501
"""The bad-input suite: each case is one line, ``(name, call, error type, match)``, where
``call(d)`` makes a mistake a user makes (``d.T``: a fresh directory, ``d.F``: a file) and
``match`` asserts that the error names the culprit (the start of the message) and the fix
(its end). Adding a case is adding a line. Below the table, the cases that need more than a
line, and typos of field and option names. Adapters: tests/test_bad_inputs_adapters.py."""

from __future__ import annotations

import dataclasses
import os
import re
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ciclo
from ciclo.adapters import FunctionState
from ciclo.managed import ManagedState

S = jnp.zeros(2)
B = [np.ones((2, 1), np.float32)]
H = ciclo.History()
H.commit(ciclo.Elapsed.create(), ciclo.logs().add_loss("loss", 1.0))
MS = ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1))


class SD:
    """A dataset with state_dict / load_state_dict."""

    def __init__(self) -> None:
        self.p = 0

    def __iter__(self) -> Iterator[Any]:
        while self.p < 10:
            self.p += 1
            yield B[0]

    def state_dict(self) -> dict[str, int]:
        return {"p": self.p}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.p = state["p"]


#: A train step and a test step that log a loss, and a generator that ``used_up`` exhausts.
STEPS = {
    ciclo.on_train_step: lambda state, batch: ciclo.logs().add_loss("loss", batch.mean()),
    ciclo.on_test_step: lambda state, batch: ciclo.logs().add_loss("loss", batch.mean()),
}


def truncate_latest(directory: str) -> None:
    """Truncates every file of the newest checkpoint, orbax's own included."""
    latest = max(
        (p for p in Path(directory).iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
    )
    for path in latest.rglob("*"):
        if path.is_file():
            with open(path, "r+b") as f:
                f.truncate(path.stat().st_size // 2)


class FakeDevice:
    """A device of process ``process_index``, for the mesh checks of several processes."""

    def __init__(self, process_index: int) -> None:
        self.process_index = process_index


def int_params_step() -> Any:
    state = ciclo.managed.ManagedState.create(
        params={"w": jnp.zeros(2, jnp.int32)}, tx=optax.sgd(0.1)
    )
    step = ciclo.managed.train_step(
        lambda state, batch: ciclo.logs().add_loss("loss", jnp.sum(state.params["w"] * batch))
    )
    return step(state, jnp.ones(2, jnp.int32))


def used_up() -> Iterator[Any]:
    batches = (b for b in B)
    list(batches)
    return batches


# fmt: off
CASES = [
    ('loop_tasks_list', lambda d: ciclo.loop(S, B, [lambda s: None]), TypeError, r"tasks\ must\ be\ a\ dict\ \{schedule:\ callback\ or\ \[.*mple:\ \{ciclo\.every\(1\):\ train_step\}\."),
    ('loop_tasks_int_key', lambda d: ciclo.loop(S, B, {1: lambda s: None}), TypeError, r"a\ schedule\ must\ be\ a\ function\ Elapsed\ \->\ bool,\ got\ 1\."),
    ('loop_tasks_str_key', lambda d: ciclo.loop(S, B, {"every": lambda s: None}), TypeError, r"tasks\ key\ 'every'\ is\ a\ name,\ but\ loop\(\)\ needs.*in_loop\ /\ test_loop\ /\ predict_loop\."),
    ('loop_callback_int', lambda d: ciclo.loop(S, B, {ciclo.every(1): 3}), TypeError, r"3\ is\ not\ a\ callback:\ give\ a\ function\ taking\ t.*loop_callback__\(loop_state\)\ method\."),
    ('loop_callback_str', lambda d: ciclo.loop(S, B, {ciclo.every(1): "step"}), TypeError, r"'step'\ is\ not\ a\ callback:\ give\ a\ function\ tak.*loop_callback__\(loop_state\)\ method\."),
    ('loop_stop_str', lambda d: ciclo.loop(S, B, {}, stop="10"), TypeError, r"stop\ must\ be\ an\ int\ \(steps\)\ or\ a\ ciclo\.at\(\.\.\..*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('loop_stop_float', lambda d: ciclo.loop(S, B, {}, stop=1.5), TypeError, r"stop\ must\ be\ an\ int\ \(steps\)\ or\ a\ ciclo\.at\(\.\.\..*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('loop_dataset_int', lambda d: ciclo.loop(S, 5, {}), TypeError, r"the\ dataset\ must\ be\ iterable\ \(a\ list,\ a\ gener.*y,\ call\ it:\ dataset=make_dataset\(\)\."),
    ('loop_dataset_none', lambda d: ciclo.loop(S, None, {}), TypeError, r"the\ dataset\ must\ be\ iterable\ \(a\ list,\ a\ gener.*y,\ call\ it:\ dataset=make_dataset\(\)\."),
    ('loop_elapsed_int', lambda d: ciclo.loop(S, B, {}, elapsed=3), TypeError, r"loop\(elapsed=3\):\ expected\ a\ ciclo\.Elapsed\ \(wh.*\ ciclo\.loop\(\.\.\.\)\)\ or\ None,\ got\ int\."),
    ('loop_elapsed_dict', lambda d: ciclo.loop(S, B, {}, elapsed={"steps": 1}), TypeError, r"loop\(elapsed=\{'steps':\ 1\}\):\ expected\ a\ ciclo\..*ciclo\.loop\(\.\.\.\)\)\ or\ None,\ got\ dict\."),
    ('loop_history_list', lambda d: ciclo.loop(S, B, {}, history=[]), TypeError, r"loop\(history=\[\]\):\ expected\ a\ ciclo\.History\ \(e.*r\ loop\ returned\)\ or\ None,\ got\ list\."),
    ('loop_history_dict', lambda d: ciclo.loop(S, B, {}, history={}), TypeError, r"loop\(history=\{\}\):\ expected\ a\ ciclo\.History\ \(e.*r\ loop\ returned\)\ or\ None,\ got\ dict\."),
    ('loop_batch_size_fn_str', lambda d: ciclo.loop(S, B, {}, batch_size_fn="len"), TypeError, r"loop\(batch_size_fn='len'\):\ expected\ a\ functio.*er\ of\ samples\ in\ a\ batch\),\ got\ str\."),
    ('loop_batch_size_fn_float', lambda d: ciclo.loop(S, B, {}, batch_size_fn=lambda b: 1.5), TypeError, r"loop\(batch_size_fn=<lambda>\)\ returned\ 1\.5;\ it.*\ samples\ in\ the\ batch,\ an\ int\ >=\ 0\."),
    ('loop_batch_size_fn_neg', lambda d: ciclo.loop(S, B, {}, batch_size_fn=lambda b: -1), ValueError, r"loop\(batch_size_fn=<lambda>\)\ returned\ \-1;\ it\ .*\ samples\ in\ the\ batch,\ an\ int\ >=\ 0\."),
    ('loop_batch_size_fn_none', lambda d: ciclo.loop(S, B, {}, batch_size_fn=lambda b: None), TypeError, r"loop\(batch_size_fn=<lambda>\)\ returned\ None;\ i.*\ samples\ in\ the\ batch,\ an\ int\ >=\ 0\."),
    ('loop_stop_signals_names', lambda d: ciclo.loop(S, B, {}, stop_signals=("SIGINT",)), TypeError, r"loop\(stop_signals=\('SIGINT',\)\):\ expected\ a\ tu.*\ \(\)\ for\ none;\ not\ names\ or\ numbers\."),
    ('loop_stop_signals_str', lambda d: ciclo.loop(S, B, {}, stop_signals="SIGTERM"), TypeError, r"loop\(stop_signals='SIGTERM'\):\ expected\ a\ tupl.*\ \(\)\ for\ none;\ not\ names\ or\ numbers\."),
    ('loop_stop_signals_int', lambda d: ciclo.loop(S, B, {}, stop_signals=15), TypeError, r"loop\(stop_signals=15\):\ expected\ a\ tuple\ of\ si.*\ \(\)\ for\ none;\ not\ names\ or\ numbers\."),
    ('loop_resume_int', lambda d: ciclo.loop(S, B, {}, resume=3), TypeError, r"a\ checkpoint\ directory\ must\ be\ a\ str\ or\ a\ pat"),
    ('loop_resume_file', lambda d: ciclo.loop(S, B, {}, resume=d.F), NotADirectoryError, r"checkpoint\ directory\ '.*'\ is\ a\ file\.\ Give.*hat\ ciclo\.checkpoint\(\.\.\.\)\ wrote\ to\."),
    ('loop_on_end_int', lambda d: ciclo.loop(S, B, {}, on_end=3), TypeError, r"3\ is\ not\ a\ callback:\ give\ a\ function\ taking\ t.*loop_callback__\(loop_state\)\ method\."),
    ('loop_callback_returns_str', lambda d: ciclo.loop(S, B, {ciclo.every(1): lambda s: "done"}), TypeError, r"callback\ .*<lambda>\ returned\ a\ str\ \('done'\),\ which\ cannot\ be\ a\ state.*a\ state\ \(a\ pytree\)\ or\ None\."),
    ('loop_callback_returns_set', lambda d: ciclo.loop(S, B, {ciclo.every(1): lambda s: {1}}), TypeError, r"callback\ .*<lambda>\ returned\ a\ set\ \('\{1\}'\),\ which\ cannot\ be\ a\ state.*a\ state\ \(a\ pytree\)\ or\ None\."),
    ('loop_callback_returns_4tuple', lambda d: ciclo.loop(S, B, {ciclo.every(1): lambda s: (None, None, None, s)}), TypeError, r"callback\ .*<lambda>\ returned\ a\ tuple\ of\ 4\ items.*ogs,\ state\),\ logs,\ a\ state\ or\ None\."),
    ('loop_callback_returns_1tuple', lambda d: ciclo.loop(S, B, {ciclo.every(1): lambda s: (s,)}), TypeError, r"callback\ .*<lambda>\ returned\ a\ tuple\ of\ 1\ items.*ogs,\ state\),\ logs,\ a\ state\ or\ None\."),
    ('loop_callback_kwonly', lambda d: ciclo.loop(S, B, {ciclo.every(1): lambda s, *, lr: None}), TypeError, r"callback\ .*<lambda>\(s,\ \*,\ lr\)\ needs\ keyword\-onl.*r\ bind\ them\ with\ functools\.partial\."),
    ('loop_callback_five_args', lambda d: ciclo.loop(S, B, {ciclo.every(1): lambda a, b, c, d, e: None}), TypeError, r"callback\ .*<lambda>\(a,\ b,\ c,\ d,\ e\)\ needs\ 5\ posi.*e,\ batch,\ elapsed,\ loop_state\):\ \.\.\."),
    ('every_zero', lambda d: ciclo.every(0), ValueError, r"every\(\):\ steps\ must\ be\ positive,\ got\ 0\."),
    ('every_negative', lambda d: ciclo.every(-2), ValueError, r"every\(\):\ steps\ must\ be\ positive,\ got\ \-2\."),
    ('every_float_steps', lambda d: ciclo.every(steps=1.5), TypeError, r"every\(\):\ steps\ must\ be\ a\ whole\ number,\ got\ 1\.5;\ or\ count\ samples\."),
    ('every_str', lambda d: ciclo.every("10"), TypeError, r"every\(\):\ steps\ must\ be\ a\ number,\ got\ '10'\ \(st"),
    ('every_none', lambda d: ciclo.every(), ValueError, r"every\(\)\ needs\ exactly\ one\ period:\ steps,\ samples\ or\ time,\ got\ none\."),
    ('every_two_units', lambda d: ciclo.every(steps=1, samples=2), ValueError, r"every\(\)\ needs\ exactly\ one\ period:\ steps,\ samples\ or\ time,\ got\ \{'steps':\ 1,\ 'samples':\ 2\}\."),
    ('every_time_zero', lambda d: ciclo.every(time=0), ValueError, r"every\(\):\ time\ must\ be\ positive,\ got\ 0\."),
    ('every_time_neg', lambda d: ciclo.every(time=-1), ValueError, r"every\(\):\ time\ must\ be\ positive,\ got\ \-1\."),
    ('every_bool', lambda d: ciclo.every(True), TypeError, r"every\(\):\ steps\ must\ be\ a\ number,\ got\ True\ \(bo"),
    ('after_neg', lambda d: ciclo.after(-1), ValueError, r"after\(\):\ steps\ must\ be\ non\-negative,\ got\ \-1\."),
    ('after_str', lambda d: ciclo.after("3"), TypeError, r"after\(\):\ steps\ must\ be\ a\ number,\ got\ '3'\ \(str"),
    ('after_none', lambda d: ciclo.after(), ValueError, r"after\(\)\ needs\ exactly\ one\ period:\ steps,\ samples\ or\ time,\ got\ none\."),
    ('piecewise_empty', lambda d: ciclo.piecewise({}), ValueError, r"piecewise\(\)\ needs\ at\ least\ one\ \{start:\ schedu"),
    ('piecewise_unsorted', lambda d: ciclo.piecewise({10: ciclo.every(1), 0: ciclo.every(2)}), ValueError, r"piecewise\(\)\ starts\ must\ be\ increasing,\ got\ \[10,\ 0\];\ reorder\ them\."),
    ('piecewise_value_int', lambda d: ciclo.piecewise({0: 3}), TypeError, r"a\ schedule\ must\ be\ a\ function\ Elapsed\ \->\ bool,\ got\ 3\."),
    ('piecewise_key_str', lambda d: ciclo.piecewise({"0": ciclo.every(1)}), TypeError, r"a\ piecewise\ start\ must\ be\ an\ int\ \(steps\)\ or\ a.*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('at_none', lambda d: ciclo.at(), ValueError, r"at\(\)\ needs\ a\ period:\ give\ steps,\ samples,\ tim.*\.g\.\ at\(1000\)\ or\ at\(samples=60_000\)\."),
    ('at_neg', lambda d: ciclo.at(-1), ValueError, r"at\(\):\ steps\ must\ be\ non\-negative,\ got\ \-1\."),
    ('at_str', lambda d: ciclo.at("1"), TypeError, r"at\(\):\ steps\ must\ be\ a\ number,\ got\ '1'\ \(str\)\."),
    ('elapse_int', lambda d: ciclo.elapse(3), TypeError, r"the\ dataset\ must\ be\ iterable\ \(a\ list,\ a\ gener.*y,\ call\ it:\ dataset=make_dataset\(\)\."),
    ('schedule_and_int', lambda d: ciclo.every(1) & 3, TypeError, r"a\ schedule\ must\ be\ a\ function\ Elapsed\ \->\ bool,\ got\ 3\."),
    ('schedule_or_str', lambda d: ciclo.every(1) | "x", TypeError, r"a\ schedule\ must\ be\ a\ function\ Elapsed\ \->\ bool,\ got\ 'x'\."),
    ('logs_entry_missing', lambda d: ciclo.logs().add_loss("loss", 1.0).entry_value("lost"), KeyError, r"no\ log\ entry\ 'lost';\ entries:\ \['losses\.loss'\]"),
    ('history_collect_missing', lambda d: H.collect("nope"), KeyError, r"history\ has\ no\ key\ 'nope';\ available\ keys:\ \['.*ps',\ 'elapsed\.time',\ 'losses\.loss'\]"),
    ('history_collect_none', lambda d: ciclo.History().collect("loss"), KeyError, r"history\ has\ no\ key\ 'loss';\ available\ keys:\ \['.*',\ 'elapsed\.steps',\ 'elapsed\.time'\]"),
    ('history_plot_missing', lambda d: H.plot("nope"), KeyError, r"history\ has\ no\ key\ 'nope';\ available\ keys:\ \['.*ps',\ 'elapsed\.time',\ 'losses\.loss'\]"),
    ('tqdm_bar_total_str', lambda d: ciclo.tqdm_bar(total="10"), TypeError, r"tqdm_bar\(total\)\ must\ be\ an\ int\ \(steps\)\ or\ a\ c.*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('keras_bar_total_str', lambda d: ciclo.keras_bar(total="10"), TypeError, r"keras_bar\(total\)\ must\ be\ an\ int\ \(steps\)\ or\ a\ .*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('keras_bar_interval_neg', lambda d: ciclo.keras_bar(total=10, interval=-1), ValueError, r"keras_bar:\ interval\ must\ be\ >=\ 0\ seconds,\ got"),
    ('keras_bar_running_mean_str', lambda d: ciclo.keras_bar(10, running_mean="yes"), TypeError, r"keras_bar:\ running_mean\ must\ be\ True\ or\ False,\ got\ 'yes'\."),
    ('inner_loop_bad', lambda d: ciclo.inner_loop(3, lambda s: None), TypeError, r"inner_loop\ name\ must\ be\ a\ non\-empty\ string,\ g"),
    ('checkpoint_keep_zero', lambda d: ciclo.checkpoint(d.T, keep=0), ValueError, r"checkpoint\(keep=0\):\ keep\ must\ be\ a\ positive\ i.*oints\ to\ keep\)\ or\ None\ to\ keep\ all\."),
    ('checkpoint_keep_str', lambda d: ciclo.checkpoint(d.T, keep="2"), ValueError, r"checkpoint\(keep='2'\):\ keep\ must\ be\ a\ positive.*oints\ to\ keep\)\ or\ None\ to\ keep\ all\."),
    ('checkpoint_keep_bool', lambda d: ciclo.checkpoint(d.T, keep=True), ValueError, r"checkpoint\(keep=True\):\ keep\ must\ be\ a\ positiv.*oints\ to\ keep\)\ or\ None\ to\ keep\ all\."),
    ('checkpoint_mode', lambda d: ciclo.checkpoint(d.T, mode="lowest"), ValueError, r"checkpoint\(mode='lowest'\):\ mode\ must\ be\ 'min'"),
    ('checkpoint_monitor_int', lambda d: ciclo.checkpoint(d.T, monitor=3), TypeError, r"checkpoint\(monitor=3\):\ monitor\ must\ be\ the\ na.*\ e\.g\.\ 'loss'\ or\ 'metrics\.accuracy'\."),
    ('checkpoint_monitor_empty', lambda d: ciclo.checkpoint(d.T, monitor=""), TypeError, r"checkpoint\(monitor=''\):\ monitor\ must\ be\ the\ n.*\ e\.g\.\ 'loss'\ or\ 'metrics\.accuracy'\."),
    ('checkpoint_dir_int', lambda d: ciclo.checkpoint(3), TypeError, r"a\ checkpoint\ directory\ must\ be\ a\ str\ or\ a\ pat"),
    ('checkpoint_dir_file', lambda d: ciclo.checkpoint(d.F), NotADirectoryError, r"checkpoint\ directory\ '.*'\ is\ a\ file\.\ Give\ cicl"),
    ('checkpoint_monitor_never_logged', lambda d: ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T, monitor="acc")}), KeyError, r"ciclo\.checkpoint\(monitor='acc'\):\ no\ log\ entry.*logged\ \(e\.g\.\ after\ the\ evaluation\)\."),
    ('checkpoint_later_steps', lambda d: (ciclo.loop(S, B * 3, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)})), FileExistsError, r"checkpoint\ directory\ '.*'\ already\ holds\ checkp.*ume=\.\.\.\),\ or\ use\ another\ directory\."),
    ('restore_missing_dir', lambda d: ciclo.restore(d.T + "/nope", S), FileNotFoundError, r"checkpoint\ directory\ '.*'\ does\ not\ exist\.\ Give.*hat\ ciclo\.checkpoint\(\.\.\.\)\ wrote\ to\."),
    ('restore_file', lambda d: ciclo.restore(d.F, S), NotADirectoryError, r"checkpoint\ directory\ '.*'\ is\ a\ file\.\ Give.*hat\ ciclo\.checkpoint\(\.\.\.\)\ wrote\ to\."),
    ('restore_empty_dir', lambda d: ciclo.restore(d.T, S), FileNotFoundError, r"checkpoint\ directory\ '.*'\ holds\ no\ checkpoint\ .*hat\ ciclo\.checkpoint\(\.\.\.\)\ wrote\ to\."),
    ('restore_dir_int', lambda d: ciclo.restore(3, S), TypeError, r"a\ checkpoint\ directory\ must\ be\ a\ str\ or\ a\ pat"),
    ('restore_bad_step', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.restore(d.T, S, step=99)), FileNotFoundError, r"no\ checkpoint\ of\ step\ 99\ in\ '.*';\ it\ holds\ ste"),
    ('restore_wrong_structure', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.restore(d.T, {"other": S})), ValueError, r"cannot\ restore\ checkpoint\ 1\ in\ '.*'\ into\ this\ .*he\ old\ one\ and\ convert\ it\ yourself\."),
    ('restore_wrong_shape', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.restore(d.T, jnp.zeros(5))), ValueError, r"cannot\ restore\ checkpoint\ 1\ in\ '.*'\ into\ this\ .*he\ old\ one\ and\ convert\ it\ yourself\."),
    ('restore_best_no_monitor', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.restore_best(d.T, S)), ValueError, r"no\ checkpoint\ in\ '.*'\ has\ a\ monitored\ value,\ s.*,\ monitor='<log\ entry>',\ mode=\.\.\.\)\."),
    ('resume_other_tasks', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.loop(S, B, {ciclo.every(1): [lambda s: None, ciclo.checkpoint(d.T)], ciclo.every(2): lambda s: None}, resume=d.T)), ValueError, r"checkpoint\ 1\ in\ '.*'\ was\ written\ by\ a\ loop\ wit.*same\ order\)\ as\ the\ interrupted\ run\."),
    ('resume_wrong_structure', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.loop({"x": S}, B, {ciclo.every(1): ciclo.checkpoint(d.T)}, resume=d.T)), ValueError, r"cannot\ restore\ checkpoint\ 1\ in\ '.*'\ into\ this\ .*he\ old\ one\ and\ convert\ it\ yourself\."),
    ('evaluate_checkpoints_dataset_list', lambda d: ciclo.evaluate_checkpoints(d.T, S, 3), TypeError, r"evaluate_checkpoints:\ dataset\ must\ be\ a\ dataset\ or.*t=lambda:\ make_batches\(x_test,\ y_test\),\ or\ a\ re\-iterable\ dataset\ such\ as\ a\ list\."),
    ('evaluate_checkpoints_poll', lambda d: ciclo.evaluate_checkpoints(d.T, S, lambda: B, poll_interval=0), ValueError, r"evaluate_checkpoints\(poll_interval=0\)\ must\ be"),
    ('evaluate_checkpoints_timeout', lambda d: ciclo.evaluate_checkpoints(d.T, S, lambda: B, timeout=-1), ValueError, r"evaluate_checkpoints\(timeout=\-1\)\ must\ be\ >=\ 0"),
    ('evaluate_checkpoints_empty_dict', lambda d: ciclo.evaluate_checkpoints(d.T, S, {}), ValueError, r"evaluate_checkpoints:\ dataset\ is\ an\ empty\ dict;\ give\ a\ function\."),
    ('evaluate_checkpoints_name_int', lambda d: ciclo.evaluate_checkpoints(d.T, S, {1: lambda: B}), TypeError, r"evaluate_checkpoints:\ dataset\ names\ must\ be\ strings,\ got\ 1\."),
    ('evaluate_checkpoints_missing', lambda d: ciclo.evaluate_checkpoints(d.T + "/nope", S, lambda: B), FileNotFoundError, r"checkpoint\ directory\ '.*'\ does\ not\ exist\.\ Give.*hat\ ciclo\.checkpoint\(\.\.\.\)\ wrote\ to\."),
    ('train_loop_test_dataset_list', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, test_dataset=3), TypeError, r"test_dataset\ must\ be\ a\ dataset\ or\ a\ function.*mbda:\ make_batches\(x_test,\ y_test\),\ or\ a\ re\-iterable\ dataset\ such\ as\ a\ list\."),
    ('train_loop_epoch_str', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, epoch_duration="1"), TypeError, r"epoch_duration\ must\ be\ an\ int\ \(steps\)\ or\ a\ ci.*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('train_loop_test_name_empty', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, test_dataset=lambda: B, test_name=""), TypeError, r"test_dataset\ names\ must\ be\ non\-empty\ strings,"),
    ('train_loop_callbacks_not_list', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, callbacks=lambda s: None), TypeError, r"train_loop:\ callbacks\ must\ be\ a\ list,\ got\ function\."),
    ('train_loop_no_step', lambda d: ciclo.train_loop(3, B, {}), ValueError, r"train_loop\ has\ no\ train_step:\ give\ tasks=\{cic.*_step:\ fn\}\ or\ a\ state\ with\ `train_step`\."),
    ('train_loop_test_duration_str', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, test_dataset=lambda: B, test_duration="2"), TypeError, r"test_duration\ for\ 'test'\ must\ be\ an\ int\ \(step.*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('train_loop_test_every_str', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, test_dataset=lambda: B, test_every="2"), TypeError, r"test_every\ for\ 'test'\ must\ be\ an\ int\ \(steps\).*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('train_loop_test_every_no_test_dataset', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, test_every=2), ValueError, r"test_every\ needs\ a\ test_dataset"),
    ('train_loop_test_duration_unknown_set', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, test_dataset={"valid": lambda: B}, test_duration={"tets": 2}), ValueError, r"test_duration\ names\ \['tets'\].*evaluation\ sets\ are\ \['valid'\]\."),
    ('train_loop_epochs_and_epoch_duration', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, epochs=2, epoch_duration=1), ValueError, r"train_loop\(epochs=2,\ epoch_duration=1\):\ give\ one\ \(epochs:\ passes"),
    ('train_loop_epochs_and_stop', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, epochs=2, stop=3), ValueError, r"train_loop\(epochs=2,\ stop=3\):\ give\ one\."),
    ('train_loop_epochs_zero', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, epochs=0), ValueError, r"train_loop\(epochs=0\):\ epochs\ must\ be\ a\ positive\ int"),
    ('train_loop_epochs_generator', lambda d: ciclo.train_loop(S, (b for b in B), {ciclo.on_train_step: lambda s: None}, epochs=2), TypeError, r"train_loop\(epochs=2\):\ train_dataset\ is\ an\ ite.*or\ a\ function\ returning\ a\ fresh\ dataset\."),
    ('train_loop_epochs_factory_returns_int', lambda d: ciclo.train_loop(S, lambda: 3, {ciclo.on_train_step: lambda s: None}, epochs=2), TypeError, r"train_loop\(epochs=2\):\ train_dataset\(\)\ gave\ int,\ not\ a\ dataset\."),
    ('train_loop_unknown_keyword', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, epoch=3), TypeError, r"train_loop\(\)\ got\ an\ unexpected\ keyword\ argument\ 'epoch'\.\ Did\ you\ mean\ 'epochs'\?"),
    ('train_loop_x_y', lambda d: ciclo.train_loop(S, np.ones((8, 2)), np.ones(8)), TypeError, r"train_loop\(state,\ x,\ y\):\ the\ third\ argument\ is\ tasks.*shape\ \(8,\).*fit\(x,\ y\).*with\ epochs=\.\.\."),
    ('train_loop_test_dataset_arrays', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None, ciclo.on_test_step: lambda s: None}, test_dataset=(np.ones((8, 2)), np.ones(8))), TypeError, r"test_dataset\ is\ a\ tuple\ of\ 2\ arrays\ of\ 8\ rows.*give\ batches:\ test_dataset=\[\(x_val"),
    ('loop_resume_stopped_not_bool', lambda d: ciclo.loop(S, B, {ciclo.every(1): lambda s: None}, resume=d.T, resume_stopped="yes"), TypeError, r"loop\(resume_stopped='yes'\):\ expected\ True\ or\ False\."),
    ('test_loop_no_step', lambda d: ciclo.test_loop(3, B, {}), ValueError, r"test_loop\ has\ no\ test_step:\ give\ tasks=\{ciclo.*t_step:\ fn\}\ or\ a\ state\ with\ `test_step`\."),
    ('test_loop_dataset_int', lambda d: ciclo.test_loop(S, 3, {ciclo.on_test_step: lambda s: None}), TypeError, r"the\ dataset\ must\ be\ iterable\ \(a\ list,\ a\ gener.*y,\ call\ it:\ dataset=make_dataset\(\)\."),
    ('predict_loop_no_step', lambda d: ciclo.predict_loop(3, B, {}), ValueError, r"predict_loop\ has\ no\ predict_step:\ give\ tasks=.*tep:\ fn\}\ or\ a\ state\ with\ `predict_step`\."),
    ('predict_loop_dataset_int', lambda d: ciclo.predict_loop(S, 3, {ciclo.on_predict_step: lambda s, b: b}), TypeError, r"the\ dataset\ must\ be\ iterable\ \(a\ list,\ a\ gener.*y,\ call\ it:\ dataset=make_dataset\(\)\."),
    ('named_schedule_bad_key', lambda d: ciclo.loop(S, B, {ciclo.on_train_step: lambda s: None}), TypeError, r"tasks\ key\ ciclo\.on_train_step\ is\ a\ named\ sche.*\ a\ schedule\ such\ as\ ciclo\.every\(1\)\."),
    ('managed_train_step_int', lambda d: ciclo.managed.train_step(42), TypeError, r"ciclo\.managed\.train_step\(42\):\ expected\ the\ st.*e\ def\ train_step\(state,\ batch\):\ \.\.\."),
    ('managed_step_int', lambda d: ciclo.managed.step(42), TypeError, r"ciclo\.managed\.step\(42\):\ expected\ the\ step\ fun.*p\ above\ def\ step\(state,\ batch\):\ \.\.\."),
    ('managed_train_step_str', lambda d: ciclo.managed.train_step("f"), TypeError, r"ciclo\.managed\.train_step\('f'\):\ expected\ the\ s.*e\ def\ train_step\(state,\ batch\):\ \.\.\."),
    ('managed_strategy_unknown', lambda d: ciclo.managed.get_strategy("nope"), ValueError, r"unknown\ strategy\ 'nope';\ known\ strategies:\ \['.*d\.register_strategy\(name,\ factory\)\."),
    ('managed_strategy_int', lambda d: ciclo.managed.get_strategy(3), TypeError, r"strategy\ must\ be\ a\ name\ such\ as\ 'jit'\ or\ a\ ci"),
    ('managed_register_int', lambda d: ciclo.managed.register_strategy(3, lambda: None), TypeError, r"a\ strategy\ name\ must\ be\ a\ non\-empty\ string,\ g"),
    ('create_state_int', lambda d: ciclo.create_state(3), TypeError, r"no\ installed\ ciclo\ adapter\ handles\ it\ \(builti.*\);\ pip\ install\ ciclo\-flax,\ \-haiku\ or\ \-equinox\."),
    ('create_state_none', lambda d: ciclo.create_state(None), TypeError, r"no\ installed\ ciclo\ adapter\ handles\ it\ \(builti.*\);\ pip\ install\ ciclo\-flax,\ \-haiku\ or\ \-equinox\."),
    ('es_mode', lambda d: ciclo.early_stopping("loss", 3, mode="lowest"), ValueError, r"early_stopping:\ mode\ must\ be\ 'min'\ \(lower\ is\ .*'\ \(e\.g\.\ an\ accuracy\),\ got\ 'lowest'\."),
    ('es_patience_neg', lambda d: ciclo.early_stopping("loss", -1), TypeError, r"early_stopping:\ patience\ must\ be\ a\ number\ of\ .*ch\ as\ ciclo\.at\(steps=1000\),\ got\ \-1\."),
    ('es_patience_float', lambda d: ciclo.early_stopping("loss", 1.5), TypeError, r"early_stopping:\ patience\ must\ be\ a\ number\ of\ .*h\ as\ ciclo\.at\(steps=1000\),\ got\ 1\.5\."),
    ('es_monitor_int', lambda d: ciclo.early_stopping(3, 2), TypeError, r"early_stopping:\ monitor\ must\ be\ the\ name\ of\ a.*\ or\ 'metrics\.accuracy_test',\ got\ 3\."),
    ('es_monitor_empty', lambda d: ciclo.early_stopping("", 2), TypeError, r"early_stopping:\ monitor\ must\ be\ the\ name\ of\ a.*or\ 'metrics\.accuracy_test',\ got\ ''\."),
    ('es_min_delta_neg', lambda d: ciclo.early_stopping("loss", 2, min_delta=-1.0), ValueError, r"early_stopping:\ min_delta\ must\ be\ >=\ 0,\ got\ \-"),
    ('es_min_delta_mode', lambda d: ciclo.early_stopping("loss", 2, min_delta_mode="pct"), ValueError, r"early_stopping:\ min_delta_mode\ must\ be\ 'abs'\ .*\ by\ min_delta\ \*\ \|best\|\),\ got\ 'pct'\."),
    ('es_start_from_str', lambda d: ciclo.early_stopping("loss", 2, start_from="1"), TypeError, r"start_from\ must\ be\ an\ int\ \(steps\)\ or\ a\ ciclo\..*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('es_never_logged', lambda d: ciclo.loop(S, B, {ciclo.every(1): ciclo.early_stopping("loss", 2)}), KeyError, r"early_stopping:\ monitor\ 'loss'\ is\ not\ in\ the\ .*ng,\ or\ the\ step\ that\ should\ log\ it\."),
    ('tqdm_total_str', lambda d: ciclo.tqdm_bar("10"), TypeError, r"tqdm_bar\(total\)\ must\ be\ an\ int\ \(steps\)\ or\ a\ c.*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('tqdm_total_float', lambda d: ciclo.tqdm_bar(1.5), TypeError, r"tqdm_bar\(total\)\ must\ be\ an\ int\ \(steps\)\ or\ a\ c.*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('tqdm_interval_neg', lambda d: ciclo.tqdm_bar(10, interval=-1), ValueError, r"tqdm_bar:\ interval\ must\ be\ >=\ 0\ seconds,\ got\ "),
    ('keras_total_str', lambda d: ciclo.keras_bar("10"), TypeError, r"keras_bar\(total\)\ must\ be\ an\ int\ \(steps\)\ or\ a\ .*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('keras_interval_neg', lambda d: ciclo.keras_bar(10, interval=-1), ValueError, r"keras_bar:\ interval\ must\ be\ >=\ 0\ seconds,\ got"),
    ('csv_missing_parent', lambda d: ciclo.csv_logger(d.T + "/no/such/x.csv"), FileNotFoundError, r"csv_logger:\ the\ directory\ of\ '.*/no/such/x\.csv'\ does\ not\ exist\.$"),
    ('inner_name_empty', lambda d: ciclo.inner_loop("", lambda state: ciclo.test_loop(state, B, {})), TypeError, r"inner_loop\ name\ must\ be\ a\ non\-empty\ string,\ g"),
    ('inner_fn_int', lambda d: ciclo.inner_loop("valid", 3), TypeError, r"inner_loop\('valid'\):\ loop_fn\ must\ be\ a\ function,\ got\ 3\."),
    ('inner_aggregation_bad', lambda d: ciclo.inner_loop("valid", lambda state: None, aggregation="median"), ValueError, r"unknown\ aggregation\ 'median';\ use\ one\ of\ \('l.*sum',\ 'min',\ 'max'\),\ a\ callable\ or\ None\."),
    ('inner_returns_int', lambda d: ciclo.loop(S, B, {ciclo.every(1): ciclo.inner_loop("valid", lambda state: 3)}), TypeError, r"inner_loop\('valid'\):\ the\ loop\ function\ returned\ int,\ not\ \(state,\ history,\ elapsed\)\."),
    ('logs_entry_missing_2', lambda d: ciclo.logs().add_loss("loss", 1.0).entry_value("lost"), KeyError, r"no\ log\ entry\ 'lost';\ entries:\ \['losses\.loss'\]"),
    ('at_float_steps', lambda d: ciclo.at(steps=1.5), TypeError, r"at\(\):\ steps\ must\ be\ a\ whole\ number,\ got\ 1\.5;\ or\ count\ samples\."),
    ('at_date_str', lambda d: ciclo.at(date="tomorrow"), TypeError, r"at\(\):\ date\ must\ be\ a\ number,\ got\ 'tomorrow'\ \("),
    ('at_time_neg', lambda d: ciclo.at(time=-1), ValueError, r"at\(\):\ time\ must\ be\ non\-negative,\ got\ \-1\."),
    ('every_list', lambda d: ciclo.every([1]), TypeError, r"every\(\):\ steps\ must\ be\ a\ number,\ got\ \[1\]\ \(lis"),
    ('after_float_steps', lambda d: ciclo.after(steps=2.5), TypeError, r"after\(\):\ steps\ must\ be\ a\ whole\ number,\ got\ 2\.5;\ or\ count\ samples\."),
    ('after_two', lambda d: ciclo.after(steps=1, time=2), ValueError, r"after\(\)\ needs\ exactly\ one\ period:\ steps,\ samples\ or\ time,\ got\ \{'steps':\ 1,\ 'time':\ 2\}\."),
    ('loop_on_start_int', lambda d: ciclo.loop(S, B, {}, on_start=3), TypeError, r"3\ is\ not\ a\ callback:\ give\ a\ function\ taking\ t.*loop_callback__\(loop_state\)\ method\."),
    ('loop_schedule_none_key', lambda d: ciclo.loop(S, B, {None: lambda s: None}), TypeError, r"a\ schedule\ must\ be\ a\ function\ Elapsed\ \->\ bool,\ got\ None\."),
    ('loop_tasks_tuple_of_int', lambda d: ciclo.loop(S, B, {ciclo.every(1): (3,)}), TypeError, r"3\ is\ not\ a\ callback:\ give\ a\ function\ taking\ t.*loop_callback__\(loop_state\)\ method\."),
    ('train_test_dict_value_list', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, test_dataset={"valid": iter(B)}), TypeError, r"test_dataset\['valid'\]\ is\ an\ iterator.*mbda:\ make_batches\(x_test,\ y_test\),\ or\ a\ re\-iterable\ dataset\ such\ as\ a\ list\."),
    ('train_stop_str', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, stop="3"), TypeError, r"stop\ must\ be\ an\ int\ \(steps\)\ or\ a\ ciclo\.at\(\.\.\..*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('train_history_list', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, history=[]), TypeError, r"loop\(history=\[\]\):\ expected\ a\ ciclo\.History\ \(e.*r\ loop\ returned\)\ or\ None,\ got\ list\."),
    ('train_elapsed_int', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, elapsed=3), TypeError, r"loop\(elapsed=3\):\ expected\ a\ ciclo\.Elapsed\ \(wh.*\ ciclo\.loop\(\.\.\.\)\)\ or\ None,\ got\ int\."),
    ('train_tasks_list', lambda d: ciclo.train_loop(S, B, [lambda s: None]), TypeError, r"train_loop:\ tasks\ must\ be\ a\ dict\ of\ schedules,\ got\ list\."),
    ('train_callbacks_int', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, callbacks=[3]), TypeError, r"callback\ int\ has\ no\ hook\ that\ train_loop\ call.*tasks=\{ciclo\.every\(100\):\ callback\}\."),
    ('train_test_step_missing', lambda d: ciclo.train_loop(S, B, {ciclo.on_train_step: lambda s: None}, test_dataset=lambda: B), ValueError, r"train_loop\ got\ a\ test_dataset\ but\ no\ test\ ste.*\ a\ state\ with\ a\ `test_step`\ method\."),
    ('train_dataset_int', lambda d: ciclo.train_loop(S, 3, {ciclo.on_train_step: lambda s: None}), TypeError, r"the\ dataset\ must\ be\ iterable\ \(a\ list,\ a\ gener.*y,\ call\ it:\ dataset=make_dataset\(\)\."),
    ('test_tasks_list', lambda d: ciclo.test_loop(S, B, [lambda s: None]), TypeError, r"test_loop:\ tasks\ must\ be\ a\ dict\ of\ schedules,\ got\ list\."),
    ('test_stop_str', lambda d: ciclo.test_loop(S, B, {ciclo.on_test_step: lambda s: None}, stop="1"), TypeError, r"stop\ must\ be\ an\ int\ \(steps\)\ or\ a\ ciclo\.at\(\.\.\..*e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('predict_tasks_list', lambda d: ciclo.predict_loop(S, B, [lambda s: None]), TypeError, r"predict_loop:\ tasks\ must\ be\ a\ dict\ of\ schedules,\ got\ list\."),
    ('test_every_key_ok', lambda d: ciclo.test_loop(S, B, {ciclo.on_train_step: lambda s: None}), ValueError, r"ciclo\.on_train_step\ is\ not\ a\ moment\ of\ test_l.*ep,\ on_test_batch_end,\ on_test_end\."),
    ('ms_create_tx_int', lambda d: ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=3), TypeError, r"tx\ must\ be\ an\ optax\ optimizer\ such\ as\ optax\.a"),
    ('ms_create_strategy_bad', lambda d: ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1), strategy="nope"), ValueError, r"unknown\ strategy\ 'nope';\ known\ strategies:\ \['.*d\.register_strategy\(name,\ factory\)\."),
    ('ms_create_strategy_int', lambda d: ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1), strategy=3), TypeError, r"strategy\ must\ be\ a\ name\ such\ as\ 'jit'\ or\ a\ ci"),
    ('ms_replace_unknown', lambda d: ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1)).replace(nope=1), TypeError, r"ManagedState\.replace\(\)\ got\ an\ unknown\ field\ '.*t\ create\(\.\.\.,\ extra=\{'nope':\ \.\.\.\}\)\."),
    ('ms_getattr_unknown', lambda d: ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1)).nope, AttributeError, r"ManagedState\ has\ no\ field\ 'nope'\ Extra\ fields"),
    ('mstep_statics_unhashable', lambda d: ciclo.managed.train_step(lambda state, batch, broadcasts, statics: None)(MS, B[0], statics=[1]), TypeError, r"managed\ step\ <lambda>:\ statics\ must\ be\ hashab.*ataclass;\ put\ arrays\ in\ broadcasts\."),
    ('mstep_bad_args', lambda d: ciclo.managed.train_step(lambda state, batch: None)(MS, B[0], broadcasts=1), TypeError, r"managed\ step\ <lambda>\ was\ given\ broadcasts,\ b.*e,\ batch,\ broadcasts,\ statics\):\ \.\.\."),
    ('mstep_many_empty', lambda d: ciclo.managed.train_step(lambda state, batch: None).many(MS, []), ValueError, r"<lambda>\.many\(state,\ batches\)\ needs\ at\ least\ "),
    ('strategy_jit_bad', lambda d: ciclo.managed.jit(steps_per_call=0), ValueError, r"jit\(steps_per_call=\.\.\.\)\ must\ be\ a\ positive\ in.*t\ 0;\ steps_per_call=1\ turns\ it\ off\."),
    ('strategy_jit_str', lambda d: ciclo.managed.jit(steps_per_call="2"), ValueError, r"jit\(steps_per_call=\.\.\.\)\ must\ be\ a\ positive\ in.*'2';\ steps_per_call=1\ turns\ it\ off\."),
    ('register_strategy_fn_int', lambda d: ciclo.managed.register_strategy("mine", 3), TypeError, r"register_strategy\('mine',\ factory\):\ factory\ m.*ng\ a\ ciclo\.managed\.Strategy,\ got\ 3\."),
    ('register_strategy_empty', lambda d: ciclo.managed.register_strategy("", lambda: None), TypeError, r"a\ strategy\ name\ must\ be\ a\ non\-empty\ string,\ g"),
    ('create_state_int_2', lambda d: ciclo.create_state(3), TypeError, r"no\ installed\ ciclo\ adapter\ handles\ it\ \(builti.*\);\ pip\ install\ ciclo\-flax,\ \-haiku\ or\ \-equinox\."),
    ('ckpt_async_str', lambda d: ciclo.checkpoint(d.T, async_save="yes"), TypeError, r"checkpoint\(async_save='yes'\):\ expected\ True\ o"),
    ('restore_step_str', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.restore(d.T, S, step="1")), TypeError, r"restore\(step='1'\):\ pass\ an\ int\ \(Checkpoint\.all_steps\(\)\)\ or\ None\."),
    ('restore_best_file', lambda d: ciclo.restore_best(d.F, S), NotADirectoryError, r"checkpoint\ directory\ '.*'\ is\ a\ file\.\ Give.*hat\ ciclo\.checkpoint\(\.\.\.\)\ wrote\ to\."),
    ('restore_best_missing', lambda d: ciclo.restore_best(d.T + "/nope", S), FileNotFoundError, r"checkpoint\ directory\ '.*'\ does\ not\ exist\.\ Give.*hat\ ciclo\.checkpoint\(\.\.\.\)\ wrote\ to\."),
    ('resume_generator_too_short', lambda d: (ciclo.loop(S, iter(B * 3), {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.loop(S, iter(B), {ciclo.every(1): ciclo.checkpoint(d.T)}, resume=d.T, stop=5)), ValueError, r"the\ dataset\ ended\ after\ 1\ batches\ while\ skipp.*umed:\ resume\ with\ the\ same\ dataset\."),
    ('piecewise_mixed_units_out_of_order', lambda d: ciclo.loop(S, B * 4, {ciclo.piecewise({ciclo.at(samples=100): ciclo.every(1), 2: ciclo.every(2)}): lambda state: None}), ValueError, r"piecewise\(\):\ ciclo\.at\(steps=2\)\ was\ reached\ be.*100\);\ write\ starts\ in\ the\ order\ reached\."),
    ('generator_reused_after_exhausted', lambda d: ciclo.loop(S, used_up(), {ciclo.every(1): lambda state: None}), ValueError, r"loop\(dataset=\.\.\.\)\ is\ a\ generator\ that\ is\ already\ exhausted.*call\ its\ function\ again\ for\ a\ new\ one"),
    ('test_dataset_empty', lambda d: ciclo.train_loop(S, B * 2, STEPS, test_dataset=lambda: [], epoch_duration=1), ValueError, r"the\ evaluation\ saw\ no\ batch:\ test_dataset\ yielded\ nothing.*give\ a\ function\ returning\ a\ fresh\ dataset"),
    ('test_dataset_exhausted_iterator', lambda d: ciclo.train_loop(S, B * 2, STEPS, test_dataset={"valid": (lambda it: lambda: it)(iter(B))}, epoch_duration=1), ValueError, r"the\ evaluation\ saw\ no\ batch:\ test_dataset\['valid'\]\ yielded\ nothing.*an\ earlier\ evaluation\ used\ up"),
    ('test_dataset_iterator', lambda d: ciclo.train_loop(S, B * 2, STEPS, test_dataset=iter(B)), TypeError, r"test_dataset\ is\ an\ iterator\ \(list_iterator\),\ which\ the\ first.*or\ a\ re\-iterable\ dataset\ such\ as\ a\ list\."),
    ('test_loop_empty_dataset', lambda d: ciclo.test_loop(S, [], {ciclo.on_test_step: STEPS[ciclo.on_test_step]}), ValueError, r"the\ evaluation\ saw\ no\ batch:\ test_loop\(dataset=\.\.\.\)\ yielded\ nothing"),
    ('evaluate_checkpoints_iterator', lambda d: ciclo.evaluate_checkpoints(d.T, S, iter(B)), TypeError, r"evaluate_checkpoints:\ dataset\ is\ an\ iterator.*called\ for\ each\ checkpoint\)"),
    ('es_monitor_never_logged_in_train_loop', lambda d: ciclo.train_loop(S, B * 4, STEPS, callbacks=[ciclo.early_stopping("val_loss", 2)], test_dataset=lambda: B, epoch_duration=2), KeyError, r"early_stopping:\ monitor\ 'val_loss'\ is\ not\ in\ the\ logs.*'losses\.loss_test'.*check\ the\ spelling"),
    ('restore_every_file_truncated', lambda d: (ciclo.loop(S, B * 3, {ciclo.every(1): ciclo.checkpoint(d.T)}), truncate_latest(d.T), ciclo.restore(d.T, S, step=3)), ValueError, r"checkpoint\ 3\ in\ '.*'\ is\ damaged:\ cannot\ read\ '.*_CHECKPOINT_METADATA'.*resume=,\ which\ falls\ back\ to\ the\ newest\ intact\ checkpoint;\ move\ '.*3'\ away"),
    ('elapse_batch_size_fn_neg', lambda d: list(ciclo.elapse(B * 2, batch_size_fn=lambda b: -8)), ValueError, r"elapse\(batch_size_fn=<lambda>\)\ returned\ \-8;.*samples\ in\ the\ batch,\ an\ int\ >=\ 0\."),
    ('elapse_batch_size_fn_str', lambda d: list(ciclo.elapse(B * 2, batch_size_fn=lambda b: "x")), TypeError, r"elapse\(batch_size_fn=<lambda>\)\ returned\ 'x';.*samples\ in\ the\ batch,\ an\ int\ >=\ 0\."),
    ('elapse_batch_size_fn_not_callable', lambda d: ciclo.elapse(B, batch_size_fn=3), TypeError, r"elapse\(batch_size_fn=3\):\ expected\ a\ function\ batch\ \->\ int"),
    ('loop_stop_neg', lambda d: ciclo.loop(S, B, {}, stop=-1), ValueError, r"stop\ must\ not\ be\ negative,\ got\ \-1;\ e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('train_epoch_duration_neg', lambda d: ciclo.train_loop(S, B, STEPS, epoch_duration=-1), ValueError, r"epoch_duration\ must\ not\ be\ negative,\ got\ \-1;\ e\.g\.\ 1000\ or\ ciclo\.at\(samples=600\)\."),
    ('keras_bar_total_neg', lambda d: ciclo.keras_bar(total=-1), ValueError, r"keras_bar\(total\)\ must\ not\ be\ negative,\ got\ \-1"),
    ('tqdm_bar_total_neg', lambda d: ciclo.tqdm_bar(total=-1), ValueError, r"tqdm_bar\(total\)\ must\ not\ be\ negative,\ got\ \-1"),
    ('train_loop_empty_dataset', lambda d: ciclo.train_loop(S, [], STEPS), ValueError, r"train_loop\(train_dataset=\.\.\.\)\ is\ empty:\ give\ a\ dataset\ of\ batches"),
    ('register_strategy_built_in', lambda d: ciclo.managed.register_strategy("jit", lambda: ciclo.managed.jit()), ValueError, r"register_strategy\('jit',\ factory\):\ 'jit'\ is\ a\ built\-in\ strategy.*pass\ replace=True\ to\ replace\ it\."),
    ('ms_create_key_str', lambda d: ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1), key="abc"), TypeError, r"ManagedState\.create\(key='abc'\):\ key\ must\ be\ a\ JAX\ random\ key\ such\ as\ jax\.random\.key\(0\),\ an\ int\ seed,\ or\ None"),
    ('ms_create_step', lambda d: ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1), step=5), TypeError, r"ManagedState\.create\(\)\ does\ not\ take\ 'step':\ it\ sets\ step=0.*state\.replace\(step=\.\.\.\)"),
    ('ms_create_opt_state', lambda d: ciclo.managed.ManagedState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(0.1), opt_state=None), TypeError, r"ManagedState\.create\(\)\ does\ not\ take\ 'opt_state':.*state\.replace\(opt_state=\.\.\.\)"),
    ('loop_max_steps_in_flight_neg', lambda d: ciclo.loop(S, B, {}, max_steps_in_flight=-1), ValueError, r"max_steps_in_flight\ must\ be\ an\ int\ >=\ 0.*got\ \-1\."),
    ('terminate_on_nan_interval_neg', lambda d: ciclo.terminate_on_nan(interval=-1), ValueError, r"terminate_on_nan\(interval=\-1\): expected seconds >= 0\."),
    ('csv_logger_directory', lambda d: ciclo.csv_logger(d.T), IsADirectoryError, r"csv_logger:\ '.*'\ is\ a\ directory;\ give\ a\ file's\ path\.$"),
    ('resume_other_kind_of_schedule', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.loop(S, B * 2, {ciclo.every(1) | ciclo.every(3): ciclo.checkpoint(d.T)}, resume=d.T)), ValueError, r"cannot\ restore\ schedule\ .*\(task\ 0\)\ from\ checkpoint\ 1\ in\ '.*':\ the\ checkpoint\ holds\ the\ state\ of\ another\ kind\ of\ schedule.*Resume\ with\ the\ same\ tasks"),
    ('restore_float_into_int', lambda d: (ciclo.loop(S, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.restore(d.T, jnp.zeros(2, jnp.int32))), ValueError, r"cannot\ restore\ checkpoint\ 1\ in\ '.*'\ into\ this\ state:.*the\ state\ \(one\ array\):\ float32\ in\ the\ checkpoint,\ int32\ in\ the\ state\ \(restoring\ would\ cast\ the\ values\).*convert\ it\ yourself\."),
    ('restore_float_leaf_into_int', lambda d: (ciclo.loop({"w": S}, B, {ciclo.every(1): ciclo.checkpoint(d.T)}), ciclo.restore(d.T, {"w": jnp.zeros(2, jnp.int32)})), ValueError, r"\['w'\]:\ float32\ in\ the\ checkpoint,\ int32\ in\ the\ state"),
    ('logs_add_loss_str', lambda d: ciclo.logs().add_loss("loss", "abc"), TypeError, r"logs\(\)\.add_loss\('loss',\ 'abc'\):\ the\ value\ is\ a\ str;.*add_entry\('text',\ 'loss',\ \.\.\.\)\ or\ add_output\."),
    ('logs_add_metrics_str', lambda d: ciclo.logs().add_metrics(acc="high"), TypeError, r"logs\(\)\.add_metric\('acc',\ 'high'\):\ the\ value\ is\ a\ str"),
    ('managed_train_step_int_params', lambda d: int_params_step(), TypeError, r"managed\ train\ step\ <lambda>:\ params\ hold\ integer\ leaves\ \[\"\['w'\]\ \(int32\)\"\].*extra=\{\.\.\.\}\)\."),
    ('mesh_batch_axis_over_processes', lambda d: ciclo.managed._strategies.check_feedable("sharded", np.array([[FakeDevice(0), FakeDevice(1)]]), ["data", "model"], ["data"]), ValueError, r"sharded:\ the\ mesh\ \{'data':\ 1,\ 'model':\ 2\}\ cannot\ be\ fed.*spans\ the\ 2\ processes.*size\ of\ 2.*jax\.make_mesh\(\(2,\ 1\),\ \('data',\ 'model'\)\)"),
    ('resume_stateful_into_list', lambda d: (ciclo.loop(S, SD(), {ciclo.every(1): ciclo.checkpoint(d.T)}, stop=2), ciclo.loop(S, B * 3, {ciclo.every(1): ciclo.checkpoint(d.T)}, resume=d.T)), TypeError, r"the\ checkpoint\ holds\ the\ dataset's\ state_dict.*\ of\ dataset\ as\ the\ interrupted\ run\."),
]
# fmt: on


@pytest.fixture
def d(tmp_path: Path) -> types.SimpleNamespace:
    (tmp_path / "file").write_text("")
    return types.SimpleNamespace(T=str(tmp_path / "dir"), F=str(tmp_path / "file"))


def test_the_suite_has_at_least_150_cases() -> None:
    assert len(CASES) >= 150
    assert len({name for name, *_ in CASES}) == len(CASES)


def test_an_empty_dataset_in_loop_is_a_warning_naming_it() -> None:
    with pytest.warns(RuntimeWarning, match=r"loop\(dataset=\.\.\.\) is empty .* runs no step"):
        _, _, elapsed = ciclo.loop(S, [], {})
    assert elapsed.steps == 0


@pytest.mark.parametrize(("name", "call", "error", "match"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_gets_an_error_naming_the_culprit_and_the_fix(
    d: types.SimpleNamespace, name: str, call: Any, error: type[BaseException], match: str
) -> None:
    os.makedirs(d.T, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error) as info:
            call(d)
    message = str(info.value.args[0]) if isinstance(info.value, KeyError) else str(info.value)
    assert re.search(match, message, re.DOTALL), f"{name}: {message}"


# === one case each, where a table row is not enough ======================================

ONE_BATCH = [np.zeros((2, 1), np.float32)]


def run_one_step(callback, state=None):
    return ciclo.loop(state, ONE_BATCH, {ciclo.every(1): callback})


# --- callbacks ------------------------------------------------------------------------------


def test_a_callback_needing_more_than_four_positional_arguments():
    def too_many(state, batch, elapsed, loop_state, extra):
        return None

    with pytest.raises(
        TypeError,
        match=r"callback .*too_many\(state, batch, elapsed, loop_state, extra\) needs 5 "
        r"positional arguments.*at most 4: the first 0-4 of \(state, batch, elapsed, loop_state\)",
    ):
        run_one_step(too_many)


def test_too_many_required_arguments_are_caught_with_star_args_too():
    def too_many(a, b, c, d, e, *rest):
        return None

    with pytest.raises(TypeError, match=r"too_many.*needs 5 positional arguments"):
        run_one_step(too_many)


def test_a_callback_needing_keyword_only_arguments():
    def configured(state, *, learning_rate):
        return None

    with pytest.raises(
        TypeError, match=r"configured.*keyword-only arguments \['learning_rate'\].*partial"
    ):
        run_one_step(configured)


def test_a_callback_returning_a_four_tuple():
    def four(state):
        return None, None, None, state

    with pytest.raises(
        TypeError,
        match=r"callback .*four returned a tuple of 4 items; a callback returns \(logs, state\), "
        r"\(outputs, logs, state\)",
    ):
        run_one_step(four, state=0)


@pytest.mark.parametrize(
    ("returned", "described"),
    [
        ((3.0, "state"), "float 3.0"),
        ((np.float32(1.5), "state"), r"float32 .*1\.5"),
        ((None, [1, 2], "state"), "list"),
        (({"accuracy": 0.5, "nested": {"a": 1}}, "state"), r"a dict with keys \['accuracy'"),
    ],
)
def test_a_non_logs_where_logs_are_expected(returned, described):
    def step(state):
        return returned

    with pytest.raises(
        TypeError,
        match=rf"callback .*step returned the logs part of its tuple that is not logs: "
        rf"{described}.*\{{collection: \{{name: value\}}\}}",
    ):
        run_one_step(step)


def test_a_dict_not_shaped_like_logs_is_never_taken_as_the_state():
    def returns_state_dict(state):
        return {"w": np.ones(3), "step": 1}

    with pytest.raises(
        TypeError,
        match=r"returns_state_dict returned a dict that is not logs: a dict with keys "
        r"\['w', 'step'\].*return \(None, state\)",
    ):
        run_one_step(returns_state_dict, state={"w": np.zeros(3), "step": 0})


def test_a_non_callable_callback():
    with pytest.raises(TypeError, match=r"42 is not a callback.*__loop_callback__"):
        run_one_step(42)


def test_a_callback_raising_gets_a_note_naming_it_and_the_step():
    def explode(state, batch, elapsed):
        if elapsed.steps == 2:
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as info:
        ciclo.loop(None, ONE_BATCH * 5, {ciclo.every(1): explode})
    assert info.value.__notes__ == [
        "(in ciclo callback "
        "test_a_callback_raising_gets_a_note_naming_it_and_the_step.<locals>.explode at step 2)"
    ]


def test_a_hook_raising_gets_a_note_too():
    def end():
        raise RuntimeError("bad end")

    with pytest.raises(RuntimeError, match="bad end") as info:
        ciclo.loop(None, ONE_BATCH * 3, on_end=end)
    assert info.value.__notes__[0].endswith("end at step 3)")


# --- tasks and schedules --------------------------------------------------------------------


def test_tasks_must_be_a_dict_of_schedules():
    with pytest.raises(TypeError, match=r"tasks must be a dict .*got list"):
        ciclo.loop(None, ONE_BATCH, [lambda: None])
    with pytest.raises(TypeError, match=r"tasks key 'on_train_step' is a name.*train_loop"):
        ciclo.loop(None, ONE_BATCH, {"on_train_step": lambda: None})
    with pytest.raises(TypeError, match=r"a schedule must be a function Elapsed -> bool, got 3\."):
        ciclo.loop(None, ONE_BATCH, {3: lambda: None})
    with pytest.raises(TypeError, match=r"a schedule must be .*got 'x'"):
        ciclo.every(2) & "x"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: ciclo.every(),
            r"every\(\) needs exactly one period: steps, samples or time, got none",
        ),
        (
            lambda: ciclo.every(2, samples=10),
            r"every\(\) needs exactly one period.*got \{'steps': 2, 'samples': 10\}",
        ),
        (lambda: ciclo.every(-1), r"every\(\): steps must be positive, got -1"),
        (lambda: ciclo.every(samples=-64), r"every\(\): samples must be positive, got -64"),
        (lambda: ciclo.every(time=-0.5), r"every\(\): time must be positive, got -0.5"),
        (lambda: ciclo.every(0), r"every\(\): steps must be positive, got 0"),
        (lambda: ciclo.after(), r"after\(\) needs exactly one period"),
        (lambda: ciclo.after(-3), r"after\(\): steps must be non-negative, got -3"),
        (lambda: ciclo.after(5).every(), r"after\(\).every\(\) needs exactly one period"),
        (lambda: ciclo.after(5).every(-2), r"after\(\).every\(\): steps must be positive"),
        (lambda: ciclo.at(), r"at\(\) needs a period: give steps, samples, time or date"),
        (lambda: ciclo.at(-1), r"at\(\): steps must be non-negative, got -1"),
        (lambda: ciclo.at(samples=-10), r"at\(\): samples must be non-negative, got -10"),
        (lambda: ciclo.at(time=-1.0), r"at\(\): time must be non-negative"),
        (lambda: ciclo.piecewise({}), r"piecewise\(\) needs at least one"),
        (
            lambda: ciclo.piecewise({10: ciclo.always(), 0: ciclo.never()}),
            r"piecewise\(\) starts must be increasing, got \[10, 0\]",
        ),
        (
            lambda: ciclo.after(samples=10).every(steps=2),
            r"after\(samples=...\).every\(\) must count in the same unit, got steps",
        ),
    ],
)
def test_bad_periods(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ciclo.every("10"), r"every\(\): steps must be a number, got '10' \(str\)"),
        (lambda: ciclo.every(True), r"every\(\): steps must be a number, got True \(bool\)"),
        (lambda: ciclo.at(time="1h"), r"at\(\): time must be a number, got '1h'"),
    ],
)
def test_periods_of_the_wrong_type(make, match):
    with pytest.raises(TypeError, match=match):
        make()


# --- datasets and stop ----------------------------------------------------------------------


@pytest.mark.parametrize("dataset", [42, None, np.float32(1.0)])
def test_a_non_iterable_dataset(dataset):
    name = type(dataset).__name__
    with pytest.raises(TypeError, match=rf"the dataset must be iterable .*got {name}"):
        ciclo.loop(None, dataset, {})
    with pytest.raises(TypeError, match=rf"the dataset must be iterable .*got {name}"):
        ciclo.elapse(dataset)


def test_a_dataset_factory_passed_uncalled_says_to_call_it():
    def make_dataset():
        yield from ONE_BATCH

    with pytest.raises(TypeError, match=r"got function\. For a factory, call it"):
        ciclo.loop(None, make_dataset)


@pytest.mark.parametrize("stop", [1.5, "100", True, [10], {"steps": 3}])
def test_a_stop_of_the_wrong_type(stop):
    match = (
        rf"stop must be an int \(steps\) or a ciclo.at\(...\) Period, got .*"
        rf"\({type(stop).__name__}\); e\.g\. 1000 or ciclo\.at\(samples=600\)\.$"
    )
    with pytest.raises(TypeError, match=match):
        ciclo.loop(None, ONE_BATCH, stop=stop)
    with pytest.raises(TypeError, match=match):
        ciclo.elapse(ONE_BATCH, stop=stop)


# --- logs and history -----------------------------------------------------------------------


def test_reading_logs_updates():
    logs = ciclo.logs().add_loss("loss", 1.0)
    with pytest.raises(
        AttributeError, match=r"Logs.updates is write-only: `logs.updates = other` merges"
    ):
        _ = logs.updates
    assert not hasattr(logs, "updates")


def test_a_logs_collection_that_is_not_a_mapping():
    with pytest.raises(TypeError, match=r"Logs collection 'metrics' must be a mapping.*float"):
        ciclo.Logs({"metrics": 0.5})


def _history_with_ambiguous_loss():
    history = ciclo.history()
    elapsed = ciclo.Elapsed.create()
    history.commit(elapsed, ciclo.logs().add_loss("loss", 1.0).add_metric("loss", 2.0))
    history.commit(elapsed, ciclo.logs().add_metric("accuracy", 0.5))
    return history


def test_an_unknown_key_in_collect_lists_the_available_keys():
    history = _history_with_ambiguous_loss()
    with pytest.raises(
        KeyError,
        match=r"history has no key 'acc'; available keys: \['elapsed.date', .*"
        r"'losses.loss', 'metrics.accuracy', 'metrics.loss'\]",
    ):
        history.collect("steps", "acc")


def test_an_ambiguous_key_in_collect_lists_the_candidates():
    history = _history_with_ambiguous_loss()
    with pytest.raises(
        KeyError,
        match=r"history key 'loss' is ambiguous; it could be any of "
        r"\['losses.loss', 'metrics.loss'\]\. Ask for one of them by its full name",
    ):
        history.collect("steps", "loss")
    assert history.collect("metrics.loss") == [2.0]


def test_an_elapsed_name_shadowed_by_a_log_entry_is_ambiguous():
    history = ciclo.history()
    history.commit(ciclo.Elapsed.create(), ciclo.logs().add_metric("steps", 7))
    with pytest.raises(KeyError, match=r"\['elapsed.steps', 'metrics.steps'\]"):
        history.collect("steps")
    assert history.collect("elapsed.steps", "metrics.steps") == ([0], [7])


def test_collect_needs_a_key():
    with pytest.raises(ValueError, match=r"collect\(\) needs at least one key"):
        ciclo.history().collect()


# === typos in field and option names: errors that name the close match ===================


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
