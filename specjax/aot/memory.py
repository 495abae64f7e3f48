"""Memory per device before compiling, and the mesh of a slice that fits a decode (``choose_mesh``).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``n`` heads, ``h`` head dim, ``L`` cache length,
``l`` decoder layers.
"""

from __future__ import annotations

import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from specjax import parallel
from specjax.aot.topologies import CHIPS, TOPOLOGIES, GiB, Topology, _topology, topology_devices
from specjax.config import PRESETS, T5Config
from specjax.models import t5

HBM_HEADROOM = 0.92
"""A configuration is refused when its estimated bytes per device exceed this fraction of the chip's HBM (the rest
for XLA's temporaries, e.g. 0.9 GB for T5-XXL on one v4 chip)."""


class DoesNotFit(ValueError):
    """A configuration whose parameters and caches exceed a device's HBM (the message names a mesh that fits)."""


def resolve_config(spec: str | T5Config, dtype: str) -> T5Config:
    """A ``T5Config`` from a preset name (``t5_1_1_xxl``), a checkpoint directory or its ``config.json``
    (Hugging Face; no weights read), or a ``T5Config``, with parameters and compute in ``dtype``.

    Raises:
      ValueError: neither a preset nor an existing path (the message lists the presets).
    """
    if isinstance(spec, T5Config):
        config = spec
    elif spec in PRESETS:
        config = T5Config.preset(spec)
    elif os.path.exists(spec):
        config = T5Config.from_hf_config(spec)
    else:
        raise ValueError(
            f"{spec!r} is neither a T5 preset nor a checkpoint directory / config.json; presets: "
            f"{', '.join(sorted(PRESETS))}."
        )
    return config.replace(dtype=dtype, param_dtype=dtype)


# ----------------------------------------------------------------------------------------------------------
# Memory before compiling


def _sharded_bytes(config: T5Config, mesh, rules) -> tuple[int, int, int]:
    """(bytes per device of all parameters, of the decoder-side ones: everything but ``encoder/``, of those a
    decode step reads: ``_read_by_step``) when placed with ``param_shardings(config, mesh, rules)``."""
    shapes = t5.abstract_params(config)
    shardings = parallel.param_shardings(config, mesh, rules)
    total = decoder = step = 0
    for (path, x), s in zip(
        jax.tree_util.tree_flatten_with_path(shapes)[0], jax.tree_util.tree_leaves(shardings), strict=True
    ):
        ways = math.prod(mesh.shape[a] for a in s.spec if a is not None)
        nbytes = math.prod(x.shape) * jnp.dtype(x.dtype).itemsize // ways
        name = parallel._path_name(path)
        total += nbytes
        if name.split("/")[0] != "encoder":
            decoder += nbytes
        if _read_by_step(config, name):
            step += nbytes
    return total, decoder, step


def _read_by_step(config: T5Config, name: str) -> bool:
    """Whether a decode step reads the parameter ``name`` (``decoder/layers_0/mlp/wo/kernel``) whole: not the
    encoder, not the cross-attention key / value kernels (``encode`` applies them once per call, making the
    memory the step reads) and not the embedding table unless the logits go through it (T5 1.0): a step looks up
    k of its rows."""
    parts = name.split("/")
    if parts[0] == "encoder":
        return False
    if parts[0] == "decoder" and "encoder_decoder_attention" in parts and parts[-2] in ("key", "value"):
        return False
    return parts[0] != "token_embedder" or config.logits_via_embedding


def _memory_bytes(config: T5Config, rows: int, s: int, length: int, heads_ways: int) -> int:
    """Bytes per device of a decoder's self-attention cache ([rows, n, length, h] keys and values per layer)
    and cross-attention memory ([rows, n, s, h] twice per layer), heads split ``heads_ways`` ways."""
    per_layer = 2 * rows * config.num_heads * config.head_dim * (length + s) // heads_ways
    return config.num_decoder_layers * per_layer * jnp.dtype(config.compute_dtype).itemsize


