"""Scanned layers (flaxformer's ``scan_layers``): parameters, caches and cross-attention memory stacked on a
leading layers axis (``stack_layers`` / ``unstack_layers`` at the checkpoint boundary, their logical axes), and
``encode``, ``decode`` and ``decode_branches`` with one ``lax.scan`` over the layers: the same contract and values.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``t`` decoder length, ``k`` window,
``L`` cache length, ``n`` heads, ``h`` head dim, ``d`` model dim, ``f`` MLP dim, ``v`` vocab, ``l`` layers.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import T5Config
from specjax.models.cache import (
    CACHE_AXES,
    ENCODED_AXES,
    BranchWindow,
    Encoded,
    KVCache,
    _slices_fit,
    _write_window,
)
from specjax.models.contract import Params, _check_branch_tokens, _check_tokens, param_logical_axes
from specjax.models.layers import NEG_INF, DecoderLayer, EncoderLayer, _layer_branches
from specjax.models.network import Transformer, _causal_bias, _chain_columns

LAYERS_AXIS = "layers"
"""Logical name of the leading axis of stacked (scanned) parameters, caches and memory (``specjax.parallel``'s
rules replicate it: every device holds every layer's slice of a tensor)."""


def _stacks(config: T5Config) -> tuple[tuple[str, int], ...]:
    return (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers))


TRANSPOSED_STACKS = (
    ("decoder", "self_attention", "query"),
    ("decoder", "self_attention", "key"),
    ("decoder", "self_attention", "value"),
    ("decoder", "encoder_decoder_attention", "query"),
)
"""(stack, attention block, kernel) whose stacked kernel is stored transposed, [l, n*h, d] instead of [l, d, n*h]
(``stack_layers``): the layout XLA:TPU's dots in the scanned decode loop read them in (their outputs are moved
heads-first for attention). Stored as [l, d, n*h], a scanned TPU program relaid each of these four stacks out once
per call (a copy: 3.2 GB of temporaries for T5 1.1 XXL on one v4 chip, ``benchmarks/results/scan``)."""


def _transposed(stack: str, path: tuple[str, ...]) -> bool:
    """Whether the stacked leaf at ``path`` (inside ``stack``'s ``layers``) is stored transposed."""
    return len(path) == 3 and path[2] == "kernel" and (stack,) + path[:2] in TRANSPOSED_STACKS


def _swap_last(x):
    """``x`` with its last two axes swapped; a ``jax.ShapeDtypeStruct`` stays abstract (its sharding swapped too)."""
    if not isinstance(x, jax.ShapeDtypeStruct):
        return jnp.swapaxes(x, -1, -2) if not isinstance(x, np.ndarray) else np.swapaxes(x, -1, -2)
    spec = getattr(x.sharding, "spec", None)
    sharding = None
    if spec is not None:
        full = tuple(spec) + (None,) * (len(x.shape) - len(spec))
        sharding = jax.sharding.NamedSharding(
            x.sharding.mesh, jax.sharding.PartitionSpec(*full[:-2], full[-1], full[-2])
        )
    return jax.ShapeDtypeStruct(tuple(x.shape[:-2]) + (x.shape[-1], x.shape[-2]), x.dtype, sharding=sharding)


def _stack_leaves(leaves, transpose: bool = False):
    """l arrays of one shape -> one array [l, ...] (``transpose``: l matrices [i, o] -> [l, o, i]):
    ``jax.ShapeDtypeStruct``s stay abstract (their sharding, if any, gains a replicated leading axis), NumPy
    arrays stay on the host, ``jax.Array``s keep their sharding."""
    if transpose and isinstance(leaves[0], (jax.ShapeDtypeStruct, np.ndarray)):
        leaves = [_swap_last(x) for x in leaves]
        transpose = False
    first = leaves[0]
    sharding = getattr(first, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is not None and transpose:
        full = tuple(spec) + (None,) * (first.ndim - len(spec))
        spec = full[:-2] + (full[-1], full[-2])
    stacked_sharding = (
        jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(None, *spec)) if spec is not None else None
    )
    if isinstance(first, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(leaves),) + tuple(first.shape), first.dtype, sharding=stacked_sharding)
    if isinstance(first, np.ndarray):
        return np.stack(leaves)
    stack = (lambda *xs: jnp.swapaxes(jnp.stack(xs), -1, -2)) if transpose else (lambda *xs: jnp.stack(xs))
    if stacked_sharding is not None and not isinstance(first, jax.core.Tracer):
        return jax.jit(stack, out_shardings=stacked_sharding)(*leaves)
    return stack(*leaves)


