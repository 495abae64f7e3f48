"""The T5 adapter: ``specjax.models.t5`` seen through the decode loops' ``DecodingModel`` interface.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``k`` window, ``v`` vocab, ``L`` cache length.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax.models import model, t5

__all__ = ["T5Decoding", "ENCODE_WIDTHS", "run_time_widths"]

ENCODE_WIDTHS = (16, 32, 64, 128, 256)
"""Encoder widths (tokens) ``T5Decoding.encode`` picks from at run time: the smallest one that holds the
longest row of the call (the padded width ``s`` itself when none below it does). Each width is one more
encoder in the program (on the 2-core CPU ~3-8 s more compile time for the shipped pair), so only widths of at
least ``s / 8`` are used (``run_time_widths``): at most four branches, wasted encoder work under 2x."""


def run_time_widths(widths: tuple[int, ...], s: int) -> list[int]:
    """The encoder widths a program for padded width ``s`` holds: ``widths`` in [s / 8, s), then ``s``."""
    return [w for w in widths if s / 8 <= w < s] + [s]


@dataclasses.dataclass(frozen=True)
class T5Decoding:
    """``DecodingModel`` for specjax's T5: the config is static (hashable), parameters are jit arguments.

    Attributes:
      config: ``T5Config``.
      encode_widths: see ``encode``; ``()`` encodes the whole padded width.
      kv_dtype: dtype name of the attention memory the loops carry (the decoder's self-attention cache and the
        cross-attention keys/values of ``encode``); None: the compute dtype. "float32" for a bfloat16 or
        float16 model holds the same values (they are computed in the compute dtype and stored exactly), and
        the logits are the same bit for bit, but XLA:CPU, which has no bfloat16 scatter or dot kernel, no
        longer converts the whole cache to float32 and back around each window's write nor the
        cross-attention memory in every window (``T5Model.decoding_model`` picks it on CPU).
      scan_layers: run the layers under ``lax.scan`` (flaxformer's ``scan_layers``): the parameters are the
        stacked tree (``specjax.models.t5.stack_layers``), the cache and the cross-attention memory are stacked
        arrays [l, ...] (``t5.encode_scanned``, ``t5.decode_scanned``). The same values as the unrolled layers
        (float32: within 1e-5, ``tests/test_scan.py``); the program holds one layer's code instead of l, so its
        compile time and size do not grow with depth (``T5Model.decoding_model`` picks it off CPU).
      slice_rows: decode windows of one row write their cache slots with one dynamic slice per row instead of
        a scatter (``specjax.models.t5.Transformer``): the same values, written in place by XLA:TPU
        (``T5Model.decoding_model`` picks it off CPU).
    """

    config: t5.T5Config
    encode_widths: tuple[int, ...] = ENCODE_WIDTHS
    kv_dtype: str | None = None
    scan_layers: bool = False
    slice_rows: bool = False

    @property
    def vocab_size(self) -> int:
        """``v``."""
        return self.config.vocab_size

    @property
    def pad_id(self) -> int:
        """Padding id and the decoder start token (T5: 0)."""
        return self.config.pad_id

    def encode(self, params, encoder_input_tokens):
        """int32[b, s] -> ``t5.Encoded`` (mask [b, s], cross keys [b, n, h, s], values [b, n, s, h]), as
        ``specjax.models.t5.encode``, but the encoder runs only on the first ``w`` tokens of every row, ``w``
        the smallest of ``run_time_widths(encode_widths, s)`` covering the call's last non-pad token: one
        ``lax.switch`` branch per width inside the compiled program, the keys/values zero-padded back to ``s``.

        The encoder cost follows the inputs' real length, not the padded width a caller chose to keep one
        program (at batch 1 on Multi30k, 16-24 tokens of a 64-token pad). Masked positions get no attention
        weight (bias -1e10: exp underflows to exactly 0), so each real position's output is the one the whole
        width would give, and the padded keys/values are never read.
        """
        s = encoder_input_tokens.shape[1]
        widths = run_time_widths(self.encode_widths, s)
        run_encoder = functools.partial(t5.encode_scanned, per_layer=self.per_layer) if self.scan_layers else t5.encode
        if len(widths) == 1:
            return self._memory(run_encoder(self.config, params, encoder_input_tokens))
        tokens = jnp.asarray(encoder_input_tokens, jnp.int32)
        mask = tokens != self.config.pad_id
        used = jnp.max(jnp.where(mask, jnp.arange(1, s + 1, dtype=jnp.int32), 0))  # last real token + 1
        index = jnp.searchsorted(jnp.asarray(widths, jnp.int32), used)  # first width >= used

        def at_width(w):
            def run(tokens):
                enc = self._memory(run_encoder(self.config, params, tokens[:, :w]))
                # Keys [(l,) b, n, h, s] grow along the last axis, values [(l,) b, n, s, h] along the one before.
                grow_k = lambda x: jnp.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, s - w),))
                grow_v = lambda x: jnp.pad(x, ((0, 0),) * (x.ndim - 2) + ((0, s - w), (0, 0)))
                return t5.Encoded(mask, jax.tree.map(grow_k, enc.cross_k), jax.tree.map(grow_v, enc.cross_v))

            return run

        return jax.lax.switch(index, [at_width(w) for w in widths], tokens)

    def _memory(self, enc: t5.Encoded) -> t5.Encoded:
        """``enc`` with its cross-attention keys/values in ``kv_dtype`` (unchanged when None)."""
        if self.kv_dtype is None:
            return enc
        cast = lambda xs: jax.tree.map(lambda x: x.astype(self.kv_dtype), xs)
        return t5.Encoded(enc.mask, cast(enc.cross_k), cast(enc.cross_v))

    def per_layer(self, layer_params):
        """With ``scan_layers``: one layer's parameters as the scan slices them from the stacked tree, inside the
        scan body, -> the parameters the layer computes with (``t5.encode_scanned``'s ``per_layer``): the
        identity here. ``specjax.quantize.QuantizedDecoding`` dequantizes there, so a quantized program holds one
        layer's float kernels at a time rather than the whole stack's."""
        return layer_params

    query_rows = True
    """``decode`` takes ``query_rows`` (``specjax.decoding.baseline.decode_step`` uses it)."""

    def decode(self, params, encoded, tokens, cache, positions, query_rows: int | None = None):
        """int32[b, k] at int32[b] -> (float32 logits [b, k, v], cache) (``specjax.models.t5.decode``, or
        ``t5.decode_scanned`` with ``scan_layers``; ``slice_rows`` and ``query_rows`` passed on)."""
        if self.scan_layers:
            return t5.decode_scanned(
                self.config, params, encoded, tokens, cache, positions, self.slice_rows, query_rows, self.per_layer
            )
        return t5.decode(self.config, params, encoded, tokens, cache, positions, self.slice_rows, query_rows)

    def decode_branches(self, params, encoded, tokens, cache, positions):
        """int32[b, k, w] branches at int32[b] -> (float32 logits [b, k, w, v], window): every branch over the
        committed cache and its own tokens, the cache unchanged (``specjax.models.t5.decode_branches``, or
        ``t5.decode_branches_scanned`` with ``scan_layers``)."""
        if self.scan_layers:
            return t5.decode_branches_scanned(self.config, params, encoded, tokens, cache, positions, self.per_layer)
        return t5.decode_branches(self.config, params, encoded, tokens, cache, positions)

    def commit_branch(self, cache, window, branch, positions, width: int):
        """Writes branch int32[b] (``width`` tokens) of a ``decode_branches`` window at int32[b] into the cache
        (``specjax.models.t5.commit_branch``; ``slice_rows`` passed on)."""
        return t5.commit_branch(cache, window, branch, positions, width, self.slice_rows)

    def fork_rows(self, tree, k: int):
        """A cache or ``t5.Encoded`` with every row repeated ``k`` times (row ``i``'s copies at ``i·k .. i·k+k-1``):
        a copy, [.., b, ..] -> [.., b·k, ..] (the batch axis is 1 for stacked arrays, else 0; the encoder mask
        [b, s] is never stacked)."""
        axis = 1 if self.scan_layers else 0
        rep = lambda x: jnp.repeat(x, k, axis=axis)
        if isinstance(tree, t5.Encoded):
            return t5.Encoded(
                jnp.repeat(tree.mask, k, axis=0), jax.tree.map(rep, tree.cross_k), jax.tree.map(rep, tree.cross_v)
            )
        return jax.tree.map(rep, tree)

    def take_rows(self, cache, rows):
        """The cache's rows int32[b'] (a gather along the batch axis): [.., b, ..] -> [.., b', ..]."""
        axis = 1 if self.scan_layers else 0
        return jax.tree.map(lambda x: jnp.take(x, rows, axis=axis), cache)

    def init_cache(self, batch, length):
        """An empty cache for ``batch`` rows and ``length`` positions (``specjax.models.t5.init_cache``; stacked
        arrays [l, b, n, L, h] with ``scan_layers``)."""
        return t5.init_cache(self.config, batch, length, self.kv_dtype, stacked=self.scan_layers)


model.DECODING_ADAPTER = T5Decoding  # T5Model.decoding_model() builds this (the model module never imports the adapter)
