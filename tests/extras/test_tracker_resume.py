"""The same tracker run after a restart: a run logged to W&B (offline), MLflow (sqlite),
TensorBoard, CLU's default writer and CSV is SIGKILLed after it wrote past its last
checkpoint (paused at a known step), then resumed with the same command less the pause (no
id passed by hand). Each tracker holds one
run in which each step is logged once, with the values of an uninterrupted run, read back
with the tracker's own reader. Then the bad inputs: a run the store no longer holds, another
run given by hand, files missing where the interrupted run wrote them."""

from __future__ import annotations

import csv
import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import ciclo

sys.path.insert(0, str(Path(__file__).parent))
import tracker_training as training
from test_trackers import wandb_records

HERE = Path(__file__).parent

# MLflow's database store uses a loader strategy that SQLAlchemy 2.1 deprecates (not ours).
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

CHECKPOINT_ROWS = 2 * training.EVERY + 1  # the newest checkpoint before the kill holds rows 0-12


def command(directory: Path, wandb_flush: str, *more: str) -> list[str]:
    script = str(HERE / "tracker_training.py")
    return [
        sys.executable, script, str(directory), "--delay", "0.3", "--wandb-flush", wandb_flush,
        *more,
    ]  # fmt: skip


def environment() -> dict[str, str]:
    return {**os.environ, "WANDB_SILENT": "true", "PYTHONPATH": str(HERE)}


# --- what each tracker stored, read with its own reader ---------------------------------------
def wandb_runs(directory: Path) -> dict[str, list[dict]]:
    """``{run id: [history row]}``: the rows of each W&B transaction log under
    ``directory``, in the order the files were started."""
    from wandb.proto import wandb_internal_pb2

    runs: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(str(directory / "wandb" / "offline-run-*" / "run-*.wandb"))):
        run_id = Path(path).stem.removeprefix("run-")
        for raw in wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                runs.setdefault(run_id, []).append(
                    {
                        i.key or "/".join(i.nested_key): json.loads(i.value_json)
                        for i in record.history.item
                    }
                )
    return runs


def wandb_steps_so_far(directory: Path) -> list[int]:
    """The steps of the rows W&B's service has written so far (a record it is still writing
    is not counted)."""
    from google.protobuf.message import DecodeError

    try:
        return [r["_step"] for rows in wandb_runs(directory).values() for r in rows]
    except (DecodeError, AssertionError):  # the file's header or last record half written
        return []


def wait_for_wandb(directory: Path) -> None:
    """wandb's service writes the offline file in the background: wait for its exit record."""
    from wandb.proto import wandb_internal_pb2

    path = max(glob.glob(str(directory / "wandb" / "offline-run-*" / "run-*.wandb")))
    deadline = time.monotonic() + 60
    while True:
        for raw in wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "exit":
                return
        assert time.monotonic() < deadline, "wandb did not finish writing the offline run"
        time.sleep(0.2)


def wandb_points(rows: list[dict]) -> list[tuple[int, str, float]]:
    return [(r["_step"], k, v) for r in rows for k, v in r.items() if not k.startswith("_")]


def mlflow_runs(directory: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{run id: {key: [(step, value)]}}`` of the MLflow store, read with its client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=training.mlflow_uri(directory))
    experiment = client.get_experiment_by_name("ciclo-test")
    runs = {}
    for run in client.search_runs([experiment.experiment_id]):
        runs[run.info.run_id] = {
            key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
            for key in run.data.metrics
        }
    return runs


def tensorboard_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows: its own reader of the event files (which drops the events
    an earlier file holds from a later file's ``purge_step`` on)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(logdir))
    reader.Reload()
    return {
        tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]
    }


