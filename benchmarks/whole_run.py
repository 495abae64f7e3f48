"""What a person measures: ``specjax generate`` and CTranslate2, each as a whole process from start to last line,
cold and warm, beside the in-loop tokens/s.

    python benchmarks/whole_run.py --lines 500 --out benchmarks/results/startup/RESULT.md

Rows (each a fresh process, timed from before its start to its exit; the same first ``--lines`` lines of
newstest2014 (en), greedy, at most ``--max-decode-length`` tokens, ``--batch`` slots):

- ``specjax generate`` cold: an empty cache directory (no stored programs, no XLA cache, no γ auto costs).
- ``specjax generate`` warm: the same command again on the same cache directory (every program loaded, nothing
  traced, lowered or compiled: ``specjax.decoding.stored``); ``--verbose``'s phase line gives import, load,
  programs, γ auto, decode and write, and the time from process start to the first decode step.
- CTranslate2 float32 and int8 (reference row): a process that loads the converted target
  (``specjax.bench.peers.to_ctranslate2``, converted before the timing), tokenizes with the pair's SentencePiece
  model, ``translate_batch`` over all lines (``max_batch_size`` ``--batch``, its own length sorting), detokenizes
  and writes the file; ``--ct2-threads`` intra threads.

In-loop tokens/s: specjax's from its phase line (output tokens / decode seconds), CTranslate2's from its
``translate_batch`` call alone. The machine and its vector features head the output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "..", "shared", "data", "wmt", "newstest2014.en")

_CT2_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import ctranslate2, sentencepiece
model_dir, spm, src, out, batch, threads, compute, max_len = sys.argv[1:9]
translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute, intra_threads=int(threads))
sp = sentencepiece.SentencePieceProcessor(model_file=spm)
lines = open(src, encoding="utf-8").read().splitlines()
tokens = [[f"<id{i}>" for i in sp.encode(line)] + ["<id1>"] for line in lines]
t1 = time.perf_counter()
res = translator.translate_batch(tokens, max_batch_size=int(batch), beam_size=1, max_decoding_length=int(max_len))
t2 = time.perf_counter()
ids = [[int(t[3:-1]) for t in r.hypotheses[0]] for r in res]
with open(out, "w", encoding="utf-8") as f:
    for row in ids:
        f.write(sp.decode([i for i in row if i != 1]) + "\n")
print(json.dumps({"load": t1 - t0, "loop": t2 - t1, "tokens": sum(len(r) for r in ids)}))
"""


def cpu_line() -> str:
    sys.path.insert(0, ROOT)
    from specjax.hardware import cpu_info

    info = cpu_info()
    vec = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni") if f in info.flags]
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return f"CPU: {info.model}, {info.cores} cores, {' '.join(vec)}; load average {' '.join(load)}"


def run_specjax(args, src: str, cache: str, out: str) -> dict:
    """One ``specjax generate`` process: wall seconds, and its phase line parsed."""
    if os.path.exists(out):
        os.remove(out)
    env = dict(os.environ, SPECJAX_CACHE_DIR=cache, PYTHONPATH=ROOT)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    cmd = [sys.executable, "-c", "import sys; from specjax.cli import main; sys.exit(main())", "generate"]
    cmd += ["--input", src, "--output", out, "--batch-size", str(args.batch), "--verbose"]
    cmd += ["--max-decode-length", str(args.max_decode_length), "--gamma", args.gamma, "--dtype", args.dtype]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"specjax generate failed:\n{proc.stderr[-3000:]}")
    phases = {}
    for line in proc.stderr.splitlines():
        if line.startswith("phases: "):
            for part in line[len("phases: ") :].split(", "):
                m = re.match(r"(.+) ([0-9.]+) s$", part)
                if m:
                    phases[m.group(1)] = float(m.group(2))
    tokens = re.search(r"tokens (\d+)", proc.stderr)
    return {"wall": wall, "phases": phases, "tokens": int(tokens.group(1)) if tokens else 0}


def run_ct2(args, model_dir: str, spm: str, src: str, out: str, compute: str) -> dict:
    cmd = [sys.executable, "-c", _CT2_CHILD, model_dir, spm, src, out, str(args.batch), str(args.ct2_threads)]
    cmd += [compute, str(args.max_decode_length)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"ctranslate2 failed:\n{proc.stderr[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall": wall, **got}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=500)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-decode-length", type=int, default=128)
    p.add_argument("--gamma", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--ct2-threads", type=int, default=2)
    p.add_argument("--warm-runs", type=int, default=2, help="warm specjax processes (the best is reported)")
    p.add_argument("--skip-ct2", action="store_true")
    p.add_argument("--out", help="also write the markdown table here")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="specjax-whole-run-")
    src = os.path.join(work, "input.en")
    with open(DATA, encoding="utf-8") as f:
        lines = f.read().splitlines()[: args.lines]
    with open(src, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    rows = []
    header = cpu_line()
    cache = os.path.join(work, "cache")
    cold = run_specjax(args, src, cache, os.path.join(work, "cold.de"))
    rows.append(("specjax generate, cold (empty cache)", cold))
    warm = min(
        (run_specjax(args, src, cache, os.path.join(work, f"warm{i}.de")) for i in range(args.warm_runs)),
        key=lambda r: r["wall"],
    )
    rows.append(("specjax generate, warm (same cache)", warm))
    if not args.skip_ct2:
        sys.path.insert(0, ROOT)
        import specjax
        from specjax.bench.peers import to_ctranslate2

        target, _, tok = specjax.load_default_pair(dtype="float32")
        model_dir = to_ctranslate2(target, os.path.join(work, "ct2model"))
        spm = getattr(tok, "model_file", None) or getattr(tok, "path", None)
        for compute in ("float32", "int8"):
            r = run_ct2(args, model_dir, str(spm), src, os.path.join(work, f"ct2_{compute}.de"), compute)
            rows.append((f"CTranslate2 {compute}, {args.ct2_threads} threads", r))
    md = [
        f"# Whole process: `specjax generate` and CTranslate2, {args.lines} newstest2014 lines",
        "",
        header,
        f"batch {args.batch}, greedy, at most {args.max_decode_length} tokens; gamma {args.gamma}, dtype {args.dtype}.",
        "",
        "| run | whole process (s) | start to first decode step (s) | in-loop tokens/s | phases |",
        "|---|---|---|---|---|",
    ]
    for name, r in rows:
        ph = r.get("phases")
        if ph is not None:
            decode = ph.get("decode")
            loop = r["tokens"] / decode if decode else float("nan")
            first = ph.get("process start to first decode step", float("nan"))
            detail = ", ".join(f"{k} {v:.1f}" for k, v in ph.items() if k != "process start to first decode step")
        else:
            loop, first, detail = r["tokens"] / r["loop"], r["load"], f"load {r['load']:.1f}, loop {r['loop']:.1f}"
        md.append(f"| {name} | {r['wall']:.1f} | {first:.1f} | {loop:.0f} | {detail} |")
    ct2 = [r for n, r in rows if n.startswith("CTranslate2 float32")]
    if ct2:
        md += ["", f"warm specjax whole process / CTranslate2 float32's: {ct2[0]['wall'] / warm['wall']:.2f}x speed"]
    text = "\n".join(md)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
