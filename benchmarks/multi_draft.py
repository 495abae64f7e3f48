"""Multi-draft speculative sampling on the shipped small pair: tokens per target call and wall-clock tokens/s for
``num_drafts`` k = 1, 2, 4 at γ 3 and 5, temperatures 0 and 1, on newstest2014 (English → German).

Usage (from the repository root, data in ../shared/data):
  python benchmarks/multi_draft.py --num-lines 200 --cpu-name "2-core AMD EPYC Zen 4, AVX-512 + AVX512_BF16, shared" \
      --out benchmarks/results/multi_draft/2026-12-07_amd-epyc-zen4-avx512bf16.md

Greedy identity (float32 pair, where a window and a one-token step round alike):
  python benchmarks/multi_draft.py --greedy-identity 1000 --cpu-name "..." \
      --out benchmarks/results/multi_draft/2026-12-07_greedy_identity.md
decodes the first 1000 lines with the target alone at temperature 0 and with k = 2 and 4 (γ 3, token rule) and
counts the rows equal token for token.

Cited by docs/architecture.md (the multi-draft step) and CHANGELOG.md. For each (γ, temperature, k) the first
``--num-lines`` lines of newstest2014.en (truncated to 96 tokens) are decoded in batches of ``--batch-size``
(sorted by length, so a batch's rows have similar lengths) with ``speculative_sample(..., num_drafts=k)``; every
k's program is compiled before timing, and each batch is decoded with every k back to back, so a busy moment of
a shared machine slows them alike. Reported: tokens per target
call (Σ lengths / Σ target calls: a property of the models and the rule, not of the machine), its ratio to k = 1
at the same γ and temperature, the share of iterations that kept a branch other than the draft's first choice,
the paper's α at the branch point's first candidate, and tokens/s (wall clock, this machine). At temperature 0
the rows equal to k = 1's output token for token are counted (both are target-greedy: a branch window, a chain
window and a one-token step give the same logits bit for bit, ``tests/test_window_invariance.py``).
"""

import argparse
import pathlib
import platform
import time

import jax
import numpy as np

import specjax
from specjax import bench


