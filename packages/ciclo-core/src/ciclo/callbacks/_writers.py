"""One writer protocol for every experiment tracker, and the callback that feeds it.

:class:`MetricWriter` is CLU's ``MetricWriter`` interface (``write_scalars``,
``write_images``, ``write_histograms``, ``write_hparams``, ``flush``, ``close``), so any CLU
writer works as it is. :class:`WriterLogger` (``writer_logger``) sends the rows of the loop's
history to one: values are read from the history (fetched by it in batches), so it adds no
device sync per step. The built-in writers: :class:`TensorBoardWriter` (tensorboardX),
:class:`WandbWriter` (``wandb``) and :class:`MLflowWriter` (``mlflow`` or ``mlflow-skinny``),
each imported only when created.
"""

from __future__ import annotations

import math
import os
import time as _time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._loop._base import LoopCallbackBase
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
]


@runtime_checkable
class MetricWriter(Protocol):
    """What :class:`WriterLogger` writes to: CLU's ``MetricWriter`` interface.

    A writer may also define ``resume_at(step)``: told, before its first write in a resumed
    run, the step of the last row written before the checkpoint, so that it can drop or hide
    the rows that the interrupted run wrote after it (the resumed run writes them again).
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
    """``(step, {"collection/name": value})`` for the rows ``start:end`` of ``history`` (its
    scalar entries only; the first read fetches pending values in one transfer).

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


_NOT_A_METRIC_WRITER = (
    "{owner}: {kind} is not a metric writer (it has no write_scalars(step, scalars)); give a "
    "ciclo.callbacks.TensorBoardWriter, WandbWriter, MLflowWriter, or a CLU metric writer."
)


class WriterLogger(LoopCallbackBase):
    """Sends every scalar row of the loop's history to a metric writer.

    Each row is written once, as ``writer.write_scalars(step, {"collection/name": value})``
    (``losses/loss``, ``metrics/accuracy_test``), at most every ``interval`` seconds, at each
    epoch end and when the loop ends (which flushes the writer, in ``ciclo.loop`` too). The
    values come from the history, fetched by it in batches: no device sync per step. A
    resumed run continues after the checkpoint's last row (and tells a writer with
    ``resume_at(step)`` where it resumed, so rows the interrupted run wrote later are not
    duplicated).

    Args:
        writer: a :class:`MetricWriter`: :class:`TensorBoardWriter`, :class:`WandbWriter`,
            :class:`MLflowWriter`, or any CLU metric writer.
        interval: seconds between writes during training.
        process: the process that writes (``None``: every process).
        hparams: written once with ``write_hparams`` before the first row.
        close: close the writer when the loop ends (else only flush).

    Use it in ``callbacks=[...]`` of :func:`ciclo.train_loop`, or under a schedule (or
    spread with ``**``) in :func:`ciclo.loop`.

    Attributes:
        metric_writer: the writer.

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
            raise TypeError(_NOT_A_METRIC_WRITER.format(owner=owner, kind=type(writer).__name__))
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

    # --- a checkpoint holds how many history rows were written: a resumed run continues there
    def state_dict(self) -> dict[str, int]:
        """How many history rows were written (``-1``: not started): saved with a checkpoint."""
        return {"written": -1 if self._next_row is None else self._next_row}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """In a resumed run: write again the rows the checkpoint holds but had not written."""
        written = int(state["written"])
        self._resume_from = written if written >= 0 else None

    def _begin(self, loop_state: LoopState) -> None:
        history = loop_state.history
        self._next_row = len(history)
        if loop_state.resumed and self._resume_from is not None:
            self._next_row = min(self._resume_from, len(history))
        self._resume_from = None
        if loop_state.resumed and hasattr(self.metric_writer, "resume_at"):
            row = self._next_row - 1  # the last row written before the checkpoint
            step = int(history[row].get("elapsed", {}).get("steps", row)) if row >= 0 else -1
            self.metric_writer.resume_at(step)
        if self.hparams is not None:
            self.metric_writer.write_hparams(self.hparams)
            self.hparams = None

    def write(self, loop_state: LoopState, *, force: bool = True) -> None:
        """Writes the history rows committed since the last write (on the writing process;
        at most every ``interval`` seconds unless ``force``)."""
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
        """At the loop's end (also ``ciclo.loop``'s, also after an error): writes the rows
        left and flushes."""
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


def _import_tensorboardx() -> Any:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ImportError(
            "ciclo.tensorboard_logger needs tensorboardX: pip install 'ciclo-core[tensorboard]'"
        ) from None
    return SummaryWriter


class TensorBoardWriter:
    """A :class:`MetricWriter` to TensorBoard event files, with tensorboardX.

    The event file is opened at the first write. In a resumed run, the events the
    interrupted run wrote after the checkpoint's step are hidden (``purge_step``).

    Args:
        logdir: the directory of the event files (``tensorboard --logdir``).
        **writer_kwargs: passed to ``tensorboardX.SummaryWriter``.

    Example:
        >>> import tempfile
        >>> writer = TensorBoardWriter(tempfile.mkdtemp())  # doctest: +SKIP
        >>> writer.write_scalars(0, {"losses/loss": 0.5})  # doctest: +SKIP
    """

    def __init__(self, logdir: str | os.PathLike[str], **writer_kwargs: Any) -> None:
        self.logdir = str(logdir)
        self.writer_kwargs = dict(writer_kwargs)
        self._writer: Any = None
        _import_tensorboardx()  # fail at creation, not mid-run

    @property
    def summary_writer(self) -> Any:
        """The ``tensorboardX.SummaryWriter`` (opened on first use)."""
        if self._writer is None:
            self._writer = _import_tensorboardx()(self.logdir, **self.writer_kwargs)
        return self._writer

    def resume_at(self, step: int) -> None:
        """Hides the events of steps after ``step`` that an interrupted run wrote."""
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
        """Flushes and closes the event file (a later write opens a new one)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _import_optional(module: str, extra: str, owner: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"ciclo.callbacks.{owner} needs {extra}: pip install 'ciclo-core[{extra}]'"
        ) from None


