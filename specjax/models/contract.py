"""The decode contract (DESIGN.md) as pure functions of ``(config, params, ...)``: ``encode`` once per input,
then ``decode`` any window of ``k`` tokens per row at per-row positions against an explicit cache pytree
(``specjax.models.cache``), ``decode_branches`` for ``k`` branches of a row in one call; ``logits`` (teacher
forced, training), and the parameters' initialisation, shapes and logical axes.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``t`` decoder length, ``k`` window,
``L`` cache length, ``n`` heads, ``h`` head dim, ``d`` model dim, ``f`` MLP dim, ``v`` vocab, ``l`` layers.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import T5Config
from specjax.models.cache import Encoded, KVCache
from specjax.models.layers import DROPOUT_STYLES
from specjax.models.network import Transformer

Params = Any


def _check_tokens(config: T5Config, tokens, what: str):
    # Only possible on concrete arrays; under tracing the caller validated earlier.
    if isinstance(tokens, jax.core.Tracer):
        return
    arr = np.asarray(tokens)
    if arr.ndim != 2:
        raise ValueError(f"{what} must be a 2-D int array [batch, length], got shape {arr.shape}.")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must hold integer token ids, got dtype {arr.dtype}.")
    if arr.size and (arr.min() < 0 or arr.max() >= config.vocab_size):
        raise ValueError(
            f"{what} holds token ids outside the vocabulary [0, {config.vocab_size}): min {arr.min()}, "
            f"max {arr.max()}. Was it encoded with the model's own tokenizer?"
        )


def encode(config: T5Config, params: Params, encoder_input_tokens) -> Encoded:
    """Runs the encoder once and precomputes every decoder layer's cross-attention keys/values.

    Args:
      config: the model's config.
      params: the parameter pytree (t5x names, without the ``params`` collection key).
      encoder_input_tokens: int32[b, s], right-padded with ``pad_id``.
    Returns:
      ``Encoded`` (mask [b, s], cross_k tuple of l arrays [b, n, h, s], cross_v of l arrays [b, n, s, h]).
    Raises:
      ValueError: tokens outside the vocabulary or not a 2-D int array (checked when concrete).
    """
    _check_tokens(config, encoder_input_tokens, "encoder_input_tokens")
    return Transformer(config).apply(
        {"params": params}, jnp.asarray(encoder_input_tokens, jnp.int32), method=Transformer.encode
    )[1]


def encoder_outputs(config: T5Config, params: Params, encoder_input_tokens) -> jax.Array:
    """The encoder's final hidden states [b, s, d] (after the final RMSNorm), as t5x ``Transformer.encode``."""
    _check_tokens(config, encoder_input_tokens, "encoder_input_tokens")
    return Transformer(config).apply(
        {"params": params}, jnp.asarray(encoder_input_tokens, jnp.int32), method=Transformer.encode
    )[0]


def decode(
    config: T5Config,
    params: Params,
    encoded: Encoded,
    tokens,
    cache: KVCache,
    positions,
    slice_rows: bool = False,
    query_rows: int | None = None,
):
    """Scores a window of ``k`` decoder tokens per row, each row at its own position.

    Row ``i``'s tokens sit at decoder positions ``positions[i] .. positions[i] + k - 1``; they attend to
    cache slots ``<=`` their own position (older slots hold the row's earlier tokens; slots at or past
    ``positions[i]`` are stale and masked) and their keys/values are written into those slots.
    The same function serves k = 1 (one step) and k = gamma + 1 (a verification window).

    Args:
      config, params: the model.
      encoded: from ``encode``.
      tokens: int32[b, k] decoder input tokens (the first decoder input of a sequence is ``pad_id``).
      cache: ``KVCache`` (tuples of l arrays [b, n, L, h], from ``init_cache``).
      positions: int32[b], the position of each row's first window token.
      slice_rows: write the window into the cache with dynamic slices (``Transformer.slice_rows``; TPU / GPU
        programs); the same values.
      query_rows: None, or a static int > k: the attentions run as for a window of this many rows (the last
        token's query repeated, its position one further each; those rows' outputs dropped), while the
        projections, the MLP and the logits see the k real rows. A step (k = 1) at ``query_rows=2`` gives the
        logits of the first row of a 2-token window bit for bit at half the dense work
        (``specjax.decoding.baseline.STEP_WINDOW``).
    Returns:
      (logits float32[b, k, v], updated cache).
    """
    return Transformer(config, slice_rows=slice_rows).apply(
        {"params": params},
        encoded,
        jnp.asarray(tokens, jnp.int32),
        cache,
        jnp.asarray(positions, jnp.int32),
        query_rows,
        method=Transformer.decode,
    )


