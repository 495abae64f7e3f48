"""Seconds per `specjax train` step of a shipped size, with the model's matrix products as they are and with
plain bfloat16 einsums, side by side in one process (alternating, repeated).

The step is `specjax.train`'s jitted step (AdamW, dropout 0.1, bfloat16 activations: the small target's
recipe, `specjax/assets/small_pair/TRAINING.md`) on random batches of the two bucket shapes that make most of a
Multi30k epoch at 2,048 tokens ([128, 16] and [85, 24]). "plain" replaces `specjax.models.t5._dense_matmul` by
`jnp.einsum` while its step is traced: every bfloat16 dot of the forward and backward passes then has a bfloat16
output, which XLA:CPU runs as converts and a float32 dot. Prints the median and minimum seconds per step of each
and the ratio.

    python benchmarks/train_step_cost.py --size small-target --repeats 4
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax import train as tr
from specjax.cli.train import _model_sizes
from specjax.models import t5

SHAPES = ((128, 16), (85, 24))


def make_step(config, plain: bool):
    """The jitted train step of ``config``, traced now (with plain einsums if ``plain``), and its inputs."""
    tc = tr.TrainConfig(
        num_steps=9000,
        tokens_per_batch=2048,
        learning_rate=5e-4,
        warmup_steps=300,
        dropout_rate=0.1,
        compute_dtype="bfloat16",
    )
    opt = tr._optimizer(tc)
    params = t5.init_params(config, 0)
    opt_state = opt.init(params)
    step = tr._make_step(config, opt, "reference", 0.0, None, 0.1, 0, "bfloat16")
    rng = np.random.default_rng(0)
    batches = [
        (rng.integers(2, config.vocab_size, s).astype(np.int32), rng.integers(2, config.vocab_size, s).astype(np.int32))
        for s in SHAPES
    ]
    original = t5._dense_matmul
    if plain:
        t5._dense_matmul = lambda x, kernel: jnp.einsum("...i,io->...o", x, kernel)
    try:
        for enc, dec in batches:  # trace and compile every shape now, under the chosen matmul
            jax.block_until_ready(step(params, opt_state, enc, dec, None, np.int32(5), np.float32(1.0)))
    finally:
        t5._dense_matmul = original
    return step, params, opt_state, batches


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--size",
        default="small-target",
        choices=sorted(_model_sizes()),
        help="a `specjax train --model` size (default: small-target)",
    )
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    config = _model_sizes()[args.size]
    variants = {"as is": make_step(config, False), "plain einsum": make_step(config, True)}
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, (step, params, opt_state, batches) in variants.items():
            for enc, dec in batches:
                t0 = time.perf_counter()
                jax.block_until_ready(step(params, opt_state, enc, dec, None, np.int32(5), np.float32(1.0)))
                times[name].append(time.perf_counter() - t0)
    print(f"jax {jax.__version__}, {args.size}, batches {SHAPES}, bfloat16 activations, dropout 0.1")
    for name, ts in times.items():
        print(f"{name:14s} s/step median {np.median(ts):.3f}  min {min(ts):.3f}")
    print(f"plain / as is: {np.median(times['plain einsum']) / np.median(times['as is']):.2f}x")


if __name__ == "__main__":
    main()
