"""Decoding across devices: data parallel (per-device loops) and model parallel (a ("data", "model") mesh).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``D`` devices,
``l`` layers, ``L`` cache length, ``n`` heads, ``h`` head dim, ``v`` vocab.

Two ways to spread one decode call (``temperature_sample`` or ``speculative_sample``, same arguments):

* ``data_parallel_sample``: the batch is split into ``D`` equal slices, one per device, and every device
  runs its own ``lax.while_loop`` on its slice (``jax.shard_map`` over a 1-D "data" mesh; parameters
  replicated). The loop body holds no collective, so a device whose rows are all finished stops iterating
  instead of stepping in lockstep with the slowest device. A batch that does not divide by ``D`` is padded
  with copies of its last row (so padding never outlives the real rows) that are dropped from the result.
* ``model_parallel_sample``: one ``jax.jit`` program over a ``("data", "model")`` mesh. Parameters are
  placed with ``NamedSharding``s derived from the model's logical axis names
  (``specjax.models.t5.param_logical_axes``) through one rules table (``STANDARD_RULES``, t5x's standard
  rules); the batch is split over "data"; the big kernels over "model", so a target larger than one
  device (T5-XXL: 11B parameters, 22 GB in bfloat16) decodes. The loop is global: its stop test is one
  all-reduced flag, so the data groups step together.

Row ``i`` always uses its own PRNG key (``fold_in(rng, i)``), so the results equal one-device results.
Sources: the JAX sharding guides (``jax.sharding.NamedSharding``, ``jax.shard_map``), t5x
``partitioning.py`` (``standard_logical_axis_rules``, logical-to-mesh mapping).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.decoding import inputs
from specjax.decoding.model import as_decoding_model
from specjax.decoding.result import DecodeResult
from specjax.decoding.sharding import (  # the rules and the mesh wrapper, shared with the slot programs
    DATA,
    MODEL,
    STANDARD_RULES,
    Rules,
    _cache_axes,  # noqa: F401  (specjax.aot reads it here)
    _check_rules,
    _drop_axis,
    _encoded_axes,  # noqa: F401  (specjax.aot reads it here)
    _MeshT5Decoding,
    activation_shardings,
    batch_sharding,
    logical_to_mesh_spec,
    mesh_decoding_model,
    mesh_draft_source,
)
from specjax.models import t5
from specjax.models.adapter import T5Decoding
from specjax.quantize import quantized_shardings

__all__ = [
    "STANDARD_RULES",
    "Rules",
    "make_mesh",
    "parse_mesh",
    "logical_to_mesh_spec",
    "param_shardings",
    "shard_params",
    "replicate_params",
    "data_parallel_sample",
    "model_parallel_sample",
    "SampleProgram",
    "data_parallel_program",
    "model_parallel_program",
    "maybe_initialize_distributed",
    "mesh_decoding_model",
    "mesh_draft_source",
    "place_decoding_params",
    "activation_shardings",
    "batch_sharding",
    "process_mesh",
    "host_loading",
    "is_process_zero",
    "value_of_process_zero",
    "decode_fn_from_flags",
    "ParallelRunner",
    "num_compiled_programs",
]


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


# ----------------------------------------------------------------------------------------------------------
# Shared plumbing: any traceable sampler ``fn(*models, encoder_input_tokens, rng=, temperature=, ...)``

_PER_ROW = ("temperature", "top_k", "top_p")
_PER_ROW_DTYPES = {"temperature": np.float32, "top_k": np.int32, "top_p": np.float32}
# The samplers' defaults: every call passes all three per-row arrays, so a call that sets only the
# temperature and one that also sets top-k / top-p share one program (one pytree structure).
_PER_ROW_DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
_JITTED: list = []  # every jitted program this module built, for num_compiled_programs()


class _Call(NamedTuple):
    """A sampler call split for wrapping: static parts (hashable) and per-row arrays (split over "data")."""

    fn: Callable
    models: tuple  # DecodingModels / draft sources (static)
    params: tuple  # one parameter pytree per model (None for a draft source without parameters)
    static: tuple  # sorted (name, value) keyword arguments that stay static
    tokens: np.ndarray  # int32[b, s]
    keys: np.ndarray  # uint32[b, 2] per-row keys: fold_in(rng, row) of the whole batch
    per_row: dict  # name -> [b] array (temperature, top_k, top_p)


def _split_call(fn: Callable, args, kwargs) -> _Call:
    if not callable(fn):
        raise ValueError(
            f"fn must be a sampler such as specjax.temperature_sample or specjax.speculative_sample, got {fn!r}."
        )
    if len(args) < 2:
        raise ValueError(
            f"got {fn!r} with {len(args)} argument(s); pass a sampler such as "
            "specjax.temperature_sample or specjax.speculative_sample, then its models, then "
            "encoder_input_tokens int[b, s] (e.g. data_parallel_sample(specjax.speculative_sample, "
            "target, draft, tokens, gamma=3, max_decode_length=64))."
        )
    check = getattr(fn, "check_arguments", None)
    if check is not None:  # every value check, eagerly, before anything compiles
        check(*args, **kwargs)
    *models, tokens = args
    tokens = np.asarray(tokens).astype(np.int32)
    b = tokens.shape[0]
    kwargs = dict(kwargs)
    keys = np.asarray(jax.device_get(inputs.row_keys(jnp.asarray(inputs.raw_keys(kwargs.pop("rng", None), b)), b)))
    per_row = {
        k: np.broadcast_to(np.asarray(kwargs.pop(k, _PER_ROW_DEFAULTS[k])).astype(_PER_ROW_DTYPES[k]), (b,))
        for k in _PER_ROW
    }
    fns, params = [], []
    for m in models:
        if hasattr(m, "propose") and hasattr(m, "start"):  # a draft source without parameters
            fns.append(m)
            params.append(None)
        else:
            f, p = as_decoding_model(m, "model")
            fns.append(f)
            params.append(p)
    return _Call(fn, tuple(fns), tuple(params), tuple(sorted(kwargs.items())), tokens, keys, per_row)


def _program(call: _Call, models: tuple):
    """The traced body: ``fn`` on one (slice of the) batch with per-row keys and sampling arrays."""

    def run(params, tokens, keys, per_row):
        pairs = tuple(m if p is None else (m, p) for m, p in zip(models, params))
        return call.fn(*pairs, tokens, rng=keys, **per_row, **dict(call.static))

    return run


def _pad_rows(x: np.ndarray, multiple: int) -> np.ndarray:
    """[b, ...] -> [ceil(b / multiple) * multiple, ...], padded with copies of the last row."""
    extra = -x.shape[0] % multiple
    return np.concatenate([x, np.repeat(x[-1:], extra, axis=0)]) if extra else x


def _to_host(x: jax.Array) -> np.ndarray:
    if x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class SampleProgram(NamedTuple):
    """One sharded decode, ready to run or to compile: what ``data_parallel_sample`` / ``model_parallel_sample``
    execute (``data_parallel_program`` / ``model_parallel_program`` build it; ``specjax.aot`` compiles it for a
    TPU topology with abstract parameters).

    Attributes:
      jitted: the ``jax.jit`` program, called as ``jitted(params, tokens, keys, per_row)``.
      params: one parameter pytree per model, placed with the program's shardings (``jax.Array``s), or
        ``jax.ShapeDtypeStruct``s with those shardings when the models' parameters were abstract.
      call: the sampler call split into static parts and per-row NumPy arrays (``b`` rows).
      batch_sharding: the ``NamedSharding`` of every per-row argument (rows over "data").
      multiple: rows are padded with copies of the last row to a multiple of this (the data-axis size).
    """

    jitted: Callable
    params: tuple
    call: _Call
    batch_sharding: NamedSharding
    multiple: int

    def batch_arguments(self, abstract: bool = False) -> tuple:
        """``(tokens int32[b', s], keys uint32[b', 2], per_row {name: [b']})`` padded to ``b'`` rows (a multiple of
        ``multiple``), placed with ``batch_sharding``; ``abstract``: as ``jax.ShapeDtypeStruct``s instead."""

        def put(x):
            x = _pad_rows(x, self.multiple)
            if abstract:
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.batch_sharding)
            return _put(x, self.batch_sharding)

        call = self.call
        return put(call.tokens), put(call.keys), {k: put(v) for k, v in call.per_row.items()}

    def trace(self) -> jax.stages.Traced:
        """The traced program for abstract per-row arguments of this call's shapes (``.lower().compile()``
        compiles what ``run`` runs, without placing anything)."""
        return self.jitted.trace(self.params, *self.batch_arguments(abstract=True))

    def run(self) -> DecodeResult:
        """Runs the program: ``DecodeResult`` of NumPy arrays for the ``b`` rows (padding rows dropped)."""
        b = self.call.tokens.shape[0]
        out = self.jitted(self.params, *self.batch_arguments())
        return jax.tree_util.tree_map(lambda x: _to_host(x)[:b], out)


def num_compiled_programs() -> int:
    """How many XLA programs this module's jitted decodes hold (sum of their jit caches).

    One per distinct (sampler, models, static settings, mesh, input shapes): repeated batches of one shape
    reuse one program, whatever their sampling values. Uses ``jax.jit``'s ``_cache_size()``.
    """
    return sum(f._cache_size() for f in _JITTED)


# ----------------------------------------------------------------------------------------------------------
# Data parallel


@functools.lru_cache(maxsize=64)
def _data_parallel_jit(fn, models, static, mesh: Mesh):
    run = _program(_Call(fn, models, (), static, None, None, {}), models)
    # One while loop per device: params replicated (P()), rows split over "data", no collective inside.
    per_device = jax.shard_map(
        run, mesh=mesh, in_specs=(P(), P(DATA), P(DATA), P(DATA)), out_specs=P(DATA), check_vma=False
    )
    jitted = jax.jit(per_device)
    _JITTED.append(jitted)
    return jitted


def data_parallel_program(fn: Callable, *args, devices: Sequence[jax.Device] | None = None, **kwargs) -> SampleProgram:
    """The program ``data_parallel_sample`` runs for these arguments (same arguments), not yet run.

    Raises:
      ValueError: any argument error of ``fn`` (before anything compiles).
    """
    call = _split_call(fn, args, kwargs)
    devices = list(jax.devices() if devices is None else devices)
    mesh = Mesh(np.asarray(devices), (DATA,))
    replicated = NamedSharding(mesh, P())
    params = jax.tree_util.tree_map(lambda x: _put(x, replicated), call.params)
    jitted = _data_parallel_jit(fn, call.models, call.static, mesh)
    return SampleProgram(jitted, params, call, NamedSharding(mesh, P(DATA)), len(devices))


def data_parallel_sample(fn: Callable, *args, devices: Sequence[jax.Device] | None = None, **kwargs) -> DecodeResult:
    """Runs a sampler (``temperature_sample``, ``speculative_sample``) with its batch split over devices.

    The sampler itself runs under ``jax.shard_map`` over a 1-D "data" mesh: each device runs its own decode
    loop on ``ceil(b / D)`` rows (no collective in the loop, so a device stops when its own rows finish).
    Parameters are replicated on every device (pre-place them with ``replicate_params`` to skip the copy on
    every call). Rows keep the keys ``fold_in(rng, i)`` of the whole batch and their own sampling values,
    so the result equals ``fn(*args, **kwargs)`` on one device. Repeated calls with the same shapes reuse one
    compiled program (``jax.pmap`` over the same samplers gives the same tokens: tests/test_parallel.py).

    Args:
      fn: a traceable sampler taking ``(*models, encoder_input_tokens, rng=, temperature=, top_k=, top_p=,
        ...)``: ``specjax.temperature_sample`` or ``specjax.speculative_sample``.
      *args, **kwargs: ``fn``'s arguments (models, ``encoder_input_tokens`` int[b, s], ``rng``, ...).
      devices: the devices to split over (default: all, ``jax.devices()``).
    Returns:
      ``DecodeResult`` of NumPy arrays for the ``b`` rows, in input order (padding rows dropped).
    Raises:
      ValueError: any argument error of ``fn`` (before anything compiles).
    """
    return data_parallel_program(fn, *args, devices=devices, **kwargs).run()


# ----------------------------------------------------------------------------------------------------------
# Model parallel


@functools.lru_cache(maxsize=64)
def _model_parallel_jit(fn, models, static, mesh: Mesh, all_rules: tuple):
    """models: DecodingModels (or draft sources); all_rules: one rules table per model."""
    wrapped, param_specs = [], []
    for fns, rules in zip(models, all_rules):
        if isinstance(fns, T5Decoding):
            wrapped.append(_MeshT5Decoding(fns, mesh, rules))
            specs = param_shardings(fns.config, mesh, rules, stacked=fns.scan_layers)
            if getattr(fns, "quantized", False):  # int8 kernels (specjax.quantize): values as the kernel, scales copied
                specs = quantized_shardings(specs)
            param_specs.append(specs)
        else:  # a hand-made DecodingModel or a draft source: params replicated, no activation constraints
            wrapped.append(fns)
            param_specs.append(NamedSharding(mesh, P()))
    run = _program(_Call(fn, tuple(wrapped), (), static, None, None, {}), tuple(wrapped))
    batch = NamedSharding(mesh, P(DATA))
    jitted = jax.jit(run, in_shardings=(tuple(param_specs), batch, batch, batch), out_shardings=batch)
    _JITTED.append(jitted)
    return jitted, tuple(param_specs)


def model_parallel_program(
    fn: Callable, *args, mesh: Mesh, rules: Rules = STANDARD_RULES, shard_draft: bool = False, **kwargs
) -> SampleProgram:
    """The program ``model_parallel_sample`` runs for these arguments (same arguments), not yet run.

    Raises:
      ValueError: as ``model_parallel_sample`` (before anything compiles).
    """
    if tuple(mesh.axis_names) != (DATA, MODEL):
        raise ValueError(
            f"model_parallel_sample needs a mesh with axes ('data', 'model'), got "
            f"{mesh.axis_names}; build one with specjax.parallel.make_mesh('data:N,model:M')."
        )
    call = _split_call(fn, args, kwargs)
    _check_rules(rules, mesh)
    rules = tuple(tuple(r) for r in rules)
    all_rules = (rules,) + ((rules if shard_draft else _drop_axis(rules, DATA)),) * (len(call.models) - 1)
    jitted, specs = _model_parallel_jit(fn, call.models, call.static, mesh, all_rules)
    params = tuple(
        None
        if p is None
        else jax.tree_util.tree_map(lambda x, s=s: _put(x, s), p)
        if isinstance(s, NamedSharding)
        else jax.tree_util.tree_map(_put, p, s)
        for p, s in zip(call.params, specs)
    )
    return SampleProgram(jitted, params, call, NamedSharding(mesh, P(DATA)), mesh.shape[DATA])


def model_parallel_sample(
    fn: Callable, *args, mesh: Mesh, rules: Rules = STANDARD_RULES, shard_draft: bool = False, **kwargs
) -> DecodeResult:
    """Runs a sampler as one program over a ``("data", "model")`` mesh, the target's weights split by ``rules``.

    The sampler runs under a sharded ``jax.jit``: the target's parameters are placed with
    ``param_shardings(config, mesh, rules)`` (a no-op if they already are, e.g. from ``shard_params``), the
    batch is split over "data" (padded with copies of the last row to a multiple of the data size), caches and
    encoder outputs are constrained to batch-over-data, heads-over-model. The draft of ``speculative_sample``
    is replicated over "model" unless ``shard_draft``. Results equal ``fn(*args, **kwargs)`` on one device (up
    to float reduction order in the split matmuls).

    Args:
      fn: ``specjax.temperature_sample`` or ``specjax.speculative_sample`` (any traceable sampler with their
        signature).
      *args, **kwargs: ``fn``'s arguments.
      mesh: from ``make_mesh("data:N,model:M")``.
      rules: logical-to-mesh rules for the target (and a sharded draft).
      shard_draft: split the draft's weights like the target's.
    Returns:
      ``DecodeResult`` of NumPy arrays for the ``b`` rows, in input order.
    Raises:
      ValueError: a mesh without axes ("data", "model"); rules with collisions, unknown names or dimensions
        that do not divide by their mesh axis; any argument error of ``fn``.
    """
    return model_parallel_program(fn, *args, mesh=mesh, rules=rules, shard_draft=shard_draft, **kwargs).run()


# ----------------------------------------------------------------------------------------------------------
# Processes and the command line


def maybe_initialize_distributed() -> bool:
    """Calls ``jax.distributed.initialize()`` when this process is one of several (a TPU pod slice, SLURM,
    Open MPI, Kubernetes); a no-op on one process (a laptop, a single-host TPU VM, CPU tests).

    Detection: ``SPECJAX_DISTRIBUTED=1`` / ``0`` forces it on / off; ``JAX_COORDINATOR_ADDRESS`` set means
    on (with ``SPECJAX_NUM_PROCESSES``, ``SPECJAX_PROCESS_ID`` and ``SPECJAX_HEARTBEAT_SECONDS`` passed to
    ``jax.distributed.initialize`` as ``num_processes``, ``process_id``, ``heartbeat_timeout_seconds``: what
    ``specjax generate --processes N`` sets, ``specjax.launch``); otherwise JAX's own cluster detection (the
    environments ``jax.distributed.initialize()`` reads). Must run before anything touches a device (call it
    first thing in the program).

    Returns:
      True if the distributed runtime is (now) initialized, False if this is a single process.
    Raises:
      RuntimeError: (from JAX) a device was used before the call on a multi-process run.
    """
    if jax.distributed.is_initialized():
        return True
    forced = os.environ.get("SPECJAX_DISTRIBUTED")
    if forced == "0":
        return False
    if forced == "1" or os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(**_distributed_arguments())
        return True
    try:
        from jax._src import clusters  # JAX's detection of the environments initialize() understands

        detected = any(
            not env.opt_in_only_method and env.is_env_present() for env in clusters.ClusterEnv._cluster_types
        )
    except Exception:  # private API moved, or a metadata query failed: treat as one process
        detected = False
    if detected:
        jax.distributed.initialize()
    return detected


def _distributed_arguments() -> dict:
    """``jax.distributed.initialize`` keyword arguments from ``SPECJAX_NUM_PROCESSES``, ``SPECJAX_PROCESS_ID``
    and ``SPECJAX_HEARTBEAT_SECONDS`` (each only where set; an int)."""
    out = {}
    for env, name in (
        ("SPECJAX_NUM_PROCESSES", "num_processes"),
        ("SPECJAX_PROCESS_ID", "process_id"),
        ("SPECJAX_HEARTBEAT_SECONDS", "heartbeat_timeout_seconds"),
    ):
        value = os.environ.get(env)
        if value:
            try:
                out[name] = int(value)
            except ValueError:
                raise ValueError(f"{env}={value!r} is not an int.") from None
    return out


@dataclasses.dataclass(frozen=True)
class ParallelRunner:
    """How to run a decode, as chosen by the CLI flags (``decode_fn_from_flags``).

    Call it as ``runner(fn, *args, **kwargs)`` with ``fn`` = ``temperature_sample`` or ``speculative_sample``
    and ``fn``'s arguments: ``fn(*args, **kwargs)`` on one device, ``data_parallel_sample`` or
    ``model_parallel_sample`` on ``mesh``. Returns ``fn``'s ``DecodeResult``.

    Attributes:
      mode: "single", "data" (``--data-parallel``) or "mesh" (``--mesh``).
      mesh: the ``("data", "model")`` mesh in "mesh" mode, else None.
      rules: the logical-to-mesh rules ("mesh" mode).
    """

    mode: str = "single"
    mesh: Mesh | None = None
    rules: Rules = STANDARD_RULES

    def __call__(self, fn: Callable, *args, **kwargs) -> DecodeResult:
        if self.mode == "data":
            return data_parallel_sample(fn, *args, **kwargs)
        if self.mode == "mesh":
            return model_parallel_sample(fn, *args, mesh=self.mesh, rules=self.rules, **kwargs)
        return fn(*args, **kwargs)

    def loading(self):
        """A context for loading checkpoints: in "mesh" mode arrays are created in host memory (the CPU
        backend) rather than on the first accelerator, which a target larger than one device would overflow;
        ``place`` then sends each device its slices. Elsewhere (or without a CPU backend) a no-op."""
        import contextlib

        return host_loading() if self.mode == "mesh" else contextlib.nullcontext()

    def place(self, target: t5.T5Model, draft: t5.T5Model | None = None):
        """Puts the models where the mode wants them once, so calls do not copy them: "mesh": target split
        by ``rules`` (``shard_params``), draft replicated; "data": both replicated on every device; "single":
        unchanged. Returns ``(target, draft)``."""
        if self.mode == "single":
            return target, draft
        mesh = self.mesh if self.mode == "mesh" else Mesh(np.asarray(jax.devices()), (DATA,))
        target = shard_params(target, mesh, self.rules) if self.mode == "mesh" else replicate_params(target, mesh)
        return target, (None if draft is None else replicate_params(draft, mesh))


def decode_fn_from_flags(
    data_parallel: bool = False, mesh: str | None = None, rules: Rules = STANDARD_RULES
) -> ParallelRunner:
    """The decode runner the CLI flags ``--data-parallel`` and ``--mesh data:N,model:M`` ask for.

    Call it (and ``maybe_initialize_distributed()`` before it) before anything touches a device. Returns a
    ``ParallelRunner``: ``runner(fn, *args, **kwargs)`` runs ``fn`` (``temperature_sample`` or
    ``speculative_sample``) plainly with neither flag, with ``data_parallel_sample`` with ``data_parallel``,
    with ``model_parallel_sample`` on ``make_mesh(mesh)`` with ``mesh``.

    Raises:
      ValueError: both flags given, or a malformed mesh / one whose sizes do not multiply to the device
        count (raised here, before any model is loaded onto devices).
    """
    if data_parallel and mesh:
        raise ValueError(
            "--data-parallel and --mesh are alternatives: --data-parallel splits the batch over "
            "all devices with replicated weights; --mesh data:N,model:M also splits the weights "
            "(use --mesh data:<devices>,model:1 for pure data parallelism on a mesh)."
        )
    if data_parallel:
        return ParallelRunner("data")
    if mesh:
        return ParallelRunner("mesh", make_mesh(mesh), tuple(rules))
    return ParallelRunner()
