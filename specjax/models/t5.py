"""Flax T5 (v1.0 and v1.1 / Flan-T5) with an explicit, windowed KV cache.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``t`` decoder length, ``k`` window,
``L`` cache length, ``n`` heads, ``h`` head dim, ``d`` model dim, ``f`` MLP dim, ``v`` vocab, ``l`` layers.

Architecture: Raffel et al. 2020 ("Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer"), section 2.1, as implemented by t5x ``examples/t5/network.py`` (parameter names are t5x's):
pre-norm RMSNorm without mean subtraction, relative position buckets shared by the layers of a stack (umT5:
one table per layer, ``T5Config.per_layer_relpos_bias``), no 1/sqrt(h) scaling inside attention (it is folded
into the query initialisation), ReLU MLP (1.0), tanh-GELU gated MLP (1.1, mT5, umT5, ByT5, MADLAD-400) or
SiLU gated MLP (UL2) (``T5Config.mlp_activations``), logits through the embedding / sqrt(d) (1.0) or an untied
``logits_dense`` (1.1) (``logits_via_embedding``, ``logits_scaling``).

The decode contract (DESIGN.md): ``encode`` once, then ``decode`` any window of ``k`` tokens per row at
per-row positions against an explicit cache pytree. Positions past a row's position hold stale keys that
are masked, then overwritten.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import T5Config

# The decode loops' view of this model (``specjax.models.adapter.T5Decoding``), registered by the adapter when
# ``specjax.models`` is imported: the adapter imports this module, never the reverse.
DECODING_ADAPTER = None

__all__ = [
    "Encoded",
    "KVCache",
    "T5Model",
    "Transformer",
    "encode",
    "decode",
    "init_cache",
    "logits",
    "relative_position_bucket",
    "init_params",
    "param_logical_axes",
    "ENCODED_AXES",
    "CACHE_AXES",
    "logical_axes",
    "LAYERS_AXIS",
    "stack_layers",
    "unstack_layers",
    "stacked_param_logical_axes",
    "stacked_logical_axes",
    "encode_scanned",
    "decode_scanned",
    "BranchWindow",
    "decode_branches",
    "decode_branches_scanned",
    "commit_branch",
]

Params = Any
NEG_INF = -1e10  # t5x's attention mask bias.


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


# ----------------------------------------------------------------------------------------------------------
# Building blocks


def relative_position_bucket(relative_position, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128):
    """Maps ``memory_position - query_position`` (int array, any shape) to a bucket in [0, num_buckets).

    Raffel et al. 2020 section 2.1; the same rule as Mesh TensorFlow ``_relative_position_bucket`` and
    t5x ``RelativePositionBiases._relative_position_bucket``: half the buckets are exact small distances,
    the rest logarithmic up to ``max_distance``; bidirectional splits the buckets between directions.
    """
    ret = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        jnp.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
        / np.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).astype(np.int32)
    val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
    return ret + jnp.where(is_small, n, val_if_large)


DROPOUT_STYLES = ("sublayers", "t5x")


def _dropout(module: nn.Module, x, rate: float, broadcast_dims: tuple[int, ...] = ()):
    """Training-time inverted dropout (t5x applies it to embeddings, every sub-layer output and the final norms).

    Each element of ``x`` (any shape and float dtype) is kept with probability ``1 - rate`` (to 2^-32) and
    scaled by ``1 / (1 - rate)``, else zeroed. A no-op when ``rate`` is 0 (inference): no ``"dropout"`` rng is
    needed then. ``broadcast_dims``: axes along which one decision is shared (flax ``nn.Dropout``'s
    ``broadcast_dims``; t5x shares its masks along the length axis, -2).

    The mask's bits come from XLA's RngBitGenerator with its Threefry algorithm (Salmon et al. 2011, the
    generator ``jax.random``'s default keys use), keyed by 128 bits drawn from the module's ``"dropout"`` rng:
    ``jax.random.bernoulli`` on an "rbg" key asks for XLA's default algorithm, Philox, which XLA:CPU runs
    5x slower (8.5 vs 1.5 ms for a [128, 16, 512] mask; 34 masks were 23 % of the small target's training
    step).
    """
    if rate == 0.0:
        return x
    key = jax.random.bits(module.make_rng("dropout"), (4,), jnp.uint32)
    shape = tuple(1 if i in {d % x.ndim for d in broadcast_dims} else n for i, n in enumerate(x.shape))
    _, bits = jax.lax.rng_bit_generator(key, shape, dtype=jnp.uint32, algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)
    keep = bits >= jnp.uint32(min(round(rate * 2.0**32), 2**32 - 1))
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def _dense_matmul(x, kernel):
    """``x [..., i] @ kernel [i, o]`` in the operands' dtype (``Dense``).

    float32 operands: the plain einsum. bfloat16 operands: the plain einsum's values, forward and backward
    (each product accumulated in float32 and rounded once to bfloat16; bfloat16 is exact in float32), but every
    dot, the backward pass's two included (a custom VJP), is bfloat16 x bfloat16 -> float32, which XLA:CPU runs
    natively (AVX512-BF16: ~1,000 GFLOP/s here for [2048, 512] x [512, 1024]) where it rewrites a bfloat16 ->
    bfloat16 dot into converts and a float32 dot (~470 GFLOP/s): the small target's training step 0.7x.
    Only for these 2-D-kernel products: XLA:CPU's plain dot thunk (batched attention dots with the decode loops'
    options) has no bfloat16 x bfloat16 -> float32 kernel.
    """
    if x.dtype == jnp.float32 or x.dtype != kernel.dtype:
        return jnp.einsum("...i,io->...o", x, kernel)
    return _bf16_dense_matmul(x, kernel)


def _f32_accumulated(spec: str, x, y, dtype):
    return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32).astype(dtype)


@jax.custom_vjp
def _bf16_dense_matmul(x, kernel):
    return _f32_accumulated("...i,io->...o", x, kernel, x.dtype)


def _bf16_dense_matmul_fwd(x, kernel):
    return _bf16_dense_matmul(x, kernel), (x, kernel)


def _bf16_dense_matmul_bwd(residuals, g):
    """dx [..., i] = g [..., o] @ kernel^T, dkernel [i, o] = x^T @ g (summed over the leading dims)."""
    x, kernel = residuals
    g = g.astype(x.dtype)
    return (
        _f32_accumulated("...o,io->...i", g, kernel, x.dtype),
        _f32_accumulated("...i,...o->io", x, g, kernel.dtype),
    )


_bf16_dense_matmul.defvjp(_bf16_dense_matmul_fwd, _bf16_dense_matmul_bwd)


def _halving_tree(x, combine, fill: float):
    """``x`` [..., m] reduced over its last axis by ``combine`` in a halving tree: padded with ``fill`` to the next
    power of two ``w``, then ``combine(x[..., :w/2], x[..., w/2:])`` until one column is left. [...]"""
    m = x.shape[-1]
    w = 1 << max(m - 1, 0).bit_length()
    if w != m:
        x = jnp.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, w - m),), constant_values=fill)
    while w > 1:
        w //= 2
        x = combine(x[..., :w], x[..., w:])
    return x[..., 0]


def fixed_order_sum(x):
    """The sum of ``x`` [..., m] over its last axis in one fixed order: a halving tree of elementwise adds.

    The last axis is zero-padded to the next power of two ``w``, then ``x[..., :w/2] + x[..., w/2:]`` is taken
    until one column is left. Elementwise adds are never reassociated by XLA, so every row's sum is the same
    bits whatever the other dimensions are: the number of rows in a call (a one-token step or a window of γ + 1),
    the batch, and the width ``m`` itself as long as entries past a row's real ones are zeros (masked attention
    weights are exactly 0). XLA's own reductions pick a vectorisation from the whole shape (XLA:CPU: across the
    rows when there are enough of them, along the reduced axis otherwise), which rounds a row's sum differently
    in a window than in a step. Returns [...], in ``x``'s dtype.
    """
    return _halving_tree(x, jnp.add, 0.0)


def fixed_order_max(x):
    """The max of ``x`` [..., m] over its last axis by the same halving tree as ``fixed_order_sum`` (elementwise
    ``maximum``, padded with -inf). A max is exact in any order, but an XLA:CPU reduction fused with what follows
    it changed how that fusion computed ``exp``: ``exp(x - max(x))`` differed in the last bit between a one-token
    step and a window of 4 or more rows (batch 1), where the same exp after this tree did not. Returns [...]."""
    return _halving_tree(x, jnp.maximum, -jnp.inf)


def fixed_order_softmax(scores):
    """``softmax(scores)`` over the last axis from ``fixed_order_max`` and ``fixed_order_sum``: no XLA reduction,
    so each row's weights are the same bits in a window and in a one-token step, whatever the row count."""
    shifted = jnp.exp(scores - jax.lax.stop_gradient(fixed_order_max(scores))[..., None])
    return shifted / fixed_order_sum(shifted)[..., None]


