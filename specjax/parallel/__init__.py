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

The package lives in modules by concern, imports flowing one way (each imports only those above it):

- ``specjax.parallel.mesh``: ``make_mesh``, parameter shardings and placement, the process helpers;
- ``specjax.parallel.programs``: ``data_parallel_sample`` / ``model_parallel_sample`` and their compiled programs;
- ``specjax.parallel.runner``: ``maybe_initialize_distributed``, the CLI flags' ``decode_fn_from_flags``.

This package is their public face: ``from specjax.parallel import X`` and ``parallel.X`` reach every name.
"""

from __future__ import annotations

from specjax.decoding.sharding import (  # the rules and the mesh wrapper, shared with the slot programs
    DATA,  # noqa: F401
    MODEL,  # noqa: F401
    STANDARD_RULES,
    Rules,
    _cache_axes,  # noqa: F401  (specjax.aot reads it here)
    _drop_axis,  # noqa: F401
    _encoded_axes,  # noqa: F401  (specjax.aot reads it here)
    _MeshT5Decoding,  # noqa: F401
    activation_shardings,
    batch_sharding,
    logical_to_mesh_spec,
    mesh_decoding_model,
    mesh_draft_source,
)
from specjax.parallel.mesh import (
    _path_name,  # noqa: F401
    host_loading,
    is_process_zero,
    make_mesh,
    param_shardings,
    parse_mesh,
    place_decoding_params,
    process_mesh,
    replicate_params,
    shard_params,
    value_of_process_zero,
)
from specjax.parallel.programs import (
    SampleProgram,
    _data_parallel_jit,  # noqa: F401
    _split_call,  # noqa: F401
    data_parallel_program,
    data_parallel_sample,
    model_parallel_program,
    model_parallel_sample,
    num_compiled_programs,
)
from specjax.parallel.runner import ParallelRunner, decode_fn_from_flags, maybe_initialize_distributed

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
