"""The whole T5 as Flax modules (t5x ``examples/t5/network.py``): the encoder and decoder stacks and ``Transformer``,
whose methods the pure functions of ``specjax.models.contract`` apply. The decoder scores a window of ``k``
tokens per row at per-row positions against an explicit ``KVCache``, or a branch window without writing it.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``t`` decoder length, ``k`` window,
``L`` cache length, ``n`` heads, ``h`` head dim, ``d`` model dim, ``f`` MLP dim, ``v`` vocab, ``l`` layers.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from specjax.config import T5Config
from specjax.models.cache import BranchWindow, Encoded, KVCache, _empty_cache, _slices_fit, _write_window
from specjax.models.layers import (
    NEG_INF,
    DecoderLayer,
    Dense,
    Embed,
    EncoderLayer,
    RelativePositionBias,
    RMSNorm,
    _dropout,
    _layer_branches,
    _length_shared,
)


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
