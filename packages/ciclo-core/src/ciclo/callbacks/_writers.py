"""One writer protocol (CLU's ``MetricWriter``) for every experiment tracker, and the callback
that feeds it from the loop's history; writers' runs are saved with checkpoints and resumed.
"""

from __future__ import annotations

import glob
import json
import math
import os
import secrets
import string
import struct
import time as _time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._loop._base import LoopCallbackBase
from .._loop._hooks import is_stateful
from .._loop._state import LoopState
from .._processes._outputs import check_output_process, writes_here
from .._records._history import History
from .._time._elapsed import Elapsed

__all__ = [
    "MetricWriter",
    "WriterLogger",
    "writer_logger",
    "TensorBoardWriter",
    "WandbWriter",
    "MLflowWriter",
    "scalar_rows",
    "writers_within",
]

_CLU_WRITERS = "clu.metric_writers"

_WRITERS = "{}: the checkpoint has {} writer run(s), not {}; use the same writers."


def writers_within(writer: Any) -> list[Any]:
    """``writer`` and, depth first, the writers it wraps when it is a CLU combinator.

    Example:
        >>> class Printer:
        ...     def write_scalars(self, step, scalars): print(step, scalars)
        >>> writer = Printer()
        >>> writers_within(writer) == [writer]
        True
    """
    found = [writer]
    if type(writer).__module__.startswith(_CLU_WRITERS):
        inner = getattr(writer, "_writers", None)
        if inner is None and getattr(writer, "_writer", None) is not None:
            inner = [writer._writer]
        for wrapped in inner or ():
            found += writers_within(wrapped)
    return found


