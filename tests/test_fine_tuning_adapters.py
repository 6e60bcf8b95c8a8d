"""Fine-tuning through every adapter (Flax Linen, Flax NNX, Haiku, Equinox): each source
format (a pytree, another state, a ciclo checkpoint, an Orbax checkpoint, safetensors, Flax
msgpack) loads into each adapter's state bit for bit, a new head is kept with
``missing="keep"``, and ``trainable=`` freezes the rest (unchanged after training, no
optimizer state); kills in the frozen and in the unfrozen phase resume bit for bit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import equinox as eqx
import flax.linen as nn
import flax.serialization
import haiku as hk
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from safetensors.numpy import save_file

import ciclo
import ciclo_equinox
import ciclo_flax
import ciclo_haiku

FRAMEWORKS = ["linen", "nnx", "haiku", "equinox"]
SOURCES = ["pytree", "state", "ciclo", "orbax", "safetensors", "msgpack"]
CE = optax.softmax_cross_entropy_with_integer_labels
#: The output layer's names in each framework (the head a fine-tuning replaces).
HEAD = {"linen": "^out/", "nnx": "^out/", "haiku": "linear_1/", "equinox": "^layers/1/"}
RNG = np.random.default_rng(0)
BATCH = (RNG.normal(size=(16, 12)).astype(np.float32), RNG.integers(0, 5, 16).astype(np.int32))


class LinenMLP(nn.Module):
    classes: int = 5

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.classes, name="out")(nn.relu(nn.Dense(16, name="hidden")(x)))


class NNXMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, classes: int = 5) -> None:
        self.hidden, self.out = nnx.Linear(12, 16, rngs=rngs), nnx.Linear(16, classes, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def create(framework: str, seed: int = 0, classes: int = 5, **options: Any) -> Any:
    tx = optax.adam(1e-2)
    common = {"losses": {"loss": CE}, **options}
    if framework == "linen":
        model = LinenMLP(classes)
        return ciclo_flax.create_state(model, BATCH[0][:1], tx, key=seed, **common)
    if framework == "nnx":
        return ciclo_flax.create_nnx_state(NNXMLP(nnx.Rngs(seed), classes), tx, **common)
    if framework == "haiku":
        model = hk.transform(lambda x: hk.nets.MLP([16, classes])(x))
        return ciclo_haiku.create_state(model, BATCH[0][:1], tx, key=seed, **common)
    model = eqx.nn.MLP(12, classes, 16, 1, key=jax.random.key(seed))
    return ciclo_equinox.create_state(model, tx, vmap=True, **common)


def named(tree: Any) -> dict[str, np.ndarray]:
    return {
        ciclo.managed.key_path(p).removesuffix("/value"): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def nested(flat: dict[str, np.ndarray]) -> dict:
    """``{"a/b": x}`` as ``{"a": {"b": x}}``: how the files of other libraries hold them."""
    tree: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def same_bits(a: Any, b: Any) -> bool:
    x, y = named(a), named(b)
    return x.keys() == y.keys() and all(x[k].tobytes() == y[k].tobytes() for k in x)


def source_of(kind: str, trained: Any, directory: Path) -> Any:
    flat = named(trained.params)
    if kind == "pytree":
        return trained.params
    if kind == "state":
        return trained
    if kind == "orbax":
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(directory / "orbax", nested(flat))
        checkpointer.wait_until_finished()
        return directory / "orbax"
    if kind == "safetensors":
        save_file(flat, str(directory / "w.safetensors"))
        return directory / "w.safetensors"
    if kind == "msgpack":
        (directory / "w.msgpack").write_bytes(flax.serialization.msgpack_serialize(nested(flat)))
        return str(directory / "w.msgpack")
    raise AssertionError(kind)


def train(state: Any, steps: int) -> Any:
    for _ in range(steps):
        _, state = state.train_step(BATCH)
    return state


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_source_loads_into_each_adapter_bit_for_bit(tmp_path, framework, kind):
    other = create(framework, seed=1)  # other weights (another seed)
    if kind == "ciclo":  # a checkpoint of it, written by a loop
        ciclo.loop(other, [BATCH], {ciclo.every(1): ciclo.checkpoint(tmp_path / "run")})
        source = tmp_path / "run"
    else:
        source = source_of(kind, other, tmp_path)
    state = create(framework, seed=0).replace(step=np.int32(3))
    assert not same_bits(state.params, other.params)
    loaded = ciclo.load_weights(state, source)
    assert same_bits(loaded.params, other.params)
    assert int(loaded.step) == 0


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_new_head_is_kept_and_trained_alone(framework, capsys):
    pretrained = create(framework, seed=1)
    state = create(framework, seed=0, classes=10, trainable=HEAD[framework])
    with pytest.raises(ValueError, match=r"2 mismatched .*state \(.*\) float32, source"):
        ciclo.load_weights(state, pretrained)
    loaded = ciclo.load_weights(state, pretrained, mismatched="keep")
    printed = capsys.readouterr().out
    assert printed.startswith("weights plan: 2 loaded, 2 kept, 2 ignored, 2 mismatched, 0 cast")
    head = [n for n in named(state.params) if re.search(HEAD[framework], n)]
    assert sorted(ciclo.weights_plan(state, pretrained, mismatched="keep").kept) == sorted(head)
    moments = sum(x.size for x in jax.tree.leaves(loaded.opt_state))
    assert moments == 1 + 2 * sum(named(loaded.params)[n].size for n in head)
    after = train(loaded, 3)
    for name, value in named(after.params).items():
        unchanged = value.tobytes() == named(loaded.params)[name].tobytes()
        assert unchanged == (name not in head), name
    body = [n for n in named(after.params) if n not in head]
    assert all(
        named(after.params)[n].tobytes() == named(pretrained.params)[n].tobytes() for n in body
    )


def test_an_nnx_filter_selects_what_trains():
    state = create("nnx", trainable=nnx.PathContains("out"))
    assert {n.split("/mu/")[1].split("/")[0] for n in named(state.opt_state) if "/mu/" in n} == {
        "out"
    }
    state = state.with_trainable(nnx.Any(nnx.PathContains("hidden"), nnx.PathContains("out")))
    assert {n.split("/mu/")[1].split("/")[0] for n in named(state.opt_state) if "/mu/" in n} == {
        "hidden",
        "out",
    }


# --- kills in the frozen and in the unfrozen phase ------------------------------------------
WORKER = Path(__file__).parent / "fine_tuning_run.py"


def run(directory: Path, kill_at: str | None = None) -> tuple[dict[str, str], list[str]]:
    """The two-phase run of ``fine_tuning_run.py``: its final params' hashes and the steps
    it ran (``"frozen 0"``...); killed (SIGKILL) when it prints step ``kill_at``."""
    process = subprocess.Popen(
        [sys.executable, str(WORKER), str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"},
    )
    assert process.stdout is not None
    result: dict[str, str] = {}
    steps: list[str] = []
    for line in process.stdout:
        if line.startswith("step "):
            steps.append(line.split(" ", 1)[1].strip())
            if steps[-1] == kill_at:
                process.send_signal(signal.SIGKILL)
                process.communicate(timeout=60)
                return {}, steps
        if line.startswith("final "):
            _, name, digest = line.split()
            result[name] = digest
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    return result, steps


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("reference"))[0]


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["frozen 5", "unfrozen 4"])
def test_a_kill_in_either_phase_resumes_bit_for_bit(tmp_path, kill_at, reference):
    assert len(reference) == 4
    assert run(tmp_path / "killed", kill_at=kill_at)[0] == {}
    resumed, steps = run(tmp_path / "killed")
    assert resumed == reference
    # it went on from a checkpoint of the killed phase (not from its start)
    phase = kill_at.split()[0]
    assert f"{phase} 0" not in steps
    assert steps[0].startswith(phase)
