"""Window invariance: greedy speculative output against the target alone, line by line, and the speed of both.

For each line (batch 1, the first ``--lines`` of newstest2014 en, greedy, ``--max-decode-length`` tokens) it runs
``temperature_sample`` (the target alone) and ``speculative_sample`` with the model draft, a prompt-lookup draft,
the model draft with a confidence stop and block verification, and counts the lines whose output differs. It
then times the target alone and the model draft (γ ``--gamma``) over ``--time-lines`` lines, alternating.

    python benchmarks/window_invariance.py --dtype auto --lines 1000 \
        > benchmarks/results/window_invariance/2026-12-07_amd-epyc-zen4-avx512bf16.txt

Run it from two checkouts (``PYTHONPATH=<checkout>``) in turns to compare a change's speed side by side.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np

import specjax
from specjax import hardware
from specjax.decoding import PromptLookupDraft, speculative_sample, temperature_sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--time-lines", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--max-decode-length", type=int, default=64)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"))
    ap.add_argument("--skip-identity", action="store_true")
    args = ap.parse_args()
    info = hardware.cpu_info()
    target, draft, tok = specjax.load_default_pair(dtype=args.dtype)
    print(f"CPU: {info.model}; flags: {' '.join(sorted(f for f in info.flags if 'avx512' in f or 'amx' in f))}")
    print(f"jax {jax.__version__}; target {target.config.dtype}, draft {draft.config.dtype}; batch 1, greedy")
    lines = (Path(args.data) / "wmt" / "newstest2014.en").read_text().splitlines()
    T = args.max_decode_length

    def pad(ids, width=None):
        width = width or max(16, 1 << (len(ids) - 1).bit_length())
        return np.asarray([ids + [0] * (width - len(ids))], np.int32)

    kinds = {
        "model draft": dict(draft=draft),
        "prompt lookup": dict(draft=PromptLookupDraft()),
        "confidence stop 0.3": dict(draft=draft, draft_confidence_threshold=0.3),
        "block verification": dict(draft=draft, verification="block"),
    }
    if not args.skip_identity:
        differ = dict.fromkeys(kinds, 0)
        examples = {}
        for i, line in enumerate(lines[: args.lines]):
            ids = tok.encode(line)[:127]
            x = pad(ids)
            base = temperature_sample(target, x, rng=0, max_decode_length=T, temperature=0.0)
            for name, kw in kinds.items():
                kw = dict(kw)
                d = kw.pop("draft")
                spec = speculative_sample(
                    target, d, x, rng=0, gamma=args.gamma, max_decode_length=T, temperature=0.0, **kw
                )
                same = np.array_equal(spec.sequences, base.sequences) and np.array_equal(spec.lengths, base.lengths)
                if not same:
                    differ[name] += 1
                    examples.setdefault(name, i)
        n = min(args.lines, len(lines))
        for name in kinds:
            where = f" (first at line {examples[name]})" if name in examples else ""
            print(f"greedy identity, {name:22s}: {n - differ[name]} of {n} lines identical{where}")

    timed = [pad(tok.encode(l)[:63], 64) for l in lines[: args.time_lines]]
    runs = {
        "temperature_sample": lambda x: temperature_sample(target, x, rng=0, max_decode_length=T, temperature=0.0),
        f"speculative_sample gamma {args.gamma}": lambda x: speculative_sample(
            target, draft, x, rng=0, gamma=args.gamma, max_decode_length=T, temperature=0.0
        ),
    }
    for f in runs.values():
        jax.block_until_ready(f(timed[0]).sequences)
    best = dict.fromkeys(runs, float("inf"))
    tokens = dict.fromkeys(runs, 0)
    for _ in range(args.rounds):
        for name, f in runs.items():
            t0, n = time.perf_counter(), 0
            for x in timed:
                out = f(x)
                n += int(np.asarray(out.lengths).sum())
            best[name] = min(best[name], time.perf_counter() - t0)
            tokens[name] = n
    for name in runs:
        print(f"{name:34s} {tokens[name] / best[name]:7.1f} tokens/s (best of {args.rounds}, {len(timed)} lines)")


if __name__ == "__main__":
    main()