@runtime_checkable
class MetricWriter(Protocol):
    """What :class:`WriterLogger` writes to: CLU's ``MetricWriter`` interface.

    Optional: ``state_dict()``/``load_state_dict(state)`` (the identity of its run, saved with
    each checkpoint and given back before a resumed run writes) and ``resume_at(step)`` (told
    the last step written before the checkpoint, to skip the rows written after it; it may
    return the last step its run holds, and rows above that are written again).
    """

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None: ...

    def write_images(self, step: int, images: Mapping[str, Any]) -> None: ...

    def write_histograms(
        self, step: int, arrays: Mapping[str, Any], num_buckets: Mapping[str, int] | None = None
    ) -> None: ...

    def write_hparams(self, hparams: Mapping[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool | int | float | np.generic) or (
        isinstance(value, np.ndarray) and value.size == 1
    ):
        try:
            return float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    return None


def scalar_rows(history: History, start: int, end: int) -> list[tuple[int, dict[str, float]]]:
    """``(step, {"collection/name": value})`` for the scalar entries of ``history[start:end]``.

    Example:
        >>> import ciclo, numpy as np
        >>> def step(state, batch):
        ...     return ciclo.logs().add_loss("loss", 0.5), state
        >>> _, history, _ = ciclo.loop(None, [np.ones(1)] * 2, {ciclo.every(1): step})
        >>> scalar_rows(history, 0, 2)
        [(0, {'losses/loss': 0.5}), (1, {'losses/loss': 0.5})]
    """
    rows: list[tuple[int, dict[str, float]]] = []
    for index in range(start, end):
        row = history[index]
        elapsed = row.get("elapsed", {})
        scalars: dict[str, float] = {}
        for collection, entries in row.items():
            if collection in ("elapsed", "outputs"):
                continue
            for name, value in entries.items():
                scalar = _scalar(value)
                if scalar is not None:
                    scalars[f"{collection}/{name}"] = scalar
        if scalars:
            rows.append((int(elapsed.get("steps", index)), scalars))
    return rows


_NOT_A_WRITER = "{owner}: {kind} is not a metric writer (no write_scalars); give a CLU writer."


def _row_step(history: History, row: int) -> int:
    """The step of ``history[row]`` (``-1`` before the first)."""
    return int(history[row].get("elapsed", {}).get("steps", row)) if row >= 0 else -1


class WriterLogger(LoopCallbackBase):
    """Sends every scalar row of the loop's history to a metric writer (no device sync).

    Rows are written once, at most every ``interval`` seconds, at each epoch end and at the
    loop's end; with ``ciclo.checkpoint``, a resumed run continues the same tracker runs.

    Args:
        writer: a :class:`MetricWriter` (:class:`TensorBoardWriter`, :class:`WandbWriter`,
            :class:`MLflowWriter`, any CLU writer).
        interval: seconds between writes during training.
        process: the process that writes (``None``: every process).
        hparams: written once with ``write_hparams`` before the first row.
        close: close the writer when the loop ends (else only flush).

    Example:
        >>> import ciclo, numpy as np
        >>> class Printer:  # a CLU-style writer
        ...     def write_scalars(self, step, scalars): print(step, scalars)
        ...     def flush(self): pass
        >>> def step(state, batch):
        ...     return ciclo.logs().add_loss("loss", 0.5), state
        >>> _ = ciclo.loop(None, [np.ones(1)] * 2, {ciclo.every(1): step,
        ...                **ciclo.writer_logger(Printer(), interval=60)})
        0 {'losses/loss': 0.5}
        1 {'losses/loss': 0.5}
    """

    __loop_observer__ = True  # reads the loop only: runs once per fused group
    _owner = "writer_logger"  # the name its errors give (a subclass's own)

    def __init__(
        self,
        writer: Any,
        *,
        interval: float = 5.0,
        process: int | None = 0,
        hparams: Mapping[str, Any] | None = None,
        close: bool = False,
    ) -> None:
        owner = self._owner
        if not callable(getattr(writer, "write_scalars", None)):
            raise TypeError(_NOT_A_WRITER.format(owner=owner, kind=type(writer).__name__))
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
            raise TypeError(f"{owner}(interval={interval!r}): expected seconds, a number >= 0")
        self.metric_writer = writer
        self.interval = float(interval)
        self.process = check_output_process(process, owner)
        self.hparams = dict(hparams) if hparams is not None else None
        self.close_on_end = close
        self._next_row: int | None = None
        self._resume_from: int | None = None  # rows written when the checkpoint was saved
        self._last = -math.inf

    def _stateful_writers(self) -> list[Any]:
        return [w for w in writers_within(self.metric_writer) if is_stateful(w)]

    def state_dict(self) -> dict[str, Any]:
        """Rows written (``-1``: none yet) and the writers' ``state_dict()``s."""
        state: dict[str, Any] = {"written": -1 if self._next_row is None else self._next_row}
        if writes_here(self.process):
            state["writers"] = [w.state_dict() for w in self._stateful_writers()]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes at the checkpoint's rows, in the writers' runs it names."""
        written = int(state["written"])
        self._resume_from = written if written >= 0 else None
        saved = state.get("writers")  # absent in checkpoints of ciclo 0.1
        if saved is None or not writes_here(self.process):
            return
        writers = self._stateful_writers()
        if len(saved) != len(writers):
            raise ValueError(_WRITERS.format(self._owner, len(saved), len(writers)))
        for writer, writer_state in zip(writers, saved, strict=True):
            writer.load_state_dict(writer_state)

    def _begin(self, loop_state: LoopState) -> None:
        history = loop_state.history
        self._next_row = len(history)
        if loop_state.resumed and self._resume_from is not None:
            self._next_row = min(self._resume_from, len(history))
        self._resume_from = None
        if loop_state.resumed:
            step = _row_step(history, self._next_row - 1)  # the last row written before it
            held = [
                writer.resume_at(step)
                for writer in writers_within(self.metric_writer)
                if callable(getattr(writer, "resume_at", None))
            ]
            lost = [h for h in held if isinstance(h, int) and h < step]
            if lost:  # a tracker lost rows it had been sent: write them again, from the history
                while self._next_row > 0 and _row_step(history, self._next_row - 1) > min(lost):
                    self._next_row -= 1
        if self.hparams is not None:
            self.metric_writer.write_hparams(self.hparams)
            self.hparams = None

    def write(self, loop_state: LoopState, *, force: bool = True) -> None:
        """Writes the new rows (at most every ``interval`` seconds unless ``force``)."""
        if not writes_here(self.process):
            return
        if self._next_row is None:
            self._begin(loop_state)
        now = _time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        start, end = self._next_row, len(loop_state.history)
        if start is None or end <= start:
            return
        for step, scalars in scalar_rows(loop_state.history, start, end):
            self.metric_writer.write_scalars(step, scalars)
        self._next_row = end
        self.metric_writer.flush()

    def end(self, loop_state: LoopState) -> None:
        """Writes what is left and flushes (and closes the writer, with ``close=True``)."""
        if not writes_here(self.process):
            return
        self.write(loop_state)
        self._next_row = None  # a later loop starts from its own history
        self.metric_writer.flush()
        if self.close_on_end:
            self.metric_writer.close()

    # --- hooks ---------------------------------------------------------------------------
    def __loop_callback__(self, loop_state: LoopState) -> None:
        self.write(loop_state, force=False)

    def __loop_end__(self, loop_state: LoopState, error: BaseException | None) -> None:
        """Writes the rows left and flushes (also after an error)."""
        if self._next_row is not None:
            self.end(loop_state)

    def on_train_begin(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        if writes_here(self.process):
            self._begin(loop_state)

    def on_train_batch_end(
        self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState
    ) -> None:
        self.write(loop_state, force=False)

    def on_epoch_end(self, state: Any, batch: Any, elapsed: Elapsed, loop_state: LoopState) -> None:
        self.write(loop_state)


writer_logger = WriterLogger
"""Another name of :class:`WriterLogger` (the same class)."""


# --- the built-in writers ------------------------------------------------------------------------
def _flat(values: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): v.item() if isinstance(v, np.generic) else v for k, v in values.items()}


_TENSORBOARD_ELSEWHERE = (
    "TensorBoardWriter: steps up to {} are in {!r}, not {!r}; give that logdir."
)


def _import_tensorboardx() -> Any:
    return _import_optional("tensorboardX", "tensorboard", "TensorBoardWriter").SummaryWriter


class TensorBoardWriter:
    """A :class:`MetricWriter` to TensorBoard event files, with tensorboardX.

    A resumed run hides the events written after the checkpoint (``purge_step``).

    Args:
        logdir: the directory of the event files.
        **writer_kwargs: passed to ``tensorboardX.SummaryWriter``.

    Example:
        >>> writer = TensorBoardWriter("runs/demo")  # doctest: +SKIP
    """

    def __init__(self, logdir: str | os.PathLike[str], **writer_kwargs: Any) -> None:
        self.logdir = str(logdir)
        self.writer_kwargs = dict(writer_kwargs)
        self._writer: Any = None
        self._resumed_from: str | None = None  # the interrupted run's logdir
        _import_tensorboardx()  # fail at creation, not mid-run

    @property
    def summary_writer(self) -> Any:
        """The ``tensorboardX.SummaryWriter`` (opened on first use)."""
        if self._writer is None:
            self._writer = _import_tensorboardx()(self.logdir, **self.writer_kwargs)
        return self._writer

    def state_dict(self) -> dict[str, str]:
        """The (absolute) directory of the event files."""
        return {"logdir": os.path.abspath(self.logdir)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """In a resumed run: the directory the interrupted run wrote to."""
        self._resumed_from = str(state["logdir"])

    def resume_at(self, step: int) -> None:
        """Hides the events of steps after ``step`` that an interrupted run wrote."""
        logdir = os.path.abspath(self.logdir)
        if self._resumed_from not in (None, logdir) and not glob.glob(
            os.path.join(glob.escape(logdir), "events.out.tfevents.*")
        ):
            message = _TENSORBOARD_ELSEWHERE.format(step, self._resumed_from, logdir)
            warnings.warn(message, stacklevel=2)
        if self._writer is None:
            self.writer_kwargs.setdefault("purge_step", step + 1)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        writer = self.summary_writer
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        for tag, image in images.items():
            self.summary_writer.add_images(tag, np.asarray(image), step, dataformats="NHWC")

    def write_histograms(
        self, step: int, arrays: Mapping[str, Any], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        for tag, values in arrays.items():
            bins = (num_buckets or {}).get(tag)
            self.summary_writer.add_histogram(
                tag, np.asarray(values), step, bins=bins if bins else "tensorflow"
            )

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.summary_writer.add_hparams(_flat(hparams), {}, name=".")

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Closes the event file (a later write opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _import_optional(module: str, extra: str, owner: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{owner} needs {extra}: pip install 'ciclo-core[{extra}]'") from None


_WANDB_RUN = "WandbWriter: the checkpoint's W&B run is {saved!r}, not {given!r}; give no run/id=."
_WANDB_GONE = "WandbWriter: {!r} lacks the files of run {!r}; logs from step {} on."


def _wandb_records(path: str) -> Iterator[bytes]:
    """The records of a W&B transaction log (LevelDB log blocks of 32 KiB after a 7-byte header)."""
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":  # empty (a service killed before it wrote), or another format
        return
    pos, block, chunks = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zeros: padding up to the next block
            pos += left
            continue
        if pos + 7 + length > len(data):  # cut by a kill
            return
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:  # a whole record
            yield chunk
        elif kind == 2:  # its first part
            chunks = chunk
        elif kind == 3:  # a middle part
            chunks += chunk
        elif kind == 4:  # its last part
            yield chunks + chunk


def _wandb_logged_steps(path: str) -> Iterator[int]:
    """The steps of the history rows in a W&B transaction log."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    for raw in _wandb_records(path):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(raw)
        except DecodeError:  # a record that protobuf cannot read: not a row
            continue
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                if item.key == "_step" or list(item.nested_key) == ["_step"]:
                    yield int(json.loads(item.value_json))


class WandbWriter:
    """A :class:`MetricWriter` to a Weights & Biases run (``pip install 'ciclo-core[wandb]'``).

    A checkpoint holds the run's id; a resumed run continues it (``resume="must"``) and skips
    the steps the run already holds.

    Args:
        run: an existing run; else ``wandb.init(**init_kwargs)`` at the first write.
        **init_kwargs: passed to ``wandb.init`` (``project=``, ``mode="offline"``, ``dir=``).

    Example:
        >>> writer = WandbWriter(project="demo", mode="offline")  # doctest: +SKIP
    """

    def __init__(self, run: Any = None, **init_kwargs: Any) -> None:
        self._wandb = _import_optional("wandb", "wandb", "WandbWriter")
        self._run = run
        self.init_kwargs = init_kwargs
        self._given = dict(init_kwargs)  # what close() goes back to: a later write, a new run
        self._skip_to: int | None = None  # in a resumed run: the run holds the steps <= this
        self._started_before = False  # in a resumed run: the checkpoint's run had started

    @property
    def run(self) -> Any:
        """The W&B run (started on first use)."""
        if self._run is None:
            self._run = self._wandb.init(**self.init_kwargs)
        return self._run

    def state_dict(self) -> dict[str, Any]:
        """The run's id (chosen now if not started) and whether it started."""
        if self._run is not None:
            return {"run_id": str(self._run.id), "started": True}
        if self.init_kwargs.get("id") is None:  # chosen now, so that the checkpoint names it
            alphabet = string.ascii_lowercase + string.digits  # as W&B's own ids
            self.init_kwargs["id"] = "".join(secrets.choice(alphabet) for _ in range(8))
        return {"run_id": str(self.init_kwargs["id"]), "started": False}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """In a resumed run: continue the checkpoint's W&B run."""
        saved = str(state["run_id"])
        given = self._run.id if self._run is not None else self.init_kwargs.get("id")
        if given is not None and str(given) != saved:
            raise ValueError(_WANDB_RUN.format(saved=saved, given=str(given)))
        self._started_before = bool(state.get("started"))
        if self._run is None:
            self.init_kwargs["id"] = saved
            self.init_kwargs.setdefault("resume", "must" if self._started_before else "allow")

    def resume_at(self, step: int) -> int | None:
        """Starts the run, skips the steps after ``step`` it holds; returns the last it holds."""
        run = self.run
        settings = run.settings
        if settings.mode not in ("offline", "dryrun"):  # online: what the server holds
            held = int(getattr(run, "starting_step", 0) or 0) - 1
            self._skip_to = held if held > step else None
            return held
        held = -1  # offline: the steps in the run's earlier files
        pattern = os.path.join(glob.escape(settings.wandb_dir), "*", f"run-{run.id}.wandb")
        files = {os.path.realpath(p) for p in glob.glob(pattern)}  # latest-run is a link
        earlier = sorted(files - {os.path.realpath(settings.sync_file)})
        for path in earlier:
            held = max([held, *_wandb_logged_steps(path)])
        self._skip_to = held if held > step else None
        if not earlier and self._started_before:
            message = _WANDB_GONE.format(settings.wandb_dir, str(run.id), step + 1)
            warnings.warn(message, stacklevel=2)
            return None  # perhaps synced: the rows before the checkpoint are not sent again
        return held

    def _held(self, step: int) -> bool:
        return self._skip_to is not None and step <= self._skip_to

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        if not self._held(step):
            self.run.log(_flat(scalars), step=step)

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        if self._held(step):
            return
        data = {k: [self._wandb.Image(np.asarray(i)) for i in v] for k, v in images.items()}
        self.run.log(data, step=step)

    def write_histograms(
        self, step: int, arrays: Mapping[str, Any], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        if self._held(step):
            return
        data = {
            k: self._wandb.Histogram(np.asarray(v), num_bins=(num_buckets or {}).get(k, 64))
            for k, v in arrays.items()
        }
        self.run.log(data, step=step)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.run.config.update(_flat(hparams), allow_val_change=True)

    def flush(self) -> None:
        pass  # wandb sends in the background; finish() (close) waits for it

    def close(self) -> None:
        """Finishes the run (a later write starts a new one)."""
        if self._run is not None:
            self._run.finish()
            self._run = None
            self.init_kwargs, self._skip_to = dict(self._given), None


_MLFLOW_RUN = "MLflowWriter: the checkpoint's run is {saved!r}, not {given!r}; give no run_id."
_MLFLOW_GONE = "MLflowWriter: {uri!r} lacks run {id!r}{why}; give tracking_uri {was!r} or restore."


class MLflowWriter:
    """A :class:`MetricWriter` to an MLflow run (``pip install 'ciclo-core[mlflow]'``).

    A checkpoint holds the run's id; a resumed run logs to it again (``RUNNING``) and skips,
    key by key, the points it already holds.

    Args:
        run_id: an existing run; else one is created at the first write.
        tracking_uri: the store (``"sqlite:///mlflow.db"``, ``"http://..."``); default: MLflow's.
        experiment_name: the experiment of a new run.
        run_name: the name of a new run.

    Example:
        >>> writer = MLflowWriter(tracking_uri="sqlite:///mlflow.db")  # doctest: +SKIP
    """

    def __init__(
        self,
        run_id: str | None = None,
        *,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        run_name: str | None = None,
    ) -> None:
        tracking = _import_optional("mlflow.tracking", "mlflow", "MLflowWriter")
        self.client = tracking.MlflowClient(tracking_uri=tracking_uri)
        self._run_id = run_id
        self.experiment_name, self.run_name = experiment_name, run_name
        self._held: dict[str, int] = {}  # in a resumed run: the top step held, per key
        self._pending: list[Any] = []

    @property
    def run_id(self) -> str:
        """The MLflow run's id (created on first use)."""
        if self._run_id is None:
            experiment_id = "0"
            if self.experiment_name is not None:
                found = self.client.get_experiment_by_name(self.experiment_name)
                experiment_id = (
                    found.experiment_id
                    if found is not None
                    else self.client.create_experiment(self.experiment_name)
                )
            run = self.client.create_run(experiment_id, run_name=self.run_name)
            self._run_id = run.info.run_id
        return self._run_id

    def state_dict(self) -> dict[str, str]:
        """The run's id (created now if needed) and the store's URI."""
        return {"run_id": self.run_id, "tracking_uri": str(self.client.tracking_uri)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """In a resumed run: log to the checkpoint's run, marked ``RUNNING`` again."""
        from mlflow.exceptions import MlflowException

        saved = str(state["run_id"])
        if self._run_id is not None and self._run_id != saved:
            raise ValueError(_MLFLOW_RUN.format(saved=saved, given=self._run_id))
        try:
            run = self.client.get_run(saved)
        except MlflowException:
            run = None
        if run is None or run.info.lifecycle_stage == "deleted":
            was, uri = str(state.get("tracking_uri")), str(self.client.tracking_uri)
            why = "" if run is None else " (deleted)"
            raise ValueError(_MLFLOW_GONE.format(id=saved, was=was, uri=uri, why=why))
        self._run_id = saved
        if run.info.status != "RUNNING":
            self.client.update_run(saved, status="RUNNING")

    def resume_at(self, step: int) -> None:
        """Skips, key by key, the steps after ``step`` that the run already holds."""
        if self._run_id is None:
            return
        self._held = {}
        for key in self.client.get_run(self._run_id).data.metrics:
            top = max(m.step for m in self.client.get_metric_history(self._run_id, key))
            if top > step:
                self._held[key] = top

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(_time.time() * 1000)
        self._pending += [
            Metric(k, float(v), now, int(step))
            for k, v in scalars.items()
            if step > self._held.get(k, -1)
        ]
        if len(self._pending) >= 1000:
            self.flush()

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        for key, batch in images.items():
            for i, image in enumerate(np.asarray(batch)):
                self.client.log_image(self.run_id, image, f"{key}/step_{step}_{i}.png")

    def write_histograms(
        self, step: int, arrays: Mapping[str, Any], num_buckets: Mapping[str, int] | None = None
    ) -> None:
        pass  # MLflow has no histograms

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(str(k), str(v)) for k, v in _flat(hparams).items()]
        self.client.log_batch(self.run_id, params=params)

    def flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:1000], self._pending[1000:]
            self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        """Flushes and ends the run."""
        self.flush()
        if self._run_id is not None:
            self.client.set_terminated(self._run_id)
