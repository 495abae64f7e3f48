"""The target as teacher (DistillSpec): its greedy outputs for the sources and its token log-probabilities
along them."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import temperature_sample
from specjax.models import t5
from specjax.models.t5 import T5Model
from specjax.train.data import _bucket, _by_bucket
from specjax.train.settings import BUCKETS
from specjax.train.step import shift_right


def teacher_log_probs(
    teacher: T5Model,
    src: Sequence[np.ndarray],
    tgt: Sequence[np.ndarray],
    path: str | os.PathLike,
    *,
    tokens_per_batch: int = 2048,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """The teacher's next-token log-probabilities at every target position of every pair, computed once.

    DistillSpec's forward KL (Zhou et al. 2023, section 3) needs the teacher's distribution at each position
    of each training target; the teacher is fixed and runs without dropout, so these are the same in every
    epoch and are computed in one forward pass over the data (pairs grouped by ``BUCKETS`` length, fixed
    batch shapes) and kept on disk.

    Args:
      teacher: the target model (its vocabulary is the student's).
      src, tgt: tokenized pairs (int32 arrays, EOS included), as given to ``train``.
      path: the float16 file, [sum of len(tgt[i]), vocab] row-major; ``path + ".index.npy"`` holds the
        int64 row offsets of each pair (len(tgt) + 1). A file whose offsets match is reused (resumable);
        a partial one (``.tmp``) is computed again.
    Returns:
      (log-probabilities float16 memmap [tokens, vocab], offsets int64 [len(tgt) + 1]); pair i's rows are
      ``offsets[i]:offsets[i + 1]``, position t holding log p(tgt[i][t] | src[i], tgt[i][:t]).
    """
    from tqdm.auto import tqdm

    path = Path(path)
    index = Path(str(path) + ".index.npy")
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in tgt])]).astype(np.int64)
    shape = (int(offsets[-1]), teacher.config.vocab_size)
    if path.exists() and index.exists() and np.array_equal(np.load(index), offsets):
        return np.memmap(path, np.float16, "r", shape=shape), offsets
    config = teacher.config

    @jax.jit
    def forward(params, enc, dec):
        return jax.nn.log_softmax(t5.logits(config, params, enc, shift_right(dec)).astype(jnp.float32), axis=-1).astype(
            jnp.float16
        )

    chunks = [
        (length, idx[k : k + tokens_per_batch // length])
        for length, idx in sorted(_by_bucket(src, tgt).items())
        for k in range(0, len(idx), tokens_per_batch // length)
    ]
    tmp = path.with_name(path.name + ".tmp")
    out = np.memmap(tmp, np.float16, "w+", shape=shape)
    for length, sel in tqdm(chunks, desc="teacher log-probabilities", unit="batch", disable=not progress):
        rows = tokens_per_batch // length  # every batch of a bucket has one shape; the last is padded
        enc = np.zeros((rows, length), np.int32)
        dec = np.zeros((rows, length), np.int32)
        for r, i in enumerate(sel):
            enc[r, : len(src[i])], dec[r, : len(tgt[i])] = src[i], tgt[i]
        logp = np.asarray(forward(teacher.params, enc, dec))
        for r, i in enumerate(sel):
            out[offsets[i] : offsets[i + 1]] = logp[r, : len(tgt[i])]
    out.flush()
    del out
    os.replace(tmp, path)
    np.save(index, offsets)
    return np.memmap(path, np.float16, "r", shape=shape), offsets


def _gather_log_probs(log_probs: np.ndarray, offsets: np.ndarray, sel: np.ndarray, shape) -> np.ndarray:
    """One batch's cached teacher log-probabilities, float16[b, L, vocab], zero past each target."""
    out = np.zeros((*shape, log_probs.shape[1]), np.float16)
    for r, i in enumerate(sel):
        out[r, : offsets[i + 1] - offsets[i]] = log_probs[offsets[i] : offsets[i + 1]]
    return out


def teacher_outputs(
    teacher: T5Model,
    src: Sequence[np.ndarray],
    *,
    batch_size: int = 128,
    max_decode_length: int = BUCKETS[-1],
    progress: bool = True,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[np.ndarray]:
    """The teacher's outputs (token ids, EOS included) for every source row: DistillSpec's "target-generated"
    training data (Zhou et al. 2023, section 3; sequence-level KD, Kim & Rush 2016).

    Rows are sorted by length and decoded in padded batches with ``temperature_sample``: greedy at
    ``temperature`` 0 (the default), else sampled from the teacher's distribution at that temperature
    (DistillSpec's sampled teacher data; batch ``j`` of the sorted rows uses key ``fold_in(PRNGKey(seed), j)``,
    so a seed gives the same samples again). Any model can stand in for the teacher (``specjax train
    --student-samples`` draws the draft's own). Returns a list aligned with ``src`` of int32 arrays.
    Raises ValueError for a negative or non-finite ``temperature``.
    """
    if not (math.isfinite(temperature) and temperature >= 0.0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}.")
    from tqdm.auto import tqdm

    order = np.argsort([len(s) for s in src], kind="stable")
    out: list[np.ndarray | None] = [None] * len(src)
    desc = "teacher outputs" if temperature == 0.0 else f"teacher samples (temperature {temperature:g})"
    for start in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", disable=not progress):
        idx = order[start : start + batch_size]
        length = _bucket(max(len(src[i]) for i in idx))
        x = np.zeros((batch_size, length), np.int32)
        for r, i in enumerate(idx):
            x[r, : len(src[i])] = src[i]
        x[len(idx) :] = x[0]  # fixed batch shape; extra rows dropped
        rng = jax.random.fold_in(jax.random.PRNGKey(seed), start // batch_size)
        res = jax.device_get(
            temperature_sample(teacher, x, rng=rng, max_decode_length=max_decode_length, temperature=temperature)
        )
        for r, i in enumerate(idx):
            out[i] = np.asarray(res.sequences[r, : res.lengths[r]], np.int32)
    return out
