"""Tokens/s and MFU of ``ciclo.train_loop`` training examples/language_model.py's GPT (Flax
NNX, bfloat16 compute, AdamW with clipping, EMA, sharded fsdp x tensor over 8 simulated CPU
devices), against a hand-written loop in the MaxText style: a ``for`` loop calling a
hand-written step jitted with ``NamedSharding`` s (the same shardings, the same math), no
framework. Target: ratio <= 1.02. The fused variant (``steps_per_call=4``) is a row of its
own (against the same unfused hand-written loop). On an accelerator the model is larger
(width 1024, 8 blocks, batch 32 of 512 tokens: about 110M parameters).

    python benchmarks/language_model.py            # the example's model, batch 16
    python benchmarks/language_model.py --tiny     # one block of width 64
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

# 8 simulated devices on a CPU (nox -s bench runs the others with XLA_FLAGS="")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"


import jax
import jax.numpy as jnp
import optax
from _harness import compare, emit, parse_args
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import ciclo
import ciclo_flax


def _load_example() -> Any:
    """examples/language_model.py as a module (its name is this script's)."""
    path = Path(__file__).parents[1] / "examples" / "language_model.py"
    spec = importlib.util.spec_from_file_location("language_model_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


example = _load_example()
GPT, RULES, ByteBatches = example.GPT, example.RULES, example.ByteBatches
make_mesh, model_flops_per_token = example.make_mesh, example.model_flops_per_token
peak_flops, stdlib_corpus = example.peak_flops, example.stdlib_corpus

CE = optax.softmax_cross_entropy_with_integer_labels
EMA = 0.99


def optimizer(steps: int) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, max(1, steps // 10), steps, 3e-4)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.1))


def hand_written_step(graphdef, rest, tx):
    """The usual hand-written step: float32 parameters cast to bfloat16 for the forward and
    backward passes, float32 loss, clipped AdamW, the moving average of the parameters."""

    def loss_fn(params, tokens, targets):
        computed = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
        logits = nnx.merge(graphdef, computed, rest)(tokens).astype(jnp.float32)
        return CE(logits, targets).mean(), logits

    def step(state, batch):
        params, opt_state, ema = state
        tokens, targets = batch
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        ema = jax.tree.map(lambda e, p: e + (1 - EMA) * (p - e), ema, params)
        accuracy = jnp.mean(logits.argmax(-1) == targets)
        return (params, opt_state, ema), {"loss": loss, "accuracy": accuracy}

    return step


def main() -> None:
    args = parse_args(__doc__ or "")
    length = 128  # steps divide by 4: the fused row runs groups of 4 only
    if args.tiny:
        width, layers, heads, batch_size, steps, repeats = 64, 1, 4, 8, 8, 2
    elif jax.default_backend() == "cpu":
        width, layers, heads, batch_size, steps, repeats = 256, 4, 8, 16, 12, 5
    else:  # an accelerator: a GPT of about 100M parameters, so the step is not dispatch
        width, layers, heads, batch_size, steps, repeats = 1024, 8, 16, 32, 24, 5
        length = 512
    train, _ = stdlib_corpus()
    batches = [
        batch
        for _, batch in zip(range(steps), ByteBatches(train, batch_size, length), strict=False)
    ]
    mesh = make_mesh(2)
    model = GPT(width, layers, heads, length, rngs=nnx.Rngs(0))
    tx = optimizer(steps)

    def create(steps_per_call: int):
        strategy = ciclo.managed.sharded(mesh, RULES, fsdp=True, steps_per_call=steps_per_call)
        return ciclo_flax.create_nnx_state(
            model, tx, losses={"loss": CE},
            metrics={"accuracy": lambda logits, targets: logits.argmax(-1) == targets},
            strategy=strategy, compute_dtype=jnp.bfloat16, ema=EMA,
        )  # fmt: skip

    unfused, fused = create(1), create(4)

    def ciclo_run(state):
        def run():
            final, history, _ = ciclo.train_loop(state, batches)
            jax.block_until_ready(final)
            history.fetch()

        return run

    # The hand-written loop: the same arrays, placed where ciclo placed them.
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    hand_state = (unfused.params, unfused.opt_state, unfused.ema_params)
    shardings = jax.tree.map(lambda x: x.sharding, hand_state)
    data = NamedSharding(mesh, P("data"))
    step = jax.jit(
        hand_written_step(graphdef, rest, tx),
        in_shardings=(shardings, data),
        out_shardings=(shardings, NamedSharding(mesh, P())),
    )

    def hand_written():
        state = hand_state
        for batch in batches:
            state, _ = step(state, jax.device_put(batch, data))
        jax.block_until_ready(state)

    rows = compare(
        f"language model ({jax.device_count()} {jax.default_backend()} devices)",
        {
            "hand-written for loop, jit + NamedSharding": hand_written,
            "ciclo train_loop": ciclo_run(unfused),
            "ciclo train_loop, steps_per_call=4": ciclo_run(fused),
        },
        repeats=repeats,
        per=steps,
        unit="ms",
        target="ratio <= 1.02",
    )
    emit(rows, args.json)
    params = sum(x.size for x in jax.tree.leaves(unfused.params))
    flops_per_token = model_flops_per_token(params, layers, width, length)
    peak, source = peak_flops()
    tokens = batch_size * length
    summary = {"benchmark": "language model: tokens/s and MFU", "parameters": f"{params:,}"}
    for row in rows:
        tokens_per_second = tokens / (row["median"] / 1e3)
        mfu = tokens_per_second * flops_per_token / peak
        summary[row["candidate"]] = f"{tokens_per_second:,.0f} tokens/s, MFU {mfu:.1%}"
    summary["peak"] = f"{peak:.3g} FLOP/s ({source})"
    print(summary)
    emit_other(summary, args.json)


def emit_other(row: dict, json_path: str | None) -> None:
    """Appends a row without a candidate (RESULTS.md's "Other measurements")."""
    if json_path:
        import json

        with open(json_path, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
