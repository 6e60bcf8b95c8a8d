"""The README demo: a Flax MLP learns to read handwritten digits (scikit-learn's digits,
shipped with scikit-learn: no download) with ``ciclo.train_loop``: a progress bar, an
evaluation on the test set after every epoch, the final test accuracy, and a plot of loss
and accuracy.

    python examples/demo.py --steps 400 --plot examples/out/demo.png
"""

from __future__ import annotations

import sys
from pathlib import Path

import optax
from _data import Batches, digits, eval_batches, parse_args
from flax_linen import MLP

import ciclo
import ciclo_flax


def main() -> None:
    args = parse_args(
        __doc__, steps=400, batch_size=64, plot="examples/out/demo.png", min_accuracy=0.95
    )
    x_train, y_train, x_test, y_test = digits()
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of 8x8 pixels")

    state = ciclo_flax.create_state(
        MLP(),  # Dense(128), BatchNorm, ReLU, Dropout(0.2), Dense(10)
        x_train[:1],
        optax.adam(1e-3),
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, labels: logits.argmax(-1) == labels},
        key=0,
    )
    epoch = min(len(x_train) // args.batch_size, args.steps)  # 22 steps of 64 images
    state, history, elapsed = ciclo.train_loop(
        state,
        Batches(x_train, y_train, args.batch_size),  # endless shuffled epochs
        test_dataset=lambda: eval_batches(x_test, y_test),
        epoch_duration=epoch,  # evaluate after every epoch
        callbacks=[ciclo.keras_bar(total=args.steps)],
        stop=args.steps,
    )

    _, logs, _ = ciclo.test_loop(state, eval_batches(x_test, y_test))
    accuracy = float(logs.metrics.accuracy)
    print(
        f"trained {elapsed.steps} steps ({elapsed.samples} images) in {elapsed.time:.1f}s; "
        f"final test accuracy {accuracy:.4f}"
    )
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        history.plot(("loss", "loss_test"), ("accuracy", "accuracy_test"), path=args.plot)
        print(f"plot of loss and accuracy: {args.plot}")
    if accuracy < args.min_accuracy:
        sys.exit(f"test accuracy {accuracy:.4f} is below {args.min_accuracy}")


if __name__ == "__main__":
    main()
