"""Size probe for the second shipped pair (issue 12): training step time and one-token decode time of
candidate T5 1.1 targets with the 8k vocabulary, side by side in one process, alternating, repeated.

Usage (from the repository root, data in ../shared/data):
  nice -n 10 python benchmarks/small_pair_probe.py train   # `specjax train`'s step at 2048 tokens/batch
  nice -n 10 python benchmarks/small_pair_probe.py decode  # one decode step (k=1) and a k=5 window, batch 1

train: the jitted step of ``specjax.train`` (AdamW, dropout 0.1, the CLI's defaults) on real Multi30k batches of
the two shapes that make 84% of an epoch ([128,16]: 120 and [85,24]: 126 of 292 batches at 2048 tokens);
seconds per step are weighted by the epoch's composition, the 46 [64,32] and [42,48] batches counted as [85,24]
(same tokens, longer attention: a slight underestimate). Compiling is the slow part on a loaded machine.
decode: ``specjax.models.t5.decode`` jitted with the parameters as arguments, batch 1, a 16-token input, a
96-slot cache; median of per-round means. Random weights (time does not depend on the values).
Prints one line per candidate: parameters, decoder float32 MB, per-token decode multiply-adds, times.
"""

import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax import train as tr
from specjax.cli.train import _model_sizes
from specjax.config import T5Config
from specjax.models import t5
from specjax.tokenizer import Tokenizer


def v11(d, n, f, enc, dec, h=64):
    return T5Config(
        vocab_size=8000, d_model=d, num_heads=n, head_dim=h, mlp_dim=f, num_encoder_layers=enc, num_decoder_layers=dec
    )


CANDIDATES = {
    "mini target d256 4+4 f1024": _model_sizes()["target"],
    "mini draft d64 4+2 f256": _model_sizes()["draft"],
    "d512 8x64 f1024 4+4": v11(512, 8, 1024, 4, 4),
    "d512 8x64 f2048 4+4": v11(512, 8, 2048, 4, 4),
    "d512 8x64 f1024 6+6": v11(512, 8, 1024, 6, 6),
    "d512 8x64 f1536 6+6": v11(512, 8, 1536, 6, 6),
    "d384 6x64 f1536 6+6": v11(384, 6, 1536, 6, 6),
    "d384 6x64 f1024 8+8": v11(384, 6, 1024, 8, 8),
    "small-target": _model_sizes()["small-target"],
    "small-draft": _model_sizes()["small-draft"],
    # bfloat16 activations and matmuls (AVX-512 BF16 on this CPU), float32 parameters and optimizer state
    "small-target bf16": dataclasses.replace(_model_sizes()["small-target"], dtype="bfloat16"),
}


def decoder_sizes(c: T5Config):
    """(float32 MiB of decoder weights + logits, per-token decode multiply-adds).

    Per token a decoder layer runs self-attention q, k, v, o, cross-attention q and o (the cross keys and
    values are computed once in encode) and the MLP; then the d x v logits. The embedding table is read one
    row per token and counted in neither.
    """
    inner = c.num_heads * c.head_dim
    mlp = (3 if c.gated_gelu else 2) * c.d_model * c.mlp_dim
    per_token = c.num_decoder_layers * (6 * c.d_model * inner + mlp) + c.d_model * c.vocab_size
    weights = c.num_decoder_layers * (8 * c.d_model * inner + mlp) + c.d_model * c.vocab_size
    return weights * 4 / 2**20, per_token