def _param(module: nn.Module, name: str, init, shape, axes, dtype):
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


class RMSNorm(nn.Module):
    """T5 layer norm: ``x / sqrt(mean(x^2) + eps) * scale``, no mean, no bias, computed in float32."""

    config: T5Config

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        scale = _param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",), cfg.weight_dtype)
        x32 = x.astype(jnp.float32)
        mean_square = fixed_order_sum(jnp.square(x32))[..., None] / x32.shape[-1]  # the same bits in any window
        y = x32 * jax.lax.rsqrt(mean_square + cfg.layer_norm_epsilon)
        return (y * scale.astype(jnp.float32)).astype(cfg.compute_dtype)


class Dense(nn.Module):
    """A bias-free kernel ``[in, out]`` (t5x ``DenseGeneral`` flattened to 2-D, as t5x checkpoints store it)."""

    features: int
    axes: tuple[str, str]
    config: T5Config
    init_scale: float = 1.0

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        base = nn.initializers.variance_scaling(self.init_scale, "fan_in", "truncated_normal")
        kernel = _param(self, "kernel", base, (x.shape[-1], self.features), self.axes, cfg.weight_dtype)
        return _dense_matmul(x, kernel.astype(cfg.compute_dtype))


class RelativePositionBias(nn.Module):
    """``rel_embedding[n, buckets]``, turned into an attention bias ``[b, n, q, m]``."""

    bidirectional: bool
    config: T5Config

    def setup(self):
        cfg = self.config
        self.rel_embedding = _param(
            self,
            "rel_embedding",
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            (cfg.num_heads, cfg.relative_attention_num_buckets),
            ("heads", "relpos_buckets"),
            cfg.weight_dtype,
        )

    def __call__(self, query_pos, memory_pos):
        """query_pos: int[b, q]; memory_pos: int[b, m] -> float32 bias [b, n, q, m]."""
        cfg = self.config
        bucket = relative_position_bucket(
            memory_pos[:, None, :] - query_pos[:, :, None],
            self.bidirectional,
            cfg.relative_attention_num_buckets,
            cfg.relative_attention_max_distance,
        )  # [b, q, m]
        bias = jnp.take(self.rel_embedding.astype(jnp.float32), bucket, axis=1)  # [n, b, q, m]
        return jnp.transpose(bias, (1, 0, 2, 3))

    def causal_table(self, length: int):
        """float32 [n, length + 1]: column ``j < length`` is the bias at distance ``query - memory = j``,
        the last column is ``NEG_INF`` (a memory slot after the query). Depends only on the parameters and
        the static cache length, so a decode step gathers from it instead of bucketing every slot."""
        cfg = self.config
        bucket = relative_position_bucket(
            -jnp.arange(length, dtype=jnp.int32),
            self.bidirectional,
            cfg.relative_attention_num_buckets,
            cfg.relative_attention_max_distance,
        )  # [length]
        table = jnp.take(self.rel_embedding.astype(jnp.float32), bucket, axis=1)  # [n, length]
        return jnp.concatenate([table, jnp.full((cfg.num_heads, 1), NEG_INF, jnp.float32)], axis=1)


