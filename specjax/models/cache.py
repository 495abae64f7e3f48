"""The decoder's attention memory and its writes: ``Encoded`` (cross-attention keys/values, made once per input),
``KVCache`` (the self-attention cache, fixed shape for a whole decode), ``BranchWindow`` (a branch window's
keys/values, not yet committed), their logical axis names, ``init_cache``, and every write into a cache: a
window's (a scatter, or in-place dynamic slices, ``_write_window``), each branch's own copy of a layer's cache
(``_branch_caches``) and one branch's commit (``commit_branch``).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``t`` decoder length, ``k`` window,
``L`` cache length, ``n`` heads, ``h`` head dim, ``d`` model dim, ``f`` MLP dim, ``v`` vocab, ``l`` layers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax.config import T5Config


class Encoded(NamedTuple):
    """What the decoder needs from the encoder, computed once per input.

    Stored per layer, heads first, in the layouts the two attention dot products read without a copy: keys
    [b, n, h, s] (the contracted head dim before the positions, as a matrix product ``q [t, h] @ k [h, s]``
    wants it) and values [b, n, s, h] (``weights [t, s] @ v [s, h]``). With keys [b, n, s, h], XLA:CPU
    transposed every layer's keys in every decode step (a copy the size of the keys; 6 of them were 3-4 % of
    the small target's step, ``benchmarks/results/small_pair/2026-12-06_loop_profile.md``), since they are made outside
    the decode loop and it cannot choose their layout there.

    Attributes:
      mask: bool[b, s], True at real (non-pad) encoder tokens.                 axes ("batch", "length")
      cross_k: tuple of l arrays [b, n, h, s], cross-attention keys of each decoder layer (compute dtype).
                                                                axes ("batch", "heads", "kv", "length")
      cross_v: tuple of l arrays [b, n, s, h], cross-attention values.
                                                                axes ("batch", "heads", "length", "kv")
    """

    mask: jax.Array
    cross_k: tuple[jax.Array, ...]
    cross_v: tuple[jax.Array, ...]


class KVCache(NamedTuple):
    """Decoder self-attention cache, fixed shape for a whole decode.

    One array per layer, heads before slots ([b, n, L, h]): the layout the attention dot products read,
    so a step writes its ``k`` new slots per row in place (a scatter) and reads the cache without a copy.

    Attributes:
      k: tuple of l arrays [b, n, L, h]; slot ``i`` holds the key of decoder position ``i`` once written.
                                                                axes ("batch", "heads", "length", "kv")
      v: tuple of l arrays [b, n, L, h], values.                              axes as ``k``
    A row's slots at or beyond its current position are stale and masked by ``decode``.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


class BranchWindow(NamedTuple):
    """The keys/values a branch window computed (``decode_branches``), not yet in the cache.

    ``m = k · w`` query rows per batch row, branch-major (row ``j · w + i`` is branch ``j``'s ``i``-th token).

    Attributes:
      k: tuple of l arrays [b, m, n, h] (stacked: one array [l, b, m, n, h]), the window's self-attention keys.
      v: values, as ``k``.
    ``commit_branch`` writes one branch's ``w`` entries into the cache.
    """

    k: Any
    v: Any


# Logical axis names of every leaf (``specjax.parallel`` maps them to mesh axes).
ENCODED_AXES = Encoded(
    mask=("batch", "length"), cross_k=("batch", "heads", "kv", "length"), cross_v=("batch", "heads", "length", "kv")
)
CACHE_AXES = KVCache(k=("batch", "heads", "length", "kv"), v=("batch", "heads", "length", "kv"))


def logical_axes(tree):
    """The logical axis names of each leaf of an ``Encoded`` or ``KVCache``: a pytree of the same
    structure whose leaves are tuples of names (e.g. ``("batch", "heads", "length", "kv")``)."""
    axes = ENCODED_AXES if isinstance(tree, Encoded) else CACHE_AXES
    return type(tree)(*(f if not isinstance(x, tuple) else tuple(f for _ in x) for x, f in zip(tree, axes)))


