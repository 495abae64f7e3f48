"""Bench inputs: text files to token ids to fixed-shape batches, and the default data set.

``MULTI30K_TEST`` is Multi30k's test 2016 Flickr split (1,000 English lines, German references alongside),
read relative to the repository root as the project's data lives in ``../shared/data``.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from specjax.tokenizer import as_tokenizer

__all__ = ["MULTI30K_TEST", "read_lines", "encode_inputs", "pad_batches"]

MULTI30K_TEST = "../shared/data/train/multi30k/test_2016_flickr.en"


def read_lines(path: str, limit: int | None = None) -> list[str]:
    """Stripped lines of a UTF-8 text file (empty lines kept as "" to stay aligned with references), the
    first ``limit`` of them.

    Raises:
      FileNotFoundError: the file is missing (the message says where the shared data lives).
      ValueError: the file is not UTF-8 (the message names the file and line).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Input file {path!r} does not exist (relative paths are read from the current "
            f"directory {os.getcwd()!r}; the project's data lives in ../shared/data)."
        )
    lines = []
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                lines.append(raw.decode("utf-8").rstrip("\n").strip())
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}, line {i}: not UTF-8 ({e.reason}); convert the file with iconv.") from e
            if limit and len(lines) >= limit:
                break
    return lines


def encode_inputs(tokenizer, lines: Sequence[str], prefix: str, max_input_length: int) -> list[list[int]]:
    """Token ids (with EOS) of ``prefix + line``, each truncated to ``max_input_length`` tokens ending in EOS
    (as ``truncate=True`` in the decode functions does), so batches stay small.

    Args:
      tokenizer: a ``specjax.Tokenizer``, a ``seqio.SentencePieceVocabulary`` or a SentencePiece model path
        (``specjax.tokenizer.as_tokenizer``; ``encode`` appends EOS).
    Returns:
      one list of int ids per line.
    """
    tokenizer = as_tokenizer(tokenizer)
    out = []
    for line in lines:
        ids = tokenizer.encode(prefix + line)
        if len(ids) > max_input_length:
            ids = ids[: max_input_length - 1] + [tokenizer.eos_id]
        out.append(ids)
    return out


def pad_batches(
    rows: Sequence[Sequence[int]], batch_size: int, length: int | None = None, pad_id: int = 0
) -> list[np.ndarray]:
    """Token id lists -> int32[batch_size, s] arrays sharing one shape, so a run compiles once.

    The last batch is filled with copies of its first row (callers drop them: count real rows apart);
    s = ``length`` or the next power of two >= the longest row (at least 8).

    Raises:
      ValueError: no rows, or a row longer than ``length``.
    """
    if not rows:
        raise ValueError("No inputs to batch.")
    longest = max(len(r) for r in rows)
    L = length or max(8, 1 << (longest - 1).bit_length())
    if longest > L:
        raise ValueError(f"An input has {longest} tokens, more than the padded length {L}.")
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = list(rows[start : start + batch_size])
        chunk += [chunk[0]] * (batch_size - len(chunk))
        arr = np.full((batch_size, L), pad_id, np.int32)
        for i, r in enumerate(chunk):
            arr[i, : len(r)] = r
        out.append(arr)
    return out
