"""Meshes and what lies on them: ``make_mesh`` from a ``data:N,model:M`` spec, parameter shardings from the
model's logical axis names through one rules table (``STANDARD_RULES``), parameters placed on a mesh, and the
process helpers of a run over several processes (``process_mesh``, ``is_process_zero``, ``host_loading``)."""

from __future__ import annotations

import re
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.decoding.sharding import (
    DATA,
    MODEL,
    STANDARD_RULES,
    Rules,
    logical_to_mesh_spec,
)
from specjax.models import t5
from specjax.models.adapter import T5Decoding

_MESH_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*:\s*(\d+)\s*$")
_MESH_HELP = (
    "Write it as comma-separated name:size pairs over the axes 'data' and 'model', e.g. "
    "--mesh data:2,model:4; the sizes must multiply to the device count."
)


# ----------------------------------------------------------------------------------------------------------
# Meshes


def parse_mesh(spec: str) -> dict[str, int]:
    """Parses ``"data:2,model:4"`` into ``{"data": 2, "model": 4}`` (an axis left out has size 1).

    Raises:
      ValueError: not ``name:size`` pairs, an axis other than "data" / "model", a repeated axis, or a size
        below 1 (the message says which part and how to write it).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"Mesh spec {spec!r} is empty. {_MESH_HELP}")
    sizes: dict[str, int] = {}
    for part in spec.split(","):
        match = _MESH_RE.match(part)
        if not match:
            raise ValueError(f"Mesh spec {spec!r}: cannot read {part.strip()!r} as name:size. {_MESH_HELP}")
        name, size = match.group(1), int(match.group(2))
        if name not in (DATA, MODEL):
            raise ValueError(
                f"Mesh spec {spec!r}: unknown axis {name!r}; the axes are 'data' (splits the "
                f"batch) and 'model' (splits the weights). {_MESH_HELP}"
            )
        if name in sizes:
            raise ValueError(f"Mesh spec {spec!r}: axis {name!r} is given twice. {_MESH_HELP}")
        if size < 1:
            raise ValueError(f"Mesh spec {spec!r}: axis {name!r} has size {size}; sizes are >= 1. {_MESH_HELP}")
        sizes[name] = size
    return {DATA: sizes.get(DATA, 1), MODEL: sizes.get(MODEL, 1)}


def make_mesh(spec: str | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``("data", "model")`` mesh over all devices (of every process), from a spec like ``"data:2,model:4"``.

    Uses ``jax.make_mesh`` (topology-aware device order on TPU) with ``Auto`` axis types, so ``jax.jit``
    propagates shardings from ``NamedSharding`` inputs and ``with_sharding_constraint``.

    Args:
      spec: ``"data:N,model:M"`` (either part may be left out: size 1); None: ``data:<device count>``.
      devices: the devices to use (default ``jax.devices()``, global across processes).
    Returns:
      ``jax.sharding.Mesh`` with axis names ``("data", "model")`` and shape ``(N, M)``.
    Raises:
      ValueError: a malformed spec (see ``parse_mesh``), or sizes whose product is not the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    count = len(devices)
    sizes = {DATA: count, MODEL: 1} if spec is None else parse_mesh(spec)
    if sizes[DATA] * sizes[MODEL] != count:
        kind = devices[0].platform if devices else "?"
        examples = " or ".join(dict.fromkeys([f"data:1,model:{count}", f"data:{count},model:1"]))
        raise ValueError(
            f"Mesh spec {spec!r} asks for {sizes[DATA]} x {sizes[MODEL]} = {sizes[DATA] * sizes[MODEL]} "
            f"devices but {count} {kind} device(s) are visible (jax.devices()). Choose sizes that multiply to "
            f"{count}, e.g. --mesh {examples}; on CPU, forcing host devices takes "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts."
        )
    auto = (jax.sharding.AxisType.Auto,) * 2
    return jax.make_mesh((sizes[DATA], sizes[MODEL]), (DATA, MODEL), axis_types=auto, devices=devices)


# ----------------------------------------------------------------------------------------------------------
# Parameters: logical axis names -> mesh axes (the rules and ``logical_to_mesh_spec``: ``specjax.decoding.sharding``)


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def param_shardings(config: t5.T5Config, mesh: Mesh, rules: Rules = STANDARD_RULES, *, stacked: bool = False) -> Any:
    """``NamedSharding`` per parameter of a T5 with ``config``, from its logical axes and ``rules``.

    ``stacked``: for the stacked tree of scanned layers (``t5.stack_layers``; leading axis "layers", which
    ``STANDARD_RULES`` replicate).

    Returns:
      a pytree of ``NamedSharding`` with the params' structure (t5x names).
    Raises:
      ValueError: see ``logical_to_mesh_spec`` (collisions, missing rules, indivisible dimensions).
    """
    logical = t5.stacked_param_logical_axes(config) if stacked else t5.param_logical_axes(config)
    shapes = t5.abstract_params(config)
    if stacked:
        shapes = t5.stack_layers(config, shapes)
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    flat, treedef = jax.tree_util.tree_flatten_with_path(logical, is_leaf=is_spec)
    flat_shapes = treedef.flatten_up_to(shapes)
    shardings = [
        NamedSharding(
            mesh,
            logical_to_mesh_spec(tuple(spec), rules, mesh, what=f"parameter {_path_name(path)}", shape=shape.shape),
        )
        for (path, spec), shape in zip(flat, flat_shapes)
    ]
    return jax.tree_util.tree_unflatten(treedef, shardings)


def _put(x, sharding: NamedSharding) -> jax.Array:
    """Places one array; across processes each host supplies its own devices' slices (same full value). An
    abstract array (``jax.ShapeDtypeStruct``, e.g. ``t5.abstract_params`` for an ahead-of-time compile) stays
    abstract and gets ``sharding``."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    if jax.process_count() == 1:
        return jax.device_put(x, sharding)
    if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_params(model: t5.T5Model, mesh: Mesh, rules: Rules = STANDARD_RULES) -> t5.T5Model:
    """The model with every parameter split over ``mesh`` as ``rules`` say (``param_shardings``).

    With ``STANDARD_RULES`` on ``data:N,model:M`` each device holds 1/M of every kernel with a heads /
    joined_kv / mlp / vocab dimension and a full copy of the small rest (layer norms). Host memory must hold
    the model once; each device receives only its slices.

    Args:
      model: a ``T5Model`` (params as numpy or jax arrays).
      mesh: from ``make_mesh``.
      rules: the rules table.
    Returns:
      ``T5Model`` with the same config and params as sharded ``jax.Array``s.
    Raises:
      ValueError: see ``param_shardings``.
    """
    shardings = param_shardings(model.config, mesh, rules)
    return t5.T5Model(model.config, jax.tree_util.tree_map(_put, model.params, shardings))