def _branch_caches(cache_bnLh, new_bmnh, positions_b, width: int):
    """Each branch's own copy of a layer's self-attention keys or values: the committed cache with that branch's
    window written at its slots, as a chain window of the branch's tokens writes it (``Decoder.__call__``).

    cache [b, n, L, h]; new [b, m, n, h], ``m = k · w`` branch-major; positions int32[b] -> [b · k, n, L, h],
    row ``i · k + j`` branch ``j`` of row ``i`` (slots past ``L`` dropped, never clamped). A copy of the cache per
    branch, so that every branch's attention reads its keys/values at the slots, and in the dtype, the chain
    window's attention reads them: the same dots over the same cache length, bit for bit (``decode_branches``).
    """
    b, m = new_bmnh.shape[:2]
    k = m // width
    rows = jnp.arange(b * k)[:, None]
    query_pos = jnp.repeat(positions_b, k)[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]  # [b · k, w]
    forked = jnp.repeat(cache_bnLh, k, axis=0)  # [b · k, n, L, h]
    new_bkwnh = new_bmnh.reshape((b * k, width) + new_bmnh.shape[2:])
    return forked.at[rows, :, query_pos].set(new_bkwnh.astype(forked.dtype), mode="drop")


SLICE_ROWS_MAX = 1
"""``slice_rows`` (``Transformer``) applies to windows of at most this many rows (batch 1, the paper's setting);
bigger batches keep the scatter. A dynamic slice at a given row of a cache whose rows are split over devices
("data" > 1) made the SPMD partitioner all-gather the cache: 8 GB of all-gathers per iteration on v4-32 with
data:4,model:4, where the scatter stays per device."""


def _slices_fit(slice_rows: bool, b: int, k: int, cache_len: int) -> bool:
    """Whether a window of ``b`` rows x ``k`` tokens is written with ``_write_window``."""
    return slice_rows and b <= SLICE_ROWS_MAX and k <= cache_len


def _write_window(cache, new_bknh, positions_b, layer=None):
    """The window's keys or values written at each row's slots ``positions_b[i] .. positions_b[i] + k - 1`` of
    ``cache`` [b, n, L, h] (or, with ``layer``, of layer ``layer`` of a stacked cache [l, b, n, L, h]), slots past
    ``L`` dropped: what ``Decoder``'s scatter writes, as one in-place ``dynamic_update_slice`` of k slots per row.

    A window that runs past ``L`` is written at the clamped start ``L - k`` with its tokens shifted right and the
    slots before its first position keeping their old values, so nothing is clamped onto earlier slots. Needs
    ``k <= L`` (``_slices_fit``). new_bknh: [b, k, n, h]; positions_b: int32[b].
    """
    b, k = new_bknh.shape[:2]
    length = cache.shape[-2]
    lead = () if layer is None else (layer,)
    new_bnkh = jnp.swapaxes(new_bknh, 1, 2).astype(cache.dtype)
    start_b = jnp.clip(positions_b, 0, length - k)
    source_bk = jnp.arange(k, dtype=jnp.int32)[None, :] - (positions_b - start_b)[:, None]  # window index per slot
    for i in range(b):
        zero = jnp.zeros((), jnp.int32)
        at = lead + (jnp.asarray(i, jnp.int32), zero, start_b[i], zero)
        size = (1,) * len(lead) + (1, new_bnkh.shape[1], k, new_bnkh.shape[3])
        old = jax.lax.dynamic_slice(cache, at, size)
        moved = jnp.take(new_bnkh[i], jnp.clip(source_bk[i], 0, k - 1), axis=1).reshape(size)
        keep_new = (source_bk[i] >= 0)[:, None]  # [k, 1], broadcast over the leading [.., 1, n] dims
        cache = jax.lax.dynamic_update_slice(cache, jnp.where(keep_new, moved, old), at)
    return cache


def _empty_cache(config: T5Config, batch: int, length: int, dtype=None, stacked: bool = False) -> KVCache:
    shape = (batch, config.num_heads, length, config.head_dim)
    layers = range(config.num_decoder_layers)
    dtype = config.compute_dtype if dtype is None else dtype
    if stacked:
        shape = (config.num_decoder_layers,) + shape
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
    return KVCache(tuple(jnp.zeros(shape, dtype) for _ in layers), tuple(jnp.zeros(shape, dtype) for _ in layers))


