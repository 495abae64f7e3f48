"""``specjax generate --data-parallel`` / ``--mesh``: static batches over a device mesh (``specjax.parallel``).

Each batch of ``--batch-size`` lines (the last one padded with copies of its first row, with that row's key,
which are dropped) is padded to a power-of-2 length and decoded by one program over the mesh; line ``i`` samples
with ``fold_in(PRNGKey(seed), i)``, so the outputs equal the bulk path's (``specjax.bulk``) on one device.
"""

from __future__ import annotations

import sys
import time


def _bucket(n: int, cap: int) -> int:
    """The smallest power of 2 >= n (at least 8), capped at ``cap``."""
    size = 8
    while size < n:
        size *= 2
    return min(size, max(cap, n))


def run(args, lines: list, done: int, load) -> int:
    """Decodes ``lines[done:]`` in static batches over the mesh the flags ask for and appends them to --output;
    ``load(args)`` gives (target, draft, tokenizer). Returns 0; raises ValueError on bad input."""
    import jax
    import numpy as np
    from tqdm import tqdm

    from specjax import parallel
    from specjax.cli._lines import encode_lines
    from specjax.decoding import speculative_sample, temperature_sample

    parallel.maybe_initialize_distributed()  # before any device is touched; no-op on one process
    runner = parallel.decode_fn_from_flags(args.data_parallel, args.mesh)
    report = sys.stderr
    with runner.loading():  # --mesh: read weights into host memory, not onto one device
        target, draft, tokenizer = load(args)
    from specjax.cli import draft_source, speculative_kwargs

    spec_kwargs = speculative_kwargs(args)
    target, draft = runner.place(target, draft)  # draft None with --draft prompt-lookup
    draft = draft_source(args, draft)
    eos = tokenizer.eos_id
    encoded = encode_lines(tokenizer, lines[done:], args.prefix, args.max_input_length, args.truncate, first=done)

    seed_key = jax.random.PRNGKey(args.seed)
    common = dict(
        max_decode_length=args.max_decode_length,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        eos_id=eos,
        max_input_length=args.max_input_length,
    )
    stats = dict(
        tokens=0,
        spec_time=0.0,
        base_time=0.0,
        base_tokens=0,
        drafted=0,
        accepted=0,
        calls=0,
        dropped_ids=0,
        beta_sum=0.0,
        verified=0,
    )
    warm = set()
    from specjax.decoding import lower_speculative_sample, lower_temperature_sample

    def timed(fn, x, keys, key_shape, **kw):
        if key_shape not in warm:  # compile first (ahead of time, nothing decoded), untimed
            if runner.mode == "single":
                lower = lower_speculative_sample if key_shape[0] == "spec" else lower_temperature_sample
                models = (target, draft) if key_shape[0] == "spec" else (target,)
                extra = dict(gamma=args.gamma, **spec_kwargs) if key_shape[0] == "spec" else {}
                lower(*models, x, rng=keys, **extra, **common).compile()
            warm.add(key_shape)
        start = time.perf_counter()
        result = fn(x, keys, **kw)
        jax.block_until_ready(result)
        seconds = time.perf_counter() - start
        return jax.device_get(result), seconds

    def spec(x, keys, **kw):  # --gamma is an int >= 1 here (generate's checks)
        return runner(speculative_sample, target, draft, x, rng=keys, gamma=args.gamma, **spec_kwargs, **common)

    def base(x, keys, **kw):
        return runner(temperature_sample, target, x, rng=keys, **common)

    out = sys.stdout if args.output == "-" else open(args.output, "a", encoding="utf-8")
    bar = tqdm(total=len(lines), initial=done, unit="line", file=sys.stderr, desc="generate")
    try:
        bs = max(1, min(args.batch_size, len(encoded)))  # a short file is not padded to --batch-size rows
        for start in range(0, len(encoded), bs):
            rows = encoded[start : start + bs]
            width = _bucket(max(len(r) for r in rows), args.max_input_length)
            x = np.zeros((bs, width), np.int32)
            for j, ids in enumerate(rows):
                x[j, : len(ids)] = ids
            # Dummy rows (dropped below) copy the first row with its own key, so they finish with it: a
            # different filler would keep the shared loop running after every real row is done.
            x[len(rows) :] = x[0]
            line_ids = np.arange(done + start, done + start + bs)
            line_ids[len(rows) :] = line_ids[0]
            keys = jax.vmap(lambda i: jax.random.fold_in(seed_key, i))(line_ids)
            r, seconds = timed(spec, x, keys, ("spec", width))
            real = slice(0, len(rows))
            stats["spec_time"] += seconds
            stats["tokens"] += int(r.lengths[real].sum())
            stats["drafted"] += int(r.num_draft_tokens[real].sum())
            stats["accepted"] += int(r.num_accepted[real].sum())
            stats["calls"] += int(r.num_target_calls[real].sum())
            stats["beta_sum"] += float(r.beta_sum[real].sum())
            stats["verified"] += int(r.num_verified[real].sum())
            if args.compare_baseline:
                b, seconds = timed(base, x, keys, ("base", width))
                stats["base_time"] += seconds
                stats["base_tokens"] += int(b.lengths[real].sum())
            texts = []
            for seq, n in zip(r.sequences[real], r.lengths[real]):
                ids = [int(t) for t in seq[:n]]
                kept = [t for t in ids if t < tokenizer.vocab_size]
                stats["dropped_ids"] += len(ids) - len(kept)
                texts.append(tokenizer.decode(kept).replace("\n", " ").replace("\r", " "))
            out.write("".join(t + "\n" for t in texts))
            out.flush()
            bar.update(len(rows))
    finally:
        bar.close()
        if out is not sys.stdout:
            out.close()

    n_lines = len(encoded)
    alpha = stats["beta_sum"] / stats["verified"] if stats["verified"] else float("nan")
    fraction = stats["accepted"] / stats["drafted"] if stats["drafted"] else float("nan")
    per_call = stats["tokens"] / stats["calls"] if stats["calls"] else float("nan")
    tps = stats["tokens"] / stats["spec_time"] if stats["spec_time"] else float("nan")
    print(f"lines {n_lines}, tokens {stats['tokens']}, gamma {args.gamma}, temperature {args.temperature}", file=report)
    print(
        f"acceptance rate alpha {alpha:.3f} (the paper's, per token), accepted/drafted {fraction:.3f}, "
        f"tokens per target call {per_call:.2f}, speculative {tps:.1f} tokens/s (compilation excluded)",
        file=report,
    )
    if args.compare_baseline:
        base_tps = stats["base_tokens"] / stats["base_time"] if stats["base_time"] else float("nan")
        speedup = stats["base_time"] / stats["spec_time"] if stats["spec_time"] else float("nan")
        print(f"baseline {base_tps:.1f} tokens/s, speedup {speedup:.2f}x (wall time, same inputs)", file=report)
    if stats["dropped_ids"]:
        print(
            f"warning: {stats['dropped_ids']} generated ids beyond the tokenizer's vocabulary "
            f"({tokenizer.vocab_size}) were dropped from the text.",
            file=sys.stderr,
        )
    return 0
