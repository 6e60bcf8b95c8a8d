"""Resume on another topology: a checkpoint written by 2 processes x 2 devices resumes on
1 process x 4 devices, and that one's checkpoint back on 2 x 2, ending equal to an
uninterrupted run (a list of global batches under the sharded strategy with mesh rules,
fsdp and data-parallel); a dataset whose iterator keeps a per-process position is an
error instead."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from ciclo._checkpoint._resume import skip_consumed
from ciclo._checkpoint._topology import OtherTopology
from ciclo.testing import free_port, run_on_loopback

WORKER = Path(__file__).with_name("topology_worker.py")
STEPS = 12  # the worker's batches
TIMEOUT = 150  # seconds, for every process of one run together
STRATEGIES = ("sharded", "fsdp", "data-parallel")


def run(out: Path, processes: int, stop: int | None, lazy: bool = False) -> list[dict]:
    """Runs the worker (every strategy) on ``processes`` x ``4 // processes`` devices, the
    state built first or given as ``ciclo.lazy_state``; returns each process's results,
    ``{strategy: result}``."""
    out.mkdir(exist_ok=True)
    port = str(free_port())
    stop_arg = "none" if stop is None else str(stop)
    command = [sys.executable, str(WORKER), ",".join(STRATEGIES), str(processes)]
    lazy_arg = ["lazy"] if lazy else []
    codes, outputs, _ = run_on_loopback(
        [[*command, str(i), port, str(out), stop_arg, *lazy_arg] for i in range(processes)],
        devices_per_process=4 // processes,
        timeout=TIMEOUT,
    )
    for i, code in enumerate(codes):
        assert code == 0, f"process {i} of {processes} exited {code}:\n{outputs[i][-3000:]}"
    return [json.loads((out / f"result{i}.json").read_text()) for i in range(processes)]


@pytest.mark.slow
def test_a_list_resumes_on_another_topology_under_sharded_fsdp_and_data_parallel(tmp_path):
    """An uninterrupted run on 1 x 4 against one run stopped on 2 x 2 at step 6 (its last
    checkpoint: step 5), resumed on 1 x 4 and stopped at step 10 (checkpoint 9), and resumed
    on 2 x 2 to the end with the state given as ``ciclo.lazy_state`` (only traced, each
    array restored on the sharding the strategy gives it there): params and history equal
    within float tolerance, under each strategy (``ciclo.managed.sharded(mesh, rules)`` on
    a 2 x 2 ("data", "model") mesh)."""
    (reference,) = run(tmp_path / "reference", 1, None)
    chained = tmp_path / "chained"
    for result in run(chained, 2, 6):
        for name in STRATEGIES:
            assert result[name]["steps"] == 6, name
            assert (result[name]["processes"], result[name]["devices"]) == (2, 4), name
    (second,) = run(chained, 1, 10)  # 2 x 2 -> 1 x 4
    for name in STRATEGIES:
        assert (second[name]["processes"], second[name]["devices"]) == (1, 4), name
        assert second[name]["history_steps"] == list(range(10)), name  # 0..4 from the checkpoint
    # 1 x 4 -> 2 x 2 with a lazy state: each process only traces it, and restores into it
    for result in run(chained, 2, None, lazy=True):
        for name in STRATEGIES:
            got, expected = result[name], reference[name]
            assert got["built"] == [False], name
            assert got["steps"] == expected["steps"] == STEPS, name
            assert got["history_steps"] == expected["history_steps"], name
            np.testing.assert_allclose(
                got["loss"], expected["loss"], rtol=1e-5, atol=1e-7, err_msg=name
            )
            for leaf, expected_leaf in zip(
                jax.tree.leaves(got["params"]), jax.tree.leaves(expected["params"]), strict=True
            ):
                np.testing.assert_allclose(leaf, expected_leaf, rtol=1e-5, atol=1e-6, err_msg=name)
            # placed by the strategy on the topology it resumed on, optimizer moments too
            assert got["kernel_spec"] == expected["kernel_spec"], name
            assert got["moment_spec"] == expected["moment_spec"], name
    assert reference["sharded"]["kernel_spec"] == "P(None, 'model')"
    assert reference["fsdp"]["moment_spec"] == "P(None, 'data')"


class Positioned:
    """A dataset with a position of its own (``state_dict``/``load_state_dict``)."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        return iter(range(self.position, 10))

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


class Global(Positioned):
    """The same, with a position that is global: the same on every process."""

    elastic = True


def test_a_per_process_state_saved_by_another_number_of_processes_is_an_error():
    saved = OtherTopology([{"position": 4}, {"position": 4}])
    with pytest.raises(
        ValueError,
        match=r"state of 2 process\(es\), this run has 1, and Positioned keeps a position per "
        r"process: resume on 2 process\(es\), or feed a sequence .*ElasticIterator",
    ):
        skip_consumed(Positioned(), 4, saved)


def test_an_elastic_state_saved_by_another_number_of_processes_is_loaded():
    data = Global()
    assert list(skip_consumed(data, 4, OtherTopology([{"position": 4}] * 2))) == [4, 5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match=r"process 1 saved \{'position': 5\} but process 0"):
        skip_consumed(Global(), 4, OtherTopology([{"position": 4}, {"position": 5}]))
