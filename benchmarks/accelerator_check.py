#!/usr/bin/env python
"""Accelerator check: the paper's T5-XXL setting, measured on one GPU or TPU in one run.

What it measures, in this order, each item skipped (with a note) when the time budget would be exceeded:

  1. memory bandwidth: a large on-device read+write (``x + 1``), best of repeats, beside the device kind's
     nominal figure where known;
  2. the target's one-token decode step at batch 1 (a T5 1.1 XXL-shaped model, 11B parameters, random
     bfloat16 weights made on the device leaf by leaf, no float32 copy) against the HBM roofline:
     bytes a step must read (decoder weights, the logits kernel, one embedding row, cached K/V) / bandwidth;
  3. the draft's one-token step (T5 1.1 small shape, same 32128-row vocabulary) and c = draft / target step
     (Leviathan, Kalman & Matias 2023, section 3);
  4. the (γ+1)-token verification window for γ = 1..8, relative to one step (the paper's model of cost
     assumes 1.0);
  5. the projected walltime improvement at the paper's α values (configs/paper_table2.json, the T5-small
     draft rows) with the measured c: (1 − α^(γ+1)) / ((1 − α)(γc + 1)) (Theorem 3.8), and with the
     measured window cost in place of 1 in the denominator;
  6. the shipped pair's measured speedup (``specjax.load_default_pair()``, batch 1, temperature 0,
     γ = 3 and 5, speculative_sample against temperature_sample alternating on the same Multi30k lines);
  7. window invariance: the shipped target's logits from verification windows against the target alone's
     steps, batch 1 and 4, γ 5 and 7 (``specjax.bench.invariance.window_step_mismatch``).

Decode costs are timed as the decode loop runs them: N ``decode`` calls inside one jitted ``lax.fori_loop``,
compiled first (compile time recorded apart), best of repeats, waiting with ``block_until_ready``.

On the device machine (no network there; its image already holds jax with CUDA, flax, optax, sentencepiece,
safetensors, tensorstore, sacrebleu; ``../shared`` does not travel, so a few Multi30k test lines are copied
into an ignored folder that ``carry`` takes along):

  here, once:    mkdir -p .accel && grep -qx '/.accel/' .git/info/exclude || echo /.accel/ >> .git/info/exclude
                 head -16 ../shared/data/train/multi30k/test_2016_flickr.en > .accel/multi30k_test16.en
  device `run`:  carry [".accel"], timeout_s 560, command:
                 PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python3 benchmarks/accelerator_check.py
                     --lines .accel/multi30k_test16.en --out "$OUT"
  then here:     cp <files_at>/*.json <files_at>/*.md benchmarks/results/accelerator/ and commit them.

On a machine where specjax is not importable from the checkout, ``pip install -e . && pip install -U
"jax[cuda12]"`` first (with network; the whole run, install included, fits 8-10 minutes). On CPU,
``--small`` runs the same code on small shapes (t5_1_1_small target, a tiny draft) to check the script.
Results: ``<out>/<device_kind>.json`` and ``.md`` (``_small`` appended with --small); the table is printed.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from specjax import T5Config  # noqa: E402
from specjax.bench.theory import expected_improvement, expected_tokens_per_call  # noqa: E402
from specjax.models import t5  # noqa: E402

DEVICE_COMMAND = (
    "PYTHONPATH=$PWD PYTHONUNBUFFERED=1 python3 benchmarks/accelerator_check.py "
    '--lines .accel/multi30k_test16.en --out "$OUT"'
)
GAMMAS = tuple(range(1, 9))
PAPER_TABLE = REPO / "configs" / "paper_table2.json"
MULTI30K_TEST = REPO / ".." / "shared" / "data" / "train" / "multi30k" / "test_2016_flickr.en"
FALLBACK_LINES = REPO / "specjax" / "assets" / "demo_sentences.en"

# Nominal memory bandwidth (bytes/s) by a substring of ``device.device_kind`` (lower case), from the vendors'
# datasheets; first match wins, so longer names come first.
NOMINAL_BANDWIDTH = (
    ("h200", 4.8e12, "NVIDIA H200 datasheet (HBM3e)"),
    ("h100 pcie", 2.0e12, "NVIDIA H100 PCIe datasheet"),
    ("h100", 3.35e12, "NVIDIA H100 SXM datasheet (HBM3)"),
    ("gh200", 4.0e12, "NVIDIA GH200 datasheet"),
    ("a100-sxm4-80gb", 2.039e12, "NVIDIA A100 80GB SXM datasheet"),
    ("a100-pcie-80gb", 1.935e12, "NVIDIA A100 80GB PCIe datasheet"),
    ("a100", 1.555e12, "NVIDIA A100 40GB datasheet"),
    ("l4", 3.0e11, "NVIDIA L4 datasheet"),
    ("a10g", 6.0e11, "NVIDIA A10G datasheet"),
    ("t4", 3.2e11, "NVIDIA T4 datasheet"),
    ("tpu v4", 1.2e12, "Google Cloud TPU v4 docs (1200 GB/s per chip)"),
    ("tpu v5 lite", 8.19e11, "Google Cloud TPU v5e docs (819 GB/s per chip)"),
    ("tpu v5e", 8.19e11, "Google Cloud TPU v5e docs (819 GB/s per chip)"),
    ("tpu v5p", 2.765e12, "Google Cloud TPU v5p docs (2765 GB/s per chip)"),
    ("tpu v5", 2.765e12, "Google Cloud TPU v5p docs (2765 GB/s per chip)"),
    ("tpu v6 lite", 1.64e12, "Google Cloud TPU v6e docs (1640 GB/s per chip)"),
    ("tpu v6e", 1.64e12, "Google Cloud TPU v6e docs (1640 GB/s per chip)"),
)

# Targets tried in order when the device's memory cannot hold the XXL weights (a 16 GB TPU v5e chip).
FALLBACK_PRESETS = ("t5_1_1_xxl", "t5_1_1_xl", "t5_1_1_large", "t5_1_1_base", "t5_1_1_small")


def nominal_bandwidth(device_kind: str) -> tuple[float | None, str | None]:
    """The datasheet memory bandwidth (bytes/s) of a device kind and its source, or (None, None)."""
    kind = device_kind.lower()
    for key, value, source in NOMINAL_BANDWIDTH:
        if key in kind:
            return value, source
    return None, None


# ----------------------------------------------------------------------------------------------------------
# Random weights made on the device


def _init_std(name: str, shape: tuple[int, ...], config: T5Config) -> float | None:
    """t5x-like init scale of one parameter: None for RMSNorm scales (ones), 1.0 for the token embedding,
    1/sqrt(fan_in · h) for query kernels (t5x folds 1/sqrt(h) into the query init), 1/sqrt(fan_in) for
    other kernels ([in, …, out]: fan_in = shape[0]), 1/sqrt(buckets) for relative-position embeddings."""
    if len(shape) == 1 or name.endswith("['scale']"):
        return None
    if "rel_embedding" in name:
        return 1.0 / math.sqrt(shape[-1])
    if "token_embedder" in name or name.endswith("['embedding']"):
        return 1.0
    std = 1.0 / math.sqrt(shape[0])
    if "query" in name:
        std /= math.sqrt(config.head_dim)
    return std


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _random_leaf(key, shape, dtype, std):
    if std is None:
        return jnp.ones(shape, dtype)
    return jax.random.normal(key, shape, dtype) * jnp.asarray(std, dtype)


def random_params(config: T5Config, seed: int = 0):
    """Random parameters in ``config.param_dtype`` for every leaf of ``t5.abstract_params(config)``, made
    on the default device one leaf at a time (one small program per distinct shape), so an 11B-parameter
    bfloat16 model never has a float32 or host copy. Returns the nested dict of t5x-named arrays."""
    abstract = t5.abstract_params(config)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    out = []
    for i, (path, leaf) in enumerate(leaves):
        name = jax.tree_util.keystr(path)
        out.append(
            _random_leaf(keys[i], tuple(leaf.shape), jnp.dtype(leaf.dtype), _init_std(name, tuple(leaf.shape), config))
        )
    return jax.tree_util.tree_unflatten(treedef, out)


def step_bytes(config: T5Config, params, cache_length: int, encoder_length: int, batch: int = 1) -> dict:
    """Bytes one decode step must read from memory at the given batch size.

    Counted: every decoder parameter except the cross-attention key/value kernels (``encode`` applies
    them once per input), plus one embedding row per row of the batch (a gather), plus the cached
    self-attention K/V ([l, 2, b, n, L, h]) and the cross-attention K/V ([l, 2, b, n, s, h]) in the compute
    dtype. Returns a dict of byte counts: ``weights``, ``kv``, ``total``, ``all_params``, ``decoder_params``.
    """
    weights = decoder = total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = jax.tree_util.keystr(path)
        nbytes = int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
        total += nbytes
        if name.startswith("['decoder']"):
            decoder += nbytes
            cross_kv = "encoder_decoder_attention" in name and ("['key']" in name or "['value']" in name)
            if not cross_kv:
                weights += nbytes
        elif "token_embedder" in name:
            weights += batch * int(leaf.shape[-1]) * jnp.dtype(leaf.dtype).itemsize
    per_slot = (
        2
        * config.num_decoder_layers
        * batch
        * config.num_heads
        * config.head_dim
        * jnp.dtype(config.compute_dtype).itemsize
    )
    kv = per_slot * (cache_length + encoder_length)
    return {"weights": weights, "kv": kv, "total": weights + kv, "all_params": total, "decoder_params": decoder}


# ----------------------------------------------------------------------------------------------------------
# Timing


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


@jax.jit
def _touch(x):
    return x + jnp.ones((), x.dtype)  # reads and writes every byte once


def measure_bandwidth(nbytes: int, repeats: int = 10) -> dict:
    """Memory bandwidth (bytes/s) of ``x + 1`` over a bfloat16 array of ``nbytes`` on the default device,
    counting the bytes read and written (2 · nbytes), best of ``repeats`` compiled calls."""
    n = max(1, nbytes // 2)
    x = jax.block_until_ready(jnp.zeros((n,), jnp.bfloat16))
    jax.block_until_ready(_touch(x))
    seconds = _best_of(functools.partial(_touch, x), repeats)
    del x
    return {"buffer_bytes": 2 * n, "seconds": seconds, "bytes_per_s": 2 * 2 * n / seconds}


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _decode_loop(config, params, encoded, cache, k: int, n: int, max_position: int):
    """n decode calls of a k-token window (batch b = rows of ``encoded``) in one jitted loop, each depending
    on the last (so nothing is hoisted); every call's full logits are reduced, as the decode loop reads
    them. Returns float32[b]."""
    b = encoded.mask.shape[0]

    def body(i, carry):
        cache, acc = carry
        tokens = jnp.full((b, k), 3, jnp.int32) + (acc[:, None] > 1e30)
        positions = jnp.full((b,), (i * k) % max_position, jnp.int32)
        logits, cache = t5.decode(config, params, encoded, tokens, cache, positions)
        return cache, acc + jnp.max(logits, axis=(1, 2))

    return jax.lax.fori_loop(0, n, body, (cache, jnp.zeros((b,), jnp.float32)))[1]


_encode = jax.jit(t5.encode, static_argnums=0)


def time_decode(
    config: T5Config, params, encoder_input_tokens, k: int, steps: int, repeats: int, max_decode_length: int
) -> dict:
    """Seconds per decode call of a k-token window at the batch of ``encoder_input_tokens`` int32[b, s],
    timed inside a jitted loop of ``steps`` calls, best of ``repeats``; the first call (compile + run) is
    timed apart. The cache holds ``max_decode_length + k`` slots. Returns ``{"seconds", "compile_seconds"}``."""
    encoded = _encode(config, params, encoder_input_tokens)
    cache = t5.init_cache(config, encoder_input_tokens.shape[0], max_decode_length + k)
    run = lambda: _decode_loop(config, params, encoded, cache, k, steps, max_decode_length)  # noqa: E731
    t0 = time.perf_counter()
    jax.block_until_ready(run())
    compile_seconds = time.perf_counter() - t0
    return {"seconds": _best_of(run, repeats) / steps, "compile_seconds": compile_seconds}


class Budget:
    """Wall-clock budget (seconds since construction): items that would run past it are skipped."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def allows(self, estimate: float, reserve: float = 0.0) -> bool:
        return self.elapsed() + estimate + reserve <= self.seconds


