"""A Grain pipeline resumes on another topology through Grain's own ``ElasticIterator``: a
run checkpointed on 2 processes x 2 devices resumes on 1 process x 4 devices and back, under
the data-parallel strategy, ending equal to an uninterrupted run; a per-process Grain
iterator saved by 2 processes is an error naming the fix on 1, never a silent replay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("grain")

import ciclo
from ciclo.testing import free_port, run_on_loopback

sys.path.insert(0, str(Path(__file__).parent))
import grain_topology_worker as worker

TIMEOUT = 150  # seconds, for every process of one run together


def run(kind: str, out: Path, processes: int, stop: int | None) -> list[dict]:
    """Runs the worker on ``processes`` x ``4 // processes`` devices; returns each process's
    result."""
    out.mkdir(exist_ok=True)
    port = str(free_port())
    stop_arg = "none" if stop is None else str(stop)
    codes, outputs, _ = run_on_loopback(
        [[sys.executable, worker.__file__, kind, str(processes), str(i), port, str(out), stop_arg]
         for i in range(processes)],
        devices_per_process=4 // processes,
        timeout=TIMEOUT,
    )  # fmt: skip
    for i, code in enumerate(codes):
        assert code == 0, f"process {i} of {processes} exited {code}:\n{outputs[i][-3000:]}"
    return [json.loads((out / f"result{i}.json").read_text()) for i in range(processes)]


def test_a_stateful_dataset_is_elastic_around_grains_elastic_iterator_only():
    assert ciclo.stateful_dataset(worker.pipeline("elastic")).elastic
    assert ciclo.stateful_dataset(iter(worker.pipeline("elastic"))).elastic
    assert not ciclo.stateful_dataset(worker.pipeline("per-process")).elastic
    assert not ciclo.stateful_dataset(iter(worker.pipeline("per-process"))).elastic


@pytest.mark.slow
def test_an_elastic_grain_pipeline_resumes_on_another_topology(tmp_path):
    """Uninterrupted on 1 x 4, against a run stopped on 2 x 2 at step 6 (its last checkpoint:
    step 5), resumed on 1 x 4 and stopped at step 10 (checkpoint 9), then resumed on 2 x 2 to
    the end of the data."""
    (reference,) = run("elastic", tmp_path / "reference", 1, None)
    assert reference["steps"] == worker.STEPS
    # every record of each epoch once, in global batches
    assert sum(reference["index_sum"]) == worker.EPOCHS * sum(range(worker.RECORDS))
    chained = tmp_path / "chained"
    first = run("elastic", chained, 2, 6)
    assert all(r["processes"] == 2 and r["devices"] == 4 for r in first)
    (second,) = run("elastic", chained, 1, 10)  # 2 x 2 -> 1 x 4
    assert second["processes"] == 1
    assert second["devices"] == 4
    assert second["drawn"] == 10 - 5  # from checkpoint 5, nothing replayed
    # the global position Grain re-splits is the global sample count
    assert second["position"] == {"global_next_index": second["samples"]}
    last = run("elastic", chained, 2, None)  # 1 x 4 -> 2 x 2
    for result in last:
        assert result["drawn"] == worker.STEPS - 9
        assert result["position"] == {"global_next_index": result["samples"]}
        assert result["samples"] == reference["samples"] == worker.RECORDS * worker.EPOCHS
        assert result["history_steps"] == reference["history_steps"]
        # the same records in every global batch, each once
        assert result["index_sum"] == reference["index_sum"]
        # a global batch is ordered by process on 2 x 2: sums differ in rounding only
        np.testing.assert_allclose(result["loss"], reference["loss"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(result["w"], reference["w"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(result["b"], reference["b"], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_a_per_process_grain_iterator_resumes_on_no_other_number_of_processes(tmp_path):
    first = run("per-process", tmp_path / "two", 2, 6)
    assert [r["steps"] for r in first] == [6, 6]
    with pytest.raises(
        ValueError,
        match=r"dataset state of 2 process\(es\), this run has 1, and StatefulDataset keeps a "
        r"position per process: resume on 2 process\(es\), .*grain\.experimental\.ElasticIterator",
    ):
        worker.train("per-process", tmp_path / "two", None)
    # restoring its state (not the data) on one process is fine
    restored = ciclo.restore(tmp_path / "two" / "ckpt", worker.initial_state())
    assert restored.elapsed.steps == 5
    assert restored.history.collect("steps") == list(range(5))

    # and the other way: saved by this one process (8 devices), resumed by 2 (4 devices)
    worker.train("per-process", tmp_path / "one", 6)
    port = str(free_port())
    command = [sys.executable, worker.__file__, "per-process", "2"]
    codes, outputs, _ = run_on_loopback(
        [[*command, str(i), port, str(tmp_path / "one"), "none"] for i in range(2)],
        devices_per_process=2,
        timeout=TIMEOUT,
    )
    assert codes == [1, 1], outputs
    for output in outputs:
        assert "dataset state of 1 process(es), this run has 2" in output
        assert "grain.experimental.ElasticIterator" in output
