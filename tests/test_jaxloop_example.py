"""examples/jaxloop_style.py runs (a short run on 8 devices with the "mesh" partitioner):
two evaluation sets on their own intervals, checkpoints at every inner loop, summaries, the
model placed by its partitioning annotations, and the standalone evaluation of the
checkpoints agreeing with the evaluations made during training."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import jax
import pytest
from jax.sharding import PartitionSpec as P

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "jaxloop_style.py"


def load_example():
    spec = importlib.util.spec_from_file_location("jaxloop_style", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # flax's dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_jaxloop_style_example(tmp_path, capsys):
    example = load_example()
    partitioner = "mesh" if jax.device_count() % 2 == 0 else "single"
    result = example.main(
        [
            "--steps",
            "40",
            "--inner-steps",
            "10",
            "--partitioner",
            partitioner,
            "--workdir",
            str(tmp_path),
        ]
    )
    history, evaluated = result["history"], result["evaluated"]

    # The outer loop with two eval specs: "valid" after every inner loop, "test" every two.
    assert history.collect("steps", "accuracy_valid")[0] == [9, 19, 29, 39]
    steps, accuracy_test = history.collect("steps", "accuracy_test")
    assert steps == [19, 39]
    assert accuracy_test[-1] > 0.5  # it learns (chance is 0.1)

    # One checkpoint per inner loop; evaluating them standalone gives, at the steps where
    # training evaluated "test" too, the same accuracies.
    ckpt_steps, ckpt_accuracy = evaluated.collect("steps", "accuracy_test")
    assert ckpt_steps == [10, 20, 30, 40]
    assert ckpt_accuracy[1] == pytest.approx(accuracy_test[0], abs=1e-6)
    assert ckpt_accuracy[3] == pytest.approx(accuracy_test[1], abs=1e-6)

    # Summaries, and the partitioner: kernels placed by their nn.with_partitioning names.
    header = (tmp_path / "summary.csv").read_text().splitlines()[0]
    assert {"steps", "loss", "accuracy_valid", "accuracy_test"} <= set(header.split(","))
    if partitioner == "mesh":
        kernel = result["state"].params["Dense_0"]["kernel"].value
        assert kernel.sharding.spec == P(None, "model")
    assert "final test accuracy" in capsys.readouterr().out
