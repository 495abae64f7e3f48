"""``T5Model``: a T5 config and its parameters, the object decoding, checkpoints and training pass around, and how
the decode loops see it on each platform (``T5Model.decoding_model``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax.config import T5Config
from specjax.models.cache import Encoded, KVCache, init_cache
from specjax.models.contract import (
    Params,
    _check_tokens,
    count_params,
    decode,
    encode,
    encoder_outputs,
    init_params,
)
from specjax.models.network import Transformer
from specjax.models.scan import stack_layers

# The decode loops' view of this model (``specjax.models.adapter.T5Decoding``), registered by the adapter when
# ``specjax.models`` is imported: the adapter imports this module, never the reverse.
DECODING_ADAPTER = None


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
