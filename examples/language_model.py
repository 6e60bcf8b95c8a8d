"""A GPT-style byte-level language model in Flax NNX, trained on the Python standard library's
own source files (shipped with Python: no download), sharded over 8 devices with fsdp x
tensor parallelism, in bfloat16, with averaged weights, resumable after a kill.

    python examples/language_model.py                  # the default run (a few minutes)
    python examples/language_model.py --steps 50       # a short one
    python examples/language_model.py --checkpoint-dir runs/lm   # resumes if killed

What it uses (docs/language-model.md walks through it):

- ``strategy=ciclo.managed.sharded(mesh, RULES, fsdp=True, accumulate_steps=...)``: a mesh
  ``("data", "model")`` of every device (8 simulated CPU devices unless ``XLA_FLAGS`` says
  otherwise), the attention heads and MLP split over ``model`` (tensor parallelism), every
  array split over ``data`` as well (fsdp), and each batch split into micro-batches;
- ``compute_dtype=jnp.bfloat16``: float32 parameters and AdamW moments, bfloat16 forward
  and backward passes, float32 losses;
- ``ema=0.99``: ``ema_params``, evaluated as ``loss_test_ema``;
- AdamW with a warm-up-cosine schedule and gradient clipping (optax);
- ``ciclo.throughput``: tokens/s (samples are counted in tokens) and MFU;
- ``ciclo.checkpoint`` with ``resume=``: a killed run continues exactly where it was saved;
- ``ciclo.predict_loop``: a few lines of generated text, one byte per step.

The last line printed is ``eval perplexity: X`` (the held-out files' perplexity per byte;
a uniform guess over 256 bytes scores 256).
"""

from __future__ import annotations

import os

# 8 simulated devices on a CPU host (set before jax is imported; an accelerator is unaffected)
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import json
import math
import sysconfig
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import ciclo
import ciclo_flax

# --- data: the standard library's source, byte by byte ------------------------------------

SKIPPED = {"site-packages", "dist-packages", "test", "tests", "idlelib"}


def stdlib_corpus() -> tuple[np.ndarray, np.ndarray]:
    """``(train, held_out)``: the bytes of the standard library's ``.py`` files, split by
    file (about one file in ten held out, chosen by a hash of its path), as uint8 arrays."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not SKIPPED & set(p.relative_to(root).parts))
    parts: dict[bool, list[bytes]] = {True: [], False: []}
    for path in files:
        held_out = zlib.crc32(str(path.relative_to(root)).encode()) % 10 == 0
        parts[held_out].append(path.read_bytes())
    train, held_out = (np.frombuffer(b"\n".join(parts[k]), np.uint8) for k in (False, True))
    return train, held_out


def windows(data: np.ndarray, starts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)``: the ``length`` bytes at each start, and the bytes after them."""
    rows = data[starts[:, None] + np.arange(length + 1)].astype(np.int32)
    return rows[:, :-1], rows[:, 1:]


