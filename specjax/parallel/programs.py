"""One decode call over devices: the plumbing shared by both ways (a traceable sampler's call split into
models, per-row arrays and static arguments; one compiled program per distinct call), ``data_parallel_sample``
(``jax.shard_map`` over "data", a ``lax.while_loop`` per device) and ``model_parallel_sample`` (one ``jax.jit``
program over the ``("data", "model")`` mesh).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``D`` devices."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.decoding import inputs
from specjax.decoding.model import as_decoding_model
from specjax.decoding.result import DecodeResult
from specjax.decoding.sharding import (
    DATA,
    MODEL,
    STANDARD_RULES,
    Rules,
    _check_rules,
    _drop_axis,
    _MeshT5Decoding,
)
from specjax.models.adapter import T5Decoding
from specjax.parallel.mesh import _put, param_shardings
from specjax.quantize import quantized_shardings

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
