"""The input pipeline: plain Python + NumPy over local parallel text files (one sentence per line), a
SentencePiece vocabulary trained on them, token pairs bucketed by length and batched to a token budget."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from specjax.tokenizer import as_tokenizer
from specjax.train.settings import BUCKETS

# ----------------------------------------------------------------------------------------------------------
# Data


def train_sentencepiece(
    texts: Sequence[str | os.PathLike],
    model_prefix: str | os.PathLike,
    vocab_size: int = 8000,
    seed_sentences: int = 200000,
) -> Path:
    """Trains a unigram SentencePiece model with T5's special ids (pad 0, eos 1, unk 2, no bos).

    Args:
      texts: plain-text files, one sentence per line (source and target sides for a joint vocabulary).
      model_prefix: output path without extension; writes ``<prefix>.model`` and ``<prefix>.vocab``.
      vocab_size: pieces (tokens) in the vocabulary.
    Returns:
      The path of the ``.model`` file.
    Source: Kudo & Richardson 2018 (SentencePiece); T5's ``spiece.model`` uses the same id layout.
    """
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=",".join(os.fspath(t) for t in texts),
        model_prefix=os.fspath(model_prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        input_sentence_size=seed_sentences,
        shuffle_input_sentence=True,
        num_threads=2,
        minloglevel=2,
    )
    return Path(f"{os.fspath(model_prefix)}.model")


def read_parallel(source: str | os.PathLike, target: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Reads two line-aligned text files; drops pairs where either side is empty.

    Raises:
      FileNotFoundError: a file is missing. ValueError: the files have different line counts.
    """
    src = Path(source).read_text(encoding="utf-8").splitlines()
    tgt = Path(target).read_text(encoding="utf-8").splitlines()
    if len(src) != len(tgt):
        raise ValueError(f"{source} has {len(src)} lines but {target} has {len(tgt)}: they must be aligned.")
    pairs = [(s.strip(), t.strip()) for s, t in zip(src, tgt) if s.strip() and t.strip()]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def tokenize_pairs(tokenizer, sources: Sequence[str], targets: Sequence[str | Sequence[int]]):
    """Token ids per pair (EOS appended), truncated to the largest bucket (``BUCKETS[-1]`` tokens).

    ``targets`` may already be token id lists (e.g. a teacher's outputs, EOS included).
    Returns (src, tgt): lists of int32 arrays.
    """
    tokenizer = as_tokenizer(tokenizer)  # also a seqio.SentencePieceVocabulary or a model path
    cap = BUCKETS[-1]

    def clip(ids):
        ids = list(ids)
        return np.asarray(ids[: cap - 1] + [1] if len(ids) > cap else ids, np.int32)

    src = [clip(tokenizer.encode(s)) for s in sources]
    tgt = [clip(t) if not isinstance(t, str) else clip(tokenizer.encode(t)) for t in targets]
    return src, tgt


def _bucket(n: int) -> int:
    return next(b for b in BUCKETS if b >= n)


def _by_bucket(src: Sequence[np.ndarray], tgt: Sequence[np.ndarray]) -> dict[int, list[int]]:
    """Pair indices per length bucket (the first of ``BUCKETS`` >= both sides), in input order."""
    by_bucket: dict[int, list[int]] = {}
    for i, (s, t) in enumerate(zip(src, tgt)):
        by_bucket.setdefault(_bucket(max(len(s), len(t))), []).append(i)
    return by_bucket


def batches(
    src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], tokens_per_batch: int, seed: int, epoch: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """One epoch of padded batches, deterministic in (seed, epoch).

    Pairs are grouped by bucket (``BUCKETS``, the first length >= both sides), shuffled within the bucket,
    cut into batches of ``tokens_per_batch // bucket`` rows, and the batches shuffled.
    Returns a list of (encoder_input_tokens int32[b, L], decoder_target_tokens int32[b, L],
    index int64[b] of the pairs used).
    """
    rng = np.random.default_rng([seed, epoch])
    by_bucket = _by_bucket(src, tgt)
    out = []
    for length, idx in sorted(by_bucket.items()):
        idx = np.asarray(idx)
        rng.shuffle(idx)
        rows = tokens_per_batch // length
        for start in range(0, len(idx) - rows + 1, rows):  # drop the ragged tail: fixed shapes
            sel = idx[start : start + rows]
            enc = np.zeros((rows, length), np.int32)
            dec = np.zeros((rows, length), np.int32)
            for r, i in enumerate(sel):
                enc[r, : len(src[i])] = src[i]
                dec[r, : len(tgt[i])] = tgt[i]
            out.append((enc, dec, sel))
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def steps_for_epochs(src, tgt, tokens_per_batch: int, epochs: float) -> int:
    """Number of optimizer steps covering ``epochs`` passes over the data (batches per epoch × epochs)."""
    return max(1, math.ceil(len(batches(src, tgt, tokens_per_batch, 0, 0)) * epochs))