class ByteBatches:
    """Endless batches of random windows of ``data``; batch ``i`` depends only on the seed
    and ``i``, and ``state_dict`` saves ``i``: a resumed run draws the same batches."""

    def __init__(self, data: np.ndarray, batch_size: int, length: int, seed: int = 0) -> None:
        self.data, self.batch_size, self.length, self.seed = data, batch_size, length, seed
        self.position = 0

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        while True:
            rng = np.random.default_rng([self.seed, self.position])
            starts = rng.integers(0, len(self.data) - self.length - 1, self.batch_size)
            self.position += 1
            yield windows(self.data, starts, self.length)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def eval_batches(
    data: np.ndarray, count: int, batch_size: int, length: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` fixed windows of the held-out files, evenly spaced, in batches."""
    starts = np.linspace(0, len(data) - length - 2, count).astype(np.int64)
    return [windows(data, starts[i : i + batch_size], length) for i in range(0, count, batch_size)]


# --- the model: a GPT-style decoder -------------------------------------------------------


class Block(nnx.Module):
    """Pre-norm causal self-attention and MLP, with residual connections."""

    def __init__(self, width: int, heads: int, *, rngs: nnx.Rngs) -> None:
        self.heads = heads
        self.norm1 = nnx.LayerNorm(width, rngs=rngs)
        self.query = nnx.Linear(width, width, use_bias=False, rngs=rngs)
        self.key = nnx.Linear(width, width, use_bias=False, rngs=rngs)
        self.value = nnx.Linear(width, width, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(width, width, use_bias=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(width, rngs=rngs)
        self.mlp_in = nnx.Linear(width, 4 * width, rngs=rngs)
        self.mlp_out = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        batch, length, width = x.shape
        h = self.norm1(x)
        q, k, v = (
            f(h).reshape(batch, length, self.heads, width // self.heads)
            for f in (self.query, self.key, self.value)
        )
        attended = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.reshape(batch, length, width))
        return x + self.mlp_out(nnx.gelu(self.mlp_in(self.norm2(x))))


class GPT(nnx.Module):
    """Bytes in, next-byte logits out: embeddings, ``layers`` blocks, a final norm."""

    def __init__(self, width: int, layers: int, heads: int, length: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(256, width, rngs=rngs)
        self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (length, width)))
        self.blocks = nnx.List([Block(width, heads, rngs=rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, 256, use_bias=False, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


#: Where each array lives on the ("data", "model") mesh: heads and the MLP's hidden units
#: split over "model" (Megatron-style column- then row-parallel), and with fsdp=True every
#: array is also split over "data" along its largest dimension left. The regexes match the
#: parameters, their AdamW moments (opt_state/...) and their average (ema_params/...).
RULES = [
    (r"blocks/\d+/(query|key|value)/kernel", P(None, "model")),
    (r"blocks/\d+/out/kernel", P("model", None)),
    (r"blocks/\d+/mlp_in/kernel", P(None, "model")),
    (r"blocks/\d+/mlp_in/bias", P("model")),
    (r"blocks/\d+/mlp_out/kernel", P("model", None)),
]


def model_flops_per_token(params: int, layers: int, width: int, length: int) -> float:
    """Training FLOPs per token, as MFU counts them (PaLM's appendix B): 6 per parameter
    (forward and backward) plus the attention scores, 12 * layers * width * length."""
    return 6.0 * params + 12.0 * layers * width * length


# --- peak FLOP/s, for MFU -------------------------------------------------------------------

#: Dense bfloat16 peak FLOP/s per chip, from the datasheets.
PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12, "TPU v5p": 459e12}


def peak_flops(dtype: jnp.dtype = jnp.bfloat16, directory: str | None = None) -> tuple[float, str]:
    """The devices' peak FLOP/s and where the figure comes from: the datasheet of a known
    accelerator, else (a CPU) the best of three timings of one large matmul per device,
    all devices at once (as the sharded step runs them), measured once per run: kept in
    ``directory`` (the checkpoints'), so that a resumed run divides by the same peak."""
    kept = None if directory is None else os.path.join(directory, "peak_flops.json")
    if kept is not None and os.path.exists(kept):
        with open(kept) as file:
            peak, source = json.load(file)
        return peak, f"{source}, measured when the run began"
    peak, source = _peak_flops(dtype)
    if kept is not None:
        os.makedirs(directory, exist_ok=True)
        with open(kept, "w") as file:
            json.dump([peak, source], file)
    return peak, source


def _peak_flops(dtype: jnp.dtype) -> tuple[float, str]:
    kind = jax.devices()[0].device_kind
    for name, peak in PEAKS.items():
        if name.lower() in kind.lower():
            return peak * jax.device_count(), f"datasheet ({kind})"
    devices, size, reps = jax.device_count(), 512, 5
    mesh = jax.make_mesh((devices,), ("devices",), axis_types=(AxisType.Auto,))
    sharding = jax.sharding.NamedSharding(mesh, P("devices"))
    a = jax.device_put(jnp.ones((devices, size, size), dtype), sharding)
    matmul = jax.jit(lambda a: a @ a)
    matmul(a).block_until_ready()
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            out = matmul(a)
        out.block_until_ready()
        best = max(best, 2 * size**3 * devices * reps / (time.perf_counter() - start))
    return best, f"measured: {devices} {jnp.dtype(dtype).name} matmuls at once"


# --- training -----------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--steps", type=int, default=150, help="optimizer updates")
    add("--batch-size", type=int, default=16, help="sequences per update")
    add("--accumulate", type=int, default=2, help="micro-batches per update")
    add("--length", type=int, default=128, help="sequence length (bytes)")
    add("--width", type=int, default=256)
    add("--layers", type=int, default=4)
    add("--heads", type=int, default=8)
    add("--learning-rate", type=float, default=3e-3)
    add("--ema", type=float, default=0.99, help="decay of the averaged weights")
    add("--tensor", type=int, default=2, help="devices on the 'model' (tensor) axis")
    add("--eval-every", type=int, default=50, help="steps between evaluations")
    add("--peak-flops", type=float, default=None, help="the devices' peak FLOP/s, for MFU")
    add("--checkpoint-dir", default=None, help="resume from (and save to) this directory")
    add("--checkpoint-every", type=int, default=50)
    add("--generate", type=int, default=80, help="bytes to generate at the end")
    add(
        "--save-params", default=None, help="write the final (and averaged) parameters to this .npz"
    )
    return parser.parse_args()


def make_mesh(tensor: int) -> jax.sharding.Mesh:
    """Every device on a ("data", "model") mesh, ``tensor`` of them on "model" (fewer
    when the device count does not divide)."""
    devices = jax.device_count()
    tensor = math.gcd(tensor, devices)
    return jax.make_mesh(
        (devices // tensor, tensor), ("data", "model"), axis_types=(AxisType.Auto,) * 2
    )


def generate(state, prompts: list[bytes], count: int, length: int) -> list[bytes]:
    """``count`` bytes after each prompt, sampled one per step by ``predict_loop``: each
    step runs the state's ``predict_step`` on the last ``length`` bytes and appends one."""
    rows = [np.frombuffer(p.rjust(length, b"\n")[-length:], np.uint8) for p in prompts]
    window = jnp.asarray(np.stack(rows).astype(np.int32))

    @jax.jit
    def sample(logits: jax.Array, window: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        byte = jax.random.categorical(key, logits[:, -1] / 0.7)  # temperature 0.7
        return byte, jnp.concatenate([window[:, 1:], byte[:, None].astype(window.dtype)], 1)

    def generate_step(carry, index):
        state, window = carry
        logs, _ = state.predict_step(window)
        byte, window = sample(logs.outputs.predictions, window, jax.random.key(index))
        return {"byte": byte}, None, (state, window)

    _, outputs, _ = ciclo.predict_loop(
        (state, window), range(count), {ciclo.on_predict_step: generate_step}
    )
    generated = np.stack([np.asarray(b) for b in outputs["byte"]], 1).astype(np.uint8)
    return [prompt + row.tobytes() for prompt, row in zip(prompts, generated, strict=True)]


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    train_bytes, held_out = stdlib_corpus()
    mesh = make_mesh(args.tensor)
    model = GPT(args.width, args.layers, args.heads, args.length, rngs=nnx.Rngs(0))
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print(
        f"{params / 1e6:.2f} M parameters; {len(train_bytes) / 1e6:.1f} MB to train on, "
        f"{len(held_out) / 1e6:.1f} MB held out; mesh {dict(mesh.shape)} of "
        f"{jax.devices()[0].platform} devices"
    )
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, args.learning_rate, max(1, args.steps // 10), args.steps, args.learning_rate / 10
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.1))
    state = ciclo_flax.create_nnx_state(
        model,
        tx,
        losses={"loss": optax.softmax_cross_entropy_with_integer_labels},
        metrics={"accuracy": lambda logits, targets: logits.argmax(-1) == targets},
        strategy=ciclo.managed.sharded(mesh, RULES, fsdp=True, accumulate_steps=args.accumulate),
        compute_dtype=jnp.bfloat16,
        ema=args.ema,
    )
    tokens = args.batch_size * args.length
    directory = args.checkpoint_dir or tempfile.mkdtemp(prefix="language_model-")
    peak, peak_source = (
        (args.peak_flops, "--peak-flops") if args.peak_flops else peak_flops(directory=directory)
    )
    flops = model_flops_per_token(params, args.layers, args.width, args.length) * tokens
    first_step = []  # where this process began (after a resume, the checkpoint's step)
    evaluation = eval_batches(held_out, 64, 32, args.length)
    state, history, elapsed = ciclo.train_loop(
        state,
        ByteBatches(train_bytes, args.batch_size, args.length),
        {
            ciclo.every(args.checkpoint_every): ciclo.checkpoint(directory, keep=2),
            ciclo.on_train_begin: lambda state, batch, elapsed: first_step.append(elapsed.steps),
        },
        callbacks=[
            ciclo.throughput(10, flops_per_step=flops, peak_flops=peak),
            ciclo.tqdm_bar(total=args.steps),
        ],
        test_dataset=evaluation,
        epoch_duration=min(args.eval_every, args.steps),
        stop=args.steps,
        batch_size_fn=lambda batch: batch[0].size,  # samples count tokens
        resume=directory,
    )
    rows = history.collect("steps", "loss_test", "loss_test_ema")
    for step, loss, ema_loss in zip(*rows, strict=True):
        print(
            f"step {step + 1}: held-out perplexity {math.exp(loss):.2f} "
            f"(averaged weights {math.exp(ema_loss):.2f})"
        )
    begun = first_step[0] if first_step else elapsed.steps  # none: a finished run
    timing = f"{elapsed.steps - begun} steps in {time.perf_counter() - started:.0f} s"
    timing += f" (resumed at step {begun} of {elapsed.steps})" if begun else ""
    speeds = history.collect("samples_per_second", "mfu")
    if speeds[0]:
        print(
            f"throughput: {np.median(speeds[0]):,.0f} tokens/s, MFU {np.median(speeds[1]):.1%} "
            f"(peak {peak:.3g} FLOP/s, {peak_source}); {timing}"
        )
    else:
        print(timing)
    for text in generate(
        state, [b"def ", b"import ", b"class ", b"    return "], args.generate, args.length
    ):
        print(repr(text.decode("utf-8", errors="replace")))
    if args.save_params:
        leaves = jax.tree.leaves((state.params, state.ema_params))
        np.savez(args.save_params, *[np.asarray(leaf) for leaf in leaves])
    if rows[0] and rows[0][-1] + 1 == elapsed.steps:  # evaluated after the last step
        loss = rows[1][-1]
    else:
        loss = float(ciclo.test_loop(state, evaluation)[1].entry_value("loss"))
    print(f"eval perplexity: {math.exp(loss):.2f}")


if __name__ == "__main__":
    main()