# ----------------------------------------------------------------------------------------------------------
# The run


def _configs(args, device) -> tuple[T5Config, T5Config, list[str]]:
    """Target and draft configs (bfloat16), falling back to a smaller target when the device's memory
    (``memory_stats()['bytes_limit']``, where reported) cannot hold the weights."""
    notes = []
    bf16 = dict(dtype="bfloat16", param_dtype="bfloat16")
    if args.tiny:
        target = T5Config(
            vocab_size=512,
            d_model=64,
            num_heads=2,
            head_dim=16,
            mlp_dim=128,
            num_encoder_layers=1,
            num_decoder_layers=2,
            name="tiny_target",
            **bf16,
        )
        draft = target.replace(d_model=32, mlp_dim=64, num_decoder_layers=1, name="tiny_draft")
        return target, draft, notes
    if args.small:
        target = T5Config.preset("t5_1_1_small", **bf16)
        draft = T5Config(
            d_model=128,
            num_heads=2,
            head_dim=64,
            mlp_dim=256,
            num_encoder_layers=2,
            num_decoder_layers=2,
            name="tiny_draft",
            **bf16,
        )
        return target, draft, notes
    draft = T5Config.preset(args.draft_preset, **bf16)
    stats = {}
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 -- not every backend reports memory
        pass
    limit = stats.get("bytes_limit")
    names = (
        FALLBACK_PRESETS[FALLBACK_PRESETS.index(args.target_preset) :]
        if args.target_preset in FALLBACK_PRESETS
        else (args.target_preset,)
    )
    for name in names:
        target = T5Config.preset(name, **bf16)
        nbytes = sum(int(np.prod(x.shape)) * 2 for x in jax.tree_util.tree_leaves(t5.abstract_params(target)))
        if limit is None or nbytes * 1.15 + 2e9 <= limit:
            if name != args.target_preset:
                notes.append(
                    f"{args.target_preset} ({nbytes_of(args.target_preset) / 1e9:.1f} GB) does not fit "
                    f"the device's {limit / 1e9:.1f} GB; measured {name} instead."
                )
            return target, draft, notes
    return target, draft, notes