class Projections(nn.Module):
    """The four attention kernels of one attention block (t5x names ``query key value out``).

    ``dropout_rate``: dropout on the attention weights in training, one decision per key shared by every
    query (t5x ``dot_product_attention`` with ``broadcast_dropout``); 0 (inference, and dropout style
    "sublayers") leaves them alone.
    """

    config: T5Config
    dropout_rate: float = 0.0

    def setup(self):
        cfg = self.config
        inner = cfg.num_heads * cfg.head_dim
        # t5x folds 1/sqrt(h) into the query initialisation instead of scaling the scores.
        self.query = Dense(inner, ("embed", "joined_kv"), cfg, init_scale=1.0 / cfg.head_dim)
        self.key = Dense(inner, ("embed", "joined_kv"), cfg)
        self.value = Dense(inner, ("embed", "joined_kv"), cfg)
        self.out = Dense(cfg.d_model, ("joined_kv", "embed"), cfg)

    def heads(self, dense, x):
        """[b, t, d] -> [b, t, n, h]."""
        y = dense(x)
        return y.reshape(y.shape[:-1] + (self.config.num_heads, self.config.head_dim))

    def q(self, x):
        return self.heads(self.query, x)

    def kv(self, x):
        """[b, s, d] -> keys, values [b, s, n, h]."""
        return self.heads(self.key, x), self.heads(self.value, x)

    def kv_heads_first(self, x):
        """[b, s, d] -> keys, values [b, n, s, h] (the layout ``attend`` reads)."""
        k, v = self.kv(x)
        return jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)

    def kv_memory(self, x):
        """[b, s, d] -> keys [b, n, h, s], values [b, n, s, h]: the cross-attention memory, in the layouts
        ``attend(..., keys_hs=True)`` reads without a copy (``Encoded``)."""
        k, v = self.kv(x)
        return jnp.transpose(k, (0, 2, 3, 1)), jnp.swapaxes(v, 1, 2)

    def attend(self, q_btnh, k_bnsh, v_bnsh, bias_bnts, keys_hs: bool = False, keep_rows: int | None = None):
        """Softmax attention (float32 scores, no 1/sqrt(h) scaling) -> [b, t, d].

        Keys and values are heads-first [b, n, s, h], and the small queries are moved heads-first too
        ([b, n, t, h]) before the dots, so every operand and output of both dot products has its batch dims
        (b, n) leading: XLA:CPU then runs them without transposing copies of its own. On the 2-core CPU the
        small pair's self-attention measured 2.8-4.9x faster so (a bfloat16 window of 6 rows 58 -> 21 µs a
        layer, a float32 one-token step 25 -> 5 µs) and a window's cross-attention 2.4x
        (``benchmarks/attention_layout.py``, ``benchmarks/results/cpu_kernels/``).
        ``keys_hs``: the keys are [b, n, h, s] instead (``kv_memory``). ``keep_rows``: only the first this many
        query rows go through the output projection (``query_rows`` of ``decode``: the copies are dropped).
        """
        cfg = self.config
        q_bnth = jnp.swapaxes(q_btnh, 1, 2)
        scores = jnp.einsum(
            "bnth,bnhs->bnts" if keys_hs else "bnth,bnsh->bnts", q_bnth, k_bnsh, preferred_element_type=jnp.float32
        )
        weights = _dropout(self, fixed_order_softmax(scores + bias_bnts), self.dropout_rate, (-2,))
        weights = weights.astype(cfg.compute_dtype)
        # Values wider than the compute dtype (a float32 cache of a bfloat16 model) give the same products; the
        # output is rounded once to the compute dtype, as the compute-dtype dot rounds its float32 sums.
        out_bnth = jnp.einsum("bnts,bnsh->bnth", weights, v_bnsh).astype(cfg.compute_dtype)
        out_btnh = jnp.swapaxes(out_bnth, 1, 2)
        if keep_rows is not None:
            out_btnh = out_btnh[:, :keep_rows]
        return self.out(out_btnh.reshape(out_btnh.shape[:2] + (cfg.num_heads * cfg.head_dim,)))


def _with_query_rows(q_btnh, rows: int | None):
    """Queries [b, t, n, h] -> [b, max(t, rows), n, h]: the last row repeated (``decode``'s ``query_rows``)."""
    t = q_btnh.shape[1]
    if rows is None or rows <= t:
        return q_btnh
    return jnp.concatenate([q_btnh, jnp.repeat(q_btnh[:, -1:], rows - t, axis=1)], axis=1)


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


_ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": functools.partial(nn.gelu, approximate=True),  # tanh form: t5x "gelu", transformers "gelu_new"
    "gelu_exact": functools.partial(nn.gelu, approximate=False),  # erf form: transformers "gelu"
    "silu": nn.silu,  # x * sigmoid(x): UL2's "gated-silu", transformers "silu" / "swish"
    "linear": lambda x: x,
}


class MLP(nn.Module):
    """T5 feed-forward (t5x ``MlpBlock``): ``wo(act_0(wi_0 x) * act_1(wi_1 x))`` for two activations
    (T5 1.1 / mT5 / umT5: gelu and linear; UL2: silu and linear), ``wo(act(wi x))`` for one (T5 1.0: relu).
    x [b, t, d] -> [b, t, d]; the hidden layer is [b, t, f].

    ``dropout_rate``: dropout on the hidden activations in training, shared along the length axis (t5x
    ``MlpBlock``'s ``intermediate_dropout_rate``); 0 leaves them alone.
    """

    config: T5Config
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        acts = cfg.activations
        names = ("wi",) if len(acts) == 1 else tuple(f"wi_{i}" for i in range(len(acts)))
        h = None
        for act, name in zip(acts, names):
            y = _ACTIVATIONS[act](Dense(cfg.mlp_dim, ("embed", "mlp"), cfg, name=name)(x))  # [b, t, f]
            h = y if h is None else h * y
        return Dense(cfg.d_model, ("mlp", "embed"), cfg, name="wo")(_dropout(self, h, self.dropout_rate, (-2,)))


def _inner_rate(rate: float, style: str) -> float:
    """The dropout rate inside attention (its weights) and the MLP (its hidden layer): t5x's only."""
    if style not in DROPOUT_STYLES:
        raise ValueError(f"dropout style must be one of {DROPOUT_STYLES}, got {style!r}.")
    return rate if style == "t5x" else 0.0


def _length_shared(style: str) -> tuple[int, ...]:
    """Axes the embedding and sub-layer output masks share one decision along: t5x's length axis, or none."""
    return (-2,) if style == "t5x" else ()


