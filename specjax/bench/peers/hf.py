"""Hugging Face transformers: assisted generation on the same weights and the same inputs.

The pair is exported with ``save_checkpoint(format="hf")`` and loaded by
``transformers.T5ForConditionalGeneration`` in float32 on the CPU. transformers' assisted generation
(``model.generate(..., assistant_model=draft)``; Leviathan et al. 2023's algorithm at ``do_sample=True``,
greedy verification otherwise) is run at batch 1 with ``num_assistant_tokens = γ`` on a constant schedule
and the confidence-based early stop switched off, so both libraries run the same algorithm. Plain
``generate`` (no assistant) is the transformers baseline.

Conventions that differ (and are handled here): transformers starts decoding from
``decoder_start_token_id`` (0, T5's pad) and returns it as the first output token, which is dropped before
comparing; ``max_new_tokens`` = specjax ``max_decode_length``; eos 1, pad 0. transformers refuses an
assistant at batch > 1, so batch scaling compares plain ``generate`` there.

PyTorch and transformers are imported only inside this module's functions.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Callable, Sequence

import numpy as np

from specjax.bench.inputs import pad_batches
from specjax.bench.timing import environment, finish
from specjax.checkpoints import save_checkpoint
from specjax.decoding import speculative_sample, temperature_sample
from specjax.models.t5 import T5Model


def _import():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ImportError(
            "The transformers comparison needs PyTorch and transformers: pip install 'specjax[bench]' torch"
        ) from e
    return torch, transformers


def to_transformers(model: T5Model, path: str | os.PathLike):
    """Writes ``model`` as a Hugging Face checkpoint at ``path`` and loads it in transformers, float32, eval.

    Returns:
      ``transformers.T5ForConditionalGeneration`` on the CPU.
    Raises:
      ImportError: torch/transformers missing. CheckpointError: parameters that do not match the config.
    """
    torch, transformers = _import()

    if model.config.dtype != "float32" or model.config.param_dtype != "float32":
        model = model.astype("float32")
    save_checkpoint(model, path, format="hf")
    hf = transformers.T5ForConditionalGeneration.from_pretrained(os.fspath(path), dtype=torch.float32)
    # transformers 5.x sizes generate()'s DynamicCache from config.num_layers (the *encoder* depth) and fails
    # with an IndexError when the decoder is deeper. The built modules do not read num_layers again, so
    # raising it to the decoder depth only fixes the cache size.
    if hf.config.num_decoder_layers > hf.config.num_layers:
        hf.config.num_layers = hf.config.num_decoder_layers
    return hf.eval()


def _configure_assistant(assistant, gamma: int) -> None:
    cfg = assistant.generation_config
    cfg.num_assistant_tokens = int(gamma)
    cfg.num_assistant_tokens_schedule = "constant"
    cfg.assistant_confidence_threshold = None  # no early stop: exactly γ drafts per target call


def hf_generate(
    model,
    input_ids,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    assistant=None,
    gamma: int | None = None,
    seed: int = 0,
    eos_id: int = 1,
    pad_id: int = 0,
):
    """One transformers ``generate`` call, timed.

    Args:
      model: a transformers T5 (the target).
      input_ids: int[b, s] token ids, right-padded with ``pad_id`` (or a list of ids for one input).
      max_new_tokens: the most new tokens (= specjax ``max_decode_length``).
      temperature: 0 for greedy (``do_sample=False``); > 0 samples with ``top_k=0, top_p=1``.
      assistant: a transformers T5 draft for assisted generation (batch 1 only), with ``gamma`` drafts per
        target call.
      seed: ``torch.manual_seed`` before sampling.
    Returns:
      (list of int32 arrays, one per row: new tokens up to and including the first EOS, the start token
      dropped; seconds of wall time).
    Raises:
      ValueError: ``assistant`` with more than one row (transformers refuses it).
    """
    torch, _ = _import()
    x = np.asarray(input_ids, np.int64)
    if x.ndim == 1:
        x = x[None]
    if assistant is not None and x.shape[0] != 1:
        raise ValueError("transformers assisted generation supports batch 1 only.")
    ids = torch.from_numpy(x)
    kw = dict(
        max_new_tokens=int(max_new_tokens),
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        decoder_start_token_id=pad_id,
        min_length=0,
        num_beams=1,
    )
    if temperature == 0:
        kw.update(do_sample=False)
    else:
        kw.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
    if assistant is not None:
        if gamma is None:
            raise ValueError("gamma is needed with an assistant.")
        _configure_assistant(assistant, gamma)
        kw["assistant_model"] = assistant
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=(ids != pad_id).long(), **kw)
    dt = time.perf_counter() - t0
    rows = []
    for r in out.numpy()[:, 1:]:  # drop decoder_start_token_id
        r = r.astype(np.int32)
        ends = np.nonzero(r == eos_id)[0]
        rows.append(r[: ends[0] + 1] if ends.size else r)
    return rows, dt


def _diagnose(target: T5Model, enc_ids: Sequence[int], ours: np.ndarray, theirs: np.ndarray) -> dict:
    """Where two greedy outputs first differ, and the target's top-2 logit gap there (teacher-forced on ours)."""
    n = min(len(ours), len(theirs))
    diff = np.nonzero(ours[:n] != theirs[:n])[0]
    j = int(diff[0]) if diff.size else n
    info = {"position": j, "ours": ours[j : j + 3].tolist(), "hf": theirs[j : j + 3].tolist()}
    if j < len(ours):
        dec = np.concatenate([[target.config.pad_id], ours[:j]]).astype(np.int32)[None]
        logits = np.asarray(target.logits(np.asarray([enc_ids], np.int32), dec))[0, j]
        top = np.sort(logits)[-2:]
        info["top2_logit_gap"] = float(top[1] - top[0])
        info["explanation"] = (
            "near-tie: the target's two best logits differ by less than 1e-4, within "
            "float32 differences between XLA and PyTorch kernels"
            if info["top2_logit_gap"] < 1e-4
            else "not a near-tie: the implementations disagree here (investigate)"
        )
    else:
        info["explanation"] = "one output is a prefix of the other (length / EOS handling)"
    return info