def run(target, draft, batches, gamma, temperature, ks, max_len):
    """{k: (tokens per target call, later-branch share, alpha, tokens/s, sequences per batch)}.

    Every k's program is compiled first; then each batch is decoded with every k back to back (the same seed), so
    a busy moment of the shared machine slows every k alike."""
    kwargs = dict(gamma=gamma, max_decode_length=max_len, temperature=temperature)
    for k in ks:  # compile
        jax.block_until_ready(specjax.speculative_sample(target, draft, batches[0], rng=0, num_drafts=k, **kwargs))
    stats = {k: dict(tokens=0, calls=0, later=0, beta=0.0, verified=0.0, seconds=0.0, outputs=[]) for k in ks}
    for j, x in enumerate(batches):
        for k in ks:
            start = time.perf_counter()
            out = specjax.speculative_sample(target, draft, x, rng=jax.random.PRNGKey(j), num_drafts=k, **kwargs)
            out = jax.device_get(out)
            st = stats[k]
            st["seconds"] += time.perf_counter() - start
            st["tokens"] += int(np.sum(out.lengths))
            st["calls"] += int(np.sum(out.num_target_calls))
            st["later"] += int(np.sum(out.accepted_per_branch[:, 1:]))
            st["beta"] += float(np.sum(out.beta_sum))
            st["verified"] += float(np.sum(out.num_verified))
            st["outputs"].append(np.asarray(out.sequences))
    return {
        k: (
            st["tokens"] / st["calls"],
            st["later"] / st["calls"],
            st["beta"] / st["verified"],
            st["tokens"] / st["seconds"],
            st["outputs"],
        )
        for k, st in stats.items()
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-lines", type=int, default=200, help="newstest2014 lines (default: 200)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per call (default: 8)")
    p.add_argument("--gammas", type=int, nargs="+", default=[3, 5])
    p.add_argument("--drafts", type=int, nargs="+", default=[1, 2, 4], help="num_drafts values (default: 1 2 4)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--max-decode-length", type=int, default=128)
    p.add_argument("--cpu-name", required=True, help="the machine, in words (model, vector features, shared?)")
    p.add_argument("--out", required=True, help="markdown file to write")
    p.add_argument("--greedy-identity", type=int, default=0, help="only check greedy identity on this many lines")
    a = p.parse_args()
    if a.greedy_identity:
        return greedy_identity(a)

    target, draft, tok = specjax.load_default_pair(size="small")
    lines = pathlib.Path("../shared/data/wmt/newstest2014.en").read_text(encoding="utf-8").splitlines()[: a.num_lines]
    encoded = sorted((tok.encode(s)[:96] for s in lines), key=len)
    batches = bench.pad_batches(encoded, batch_size=a.batch_size)
    rows = []
    for gamma in a.gammas:
        for temperature in a.temperatures:
            results = run(target, draft, batches, gamma, temperature, a.drafts, a.max_decode_length)
            base_tpc, base_out = None, None
            for k in a.drafts:
                tpc, later, alpha, tps, outs = results[k]
                same = ""
                if temperature == 0:
                    if base_out is None:
                        base_out = outs
                    equal = sum(int(np.array_equal(r, s)) for x, y in zip(outs, base_out) for r, s in zip(x, y))
                    same = f"{equal}/{sum(len(x) for x in outs)}"
                base_tpc = tpc if base_tpc is None else base_tpc
                rows.append((gamma, temperature, k, tpc, tpc / base_tpc, later, alpha, tps, same))
                print(rows[-1], flush=True)

    text = [
        "# Multi-draft speculative sampling: tokens per target call and tokens/s, small pair, newstest2014",
        "",
        f"Machine: {a.cpu_name} ({platform.machine()}, jax {jax.__version__}, backend {jax.default_backend()}).",
        f"Pair: `specjax.load_default_pair(size='small')` (target 46.0M, distilled draft 4.28M parameters; dtypes "
        f"target {target.config.dtype}, draft {draft.config.dtype}). Data: the first {a.num_lines} lines of "
        f"newstest2014.en (inputs cut at 96 tokens), batch {a.batch_size} sorted by length, "
        f"max_decode_length {a.max_decode_length}, token verification, seeds 0..{len(batches) - 1} per batch.",
        "Command: `python benchmarks/multi_draft.py " + " ".join(_argv()) + "`",
        "",
        "| γ | temperature | k | tokens / target call | × k = 1 | later branch kept | α (first candidate) "
        "| tokens/s (wall) | rows equal to k = 1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for gamma, temperature, k, tpc, ratio, later, alpha, tps, same in rows:
        text.append(
            f"| {gamma} | {temperature:g} | {k} | {tpc:.3f} | {ratio:.3f} | {later:.3f} | {alpha:.3f} | {tps:.1f} "
            f"| {same or '—'} |"
        )
    text += [
        "",
        "Tokens per target call do not depend on the machine; tokens/s do, and the machine was shared with other "
        "jobs (several runs at once on its 2 cores): each batch ran with every k back to back, so the k compare within "
        "a row group, but the absolute figures are this loaded machine's.",
        "",
    ]
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text), encoding="utf-8")
    print("wrote", out)


def greedy_identity(a):
    """Rows of k = 2 and 4 (γ 3) equal to the target alone at temperature 0, float32 small pair."""
    target, draft, tok = specjax.load_default_pair(size="small", dtype="float32")
    path = pathlib.Path("../shared/data/wmt/newstest2014.en")
    lines = path.read_text(encoding="utf-8").splitlines()[: a.greedy_identity]
    batches = bench.pad_batches(sorted((tok.encode(s)[:96] for s in lines), key=len), batch_size=16)
    rows = len(lines)
    equal = {2: 0, 4: 0}
    for x in batches:
        n = min(len(x), rows)
        rows -= n
        base = np.asarray(
            specjax.temperature_sample(
                target, x, rng=0, max_decode_length=a.max_decode_length, temperature=0.0
            ).sequences
        )
        for k in equal:
            out = specjax.speculative_sample(
                target, draft, x, rng=0, gamma=3, max_decode_length=a.max_decode_length, temperature=0.0, num_drafts=k
            )
            equal[k] += int(np.all(np.asarray(out.sequences)[:n] == base[:n], axis=1).sum())
        print(equal, flush=True)
    text = [
        "# Multi-draft greedy identity, small pair in float32, newstest2014",
        "",
        f"Machine: {a.cpu_name}. The first {a.greedy_identity} lines of newstest2014.en (cut at 96 tokens), batch 16 "
        f"sorted by length, max_decode_length {a.max_decode_length}, γ 3, token rule, temperature 0.",
        "Command: `python benchmarks/multi_draft.py " + " ".join(_argv()) + "`",
        "",
        "| num_drafts | rows equal to the target alone, token for token |",
        "|---|---|",
    ]
    text += [f"| {k} | {v} / {a.greedy_identity} |" for k, v in equal.items()]
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text) + "\n", encoding="utf-8")
    print("wrote", out)


def _argv():
    import sys

    return [f'"{x}"' if " " in x else x for x in sys.argv[1:]]


if __name__ == "__main__":
    main()