class EncoderLayer(nn.Module):
    """One encoder block: x + SelfAttn(RMSNorm(x)), then x + MLP(RMSNorm(x)); x [b, s, d] -> [b, s, d]."""

    config: T5Config
    dropout_rate: float = 0.0
    dropout_style: str = "sublayers"

    def setup(self):
        inner = _inner_rate(self.dropout_rate, self.dropout_style)
        if self.config.per_layer_relpos_bias:  # umT5: this layer's own table (``layers_<i>/relpos_bias``)
            self.relpos_bias = RelativePositionBias(True, self.config)
        self.pre_attention_layer_norm = RMSNorm(self.config)
        self.attention = Projections(self.config, inner)
        self.pre_mlp_layer_norm = RMSNorm(self.config)
        self.mlp = MLP(self.config, inner)

    def __call__(self, x, bias):
        with jax.named_scope("self_attention"):
            y = self.pre_attention_layer_norm(x)
            k, v = self.attention.kv_heads_first(y)
            x = x + _dropout(
                self,
                self.attention.attend(self.attention.q(y), k, v, bias),
                self.dropout_rate,
                _length_shared(self.dropout_style),
            )
        with jax.named_scope("mlp"):
            return x + _dropout(
                self, self.mlp(self.pre_mlp_layer_norm(x)), self.dropout_rate, _length_shared(self.dropout_style)
            )


class DecoderLayer(nn.Module):
    """One decoder block (self-attention over the cache, cross-attention, MLP); x [b, k, d] -> [b, k, d]."""

    config: T5Config
    dropout_rate: float = 0.0
    dropout_style: str = "sublayers"

    def setup(self):
        cfg = self.config
        inner = _inner_rate(self.dropout_rate, self.dropout_style)
        if cfg.per_layer_relpos_bias:  # umT5: this layer's own table (``layers_<i>/relpos_bias``)
            self.relpos_bias = RelativePositionBias(False, cfg)
        self.pre_self_attention_layer_norm = RMSNorm(cfg)
        self.self_attention = Projections(cfg, inner)
        self.pre_cross_attention_layer_norm = RMSNorm(cfg)
        self.encoder_decoder_attention = Projections(cfg, inner)
        self.pre_mlp_layer_norm = RMSNorm(cfg)
        self.mlp = MLP(cfg, inner)

    def cross_kv(self, encoded_bsd):
        """[b, s, d] -> cross-attention keys [b, n, h, s], values [b, n, s, h] (``Encoded``)."""
        return self.encoder_decoder_attention.kv_memory(encoded_bsd)

    def __call__(self, x, self_kv, self_bias, cross_kv, cross_bias, write, read=None, query_rows=None):
        """x: [b, k, d]; self_kv: cached (k, v) [b, n, L, h]; write(cache, new) stores the window.

        ``read``: what attention reads of a written cache (``read(cache)`` [b, n, L, h]); None: the cache itself.
        The scanned decoder passes the whole stacked cache [l, b, n, L, h] as ``self_kv``, writes the window into
        it in place and reads this layer's slice (``decode_scanned``).

        ``query_rows`` (> k): both attentions run with the queries padded to this many rows by repeating the
        last (the biases have this many rows) and keep the first k; the projections and the MLP see k rows.

        Returns (x, (k, v)) with the window's keys/values written into the cache.
        """
        k_rows = x.shape[1] if query_rows is not None and query_rows > x.shape[1] else None
        with jax.named_scope("self_attention"):
            y = self.pre_self_attention_layer_norm(x)
            new_k, new_v = self.self_attention.kv(y)
            k, v = write(self_kv[0], new_k), write(self_kv[1], new_v)
            seen_k, seen_v = (k, v) if read is None else (read(k), read(v))
            x = x + _dropout(
                self,
                self.self_attention.attend(
                    _with_query_rows(self.self_attention.q(y), query_rows), seen_k, seen_v, self_bias, keep_rows=k_rows
                ),
                self.dropout_rate,
                _length_shared(self.dropout_style),
            )
        with jax.named_scope("cross_attention"):
            y = self.pre_cross_attention_layer_norm(x)
            x = x + _dropout(
                self,
                self.encoder_decoder_attention.attend(
                    _with_query_rows(self.encoder_decoder_attention.q(y), query_rows),
                    cross_kv[0],
                    cross_kv[1],
                    cross_bias,
                    keys_hs=True,
                    keep_rows=k_rows,
                ),
                self.dropout_rate,
                _length_shared(self.dropout_style),
            )
        with jax.named_scope("mlp"):
            x = x + _dropout(
                self, self.mlp(self.pre_mlp_layer_norm(x)), self.dropout_rate, _length_shared(self.dropout_style)
            )
        return x, (k, v)


def _layer_branches(layer: "DecoderLayer", x, cache_kv, self_bias, positions, width: int, cross_kv, cross_bias):
    """One decoder block over a branch window (inference only): x [b, m, d] (``m = k · w``, branch-major), cache
    (k, v) [b, n, L, h] read, never written, self_bias float32 [b, n, w, L] (a chain window's at ``positions``
    int32[b]) -> (x [b, m, d], the window's (keys, values) [b, m, n, h]).

    ``DecoderLayer.__call__`` with each branch's self-attention run as a chain window's: its ``w`` query rows over
    its own copy of the cache with its window written in (``_branch_caches``), the full cache length, the chain's
    mask and ``fixed_order_softmax``, so its logits are the chain window's bit for bit. Cross-attention and the
    MLP run on all ``m`` rows at once against the row's one cross-attention memory (no copy per branch)."""
    b, m = x.shape[:2]
    k = m // width
    with jax.named_scope("self_attention"):
        y = layer.pre_self_attention_layer_norm(x)
        new_k, new_v = layer.self_attention.kv(y)  # [b, m, n, h] each
        q = layer.self_attention.q(y)
        out = layer.self_attention.attend(
            q.reshape((b * k, width) + q.shape[2:]),
            _branch_caches(cache_kv[0], new_k, positions, width),
            _branch_caches(cache_kv[1], new_v, positions, width),
            jnp.repeat(self_bias, k, axis=0),
        )  # [b · k, w, d]
        x = x + out.reshape(x.shape)
    with jax.named_scope("cross_attention"):
        y = layer.pre_cross_attention_layer_norm(x)
        x = x + layer.encoder_decoder_attention.attend(
            layer.encoder_decoder_attention.q(y), cross_kv[0], cross_kv[1], cross_bias, keys_hs=True
        )
    with jax.named_scope("mlp"):
        x = x + layer.mlp(layer.pre_mlp_layer_norm(x))
    return x, (new_k, new_v)