def _path_keys(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", k)) for k in path)


def _untranspose_layer(stack: str, layer_params: Params) -> Params:
    """One layer's parameters sliced from the stacked tree, its ``TRANSPOSED_STACKS`` kernels [n*h, d] swapped
    back to the [d, n*h] the layer's modules take (inside a scan: a transposed view, no copy)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.swapaxes(x, -1, -2) if _transposed(stack, _path_keys(path)) else x, layer_params
    )


def stack_layers(config: T5Config, params: Params) -> Params:
    """The parameter tree with each stack's ``layers_0 … layers_{l-1}`` replaced by one ``layers`` subtree whose
    leaves are stacked on a new leading axis (flaxformer's ``scan_layers`` layout): e.g.
    ``decoder/layers/mlp/wo/kernel`` [l, f, d] for l kernels [f, d]. What is not per layer (embedding, relative
    position biases, final norms, logits kernel) is unchanged. The decoder's ``TRANSPOSED_STACKS`` kernels are
    stored transposed, e.g. ``decoder/layers/self_attention/query/kernel`` [l, n*h, d] for l kernels [d, n*h]
    (the layout the scanned loop's dots read; ``stacked_param_logical_axes`` swaps their names too).
    Checkpoints keep the unstacked t5x / Hugging Face layout; this runs at the boundary
    (``T5Model.decoding_model`` on TPU / GPU) and ``unstack_layers`` undoes it.

    Works on arrays (a copy: l slices become one array of the same total bytes, on the slices' devices and with
    their sharding plus a replicated leading axis), NumPy arrays (on the host) and ``jax.ShapeDtypeStruct``s.

    Raises:
      ValueError: a stack lacks one of its ``config.num_*_layers`` layers, or the tree is already stacked.
    """
    out = dict(params)
    for stack, n in _stacks(config):
        sub = dict(params[stack])
        if LAYERS_AXIS in sub:
            raise ValueError(f"stack_layers: {stack}/{LAYERS_AXIS} exists; the parameters are stacked already.")
        missing = [f"layers_{i}" for i in range(n) if f"layers_{i}" not in sub]
        if missing:
            raise ValueError(
                f"stack_layers: {stack} lacks {', '.join(missing)} ({n} layers in the config {config.name!r}); "
                "pass parameters that match the config."
            )
        layers = [sub.pop(f"layers_{i}") for i in range(n)]
        sub[LAYERS_AXIS] = jax.tree_util.tree_map_with_path(
            lambda path, *xs, stack=stack: _stack_leaves(xs, _transposed(stack, _path_keys(path))), *layers
        )
        out[stack] = sub
    return out


def unstack_layers(config: T5Config, params: Params) -> Params:
    """Inverse of ``stack_layers``: each stack's ``layers`` subtree [l, ...] back to ``layers_0 … layers_{l-1}``
    (the t5x checkpoint layout; arrays, NumPy arrays or ``jax.ShapeDtypeStruct``s). Raises ValueError for a tree
    that is not stacked or whose leading axes are not the config's layer counts."""
    out = dict(params)
    for stack, n in _stacks(config):
        sub = dict(params[stack])
        if LAYERS_AXIS not in sub:
            raise ValueError(f"unstack_layers: {stack} has no {LAYERS_AXIS!r} subtree; the parameters are not stacked.")
        layers = sub.pop(LAYERS_AXIS)
        for leaf in jax.tree_util.tree_leaves(layers):
            if leaf.shape[0] != n:
                raise ValueError(
                    f"unstack_layers: {stack}/{LAYERS_AXIS} has a leaf of leading size {leaf.shape[0]}, the config "
                    f"{config.name!r} has {n} layers."
                )
        for i in range(n):
            sub[f"layers_{i}"] = jax.tree_util.tree_map_with_path(
                lambda path, x, i=i, stack=stack: _unstack_leaf(x, i, _transposed(stack, _path_keys(path))), layers
            )
        out[stack] = sub
    return out


def _unstack_leaf(x, i: int, transpose: bool = False):
    """Layer ``i`` of a stacked leaf [l, ...] (``transpose``: [l, o, i] -> [i, o]); a ``jax.ShapeDtypeStruct``
    stays abstract (its sharding loses the leading axis)."""
    if not isinstance(x, jax.ShapeDtypeStruct):
        return _swap_last(x[i]) if transpose else x[i]
    spec = getattr(x.sharding, "spec", None)
    sharding = (
        None if spec is None else jax.sharding.NamedSharding(x.sharding.mesh, jax.sharding.PartitionSpec(*spec[1:]))
    )
    leaf = jax.ShapeDtypeStruct(tuple(x.shape[1:]), x.dtype, sharding=sharding)
    return _swap_last(leaf) if transpose else leaf


def stacked_param_logical_axes(config: T5Config) -> Params:
    """``param_logical_axes`` of the stacked tree (``stack_layers``): per-layer leaves get ``"layers"`` first,
    e.g. ``PartitionSpec("layers", "embed", "mlp")`` for ``decoder/layers/mlp/wi_0/kernel`` [l, d, f]."""
    axes = param_logical_axes(config)
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
    out = dict(axes)
    for stack, n in _stacks(config):
        sub = dict(axes[stack])
        layers = [sub.pop(f"layers_{i}") for i in range(n)]

        def stacked(path, spec, stack=stack):
            names = tuple(spec)
            if _transposed(stack, _path_keys(path)):
                names = names[:-2] + (names[-1], names[-2])
            return jax.sharding.PartitionSpec(LAYERS_AXIS, *names)

        sub[LAYERS_AXIS] = jax.tree_util.tree_map_with_path(stacked, layers[0], is_leaf=is_spec)
        out[stack] = sub
    return out


def stacked_logical_axes(tree):
    """``logical_axes`` of a stacked ``Encoded`` / ``KVCache`` (``encode_scanned``, ``init_cache(stacked=True)``):
    per-layer leaves [l, ...] get ``"layers"`` first, e.g. ``("layers", "batch", "heads", "length", "kv")``."""
    axes = ENCODED_AXES if isinstance(tree, Encoded) else CACHE_AXES
    stacked = lambda x, f: f if x.ndim == len(f) else (LAYERS_AXIS,) + f  # noqa: E731  (the mask is not stacked)
    return type(tree)(*(stacked(x, f) for x, f in zip(tree, axes)))


PerLayer = Callable[[Params], Params]
"""A map applied to one layer's parameters inside the scan body, after ``lax.scan`` slices them from the stacked
tree (in the stacked orientation: ``TRANSPOSED_STACKS`` kernels still [n*h, d]) and before the layer computes with
them. The scanned functions take one as ``per_layer`` (None: the identity); ``T5Decoding.per_layer`` passes its
own (``specjax.quantize.QuantizedDecoding`` dequantizes there: one layer's float kernels live at a time, not the
whole stack's)."""


def _per_layer(per_layer: PerLayer | None) -> PerLayer:
    return (lambda layer_params: layer_params) if per_layer is None else per_layer


def _layers_of(params: Params, stack: str) -> Params:
    layers = params[stack].get(LAYERS_AXIS) if isinstance(params.get(stack), dict) else None
    if layers is None:
        raise ValueError(
            f"the scanned {stack} needs stacked parameters ({stack}/{LAYERS_AXIS}/...); make them with "
            "specjax.models.t5.stack_layers(config, params)."
        )
    return layers


def _encoder_inputs(module: "Transformer", tokens_bs):
    """Embeddings [b, s, d], mask bool[b, s], positions int32[b, s], the padding bias float32[b, 1, 1, s] and
    the self-attention bias float32[b, n, s, s] the layers share (None with per-layer tables: umT5)."""
    mask = tokens_bs != module.config.pad_id
    b, s = tokens_bs.shape
    pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    mask_bias = jnp.where(mask[:, None, None, :], 0.0, NEG_INF)
    shared = None if module.config.per_layer_relpos_bias else module.encoder.relpos_bias(pos, pos) + mask_bias
    return module.token_embedder(tokens_bs), mask, pos, mask_bias, shared


def _layer_encoder_bias(layer: EncoderLayer, pos_bs):
    """A layer's own relative position bias float32[b, n, s, s] (umT5)."""
    return layer.relpos_bias(pos_bs, pos_bs)


def _layer_causal_bias(layer: DecoderLayer, column_bkL, table_len: int):
    """A layer's own causal bias float32[b, n, k, L] (umT5; ``_causal_bias``)."""
    return _causal_bias(layer.relpos_bias, column_bkL, table_len)


def _encoder_norm(module: "Transformer", x_bsd):
    return module.encoder.encoder_norm(x_bsd)


def _decoder_inputs(module: "Transformer", tokens_bk, positions_b, mask_bs, cache_len: int, query_rows=None):
    """Embeddings [b, k, d], query positions int32[b, k], causal columns int32[b, k, L] (``_causal_bias``), the
    self-attention bias float32[b, n, k, L] the layers share (None with per-layer tables: umT5) and the
    cross-attention bias float32[b, 1, 1, s] of a window, as ``Decoder.__call__`` computes them (the biases and
    columns with ``max(k, query_rows)`` rows, the query positions of the k written rows)."""
    k = tokens_bk.shape[1]
    r = max(k, query_rows or k)
    query_pos = positions_b[:, None] + jnp.arange(r, dtype=jnp.int32)[None, :]  # [b, r]
    distance = query_pos[:, :, None] - jnp.arange(cache_len, dtype=jnp.int32)  # [b, r, L]
    column = jnp.where(distance >= 0, distance, cache_len + r)
    shared = None
    if not module.config.per_layer_relpos_bias:
        shared = _causal_bias(module.decoder.relpos_bias, column, cache_len + r)
    cross_bias = jnp.where(mask_bs[:, None, None, :], 0.0, NEG_INF)
    return module.token_embedder(tokens_bk), query_pos[:, :k], column, shared, cross_bias


def _decoder_head(module: "Transformer", y_bkd):
    """Final norm and logits float32[b, k, v] (``Decoder.head``)."""
    return module.decoder.head(y_bkd, module.token_embedder)


def encode_scanned(
    config: T5Config, params: Params, encoder_input_tokens, per_layer: PerLayer | None = None
) -> Encoded:
    """``encode`` with the layers under ``lax.scan``: the same values, one layer's code in the program.

    Args:
      config: the model's config.
      params: stacked parameters (``stack_layers``).
      encoder_input_tokens: int32[b, s], right-padded with ``pad_id``.
      per_layer: applied to each layer's sliced parameters inside the scan bodies (``PerLayer``); None: none.
    Returns:
      ``Encoded`` with stacked memory: mask bool[b, s], cross_k [l, b, n, h, s], cross_v [l, b, n, s, h]
      (compute dtype; logical axes ``stacked_logical_axes``).
    Raises:
      ValueError: unstacked parameters; tokens outside the vocabulary or not a 2-D int array (when concrete).
    """
    _check_tokens(config, encoder_input_tokens, "encoder_input_tokens")
    tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
    encoder_layers, decoder_layers = _layers_of(params, "encoder"), _layers_of(params, "decoder")
    model = Transformer(config)
    x_bsd, mask, pos, mask_bias, shared_bias = model.apply({"params": params}, tokens, method=_encoder_inputs)
    layer = EncoderLayer(config, parent=None)
    per_layer = _per_layer(per_layer)

    def encoder_layer(x, layer_params):
        layer_params = per_layer(layer_params)
        bias = shared_bias
        if bias is None:  # umT5: this layer's own table
            bias = layer.apply({"params": layer_params}, pos, method=_layer_encoder_bias) + mask_bias
        return layer.apply({"params": layer_params}, x, bias), None

    x_bsd, _ = jax.lax.scan(encoder_layer, x_bsd, encoder_layers)
    hidden = model.apply({"params": params}, x_bsd, method=_encoder_norm)
    cross = DecoderLayer(config, parent=None)

    def cross_memory(_, layer_params):
        layer_params = _untranspose_layer("decoder", per_layer(layer_params))
        return None, cross.apply({"params": layer_params}, hidden, method=DecoderLayer.cross_kv)

    _, (cross_k, cross_v) = jax.lax.scan(cross_memory, None, decoder_layers)
    return Encoded(mask, cross_k, cross_v)


def decode_scanned(
    config: T5Config,
    params: Params,
    encoded: Encoded,
    tokens,
    cache: KVCache,
    positions,
    slice_rows: bool = False,
    query_rows: int | None = None,
    per_layer: PerLayer | None = None,
):
    """``decode`` with the layers under ``lax.scan``: the same contract and values.

    The scan carries the window's activations [b, k, d] and the whole stacked cache; layer ``i`` writes the
    window's keys/values into its slice of the stacked cache in place (with ``slice_rows``: one
    ``dynamic_update_slice`` of k slots per row at ``[i, row, :, position, :]``, ``_write_window``; otherwise a
    scatter at each row's slots of the slice, put back with ``dynamic_update_slice``), past ``L`` dropped, and
    attention reads the written slice, so the loop holds one cache buffer and copies no layer's cache out.

    Args:
      config: the model's config.
      params: stacked parameters (``stack_layers``).
      encoded: stacked memory (``encode_scanned``).
      tokens: int32[b, k] decoder input tokens.
      cache: ``KVCache`` of stacked arrays [l, b, n, L, h] (``init_cache(..., stacked=True)``).
      positions: int32[b], the position of each row's first window token.
      slice_rows, query_rows: see ``decode``.
      per_layer: applied to each layer's sliced parameters inside the scan body (``PerLayer``); None: none.
    Returns:
      (logits float32[b, k, v], updated stacked cache).
    Raises:
      ValueError: unstacked parameters.
    """
    decoder_layers = _layers_of(params, "decoder")
    model = Transformer(config, slice_rows=slice_rows)
    cache_len = cache.k.shape[-2]
    positions = jnp.asarray(positions, jnp.int32)
    x_bkd, query_pos, column, shared_bias, cross_bias = model.apply(
        {"params": params},
        jnp.asarray(tokens, jnp.int32),
        positions,
        encoded.mask,
        cache_len,
        query_rows,
        method=_decoder_inputs,
    )
    b, k = x_bkd.shape[:2]
    r = max(k, query_rows or k)
    rows = jnp.arange(b)[:, None]
    in_place = _slices_fit(slice_rows, b, k, cache_len)
    layer = DecoderLayer(config, parent=None)
    per_layer = _per_layer(per_layer)

    def decoder_layer(carry, xs):
        x, cache_k, cache_v = carry  # [b, k, d], [l, b, n, L, h] x 2
        layer_params, cross_k, cross_v, i = xs
        layer_params = _untranspose_layer("decoder", per_layer(layer_params))
        self_bias = shared_bias  # [b, n, k, L]
        if self_bias is None:  # umT5: this layer's own table
            self_bias = layer.apply({"params": layer_params}, column, cache_len + r, method=_layer_causal_bias)

        def write(stacked_lbnLh, new_bknh):
            if in_place:
                return _write_window(stacked_lbnLh, new_bknh, positions, layer=i)
            cache_bnLh = jax.lax.dynamic_index_in_dim(stacked_lbnLh, i, 0, keepdims=False)
            cache_bnLh = cache_bnLh.at[rows, :, query_pos].set(new_bknh.astype(cache_bnLh.dtype), mode="drop")
            return jax.lax.dynamic_update_index_in_dim(stacked_lbnLh, cache_bnLh, i, 0)

        def read(stacked_lbnLh):
            return jax.lax.dynamic_index_in_dim(stacked_lbnLh, i, 0, keepdims=False)

        x, (cache_k, cache_v) = layer.apply(
            {"params": layer_params},
            x,
            (cache_k, cache_v),
            self_bias,
            (cross_k, cross_v),
            cross_bias,
            write,
            read,
            r if r > k else None,
        )
        return (x, cache_k, cache_v), None

    index = jnp.arange(config.num_decoder_layers, dtype=jnp.int32)
    (x_bkd, cache_k, cache_v), _ = jax.lax.scan(
        decoder_layer, (x_bkd, cache.k, cache.v), (decoder_layers, encoded.cross_k, encoded.cross_v, index)
    )
    return model.apply({"params": params}, x_bkd, method=_decoder_head), KVCache(cache_k, cache_v)


def _branch_embed(module: "Transformer", tokens_bm):
    return module.token_embedder(tokens_bm)


def _layer_branches_apply(layer: "DecoderLayer", x, cache_kv, self_bias, positions, width: int, cross_kv, cross_bias):
    return _layer_branches(layer, x, cache_kv, self_bias, positions, width, cross_kv, cross_bias)


def _layer_relpos_bias(layer: "DecoderLayer", column, table_len: int):
    return _causal_bias(layer.relpos_bias, column, table_len)


def _stack_relpos_bias(module: "Transformer", column, table_len: int):
    return _causal_bias(module.decoder.relpos_bias, column, table_len)


def decode_branches_scanned(
    config: T5Config,
    params: Params,
    encoded: Encoded,
    tokens,
    cache: KVCache,
    positions,
    per_layer: PerLayer | None = None,
):
    """``decode_branches`` with the layers under ``lax.scan`` (stacked parameters, memory and cache): the same
    contract and values; the window's keys/values come back stacked, [l, b, k · w, n, h]. ``per_layer``: applied
    to each layer's sliced parameters inside the scan body (``PerLayer``); None: none.

    Raises:
      ValueError: unstacked parameters; tokens that are not [b, k, w].
    """
    _check_branch_tokens(tokens)
    decoder_layers = _layers_of(params, "decoder")
    tokens = jnp.asarray(tokens, jnp.int32)
    b, k, w = tokens.shape
    positions = jnp.asarray(positions, jnp.int32)
    model = Transformer(config)
    cache_len = cache.k.shape[-2]
    x_bmd = model.apply({"params": params}, tokens.reshape(b, k * w), method=_branch_embed)
    column = _chain_columns(positions, w, cache_len)  # [b, w, L]: a chain window's
    table_len = cache_len + w
    cross_bias = jnp.where(encoded.mask[:, None, None, :], 0.0, NEG_INF)
    shared = None
    if not config.per_layer_relpos_bias:
        shared = model.apply({"params": params}, column, table_len, method=_stack_relpos_bias)
    layer = DecoderLayer(config, parent=None)
    per_layer = _per_layer(per_layer)

    def decoder_layer(x, xs):
        layer_params, cache_k, cache_v, cross_k, cross_v = xs
        layer_params = _untranspose_layer("decoder", per_layer(layer_params))
        self_bias = shared
        if self_bias is None:  # umT5: this layer's own table
            self_bias = layer.apply({"params": layer_params}, column, table_len, method=_layer_relpos_bias)
        x, new_kv = layer.apply(
            {"params": layer_params},
            x,
            (cache_k, cache_v),
            self_bias,
            positions,
            w,
            (cross_k, cross_v),
            cross_bias,
            method=_layer_branches_apply,
        )
        return x, new_kv

    x_bmd, (win_k, win_v) = jax.lax.scan(
        decoder_layer, x_bmd, (decoder_layers, cache.k, cache.v, encoded.cross_k, encoded.cross_v)
    )
    logits = model.apply({"params": params}, x_bmd, method=_decoder_head)
    return logits.reshape(b, k, w, -1), BranchWindow(win_k, win_v)
