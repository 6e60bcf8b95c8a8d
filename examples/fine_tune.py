"""Fine-tuning with ``ciclo.load_weights`` and ``trainable=``: a Flax NNX network is
pretrained on the digits 0-4 and checkpointed; a new network with a 10-class head loads
its backbone from the checkpoint (``missing="keep"``: the new head keeps its
initialization; the plan is printed), trains the head alone (the backbone stays bit for
bit as loaded, and has no optimizer state), then everything.

    python examples/fine_tune.py --steps 200
"""

from __future__ import annotations

import tempfile

import jax
import numpy as np
import optax
from _data import Batches, digits, eval_batches, parse_args
from flax import nnx

import ciclo
import ciclo_flax


class Backbone(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.layers = nnx.List([nnx.Linear(64, 128, rngs=rngs), nnx.Linear(128, 128, rngs=rngs)])

    def __call__(self, x):
        for layer in self.layers:
            x = nnx.relu(layer(x))
        return x


class Classifier(nnx.Module):
    def __init__(self, classes: int, head: str, *, rngs: nnx.Rngs) -> None:
        self.backbone = Backbone(rngs=rngs)
        self.head_name = head
        setattr(self, head, nnx.Linear(128, classes, rngs=rngs))

    def __call__(self, x):
        return getattr(self, self.head_name)(self.backbone(x))


def create(model: nnx.Module, **options):
    return ciclo_flax.create_nnx_state(
        model,
        optax.adam(3e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        **options,
    )


def backbone_of(state) -> dict[str, np.ndarray]:
    """The backbone's parameters by name, as host arrays."""
    leaves = jax.tree_util.tree_flatten_with_path(state.params["backbone"])[0]
    return {jax.tree_util.keystr(path): np.asarray(value) for path, value in leaves}


def main() -> None:
    args = parse_args(__doc__, steps=200, batch_size=64)
    x_train, y_train, x_test, y_test = digits()
    test = eval_batches(x_test, y_test)

    # 1. Pretrain on the digits 0-4 (a 5-class head named "digits_0_4"), checkpointed.
    low = y_train < 5
    pretrained = create(Classifier(5, "digits_0_4", rngs=nnx.Rngs(0)))
    directory = tempfile.mkdtemp(prefix="ciclo-pretrained-")
    pretrained, _, _ = ciclo.train_loop(
        pretrained,
        Batches(x_train[low], y_train[low], args.batch_size),
        callbacks=[ciclo.checkpoint(directory)],
        stop=args.steps,
    )

    # 2. A new network with a 10-class "head": its backbone from the checkpoint, the new
    #    head kept as initialized, the old head ignored. Only the head trains.
    state = create(Classifier(10, "head", rngs=nnx.Rngs(1)), trainable="^head/")
    state = ciclo.load_weights(state, directory, missing="keep", unexpected="ignore")
    loaded = backbone_of(state)
    data = Batches(x_train, y_train, args.batch_size, seed=1)
    state, _, _ = ciclo.train_loop(state, data, stop=args.steps)
    after = backbone_of(state)
    assert all(after[name].tobytes() == loaded[name].tobytes() for name in loaded)
    _, logs, _ = ciclo.test_loop(state, test)
    print(f"head only: backbone unchanged, test accuracy {logs.entry_value('accuracy'):.4f}")

    # 3. Then everything trains (a new optimizer state for all the parameters).
    state = state.with_trainable(None)
    state, _, _ = ciclo.train_loop(state, data, stop=args.steps)
    _, logs, _ = ciclo.test_loop(state, test)
    accuracy = float(logs.entry_value("accuracy"))
    print(f"fine-tuned: test accuracy on all 10 digits {accuracy:.4f}")
    assert accuracy >= 0.9, accuracy


if __name__ == "__main__":
    main()
