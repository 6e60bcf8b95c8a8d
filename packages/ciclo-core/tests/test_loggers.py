"""csv_logger, tensorboard_logger and History.plot: files written and read back."""

from __future__ import annotations

import csv
import glob
import io
import os
import struct
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ciclo


@jax.jit
def train_step(state, batch):
    loss = 1.0 / (state + 1.0)
    return ciclo.logs().add_loss("loss", loss).add_metric("accuracy", 1.0 - loss), state + 1.0


@jax.jit
def eval_step(state, batch):
    return ciclo.logs().add_metric("accuracy", state / 10.0)


def train(callbacks, steps=6, tasks_extra=None, **options):
    return ciclo.train_loop(
        jnp.float32(0.0),
        [np.zeros((2, 1), np.float32)] * steps,
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step, **(tasks_extra or {})},
        callbacks=callbacks,
        test_dataset=lambda: [np.zeros((2, 1), np.float32)],
        **options,
    )


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_logger_writes_one_row_per_epoch(tmp_path):
    path = tmp_path / "log.csv"
    _, history, _ = train([ciclo.csv_logger(path)], epoch_duration=2)
    rows = read_csv(path)
    assert list(rows[0]) == ["steps", "samples", "time", "accuracy", "accuracy_test", "loss"]
    assert [int(r["steps"]) for r in rows] == history.collect("steps", "accuracy_test")[0]
    assert [float(r["accuracy_test"]) for r in rows] == pytest.approx([0.2, 0.4, 0.6])
    assert [float(r["loss"]) for r in rows] == pytest.approx(
        history.collect("steps", "loss", "accuracy_test")[1]
    )


def test_csv_logger_widens_its_header_and_appends(tmp_path):
    path = tmp_path / "log.csv"
    logger = ciclo.csv_logger(path)
    tasks = {ciclo.every(1): train_step, ciclo.every(2): logger}
    state, _, elapsed = ciclo.loop(jnp.float32(0.0), [np.zeros(1)] * 3, tasks)
    assert [float(r["loss"]) for r in read_csv(path)] == pytest.approx([1.0, 1 / 3])
    # the first evaluation adds a column; earlier rows keep it empty
    ciclo.train_loop(
        state,
        [np.zeros(1)] * 2,
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        callbacks=[logger],
        test_dataset=lambda: [np.zeros(1)],
        epoch_duration=2,
        elapsed=elapsed,
    )
    rows = read_csv(path)
    assert [r["accuracy_test"] for r in rows] == ["", "", "0.4"]  # the epoch ending at 4
    # a new logger with append=True continues the same file (a resumed run)
    again = ciclo.csv_logger(path, append=True)
    ciclo.loop(jnp.float32(0.0), [np.zeros(1)], {ciclo.every(1): [train_step, again]})
    assert len(read_csv(path)) == 4
    assert read_csv(path)[-1]["accuracy_test"] == ""
    with pytest.raises(FileNotFoundError, match=r"csv_logger: the directory of .* does not exist"):
        ciclo.csv_logger(tmp_path / "missing" / "log.csv")
    with pytest.raises(IsADirectoryError, match=r"csv_logger: '.*' is a directory; give a file"):
        ciclo.csv_logger(tmp_path)
    readonly = tmp_path / "readonly"  # issue 41: it failed only at the first epoch's end
    readonly.mkdir()
    readonly.chmod(0o555)
    if os.access(readonly, os.W_OK):  # root ignores permissions; /sys refuses even root
        readonly = Path("/sys")
    with pytest.raises(PermissionError, match=r"csv_logger: cannot write in '.*'\.$"):
        ciclo.csv_logger(readonly / "log.csv")


def read_events(logdir):
    """(tag, step, value) of every scalar in the TFRecord event files of ``logdir``."""
    from tensorboardX.proto import event_pb2

    scalars = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        i = 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
            i += 12 + length + 4  # length, its crc, the record, its crc
            scalars += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return scalars


