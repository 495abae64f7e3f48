"""What a speculative iteration's model calls cost together, against what they cost apart.

Times jitted ``fori_loop``s of bare ``t5.decode`` calls of the shipped pair at batch 1 (no sampling, no
control flow), compiled with the decode loops' CPU options (``specjax.decoding.xla_cpu``):
- ``window``: the target's (γ + 1)-token verification window alone;
- ``draft``: the draft's calls of one iteration alone: its 2-token catch-up window and γ − 1 one-token steps
  (``ModelDraft.propose``), and the same with γ one-token steps;
- ``window + draft``: both in the same loop body, as the speculative loop runs them.
``window + draft`` minus the sum of the two alone is what running them together costs (on a CPU: the target
streams its weights through the last-level cache and evicts the draft's, and the other way round); the real
loop's iteration (``benchmarks/loop_cost.py``) minus ``window + draft`` is the loop's own machinery (sampling,
verification, commit, control flow). ``--bf16-draft`` adds the draft run in bfloat16 (weights and activations).
Variants alternate, repeated; medians and minima in milliseconds per loop iteration.

    python benchmarks/loop_composition.py --size small --gamma 3
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.decoding.xla_cpu import SMALL_DOT_OPTIONS
from specjax.models import t5
from specjax.sampling import argmax

STEPS = 100  # loop iterations per timed call


def make(target_cfg, draft_cfg, with_window: bool, draft_widths: tuple[int, ...], gamma: int, cache_len: int):
    """A jitted loop whose body runs the target window (optional) and the draft calls of ``draft_widths``."""

    def run(tp, dp, tenc, denc):
        tcache = t5.init_cache(target_cfg, 1, cache_len)
        dcache = t5.init_cache(draft_cfg, 1, cache_len)

        def body(i, carry):
            tcache, dcache, acc = carry
            pos = jnp.full((1,), i % (cache_len - 2 * gamma - 2), jnp.int32)
            dep = (acc > 1e30).astype(jnp.int32)  # a data dependency: nothing is hoisted out of the loop
            # acc sums the argmax of every logit row, as the loops' greedy draws read them (a single logit would let
            # XLA compute one column of the logits dot)
            if with_window:
                logits, tcache = t5.decode(
                    target_cfg, tp, tenc, jnp.full((1, gamma + 1), 5, jnp.int32) + dep, tcache, pos
                )
                acc = acc + argmax(logits).sum().astype(jnp.float32)
            for j, k in enumerate(draft_widths):
                logits, dcache = t5.decode(draft_cfg, dp, denc, jnp.full((1, k), 5, jnp.int32) + dep, dcache, pos + j)
                acc = acc + argmax(logits).sum().astype(jnp.float32)
            return tcache, dcache, acc

        return jax.lax.fori_loop(0, STEPS, body, (tcache, dcache, jnp.float32(0)))[2]

    return jax.jit(run, compiler_options=dict(SMALL_DOT_OPTIONS))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", choices=["mini", "small"], help="shipped pair (default: small)")
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bf16-draft", action="store_true", help="also time the draft in bfloat16")
    args = parser.parse_args()
    g = args.gamma
    target, draft, tok = specjax.load_default_pair(size=args.size)
    x = np.zeros((1, 64), np.int32)
    ids = tok.encode("A man in a blue shirt is riding a bicycle down the street.")
    x[0, : len(ids)] = ids
    drafts = {"f32": draft}
    if args.bf16_draft:
        drafts["bf16"] = draft.astype("bfloat16")
    tenc = jax.jit(lambda p, x: t5.encode(target.config, p, x))(target.params, x)
    cache_len = 64 + g + 1
    catch_up = (2,) + (1,) * (g - 1)
    plain = (1,) * g
    variants = {}
    for kind, d in drafts.items():
        denc = jax.jit(lambda p, x, c=d.config: t5.encode(c, p, x))(d.params, x)
        args_ = (target.params, d.params, tenc, denc)
        for name, window, widths in [
            ("window", True, ()),
            ("draft 2+1x(g-1)", False, catch_up),
            ("draft 1xg", False, plain),
            ("window + draft 2+1x(g-1)", True, catch_up),
            ("window + draft 1xg", True, plain),
        ]:
            if kind != "f32" and name == "window":
                continue
            variants[f"{name} [{kind} draft]" if "draft" in name else name] = (
                make(target.config, d.config, window, widths, g, cache_len),
                args_,
            )
    for fn, a in variants.values():
        fn(*a).block_until_ready()
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for k, (fn, a) in variants.items():
            t0 = time.perf_counter()
            fn(*a).block_until_ready()
            times[k].append((time.perf_counter() - t0) / STEPS * 1e3)
    print(
        f"jax {jax.__version__}, {args.size} pair, batch 1, γ {g}; ms per loop iteration "
        f"(median, min of {args.repeats})"
    )
    for k, v in times.items():
        print(f"{k:38s} {np.median(v):7.3f} {min(v):7.3f}")
    med = {k: float(np.median(v)) for k, v in times.items()}
    for kind in drafts:
        for widths in ("2+1x(g-1)", "1xg"):
            both, alone = (
                med[f"window + draft {widths} [{kind} draft]"],
                med["window"] + med[f"draft {widths} [{kind} draft]"],
            )
            print(f"together − apart, {kind} draft {widths}: {both - alone:+.3f} ms")


if __name__ == "__main__":
    main()
