"""Manual iteration: your own ``for`` loop over ``ciclo.elapse``, with ciclo's schedules
called by hand and a ``ciclo.History``; a softmax regression in plain JAX on digits.

    python examples/manual_iteration.py --steps 300
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from _data import Batches, digits, parse_args

import ciclo

tx = optax.sgd(0.5, momentum=0.9)


def loss_fn(params, x, y):
    logits = x @ params["w"] + params["b"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, jnp.mean(logits.argmax(-1) == y)


@jax.jit
def train_step(params, opt_state, x, y):
    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    logs = ciclo.logs().add_loss("loss", loss).add_metric("accuracy", accuracy)
    return logs, optax.apply_updates(params, updates), opt_state


def main() -> None:
    args = parse_args(__doc__, steps=300, batch_size=64)
    x_train, y_train, x_test, y_test = digits()
    params = {"w": jnp.zeros((64, 10)), "b": jnp.zeros(10)}
    opt_state = tx.init(params)
    history = ciclo.history()
    log_every = ciclo.every(10)  # in steps
    evaluate_every = ciclo.every(samples=4000)  # in samples
    report_every = ciclo.every(time=2.0)  # in seconds

    batches = Batches(x_train, y_train, args.batch_size)
    steps = ciclo.elapse(batches, stop=args.steps)  # yields (elapsed before the batch, batch)
    for elapsed, (x, y) in steps:
        logs, params, opt_state = train_step(params, opt_state, x, y)
        if evaluate_every(elapsed):
            _, accuracy = loss_fn(params, x_test, y_test)
            logs.add_metric("accuracy_test", accuracy)
        if log_every(elapsed) or "accuracy_test" in logs.metrics:
            history.commit(elapsed, logs)  # values stay on device until read
        if report_every(elapsed):
            print(f"step {elapsed.steps:4d}  samples {elapsed.samples:6d}  {elapsed.time:5.1f}s")

    elapsed = steps.finish()  # the count after the last batch
    print(f"evaluated at samples {history.collect('samples', 'accuracy_test')[0]}")
    _, accuracy = loss_fn(params, x_test, y_test)
    print(
        f"manual iteration: {elapsed.steps} steps, {len(history)} history rows, "
        f"final train loss {history.collect('loss')[-1]:.4f}, "
        f"final test accuracy {float(accuracy):.4f}"
    )


if __name__ == "__main__":
    main()