def logits(
    config: T5Config,
    params: Params,
    encoder_input_tokens,
    decoder_input_tokens,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    dropout_style: str = "sublayers",
) -> jax.Array:
    """Teacher-forced forward pass: float32 logits [b, t, v] (t5x ``Transformer.__call__``).

    Training passes ``dropout_rate`` > 0 with a ``dropout_rng`` key (T5's dropout on embeddings, every
    sub-layer output and the final norms; Raffel et al. 2020 section 3.1.2 use 0.1 for fine-tuning).
    ``dropout_style``: "sublayers" (the default) drops each element independently on the embeddings, every
    sub-layer output and the two final norms' outputs. "t5x" does what t5x's ``examples/t5/network.py`` does:
    those masks shared along the length axis (one decision per row and feature; the encoder's final one
    excepted), plus dropout on the attention weights (one decision per key, shared by the queries) and on the
    MLP's hidden activations (shared along the length axis).
    Raises ValueError for a ``dropout_rate`` outside [0, 1), a rate without a key, or an unknown style.

    ``decoder_input_tokens`` int32[b, t] are the targets shifted right, starting with ``pad_id`` (0).
    Padded decoder positions are not masked as keys (causal mask only): logits at real target positions
    equal t5x's, whose padding mask only hides keys after the target's end.
    """
    _check_tokens(config, encoder_input_tokens, "encoder_input_tokens")
    _check_tokens(config, decoder_input_tokens, "decoder_input_tokens")
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}.")
    if dropout_rate > 0.0 and dropout_rng is None:
        raise ValueError("dropout_rate > 0 needs a dropout_rng key (jax.random.PRNGKey).")
    if dropout_style not in DROPOUT_STYLES:
        raise ValueError(f"dropout_style must be one of {DROPOUT_STYLES}, got {dropout_style!r}.")
    rngs = {"dropout": dropout_rng} if dropout_rate > 0.0 else {}
    return Transformer(config, dropout_rate, dropout_style).apply(
        {"params": params},
        jnp.asarray(encoder_input_tokens, jnp.int32),
        jnp.asarray(decoder_input_tokens, jnp.int32),
        rngs=rngs,
    )


def _init_boxed(config: T5Config, rng):
    dummy = jnp.ones((1, 2), jnp.int32)
    return Transformer(config).init(rng, dummy, dummy)["params"]


def init_params(config: T5Config, seed: int = 0) -> Params:
    """Random parameters with t5x's initialisers (truncated-normal fan-in kernels, query / sqrt(h),
    unit-normal embedding): a nested dict keyed by t5x names, arrays in ``config.param_dtype``."""
    return nn.unbox(jax.jit(_init_boxed, static_argnums=0)(config, jax.random.PRNGKey(seed)))


@functools.lru_cache(maxsize=32)
def _boxed_shapes_cached(config: T5Config):
    return jax.eval_shape(functools.partial(_init_boxed, config), jax.random.PRNGKey(0))


def _boxed_shapes(config: T5Config):
    """The boxed (logically partitioned) abstract parameters of ``config``: one trace of the model's init per
    config (about 1-3 s for T5-XXL), kept; its consumers only map over it, never change it."""
    try:
        return _boxed_shapes_cached(config)
    except TypeError:  # a config with an unhashable field
        return jax.eval_shape(functools.partial(_init_boxed, config), jax.random.PRNGKey(0))


def abstract_params(config: T5Config) -> Params:
    """``jax.ShapeDtypeStruct`` for every parameter, without allocating (used to check checkpoints)."""
    return nn.unbox(_boxed_shapes(config))


def param_logical_axes(config: T5Config) -> Params:
    """Logical axis names per parameter (``embed heads joined_kv mlp vocab relpos_buckets``), as
    ``jax.sharding.PartitionSpec`` leaves; ``specjax.parallel`` maps them to mesh axes."""
    return nn.get_partition_spec(_boxed_shapes(config))


def count_params(params: Params) -> int:
    """Total number of parameters (scalars) in a pytree."""
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


# Branch windows: k draft continuations of one row scored in one call (multi-draft verification)


def _check_branch_tokens(tokens):
    if np.ndim(tokens) != 3:
        raise ValueError(
            f"decode_branches takes tokens int32[b, k, w] (k branches of w tokens), got shape {np.shape(tokens)}."
        )


def decode_branches(config: T5Config, params: Params, encoded: Encoded, tokens, cache: KVCache, positions):
    """Scores ``k`` branches of ``w`` decoder tokens per row in one call, without writing the cache.

    Branch ``j`` of row ``b`` holds tokens ``tokens[b, j, 0..w-1]`` at decoder positions ``positions[b] ..
    positions[b] + w - 1``. Every branch attends to the row's committed cache slots ``< positions[b]`` (a cache
    slot at or past the position is stale and masked) and to its own earlier tokens and itself, with T5's relative
    position bias of the true distances, exactly as a chain window ``decode`` of its ``w`` tokens does: its
    self-attention reads its own copy of the layer's cache with its window written at its slots (``_branch_caches``:
    ``k`` copies of the cache per layer, transient), over the whole cache length, with the chain window's mask and
    ``fixed_order_softmax``. So a branch's logits are the chain window's bit for bit wherever the dense layers'
    dots round ``k · w`` rows as they round ``w`` (bfloat16 on XLA:CPU: one kernel from 2 to 256 rows; float32
    below about 40 rows; docs/performance.md, "Window invariance"), and greedy multi-draft output is the target
    alone's. All branches share the row's one cross-attention memory (``encoded``: no copy per branch). The cache
    passed in is not written; keep one branch's keys/values with ``commit_branch``.

    Args:
      config, params: the model (unstacked parameters).
      encoded: from ``encode``.
      tokens: int32[b, k, w] decoder input tokens of each branch.
      cache: ``KVCache`` (tuples of l arrays [b, n, L, h]), holding each row's slots ``< positions``.
      positions: int32[b], the decoder position of each branch's first token.
    Returns:
      (logits float32[b, k, w, v], ``BranchWindow`` with keys/values tuples of l arrays [b, k · w, n, h]).
    Raises:
      ValueError: tokens that are not [b, k, w].
    """
    _check_branch_tokens(tokens)
    tokens = jnp.asarray(tokens, jnp.int32)
    b, k, w = tokens.shape
    logits, window = Transformer(config).apply(
        {"params": params},
        encoded,
        tokens.reshape(b, k * w),
        cache,
        jnp.asarray(positions, jnp.int32),
        w,
        method=Transformer.decode_branches,
    )
    return logits.reshape(b, k, w, -1), window