def nbytes_of(preset: str) -> int:
    """bfloat16 bytes of a preset's parameters."""
    cfg = T5Config.preset(preset, param_dtype="bfloat16")
    return sum(int(np.prod(x.shape)) * 2 for x in jax.tree_util.tree_leaves(t5.abstract_params(cfg)))


def _paper_rows(draft_name: str = "T5-small") -> list[dict]:
    """The paper's rows with the given draft from configs/paper_table2.json."""
    with open(PAPER_TABLE) as f:
        spec = json.load(f)
    return [r for r in spec["rows"] if r["draft"] == draft_name]


def projections(c: float, window_over_step: dict[int, float]) -> list[dict]:
    """The paper's expected walltime improvement with the measured c, for each T5-small row of Table 2.

    Per row: ``projected`` = expected_improvement(α, γ, c) at the paper's γ (Theorem 3.8);
    ``projected_window`` = expected tokens per call / (γc + window/step) where the window was measured;
    ``best_gamma`` / ``projected_best`` = the γ in 1..8 maximising expected_improvement, and its value.
    """
    out = []
    for r in _paper_rows():
        alpha, gamma = float(r["paper"]["alpha"]), int(r["gamma"])
        best = max(GAMMAS, key=lambda g: expected_improvement(alpha, g, c))
        w = window_over_step.get(gamma)
        out.append(
            {
                "task": r["task"],
                "temperature": r["temperature"],
                "draft": r["draft"],
                "alpha": alpha,
                "gamma": gamma,
                "paper_speedup": r["paper"]["speedup"],
                "c": c,
                "projected": expected_improvement(alpha, gamma, c),
                "projected_window": (expected_tokens_per_call(alpha, gamma) / (gamma * c + w)) if w else None,
                "best_gamma": best,
                "projected_best": expected_improvement(alpha, best, c),
            }
        )
    return out