def memory_estimate(
    target: T5Config,
    draft: T5Config | None,
    mesh,
    *,
    batch: int,
    input_length: int,
    output_length: int,
    gamma: int,
    data_parallel: bool = False,
    rules=parallel.STANDARD_RULES,
) -> dict:
    """Bytes per device of the parameters and caches a decode holds, before compiling (no temporaries).

    Model parallel (``data:N,model:M``): the target's parameters as ``rules`` split them over "model", the draft
    replicated, rows split over "data" (``ceil(b / N)`` per device), caches' heads over "model". Data parallel:
    both models replicated, ``ceil(b / D)`` rows per device.

    Returns:
      ``{"target_params", "draft_params", "caches", "total"}`` (bytes per device), ``"target_decoder_params"``
      (the target's parameters but its encoder) and ``"target_step_params"`` (those a decode step reads:
      ``_read_by_step``).
    Raises:
      ValueError: a ``model`` size that does not divide a sharded dimension (``param_shardings``).
    """
    one = jax.sharding.Mesh(np.asarray(mesh.devices).reshape(-1)[:1].reshape(1, 1), ("data", "model"))
    if data_parallel:
        rows, ways, tmesh = -(-batch // mesh.devices.size), 1, one
    else:
        rows, ways, tmesh = -(-batch // mesh.shape["data"]), mesh.shape["model"], mesh
    tp, td, ts = _sharded_bytes(target, tmesh, rules)
    length = output_length + gamma + 1
    caches = _memory_bytes(target, rows, input_length, length, ways)
    dp = 0
    if draft is not None:
        dp = _sharded_bytes(draft, one, rules)[0]
        caches += _memory_bytes(draft, rows, input_length, length, 1)
    return dict(
        target_params=tp,
        target_decoder_params=td,
        target_step_params=ts,
        draft_params=dp,
        caches=caches,
        total=tp + dp + caches,
    )


def _mesh(devices, data: int, model: int):
    return parallel.make_mesh(f"data:{data},model:{model}", devices=list(devices))


def choose_mesh(
    topology: str, target: T5Config, draft: T5Config | None, *, data_parallel: bool = False, **shape
) -> tuple[int, int]:
    """The mesh ``(data, model)`` of ``topology``'s devices that serves ``batch`` best: the data axis never larger
    than the batch (it must divide it), then the smallest model split whose estimated bytes per device
    (``memory_estimate``) fit ``HBM_HEADROOM`` of a chip's HBM (data parallel: ``(D, 1)`` if it fits).

    Why the batch bounds the data axis: a row runs on one data shard, so at batch 1 (the paper's latency setting)
    ``data:4`` would leave three of four chips decoding filler rows while one chip reads all the weights every step
    (on a v4-8 with T5 1.1 XXL bfloat16: 22.4 GB per chip, a 9.56 ms step), where ``model:4`` has every chip read a
    quarter of them (5.7 GB per chip, a 2.38 ms step). At batch 8 on a v4-8 the same rule gives ``data:4,model:1``
    where it fits: the throughput setting.

    Raises:
      DoesNotFit: no split fits; the one-line message names a topology and mesh that do.
    """
    topo = _topology(topology)
    hbm = CHIPS[topo.chip].hbm_bytes
    devices = topology_devices(topo.name)
    batch = int(shape.get("batch", 1))
    splits = (
        [(topo.devices, 1)]
        if data_parallel
        else [(topo.devices // m, m) for m in _divisors(topo.devices) if batch % (topo.devices // m) == 0]
    )
    for data, model in splits:
        try:
            need = memory_estimate(target, draft, _mesh(devices, data, model), data_parallel=data_parallel, **shape)
        except ValueError:  # a model size that does not divide the heads / vocabulary
            continue
        if need["total"] <= HBM_HEADROOM * hbm:
            return data, model
    need = memory_estimate(target, draft, _mesh(devices, *splits[0]), data_parallel=data_parallel, **shape)
    raise DoesNotFit(
        f"{target.name} ({target.dtype}) with {draft.name if draft else 'no draft'} needs "
        f"{need['total'] / 1e9:.1f} GB per device on {topo.name} "
        f"({'data parallel' if data_parallel else f'mesh data:{splits[0][0]},model:{splits[0][1]}'}; "
        f"a {topo.chip} chip has {hbm / GiB:.0f} GiB): {_fitting_hint(topo, target, draft, hbm, **shape)}"
    )


def _divisors(n: int) -> list[int]:
    return [m for m in range(1, n + 1) if n % m == 0]


def _fitting_hint(topo: Topology, target, draft, hbm: int, **shape) -> str:
    """'use --topology X --mesh data:N,model:M (G GB per device)' for the smallest slice of the same chip that
    fits, or advice to use fewer bytes."""
    for other in sorted((t for t in TOPOLOGIES.values() if t.chip == topo.chip), key=lambda t: t.devices):
        for m in _divisors(other.devices):
            try:
                need = memory_estimate(
                    target, draft, _mesh(topology_devices(other.name), other.devices // m, m), **shape
                )
            except ValueError:
                continue
            if need["total"] <= HBM_HEADROOM * hbm:
                flag = "" if other.name == topo.name else f"--topology {other.name} "
                return (
                    f"use {flag}--mesh data:{other.devices // m},model:{m} ({need['total'] / 1e9:.1f} GB per device)."
                )
    return f"no {topo.chip} slice here holds it; use bfloat16 (--dtype bfloat16) or a smaller model."


def _cache_layer_bytes(config: T5Config, rows: int, length: int, heads_ways: int) -> int:
    return rows * config.num_heads * length * config.head_dim * jnp.dtype(config.compute_dtype).itemsize // heads_ways