def test_tensorboard_logger_writes_every_scalar_row(tmp_path):
    pytest.importorskip("tensorboardX", reason="the optional extra ciclo-core[tensorboard]")
    logdir = str(tmp_path / "tb")
    _, history, _ = train([ciclo.tensorboard_logger(logdir)], epoch_duration=3)
    scalars = read_events(logdir)
    by_tag = {}
    for tag, step, value in scalars:
        by_tag.setdefault(tag, []).append((step, value))
    assert set(by_tag) == {"losses/loss", "metrics/accuracy", "metrics/accuracy_test"}
    steps, loss = history.collect("steps", "loss")
    assert [s for s, _ in by_tag["losses/loss"]] == steps == list(range(6))
    assert [v for _, v in by_tag["losses/loss"]] == pytest.approx(loss)
    assert by_tag["metrics/accuracy_test"] == [(2, pytest.approx(0.3)), (5, pytest.approx(0.6))]


def test_optional_extras_say_how_to_install_them(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails
    with pytest.raises(ImportError, match=r"pip install 'ciclo-core\[tensorboard\]'"):
        ciclo.tensorboard_logger(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'ciclo-core\[plot\]'"):
        ciclo.history().plot("loss")


def test_history_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the optional extra ciclo-core[plot]")
    _, history, _ = train([], epoch_duration=2)
    path = tmp_path / "run.png"
    figure = history.plot("loss", ("accuracy", "accuracy_test"), path=path, title="run")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(figure.axes) == 2
    lines = figure.axes[1].get_lines()
    assert [line.get_label() for line in lines] == ["accuracy", "accuracy_test"]
    np.testing.assert_allclose(lines[1].get_ydata(), [0.2, 0.4, 0.6], rtol=1e-6)
    with pytest.raises(KeyError, match=r"history has no key 'los'"):
        history.plot("los")


def _epoch_means(history, key, epoch):
    steps, values = history.collect("steps", key)
    means, rows = [], list(zip(steps, values, strict=True))
    for start in range(0, max(steps) + 1, epoch):
        means.append(np.mean([v for s, v in rows if start <= s < start + epoch]))
    return means


def test_csv_logger_running_mean_writes_epoch_means_of_training_entries(tmp_path):
    path = tmp_path / "log.csv"
    out = io.StringIO()
    bar = ciclo.keras_bar(8, file=out, running_mean=True)
    _, history, _ = train(
        [ciclo.csv_logger(path, running_mean=True), bar], steps=8, epoch_duration=4
    )
    rows = read_csv(path)
    loss, accuracy = (_epoch_means(history, key, 4) for key in ("loss", "accuracy"))
    assert [float(r["loss"]) for r in rows] == pytest.approx(loss)
    assert [float(r["accuracy"]) for r in rows] == pytest.approx(accuracy)
    # evaluation entries as they are; the bar's last line shows the same means
    assert [float(r["accuracy_test"]) for r in rows] == pytest.approx([0.4, 0.8])
    assert f"loss: {loss[-1]:.4f}" in out.getvalue().splitlines()[-1]
    # in ciclo.loop: since the loop began, the logs of its call being training entries
    path = tmp_path / "loop.csv"
    tasks = {ciclo.every(1): train_step, ciclo.every(3): ciclo.csv_logger(path, running_mean=True)}
    _, history, _ = ciclo.loop(jnp.float32(0.0), [np.zeros((2, 1), np.float32)] * 6, tasks)
    losses = history.collect("loss")
    assert [float(r["loss"]) for r in read_csv(path)] == pytest.approx(
        [np.mean(losses[:1]), np.mean(losses[:4])]
    )
    with pytest.raises(TypeError, match=r"csv_logger: running_mean must be True or False"):
        ciclo.csv_logger(path, running_mean="yes")


def test_csv_logger_running_mean_resumed_within_an_epoch_averages_all_of_it(tmp_path):
    def run(directory, crash_at=None):
        def crash(elapsed):
            if elapsed.steps == crash_at:
                raise RuntimeError("killed")

        checkpoint = ciclo.checkpoint(directory / "ckpt")
        return train(
            [ciclo.csv_logger(directory / "log.csv", running_mean=True)],
            steps=8,
            epoch_duration=4,
            tasks_extra={ciclo.every(1): lambda s, b, e: crash(e), ciclo.every(2): checkpoint},
            resume=checkpoint,
        )

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run(tmp_path / "a")
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "b", crash_at=6)  # saved at step 5 (checkpoint 6), within epoch 2
    run(tmp_path / "b")
    resumed, straight = (read_csv(tmp_path / d / "log.csv") for d in "ba")
    for row in resumed + straight:
        del row["time"]
    assert resumed == straight
    assert len(straight) == 2
