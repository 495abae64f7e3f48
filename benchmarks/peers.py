"""specjax beside other engines and implementations, each run in its own process where time is measured.

    python benchmarks/peers.py families --output benchmarks/results/families/NAME.md   # every T5 family vs PyTorch
    python benchmarks/peers.py first-run --runs 2 > RESULT.md   # whole ``specjax demo`` processes, cold then warm cache
    python benchmarks/peers.py whole-run --lines 500 --out RESULT.md   # generate vs CTranslate2, whole processes

Speed against Hugging Face transformers and CTranslate2 is ``specjax bench --hf`` / ``--against ctranslate2``
(docs/benchmarks.md, "Peers"); this script holds the comparisons that need a process or a library of their own.
Each subcommand's ``--help`` gives its flags.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import torch
import transformers

import specjax
from specjax.bench.report import run_subcommands

# ------------------------------------------------------------------------------------------------------------
# families (formerly benchmarks/families_vs_pytorch.py)

_FAMILIES_DOC = """\
Every T5 family specjax reads, against transformers' PyTorch implementation: one table row per family.

For each family a tiny random model with that family's layout (``model_type``, ``feed_forward_proj``, tied or
untied head, shared or per-layer relative position tables, vocabulary size, special ids, head width) is
written by transformers' ``save_pretrained``, read with ``specjax.load_checkpoint``, and scored in float32 by
both on the same padded batch: the row gives the largest |Δlogits| over every decoder position (and the
largest |logit|, so the difference has a scale). A second column decodes greedily with speculative sampling
(a 1-decoder-layer draft of the same family, γ 3) and says whether the tokens equal the target's own greedy
decode (``specjax.temperature_sample``). Heads are tied or untied as each family's released checkpoints are.
Shapes are tiny (d_model 32) and the weights random: the table is about the architecture and parameter mapping,
not the released weights, which are too large to fetch here.

    python benchmarks/peers.py families \
        --output benchmarks/results/families/2026-12-06_logits_vs_pytorch.md