class Encoder(nn.Module):
    """Token embeddings [b, s, d] and mask bool[b, s] -> final encoder states [b, s, d] (after RMSNorm)."""

    config: T5Config
    dropout_rate: float = 0.0
    dropout_style: str = "sublayers"

    def setup(self):
        cfg = self.config
        if not cfg.per_layer_relpos_bias:  # T5 / mT5: one table for the stack
            self.relpos_bias = RelativePositionBias(True, cfg)
        self.layers = [
            EncoderLayer(cfg, self.dropout_rate, self.dropout_style, name=f"layers_{i}")
            for i in range(cfg.num_encoder_layers)
        ]
        self.encoder_norm = RMSNorm(cfg)

    def __call__(self, x_bsd, mask_bs):
        b, s = mask_bs.shape
        pos = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
        mask_bias = jnp.where(mask_bs[:, None, None, :], 0.0, NEG_INF)  # [b, 1, 1, s]
        shared = None if self.config.per_layer_relpos_bias else self.relpos_bias(pos, pos) + mask_bias
        x_bsd = _dropout(self, x_bsd, self.dropout_rate, _length_shared(self.dropout_style))
        for layer in self.layers:
            bias = shared if shared is not None else layer.relpos_bias(pos, pos) + mask_bias  # [b, n, s, s]
            x_bsd = layer(x_bsd, bias)
        return _dropout(self, self.encoder_norm(x_bsd), self.dropout_rate)  # t5x shares no decisions on this one


class Decoder(nn.Module):
    """A k-token window at per-row positions against the cache -> (float32 logits [b, k, v], new cache).

    ``slice_rows``: write a one-row window into the cache with one in-place ``dynamic_update_slice``
    (``_write_window``) instead of a scatter (``Transformer.slice_rows``).
    """

    config: T5Config
    dropout_rate: float = 0.0
    dropout_style: str = "sublayers"
    slice_rows: bool = False

    def setup(self):
        cfg = self.config
        if not cfg.per_layer_relpos_bias:  # T5 / mT5: one table for the stack
            self.relpos_bias = RelativePositionBias(False, cfg)
        self.layers = [
            DecoderLayer(cfg, self.dropout_rate, self.dropout_style, name=f"layers_{i}")
            for i in range(cfg.num_decoder_layers)
        ]
        self.decoder_norm = RMSNorm(cfg)
        if not cfg.logits_via_embedding:
            self.logits_dense = Dense(cfg.vocab_size, ("embed", "vocab"), cfg)

    def cross_kv(self, encoded_bsd):
        """[b, s, d] -> (keys, values): tuples of l arrays [b, n, h, s] and [b, n, s, h]."""
        ks, vs = zip(*(layer.cross_kv(encoded_bsd) for layer in self.layers))
        return tuple(ks), tuple(vs)

    def __call__(self, x_bkd, positions_b, cache: KVCache, encoded: Encoded, embedder, query_rows=None):
        cfg = self.config
        b, k = x_bkd.shape[:2]
        r = max(k, query_rows or k)  # attention's query rows (``decode``'s ``query_rows``)
        cache_len = cache.k[0].shape[2]
        query_pos_r = positions_b[:, None] + jnp.arange(r, dtype=jnp.int32)[None, :]  # [b, r]
        query_pos = query_pos_r[:, :k]  # [b, k]: the rows written
        # Causal relative-position bias [b, n, r, L]: a gather from a per-distance table (the last column
        # is NEG_INF for slots after the query), rather than bucketing (a log) every slot every step.
        distance = query_pos_r[:, :, None] - jnp.arange(cache_len, dtype=jnp.int32)  # [b, r, L]
        # Distances run up to L + r - 1 (a window may reach past the cache; its writes are dropped).
        column = jnp.where(distance >= 0, distance, cache_len + r)

        def causal_bias(relpos_bias):
            return _causal_bias(relpos_bias, column, cache_len + r)

        shared_bias = None if cfg.per_layer_relpos_bias else causal_bias(self.relpos_bias)
        cross_bias = jnp.where(encoded.mask[:, None, None, :], 0.0, NEG_INF)  # [b, 1, 1, s]
        rows = jnp.arange(b)[:, None]

        def write(cache_bnLh, new_bknh):
            if _slices_fit(self.slice_rows, b, k, cache_len):
                return _write_window(cache_bnLh, new_bknh, positions_b)
            # Scatter each row's window at its own slots, in place; slots past L are dropped, never clamped.
            # (Advanced indices around a slice put their [b, k] dims first: the update is [b, k, n, h].)
            return cache_bnLh.at[rows, :, query_pos].set(new_bknh.astype(cache_bnLh.dtype), mode="drop")

        new_k, new_v = [], []
        x_bkd = _dropout(self, x_bkd, self.dropout_rate, _length_shared(self.dropout_style))
        for i, layer in enumerate(self.layers):
            self_bias = shared_bias if shared_bias is not None else causal_bias(layer.relpos_bias)  # [b, n, k, L]
            x_bkd, (lk, lv) = layer(
                x_bkd,
                (cache.k[i], cache.v[i]),
                self_bias,
                (encoded.cross_k[i], encoded.cross_v[i]),
                cross_bias,
                write,
                query_rows=r if r > k else None,
            )
            new_k.append(lk)
            new_v.append(lv)
        return self.head(x_bkd, embedder), KVCache(tuple(new_k), tuple(new_v))

    def branches(self, x_bmd, positions_b, width: int, cache: KVCache, encoded: Encoded, embedder):
        """A branch window (``decode_branches``): x [b, m, d] -> (float32 logits [b, m, v], ``BranchWindow``)."""
        cache_len = cache.k[0].shape[2]
        column = _chain_columns(positions_b, width, cache_len)

        def causal_bias(relpos):  # [b, n, w, L], a chain window's
            return _causal_bias(relpos, column, cache_len + width)

        shared = None if self.config.per_layer_relpos_bias else causal_bias(self.relpos_bias)
        cross_bias = jnp.where(encoded.mask[:, None, None, :], 0.0, NEG_INF)  # [b, 1, 1, s]
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            self_bias = shared if shared is not None else causal_bias(layer.relpos_bias)
            x_bmd, (lk, lv) = _layer_branches(
                layer,
                x_bmd,
                (cache.k[i], cache.v[i]),
                self_bias,
                positions_b,
                width,
                (encoded.cross_k[i], encoded.cross_v[i]),
                cross_bias,
            )
            new_k.append(lk)
            new_v.append(lv)
        return self.head(x_bmd, embedder), BranchWindow(tuple(new_k), tuple(new_v))

    def head(self, x_bkd, embedder):
        """The last layer's output [b, k, d] -> final norm -> float32 logits [b, k, v]."""
        cfg = self.config
        y = _dropout(self, self.decoder_norm(x_bkd), self.dropout_rate, _length_shared(self.dropout_style))
        if cfg.logits_via_embedding:
            logits = embedder.attend(y)
        else:
            logits = self.logits_dense(y)
        if cfg.scales_logits:  # d**-0.5 (T5 1.0's tied head; transformers scale_decoder_outputs)
            logits = logits / jnp.sqrt(jnp.asarray(y.shape[-1], jnp.float32)).astype(y.dtype)
        return logits.astype(jnp.float32)


