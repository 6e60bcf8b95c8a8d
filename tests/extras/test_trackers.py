"""Experiment trackers with the real packages: a run logged to W&B (offline) and to MLflow (a
local file store), the values read back equal to the history; a TensorBoard writer's event
files read back."""

from __future__ import annotations

import glob
import json
import struct
import time
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


def train(writer, **options):
    return ciclo.train_loop(
        jnp.float32(0.0),
        [np.zeros((2, 1), np.float32)] * 6,
        {ciclo.on_train_step: train_step, ciclo.on_test_step: eval_step},
        callbacks=[ciclo.writer_logger(writer, **options)],
        test_dataset=lambda: [np.zeros((2, 1), np.float32)],
        epoch_duration=3,
    )


def expected(history):
    """``{key: [(step, value)]}`` of the history's scalar rows, as the writers receive them."""
    by_key: dict[str, list[tuple[int, float]]] = {}
    for step, scalars in ciclo.callbacks._writers.scalar_rows(history, 0, len(history)):
        for key, value in scalars.items():
            by_key.setdefault(key, []).append((step, value))
    return by_key


def wandb_records(path):
    """The records of a W&B ``.wandb`` file (LevelDB log blocks after a 7-byte header)."""
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            chunks = chunk
        elif kind == 3:
            chunks += chunk
        elif kind == 4:
            yield chunks + chunk


def test_a_run_logged_to_wandb_offline_reads_back_equal_to_the_history(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = wandb.Settings(
        silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True
    )
    writer = ciclo.callbacks.WandbWriter(
        mode="offline", dir=str(tmp_path), project="ciclo-test", settings=settings
    )
    _, history, _ = train(writer, close=True, hparams={"lr": 0.1})
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    # wandb's service writes the file in the background: wait for the run's exit record
    deadline = time.monotonic() + 60
    while True:
        records = []
        for raw in wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, "wandb did not finish writing the offline run"
        time.sleep(0.2)
    found: dict[str, list[tuple[int, float]]] = {}
    config = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            for key, value in items.items():
                if not key.startswith("_"):
                    found.setdefault(key, []).append((items["_step"], value))
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    want = expected(history)
    assert set(found) == set(want) == {"losses/loss", "metrics/accuracy", "metrics/accuracy_test"}
    for key, rows in want.items():
        assert [s for s, _ in found[key]] == [s for s, _ in rows]
        assert [v for _, v in found[key]] == pytest.approx([v for _, v in rows])
    assert config["lr"] == 0.1


# MLflow's database store uses a loader strategy that SQLAlchemy 2.1 deprecates (not ours).
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_a_run_logged_to_mlflow_reads_back_equal_to_the_history(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # as the docs say: no setting
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the URI of the docs, what ciclo-core[mlflow] runs
    writer = ciclo.callbacks.MLflowWriter(tracking_uri=uri, experiment_name="ciclo-test")
    _, history, _ = train(writer, close=True, hparams={"lr": 0.1})
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(writer.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1"}
    want = expected(history)
    assert set(run.data.metrics) == set(want)
    for key, rows in want.items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(writer.run_id, key))
        assert [s for s, _ in got] == [s for s, _ in rows]
        assert [v for _, v in got] == pytest.approx([v for _, v in rows])
    # a resumed run on the same MLflow run does not log again the steps it holds
    again = ciclo.callbacks.MLflowWriter(writer.run_id, tracking_uri=uri)
    again.resume_at(2)
    again.write_scalars(3, {"losses/loss": 123.0})
    again.write_scalars(6, {"losses/loss": 7.0})
    again.flush()
    got = [(m.step, m.value) for m in client.get_metric_history(writer.run_id, "losses/loss")]
    assert (3, 123.0) not in got
    assert (6, 7.0) in got


def test_tensorboard_writer_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto import event_pb2

    writer = ciclo.callbacks.TensorBoardWriter(tmp_path)
    _, history, _ = train(writer, close=True)
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(str(tmp_path / "events.out.tfevents.*"))):
        data = Path(path).read_bytes()
        i = 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
            i += 12 + length + 4
            for v in event.summary.value:
                found.setdefault(v.tag, []).append((event.step, v.simple_value))
    want = expected(history)
    assert set(found) == set(want)
    for key, rows in want.items():
        assert [s for s, _ in found[key]] == [s for s, _ in rows]
        assert [v for _, v in found[key]] == pytest.approx([v for _, v in rows])


def test_clu_writers_as_they_are_receive_every_row_once(caplog):
    """clu's own writers, unchanged: its ``AsyncMultiWriter`` (a thread pool) around its
    ``LoggingWriter`` and a writer written against clu's ``MetricWriter`` interface."""
    metric_writers = pytest.importorskip("clu.metric_writers")

    class Recorder(metric_writers.MetricWriter):
        def __init__(self):
            self.rows: list[tuple[int, dict]] = []
            self.flushed = self.closed = False

        def write_summaries(self, step, values, metadata=None):
            pass

        def write_scalars(self, step, scalars):
            self.rows.append((int(step), dict(scalars)))

        def write_images(self, step, images):
            pass

        def write_videos(self, step, videos):
            pass

        def write_audios(self, step, audios, *, sample_rate):
            pass

        def write_texts(self, step, texts):
            pass

        def write_histograms(self, step, arrays, num_buckets=None):
            pass

        def write_hparams(self, hparams):
            self.hparams = dict(hparams)

        def flush(self):
            self.flushed = True

        def close(self):
            self.closed = True

    recorder = Recorder()
    writer = metric_writers.AsyncMultiWriter([metric_writers.LoggingWriter(), recorder])
    with caplog.at_level("INFO"):
        _, history, _ = train(writer, close=True, hparams={"lr": 0.1})
    want = sorted((step, sorted(s.items())) for step, s in expected_rows(history))
    got = sorted((step, sorted(s.items())) for step, s in recorder.rows)
    assert got == want  # every row once: none lost, none repeated
    assert recorder.hparams == {"lr": 0.1}
    assert recorder.flushed
    assert recorder.closed
    logged = [r.getMessage() for r in caplog.records if "losses/loss=" in r.getMessage()]
    # clu's LoggingWriter prints "[step] name=value, ...": once per row, in order
    assert [int(m[1 : m.index("]")]) for m in logged] == [step for step, _ in want]


def expected_rows(history):
    return ciclo.callbacks._writers.scalar_rows(history, 0, len(history))
