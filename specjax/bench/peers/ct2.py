"""CTranslate2 (``compare_with_ctranslate2``): the target converted with CTranslate2's own converter
(``ctranslate2.converters.TransformersConverter``) from the Hugging Face export, run greedy at float32 and
int8 with 1 and 2 threads beside specjax's temperature_sample and speculative_sample on the same inputs.
CTranslate2 has no speculative decoding; it is what a CPU user would pick for fast T5.

ctranslate2 is imported only inside this module's functions; the conversion starts from ``to_transformers``
(PyTorch and transformers).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Callable, Sequence

import numpy as np

from specjax.bench.inputs import pad_batches
from specjax.bench.peers.hf import to_transformers
from specjax.bench.timing import environment, finish
from specjax.decoding import speculative_sample, temperature_sample
from specjax.models.t5 import T5Model


def _import_ct2():
    try:
        import ctranslate2
    except ImportError as e:
        raise ImportError("The CTranslate2 comparison needs ctranslate2: pip install 'specjax[bench]'") from e
    return ctranslate2


def _id_token(i: int) -> str:
    """CTranslate2 takes tokens as strings; the converted model's vocabulary is one string per id."""
    return f"<id{i}>"


class _IdVocabulary:
    """The part of a Hugging Face tokenizer CTranslate2's T5 loader reads (``get_vocab``, the special tokens and
    ``convert_ids_to_tokens``), with one string per id, so token ids go in and come out unchanged, whatever
    SentencePiece model the pair uses (or none, for random test models)."""

    def __init__(self, vocab_size: int, pad_id: int, eos_id: int, unk_id: int = 2):
        self._vocab = {_id_token(i): i for i in range(vocab_size)}
        self.pad_token, self.eos_token = _id_token(pad_id), _id_token(eos_id)
        self.unk_token = _id_token(unk_id if unk_id < vocab_size else pad_id)

    def get_vocab(self) -> dict:
        return dict(self._vocab)

    def convert_ids_to_tokens(self, i):
        return [_id_token(j) for j in i] if isinstance(i, (list, tuple)) else _id_token(i)


def to_ctranslate2(model: T5Model, path: str | os.PathLike, *, hf_path: str | os.PathLike | None = None) -> str:
    """Converts ``model`` to a CTranslate2 model directory with CTranslate2's own converter.

    The model is exported as a Hugging Face checkpoint (``to_transformers``; at ``hf_path`` or
    ``path``/hf) and converted by ``ctranslate2.converters.TransformersConverter`` without quantization
    (float32 weights; ``int8`` is chosen when loading, ``compute_type="int8"``). The vocabulary is one string
    ``<id{i}>`` per token id (see ``ctranslate2_generate``).

    Returns:
      the CTranslate2 model directory (``path``/ct2).
    Raises:
      ImportError: ctranslate2, torch or transformers missing.
    """
    ctranslate2 = _import_ct2()
    hf_path = os.fspath(hf_path or os.path.join(os.fspath(path), "hf"))
    if not os.path.exists(os.path.join(hf_path, "config.json")):
        to_transformers(model, hf_path)
    cfg = model.config

    class Converter(ctranslate2.converters.TransformersConverter):
        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return _IdVocabulary(cfg.vocab_size, cfg.pad_id, cfg.eos_id)

    out = os.path.join(os.fspath(path), "ct2")
    Converter(hf_path).convert(out, force=True)
    return out


def ctranslate2_generate(
    translator, rows: Sequence[Sequence[int]], *, max_decode_length: int, batch_size: int, eos_id: int = 1
) -> tuple[list[np.ndarray], float]:
    """Greedy CTranslate2 translation of token id rows, timed.

    Args:
      translator: ``ctranslate2.Translator`` of a ``to_ctranslate2`` model.
      rows: token id lists (with EOS), one per input.
      max_decode_length: the most output tokens (CTranslate2 ``max_decoding_length``).
      batch_size: rows per ``translate_batch`` call (CTranslate2 ``max_batch_size``).
    Returns:
      (int32 arrays, one per row: output tokens up to and including the first EOS; seconds of wall time).
    """
    src = [[_id_token(int(i)) for i in r] for r in rows]
    outs, t0 = [], time.perf_counter()
    for start in range(0, len(src), batch_size):
        res = translator.translate_batch(
            src[start : start + batch_size],
            max_batch_size=batch_size,
            beam_size=1,
            max_decoding_length=int(max_decode_length),
            return_end_token=True,
        )
        outs += [r.hypotheses[0] for r in res]
    dt = time.perf_counter() - t0
    return [np.asarray([int(t[3:-1]) for t in toks], np.int32) for toks in outs], dt