def measure_shipped_pair(args, budget: Budget, result: dict) -> None:
    """The shipped pair at batch 1, temperature 0, γ in ``args.pair_gammas``: ``bench.measure_pair``."""
    from specjax import load_default_pair
    from specjax.bench import encode_inputs, measure_pair, pad_batches, read_lines

    path = Path(args.lines) if args.lines else MULTI30K_TEST
    if not path.is_file():
        result["notes"].append(f"{path} is missing; the shipped pair ran on {FALLBACK_LINES.name} instead.")
        path = FALLBACK_LINES
    target, draft, tokenizer = load_default_pair(dtype=args.pair_dtype)
    lines = [l for l in read_lines(str(path), args.pair_lines) if l]
    ids = encode_inputs(tokenizer, lines, "", 512)
    batches = pad_batches(ids, batch_size=1, pad_id=target.config.pad_id)
    pair = {
        "lines_file": str(path),
        "num_inputs": len(ids),
        "dtype": args.pair_dtype,
        "batch_size": 1,
        "temperature": 0.0,
        "max_decode_length": args.pair_max_decode_length,
        "repeats": args.pair_repeats,
        "target_params": target.num_params,
        "draft_params": draft.num_params,
        "rows": [],
    }
    result["shipped_pair"] = pair
    for gamma in args.pair_gammas:
        estimate = pair["rows"][-1]["item_seconds"] if pair["rows"] else args.pair_estimate
        if not budget.allows(estimate):
            result["skipped"].append(
                {
                    "item": f"shipped pair γ={gamma}",
                    "note": f"time budget ({budget.elapsed():.0f} s of {budget.seconds:.0f} s used, "
                    f"~{estimate:.0f} s needed)",
                }
            )
            continue
        t0 = time.perf_counter()
        m = measure_pair(
            target,
            draft,
            batches,
            gamma=gamma,
            temperature=0.0,
            max_decode_length=args.pair_max_decode_length,
            num_inputs=len(ids),
            repeats=args.pair_repeats,
        )
        identical = all(np.array_equal(a, b) for a, b in zip(m.sequences("spec"), m.sequences("base")))
        pair["rows"].append(
            {
                "gamma": gamma,
                "speedup": m.speedup,
                "alpha": m.acceptance_rate,
                "tokens_per_target_call": m.tokens_per_target_call,
                "mean_accepted_length": m.mean_accepted_length,
                "spec_tokens_per_s": m.output_tokens * args.pair_repeats / m.spec_seconds,
                "base_tokens_per_s": m.base_output_tokens * args.pair_repeats / m.base_seconds,
                "spec_seconds": m.spec_seconds,
                "base_seconds": m.base_seconds,
                "spec_compile_seconds": m.spec_compile_seconds,
                "base_compile_seconds": m.base_compile_seconds,
                "greedy_identical": identical,
                "item_seconds": time.perf_counter() - t0,
            }
        )
        _log(f"shipped pair γ={gamma}: speedup {m.speedup:.2f}x, α {m.acceptance_rate}, greedy identical {identical}")


