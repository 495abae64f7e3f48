"""Weight-only int8 quantization of a T5 model with Qwix (google/qwix), applied at the parameter level.

Every dense kernel [i, o] of the model (attention q/k/v/o, MLP wi/wo, the T5 1.1 logits kernel) is stored as a
``qwix.QArray``: int8 values [i, o] and one float32 scale per output column [1, o] (symmetric, absmax
calibration: ``qwix.quantize(kernel, int8, channelwise_axes=(1,))``, Qwix's weight-only PTQ layout for a
``"...i,io->...o"`` einsum). The embedding table, the relative position biases and the norms keep the compute
dtype (a lookup table and vectors: 1.2 % of the small target's weights, 1.2 % of T5 1.1 XXL's).

How the model computes with them: the decode programs dequantize each kernel (``qwix.dequantize``: int8 values
times their column's scale, rounded once to the compute dtype) and run the model's own matmul on the result, which
is what Qwix's PTQ provider does for a float activation times a quantized weight (``qwix``'s ``dot_general`` takes
its "dequantize on the input" path whenever an operand is bfloat16 / float32) -- so the model code is unchanged
and keeps its bit-exact properties (a window and a step give the same logits; a row's result does not depend on
its company), now for the quantized model.

Exactness (Leviathan et al. 2023, Algorithm 1): the output distribution of speculative sampling is the target's
whatever the draft is, so an int8 draft never changes the output, only α. An int8 target is another target: greedy
speculative output equals *the int8 target alone*, bit for bit, and sampled output follows the int8 target's
distribution; it is not the float32 target's (BLEU against it: benchmarks/results/int8/).

Legend (STYLE.md): ``i`` a kernel's input features, ``o`` its output features, ``l`` layers.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.adapter import T5Decoding
from specjax.models.scan import LAYERS_AXIS
from specjax.models.t5 import Params, T5Model, abstract_params, stack_layers

__all__ = [
    "QUANTIZED_DTYPES",
    "QuantizedDecoding",
    "QuantizedT5Model",
    "quantize",
    "quantize_params",
    "dequantize_params",
    "is_quantized",
    "weight_bytes",
    "quantized_shardings",
    "abstract_quantized_model",
]

QUANTIZED_DTYPES = ("int8",)
"""The weight dtypes ``quantize`` (and ``dtype=`` / ``--dtype`` everywhere) accept: "int8" (weight-only)."""


@functools.cache
def _qwix():
    import qwix  # ~1.3 s of imports (its contrib pulls optimisers): only when a model is quantized

    return qwix


def _is_qarray(x) -> bool:
    if type(x).__name__ != "QArray":  # cheap test first: no qwix import for a float model
        return False
    return isinstance(x, _qwix().QArray)


def _is_kernel(path, x) -> bool:
    keys = [str(getattr(k, "key", k)) for k in path]
    return bool(keys) and keys[-1] == "kernel" and getattr(x, "ndim", 0) == 2


def is_quantized(params: Params) -> bool:
    """Whether any leaf of ``params`` is a ``qwix.QArray`` (a quantized kernel)."""
    return any(_is_qarray(x) for x in jax.tree_util.tree_leaves(params, is_leaf=_is_qarray))


def quantize_params(params: Params, qtype: str = "int8") -> Params:
    """``params`` with every dense kernel [i, o] replaced by a ``qwix.QArray`` (qvalue int8 [i, o], scale float32
    [1, o]: per output column, absmax / 127.5 -- Qwix's symmetric int8 bound, qmax + 0.5 -- values clipped to
    [-128, 127]); every other leaf unchanged.

    Args:
      params: a T5 parameter tree (t5x names, unstacked), float arrays.
      qtype: "int8".
    Returns:
      The quantized tree (same structure, ``QArray`` nodes at the kernels).
    Raises:
      ValueError: an unknown ``qtype``, or a tree already quantized.
    """
    if qtype not in QUANTIZED_DTYPES:
        raise ValueError(f"qtype must be one of {QUANTIZED_DTYPES}, got {qtype!r}.")
    if is_quantized(params):
        raise ValueError("quantize_params: the parameters are quantized already.")
    qwix = _qwix()

    def one(path, x):
        if not _is_kernel(path, x):
            return x
        return qwix.quantize(jnp.asarray(x, jnp.float32), jnp.int8, channelwise_axes=(1,))

    return jax.tree_util.tree_map_with_path(one, params)


def dequantize_params(params: Params, dtype) -> Params:
    """``params`` with every ``qwix.QArray`` replaced by its dequantized array (``qwix.dequantize``: qvalue times
    scale in float32, then rounded once to ``dtype``); other leaves unchanged. Traceable (used inside the decode
    programs)."""
    if not is_quantized(params):
        return params
    qwix = _qwix()
    return jax.tree_util.tree_map(
        lambda x: qwix.dequantize(x).astype(dtype) if _is_qarray(x) else x, params, is_leaf=_is_qarray
    )


def weight_bytes(params: Params) -> int:
    """Bytes of the parameters as held in memory (int8 values plus their float32 scales for a quantized kernel);
    works on arrays and ``jax.ShapeDtypeStruct``s."""
    leaves = jax.tree_util.tree_leaves(params)
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in leaves))


@dataclasses.dataclass(frozen=True)
class QuantizedDecoding(T5Decoding):
    """``T5Decoding`` for parameters with quantized kernels: each of ``encode``, ``decode`` and ``decode_branches``
    dequantizes the kernels (``dequantize_params``, to the config's parameter dtype) inside the program and runs the
    float model on them. Every other method (caches, branch commits) is ``T5Decoding``'s.

    With ``scan_layers`` the layer stacks are dequantized inside the scan bodies, one layer's slice at a time
    (``per_layer``), and only the leaves outside them (the T5 1.1 logits kernel) before: the program never holds a
    float copy of a whole stack (T5 1.1 XXL on one v4 chip: 0.5 GB of temporaries instead of 11.9 GB,
    ``benchmarks/results/int8``). Each kernel is dequantized by the same function either way (the slice of the
    stacked int8 values times the slice of the stacked scales, in the stacked orientation), so the values, and
    the outputs, are the same bit for bit."""

    quantized = True
    """Marks a decoding model whose parameters hold ``qwix.QArray`` kernels (``specjax.parallel`` reads it)."""

    def _float(self, params):
        if not self.scan_layers:
            return dequantize_params(params, self.config.param_dtype)
        out = dequantize_params(
            {k: v for k, v in params.items() if k not in ("encoder", "decoder")}, self.config.param_dtype
        )
        for stack in ("encoder", "decoder"):  # the layer stacks stay int8 here: ``per_layer`` dequantizes each slice
            sub = params[stack]
            out[stack] = {
                **dequantize_params({k: v for k, v in sub.items() if k != LAYERS_AXIS}, self.config.param_dtype),
                LAYERS_AXIS: sub[LAYERS_AXIS],
            }
        return out

    def per_layer(self, layer_params):
        """One layer's parameters sliced from the stacked tree inside the scan body, dequantized
        (``dequantize_params``; ``T5Decoding.per_layer``)."""
        return dequantize_params(layer_params, self.config.param_dtype)

    def encode(self, params, encoder_input_tokens):
        """See ``T5Decoding.encode``."""
        return super().encode(self._float(params), encoder_input_tokens)

    def decode(self, params, encoded, tokens, cache, positions, query_rows: int | None = None):
        """See ``T5Decoding.decode``."""
        return super().decode(self._float(params), encoded, tokens, cache, positions, query_rows)

    def decode_branches(self, params, encoded, tokens, cache, positions):
        """See ``T5Decoding.decode_branches``."""
        return super().decode_branches(self._float(params), encoded, tokens, cache, positions)


@dataclasses.dataclass(frozen=True)
class QuantizedT5Model(T5Model):
    """A ``T5Model`` whose dense kernels are ``qwix.QArray``s (``quantize``); ``config.dtype`` is the compute dtype.

    It decodes everywhere a ``T5Model`` does (``speculative_sample``, ``temperature_sample``, ``Decoder``,
    ``BulkDecoder``; ``decoding_model`` hands the loops a ``QuantizedDecoding`` and the quantized parameters), and
    ``encode`` / ``decode`` / ``logits`` run the dequantized model.
    """

    def dequantized(self) -> T5Model:
        """The float model the quantized one computes: kernels dequantized to ``config.param_dtype``."""
        return T5Model(self.config, dequantize_params(self.params, self.config.param_dtype))

    def encode(self, encoder_input_tokens):
        """See ``specjax.models.t5.encode`` (on the dequantized kernels)."""
        return self.dequantized().encode(encoder_input_tokens)

    def encoder_outputs(self, encoder_input_tokens):
        """See ``specjax.models.t5.encoder_outputs`` (on the dequantized kernels)."""
        return self.dequantized().encoder_outputs(encoder_input_tokens)

    def decode(self, encoded, tokens, cache, positions):
        """See ``specjax.models.t5.decode`` (on the dequantized kernels)."""
        return self.dequantized().decode(encoded, tokens, cache, positions)

    def logits(self, encoder_input_tokens, decoder_input_tokens):
        """Teacher-forced logits float32[b, t, v] of the dequantized model."""
        return self.dequantized().logits(encoder_input_tokens, decoder_input_tokens)

    @property
    def num_params(self) -> int:
        """Number of weights (scalars; a quantized kernel counts its int8 values, not its scales)."""
        leaves = jax.tree_util.tree_leaves(self.params, is_leaf=_is_qarray)
        return int(sum(np.prod((x.qvalue if _is_qarray(x) else x).shape, dtype=np.int64) for x in leaves))

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights in memory (``weight_bytes``)."""
        return weight_bytes(self.params)

    def astype(self, dtype: str) -> "QuantizedT5Model":
        """The same quantized kernels with the other leaves and the compute in ``dtype``."""
        cfg = self.config.replace(dtype=dtype, param_dtype=dtype)
        cast = lambda x: x if _is_qarray(x) else jnp.asarray(x, dtype)
        return QuantizedT5Model(cfg, jax.tree_util.tree_map(cast, self.params, is_leaf=_is_qarray))

    def decoding_model(self, scan_layers: bool | None = None):
        """``(QuantizedDecoding, quantized params)``: ``T5Model.decoding_model``'s choices (scan, kv dtype, rows),
        the kernels left quantized (the program dequantizes them)."""
        decoding, params = super().decoding_model(scan_layers)
        fields = {f.name: getattr(decoding, f.name) for f in dataclasses.fields(decoding)}
        return QuantizedDecoding(**fields), params

    def _decode_stacked_params(self) -> Params:
        """The stacked tree (``stack_layers``) of the quantized parameters: int8 values and scales each stacked
        (and transposed where ``stack_layers`` transposes: a scale [1, o] becomes [o, 1], so values times scales
        stay the transposed kernel)."""
        cached = self.__dict__.get("_decode_stacked_params_cache")
        if cached is not None:
            return cached
        params = self._decode_params()
        qwix = _qwix()
        leaves, treedef = jax.tree_util.tree_flatten(params, is_leaf=_is_qarray)
        parts = {}
        for part in ("qvalue", "scale"):
            tree = jax.tree_util.tree_unflatten(treedef, [getattr(x, part) if _is_qarray(x) else x for x in leaves])
            parts[part] = stack_layers(self.config, tree)
        qtypes = iter([x.qtype for x in leaves if _is_qarray(x)])
        out_leaves, out_def = jax.tree_util.tree_flatten(parts["qvalue"])
        scale_leaves = jax.tree_util.tree_leaves(parts["scale"])
        stacked = jax.tree_util.tree_unflatten(
            out_def,
            [
                qwix.QArray(q, s, qtype=next(qtypes)) if np.dtype(q.dtype) == np.int8 else q
                for q, s in zip(out_leaves, scale_leaves)
            ],
        )
        if not any(isinstance(x, jax.core.Tracer) for x in out_leaves):  # cache only concrete arrays (STYLE 23)
            object.__setattr__(self, "_decode_stacked_params_cache", stacked)
        return stacked


jax.tree_util.register_dataclass(QuantizedT5Model, data_fields=["params"], meta_fields=["config"])


def quantize(model: T5Model, dtype: str = "int8", compute_dtype: str | None = None) -> QuantizedT5Model:
    """``model`` with its dense kernels quantized (``quantize_params``), the rest and the compute in
    ``compute_dtype`` (None: the model's dtype).

    Args:
      model: a float ``T5Model`` (float32 weights give the same int8 values as bfloat16 ones upcast).
      dtype: "int8" (weight-only, per output column).
      compute_dtype: "float32", "bfloat16", "float16" or None.
    Returns:
      ``QuantizedT5Model``; its ``weight_bytes`` tells the memory held.
    Raises:
      ValueError: an unknown dtype, or a model already quantized.
    """
    if isinstance(model, QuantizedT5Model) or is_quantized(model.params):
        raise ValueError("quantize: the model is quantized already.")
    compute = compute_dtype or jnp.dtype(model.config.dtype).name
    if compute not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"compute_dtype must be float32, bfloat16 or float16, got {compute_dtype!r}.")
    params = quantize_params(model.params, dtype)
    cfg = model.config.replace(dtype=compute, param_dtype=compute)
    return QuantizedT5Model(cfg, params).astype(compute)


