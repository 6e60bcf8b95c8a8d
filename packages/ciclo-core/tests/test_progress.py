"""keras_bar and tqdm_bar: the rendered text, units, and fetching only when redrawing."""

from __future__ import annotations

import io
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo
from ciclo.callbacks._progress import Frame


@jax.jit
def train_step(state, batch):
    loss = 1.0 / (state + 1.0)
    logs = ciclo.logs().add_loss("loss", loss).add_metric("accuracy", 1.0 - loss)
    return logs, state + 1.0


@jax.jit
def eval_step(state, batch):
    return ciclo.logs().add_metric("accuracy", state / 100.0)


def batches(n, size=4):
    return [np.zeros((size, 2), np.float32)] * n


def test_keras_bar_final_line_shows_total_and_metric_values(capsys):
    _, history, _ = ciclo.train_loop(
        jnp.float32(0.0),
        batches(12),
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        callbacks=[ciclo.keras_bar(12)],  # stdout: not a terminal under capsys
        test_dataset=lambda: batches(1),
        epoch_duration=4,
    )
    lines = capsys.readouterr().out.splitlines()
    assert "\r" not in "".join(lines)  # plain lines when not on a terminal
    last = lines[-1]
    assert re.match(r"^12/12 \[={30}\] - \d+s \d+(s|ms|us)/step - ", last), last
    loss, accuracy, accuracy_test = (
        history.collect(k)[-1] for k in ("loss", "accuracy", "accuracy_test")
    )
    assert last.endswith(
        f"- accuracy: {accuracy:.4f} - accuracy_test: {accuracy_test:.4f} - loss: {loss:.4f}"
    )
    assert accuracy_test == pytest.approx(0.12)
    # a line per epoch end (with the new evaluation), before the final one
    assert any(
        line.startswith(" 4/12 [=========>") and "accuracy_test: 0.0400" in line for line in lines
    )


def test_keras_bar_redraws_in_place_on_a_terminal():
    out = io.StringIO()
    bar = ciclo.keras_bar(5, interval=0, dynamic=True, width=10, file=out)
    ciclo.loop(jnp.float32(0.0), batches(5), {ciclo.every(1): train_step, **bar})
    text = out.getvalue()
    frames = text.split("\r")[1:]
    assert [f.split(" ")[0] for f in frames] == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert frames[1].startswith("2/5 [===>......] - ETA: ")
    assert frames[-1].startswith("5/5 [==========] - ")
    assert frames[-1].endswith("\n")
    assert text.count("\n") == 1


def test_keras_bar_counts_samples():
    out = io.StringIO()
    bar = ciclo.keras_bar(ciclo.at(samples=30), interval=0, file=out, width=10)
    ciclo.loop(
        jnp.float32(0.0),
        batches(20),
        {ciclo.every(1): train_step, **bar},
        stop=ciclo.at(samples=30),
    )
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(" 4/30 [>.........] - accuracy: 0.0000 - loss: 1.0000")
    assert re.match(r"^30/30 \[=+\] - \d+s \d+(s|ms|us)/sample - accuracy", lines[-1])


def test_keras_bar_line_for_time_totals():
    bar = ciclo.keras_bar(ciclo.at(time=120), width=10)
    line = bar.line(Frame(30.0, {"loss": 0.5}, 90.0, (30.0, 30.0), False))
    assert line == "30s/120s [=>........] - ETA: 1:30 - loss: 0.5000"
    assert bar.line(Frame(130.0, {}, None, (130.0, 130.0), True)) == "120s/120s [==========] - 130s"


def test_keras_bar_fetches_only_when_redrawing(count_fetches):
    history = ciclo.history(fetch_interval=1e9)  # the history fetches only when read
    bar = ciclo.keras_bar(60, interval=1e9, plain_interval=1e9, file=io.StringIO())
    ciclo.loop(jnp.float32(0.0), batches(60), {ciclo.every(1): train_step, **bar}, history=history)
    assert len(count_fetches) == 2  # the first line and the final line, not 60
    count_fetches.clear()
    bar = ciclo.keras_bar(60, interval=0, dynamic=True, file=io.StringIO())
    ciclo.loop(jnp.float32(0.0), batches(60), {ciclo.every(1): train_step, **bar}, history=history)
    assert len(count_fetches) == 60  # redrawing every step costs a fetch every step


def test_tqdm_bar_shows_count_and_values():
    out = io.StringIO()
    ciclo.train_loop(
        jnp.float32(0.0),
        batches(12),
        {ciclo.on_train_step: train_step},
        callbacks=[ciclo.tqdm_bar(12, file=out, ncols=120, desc="train")],
    )
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("train: 100%")
    assert "12/12" in last
    assert "accuracy=0.9167" in last
    assert "loss=0.0833" in last  # 1 / 12