def measure_window_invariance(args, result: dict) -> None:
    """The shipped target's logits from verification windows against the target alone's steps on this device
    (``specjax.bench.invariance.window_step_mismatch``), batch 1 and 4, γ 5 and 7: on TPU / GPU the dot kernels
    are the compiler's to pick by shape, so this measures whether a window and a step round alike there."""
    from specjax import load_default_pair
    from specjax.bench.invariance import window_step_mismatch

    target, _, tokenizer = load_default_pair(dtype=args.pair_dtype)
    lines = ["A man is riding a bicycle down the street.", "Two dogs play in the snow.", "The children sit.", "Hi."]
    rows = []
    for batch in (1, 4):
        x = np.asarray(tokenizer.encode_batch(lines[:batch]))
        x = np.pad(x, ((0, 0), (0, 32 - x.shape[1])))
        for gamma in (5, 7):
            got = window_step_mismatch(target, x, gamma, max_decode_length=24, seed=gamma)
            rows.append({"batch": batch, "gamma": gamma, **got})
            _log(f"window invariance batch {batch} γ={gamma}: {got['differ']} of {got['total']} logits differ")
    result["window_invariance"] = rows


def _log(msg: str) -> None:
    print(f"[accelerator_check] {msg}", flush=True)


def run(args) -> dict:
    """Runs every item within ``args.time_budget`` seconds; returns the result dict (see ``format_markdown``)."""
    budget = Budget(args.time_budget)
    device = jax.devices()[0]
    kind = device.device_kind
    result: dict[str, Any] = {
        "environment": {
            "jax": jax.__version__,
            "backend": jax.default_backend(),
            "device_kind": kind,
            "device_count": jax.device_count(),
            "platform": device.platform,
        },
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name] + list(args.argv)) if args.argv is not None else None,
        "settings": {k: v for k, v in vars(args).items() if k != "argv"},
        "notes": [],
        "skipped": [],
    }
    target_cfg, draft_cfg, notes = _configs(args, device)
    result["notes"] += notes
    nominal, nominal_source = nominal_bandwidth(kind)

    # 1. Bandwidth.
    t0 = time.perf_counter()
    bw = measure_bandwidth(args.bandwidth_bytes)
    bw["nominal_bytes_per_s"], bw["nominal_source"] = nominal, nominal_source
    result["bandwidth"] = bw
    _log(
        f"bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s measured ({time.perf_counter() - t0:.1f} s)"
        + (f", {nominal / 1e9:.0f} GB/s nominal" if nominal else "")
    )

    # 2. Target weights and its one-token step.
    t0 = time.perf_counter()
    params = jax.block_until_ready(random_params(target_cfg, seed=0))
    init_s = time.perf_counter() - t0
    tokens = np.asarray(np.random.default_rng(0).integers(2, target_cfg.vocab_size, (1, args.encoder_length)), np.int32)
    tokens[0, -1] = target_cfg.eos_id
    nb = step_bytes(target_cfg, params, args.max_decode_length + 1, args.encoder_length)
    _log(f"target {target_cfg.name}: {nb['all_params'] / 2 / 1e9:.2f}B params, made in {init_s:.1f} s")
    step = time_decode(target_cfg, params, tokens, 1, args.steps, args.repeats, args.max_decode_length)
    target = {
        "preset": target_cfg.name,
        "config": _config_dict(target_cfg),
        "num_params": nb["all_params"] // 2,
        "init_seconds": init_s,
        "param_bytes": nb["all_params"],
        "decoder_param_bytes": nb["decoder_params"],
        "step_weight_bytes": nb["weights"],
        "step_kv_bytes": nb["kv"],
        "step_bytes": nb["total"],
        "step_s": step["seconds"],
        "step_compile_s": step["compile_seconds"],
        "roofline_s": nb["total"] / bw["bytes_per_s"],
        "roofline_nominal_s": nb["total"] / nominal if nominal else None,
        "achieved_bytes_per_s": nb["total"] / step["seconds"],
    }
    target["step_over_roofline"] = step["seconds"] / target["roofline_s"]
    target["step_over_roofline_nominal"] = step["seconds"] / target["roofline_nominal_s"] if nominal else None
    result["target"] = target
    _log(
        f"target step {step['seconds'] * 1e3:.3f} ms, roofline {target['roofline_s'] * 1e3:.3f} ms "
        f"(x{target['step_over_roofline']:.2f}); compile {step['compile_seconds']:.1f} s"
    )

    # 3. Draft step and c.
    t0 = time.perf_counter()
    dparams = jax.block_until_ready(random_params(draft_cfg, seed=1))
    dstep = time_decode(
        draft_cfg, dparams, tokens % draft_cfg.vocab_size, 1, args.steps, args.repeats, args.max_decode_length
    )
    dnb = step_bytes(draft_cfg, dparams, args.max_decode_length + 1, args.encoder_length)
    c = dstep["seconds"] / step["seconds"]
    result["draft"] = {
        "preset": draft_cfg.name,
        "config": _config_dict(draft_cfg),
        "num_params": dnb["all_params"] // 2,
        "step_s": dstep["seconds"],
        "step_compile_s": dstep["compile_seconds"],
        "step_bytes": dnb["total"],
        "roofline_s": dnb["total"] / bw["bytes_per_s"],
        "item_seconds": time.perf_counter() - t0,
    }
    result["c"] = c
    del dparams
    _log(f"draft step {dstep['seconds'] * 1e3:.3f} ms; c = {c:.4f}")

    # 4. Windows γ = 1..8 (keeping time for the shipped pair).
    windows: dict[int, dict] = {}
    last = step["compile_seconds"] + args.repeats * args.steps * step["seconds"] * 2
    reserve = args.pair_estimate * len(args.pair_gammas) if not args.no_pair else 0.0
    for gamma in GAMMAS:
        if not budget.allows(1.2 * last, reserve):
            result["skipped"].append(
                {
                    "item": f"target window γ={gamma}",
                    "note": f"time budget ({budget.elapsed():.0f} s of {budget.seconds:.0f} s used, "
                    f"~{1.2 * last:.0f} s needed, {reserve:.0f} s kept for the shipped pair)",
                }
            )
            continue
        t0 = time.perf_counter()
        w = time_decode(target_cfg, params, tokens, gamma + 1, args.steps, args.repeats, args.max_decode_length)
        last = time.perf_counter() - t0
        windows[gamma] = {
            "k": gamma + 1,
            "window_s": w["seconds"],
            "compile_s": w["compile_seconds"],
            "window_over_step": w["seconds"] / step["seconds"],
        }
        _log(f"window γ={gamma}: {w['seconds'] * 1e3:.3f} ms = {windows[gamma]['window_over_step']:.3f} steps")
    result["windows"] = {str(g): v for g, v in windows.items()}
    del params
    gc.collect()

    # 5. Projections at the paper's α.
    result["projections"] = projections(c, {g: v["window_over_step"] for g, v in windows.items()})

    # 6. The shipped pair.
    if args.no_pair:
        result["skipped"].append({"item": "shipped pair", "note": "--no-pair"})
    else:
        try:
            measure_shipped_pair(args, budget, result)
        except Exception as e:  # noqa: BLE001 -- keep everything measured so far
            result["notes"].append(f"shipped pair failed: {type(e).__name__}: {e}")
            _log(f"shipped pair failed: {e!r}")
    # 7. Window invariance of the shipped target (window logits = step logits, bit for bit?).
    if not args.no_pair:
        try:
            measure_window_invariance(args, result)
        except Exception as e:  # noqa: BLE001 -- keep everything measured so far
            result["notes"].append(f"window invariance failed: {type(e).__name__}: {e}")
            _log(f"window invariance failed: {e!r}")
    result["elapsed_s"] = budget.elapsed()
    return result