Cited by docs/models.md ("Families and sizes"). About 2 minutes of CPU time (10 minutes of wall time on a 2-core VM
shared with other jobs); needs torch and transformers.
"""


TINY = dict(
    vocab_size=128,
    d_model=32,
    d_kv=8,
    num_heads=4,
    d_ff=64,
    num_layers=2,
    num_decoder_layers=2,
    dropout_rate=0.0,
    relative_attention_num_buckets=16,
    relative_attention_max_distance=32,
)


CLASSES = {
    "t5": (transformers.T5Config, transformers.T5ForConditionalGeneration),
    "mt5": (transformers.MT5Config, transformers.MT5ForConditionalGeneration),
    "umt5": (transformers.UMT5Config, transformers.UMT5ForConditionalGeneration),
}


# (row label, who uses it, model_type, config fields): the issue's table, one layout per family.
FAMILIES = [
    ("T5 1.0", "the original T5", "t5", dict(feed_forward_proj="relu")),
    ("T5 1.1 / Flan-T5", "instruction-tuned T5", "t5", dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    ("mT5", "multilingual; mt5-xxl 13B", "mt5", dict(feed_forward_proj="gated-gelu")),
    (
        "umT5",
        "multilingual, per-layer position tables",
        "umt5",
        dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    ),
    ("UL2 / Flan-UL2", "20B, gated-silu", "t5", dict(feed_forward_proj="gated-silu")),  # tied, as released
    (
        "ByT5",
        "bytes, no SentencePiece",
        "t5",
        dict(vocab_size=384, num_layers=3, feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    ),
    (
        "MADLAD-400 MT",
        "translation into 400+ languages",
        "t5",
        dict(
            d_kv=16,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            pad_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=0,
        ),
    ),
]


def hf_model(model_type: str, seed: int, **fields):
    """A random transformers model of ``model_type`` with non-trivial layer norms and position tables."""
    config_cls, model_cls = CLASSES[model_type]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY, **fields})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5))
            elif "relative_attention_bias" in name:
                p.copy_(torch.randn_like(p))
    return model


def inputs(vocab: int, eos: int, seed: int = 0):
    """Encoder ids int32[4, 12] (real ids >= 3, EOS last, right-padded with 0) and decoder ids int32[4, 8]."""
    rs = np.random.RandomState(seed)
    enc = rs.randint(3, vocab, size=(4, 12)).astype(np.int32)
    for row, n in enumerate((12, 9, 5, 2)):
        enc[row, n - 1] = eos
        enc[row, n:] = 0
    dec = rs.randint(3, vocab, size=(4, 8)).astype(np.int32)
    dec[:, 0] = 0
    return enc, dec


def compare(label: str, model_type: str, fields: dict, seed: int, workdir: Path) -> dict:
    ref = hf_model(model_type, seed, **fields)
    ref.save_pretrained(workdir / f"target_{seed}")
    model = specjax.load_checkpoint(workdir / f"target_{seed}")
    hf_pad = fields.get("pad_token_id", 0)
    enc, dec = inputs(ref.config.vocab_size, ref.config.eos_token_id, seed)
    hf_enc = np.where(enc == 0, hf_pad, enc)
    with torch.no_grad():
        want = ref(
            input_ids=torch.tensor(hf_enc, dtype=torch.long),
            attention_mask=torch.tensor(enc != 0, dtype=torch.long),
            decoder_input_ids=torch.tensor(dec, dtype=torch.long),
        ).logits.numpy()
    got = np.asarray(model.logits(np.where(enc == 0, model.config.pad_id, enc), dec))
    draft_ref = hf_model(model_type, seed + 100, **{**fields, "num_decoder_layers": 1})
    draft_ref.save_pretrained(workdir / f"draft_{seed}")
    draft = specjax.load_checkpoint(workdir / f"draft_{seed}")
    x = np.where(enc == 0, model.config.pad_id, enc)
    kw = dict(rng=jax.random.PRNGKey(0), max_decode_length=16, temperature=0.0)
    spec = specjax.speculative_sample(model, draft, x, gamma=3, **kw)
    base = specjax.temperature_sample(model, x, **kw)
    cfg = model.config
    return dict(
        label=label,
        model_type=model_type,
        proj=ref.config.feed_forward_proj,
        layout=f"{cfg.family}, {'tied' if cfg.logits_via_embedding else 'untied'} head, "
        f"{'per-layer' if cfg.per_layer_relpos_bias else 'shared'} position tables, v={cfg.vocab_size}",
        max_diff=float(np.abs(got - want).max()),
        scale=float(np.abs(want).max()),
        greedy_equal=bool(np.array_equal(np.asarray(spec.sequences), np.asarray(base.sequences))),
        alpha=float(spec.acceptance_rate),
    )


def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def families(argv=None) -> int:
    p = argparse.ArgumentParser(description=_FAMILIES_DOC.splitlines()[0])
    p.add_argument("--output", help="markdown file to write (default: stdout)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed, (label, users, model_type, fields) in enumerate(FAMILIES):
            r = compare(label, model_type, fields, seed, Path(tmp))
            r["users"] = users
            rows.append(r)
            print(f"{label}: max |dlogits| {r['max_diff']:.1e}", file=sys.stderr)
    lines = [
        "# T5 families: specjax against transformers (PyTorch), float32",
        "",
        f"`python benchmarks/peers.py families` on {_cpu_name()} ({os.cpu_count()} cores, "
        f"{platform.system()}), jax {jax.__version__}, transformers {transformers.__version__}, "
        f"torch {torch.__version__}. Tiny random models (d_model 32, 4 heads, 2+2 layers; ByT5 3+2) written by "
        "transformers' `save_pretrained`, read by `specjax.load_checkpoint`; a batch of 4 padded rows, 8 decoder "
        "positions. Greedy: speculative sampling (γ 3, a 1-decoder-layer draft of the same family) against the "
        "target alone, 16 tokens.",
        "",
        "| model family (who uses it) | model_type, feed_forward_proj | specjax reads it as | today | greedy "
        "speculative = target greedy |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} ({r['users']}) | {r['model_type']}, {r['proj']} | {r['layout']} | loads; max "
            f"\\|Δlogits\\| {r['max_diff']:.1e} (largest \\|logit\\| {r['scale']:.1f}) | "
            f"{'yes' if r['greedy_equal'] else 'NO'} (α {r['alpha']:.2f}) |"
        )
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0 if all(r["max_diff"] < 1e-4 and r["greedy_equal"] for r in rows) else 1


# ------------------------------------------------------------------------------------------------------------
# first-run (formerly benchmarks/demo_first_run.py)

_FIRST_RUN_DOC = """\
A newcomer's first and second ``specjax demo``: wall time to the first translation and to the end, with an empty
cache directory and then with the one the first run filled (XLA's compiled programs, γ auto's measured costs).

    python benchmarks/peers.py first-run --runs 2 [--size small] [demo flags ...] > RESULT.md

Each run is ``python -m specjax demo --cache-dir DIR`` in its own process, started from the repository root; the
first translation is the first ``DE:`` line on stdout. Prints a Markdown table with the machine (CPU model, flags,
load average before each run) and the demo's own compile / first-pass / cost-measurement line.
"""


REPO = Path(__file__).resolve().parents[1]


def one_run(cache: str, extra: list[str]) -> dict:
    """Runs the demo once; returns wall seconds to the first translation and to the end, and its timing lines."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the command's default: under --cache-dir
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specjax", "demo", "--cache-dir", cache, *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    first, lines = None, []
    for line in proc.stdout:
        if first is None and line.startswith("DE:"):
            first = time.perf_counter() - t0
        lines.append(line.rstrip("\n"))
    status = proc.wait()
    total = time.perf_counter() - t0
    timing = [line for line in lines if line.startswith(("speedup", "not timed"))]
    return dict(status=status, first=first, total=total, load=load, timing=timing)


