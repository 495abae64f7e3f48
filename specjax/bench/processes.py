"""Peer engines each in its own process: specjax and CTranslate2 on the same inputs, alternating, best of N.

Why processes: an XLA:CPU thread pool left spinning after a specjax call slows whatever runs next in the same
process (16 lines through CTranslate2 took 4x as long right after a specjax call as before it, and their usual
time again 2 s later), so a one-process comparison (``peers.compare_with_ctranslate2``) favours whichever engine
runs first after a pause. Here every (engine, batch size) run is a fresh ``python -m specjax.bench.processes``
worker: it loads its engine, warms it up (specjax compiles; ``gamma="auto"`` makes one untimed pass over every
batch, which also teaches it α), then times ``passes`` passes over the inputs and reports the fastest (a call
in which auto first picks a γ compiles: it is run again and only the second run is timed). The parent runs the
workers one at a time, the engines' order rotating between rounds, ``rounds`` times, and keeps each engine's
best pass of all its rounds (best of N = rounds × passes). Nothing else runs in the parent while a worker runs.

Engines: "specjax temperature_sample" (the target alone), "specjax γ=auto" / "specjax γ=g" (``specjax.Decoder``),
and "ctranslate2 {compute type} {n} thread(s)" (the target converted by CTranslate2's own converter,
``peers.to_ctranslate2``; ``intra_threads=n``, one translator). Greedy decoding throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Sequence

import numpy as np

from specjax import hardware
from specjax.bench import peers
from specjax.bench.inputs import pad_batches
from specjax.bench.peers import ctranslate2_generate
from specjax.bench.timing import finish
from specjax.checkpoints import load_checkpoint
from specjax.decoder import Decoder
from specjax.decoding import temperature_sample
from specjax.defaults import load_default_pair

__all__ = ["compare_in_processes", "format_processes", "run_worker", "load_model"]


def load_model(path: str, dtype: str, draft: bool = False):
    """A model from a bench path: ``default:KIND`` / ``default:SIZE:KIND`` (a shipped pair's target or draft,
    KIND "target", "distilled" or "reference"; dtype "auto" resolved by ``load_default_pair``) or a checkpoint
    directory (``load_checkpoint``; "auto" loads float32)."""
    if path.startswith("default:"):
        *size, kind = path.split(":")[1:]
        target, draft_model, _ = load_default_pair(
            "distilled" if kind == "target" else kind,
            dtype="auto" if draft else dtype,
            draft_dtype=dtype if draft else None,
            size=size[0] if size else None,
        )
        return draft_model if kind != "target" else target

    return load_checkpoint(path, dtype="float32" if dtype == "auto" else dtype)


def _specjax_runner(job: dict):
    import jax

    target = load_model(job["target"], job["dtype"])
    gamma = job["gamma"]
    T, bs, rows = job["max_decode_length"], job["batch_size"], job["rows"]
    batches = pad_batches(rows, batch_size=bs, pad_id=target.config.pad_id)
    decoder = None
    if gamma is not None:
        draft = load_model(job["draft"], job["draft_dtype"], draft=True)
        decoder = Decoder(target, draft, gamma=gamma, max_decode_length=T)

    excluded = []  # seconds of calls that compiled (a γ auto picked for the first time), not charged

    def one(j, x):
        key = jax.random.PRNGKey(job["seed"] + j)
        if decoder is None:
            return finish(temperature_sample(target, x, rng=key, max_decode_length=T, temperature=0.0))
        r = finish(decoder(x, rng=key, temperature=0.0))
        if decoder.last_compiled:
            excluded.append(decoder.last_seconds)
            r = finish(decoder(x, rng=key, temperature=0.0, gamma=decoder.last_choice.gamma))
        return r

    def run_pass():
        excluded.clear()
        outs, chosen = [], []
        for j, x in enumerate(batches):
            r = one(j, x)
            seqs, lens = np.asarray(r.sequences), np.asarray(r.lengths)
            outs += [s[:m].tolist() for s, m in zip(seqs, lens)][: min(bs, len(rows) - j * bs)]
            if decoder is not None:
                chosen.append(decoder.last_choice.gamma)
        return outs, chosen, sum(excluded)

    warm = batches if gamma == "auto" else batches[:1]
    for j, x in enumerate(warm):  # compile (auto: every batch once, teaching α; never timed)
        one(j, x)
    return run_pass


def _ctranslate2_runner(job: dict):
    import ctranslate2

    tr = ctranslate2.Translator(
        job["ct2_dir"], device="cpu", compute_type=job["compute_type"], inter_threads=1, intra_threads=job["threads"]
    )
    rows, bs = job["rows"], job["batch_size"]

    def run_pass():
        outs, _ = ctranslate2_generate(tr, rows, max_decode_length=job["max_decode_length"], batch_size=bs)
        return [o.tolist() for o in outs], [], 0.0

    run_pass()  # warm-up
    return run_pass


def run_worker(job: dict) -> dict:
    """Runs one engine on ``job["rows"]`` (token id lists): warm-up, then ``job["passes"]`` timed passes.

    Returns:
      {"seconds": [per pass], "tokens": output tokens per pass, "outputs": token lists of the last pass,
      "gammas": γ per batch of the last pass (specjax Decoder engines; else empty), "cpu": the CPU line}.
    """
    runner = _ctranslate2_runner(job) if job["engine"] == "ctranslate2" else _specjax_runner(job)
    seconds, outs, chosen = [], [], []
    for _ in range(job["passes"]):
        t0 = time.perf_counter()
        outs, chosen, excluded = runner()
        seconds.append(time.perf_counter() - t0 - excluded)
    return {
        "seconds": seconds,
        "tokens": int(sum(len(o) for o in outs)),
        "outputs": outs,
        "gammas": chosen,
        "cpu": hardware.cpu_info().describe(),
    }


def _engines(gammas, compute_types, threads) -> dict:
    engines = {"specjax temperature_sample": {"engine": "specjax", "gamma": None}}
    for g in gammas:
        engines[f"specjax γ={g}"] = {"engine": "specjax", "gamma": g}
    for ct in compute_types:
        for n in threads:
            engines[f"ctranslate2 {ct} {n} thread{'s' if n > 1 else ''}"] = {
                "engine": "ctranslate2",
                "compute_type": ct,
                "threads": n,
            }
    return engines


def compare_in_processes(
    target_path: str,
    draft_path: str,
    rows: Sequence[Sequence[int]],
    *,
    dtype: str = "auto",
    draft_dtype: str | None = None,
    gammas: Sequence = ("auto",),
    max_decode_length: int = 64,
    batch_sizes: Sequence[int] = (1, 32),
    compute_types: Sequence[str] = ("float32",),
    threads: Sequence[int] = (1, 2),
    rounds: int = 2,
    passes: int = 2,
    seed: int = 0,
    workdir: str | None = None,
    on_step: Callable[[str], None] | None = None,
) -> dict:
    """Every engine in its own process on the same inputs, greedy; the best pass of ``rounds`` × ``passes``.

    Args:
      target_path, draft_path: bench model paths (``load_model``): "default:small:target",
        "default:small:distilled", or checkpoint directories.
      rows: token id lists (with EOS), one per input.
      dtype, draft_dtype: specjax's compute dtypes ("auto": ``specjax.defaults.pair_dtypes``); CTranslate2 runs
        the float32 target at ``compute_types``.
      gammas: specjax Decoder engines to run ("auto" and/or ints >= 1), beside the target alone.
      batch_sizes: rows per call; threads: CTranslate2 ``intra_threads`` values; rounds: passes of the parent
        over every engine (order rotating); passes: timed passes inside each worker.
      workdir: where the CTranslate2 conversion and the job files go (default: a temporary directory).
      on_step: called with each finished run's name (progress).
    Returns:
      dict with ``cpu`` (model, cores, dot-relevant flags), ``num_inputs``, ``max_decode_length``,
      ``rounds``, ``passes``, and ``records``: per (batch size, engine) ``tokens_per_s`` (best pass),
      ``seconds`` (all passes of all rounds), ``tokens``, ``identical`` (lines equal to the target alone's),
      ``gammas`` (auto's choices); ``ratios`` per batch size: the fastest specjax engine over each other.
    Raises:
      RuntimeError: a worker failed (its stderr's last lines in the message). ImportError: ctranslate2 missing.
    """
    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    work = workdir or tmp.name
    os.makedirs(work, exist_ok=True)
    engines = _engines(gammas, compute_types, threads)
    ct2_dir = None
    if compute_types and threads:
        ct2_dir = peers.to_ctranslate2(load_model(target_path, "float32"), work)
    common = dict(
        rows=[list(map(int, r)) for r in rows],
        max_decode_length=max_decode_length,
        seed=seed,
        passes=passes,
        target=target_path,
        draft=draft_path,
        dtype=dtype,
        draft_dtype=draft_dtype or dtype,
        ct2_dir=ct2_dir,
    )
    result = {
        "cpu": hardware.cpu_info().describe(),
        "num_inputs": len(rows),
        "max_decode_length": max_decode_length,
        "rounds": rounds,
        "passes": passes,
        "dtype": dtype,
        "records": [],
        "ratios": {},
    }
    names = list(engines)
    for bs in batch_sizes:
        runs: dict = {n: [] for n in names}
        for rnd in range(rounds):
            k = rnd % len(names)
            for name in names[k:] + names[:k]:
                job = dict(common, **engines[name], batch_size=bs)
                job_path, out_path = os.path.join(work, "job.json"), os.path.join(work, "out.json")
                with open(job_path, "w") as f:
                    json.dump(job, f)
                proc = subprocess.run(
                    [sys.executable, "-m", "specjax.bench.processes", job_path, out_path],
                    capture_output=True,
                    text=True,
                )
                if proc.returncode != 0:
                    tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
                    raise RuntimeError(f"{name} at batch {bs} failed (exit {proc.returncode}):\n{tail}")
                with open(out_path) as f:
                    runs[name].append(json.load(f))
                if on_step:
                    on_step(f"{name} batch {bs}")
        ref = runs["specjax temperature_sample"][-1]["outputs"]
        recs = {}
        for name in names:
            tokens = runs[name][-1]["tokens"]
            best = min(s for r in runs[name] for s in r["seconds"])
            recs[name] = {
                "batch_size": bs,
                "method": name,
                "tokens": tokens,
                "tokens_per_s": tokens / best,
                "seconds": [s for r in runs[name] for s in r["seconds"]],
                "identical": int(sum(a == b for a, b in zip(runs[name][-1]["outputs"], ref))),
                "gammas": runs[name][-1]["gammas"],
            }
        spec = max((n for n in names if n.startswith("specjax")), key=lambda n: recs[n]["tokens_per_s"])
        result["ratios"][bs] = {
            "fastest_specjax": spec,
            "over": {n: recs[spec]["tokens_per_s"] / r["tokens_per_s"] for n, r in recs.items() if n != spec},
        }
        result["records"] += list(recs.values())
    if tmp is not None:
        tmp.cleanup()
    return result


def format_processes(result: dict) -> str:
    """Markdown table of ``compare_in_processes``: tokens/s (best pass) per engine and batch size, the
    fastest specjax engine's ratio over each, auto's γ choices, and agreement with the target alone."""
    n = result["num_inputs"]
    lines = [
        f"Each engine in its own process, greedy, {n} inputs, max_decode_length {result['max_decode_length']}; "
        f"best pass of {result['rounds']} rounds x {result['passes']} passes, engines rotating; "
        f"CPU: {result['cpu']}; specjax dtype {result['dtype']}",
        "",
        "| batch | engine | tokens/s | fastest specjax / this | γ auto ran | identical to the target alone |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["records"]:
        ratio = result["ratios"][r["batch_size"]]
        over = ratio["over"].get(r["method"])
        mark = " (fastest specjax)" if r["method"] == ratio["fastest_specjax"] else ""
        chosen = ""
        if r["gammas"]:
            counts = {g: r["gammas"].count(g) for g in sorted(set(r["gammas"]))}
            chosen = ", ".join(f"{g}×{c}" for g, c in counts.items())
        lines.append(
            f"| {r['batch_size']} | {r['method']}{mark} | {r['tokens_per_s']:.1f} | "
            f"{'' if over is None else f'{over:.2f}x'} | {chosen} | {r['identical']}/{n} |"
        )
    return "\n".join(lines) + "\n"


def _main(argv: list[str]) -> int:
    """Worker entry point: ``python -m specjax.bench.processes JOB.json OUT.json``."""
    if len(argv) != 2:
        print("usage: python -m specjax.bench.processes JOB.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        job = json.load(f)
    out = run_worker(job)
    with open(argv[1], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
