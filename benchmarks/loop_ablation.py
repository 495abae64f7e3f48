"""Where a speculative iteration's time goes, by taking the real loop apart: each model swapped for a stand-in.

The real ``speculative_sample`` loop (batch 1, temperature 0, Multi30k test lines) is timed beside the same loop
with one part replaced (same process, alternating line by line, best of ``--repeats``):

- **no draft**: a stand-in draft source that proposes ``last + 5`` γ times (no model; the target rejects it, so
  every iteration is one target window plus the loop's own work: accept, commit, keys, conditionals);
- **no target**: a stand-in target whose logits reject every draft (one-hot, no weights), so every iteration is
  the draft's γ steps with their weights warm in the cache, plus the loop's work;
- **no target, cold**: the same stand-in reading ``--flush-mb`` of weights each call (a data-dependent sum, so
  XLA cannot hoist it), as the real target's window does: the draft's steps then start with their weights
  evicted from the last-level cache;
- **no models** and **no models, cold**: both stand-ins (the loop alone, and the loop plus the read).

Per iteration (ms) = call time / target calls, summed over the lines (the stand-ins end rows at
``max_decode_length``; the real loop's fixed per-call costs, its encoders, are folded in, which a fit over lines
cannot separate when every line has the same number of iterations). From these:
``draft, warm = no target − no models``; ``draft, cold = (no target, cold) − (no models, cold)``;
``window + loop = no draft``; and what the real iteration costs beyond their sum.

Nothing is asserted; only the ratios within one run mean anything (this machine is shared).

    python benchmarks/loop_ablation.py --gamma 5 --num-inputs 12
    python benchmarks/loop_ablation.py --gamma 5 --dtype float32 --draft-dtype float32
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.bench.inputs import MULTI30K_TEST, encode_inputs, read_lines
from specjax.bench.profile import model_costs
from specjax.decoding.drafts import decoder_input_at
from specjax.decoding.verify import Proposal


@dataclasses.dataclass(frozen=True)
class ConstantDraft:
    """A draft source with no model: proposes ``d[n] + 5`` in every slot (p = 0: unused when all rows are greedy)."""

    vocab_size: int
    pad_id: int = 0

    def start(self, params, encoder_input_tokens, cache_length):
        return None, jnp.zeros((encoder_input_tokens.shape[0],), jnp.int32)

    def propose(self, params, context, carry, sequences, positions, keys, sampling, gamma):
        b = positions.shape[0]
        last = decoder_input_at(sequences, positions, self.pad_id)
        tokens = jnp.broadcast_to((last[:, None] + 5) % self.vocab_size, (b, gamma)).astype(jnp.int32)
        return Proposal(
            tokens, jnp.zeros((b, gamma, self.vocab_size), jnp.float32), jnp.full((b,), gamma, jnp.int32)
        ), carry


@dataclasses.dataclass(frozen=True)
class RejectingTarget:
    """A stand-in target (a ``DecodingModel``): logits one-hot at ``token + 7`` (never EOS), so every draft is
    rejected and rows end at ``max_decode_length``. With params ``{"weights": array}`` each call also reads the
    whole array (a sum scaled by the input, so it cannot be hoisted out of the loop)."""

    vocab_size: int
    pad_id: int = 0

    def encode(self, params, encoder_input_tokens):
        return jnp.zeros((encoder_input_tokens.shape[0],), jnp.float32)

    def init_cache(self, batch, length):
        return jnp.zeros((batch, 1), jnp.float32)

    def decode(self, params, encoded, tokens, cache, positions):
        nxt = (tokens + 7) % self.vocab_size
        nxt = jnp.where(nxt == 1, 2, nxt)
        logits = jax.nn.one_hot(nxt, self.vocab_size, dtype=jnp.float32) * 10.0
        if params:
            scale = (1 + tokens[0, 0] % 3).astype(jnp.float32)
            logits = logits + (jnp.sum(params["weights"].astype(jnp.float32) * scale) > 1e30).astype(jnp.float32)
        return logits, cache


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gamma", type=int, default=5, help="γ (default: 5)")
    parser.add_argument("--num-inputs", type=int, default=12, help="Multi30k test lines (default: 12)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes; each line keeps its best (default: 3)")
    parser.add_argument(
        "--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="the target's dtype (default: bfloat16)"
    )
    parser.add_argument(
        "--draft-dtype", default="float32", choices=["float32", "bfloat16"], help="the draft's dtype (default: float32)"
    )
    parser.add_argument(
        "--flush-mb",
        type=float,
        default=None,
        help="MB the cold stand-in target reads per call (default: the target's decoder weights, what one of its calls reads)",
    )
    args = parser.parse_args(argv)

    target, draft, tokenizer = specjax.load_default_pair(size="small", dtype=args.dtype, draft_dtype=args.draft_dtype)
    v = target.config.vocab_size
    weight_bytes = model_costs(target)["step_weight_bytes"]  # what one decoder call of the target reads
    flush_bytes = int(args.flush_mb * 1e6) if args.flush_mb else weight_bytes
    flush = {"weights": jnp.ones((flush_bytes // 2,), jnp.bfloat16)}
    ids = encode_inputs(tokenizer, read_lines(MULTI30K_TEST, args.num_inputs), "", 64)
    lines = [np.array([row + [0] * (64 - len(row))], np.int32) for row in ids]
    g, T = args.gamma, 64
    stand_in, no_draft = (RejectingTarget(v), {}), ConstantDraft(v)

    def spec(t, d):
        return lambda x: specjax.speculative_sample(t, d, x, gamma=g, max_decode_length=T, temperature=0.0)

    variants = {
        "real": spec(target, draft),
        "no draft": spec(target, no_draft),
        "no target": spec(stand_in, draft),
        "no target, cold": spec((RejectingTarget(v), flush), draft),
        "no models": spec(stand_in, no_draft),
        "no models, cold": spec((RejectingTarget(v), flush), no_draft),
    }
    for fn in variants.values():  # compile
        jax.block_until_ready(fn(lines[0]))
    best = {k: np.full(len(lines), np.inf) for k in variants}
    iters = {k: np.zeros(len(lines)) for k in variants}
    for _ in range(args.repeats):
        for j, x in enumerate(lines):
            for k, fn in variants.items():
                t0 = time.perf_counter()
                result = jax.block_until_ready(fn(x))
                best[k][j] = min(best[k][j], (time.perf_counter() - t0) * 1e3)
                iters[k][j] = int(np.asarray(result.num_target_calls).sum())
    per = {k: best[k].sum() / iters[k].sum() for k in variants}
    print(
        f"jax {jax.__version__}, small pair ({args.dtype} target, {args.draft_dtype} draft), γ {g}, batch 1, "
        f"temperature 0, {len(lines)} lines, best of {args.repeats}; cold stand-in reads "
        f"{flush_bytes / 1e6:.1f} MB a call"
    )
    print(f"{'variant':18} {'iterations':>10} {'ms / iteration':>15}")
    for k in variants:
        print(f"{k:18} {int(iters[k].sum()):10d} {per[k]:15.3f}")
    warm = per["no target"] - per["no models"]
    cold = per["no target, cold"] - per["no models, cold"]
    window = per["no draft"]
    print(
        f"draft, γ steps, weights warm: {warm:.3f} ms ({warm / g:.3f} a step); weights cold: {cold:.3f} ms "
        f"(+{cold - warm:.3f} ms an iteration)"
    )
    print(
        f"target window + loop (no draft): {window:.3f} ms; real iteration {per['real']:.3f} ms = window + loop "
        f"+ cold draft + {per['real'] - window - cold:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