def test_tqdm_bar_counts_samples():
    out = io.StringIO()
    bar = ciclo.tqdm_bar(ciclo.at(samples=40), file=out, ncols=120)
    ciclo.loop(jnp.float32(0.0), batches(10), {ciclo.every(1): train_step, **bar})
    assert "40/40" in out.getvalue().split("\r")[-1]
    assert "sample/s" in out.getvalue()


def test_bad_totals_are_clear_errors():
    with pytest.raises(ValueError, match=r"keras_bar\(total\) must be a positive amount"):
        ciclo.keras_bar(0)
    with pytest.raises(
        ValueError, match=r"tqdm_bar\(total\) must be a positive amount in one unit"
    ):
        ciclo.tqdm_bar(ciclo.at(steps=10, samples=100))
    with pytest.raises(TypeError, match=r"keras_bar\(total\) must be an int"):
        ciclo.keras_bar("100")
    with pytest.raises(ValueError, match=r"interval must be >= 0"):
        ciclo.keras_bar(10, interval=-1)


def test_bars_without_a_total_read_it_from_the_loop():
    def final_line(bar, dataset, **loop_options):
        ciclo.loop(jnp.float32(0.0), dataset, {ciclo.every(1): train_step, **bar}, **loop_options)
        return bar.file.getvalue().splitlines()[-1]

    def bar():
        return ciclo.keras_bar(file=io.StringIO())

    assert final_line(bar(), batches(6)).startswith("6/6 [")  # len(dataset)
    assert final_line(bar(), iter(batches(20)), stop=8).startswith("8/8 [")  # the loop's stop
    assert final_line(bar(), batches(20), stop=8).startswith("8/8 [")  # stop before the end
    line = final_line(bar(), iter(batches(20)), stop=ciclo.at(samples=24))  # its unit
    assert line.startswith("24/24 [")
    assert "/sample" in line
    # continued from a count: the total is where the loop ends
    line = final_line(bar(), batches(4), elapsed=ciclo.Elapsed.create(steps=10))
    assert line.startswith("14/14 [")
    # train_loop passes its stop on; tqdm too
    out = io.StringIO()
    ciclo.train_loop(
        jnp.float32(0.0),
        iter(batches(20)),
        {ciclo.on_train_step: train_step},
        callbacks=[ciclo.tqdm_bar(file=out, ncols=120)],
        stop=12,
    )
    assert "12/12" in out.getvalue().split("\r")[-1]


def test_a_bar_without_a_total_in_a_loop_that_cannot_tell_it_says_what_to_pass():
    with pytest.raises(
        TypeError,
        match=r"keras_bar\(\) was given no total, and the loop has no stop nor a dataset with "
        r"len\(\): pass keras_bar\(1000\)",
    ):
        ciclo.loop(
            jnp.float32(0.0),
            iter(batches(3)),
            {ciclo.every(1): train_step, **ciclo.keras_bar(file=io.StringIO())},
        )


def test_a_bar_leaves_out_the_ledger_seconds_by_default_and_what_exclude_names():
    # issue 41, item 4: ciclo.goodput() logs ten entries; a bar shows only its ratio.
    def lines(**options):
        out = io.StringIO()
        ledger = ciclo.goodput(steps=2, since="now")
        bar = ciclo.keras_bar(4, file=out, plain_interval=0, **options)
        ciclo.loop(jnp.float32(0.0), batches(4), {ciclo.every(1): train_step, **ledger, **bar})
        return out.getvalue().splitlines()

    final = lines()[-1]
    assert "goodput: " in final
    assert "goodput_" not in final
    assert "loss: " in final
    assert "goodput_compile: " in lines(exclude=())[-1]
    final = lines(exclude=["goodput*", "acc*"])[-1]
    assert "goodput" not in final
    assert "accuracy" not in final
    assert "loss: " in final
    with pytest.raises(TypeError, match=r"keras_bar\(exclude=\[3\]\): give names or patterns"):
        ciclo.keras_bar(4, exclude=[3])


def test_a_bar_whose_total_is_short_of_the_run_says_so_once():
    out = io.StringIO()
    tasks = {ciclo.every(1): train_step, **ciclo.keras_bar(4, file=out, plain_interval=0)}
    with pytest.warns(
        UserWarning, match=r"keras_bar: the loop runs past the bar's total \(4 steps\)"
    ) as caught:
        ciclo.loop(jnp.float32(0.0), batches(8), tasks)
    assert len([w for w in caught if "past the bar's total" in str(w.message)]) == 1
    assert out.getvalue().splitlines()[-1].startswith("4/4 [")
    with warnings.catch_warnings():  # an exact total says nothing
        warnings.simplefilter("error")
        bar = ciclo.keras_bar(8, file=io.StringIO())
        ciclo.train_loop(
            jnp.float32(0.0), batches(8), {ciclo.on_train_step: train_step}, callbacks=[bar]
        )