def _chain_columns(positions_b, k: int, cache_len: int):
    """int32[b, k, L]: the columns of ``RelativePositionBias.causal_table(cache_len + k)`` a window of ``k`` tokens
    at ``positions_b`` reads (``_causal_bias``): the distance query - slot, or the masked column ``cache_len + k``
    for a slot after the query (``Decoder.__call__``, ``_decoder_inputs``)."""
    query_pos = positions_b[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]  # [b, k]
    # Distances run up to L + k - 1 (a window may reach past the cache; its writes are dropped).
    distance = query_pos[:, :, None] - jnp.arange(cache_len, dtype=jnp.int32)  # [b, k, L]
    return jnp.where(distance >= 0, distance, cache_len + k)


def _causal_bias(relpos_bias: RelativePositionBias, column_bkL, table_len: int):
    """float32 [b, n, k, L]: the causal self-attention bias, gathered from ``relpos_bias.causal_table(table_len)``
    at ``column_bkL`` (int32 [b, k, L]: the distance query - slot, or ``table_len - 1`` for a slot after the query)."""
    table = relpos_bias.causal_table(table_len)  # [n, table_len + 1]
    return jnp.transpose(jnp.take(table, column_bkL, axis=1, mode="clip"), (1, 0, 2, 3))


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


class Embed(nn.Module):
    """Shared token embedding ``[v, d]`` (t5x ``token_embedder/embedding``)."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.embedding = _param(
            self,
            "embedding",
            nn.initializers.normal(1.0),
            (cfg.vocab_size, cfg.d_model),
            ("vocab", "embed"),
            cfg.weight_dtype,
        )

    def __call__(self, tokens):
        return jnp.take(self.embedding, tokens, axis=0).astype(self.config.compute_dtype)

    def attend(self, y):
        """y: [..., d] -> [..., v] (logits through the embedding, T5 1.0)."""
        return jnp.einsum("...d,vd->...v", y, self.embedding.astype(y.dtype))


class Transformer(nn.Module):
    """The whole T5; its methods are reached through the pure functions below.

    ``dropout_rate`` > 0 only in training (``logits(..., dropout_rng=...)``); inference never drops.
    ``dropout_style``: where and how (``logits``).
    ``slice_rows``: a decode window of one row (``SLICE_ROWS_MAX``) writes its cache slots with one in-place
    ``dynamic_update_slice`` (``_write_window``) instead of a scatter: the same values. XLA:TPU lowers a
    window's scatter into the cache to a copy of the layer's cache, the scatter on that copy and a relayout back
    (``benchmarks/results/tpu_aot``). ``T5Model.decoding_model()`` sets it for TPU / GPU programs; CPU programs
    keep the scatter. (The embedding stays a gather: one dynamic slice per token of a vocabulary-split table
    made the SPMD partitioner all-gather the whole table in every window.)
    """

    config: T5Config
    dropout_rate: float = 0.0
    dropout_style: str = "sublayers"
    slice_rows: bool = False

    def setup(self):
        self.token_embedder = Embed(self.config)
        self.encoder = Encoder(self.config, self.dropout_rate, self.dropout_style)
        self.decoder = Decoder(self.config, self.dropout_rate, self.dropout_style, self.slice_rows)

    def encode(self, encoder_input_tokens):
        mask = encoder_input_tokens != self.config.pad_id
        hidden = self.encoder(self.token_embedder(encoder_input_tokens), mask)
        cross_k, cross_v = self.decoder.cross_kv(hidden)
        return hidden, Encoded(mask, cross_k, cross_v)

    def decode(self, encoded, tokens, cache, positions, query_rows=None):
        return self.decoder(self.token_embedder(tokens), positions, cache, encoded, self.token_embedder, query_rows)

    def decode_branches(self, encoded, tokens_bm, cache, positions, width: int):
        return self.decoder.branches(
            self.token_embedder(tokens_bm), positions, width, cache, encoded, self.token_embedder
        )

    def __call__(self, encoder_input_tokens, decoder_input_tokens):
        _, encoded = self.encode(encoder_input_tokens)
        b, t = decoder_input_tokens.shape
        cache = _empty_cache(self.config, b, t)
        return self.decode(encoded, decoder_input_tokens, cache, jnp.zeros((b,), jnp.int32))[0]


# ----------------------------------------------------------------------------------------------------------
# Pure functions (the decode contract)


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


# ----------------------------------------------------------------------------------------------------------
# Scanned layers (flaxformer's ``scan_layers``): parameters, caches and cross-attention memory stacked on a
# leading layers axis, one ``lax.scan`` over the layers in encode and in every decode window

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


def encode_scanned(config: T5Config, params: Params, encoder_input_tokens) -> Encoded:
    """``encode`` with the layers under ``lax.scan``: the same values, one layer's code in the program.

    Args:
      config: the model's config.
      params: stacked parameters (``stack_layers``).
      encoder_input_tokens: int32[b, s], right-padded with ``pad_id``.
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

    def encoder_layer(x, layer_params):
        bias = shared_bias
        if bias is None:  # umT5: this layer's own table
            bias = layer.apply({"params": layer_params}, pos, method=_layer_encoder_bias) + mask_bias
        return layer.apply({"params": layer_params}, x, bias), None

    x_bsd, _ = jax.lax.scan(encoder_layer, x_bsd, encoder_layers)
    hidden = model.apply({"params": params}, x_bsd, method=_encoder_norm)
    cross = DecoderLayer(config, parent=None)

    def cross_memory(_, layer_params):
        layer_params = _untranspose_layer("decoder", layer_params)
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

    def decoder_layer(carry, xs):
        x, cache_k, cache_v = carry  # [b, k, d], [l, b, n, L, h] x 2
        layer_params, cross_k, cross_v, i = xs
        layer_params = _untranspose_layer("decoder", layer_params)
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