def _config_dict(cfg: T5Config) -> dict:
    return {
        k: getattr(cfg, k)
        for k in (
            "d_model",
            "num_heads",
            "head_dim",
            "mlp_dim",
            "num_encoder_layers",
            "num_decoder_layers",
            "vocab_size",
            "dtype",
            "param_dtype",
        )
    }


# ----------------------------------------------------------------------------------------------------------
# Report


def _f(x, fmt="{:.3f}", none="—"):
    return none if x is None else fmt.format(x)


def format_markdown(r: dict) -> str:
    """The result dict as Markdown tables (what is printed and written to ``<device_kind>.md``)."""
    env, bw, tg = r["environment"], r["bandwidth"], r["target"]
    lines = [
        f"# Accelerator check: {env['device_kind']} ({env['backend']}, jax {env['jax']})",
        "",
        f"{r['date']}; {r['elapsed_s']:.0f} s in all. Command: `{r.get('command')}`",
        "",
        "## Target one-token step at batch 1 against the memory roofline",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| target | {tg['preset']}, {tg['num_params'] / 1e9:.3f}B params, random {tg['config']['param_dtype']} "
        f"(made on the device in {tg['init_seconds']:.1f} s) |",
        f"| bytes a step reads | {tg['step_bytes'] / 1e9:.3f} GB (decoder weights {tg['step_weight_bytes'] / 1e9:.3f}"
        f" GB + K/V {tg['step_kv_bytes'] / 1e6:.1f} MB) |",
        f"| bandwidth, measured (x + 1 over {bw['buffer_bytes'] / 1e9:.2f} GB) | {bw['bytes_per_s'] / 1e9:.1f} GB/s |",
        f"| bandwidth, nominal | {_f(bw['nominal_bytes_per_s'] and bw['nominal_bytes_per_s'] / 1e9, '{:.0f} GB/s')}"
        f"{' (' + bw['nominal_source'] + ')' if bw['nominal_source'] else ' (device kind not in the table)'} |",
        f"| step, measured | {tg['step_s'] * 1e3:.3f} ms (compile {tg['step_compile_s']:.1f} s) |",
        f"| roofline at measured / nominal bandwidth | {tg['roofline_s'] * 1e3:.3f} ms / "
        f"{_f(tg['roofline_nominal_s'] and tg['roofline_nominal_s'] * 1e3)} ms |",
        f"| step / roofline (measured / nominal bandwidth) | {tg['step_over_roofline']:.2f} / "
        f"{_f(tg['step_over_roofline_nominal'], '{:.2f}')} |",
        f"| bandwidth the step achieves | {tg['achieved_bytes_per_s'] / 1e9:.1f} GB/s |",
        "",
    ]
    d = r.get("draft")
    if d:
        lines += [
            "## Draft step and c",
            "",
            "| quantity | value |",
            "|---|---|",
            f"| draft | {d['preset']}, {d['num_params'] / 1e6:.1f}M params |",
            f"| draft step | {d['step_s'] * 1e3:.3f} ms (roofline {d['roofline_s'] * 1e3:.3f} ms) |",
            f"| c = draft step / target step | {r['c']:.4f} |",
            "",
        ]
    if r.get("windows"):
        lines += [
            "## Verification window (γ+1 tokens) against one step",
            "",
            "| γ | k | window ms | window / step |",
            "|---|---|---|---|",
        ]
        for g, w in sorted(r["windows"].items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {g} | {w['k']} | {w['window_s'] * 1e3:.3f} | {w['window_over_step']:.3f} |")
        lines.append("")
    if r.get("projections"):
        lines += [
            "## Projected speedup at the paper's α (Table 2, T5-small draft) with the measured c",
            "",
            "Projected = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) (Leviathan et al. 2023, Theorem 3.8); "
            "with window = the same with the measured window/step in place of 1.",
            "",
            "| task | T | α (paper) | γ (paper) | paper speedup | projected | with window | best γ "
            "| projected at best γ |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in r["projections"]:
            lines.append(
                f"| {p['task']} | {p['temperature']} | {p['alpha']} | {p['gamma']} | {p['paper_speedup']} | "
                f"{p['projected']:.2f} | {_f(p['projected_window'], '{:.2f}')} | {p['best_gamma']} | "
                f"{p['projected_best']:.2f} |"
            )
        lines.append("")
    sp = r.get("shipped_pair")
    if sp and sp["rows"]:
        lines += [
            f"## Shipped pair measured (batch 1, temperature 0, {sp['num_inputs']} lines of "
            f"{Path(sp['lines_file']).name}, {sp['dtype']}, max_decode_length {sp['max_decode_length']})",
            "",
            "| γ | α | tokens / target call | speculative tok/s | target alone tok/s | speedup | greedy identical |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in sp["rows"]:
            lines.append(
                f"| {row['gamma']} | {_f(row['alpha'])} | {row['tokens_per_target_call']:.2f} | "
                f"{row['spec_tokens_per_s']:.0f} | {row['base_tokens_per_s']:.0f} | {row['speedup']:.2f}x | "
                f"{row['greedy_identical']} |"
            )
        lines.append("")
    wi = r.get("window_invariance")
    if wi:
        lines += [
            "## Window invariance (shipped target: verification-window logits against the target alone's steps)",
            "",
            "| batch | γ | dtype | logits that differ | argmax that differ | max abs difference |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {w['batch']} | {w['gamma']} | {w['dtype']} | {w['differ']} of {w['total']} | {w['argmax_differ']} | "
            f"{w['max_abs']:.3g} |"
            for w in wi
        ]
        lines.append("")
    if r["skipped"] or r["notes"]:
        lines += ["## Skipped and notes", ""]
        lines += [f"- skipped {s['item']}: {s['note']}" for s in r["skipped"]]
        lines += [f"- {n}" for n in r["notes"]]
        lines.append("")
    return "\n".join(lines)


def _slug(kind: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_") or "device"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out",
        default="benchmarks/results/accelerator",
        help="folder for <device_kind>.json and .md (default: %(default)s)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=420.0,
        help="seconds; items that would run past it are skipped with a note (default: %(default)s)",
    )
    p.add_argument("--small", action="store_true", help="t5_1_1_small target, tiny draft: checks the script on CPU")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # 2-layer models, for the test
    p.add_argument("--target-preset", default="t5_1_1_xxl")
    p.add_argument("--draft-preset", default="t5_1_1_small")
    p.add_argument("--steps", type=int, default=None, help="decode calls per timed loop (default 32; 8 with --small)")
    p.add_argument("--repeats", type=int, default=None, help="timed loops, best kept (default 5; 2 with --small)")
    p.add_argument("--encoder-length", type=int, default=64, help="encoder input tokens (default: %(default)s)")
    p.add_argument(
        "--max-decode-length", type=int, default=128, help="decoder cache slots minus the window (default: %(default)s)"
    )
    p.add_argument("--bandwidth-bytes", type=int, default=None, help="bandwidth buffer (default 4 GiB; 64 MiB --small)")
    p.add_argument("--no-pair", action="store_true", help="skip the shipped pair")
    p.add_argument("--lines", default=None, help="input lines for the shipped pair (default: Multi30k test 2016)")
    p.add_argument("--pair-lines", type=int, default=None, help="lines (default 16; 2 with --small)")
    p.add_argument("--pair-gammas", type=int, nargs="+", default=[3, 5])
    p.add_argument("--pair-repeats", type=int, default=None, help="passes over the lines (default 3; 1 --small)")
    p.add_argument("--pair-max-decode-length", type=int, default=64)
    p.add_argument("--pair-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--pair-estimate",
        type=float,
        default=60.0,
        help="seconds kept for each shipped-pair γ (compile + run) (default: %(default)s)",
    )
    args = p.parse_args(argv)
    small = args.small or args.tiny
    args.steps = args.steps or (8 if small else 32)
    args.repeats = args.repeats or (2 if small else 5)
    args.bandwidth_bytes = args.bandwidth_bytes or ((64 << 20) if small else (4 << 30))
    args.pair_lines = args.pair_lines or (2 if small else 16)
    args.pair_repeats = args.pair_repeats or (1 if small else 3)
    if small:
        args.max_decode_length = min(args.max_decode_length, 32)
        args.encoder_length = min(args.encoder_length, 16)
    if args.steps < 1 or args.repeats < 1 or args.max_decode_length < 1 or args.encoder_length < 2:
        p.error("--steps, --repeats, --max-decode-length must be >= 1 and --encoder-length >= 2.")
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    """Runs the check, writes ``<out>/<device_kind>[_small].{json,md}``, prints the table; returns the dict."""
    args = parse_args(argv)
    result = run(args)
    md = format_markdown(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = _slug(result["environment"]["device_kind"]) + ("_tiny" if args.tiny else "_small" if args.small else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(md + "\n")
    result["files"] = [str(out / f"{stem}.json"), str(out / f"{stem}.md")]
    print(md, flush=True)
    _log(f"wrote {result['files'][0]} and .md")
    return result


if __name__ == "__main__":
    main()