def init_cache(config: T5Config, batch: int, length: int, dtype=None, stacked: bool = False) -> KVCache:
    """An empty decoder cache of ``length`` slots (tokens) per row: ``KVCache`` whose ``k`` and ``v`` are
    tuples of l arrays [b, n, L, h] (logical axes ``CACHE_AXES``) in ``dtype``: the compute dtype when None.
    ``stacked``: one array [l, b, n, L, h] each instead, for ``decode_scanned`` (``stacked_logical_axes``).

    ``length`` must cover the last position a window can write (for a decode loop: max_decode_length plus
    the window size); ``decode`` drops writes past it rather than clamping them. A ``dtype`` wider than the
    compute dtype (float32 for a bfloat16 model) holds the compute dtype's values exactly: ``decode`` writes
    keys and values computed in the compute dtype, and its attention rounds its output to the compute dtype,
    so the logits are those of a compute-dtype cache (``specjax.models.adapter.T5Decoding.kv_dtype``).

    Raises:
      ValueError: ``batch`` or ``length`` below 1.
    """
    if batch < 1 or length < 1:
        raise ValueError(f"init_cache needs batch >= 1 and length >= 1, got batch={batch}, length={length}.")
    return _empty_cache(config, batch, length, dtype, stacked)


def commit_branch(cache: KVCache, window: BranchWindow, branch, positions, width: int, slice_rows: bool = False):
    """Writes branch ``branch[b]``'s ``w`` keys/values of a ``decode_branches`` window into each row's slots
    ``positions[b] .. positions[b] + w - 1`` (slots past ``L`` dropped, never clamped): afterwards the cache is
    what a chain ``decode`` of that branch's tokens would have left. Fixed shapes, in place: a scatter, or with
    ``slice_rows`` one ``dynamic_update_slice`` per row (``_write_window``; one-row windows).

    Args:
      cache: ``KVCache``, tuples of l arrays [b, n, L, h] or stacked arrays [l, b, n, L, h].
      window: ``BranchWindow`` of the same layout, keys/values [(l,) b, k · w, n, h].
      branch: int32[b] in [0, k), the branch kept per row. positions: int32[b]. width: ``w``.
      slice_rows: see ``decode``.
    Returns:
      the updated ``KVCache``.
    """
    branch = jnp.asarray(branch, jnp.int32)
    positions = jnp.asarray(positions, jnp.int32)
    stacked = not isinstance(cache.k, tuple)

    def pick(win):  # [(l,) b, k · w, n, h] -> [(l,) b, w, n, h]
        lead = win.shape[:-4]
        b, m, n, h = win.shape[-4:]
        kw = win.reshape(lead + (b, m // width, width, n, h))
        idx = branch.reshape((1,) * len(lead) + (b, 1, 1, 1, 1))
        return jnp.take_along_axis(kw, idx, axis=-4)[..., 0, :, :, :]

    def write(c, new):  # c [(l,) b, n, L, h], new [(l,) b, w, n, h]
        b, length = c.shape[-4], c.shape[-2]
        if stacked:
            if _slices_fit(slice_rows, b, width, length):
                for i in range(c.shape[0]):
                    c = _write_window(c, new[i], positions, layer=i)
                return c
            rows = jnp.arange(b)[:, None]
            query_pos = positions[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
            # Advanced indices around slices: the update is [b, w, l, n, h].
            return c.at[:, rows, :, query_pos].set(jnp.moveaxis(new, 0, 2).astype(c.dtype), mode="drop")
        if _slices_fit(slice_rows, b, width, length):
            return _write_window(c, new, positions)
        rows = jnp.arange(b)[:, None]
        query_pos = positions[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :]
        return c.at[rows, :, query_pos].set(new.astype(c.dtype), mode="drop")

    if stacked:
        return KVCache(write(cache.k, pick(window.k)), write(cache.v, pick(window.v)))
    return KVCache(
        tuple(write(c, pick(x)) for c, x in zip(cache.k, window.k)),
        tuple(write(c, pick(x)) for c, x in zip(cache.v, window.v)),
    )