# ----------------------------------------------------------------------------------------------------------
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


def _branch_embed(module: "Transformer", tokens_bm):
    return module.token_embedder(tokens_bm)


def _layer_branches_apply(layer: "DecoderLayer", x, cache_kv, self_bias, positions, width: int, cross_kv, cross_bias):
    return _layer_branches(layer, x, cache_kv, self_bias, positions, width, cross_kv, cross_bias)


def _layer_relpos_bias(layer: "DecoderLayer", column, table_len: int):
    return _causal_bias(layer.relpos_bias, column, table_len)


def _stack_relpos_bias(module: "Transformer", column, table_len: int):
    return _causal_bias(module.decoder.relpos_bias, column, table_len)


def decode_branches_scanned(config: T5Config, params: Params, encoded: Encoded, tokens, cache: KVCache, positions):
    """``decode_branches`` with the layers under ``lax.scan`` (stacked parameters, memory and cache): the same
    contract and values; the window's keys/values come back stacked, [l, b, k · w, n, h].

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

    def decoder_layer(x, xs):
        layer_params, cache_k, cache_v, cross_k, cross_v = xs
        layer_params = _untranspose_layer("decoder", layer_params)
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


# ----------------------------------------------------------------------------------------------------------
# The user-facing model object


@dataclasses.dataclass(frozen=True)
class T5Model:
    """A T5 config and its parameters: the object decoding, checkpoints and training pass around.

    Attributes:
      config: ``T5Config``.
      params: nested dict of arrays keyed by t5x parameter names
        (``encoder/layers_0/attention/query/kernel`` [d, n*h], ``token_embedder/embedding`` [v, d] …).
    """

    config: T5Config
    params: Params

    @classmethod
    def random(cls, config: T5Config, seed: int = 0) -> "T5Model":
        """A model with random t5x-initialised weights, for tests and examples."""
        return cls(config, init_params(config, seed))

    def encode(self, encoder_input_tokens) -> Encoded:
        """See ``specjax.models.t5.encode``."""
        return encode(self.config, self.params, encoder_input_tokens)

    def encoder_outputs(self, encoder_input_tokens) -> jax.Array:
        """Final encoder hidden states float[b, s, d]; see ``encoder_outputs``."""
        return encoder_outputs(self.config, self.params, encoder_input_tokens)

    def decode(self, encoded: Encoded, tokens, cache: KVCache, positions):
        """See ``specjax.models.t5.decode``: (logits float32[b, k, v], cache)."""
        return decode(self.config, self.params, encoded, tokens, cache, positions)

    def init_cache(self, batch: int, length: int) -> KVCache:
        """See ``specjax.models.t5.init_cache``."""
        return init_cache(self.config, batch, length)

    def logits(self, encoder_input_tokens, decoder_input_tokens) -> jax.Array:
        """Teacher-forced logits float32[b, t, v]; see ``specjax.models.t5.logits``."""
        return _jit_logits(self.config, self.params, encoder_input_tokens, decoder_input_tokens)

    @property
    def num_params(self) -> int:
        """Number of parameters (scalars)."""
        return count_params(self.params)

    def astype(self, dtype: str) -> "T5Model":
        """The same model with parameters and compute in ``dtype`` ("float32", "bfloat16", "float16")."""
        cfg = self.config.replace(dtype=dtype, param_dtype=dtype)
        return T5Model(cfg, jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), self.params))

    def decoding_model(self, scan_layers: bool | None = None):
        """``(DecodingModel, params)``: how the decode loops see this model (``specjax.models.adapter``).

        ``scan_layers``: run the layers under ``lax.scan`` (``T5Decoding.scan_layers``), with the parameters
        handed over stacked (``stack_layers``: a copy of the layers' weights, made on the first call and kept on
        this object). None (the default) scans for programs compiled for TPU / GPU (the devices or sharding of
        the parameters: compile time and program size no longer grow with depth) where that copy fits in the
        devices' free memory (``_stacked_copy_fits``; abstract parameters always do), and keeps the layers unrolled
        on CPU, where they run faster (``benchmarks/results/scan``), and for traced parameters.

        The parameters are ``self.params``, except on a CPU for a bfloat16 / float16 model with its own logits
        kernel (T5 1.1; not ``logits_via_embedding``): there ``token_embedder/embedding`` [v, d] is handed over
        as a float32 copy, made on the first call and kept on this object (4 bytes per entry more: 16 MB for
        the small target, 0.5 GB for T5-XXL). XLA:CPU has no bfloat16 gather, so with the table as stored every
        decode call converted all of it to float32 to look up a few rows (2-4 ms a call for the small target's
        8000 x 512, about 5 % of a batch-1 speculative call; ``benchmarks/results/cpu_kernels/``). The
        rows looked up are cast to the compute dtype as before, so every output is the same bit for bit. Traced
        parameters (a ``T5Model`` argument of a user's ``jax.jit``) are passed as they are.

        On a CPU a bfloat16 / float16 model's ``DecodingModel`` also holds its attention memory (the decoder's
        self-attention cache and the cross-attention keys/values) in float32 (``T5Decoding.kv_dtype``): the
        same values, the same logits bit for bit, but no float32 conversion of every layer's cache around each
        window's write and of the cross-attention memory in each window (XLA:CPU has no bfloat16 scatter or
        batched-dot kernel). Measured on the small pair (bfloat16 target, float32 draft, γ 5, 24 Multi30k
        lines, one process, alternating): speculative sampling 1.12x faster
        (``benchmarks/results/cpu_kernels/``). The memory is small beside the weights
        (b x n x L x h x 4 bytes per layer and per keys / values: 0.14 MB a layer for the small target).
        """
        scan = self._decode_scan_layers() if scan_layers is None else bool(scan_layers)
        decoding = DECODING_ADAPTER(
            self.config, kv_dtype=self._decode_kv_dtype(), scan_layers=scan, slice_rows=not self._decode_on_cpu()
        )
        return decoding, (self._decode_stacked_params() if scan else self._decode_params())

    def _decode_scan_layers(self) -> bool:
        """True when the decode program is compiled for a TPU / GPU (see ``decoding_model``): concrete or abstract
        parameters placed off CPU. Reads the config and one parameter."""
        table = self.params.get("token_embedder", {}).get("embedding") if isinstance(self.params, dict) else None
        if table is None or isinstance(table, jax.core.Tracer) or _on_cpu(table):
            return False
        return _stacked_copy_fits(self.params)

    def _decode_stacked_params(self) -> Params:
        """``_decode_params()`` with the layers stacked (``stack_layers``), made once and kept (traced: every call)."""
        cached = self.__dict__.get("_decode_stacked_params_cache")
        if cached is not None:
            return cached
        params = self._decode_params()
        if _any_tracer(params):  # a T5Model argument of a user's jit: stacked inside that trace, never kept
            return stack_layers(self.config, params)
        with jax.ensure_compile_time_eval():  # concrete even when called under a user's trace (a closed-over model)
            stacked = stack_layers(self.config, params)
        if not _any_tracer(stacked):
            object.__setattr__(self, "_decode_stacked_params_cache", stacked)  # frozen dataclass: a cache
        return stacked

    def _decode_kv_dtype(self) -> str | None:
        """ "float32" on CPU for a bfloat16 / float16 model (see ``T5Decoding.kv_dtype``), else None. Called on
        every decode: it reads the config and one parameter, never the whole tree."""
        if jnp.dtype(self.config.compute_dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            return None
        return "float32" if self._decode_on_cpu() else None

    def _decode_on_cpu(self) -> bool:
        """Whether the decode program runs on CPU: the devices of the embedding table (or of its sharding, for
        abstract parameters), the default backend for traced parameters. Reads one parameter."""
        table = self.params.get("token_embedder", {}).get("embedding") if isinstance(self.params, dict) else None
        traced = table is None or isinstance(table, jax.core.Tracer)
        return jax.default_backend() == "cpu" if traced else _on_cpu(table)

    def _decode_params(self) -> Params:
        cached = self.__dict__.get("_decode_params_cache")
        if cached is not None:
            return cached
        params = self.params
        table = params.get("token_embedder", {}).get("embedding") if isinstance(params, dict) else None
        if (
            table is None
            or self.config.logits_via_embedding
            or isinstance(table, jax.core.Tracer)
            or jnp.dtype(table.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
            or not _on_cpu(table)
        ):
            return params
        if isinstance(table, jax.ShapeDtypeStruct):  # abstract parameters (ahead of time): the copy's shape
            copy = jax.ShapeDtypeStruct(table.shape, jnp.float32, sharding=table.sharding)
        else:
            # A concrete array even when this runs under a user's trace (a model closed over in their jax.jit):
            # a copy made inside the trace would be a tracer, kept here and leaked into the next call.
            with jax.ensure_compile_time_eval():
                copy = jnp.asarray(table, jnp.float32)
        embedder = dict(params["token_embedder"], embedding=copy)
        decode_params = dict(params, token_embedder=embedder)
        if not _any_tracer(decode_params):  # cache only concrete (or abstract) arrays (STYLE.md item 23)
            object.__setattr__(self, "_decode_params_cache", decode_params)  # frozen dataclass: a cache, not a field
        return decode_params


def _any_tracer(tree) -> bool:
    """Whether any leaf of ``tree`` is a tracer (a value inside a ``jax.jit`` / ``vmap`` / ``shard_map`` trace)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def _stacked_copy_fits(params, memory_stats=lambda device: device.memory_stats()) -> bool:
    """Whether the stacked copy of the layers' weights (``stack_layers``, kept beside ``T5Model.params``) fits
    in the free memory of the devices holding them. Abstract parameters (``jax.ShapeDtypeStruct``: an
    ahead-of-time compile) always fit; so do devices that report no memory statistics. A model that fills most
    of its chip (T5-XXL in bfloat16, 22.4 GB, on one 32 GiB v4 chip) keeps the unrolled layers: the same
    outputs, a longer compile, no second copy of the weights."""
    leaves = [x for x in jax.tree_util.tree_leaves(params) if isinstance(x, jax.Array)]
    if not leaves:
        return True
    need: dict = {}  # device -> bytes of the stacked copy on it
    for x in leaves:
        for shard in x.addressable_shards:
            need[shard.device] = need.get(shard.device, 0) + shard.data.nbytes
    for device, nbytes in need.items():
        try:
            stats = memory_stats(device) or {}
        except Exception:  # pragma: no cover - a backend without memory statistics
            stats = {}
        limit, used = stats.get("bytes_limit"), stats.get("bytes_in_use", 0)
        if limit is not None and used + 1.05 * nbytes > limit:
            return False
    return True