def compare_with_transformers(
    target: T5Model,
    draft: T5Model,
    rows: Sequence[Sequence[int]],
    *,
    gamma: int,
    max_decode_length: int,
    temperatures: Sequence[float] = (0.0, 1.0),
    seed: int = 0,
    workdir: str | None = None,
    on_item: Callable[[], None] | None = None,
    hf_models: tuple | None = None,
) -> dict:
    """specjax speculative_sample / temperature_sample against transformers assisted / plain generate.

    Batch 1, float32, the same weights (exported through ``save_checkpoint(format="hf")``), the same
    inputs, the four methods alternating per input after one untimed warm-up call each (specjax
    compiles there).

    Args:
      rows: token id lists (with EOS), one per input.
      gamma: draft tokens per target call for both libraries.
      temperatures: 0 → "greedy" entry, > 0 → "sampling" entry (the first of each kind is used).
      workdir: where the HF export goes (a temporary directory by default).
      hf_models: (hf_target, hf_draft) already loaded (skips the export).
    Returns:
      dict with ``gamma``, ``num_inputs``, ``max_decode_length``, versions, and per mode ("greedy",
      "sampling") a dict of seconds (``specjax_spec_s``, ``specjax_base_s``, ``hf_assisted_s``,
      ``hf_plain_s``), output tokens per method, ratios ``hf_assisted_over_specjax_spec`` (how many times
      faster specjax speculative is than transformers assisted), ``hf_plain_over_specjax_base``,
      ``specjax_speedup``, ``hf_assisted_speedup``, ``specjax_alpha`` (the paper's α measured in the loop;
      None for results without ``beta_sum``), ``specjax_accepted_fraction`` (accepted / drafted), and for
      greedy ``matches_assisted`` / ``matches_plain`` (inputs whose tokens equal ours) and ``mismatches``
      (position, tokens, the target's top-2 logit gap there and an explanation).
    Raises:
      ImportError: torch/transformers missing. ValueError: as ``speculative_sample``.
    """
    torch, transformers = _import()
    import jax

    target = target if target.config.dtype == "float32" else target.astype("float32")
    draft = draft if draft.config.dtype == "float32" else draft.astype("float32")
    if hf_models is None:
        tmp = tempfile.TemporaryDirectory() if workdir is None else None
        base_dir = workdir or tmp.name
        hf_models = (
            to_transformers(target, os.path.join(base_dir, "target")),
            to_transformers(draft, os.path.join(base_dir, "draft")),
        )
    hf_target, hf_draft = hf_models
    padded = pad_batches(rows, batch_size=1, pad_id=target.config.pad_id)
    result = {
        "gamma": gamma,
        "num_inputs": len(rows),
        "max_decode_length": max_decode_length,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        **environment(),
    }
    modes = {}
    for t in temperatures:
        modes.setdefault("greedy" if t == 0 else "sampling", float(t))
    for mode, temp in modes.items():
        kw = dict(max_decode_length=max_decode_length, temperature=temp)
        hkw = dict(max_new_tokens=max_decode_length, temperature=temp)

        def spec(i, kw=kw):
            return finish(
                speculative_sample(target, draft, padded[i], rng=jax.random.PRNGKey(seed + i), gamma=gamma, **kw)
            )

        def base(i, kw=kw):
            return finish(temperature_sample(target, padded[i], rng=jax.random.PRNGKey(seed + i), **kw))

        def hfa(i, hkw=hkw):
            return hf_generate(hf_target, rows[i], assistant=hf_draft, gamma=gamma, seed=seed + i, **hkw)

        def hfp(i, hkw=hkw):
            return hf_generate(hf_target, rows[i], seed=seed + i, **hkw)

        spec(0), base(0), hfa(0), hfp(0)  # warm-up / compile, untimed
        secs = {"specjax_spec_s": 0.0, "specjax_base_s": 0.0, "hf_assisted_s": 0.0, "hf_plain_s": 0.0}
        toks = {k[:-2] + "_tokens": 0 for k in secs}
        drafted = accepted = verified = 0
        beta = 0.0
        matches_a = matches_p = 0
        mismatches = []
        fns = [("specjax_spec_s", spec), ("specjax_base_s", base), ("hf_assisted_s", hfa), ("hf_plain_s", hfp)]
        for i in range(len(rows)):
            order = fns if i % 2 == 0 else fns[::-1]
            outs = {}
            for name, fn in order:
                t0 = time.perf_counter()
                r = fn(i)
                dt = time.perf_counter() - t0
                secs[name] += dt
                if name.startswith("hf"):
                    seq = r[0][0]
                else:
                    seq = np.asarray(r.sequences)[0][: int(np.asarray(r.lengths)[0])]
                    if name == "specjax_spec_s":
                        drafted += int(np.asarray(r.num_draft_tokens).sum())
                        accepted += int(np.asarray(r.num_accepted).sum())
                        if getattr(r, "beta_sum", None) is not None:
                            beta += float(np.asarray(r.beta_sum).sum())
                            verified += int(np.asarray(r.num_verified).sum())
                outs[name] = np.asarray(seq, np.int32)
                toks[name[:-2] + "_tokens"] += len(seq)
            if mode == "greedy":
                ours = outs["specjax_spec_s"]
                ok_a = np.array_equal(ours, outs["hf_assisted_s"])
                ok_p = np.array_equal(ours, outs["hf_plain_s"])
                matches_a += ok_a
                matches_p += ok_p
                if not ok_a or not ok_p:
                    other = outs["hf_assisted_s"] if not ok_a else outs["hf_plain_s"]
                    mismatches.append(
                        {
                            "input": i,
                            "which": "assisted" if not ok_a else "plain",
                            **_diagnose(target, rows[i], ours, other),
                        }
                    )
            if on_item:
                on_item()
        entry = {
            "temperature": temp,
            **secs,
            **toks,
            "hf_assisted_over_specjax_spec": secs["hf_assisted_s"] / secs["specjax_spec_s"],
            "hf_plain_over_specjax_base": secs["hf_plain_s"] / secs["specjax_base_s"],
            "hf_plain_over_specjax_spec": secs["hf_plain_s"] / secs["specjax_spec_s"],
            "specjax_speedup": secs["specjax_base_s"] / secs["specjax_spec_s"],
            "hf_assisted_speedup": secs["hf_plain_s"] / secs["hf_assisted_s"],
            "specjax_accepted_fraction": accepted / drafted if drafted else float("nan"),
            "specjax_alpha": beta / verified if verified else None,
        }
        if mode == "greedy":
            entry.update(matches_assisted=int(matches_a), matches_plain=int(matches_p), mismatches=mismatches)
        result[mode] = entry
    return result