def first_run() -> None:
    parser = argparse.ArgumentParser(description=_FIRST_RUN_DOC.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args, extra = parser.parse_known_args()
    from specjax.hardware import cpu_info

    info = cpu_info()
    print(f"CPU: {info.describe()}; {sys.version.split()[0]}; demo flags: {' '.join(extra) or '(none)'}\n")
    print("| run | cache | load average before | first translation s | whole demo s | exit |")
    print("|---|---|---|---|---|---|")
    notes = []
    with tempfile.TemporaryDirectory(prefix="specjax-demo-cache-") as cache:
        for i in range(1, args.runs + 1):
            r = one_run(cache, extra)
            state = "empty" if i == 1 else "filled by run 1"
            first = f"{r['first']:.1f}" if r["first"] is not None else "-"
            print(f"| {i} | {state} | {r['load']:.1f} | {first} | {r['total']:.1f} | {r['status']} |")
            notes += [f"run {i}: {line}" for line in r["timing"]]
    print("\n" + "\n".join(f"- {n}" for n in notes))


# ------------------------------------------------------------------------------------------------------------
# whole-run (specjax generate and CTranslate2, each a whole process, cold and warm)

_WHOLE_RUN_DOC = """What a person measures: ``specjax generate`` and CTranslate2, each a whole process, start to end,
cold and warm, beside the in-loop tokens/s.

    python benchmarks/peers.py whole-run --lines 500 --out benchmarks/results/startup/RESULT.md

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

_WHOLE_RUN_DATA = os.path.join(str(REPO), "..", "shared", "data", "wmt", "newstest2014.en")

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


def _whole_cpu_line() -> str:
    from specjax.hardware import cpu_info

    info = cpu_info()
    vec = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni") if f in info.flags]
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return f"CPU: {info.model}, {info.cores} cores, {' '.join(vec)}; load average {' '.join(load)}"


def _whole_specjax(args, src: str, cache: str, out: str) -> dict:
    """One ``specjax generate`` process: wall seconds, and its phase line parsed."""
    if os.path.exists(out):
        os.remove(out)
    env = dict(os.environ, SPECJAX_CACHE_DIR=cache, PYTHONPATH=str(REPO))
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
            for part in line[len("phases: ") :].split("; "):
                m = re.match(r"(.+) ([0-9.]+) s$", part)
                if m:
                    phases[m.group(1)] = float(m.group(2))
    tokens = re.search(r"tokens (\d+)", proc.stderr)
    return {"wall": wall, "phases": phases, "tokens": int(tokens.group(1)) if tokens else 0}


def _whole_ct2(args, model_dir: str, spm: str, src: str, out: str, compute: str) -> dict:
    cmd = [sys.executable, "-c", _CT2_CHILD, model_dir, spm, src, out, str(args.batch), str(args.ct2_threads)]
    cmd += [compute, str(args.max_decode_length)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"ctranslate2 failed:\n{proc.stderr[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall": wall, **got}


def whole_run(argv=None) -> int:
    p = argparse.ArgumentParser(description=_WHOLE_RUN_DOC.strip().splitlines()[0])
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
    with open(_WHOLE_RUN_DATA, encoding="utf-8") as f:
        lines = f.read().splitlines()[: args.lines]
    with open(src, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    rows = []
    header = _whole_cpu_line()
    cache = os.path.join(work, "cache")
    cold = _whole_specjax(args, src, cache, os.path.join(work, "cold.de"))
    rows.append(("specjax generate, cold (empty cache)", cold))
    warm = min(
        (_whole_specjax(args, src, cache, os.path.join(work, f"warm{i}.de")) for i in range(args.warm_runs)),
        key=lambda r: r["wall"],
    )
    rows.append(("specjax generate, warm (same cache)", warm))
    if not args.skip_ct2:
        from specjax.bench.peers import to_ctranslate2

        target, _, tok = specjax.load_default_pair(dtype="float32")
        model_dir = to_ctranslate2(target, os.path.join(work, "ct2model"))
        spm = getattr(tok, "model_file", None) or getattr(tok, "path", None)
        for compute in ("float32", "int8"):
            r = _whole_ct2(args, model_dir, str(spm), src, os.path.join(work, f"ct2_{compute}.de"), compute)
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


SUBCOMMANDS = {
    "families": (families, _FAMILIES_DOC),
    "first-run": (first_run, _FIRST_RUN_DOC),
    "whole-run": (whole_run, _WHOLE_RUN_DOC),
}


def main() -> int:
    """``python benchmarks/NAME.py SUBCOMMAND [flags]``: runs SUBCOMMAND with the flags its ``--help`` lists."""
    return run_subcommands(__doc__, SUBCOMMANDS)


if __name__ == "__main__":
    sys.exit(main())