def _on_cpu(x) -> bool:
    """True when the program reading ``x`` runs on CPU devices: those a ``jax.Array`` lives on, or those of an
    abstract array's sharding (``jax.ShapeDtypeStruct(..., sharding=)``, e.g. parameters of a TPU program compiled
    ahead of time on a CPU host: ``specjax.aot``); a NumPy array or an abstract one without a sharding: when
    JAX's default backend is the CPU."""
    devices = getattr(x, "devices", None)
    if callable(devices):
        return all(d.platform == "cpu" for d in devices())
    device_set = getattr(getattr(x, "sharding", None), "device_set", None)
    if device_set:
        return all(d.platform == "cpu" for d in device_set)
    return jax.default_backend() == "cpu"


# A pytree (params the leaves, the config static), so a T5Model can be a jit / shard_map / pmap argument.
jax.tree_util.register_dataclass(T5Model, data_fields=["params"], meta_fields=["config"])


def _jit_logits(config, params, encoder_input_tokens, decoder_input_tokens):
    _check_tokens(config, encoder_input_tokens, "encoder_input_tokens")
    _check_tokens(config, decoder_input_tokens, "decoder_input_tokens")
    return _logits_jit(
        config, params, jnp.asarray(encoder_input_tokens, jnp.int32), jnp.asarray(decoder_input_tokens, jnp.int32)
    )


@functools.partial(jax.jit, static_argnums=0)
def _logits_jit(config, params, encoder_input_tokens, decoder_input_tokens):
    return Transformer(config).apply({"params": params}, encoder_input_tokens, decoder_input_tokens)
