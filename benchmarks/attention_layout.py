"""Micro-benchmark: the attention's two dots with the queries as stored ([b, t, n, h]) or moved heads-first.

``Projections.attend`` (``specjax/models/t5.py``) moves the queries heads-first ([b, n, t, h]) before its dots
so every operand has its batch dims (b, n) leading; before, the einsums read [b, t, n, h] queries directly and
XLA:CPU transposed around them. Six attention blocks (the small target's decoder depth) run 100 times in one
jitted ``fori_loop`` each way, in this one process, alternately (best of 3). Prints microseconds per
attention block and whether the outputs are bit-identical. Nothing is asserted.

    python benchmarks/attention_layout.py            # the shapes of the small pair's decode loops

Cited by docs/benchmarks.md ("CPU notes": queries heads-first). Output, as committed:
``python benchmarks/attention_layout.py > benchmarks/results/cpu_kernels/YYYY-MM-DD_attention_layout.txt``.
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

CASES = [  # (label, t query rows, query dtype, keys [b,n,h,s] ("hs") or [b,n,s,h] ("sh"), heads, head dim)
    ("target window (γ 5), cross-attention", 6, "bfloat16", "hs", 8, 64),
    ("target window (γ 5), self-attention", 6, "bfloat16", "sh", 8, 64),
    ("float32 target step, cross-attention", 1, "float32", "hs", 8, 64),
    ("float32 target step, self-attention", 1, "float32", "sh", 8, 64),
    ("draft step, cross-attention", 1, "float32", "hs", 4, 32),
    ("draft step, self-attention", 1, "float32", "sh", 4, 32),
]


def case(t, qdt, keys, n, h, s=70, layers=6, loops=100):
    rng = np.random.default_rng(0)
    qdt = jnp.dtype(qdt)
    hs = keys == "hs"
    q = jnp.asarray(rng.standard_normal((1, t, n, h)), qdt)
    ks = [jnp.asarray(rng.standard_normal((1, n, h, s) if hs else (1, n, s, h)), jnp.float32) for _ in range(layers)]
    vs = [jnp.asarray(rng.standard_normal((1, n, s, h)), jnp.float32) for _ in range(layers)]

    def stored(q, k, v):
        sc = jnp.einsum("btnh,bnhs->bnts" if hs else "btnh,bnsh->bnts", q, k, preferred_element_type=jnp.float32)
        w = jax.nn.softmax(sc, axis=-1).astype(qdt)
        return jnp.einsum("bnts,bnsh->btnh", w, v).astype(qdt)

    def heads_first(q, k, v):
        qh = jnp.swapaxes(q, 1, 2)
        sc = jnp.einsum("bnth,bnhs->bnts" if hs else "bnth,bnsh->bnts", qh, k, preferred_element_type=jnp.float32)
        w = jax.nn.softmax(sc, axis=-1).astype(qdt)
        return jnp.swapaxes(jnp.einsum("bnts,bnsh->bnth", w, v).astype(qdt), 1, 2)

    def looped(att):
        def body(q, ks, vs):
            def step(i, q):
                for k, v in zip(ks, vs):
                    q = att(q, k, v)
                return q

            return jax.lax.fori_loop(0, loops, step, q)

        return jax.jit(body)

    fns = {"stored": looped(stored), "heads-first": looped(heads_first)}
    same = bool(jnp.all(fns["stored"](q, ks, vs) == fns["heads-first"](q, ks, vs)))
    best = {}
    for _ in range(3):
        for name, f in fns.items():
            f(q, ks, vs).block_until_ready()
            t0 = time.perf_counter()
            for _ in range(3):
                f(q, ks, vs).block_until_ready()
            best[name] = min(best.get(name, np.inf), (time.perf_counter() - t0) / 3 / loops / layers * 1e6)
    return best, same


def main() -> int:
    print(f"jax {jax.__version__}; µs per attention block (both dots and the softmax), best of 3")
    print(f"{'shapes':42} {'stored':>8} {'heads-first':>12} {'ratio':>7}  bit-identical")
    for label, *args in CASES:
        best, same = case(*args)
        print(
            f"{label:42} {best['stored']:8.1f} {best['heads-first']:12.1f} "
            f"{best['stored'] / best['heads-first']:6.2f}x  {same}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
