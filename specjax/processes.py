"""Several processes of one bulk decode (a multi-host slice, ``jax.process_count() > 1``): each process's share of
the input, and the merge of every process's results into one stream in input order (JAX's multi-controller
runtime: ``process_allgather``; every process runs the merge in step, no scheduler). ``specjax.bulk`` uses them;
``specjax.launch`` starts the processes on one machine.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Iterator

import jax
import numpy as np

from specjax.decoding.result import LineResult

__all__ = ["merge_processes", "process_share"]


def process_share(pairs: Iterable, process_index: int, process_count: int) -> Iterator:
    """This process's share of the input: the ``(index, row)`` pairs at positions ``process_index``,
    ``process_index + process_count``, ... (line ``i`` of a run goes to process ``i mod process_count``, so
    every process gets lines of every length, and the shares differ by at most one line). One process: all.

    Raises:
      ValueError: ``process_index`` not in ``[0, process_count)``.
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} is not in [0, {process_count}) (jax.process_index()).")
    return iter(pairs) if process_count == 1 else itertools.islice(pairs, process_index, None, process_count)


_PACKED_COUNTERS = {  # packed name -> LineResult field (int32)
    "target_calls": "num_target_calls",
    "draft_tokens": "num_draft_tokens",
    "accepted": "num_accepted",
    "num_verified": "num_verified",
    "gamma": "gamma",
}


def _pack(results: list, lines: int, max_decode_length: int) -> dict:
    """Up to ``lines`` ``LineResult``s as fixed-shape NumPy arrays (the same on every process, as
    ``process_allgather`` needs): count int32[], index int32[lines], length int32[lines], tokens
    int32[lines, T], the counters int32[lines], beta_sum float32[lines]; rows past ``count`` are zeros."""
    n = len(results)
    out = dict(
        count=np.int32(n),
        index=np.zeros((lines,), np.int32),
        length=np.zeros((lines,), np.int32),
        tokens=np.zeros((lines, max_decode_length), np.int32),
        beta_sum=np.zeros((lines,), np.float32),
        **{k: np.zeros((lines,), np.int32) for k in _PACKED_COUNTERS},
    )
    for j, r in enumerate(results):
        out["index"][j], out["length"][j] = r.index, len(r.tokens)
        out["tokens"][j, : len(r.tokens)] = r.tokens
        out["beta_sum"][j] = r.beta_sum
        for k, field in _PACKED_COUNTERS.items():
            out[k][j] = getattr(r, field)
    return out


def _unpack(gathered: dict) -> list:
    """Every process's ``_pack`` (each array with a leading process axis [P, ...]) as ``LineResult``s sorted by
    index."""
    out = []
    for p in range(len(gathered["count"])):
        for j in range(int(gathered["count"][p])):
            n = int(gathered["length"][p][j])
            out.append(
                LineResult(
                    int(gathered["index"][p][j]),
                    np.array(gathered["tokens"][p][j, :n], np.int32),
                    int(gathered["target_calls"][p][j]),
                    int(gathered["draft_tokens"][p][j]),
                    int(gathered["accepted"][p][j]),
                    float(gathered["beta_sum"][p][j]),
                    int(gathered["num_verified"][p][j]),
                    int(gathered["gamma"][p][j]),
                )
            )
    return sorted(out, key=lambda r: r.index)


def _allgather(tree: dict) -> dict:
    """``multihost_utils.process_allgather(tree, tiled=False)``: every process's arrays stacked [P, ...]."""
    from jax.experimental import multihost_utils

    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=False))


def _processes() -> tuple[int, int, Callable[[dict], dict]]:
    """(this process's index, the process count, the exchange of ``merge_processes``): JAX's multi-controller
    runtime (``jax.process_index()``, ``jax.process_count()``, ``process_allgather``)."""
    return jax.process_index(), jax.process_count(), _allgather


def merge_processes(
    local: Iterator[LineResult],
    exchange: Callable[[dict], dict] | None,
    lines_per_round: int,
    max_decode_length: int,
) -> Iterator[LineResult]:
    """Merges every process's results into one stream in input order (JAX's multi-controller runtime: every
    process runs this in step; no scheduler).

    Round after round, each process takes the next ``lines_per_round`` results of its own ``local`` stream (its
    ``process_share``, in order), packs them into fixed-shape arrays and calls ``exchange`` (a collective:
    ``process_allgather``); every process then yields the round's results of all processes sorted by index.
    With round-robin shares a round holds a contiguous run of lines (process ``p``'s ``j``-th line is line
    ``j·P + p``), so the stream is in input order. The rounds end when no process has results left.

    Args:
      local: this process's ``LineResult``s in input order.
      exchange: {name: array} -> {name: array [P, ...]}, every process's arrays stacked; None:
        ``multihost_utils.process_allgather(tree, tiled=False)``.
      lines_per_round: results per process per round (memory: ``P × lines_per_round`` results).
      max_decode_length: ``T``, the width of the packed tokens.
    Yields:
      ``LineResult``s of every process, in input order.
    """
    exchange = _allgather if exchange is None else exchange
    while True:
        mine = list(itertools.islice(local, lines_per_round))
        merged = _unpack(exchange(_pack(mine, lines_per_round, max_decode_length)))
        if not merged:
            return
        yield from merged