def batch_scaling(
    target: T5Model,
    draft: T5Model,
    rows: Sequence[Sequence[int]],
    *,
    gamma: int,
    max_decode_length: int,
    batch_sizes: Sequence[int] = (1, 4, 16, 32),
    seed: int = 0,
    hf_target=None,
    on_step: Callable[[], None] | None = None,
) -> list[dict]:
    """Greedy throughput (output tokens per second) against batch size.

    The inputs are cycled up to a multiple of the largest batch size so every batch size decodes the same
    inputs; each method is compiled / warmed up on one batch first (untimed).

    Args:
      rows: token id lists (with EOS).
      hf_target: a transformers T5 (``to_transformers``) to time plain ``generate`` at each batch size;
        None skips transformers. (transformers refuses assisted generation at batch > 1.)
    Returns:
      one dict per batch size: ``batch_size``, ``num_inputs``, ``specjax_spec_tokens_per_s``,
      ``specjax_base_tokens_per_s``, ``hf_plain_tokens_per_s`` (when ``hf_target``), and
      ``*_over_batch1`` ratios of each against batch 1.
    """
    import jax

    biggest = max(batch_sizes)
    n = -(-max(len(rows), biggest) // biggest) * biggest
    inputs = [rows[i % len(rows)] for i in range(n)]
    L = max(8, 1 << (max(len(r) for r in inputs) - 1).bit_length())
    out = []
    for bs in batch_sizes:
        batches = pad_batches(inputs, batch_size=bs, length=L, pad_id=target.config.pad_id)
        rec = {"batch_size": bs, "num_inputs": n, "gamma": gamma}
        methods = {
            "specjax_spec": lambda x, j: speculative_sample(
                target,
                draft,
                x,
                rng=jax.random.PRNGKey(seed + j),
                gamma=gamma,
                max_decode_length=max_decode_length,
                temperature=0.0,
            ),
            "specjax_base": lambda x, j: temperature_sample(
                target, x, rng=jax.random.PRNGKey(seed + j), max_decode_length=max_decode_length, temperature=0.0
            ),
        }
        for name, fn in methods.items():
            fn(batches[0], 0)  # compile
            tokens, t0 = 0, time.perf_counter()
            for j, x in enumerate(batches):
                tokens += int(np.asarray(finish(fn(x, j)).lengths).sum())
            rec[f"{name}_tokens_per_s"] = tokens / (time.perf_counter() - t0)
        if hf_target is not None:
            hf_generate(hf_target, batches[0], max_new_tokens=max_decode_length)  # warm-up
            tokens, secs = 0, 0.0
            for x in batches:
                seqs, dt = hf_generate(hf_target, x, max_new_tokens=max_decode_length)
                tokens += sum(len(s) for s in seqs)
                secs += dt
            rec["hf_plain_tokens_per_s"] = tokens / secs
        out.append(rec)
        if on_step:
            on_step()
    first = out[0]
    for rec in out:
        for k in [k for k in rec if k.endswith("_tokens_per_s")]:
            rec[k.replace("_tokens_per_s", "_over_batch1")] = rec[k] / first[k]
    return out


def format_comparison(result: dict) -> str:
    """Markdown table of ``compare_with_transformers`` output, with the greedy token check and its reasons."""
    lines = [
        f"specjax vs transformers {result['transformers']} (torch {result['torch']}, "
        f"{result['torch_threads']} threads), float32, batch 1, γ={result['gamma']}, "
        f"{result['num_inputs']} inputs, max_decode_length={result['max_decode_length']}",
        "",
        "| mode | specjax spec s | specjax base s | HF assisted s | HF plain s | HF assisted / specjax spec "
        "| HF plain / specjax base | specjax speedup | HF assisted speedup | specjax α | specjax accepted fraction |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in ("greedy", "sampling"):
        if mode in result:
            e = result[mode]
            lines.append(
                f"| {mode} (T={e['temperature']:g}) | {e['specjax_spec_s']:.3f} | {e['specjax_base_s']:.3f} | "
                f"{e['hf_assisted_s']:.3f} | {e['hf_plain_s']:.3f} | "
                f"{e['hf_assisted_over_specjax_spec']:.2f}x | {e['hf_plain_over_specjax_base']:.2f}x | "
                f"{e['specjax_speedup']:.2f}x | {e['hf_assisted_speedup']:.2f}x | "
                f"{'' if e.get('specjax_alpha') is None else format(e['specjax_alpha'], '.3f')} | "
                f"{e['specjax_accepted_fraction']:.3f} |"
            )
    if "greedy" in result:
        e = result["greedy"]
        lines += [
            "",
            f"greedy tokens equal to specjax speculative_sample: transformers assisted "
            f"{e['matches_assisted']}/{result['num_inputs']}, plain {e['matches_plain']}/{result['num_inputs']}",
        ]
        for m in e["mismatches"]:
            lines.append(
                f"  input {m['input']} ({m['which']}): first difference at position {m['position']} "
                f"(ours {m['ours']}, transformers {m['hf']}); "
                + (f"target top-2 logit gap {m['top2_logit_gap']:.2e}; " if "top2_logit_gap" in m else "")
                + m["explanation"]
            )
    return "\n".join(lines) + "\n"


def format_scaling(records: Sequence[dict]) -> str:
    """Markdown table of ``batch_scaling`` output (tokens per second and ratio to batch 1)."""
    has_hf = any("hf_plain_tokens_per_s" in r for r in records)
    head = "| batch | specjax speculative tok/s | x batch 1 | specjax temperature_sample tok/s | x batch 1 |"
    sep = "|---|---|---|---|---|"
    if has_hf:
        head += " HF generate tok/s | x batch 1 |"
        sep += "---|---|"
    lines = [
        f"greedy throughput against batch size (γ={records[0]['gamma']}, {records[0]['num_inputs']} inputs; "
        "transformers refuses an assistant at batch > 1, so its column is plain generate)",
        "",
        head,
        sep,
    ]
    for r in records:
        line = (
            f"| {r['batch_size']} | {r['specjax_spec_tokens_per_s']:.1f} | {r['specjax_spec_over_batch1']:.2f} | "
            f"{r['specjax_base_tokens_per_s']:.1f} | {r['specjax_base_over_batch1']:.2f} |"
        )
        if has_hf:
            plain, over = r.get("hf_plain_tokens_per_s", float("nan")), r.get("hf_plain_over_batch1", float("nan"))
            line += f" {plain:.1f} | {over:.2f} |"
        lines.append(line)
    return "\n".join(lines) + "\n"
