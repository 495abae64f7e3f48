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

The model lives in modules by concern, imports flowing one way (each imports only those above it):

- ``specjax.models.numerics``: fixed-order sums, max and softmax, the dense layers' bfloat16 matmul (custom VJP);
- ``specjax.models.cache``: ``Encoded``, ``KVCache``, ``BranchWindow``, their logical axes, ``init_cache``, the
  window and branch writes (``commit_branch``);
- ``specjax.models.layers``: the Flax building blocks, one encoder and one decoder block;
- ``specjax.models.network``: the encoder and decoder stacks, ``Transformer``;
- ``specjax.models.contract``: the pure functions ``encode``, ``decode``, ``decode_branches``, ``logits``, the
  parameters' initialisation, shapes and logical axes;
- ``specjax.models.scan``: stacked (scanned) layers, ``stack_layers`` and the scanned encode / decode;
- ``specjax.models.model``: ``T5Model``.

This module is their public face: ``from specjax.models.t5 import X`` and ``t5.X`` reach every name.
"""

from __future__ import annotations

from specjax.config import T5Config  # noqa: F401
from specjax.models.cache import (  # noqa: F401
    CACHE_AXES,
    ENCODED_AXES,
    SLICE_ROWS_MAX,
    BranchWindow,
    Encoded,
    KVCache,
    commit_branch,
    init_cache,
    logical_axes,
)
from specjax.models.contract import (  # noqa: F401
    Params,
    abstract_params,
    count_params,
    decode,
    decode_branches,
    encode,
    encoder_outputs,
    init_params,
    logits,
    param_logical_axes,
)
from specjax.models.layers import (  # noqa: F401
    DROPOUT_STYLES,
    MLP,
    NEG_INF,
    DecoderLayer,
    Dense,
    Embed,
    EncoderLayer,
    Projections,
    RelativePositionBias,
    RMSNorm,
    _dropout,
    relative_position_bucket,
)
from specjax.models.model import T5Model, _stacked_copy_fits  # noqa: F401
from specjax.models.network import Decoder, Encoder, Transformer  # noqa: F401
from specjax.models.numerics import _dense_matmul, fixed_order_max, fixed_order_softmax, fixed_order_sum  # noqa: F401
from specjax.models.scan import (  # noqa: F401
    LAYERS_AXIS,
    TRANSPOSED_STACKS,
    decode_branches_scanned,
    decode_scanned,
    encode_scanned,
    stack_layers,
    stacked_logical_axes,
    stacked_param_logical_axes,
    unstack_layers,
)

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