def _kernel_path(path) -> bool:
    keys = [str(getattr(k, "key", k)) for k in path]
    return bool(keys) and keys[-1] == "kernel"


def quantized_shardings(shardings):
    """The shardings of a quantized tree from the float tree's (``specjax.parallel.param_shardings``, stacked or
    not): each kernel's ``NamedSharding`` for its int8 values, its scales replicated (one float32 per output column:
    16 KB for T5 1.1 XXL's widest kernel)."""
    from jax.sharding import NamedSharding, PartitionSpec

    qwix = _qwix()

    def one(path, s):
        if not _kernel_path(path):
            return s
        return qwix.QArray(s, NamedSharding(s.mesh, PartitionSpec()), qtype=jnp.int8)

    return jax.tree_util.tree_map_with_path(one, shardings)


def abstract_quantized_model(config, sharding=None) -> QuantizedT5Model:
    """A ``QuantizedT5Model`` of ``jax.ShapeDtypeStruct``s (int8 values [i, o] and float32 scales [1, o] per kernel,
    the rest in ``config.param_dtype``), each with ``sharding``: for ahead-of-time compiles (``specjax.aot``)."""
    qwix = _qwix()

    def one(path, x):
        if not _is_kernel(path, x):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        return qwix.QArray(
            jax.ShapeDtypeStruct(x.shape, jnp.int8, sharding=sharding),
            jax.ShapeDtypeStruct((1, x.shape[1]), jnp.float32, sharding=sharding),
            qtype=jnp.int8,
        )

    return QuantizedT5Model(config, jax.tree_util.tree_map_with_path(one, abstract_params(config)))
