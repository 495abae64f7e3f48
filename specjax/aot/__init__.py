"""Ahead-of-time TPU compiles: the decode programs ``specjax.parallel`` runs, compiled and costed on a CPU host.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``k`` window (γ+1),
``D`` devices, ``n`` heads, ``h`` head dim, ``L`` cache length, ``l`` decoder layers.

With ``libtpu`` installed (``pip install 'specjax[tpu-aot]'``), ``jax.experimental.topologies.get_topology_desc``
gives the abstract devices of a named TPU slice; a mesh over them, parameters as ``jax.ShapeDtypeStruct``s with
``NamedSharding``s (``specjax.models.t5.abstract_params``: no weights read) and
``jax.jit(...).trace(...).lower().compile()`` give the TPU executable with its ``memory_analysis()``,
``cost_analysis()`` and compiled HLO text. This is how MaxText (``train_compile.py``, ``compile_topology=``) and
axlearn (``run_aot_compilation``; its ``SystemCharacteristics`` table of topologies) check large TPU programs
before renting the hardware.

``compile_report`` compiles, for one topology and mesh:

* the whole programs, ``speculative_sample`` and ``temperature_sample``, through the very jitted functions
  ``model_parallel_sample`` / ``data_parallel_sample`` build (``parallel.model_parallel_program`` /
  ``parallel.data_parallel_program``), never a copy of them;
* the loop-free pieces of one iteration, each its own program with the loop's shardings and cache shapes: the
  target's one-token step, its (γ+1)-token verification window, the draft's one-token step.

What it reports, and what it cannot tell: memory per device (XLA's buffer assignment: arguments, temporaries,
outputs) is what the TPU would allocate. Times are **XLA's cost model, not a measurement**: each piece's flops
and bytes accessed (``cost_analysis()``) divided by the chip's peak bfloat16 matrix throughput and HBM bandwidth
(a roofline; the estimate is the larger of the two). It ignores overlap, collectives' latency, the loop's
scalar work and launch overheads, so it is a lower bound for one piece and says nothing about the loop as a
whole (``cost_analysis`` of a while loop counts its body once). The floor beside it is (the weights the decoder
reads + its caches, per device) / bandwidth: what a memory-bound step cannot beat.

Sources: the JAX ahead-of-time lowering guide (``jax.stages``), ``jax.experimental.topologies``; TPU chip figures
from Google Cloud's TPU v4 / v5e / v5p system architecture pages (HBM per chip, HBM bandwidth, peak bf16 FLOP/s);
the speedup formula from Leviathan, Kalman & Matias 2023, section 3 (eq. for the expected walltime improvement),
with the window's cost folded in.

The package, data flowing one way: ``topologies`` (chips, slices, libtpu) → ``hlo`` (reading compiled HLO text)
→ ``memory`` (bytes per device, the mesh that fits) → ``projection`` (the paper's formula and rows) →
``compiling`` (one program's memory and costs; the loop pieces) → ``report`` (``compile_report``,
``format_report``).
"""

# ruff: noqa: F401  (re-exports: the private helpers the benchmarks and tests use keep their ``aot._name``)
from __future__ import annotations

import importlib.util  # ``aot.importlib``: tests patch ``importlib.util.find_spec`` through it

from specjax.aot.bulk import bulk_report, format_bulk_report, paper_alpha
from specjax.aot.compiling import (
    _abstract_model,
    _branch_trace,
    _compile,
    _costs,
    _piece_costs,
    _piece_trace,
    _pieces,
    _unrolled,
)
from specjax.aot.hlo import hbm_traffic, host_transfers, loop_analysis, loop_iteration_costs, program_flops
from specjax.aot.memory import (
    HBM_HEADROOM,
    DoesNotFit,
    _cache_layer_bytes,
    _fitting_hint,
    _memory_bytes,
    _mesh,
    _sharded_bytes,
    choose_mesh,
    memory_estimate,
    resolve_config,
)
from specjax.aot.projection import PAPER_C, _paper_rows, expected_speedup
from specjax.aot.report import compile_report, format_report
from specjax.aot.topologies import (
    CHIPS,
    INSTALL_HINT,
    TOPOLOGIES,
    Chip,
    LibtpuMissing,
    Topology,
    _topology,
    require_libtpu,
    topology_devices,
)

__all__ = [
    "Chip",
    "Topology",
    "CHIPS",
    "TOPOLOGIES",
    "INSTALL_HINT",
    "LibtpuMissing",
    "DoesNotFit",
    "require_libtpu",
    "topology_devices",
    "resolve_config",
    "memory_estimate",
    "choose_mesh",
    "loop_analysis",
    "hbm_traffic",
    "loop_iteration_costs",
    "host_transfers",
    "program_flops",
    "expected_speedup",
    "compile_report",
    "format_report",
    "PAPER_C",
    "bulk_report",
    "format_bulk_report",
    "paper_alpha",
]