def replicate_params(model: t5.T5Model, mesh: Mesh) -> t5.T5Model:
    """The model with a full copy of every parameter on every device of ``mesh`` (e.g. a small draft)."""
    replicated = NamedSharding(mesh, P())
    return t5.T5Model(model.config, jax.tree_util.tree_map(lambda x: _put(x, replicated), model.params))


# ----------------------------------------------------------------------------------------------------------
# Bulk decoding over a mesh (``specjax.decoding.slots``, ``specjax.bulk``): the parameter shardings of
# ``model_parallel_sample`` applied to decode slots (the activation wrapper: ``specjax.decoding.sharding``)


def place_decoding_params(fns, params, mesh: Mesh, rules: Rules = STANDARD_RULES):
    """``params`` of the ``DecodingModel`` ``fns`` placed on ``mesh``: a ``T5Decoding``'s split by
    ``param_shardings(config, mesh, rules)`` (stacked for scanned layers), anything else replicated. None stays
    None. Raises ValueError as ``param_shardings``."""
    if params is None:
        return None
    if isinstance(fns, T5Decoding):
        specs = param_shardings(fns.config, mesh, rules, stacked=fns.scan_layers)
        return jax.tree_util.tree_map(_put, params, specs)
    replicated = NamedSharding(mesh, P())
    return jax.tree_util.tree_map(lambda x: _put(x, replicated), params)


def process_mesh(data_parallel: bool = False, mesh: str | None = None) -> Mesh | None:
    """The mesh ``specjax generate --data-parallel`` / ``--mesh data:N,model:M`` decodes on, in this process:
    ``("data", "model")`` over this process's devices (``jax.local_devices()``), ``data:<local devices>`` for
    ``--data-parallel``, None for neither.

    The spec names the whole run's devices (every process's, ``jax.device_count()``): on ``P`` processes the
    data axis is split over the processes (each decodes its share of the input, ``specjax.bulk``) and each
    process gets ``data:N/P,model:M`` of its own devices; so the model axis lies within a process (a host).

    Raises:
      ValueError: both flags given; a malformed mesh (see ``make_mesh``); sizes that do not multiply to the
        device count of all processes, or a data axis that does not split over the processes.
    """
    if data_parallel and mesh:
        raise ValueError(
            "--data-parallel and --mesh are alternatives: --data-parallel splits the slots over all devices "
            "with replicated weights; --mesh data:N,model:M also splits the weights (--mesh data:<devices>,model:1 "
            "is --data-parallel)."
        )
    if not (data_parallel or mesh):
        return None
    local, count = jax.local_devices(), jax.process_count()
    if count == 1 or data_parallel:
        return make_mesh(mesh or None, devices=local)
    sizes = parse_mesh(mesh)
    total = jax.device_count()
    if sizes[DATA] * sizes[MODEL] != total or sizes[DATA] % count:
        per = len(local)
        raise ValueError(
            f"--mesh {mesh} on {count} processes of {per} devices: the mesh spans every process's devices "
            f"({total}) and its data axis is split over the processes, so N*M must be {total} and N a multiple of "
            f"{count} (e.g. --mesh data:{total},model:1 or data:{count},model:{per})."
        )
    return make_mesh(f"data:{sizes[DATA] // count},model:{sizes[MODEL]}", devices=local)


def is_process_zero() -> bool:
    """True on process 0 (``jax.process_index() == 0``; always on one process): the one that writes outputs."""
    return jax.process_index() == 0


def value_of_process_zero(value: int) -> int:
    """``value`` as process 0 has it, on every process (``multihost_utils.broadcast_one_to_all``; e.g. the lines
    already in an output file that only process 0 writes); ``value`` itself on one process. Every process must
    call it (a collective)."""
    if jax.process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def host_loading():
    """A context for loading checkpoints that will be split over a mesh: arrays are created in host memory (the
    CPU backend) rather than on the first accelerator, which a target larger than one device would overflow; a
    no-op without a CPU backend."""
    import contextlib

    try:
        return jax.default_device(jax.local_devices(backend="cpu")[0])  # this process's (jax.devices: all's)
    except RuntimeError:
        return contextlib.nullcontext()
