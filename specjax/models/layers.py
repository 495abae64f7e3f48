"""The T5 building blocks as Flax modules (t5x ``examples/t5/layers.py`` and the blocks of ``network.py``; parameter
names are t5x's): relative position buckets and biases, RMSNorm, the bias-free dense kernel, the attention
projections and softmax attention, the MLP, training dropout, the embedding, and one encoder and one decoder block
(with the decoder block's branch-window form, ``_layer_branches``).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``t`` decoder length, ``k`` window,
``L`` cache length, ``n`` heads, ``h`` head dim, ``d`` model dim, ``f`` MLP dim, ``v`` vocab, ``l`` layers.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specjax.config import T5Config
from specjax.models.cache import _branch_caches
from specjax.models.numerics import _dense_matmul, fixed_order_softmax, fixed_order_sum

NEG_INF = -1e10  # t5x's attention mask bias.


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