def probe_train(names, rounds=3):
    tok = Tokenizer("specjax/assets/default_pair/spiece.model", extra_ids=0)
    s, t = tr.read_parallel("../shared/data/train/multi30k/train.en", "../shared/data/train/multi30k/train.de")
    src, tgt = tr.tokenize_pairs(tok, s, t)
    epoch = tr.batches(src, tgt, 2048, 0, 0)
    shapes = {(128, 16): 120, (85, 24): 172}  # the 46 [64,32] and [42,48] batches counted as [85,24]
    batch = {shape: next(b for b in epoch if b[0].shape == shape) for shape in shapes}
    tc = tr.TrainConfig(num_steps=3000, tokens_per_batch=2048, dropout_rate=float(os.environ.get("DROPOUT", "0.1")))
    opt = tr._optimizer(tc)
    state = {}
    for name in names:
        c = CANDIDATES[name]
        params = t5.init_params(c, 0)
        step = tr._make_step(c, opt, "reference", 1.0, None, tc.dropout_rate, 0)
        os_ = opt.init(params)
        t0 = time.perf_counter()
        for shape in shapes:  # compile each shape once
            enc, dec, _ = batch[shape]
            params, os_, m = step(params, os_, enc, dec, None, np.int32(0))
            jax.block_until_ready(m)
        print(f"compiled {name}: {time.perf_counter() - t0:.0f}s ({t5.count_params(params) / 1e6:.1f}M)", flush=True)
        state[name] = [step, params, os_]
    times = {n: {s: [] for s in shapes} for n in names}
    for r in range(rounds):
        for name in names:
            step, params, os_ = state[name]
            for shape in shapes:
                enc, dec, _ = batch[shape]
                t0 = time.perf_counter()
                params, os_, m = step(params, os_, enc, dec, None, np.int32(r + 1))
                jax.block_until_ready((params, m))
                times[name][shape].append(time.perf_counter() - t0)
            state[name][1:] = [params, os_]
        print(
            f"round {r}: " + "; ".join(f"{n}: {np.mean([v[-1] for v in times[n].values()]):.2f}s" for n in names),
            flush=True,
        )
    ref = names[0]
    w = {n: sum(shapes[s] * np.median(times[n][s]) for s in shapes) / sum(shapes.values()) for n in names}
    for n in names:
        mb, mac = decoder_sizes(CANDIDATES[n])
        per_shape = ", ".join(f"{s[0]}x{s[1]}: {np.median(times[n][s]):.2f}" for s in shapes)
        print(
            f"TRAIN {n:28s} params {t5.count_params(state[n][1]) / 1e6:5.1f}M  s/step {w[n]:.2f} "
            f"(x{w[n] / w[ref]:.1f} of {ref}; {per_shape}; min/max over rounds "
            f"{min(min(v) for v in times[n].values()):.2f}/{max(max(v) for v in times[n].values()):.2f})  "
            f"epoch (292 steps) {292 * w[n] / 60:.0f} min",
            flush=True,
        )


def probe_decode(names, rounds=5, calls=100):
    fn = jax.jit(t5.decode, static_argnums=0)
    enc_fn = jax.jit(t5.encode, static_argnums=0)
    x = jnp.asarray(np.arange(3, 19, dtype=np.int32)[None])
    state = {}
    for name in names:
        c = CANDIDATES[name]
        params = t5.init_params(c, 0)
        encoded = enc_fn(c, params, x)
        state[name] = (c, params, encoded)
        for k in (1, 5):
            cache = t5.init_cache(c, 1, 96)
            jax.block_until_ready(
                fn(c, params, encoded, jnp.zeros((1, k), jnp.int32), cache, jnp.full((1,), 10, jnp.int32))
            )
    times = {n: {1: [], 5: []} for n in names}
    for _ in range(rounds):
        for name in names:
            c, params, encoded = state[name]
            for k in (1, 5):
                cache = t5.init_cache(c, 1, 96)
                tokens, pos = jnp.zeros((1, k), jnp.int32), jnp.full((1,), 10, jnp.int32)
                t0 = time.perf_counter()
                for _ in range(calls):
                    logits, cache = fn(c, params, encoded, tokens, cache, pos)
                jax.block_until_ready(logits)
                times[name][k].append((time.perf_counter() - t0) / calls * 1e3)
    ref = names[0]
    for n in names:
        mb, mac = decoder_sizes(CANDIDATES[n])
        t1, t5w = np.median(times[n][1]), np.median(times[n][5])
        print(
            f"DECODE {n:28s} dec {mb:6.1f} MiB f32  {mac / 1e6:6.2f}M MAC/token  k=1 {t1:6.3f} ms "
            f"(x{t1 / np.median(times[ref][1]):.1f} of {ref}; rounds {min(times[n][1]):.3f}-{max(times[n][1]):.3f})"
            f"  k=5 {t5w:6.3f} ms (x{t5w / t1:.2f} of k=1)",
            flush=True,
        )


if __name__ == "__main__":
    what = sys.argv[1]
    names = sys.argv[2:] or list(CANDIDATES)
    if what == "train":
        probe_train([n for n in names if "draft" not in n])
    else:
        probe_decode(names)