def raw_event_steps(logdir: Path) -> list[int]:
    """The steps of every scalar event in the files, as written (nothing dropped)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = []
    for path in sorted(glob.glob(str(logdir / "events.out.tfevents.*"))):
        for event in EventFileLoader(path).Load():
            if event.summary.value:
                steps.append(event.step)
    return steps


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return [{k: v for k, v in row.items() if k != "time"} for row in csv.DictReader(f)]


# --- the run killed and resumed ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "wandb_flush",
    [
        "0",  # W&B's service stores rows only when a buffer fills: the kill loses the last ones
        "0.05",  # it stores them at once: the killed run's file holds rows after the checkpoint
    ],
)
def test_every_tracker_continues_the_same_run_after_a_sigkill_each_step_once(tmp_path, wandb_flush):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir()
    killed.mkdir()
    straight = subprocess.Popen(
        command(reference, wandb_flush),
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    kill_at = CHECKPOINT_ROWS + 3  # the run pauses there: rows 13 and 14 were handed over
    process = subprocess.Popen(
        command(killed, wandb_flush, "--pause-at", str(kill_at)),
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    after = CHECKPOINT_ROWS - 1  # the step of the checkpoint's last history row
    try:
        # checkpoint 13 saved at step 12; every writer has been handed rows 13 and 14 after it
        assert process.stdout is not None
        for line in process.stdout:
            if int(line.split()[1]) >= kill_at:
                break
        # W&B's service writes in the background: the run is paused, so the kill comes once
        # it wrote a row after the checkpoint (flushing every 0.05 s), or after 20 times
        # that (flushing only a full buffer)
        deadline = time.monotonic() + (30 if wandb_flush != "0" else 1)
        while time.monotonic() < deadline:
            if wandb_flush != "0" and max(wandb_steps_so_far(killed), default=-1) > after:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
        _, errors = straight.communicate(timeout=300)
    finally:
        process.kill()
        straight.kill()
    assert process.returncode == -signal.SIGKILL
    assert straight.returncode == 0, errors.decode()[-3000:]

    # the interrupted run wrote past its checkpoint, in every tracker, but W&B when its
    # service stores rows only when a buffer fills: there it lost rows the checkpoint counts
    # as written
    wandb_steps = [r["_step"] for rows in wandb_runs(killed).values() for r in rows]
    if wandb_flush == "0":
        assert max(wandb_steps, default=-1) < after - 1, "W&B: no row was lost"
    else:
        assert max(wandb_steps) > after, "W&B: nothing after the checkpoint"
    (killed_mlflow,) = mlflow_runs(killed).values()
    assert killed_mlflow["losses/loss"][-1][0] > after, "MLflow: nothing after the checkpoint"
    assert max(raw_event_steps(killed / "tb")) > after, "TensorBoard: nothing after it"
    assert max(raw_event_steps(killed / "clu")) > after, "CLU: nothing after the checkpoint"
    assert int(csv_rows(killed / "log.csv")[-1]["steps"]) > after, "CSV: nothing after it"

    resumed = subprocess.run(
        command(killed, wandb_flush), env=environment(), capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    wait_for_wandb(reference)
    wait_for_wandb(killed)

    # W&B: one run id in two offline files (wandb sync uploads them as one run); together
    # they hold each step once, equal to the uninterrupted run's
    runs = wandb_runs(killed)
    assert len(runs) == 1, f"W&B: {sorted(runs)} (expected one run)"
    (rows,) = runs.values()
    assert len(glob.glob(str(killed / "wandb" / "offline-run-*"))) == 2
    steps = [r["_step"] for r in rows]
    assert sorted(steps) == list(range(training.STEPS)), Counter(steps)
    (want,) = wandb_runs(reference).values()
    assert sorted(wandb_points(rows)) == sorted(wandb_points(want))

    # MLflow: one run, each step of each key once, equal to the uninterrupted run's
    runs = mlflow_runs(killed)
    assert len(runs) == 1, f"MLflow: {len(runs)} runs"
    ((run_id, metrics),) = runs.items()
    (want,) = mlflow_runs(reference).values()
    assert metrics == want
    assert [s for s, _ in metrics["losses/loss"]] == list(range(training.STEPS))
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=training.mlflow_uri(killed)).get_run(run_id)
    assert run.info.status == "FINISHED"

    # TensorBoard and CLU's writer: what TensorBoard shows holds each step once, equal
    for logdir in ("tb", "clu"):
        shown = tensorboard_scalars(killed / logdir)
        assert shown == tensorboard_scalars(reference / logdir), logdir
        assert [s for s, _ in shown["losses/loss"]] == list(range(training.STEPS)), logdir
        assert len(raw_event_steps(killed / logdir)) > len(raw_event_steps(reference / logdir))

    # CSV: the rows after the checkpoint were dropped and written again, once
    assert csv_rows(killed / "log.csv") == csv_rows(reference / "log.csv")


# --- bad inputs ----------------------------------------------------------------------------
def resumable(directory: Path, writer, stop: int):
    """A short run logged to ``writer``, checkpointed, resumed from ``directory``."""
    tasks = {
        ciclo.every(1): [training.train_step, ciclo.writer_logger(writer, interval=0, close=True)],
        ciclo.every(3): ciclo.checkpoint(directory / "ckpt", keep=1, async_save=False),
    }
    batches = [np.full((2,), i, np.float32) for i in range(10)]
    return ciclo.loop(jnp.float32(0), batches, tasks, stop=stop, resume=directory / "ckpt")


def test_mlflow_resume_continues_its_run_and_names_a_run_it_cannot_continue(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = training.mlflow_uri(tmp_path)
    first = ciclo.callbacks.MLflowWriter(tracking_uri=uri)
    resumable(tmp_path, first, stop=4)
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(first.run_id).info.status == "FINISHED"
    # another run given by hand
    with pytest.raises(
        ValueError,
        match=rf"MLflowWriter: the checkpoint's run is '{first.run_id}', not 'other'; "
        r"give no run_id",
    ):
        resumable(tmp_path, ciclo.callbacks.MLflowWriter("other", tracking_uri=uri), stop=8)
    # another store (a relative sqlite path run from another directory, say)
    elsewhere = training.mlflow_uri(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(
        ValueError,
        match=rf"MLflowWriter: '{elsewhere}' lacks run '{first.run_id}'; give tracking_uri "
        rf"'{uri}' or restore\.",
    ):
        resumable(tmp_path, ciclo.callbacks.MLflowWriter(tracking_uri=elsewhere), stop=8)
    # a deleted run
    client.delete_run(first.run_id)
    with pytest.raises(ValueError, match=r"lacks run '.*' \(deleted\); give"):
        resumable(tmp_path, ciclo.callbacks.MLflowWriter(tracking_uri=uri), stop=8)
    # restored as the message says: the resumed run continues it, running again, then finished
    client.restore_run(first.run_id)
    again = ciclo.callbacks.MLflowWriter(tracking_uri=uri)
    _, history, _ = resumable(tmp_path, again, stop=8)
    assert again.run_id == first.run_id
    assert client.get_run(first.run_id).info.status == "FINISHED"
    points = [(m.step, m.value) for m in client.get_metric_history(first.run_id, "losses/loss")]
    assert sorted(points) == list(enumerate(history.collect("loss")))


def test_wandb_resume_refuses_another_run_and_says_when_its_offline_files_are_gone(
    tmp_path, monkeypatch
):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = wandb.Settings(
        silent=True, console="off", x_disable_stats=True, x_disable_machine_info=True
    )

    def writer(**options):
        return ciclo.callbacks.WandbWriter(
            mode="offline", dir=str(tmp_path), project="ciclo-test", settings=settings, **options
        )

    first = writer()
    resumable(tmp_path, first, stop=4)
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    run_id = path.rsplit("-", 1)[-1]
    with pytest.raises(
        ValueError,
        match=rf"WandbWriter: the checkpoint's W&B run is '{run_id}', not 'other'; give no "
        r"run/id=",
    ):
        resumable(tmp_path, writer(id="other"), stop=6)
    for directory in glob.glob(str(tmp_path / "wandb" / "*run-*")):
        os.rename(directory, tmp_path / Path(directory).name)  # moved away (or synced, cleaned)
    with pytest.warns(
        UserWarning,
        match=rf"WandbWriter: '.*wandb' lacks the files of run '{run_id}'; logs from step 3 on\.",
    ):
        resumable(tmp_path, writer(), stop=6)
    (path,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert path.endswith(run_id)  # the same run, continued
