"""Cost of one T5 decode step (k = 1) and of one (gamma+1)-token window, inside a compiled loop.

For the shipped target and draft (``specjax.load_default_pair()``) at batch 1 and 32, times a
``lax.fori_loop`` of ``--steps`` calls of ``t5.decode`` (what the decode loops run), prints milliseconds per
call and the ratio window / step. With ``--old PATH`` (a copy of an earlier ``specjax/models/t5.py``) both
implementations are compiled in the same process and timed alternately, repeated, and the ratio new / old
is printed: the only fair comparison on a shared machine (notes/COMMON.md).

With ``--profile DIR`` every program is also traced once with ``jax.profiler`` (on CPU the trace records
each XLA thunk) and the thunks are summed by name per call: the ten costliest per program are printed.

    python benchmarks/step_cost.py --old /tmp/t5_old.py --repeats 5
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib.util
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax.models import t5 as t5_new

CACHE_LEN = 72  # slots: a max_decode_length of 64 plus room for a window
MAX_POS = 64  # positions cycle in [0, MAX_POS)
ENC_LEN = 32  # encoder tokens per row


def load_impl(path: str):
    """Imports a t5.py copy from ``path`` as a module (it must import only specjax's public modules)."""
    spec = importlib.util.spec_from_file_location("t5_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["t5_old"] = module  # flax dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def make_loop(impl, config, k: int, n: int):
    """A jitted ``fori_loop`` of ``n`` decode calls of ``k`` tokens at per-row positions that move."""

    @jax.jit
    def run(params, encoded, cache):
        b = jax.tree_util.tree_leaves(encoded)[0].shape[0]
        rows = jnp.arange(b, dtype=jnp.int32)

        def body(i, carry):
            cache, acc = carry
            # The tokens depend on the previous logits, so nothing can be hoisted out of the loop.
            tokens = jnp.full((b, k), 3, jnp.int32) + (acc[:, None] > 1e30)
            positions = (i * k + 3 * rows) % MAX_POS
            logits, cache = impl.decode(config, params, encoded, tokens, cache, positions)
            return cache, acc + logits[:, -1, 0]

        return jax.lax.fori_loop(0, n, body, (cache, jnp.zeros((b,), jnp.float32)))[1]

    return run


_NOT_THUNKS = ("ThunkExecutor", "ThreadpoolListener", "end: ", "$", "Slinky", "while", "PjRt", "Pjit")


def thunk_table(trace_dir: Path, calls: int, top: int = 10) -> list[tuple[str, float, int]]:
    """(thunk name, ms per call, count per call) summed over the newest trace under ``trace_dir``.

    Thunk events sit on the XLA:CPU thread-pool lines of the ``/host:CPU`` plane; times are summed over
    threads (CPU time, not wall time)."""
    files = sorted(trace_dir.rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    data = jax.profiler.ProfileData.from_file(str(files[-1]))
    total, count = collections.Counter(), collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLA"):  # the XLA:CPU threads that run the thunks
                continue
            for ev in line.events:
                if ev.name.startswith(_NOT_THUNKS):
                    continue
                total[ev.name] += ev.duration_ns
                count[ev.name] += 1
    rows = [(name, ns / 1e6 / calls, count[name] / calls) for name, ns in total.most_common(top)]
    rows.append(("(all thunks)", sum(total.values()) / 1e6 / calls, sum(count.values()) / calls))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="path of an older t5.py to compare against")
    parser.add_argument("--steps", type=int, default=200, help="decode calls per timed loop")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--models", nargs="+", default=["target", "draft"])
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="also time the new code compiled with these XLA options (e.g. "
        "xla_cpu_multi_thread_eigen=false, or several: A=1,B=2), side by side; repeatable",
    )
    parser.add_argument("--profile", help="folder for jax.profiler traces (one per program)")
    parser.add_argument("--size", default="mini", choices=["mini", "small"], help="which shipped pair (default: mini)")
    args = parser.parse_args(argv)

    target, draft, _ = specjax.load_default_pair(size=args.size)
    models = {"target": target, "draft": draft}
    impls = {"new": (t5_new, {})}
    if args.old:
        impls["old"] = (load_impl(args.old), {})
    for opt in args.option:
        options = {}
        for item in opt.split(","):  # NAME=VALUE[,NAME=VALUE...]: one variant compiled with all of them
            name, value = item.split("=", 1)
            options[name] = {"true": True, "false": False}.get(value.lower(), value)
        impls[opt] = (t5_new, options)
    ks = (1, args.gamma + 1)
    rng = np.random.default_rng(0)
    programs = {}  # (model, batch, k, impl) -> (fn, args)
    for name in args.models:
        model = models[name]
        for b in args.batch:
            enc = rng.integers(3, model.config.vocab_size, size=(b, ENC_LEN)).astype(np.int32)
            enc[::2, ENC_LEN // 2 :] = 0  # padding in every other row
            for iname, (impl, options) in impls.items():
                encoded = jax.jit(functools.partial(impl.encode, model.config))(model.params, enc)
                cache = impl.init_cache(model.config, b, CACHE_LEN)
                for k in ks:
                    fn = make_loop(impl, model.config, k, args.steps)
                    fn = fn.lower(model.params, encoded, cache).compile(compiler_options=options or None)
                    jax.block_until_ready(fn(model.params, encoded, cache))
                    programs[(name, b, k, iname)] = (fn, (model.params, encoded, cache))
    times = collections.defaultdict(list)
    for _ in range(args.repeats):
        for key, (fn, fargs) in programs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*fargs))
            times[key].append((time.perf_counter() - t0) * 1e3 / args.steps)

    ms = {key: min(v) for key, v in times.items()}  # best of: the least disturbed by other jobs
    print(
        f"jax {jax.__version__}; ms per decode call (best of {args.repeats} loops of {args.steps} calls); "
        f"window = {args.gamma + 1} tokens; XLA_FLAGS={__import__('os').environ.get('XLA_FLAGS', '')!r}"
    )
    header = f"{'model':7} {'batch':>5} {'impl':4} {'step ms':>8} {'window ms':>10} {'window/step':>11}"
    print(header)
    for name in args.models:
        for b in args.batch:
            for iname in impls:
                s, w = ms[(name, b, 1, iname)], ms[(name, b, ks[1], iname)]
                print(f"{name:7} {b:5d} {iname:4} {s:8.3f} {w:10.3f} {w / s:11.2f}")
            for iname in impls:
                if iname == "new":
                    continue
                s = ms[(name, b, 1, "new")] / ms[(name, b, 1, iname)]
                w = ms[(name, b, ks[1], "new")] / ms[(name, b, ks[1], iname)]
                print(f"{name:7} {b:5d} new / {iname}: step {s:.2f}, window {w:.2f}")

    if args.profile:
        root = Path(args.profile)
        for key, (fn, fargs) in programs.items():
            folder = root / "_".join(map(str, key))
            with jax.profiler.trace(str(folder)):
                jax.block_until_ready(fn(*fargs))
            print(f"\n{key}: costliest thunks (ms per call, count per call)")
            for tname, t, c in thunk_table(folder, args.steps):
                print(f"  {t:8.4f} {c:6.1f}  {tname}")


if __name__ == "__main__":
    sys.exit(main())