def compare_with_ctranslate2(
    target: T5Model,
    draft: T5Model,
    rows: Sequence[Sequence[int]],
    *,
    gammas: Sequence[int],
    max_decode_length: int,
    batch_sizes: Sequence[int] = (1, 32),
    compute_types: Sequence[str] = ("float32", "int8"),
    threads: Sequence[int] = (1, 2),
    repeats: int = 1,
    seed: int = 0,
    workdir: str | None = None,
    on_step: Callable[[], None] | None = None,
) -> dict:
    """specjax temperature_sample and speculative_sample against CTranslate2 on the same target, greedy.

    One process, the same inputs; at each batch size every method is warmed up (specjax compiles there),
    then the methods take turns batch by batch, in an order that rotates each batch, ``repeats`` times.
    CTranslate2 runs the target converted by its own converter (``to_ctranslate2``) at each compute type
    and thread count (``intra_threads``; one translator each). specjax runs float32, as loaded.

    Args:
      rows: token id lists (with EOS), one per input.
      gammas: γ values for speculative_sample; each is timed, and ``best`` names the fastest per batch size.
      batch_sizes: rows per call (the last batch is filled; filler rows are not counted).
    Returns:
      dict with ``num_inputs``, ``max_decode_length``, versions, ``engines`` (CTranslate2 settings) and
      ``records``: one per (batch size, method) with ``method`` ("specjax temperature_sample",
      "specjax speculative γ=g", "ctranslate2 float32 1 thread" …), ``seconds``, ``tokens``, ``tokens_per_s``,
      ``identical`` (lines whose tokens equal specjax temperature_sample's, of ``num_inputs``), and
      ``best`` per batch size: the fastest speculative method, and ratios of its tokens/s over each other
      method's (``spec_over``).
    Raises:
      ImportError: ctranslate2, torch or transformers missing. ValueError: as the decode functions.
    """
    ctranslate2 = _import_ct2()
    import jax

    target = target if target.config.dtype == "float32" else target.astype("float32")
    draft = draft if draft.config.dtype == "float32" else draft.astype("float32")
    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    ct2_dir = to_ctranslate2(target, workdir or tmp.name)
    translators = {
        f"ctranslate2 {ct} {n} thread{'s' if n > 1 else ''}": ctranslate2.Translator(
            ct2_dir, device="cpu", compute_type=ct, inter_threads=1, intra_threads=n
        )
        for ct in compute_types
        for n in threads
    }
    eos, n = target.config.eos_id, len(rows)
    result = {
        "num_inputs": n,
        "max_decode_length": max_decode_length,
        "ctranslate2": ctranslate2.__version__,
        "engines": {
            k: {"compute_type": ct, "intra_threads": t}
            for k, (ct, t) in zip(translators, [(ct, t) for ct in compute_types for t in threads])
        },
        **environment(),
        "records": [],
        "best": {},
    }
    for bs in batch_sizes:
        batches = pad_batches(rows, batch_size=bs, pad_id=target.config.pad_id)

        def specjax_method(gamma, batches=batches, bs=bs):
            def run(i):
                x = batches[i]
                key = jax.random.PRNGKey(seed + i)
                r = finish(
                    speculative_sample(
                        target, draft, x, rng=key, gamma=gamma, temperature=0.0, max_decode_length=max_decode_length
                    )
                    if gamma
                    else temperature_sample(target, x, rng=key, temperature=0.0, max_decode_length=max_decode_length)
                )
                seqs, lens = np.asarray(r.sequences), np.asarray(r.lengths)
                return [s[:m] for s, m in zip(seqs, lens)][: min(bs, n - i * bs)]

            return run

        def ct2_method(tr, bs=bs):
            def run(i):
                return ctranslate2_generate(
                    tr, rows[i * bs : (i + 1) * bs], max_decode_length=max_decode_length, batch_size=bs, eos_id=eos
                )[0]

            return run

        methods = {
            "specjax temperature_sample": specjax_method(0),
            **{f"specjax speculative γ={g}": specjax_method(int(g)) for g in gammas},
            **{name: ct2_method(tr) for name, tr in translators.items()},
        }
        names = list(methods)
        for fn in methods.values():
            fn(0)  # warm-up / compile, untimed
        secs = dict.fromkeys(names, 0.0)
        outs: dict[str, list] = {k: [] for k in names}
        for rep in range(repeats):
            for j in range(len(batches)):
                k = (j + rep) % len(names)
                for name in names[k:] + names[:k]:
                    t0 = time.perf_counter()
                    o = methods[name](j)
                    secs[name] += time.perf_counter() - t0
                    if rep == repeats - 1:
                        outs[name] += o
                if on_step:
                    on_step()
        ref = outs["specjax temperature_sample"]
        recs = {}
        for name in names:
            tokens = sum(len(o) for o in outs[name])
            recs[name] = {
                "batch_size": bs,
                "method": name,
                "seconds": secs[name],
                "tokens": tokens,
                "tokens_per_s": tokens * repeats / secs[name],
                "identical": int(sum(np.array_equal(a, b) for a, b in zip(outs[name], ref))),
            }
        best = max(
            (k for k in names if k.startswith("specjax speculative")),
            key=lambda k: recs[k]["tokens_per_s"],
            default="specjax temperature_sample",
        )
        result["best"][bs] = {
            "method": best,
            "spec_over": {k: recs[best]["tokens_per_s"] / r["tokens_per_s"] for k, r in recs.items() if k != best},
        }
        result["records"] += list(recs.values())
    if tmp is not None:
        tmp.cleanup()
    return result


def format_ctranslate2(result: dict) -> str:
    """Markdown table of ``compare_with_ctranslate2`` output: tokens/s per method and batch size, the best
    speculative method's ratio over each, and the output agreement with specjax temperature_sample."""
    n = result["num_inputs"]
    lines = [
        f"specjax vs CTranslate2 {result['ctranslate2']} on the same target and inputs, greedy, "
        f"{n} inputs, max_decode_length={result['max_decode_length']}; jax {result['jax']} "
        f"{result['backend']} ({result['device_kind']}); one process, methods alternating batch by batch",
        "",
        "| batch | method | tokens/s | best speculative / this | identical to temperature_sample |",
        "|---|---|---|---|---|",
    ]
    for r in result["records"]:
        best = result["best"][r["batch_size"]]
        ratio = best["spec_over"].get(r["method"])
        lines.append(
            f"| {r['batch_size']} | {r['method']}{' (best)' if r['method'] == best['method'] else ''} | "
            f"{r['tokens_per_s']:.1f} | {'' if ratio is None else f'{ratio:.2f}x'} | {r['identical']}/{n} |"
        )
    return "\n".join(lines) + "\n"