class WandbWriter:
    """A :class:`MetricWriter` to a Weights & Biases run (``pip install 'ciclo-core[wandb]'``).

    Args:
        run: an existing ``wandb`` run; else one is started at the first write with
            ``wandb.init(**init_kwargs)`` (e.g. ``project=``, ``mode="offline"``, ``dir=``).
        **init_kwargs: passed to ``wandb.init``.

    A resumed run that should continue the same W&B run passes ``id=`` and
    ``resume="allow"``; W&B ignores steps lower than the ones it already holds.

    Example:
        >>> writer = WandbWriter(project="demo", mode="offline")  # doctest: +SKIP
    """

    def __init__(self, run: Any = None, **init_kwargs: Any) -> None:
        self._wandb = _import_optional("wandb", "wandb", "WandbWriter")
        self._run = run
        self.init_kwargs = init_kwargs

    @property
    def run(self) -> Any:
        """The W&B run (started on first use)."""
        if self._run is None:
            self._run = self._wandb.init(**self.init_kwargs)
        return self._run

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        self.run.log(_flat(scalars), step=step)

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        data = {k: [self._wandb.Image(np.asarray(i)) for i in v] for k, v in images.items()}
        self.run.log(data, step=step)

    def write_histograms(
        self, step: int, arrays: Mapping[str, Any], num_buckets: Mapping[str, int] | None = None
    ) -> None:
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


class MLflowWriter:
    """A :class:`MetricWriter` to an MLflow run (``pip install 'ciclo-core[mlflow]'``, which
    installs ``mlflow-skinny``; the full ``mlflow`` works too).

    Args:
        run_id: an existing run to log to (a resumed run passes the run's id); else a run
            is created at the first write.
        tracking_uri: where runs are stored: a database (``"sqlite:///mlflow.db"``, what
            the extra installs for) or a server (``"http://..."``); default: MLflow's.
            MLflow 3 refuses a ``"file://..."`` store unless ``MLFLOW_ALLOW_FILE_STORE=true``.
        experiment_name: the experiment of a new run (default: MLflow's default).
        run_name: the name of a new run.

    In a resumed run (same ``run_id``), steps the run already holds are not logged again.

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
        self._skip_to: int | None = None  # in a resumed run: steps <= this are held already
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

    def resume_at(self, step: int) -> None:
        """Skips the steps after ``step`` that the run already holds (written by the
        interrupted run, equal to what the resumed run computes)."""
        if self._run_id is None:
            return
        held = self.client.get_run(self._run_id).data.metrics
        top = -1
        for key in held:
            history = self.client.get_metric_history(self._run_id, key)
            top = max([top, *(m.step for m in history)])
        self._skip_to = top if top > step else None

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        if self._skip_to is not None and step <= self._skip_to:
            return
        from mlflow.entities import Metric

        now = int(_time.time() * 1000)
        self._pending += [Metric(k, float(v), now, int(step)) for k, v in scalars.items()]
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
