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
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
import re
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import parallel
from specjax.config import PRESETS, T5Config
from specjax.decoding.baseline import temperature_sample
from specjax.decoding.loop import speculative_sample
from specjax.models import t5

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
    "expected_speedup",
    "compile_report",
    "format_report",
    "PAPER_C",
]

INSTALL_HINT = "pip install 'specjax[tpu-aot]'"
"""How to install libtpu (the ``tpu-aot`` extra pins ``jax[tpu]`` to the installed JAX's version)."""


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip generation, as the roofline sees it (one JAX device per chip: megacore on v4 / v5p).

    Attributes:
      name: "v4", "v5e", "v5p".
      hbm_bytes: HBM per chip (bytes).
      hbm_bandwidth: HBM bandwidth (bytes / second).
      peak_flops: peak bfloat16 matrix throughput (FLOP / second).
    """

    name: str
    hbm_bytes: int
    hbm_bandwidth: float
    peak_flops: float


GiB = 2**30
CHIPS = {
    "v4": Chip("v4", 32 * GiB, 1.2e12, 275e12),
    "v5e": Chip("v5e", 16 * GiB, 819e9, 197e12),
    "v5p": Chip("v5p", 95 * GiB, 2.76e12, 459e12),
}
"""Google Cloud's published per-chip figures: TPU v4 32 GiB at 1.2 TB/s, 275 TFLOP/s bf16; v5e 16 GiB at
819 GB/s, 197 TFLOP/s; v5p 95 GiB at 2.76 TB/s, 459 TFLOP/s."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """A named TPU slice, as ``jax.experimental.topologies.get_topology_desc`` takes it (axlearn's
    ``SystemCharacteristics``).

    Attributes:
      name: the slice's name (``v4-8``: Cloud TPU's count of TensorCores for v4 / v5p, of chips for v5e).
      topology_name: ``"v4:2x2x1"`` (chips along each axis).
      chip: a key of ``CHIPS``.
      chip_config_name: "megacore" (v4, v5p: one device per chip, its two TensorCores together) or "default".
      chips_per_host_bounds: chips per host along each axis ((2, 2, 1): four chips per host).
      devices: JAX devices in the slice (chips).
      hosts: host processes.
    """

    name: str
    topology_name: str
    chip: str
    chip_config_name: str
    chips_per_host_bounds: tuple[int, int, int]
    devices: int
    hosts: int


TOPOLOGIES = {
    t.name: t
    for t in (
        Topology("v4-1", "v4:1x1x1", "v4", "megacore", (1, 1, 1), 1, 1),  # one v4 chip: the paper's setup
        Topology("v4-8", "v4:2x2x1", "v4", "megacore", (2, 2, 1), 4, 1),
        Topology("v4-16", "v4:2x2x2", "v4", "megacore", (2, 2, 1), 8, 2),
        Topology("v4-32", "v4:2x2x4", "v4", "megacore", (2, 2, 1), 16, 4),
        Topology("v5e-1", "v5e:1x1", "v5e", "default", (1, 1, 1), 1, 1),
        Topology("v5e-4", "v5e:2x2", "v5e", "default", (2, 2, 1), 4, 1),
        Topology("v5e-8", "v5e:2x4", "v5e", "default", (2, 4, 1), 8, 1),
        Topology("v5p-8", "v5p:2x2x1", "v5p", "megacore", (2, 2, 1), 4, 1),
        Topology("v5p-16", "v5p:2x2x2", "v5p", "megacore", (2, 2, 1), 8, 2),
    )
}
"""Named slices (axlearn's and Cloud TPU's names); ``v5litepod-N`` is accepted for ``v5e-N``."""

PAPER_C = {"t5_1_1_small": 0.02, "t5_1_1_base": 0.04, "t5_1_1_large": 0.11}
"""c = draft step / target step that Leviathan et al. 2023 report for T5 1.1 drafts of a T5-XXL target (their
Table 4, TPU-v4), keyed by preset."""

_PAPER_DRAFTS = {"T5-small": "t5_1_1_small", "T5-base": "t5_1_1_base", "T5-large": "t5_1_1_large"}
_PAPER_TABLE2 = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "paper_table2.json"
)
HBM_HEADROOM = 0.92
"""A configuration is refused when its estimated bytes per device exceed this fraction of the chip's HBM (the rest
for XLA's temporaries, e.g. 0.9 GB for T5-XXL on one v4 chip)."""


class LibtpuMissing(RuntimeError):
    """libtpu is not installed: no TPU compiler on this host (the message says how to install it)."""


class DoesNotFit(ValueError):
    """A configuration whose parameters and caches exceed a device's HBM (the message names a mesh that fits)."""


def require_libtpu() -> None:
    """Raises ``LibtpuMissing`` (with ``INSTALL_HINT``) when the ``libtpu`` package cannot be imported."""
    if importlib.util.find_spec("libtpu") is None:
        raise LibtpuMissing(
            f"compiling for a TPU ahead of time needs libtpu, the TPU compiler, which is not installed: "
            f"{INSTALL_HINT} (about 680 MB; no TPU needed)."
        )


def _topology(name: str) -> Topology:
    key = re.sub(r"^v5litepod-", "v5e-", name)
    if key not in TOPOLOGIES:
        raise ValueError(f"Unknown TPU topology {name!r}; known: {', '.join(TOPOLOGIES)} (v5litepod-N = v5e-N).")
    return TOPOLOGIES[key]


@functools.lru_cache(maxsize=None)
def topology_devices(name: str) -> tuple:
    """The abstract JAX devices (one per chip) of the named slice; none of them exists on this host.

    Raises:
      ValueError: an unknown name. LibtpuMissing: no libtpu.
    """
    topo = _topology(name)
    require_libtpu()
    # libtpu takes /tmp/libtpu_lockfile for the one process that may drive a host's TPU; a compile-only client
    # drives none, so it must not fail (or block others) because another JAX process on the host holds it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    desc = topologies.get_topology_desc(
        topology_name=topo.topology_name,
        platform="tpu",
        chip_config_name=topo.chip_config_name,
        chips_per_host_bounds=topo.chips_per_host_bounds,
        num_slices=1,
    )
    devices = tuple(desc.devices)
    if len(devices) != topo.devices:
        raise RuntimeError(f"{name}: libtpu lists {len(devices)} devices, expected {topo.devices}.")
    return devices


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


# ----------------------------------------------------------------------------------------------------------
# The compiled HLO text: loops, collectives, what should not be in a loop

_COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
_HOST_OPS = ("infeed", "outfeed", "send", "recv", "send-done", "recv-done")
_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "s4": 0.5,
    "u4": 0.5,
}
_ARRAY_RE = re.compile(r"\b(pred|[sufc]\d+|bf16)\[([\d,]*)\]")
_HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLED_RE = re.compile(r"\b(?:calls|body|condition|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES_RE = re.compile(r"branch_computations=\{([^}]*)\}")


def _shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string (an array ``bf16[4,128]{1,0}`` or a tuple of them)."""
    total = 0.0
    for dtype, dims in _ARRAY_RE.findall(shape):
        total += _DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
    return int(total)


def _parse_instruction(line: str):
    """``(name, shape, opcode, rest)`` of one HLO instruction line, or None."""
    m = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
    if not m:
        return None
    rest = line[m.end() :]
    if rest.startswith("("):  # a tuple shape: up to its matching parenthesis
        depth, end = 0, len(rest)
        for index, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                end = index + 1
                break
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    op = re.match(r"([a-z][\w\-]*)\(", rest)
    return (m.group(1), shape, op.group(1), rest) if op else None


def _computations(hlo: str) -> tuple[dict[str, list], str | None]:
    comps: dict[str, list] = {}
    entry, current = None, None
    for line in hlo.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            m = _HEADER_RE.match(line)
            if m:
                current = m.group(2)
                comps[current] = []
                if m.group(1):
                    entry = current
                continue
        if current is not None and line.strip() == "}":
            current = None
            continue
        if current is not None:
            parsed = _parse_instruction(line)
            if parsed:
                comps[current].append(parsed)
    return comps, entry


def _called(rest: str) -> list[str]:
    names = _CALLED_RE.findall(rest)
    for group in _BRANCHES_RE.findall(rest):
        names += [n.strip().lstrip("%") for n in group.split(",") if n.strip()]
    return names


def _trip_count(comps: dict, condition: str) -> int | None:
    """A while loop's static trip count when its condition is ``counter < constant`` (a ``lax.scan`` /
    ``fori_loop``: XLA's TPU text carries no ``known_trip_count``); None for a data-dependent condition."""
    ops = comps.get(condition, [])
    constants = [re.search(r"constant\((-?\d+)\)", ins[3]) for ins in ops if ins[2] == "constant"]
    if not ops or len(constants) != 1 or not constants[0]:
        return None
    if {ins[2] for ins in ops} - {"parameter", "get-tuple-element", "constant", "compare", "bitcast", "copy"}:
        return None
    return int(constants[0].group(1))


def loop_analysis(hlo: str, cache_layer_bytes: int | None = None) -> dict:
    """What one iteration of the program's decode loop does, read from compiled HLO text.

    Top-level ``while`` loops of the entry computation are split into layer loops (a static trip count: scanned
    layers, ``_trip_count``) and decode loops (a data-dependent condition: every row done). The main decode loop
    is the one with the largest body; its condition and every computation its body calls (fusions, conditionals,
    nested loops) are walked, an instruction inside a nested loop counting its trip count times (once if unknown).

    Args:
      hlo: ``compiled.as_text()``.
      cache_layer_bytes: bytes per device of one layer's cache array; a top-level ``copy`` at least this big is
        counted as a whole-cache copy.
    Returns:
      ``{"top_level_whiles", "decode_loops", "layer_loops": [trip counts], "collectives": {op: {"count",
      "bytes"}}, "host_transfers": [opcodes], "host_callbacks": [custom-call targets], "cache_copies": {"count",
      "bytes"}}`` per iteration of the main decode loop (bytes per device: the collectives' result shapes).
    """
    comps, entry = _computations(hlo)
    whiles = []
    for ins in comps.get(entry, []):
        if ins[2] == "while":
            body = re.search(r"body=%?([\w.\-]+)", ins[3]).group(1)
            cond = re.search(r"condition=%?([\w.\-]+)", ins[3]).group(1)
            whiles.append((body, cond, _trip_count(comps, cond)))
    decode = [w for w in whiles if w[2] is None]
    out = dict(
        top_level_whiles=len(whiles),
        decode_loops=len(decode),
        layer_loops=[w[2] for w in whiles if w[2] is not None],
        collectives={op: {"count": 0, "bytes": 0} for op in _COLLECTIVES},
        host_transfers=[],
        host_callbacks=[],
        cache_copies={"count": 0, "bytes": 0},
    )
    if not whiles:
        return out
    body, cond, _ = max(decode or whiles, key=lambda w: len(comps.get(w[0], [])))
    seen: set[tuple[str, int]] = set()

    def walk(name: str, times: int, in_fusion: bool):
        if (name, times) in seen or name not in comps:
            return
        seen.add((name, times))
        for _, shape, op, rest in comps[name]:
            base = op[: -len("-start")] if op.endswith("-start") else op
            if base in _COLLECTIVES:
                out["collectives"][base]["count"] += times
                out["collectives"][base]["bytes"] += times * _shape_bytes(shape)
            elif op in _HOST_OPS or "S(5)" in shape:
                out["host_transfers"].append(op)
            elif op == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', rest)
                if target and re.search(r"callback|host", target.group(1), re.I):
                    out["host_callbacks"].append(target.group(1))
            elif op == "copy" and not in_fusion and cache_layer_bytes and _shape_bytes(shape) >= cache_layer_bytes:
                out["cache_copies"]["count"] += times
                out["cache_copies"]["bytes"] += times * _shape_bytes(shape)
            trips = 1
            if op == "while":
                sub_cond = re.search(r"condition=%?([\w.\-]+)", rest)
                trips = (_trip_count(comps, sub_cond.group(1)) if sub_cond else None) or 1
            for sub in _called(rest):
                walk(sub, times * trips, in_fusion or op == "fusion")

    walk(body, 1, False)
    walk(cond, 1, False)
    return out


_LAYOUT_ARRAY_RE = re.compile(r"\b(pred|[sufc]\d+|bf16)\[([\d,]*)\](\{[^}]*\})?")
_NO_TRAFFIC = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "after-all",
    "opt-barrier",
    "partition-id",
    "replica-id",
}
_IN_PLACE = ("dynamic-update-slice", "scatter")  # operand 0 is updated where it lies: only the update moves
_SLICING = ("dynamic-slice", "slice", "gather")  # operand 0 is read only where the output comes from


def _arrays(shape: str) -> list[tuple[int, int]]:
    """``(bytes, memory space)`` of each array of an HLO shape string; memory space 0 (no ``S(n)`` in the layout) is
    HBM, ``S(1)`` … are the chip's on-chip memories (``S(5)``: host)."""
    out = []
    for dtype, dims, layout in _LAYOUT_ARRAY_RE.findall(shape):
        nbytes = _DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
        space = re.search(r"S\((\d+)\)", layout or "")
        out.append((int(nbytes), int(space.group(1)) if space else 0))
    return out


def _hbm_bytes(shape: str) -> int:
    return sum(n for n, space in _arrays(shape) if space == 0)


def _operands(rest: str) -> list[str]:
    """Names of an instruction's operands (inside the parentheses after its opcode)."""
    start, depth = rest.index("("), 0
    end = len(rest)
    for index in range(start, len(rest)):
        depth += (rest[index] == "(") - (rest[index] == ")")
        if depth == 0:
            end = index
            break
    return re.findall(r"%([\w.\-]+)", rest[start:end])


def _fused_read(comps: dict, fused: str, index: int, full: int) -> int:
    """Bytes a fusion reads of its operand ``index`` (``full`` bytes): only the slices / gathered rows when every
    use of the parameter (through bitcasts) slices it, nothing when it is only updated in place, else all."""
    ops = comps.get(fused, [])
    params = [i[0] for i in ops if i[2] == "parameter" and re.match(rf"parameter\({index}\)", i[3])]
    if not params:
        return full
    total, frontier = 0, [params[0]]
    while frontier:
        name = frontier.pop()
        for user, shape, op, rest in ops:
            if op == "parameter" or name not in _operands(rest):
                continue
            first = _operands(rest)[0] == name
            if op == "bitcast":
                frontier.append(user)
            elif op in _SLICING and first:
                total += sum(n for n, _ in _arrays(shape))
            elif not (op in _IN_PLACE and first):
                return full
    return min(total, full)


def _fused_write(comps: dict, fused: str, shape: str) -> int:
    """Bytes a fusion writes to HBM: its HBM outputs, or only the update of an in-place root (a
    ``dynamic-update-slice`` / ``scatter`` of a parameter)."""
    ops = comps.get(fused, [])
    written = _hbm_bytes(shape)
    if not ops or not written or ops[-1][2] not in _IN_PLACE:
        return written
    shapes = {i[0]: i[1] for i in ops}
    update = _operands(ops[-1][3])[-1 if ops[-1][2] == "scatter" else 1]
    return sum(n for n, _ in _arrays(shapes.get(update, "")))


def hbm_traffic(hlo: str) -> dict:
    """An estimate of the bytes a compiled TPU program moves between HBM and the chip, read from its HLO text:
    each buffer moved between HBM and on-chip memory counted once.

    XLA's ``cost_analysis()["bytes accessed"]`` sums every instruction's operand and output bytes wherever they
    live. XLA:TPU's memory-space assignment prefetches weights, caches and activations into on-chip memory
    (``copy-start`` / ``slice-start`` into a layout with ``S(n)``) before the instruction that reads them, so a
    prefetched kernel is counted there three times (read from HBM, written on chip, read on chip by its dot).
    Here an array in HBM (no ``S(n)`` in its layout) is counted when an instruction reads or writes it: a
    prefetch or write-back once, on its HBM side; a fusion's HBM operands by what it reads of them (only the
    slices or gathered rows when it slices them, nothing for an operand it updates in place) and its HBM
    outputs (an in-place update: the update only); on-chip operands and outputs are not counted. Instructions
    inside while loops count their trip count times when it is static (``_trip_count``), once otherwise.

    It is a reading of the compiled program's memory spaces, not a run and not XLA's model: it assumes every
    HBM access moves its bytes once and says nothing of bandwidth achieved, overlap or on-chip traffic.

    Args:
      hlo: ``compiled.as_text()`` of a TPU executable.
    Returns:
      ``{"bytes": total HBM bytes per device, "by_opcode": {opcode: bytes}}``.
    """
    comps, entry = _computations(hlo)
    by_opcode: dict[str, int] = {}

    def walk(name: str, times: int) -> None:
        shapes = {ins[0]: ins[1] for ins in comps.get(name, [])}
        for _, shape, op, rest in comps.get(name, []):
            if op in _NO_TRAFFIC or op.endswith("-done"):
                continue
            if op in ("while", "conditional", "call"):
                trips = 1
                if op == "while":
                    cond = re.search(r"condition=%?([\w.\-]+)", rest)
                    trips = (_trip_count(comps, cond.group(1)) if cond else None) or 1
                for sub in _called(rest):
                    walk(sub, times * trips)
                continue
            inputs = [shapes.get(o, "") for o in _operands(rest)]
            arrays = _arrays(shape)
            if op == "copy-start" and len(arrays) >= 2:  # (destination, source, context)
                moved = sum(n for n, space in arrays[:2] if space == 0)
            elif op == "slice-start" and len(arrays) >= 2:  # ((source), destination, context)
                (_, source), (size, destination) = arrays[0], arrays[1]
                moved = size * ((source == 0) + (destination == 0))
            elif op == "fusion":
                fused = re.search(r"calls=%?([\w.\-]+)", rest).group(1)
                moved = sum(_fused_read(comps, fused, i, _hbm_bytes(x)) for i, x in enumerate(inputs) if _hbm_bytes(x))
                moved += _fused_write(comps, fused, shape)
            elif op in _IN_PLACE and len(inputs) >= 2:
                update = inputs[-1 if op == "scatter" else 1]
                moved = _hbm_bytes(update) + (sum(n for n, _ in _arrays(update)) if _hbm_bytes(shape) else 0)
            elif op in _SLICING and inputs:
                moved = (sum(n for n, _ in arrays) if _hbm_bytes(inputs[0]) else 0) + _hbm_bytes(shape)
            else:
                moved = sum(_hbm_bytes(x) for x in inputs) + _hbm_bytes(shape)
            if moved:
                by_opcode[op] = by_opcode.get(op, 0) + times * moved

    if entry is not None:
        walk(entry, 1)
    return dict(bytes=int(sum(by_opcode.values())), by_opcode=dict(sorted(by_opcode.items(), key=lambda kv: -kv[1])))


# ----------------------------------------------------------------------------------------------------------
# Compiling


def _compile(name: str, trace: Callable[[], Any], hbm: int) -> tuple[dict, Any]:
    """Lowers and compiles one program; ``(record, compiled or None)``; the record holds the exact error."""
    record: dict = dict(name=name, compiled=False, hbm_bytes=hbm)
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        lowered = trace().lower()
        record["lower_seconds"] = round(time.perf_counter() - start, 2)
        compiled = lowered.compile()
    except Exception as e:  # the exact error goes in the report
        record["error"] = f"{type(e).__name__}: {e}"[:4000]
        record["compile_seconds"] = round(time.perf_counter() - start, 2)
        return record, None
    record["compile_seconds"] = round(time.perf_counter() - start, 2)
    record["compile_cpu_seconds"] = round(time.process_time() - cpu_start, 2)  # all threads: less load-dependent
    record["compiled"] = True
    mem = compiled.memory_analysis()
    record["generated_code_bytes"] = int(getattr(mem, "generated_code_size_in_bytes", 0))
    record["bytes_per_device"] = dict(
        arguments=int(mem.argument_size_in_bytes),
        temporaries=int(mem.temp_size_in_bytes),
        output=int(mem.output_size_in_bytes),
        aliased=int(getattr(mem, "alias_size_in_bytes", 0)),
    )
    used = mem.argument_size_in_bytes + mem.temp_size_in_bytes + mem.output_size_in_bytes
    used -= getattr(mem, "alias_size_in_bytes", 0)
    record["fits"] = bool(used <= hbm)
    return record, compiled


def _costs(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)))


def _abstract_model(config: T5Config, sharding) -> t5.T5Model:
    params = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), t5.abstract_params(config)
    )
    return t5.T5Model(config, params)


def _piece_trace(fns, params, mesh, rules, rows: int, input_length: int, length: int, window: int):
    """A trace of one decode call ``fns.decode`` with ``window`` tokens per row, the loop's shardings (caches'
    heads over "model" as ``rules`` say, rows over "data") and a cache of ``length`` slots; the cache is donated
    (written in place, as in the loop)."""
    wrapped = parallel._MeshT5Decoding(fns, mesh, rules)
    batch = NamedSharding(mesh, P("data"))

    def spec(x, logical):
        return jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=NamedSharding(mesh, parallel.logical_to_mesh_spec(logical, rules, mesh))
        )

    tokens = jax.ShapeDtypeStruct((rows, input_length), jnp.int32, sharding=batch)
    encoded = jax.eval_shape(wrapped.inner.encode, params, tokens)
    encoded = jax.tree_util.tree_map(spec, encoded, parallel._encoded_axes(encoded))
    cache = jax.eval_shape(lambda: wrapped.inner.init_cache(rows, length))
    cache = jax.tree_util.tree_map(spec, cache, parallel._cache_axes(cache))
    window_tokens = jax.ShapeDtypeStruct((rows, window), jnp.int32, sharding=batch)
    positions = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=batch)
    jitted = jax.jit(wrapped.decode, donate_argnums=(3,))
    return lambda: jitted.trace(params, encoded, window_tokens, cache, positions)


def _cache_layer_bytes(config: T5Config, rows: int, length: int, heads_ways: int) -> int:
    return rows * config.num_heads * length * config.head_dim * jnp.dtype(config.compute_dtype).itemsize // heads_ways


def expected_speedup(alpha: float, gamma: int, c: float, window: float = 1.0) -> float:
    """Expected walltime improvement of speculative decoding over the target alone (Leviathan et al. 2023, §3:
    ``(1 - α^(γ+1)) / ((1 - α)(γc + 1))``), with the verification window's cost ``window`` (in target steps)
    in place of the paper's 1: ``(1 - α^(γ+1)) / ((1 - α)(γc + window))``. α = 1 gives ``(γ+1) / (γc + window)``."""
    tokens = gamma + 1 if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    return tokens / (gamma * c + window)


def _paper_rows(path: str | None) -> list[dict]:
    """The paper's Table 2 rows (``configs/paper_table2.json`` of a checkout, or ``path``); [] with a warning on
    stderr when the file is absent (an installed wheel has no ``configs/``) or unreadable."""
    try:
        with open(path or _PAPER_TABLE2) as f:
            return json.load(f)["rows"]
    except (OSError, KeyError, ValueError) as e:
        print(
            f"specjax aot: no Table 2 projections: cannot read the paper's rows from {path or _PAPER_TABLE2} ({e}); "
            "run from a checkout or pass the file of configs/paper_table2.json (compile_report(paper_table=...)).",
            file=sys.stderr,
        )
        return []


def compile_report(
    topology: str,
    target: str | T5Config = "t5_1_1_xxl",
    draft: str | T5Config | None = "t5_1_1_small",
    *,
    gamma: int = 7,
    batch: int = 1,
    input_length: int = 512,
    output_length: int = 128,
    temperature: float = 0.0,
    verification: str = "token",
    mesh: str | None = None,
    dtype: str = "bfloat16",
    data_parallel: bool = False,
    programs: Sequence[str] = ("speculative_sample", "temperature_sample"),
    pieces: bool = True,
    window_gammas: Sequence[int] | None = None,
    paper_table: str | None = None,
    reuse_pieces: dict | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Compiles the decode programs for a TPU slice on this host (no TPU, no weights) and reports their memory,
    XLA's cost model of each loop piece and the paper's Table 2 projected with it.

    Args:
      topology: a key of ``TOPOLOGIES`` (``v4-1`` one v4 chip, ``v4-8``, ``v5e-8`` / ``v5litepod-8``, ``v5p-8``,
        ``v4-32`` …).
      target, draft: presets (``t5_1_1_xxl``), checkpoint directories / ``config.json`` paths or ``T5Config``s;
        ``draft=None``: the target alone (no speculative program, no draft piece).
      gamma: γ, draft tokens per iteration. batch: ``b`` rows. input_length: ``s`` (tokens, padded width).
      output_length: ``T`` = max_decode_length (tokens). temperature: 0 (greedy) or 1 (traced: the same program).
      verification: "token" or "block". dtype: parameters' and compute dtype.
      mesh: ``"data:N,model:M"`` over the slice's devices; None: ``choose_mesh`` (a data axis no larger than the
        batch, then the smallest model split that fits).
      data_parallel: compile ``data_parallel_sample``'s program (a loop per device, both models replicated).
      programs: which whole programs to compile. pieces: compile the target step, window and draft step.
      window_gammas: more γ values for which the target window is compiled (``window_over_step_by_gamma``;
        default: every γ of the paper rows projected for this draft).
      paper_table: path of the paper's Table 2 rows (default ``configs/paper_table2.json``).
      reuse_pieces: the ``pieces`` of an earlier report for the same target, topology, mesh and shapes: target
        pieces found there are not compiled again (a sweep over drafts).
      log: called with a line before each compile (progress).
    Returns:
      a JSON-ready dict: ``topology``, ``chip``, ``mesh``, ``settings``, ``memory_estimate``, ``programs`` (list of
      ``name, compiled, compile_seconds, generated_code_bytes, bytes_per_device{arguments, temporaries, output},
      hbm_bytes``, ``loop`` (``loop_analysis``) or ``error``), ``pieces`` (``target_step``, ``target_window``,
      ``draft_step``: XLA's ``flops, bytes_accessed, hbm_seconds, mxu_seconds, cost_model_seconds``; the HBM
      traffic read from the HLO ``hbm_traffic_bytes, traffic_seconds``; ``estimate_seconds`` = max(traffic,
      MXU); ``floor_bytes, floor_seconds, decoder_floor_bytes``: ``_piece_costs``), ``c``, ``window_over_step``,
      ``window_over_step_by_gamma`` (from ``estimate_seconds``) and the same from XLA's cost model (``c_cost_model``
      …), ``projections`` (``task, draft, temperature, gamma, paper_alpha, paper_speedup, paper_expected,
      projected_speedup, projected_speedup_cost_model``) and ``cost_model_note``.
    Raises:
      LibtpuMissing: no libtpu. DoesNotFit: the configuration exceeds a device's HBM (before compiling).
      ValueError: unknown topology / preset, a malformed mesh or one whose sizes do not match the slice.
    """
    log = log or (lambda line: None)
    topo = _topology(topology)
    chip = CHIPS[topo.chip]
    devices = topology_devices(topo.name)
    tcfg = resolve_config(target, dtype)
    dcfg = None if draft is None else resolve_config(draft, dtype)
    shape = dict(batch=batch, input_length=input_length, output_length=output_length, gamma=gamma)
    if mesh is None:
        data, model = choose_mesh(topo.name, tcfg, dcfg, data_parallel=data_parallel, **shape)
    else:
        sizes = parallel.parse_mesh(mesh)
        data, model = sizes["data"], sizes["model"]
        if data_parallel and model != 1:
            raise ValueError(f"data parallel replicates the weights: use --mesh data:{topo.devices},model:1.")
    the_mesh = _mesh(devices, data, model)
    need = memory_estimate(tcfg, dcfg, the_mesh, data_parallel=data_parallel, **shape)
    if need["total"] > HBM_HEADROOM * chip.hbm_bytes:
        raise DoesNotFit(
            f"{tcfg.name} ({dtype}) with {dcfg.name if dcfg else 'no draft'} needs {need['total'] / 1e9:.1f} GB per "
            f"device on {topo.name} with mesh data:{data},model:{model} (a {topo.chip} chip has "
            f"{chip.hbm_bytes / GiB:.0f} GiB): {_fitting_hint(topo, tcfg, dcfg, chip.hbm_bytes, **shape)}"
        )
    rules = parallel.STANDARD_RULES
    replicated = NamedSharding(the_mesh, P())
    tmodel = _abstract_model(tcfg, replicated)
    dmodel = None if dcfg is None else _abstract_model(dcfg, replicated)
    tokens = np.full((batch, input_length), 3, np.int32)
    tokens[:, -1] = 1  # EOS
    common = dict(gamma=gamma, max_decode_length=output_length, temperature=temperature, max_input_length=input_length)
    report: dict = dict(
        topology=topo.name,
        topology_name=topo.topology_name,
        chip=dataclasses.asdict(chip),
        devices=topo.devices,
        hosts=topo.hosts,
        mesh=dict(data=data, model=model),
        parallel="data" if data_parallel else "model",
        target=tcfg.name,
        draft=None if dcfg is None else dcfg.name,
        settings=dict(shape, temperature=temperature, verification=verification, dtype=dtype),
        memory_estimate=need,
        programs=[],
        pieces={},
        cost_model_note=(
            "No time here is a measurement. estimate_seconds (used for c, window / step and the projections) is "
            "the larger of the HBM traffic read from the compiled HLO (each buffer moved between HBM and on-chip "
            "memory counted once: hbm_traffic) over the chip's HBM bandwidth and XLA's flops over its peak bf16 "
            "FLOP/s; cost_model_seconds is XLA's cost model as it stands (cost_analysis bytes accessed, which "
            "counts each on-chip prefetch of a kernel or cache as more accesses, over the bandwidth, or the MXU "
            "time if larger). floor = (weights a step reads + caches and cross-attention memory, per device) / "
            "bandwidth. Pieces are compiled with the layers unrolled (cost_analysis counts a loop body once)."
        ),
    )
    rows = -(-batch // (topo.devices if data_parallel else data))
    length = output_length + gamma + 1
    heads_ways = 1 if data_parallel else model

    def build(fn, *models, **kwargs):
        if data_parallel:
            return parallel.data_parallel_program(fn, *models, tokens, devices=list(devices), **kwargs)
        return parallel.model_parallel_program(fn, *models, tokens, mesh=the_mesh, rules=rules, **kwargs)

    spec_program = (
        None if dmodel is None else build(speculative_sample, tmodel, dmodel, verification=verification, **common)
    )
    base_program = build(
        temperature_sample,
        tmodel,
        max_decode_length=output_length,
        temperature=temperature,
        max_input_length=input_length,
    )
    known = dict(speculative_sample=spec_program, temperature_sample=base_program)
    for name in programs:
        if name not in known:
            raise ValueError(f"Unknown program {name!r}; choose from {', '.join(known)}.")
        program = known[name]
        if program is None:  # speculative_sample without a draft
            continue
        log(f"compiling {name} for {topo.name} (data:{data},model:{model}) ...")
        record, compiled = _compile(name, program.trace, chip.hbm_bytes)
        if compiled is not None:
            record["loop"] = loop_analysis(compiled.as_text(), _cache_layer_bytes(tcfg, rows, length, heads_ways))
        log(f"  {name}: {_one_line(record)}")
        report["programs"].append(record)

    if pieces:
        report["pieces"], report["window_over_step_by_gamma"] = _pieces(
            spec_program or base_program,
            tcfg,
            dcfg,
            devices,
            the_mesh,
            data_parallel,
            rows,
            length,
            heads_ways,
            chip,
            need,
            shape,
            log,
            window_gammas,
            _paper_rows(paper_table),
            reuse_pieces or {},
        )
        _summarise(report, _paper_rows(paper_table))
    return report


def _one_line(record: dict) -> str:
    if not record["compiled"]:
        return f"error after {record['compile_seconds']} s: {record['error'].splitlines()[0][:200]}"
    m = record["bytes_per_device"]
    return (
        f"{record['compile_seconds']} s, code {record['generated_code_bytes'] / 1e6:.1f} MB, per device "
        f"{m['arguments'] / 1e9:.2f} + {m['temporaries'] / 1e9:.2f} GB"
    )


def _unrolled(config: T5Config, mesh, rules):
    """``(DecodingModel, params)`` of ``config`` with its layers unrolled, parameters abstract and placed with
    ``param_shardings(config, mesh, rules)`` (the platform's choices follow from their devices)."""
    shardings = parallel.param_shardings(config, mesh, rules)
    params = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), t5.abstract_params(config), shardings
    )
    model = t5.T5Model(config, params)
    try:
        return model.decoding_model(scan_layers=False)
    except TypeError:  # a T5Model whose layers are never scanned
        return model.decoding_model()


def _pieces(
    program,
    tcfg,
    dcfg,
    devices,
    mesh,
    data_parallel,
    rows,
    length,
    heads_ways,
    chip,
    need,
    shape,
    log,
    window_gammas,
    paper_rows,
    reuse,
):
    """Compiles the loop-free pieces, each its own program with the loop's parameter shardings (``program``'s
    mesh and rules; data parallel: one device's program) and cache shapes; ``({piece: costs}, {gamma: window /
    step})``.

    The pieces run with the layers unrolled even where the loop scans them: XLA's ``cost_analysis`` counts a
    while loop's body once, so a scanned step would be costed as one layer. Unrolled and scanned layers do the
    same arithmetic on the same bytes."""
    del program  # the pieces rebuild the models' parameters unstacked, with the same shardings
    rules = parallel.STANDARD_RULES
    if data_parallel:  # each device runs its own loop on ``rows`` rows: the pieces are one device's programs
        mesh = _mesh(devices[:1], 1, 1)
    tfns, tparams = _unrolled(tcfg, mesh, rules)
    s = shape["input_length"]
    total_rows = rows if data_parallel else rows * mesh.shape["data"]
    gammas = sorted(
        {shape["gamma"]}
        | set(window_gammas or ())
        | {r["gamma"] for r in paper_rows if dcfg is not None and _PAPER_DRAFTS.get(r["draft"]) == dcfg.name}
    )
    todo = [("target_step", tfns, tparams, rules, 1, shape["gamma"])]
    todo += [(f"target_window_{g}", tfns, tparams, rules, g + 1, g) for g in gammas]
    if dcfg is not None:
        drules = parallel._drop_axis(rules, "data")  # the draft replicated over "model", as the loop has it
        dfns, dparams = _unrolled(dcfg, mesh, drules)
        todo.append(("draft_step", dfns, dparams, drules, 1, shape["gamma"]))
    floors = dict(  # (what a step reads of the weights, the whole decoder's weights), each + caches and memory
        target=(
            need["target_step_params"] + _memory_bytes(tcfg, rows, s, length, heads_ways),
            need["target_decoder_params"] + _memory_bytes(tcfg, rows, s, length, heads_ways),
        ),
        draft=None
        if dcfg is None
        else tuple(
            _sharded_bytes(dcfg, _mesh(devices[:1], 1, 1), rules)[i] + _memory_bytes(dcfg, rows, s, length, 1)
            for i in (2, 1)
        ),
    )
    out, windows = {}, {}
    for name, fns, params, prules, window, g in todo:
        if name != "draft_step" and reuse.get(name, {}).get("compiled"):
            out[name] = reuse[name]
            continue
        log(f"compiling piece {name} ({window} token(s) x {total_rows} row(s)) ...")
        cache_length = shape["output_length"] + g + 1
        trace = _piece_trace(fns, params, mesh, prules, total_rows, s, cache_length, window)
        record, compiled = _compile(name, trace, chip.hbm_bytes)
        if compiled is not None:
            record.update(_piece_costs(compiled, chip, floors["draft" if name == "draft_step" else "target"]))
        log(
            f"  {name}: "
            + (
                f"{record['estimate_seconds'] * 1e3:.2f} ms (HBM traffic estimate), "
                f"{record['cost_model_seconds'] * 1e3:.2f} ms (XLA's cost model)"
                if compiled
                else record["error"]
            )
        )
        out[name] = record
    for key in ("estimate_seconds", "cost_model_seconds"):
        step = out["target_step"].get(key)
        for g in gammas:
            w = out[f"target_window_{g}"].get(key)
            if step and w:
                windows.setdefault(key, {})[str(g)] = w / step
    out["target_window"] = out[f"target_window_{shape['gamma']}"]
    return out, windows


def _piece_costs(compiled, chip: Chip, floor: tuple[int, int]) -> dict:
    """A piece's costs: XLA's (``flops``, ``bytes_accessed``; ``hbm_seconds`` = bytes accessed / bandwidth,
    ``mxu_seconds`` = flops / peak, ``cost_model_seconds`` the larger), the HBM traffic read from its HLO
    (``hbm_traffic_bytes``, ``traffic_seconds``; ``estimate_seconds`` = the larger of it and ``mxu_seconds``:
    what c, window / step and the projections use), and the floors (``floor_bytes``: the weights a step reads +
    caches and memory, per device; ``decoder_floor_bytes``: every decoder-side weight + caches and memory)."""
    out = _costs(compiled)
    out["hbm_traffic_bytes"] = hbm_traffic(compiled.as_text())["bytes"]
    out["hbm_seconds"] = out["bytes_accessed"] / chip.hbm_bandwidth
    out["mxu_seconds"] = out["flops"] / chip.peak_flops
    out["cost_model_seconds"] = max(out["hbm_seconds"], out["mxu_seconds"])
    out["traffic_seconds"] = out["hbm_traffic_bytes"] / chip.hbm_bandwidth
    out["estimate_seconds"] = max(out["traffic_seconds"], out["mxu_seconds"])
    out["floor_bytes"], out["decoder_floor_bytes"] = floor
    out["floor_seconds"] = floor[0] / chip.hbm_bandwidth
    return out


def _summarise(report: dict, paper_rows: list[dict]) -> None:
    """Adds ``c``, ``window_over_step`` and ``projections`` from the pieces' ``estimate_seconds`` (HBM traffic
    read from the HLO, or the MXU time if larger), and the same from XLA's raw cost model (``cost_model_seconds``)
    as ``c_cost_model``, ``window_over_step_cost_model`` and each projection's ``projected_speedup_cost_model``."""
    pieces = report["pieces"]
    by_gamma = report.pop("window_over_step_by_gamma", {}) or {}
    for key, suffix in (("estimate_seconds", ""), ("cost_model_seconds", "_cost_model")):
        step = pieces.get("target_step", {}).get(key)
        draft = pieces.get("draft_step", {}).get(key)
        window = pieces.get("target_window", {}).get(key)
        report["c" + suffix] = draft / step if step and draft else None
        report["window_over_step" + suffix] = window / step if step and window else None
        report["window_over_step_by_gamma" + suffix] = by_gamma.get(key, {})
    report["paper_c"] = PAPER_C.get(report["draft"])
    projections = []
    for row in paper_rows:
        if _PAPER_DRAFTS.get(row["draft"]) != report["draft"] or report["c"] is None:
            continue
        alpha, g = row["paper"]["alpha"], row["gamma"]
        w = report["window_over_step_by_gamma"].get(str(g), report["window_over_step"])
        w_model = report["window_over_step_by_gamma_cost_model"].get(str(g), report["window_over_step_cost_model"])
        raw = None if report["c_cost_model"] is None else expected_speedup(alpha, g, report["c_cost_model"], w_model)
        projections.append(
            dict(
                task=row["task"],
                draft=row["draft"],
                temperature=row["temperature"],
                gamma=g,
                paper_alpha=alpha,
                paper_speedup=row["paper"]["speedup"],
                paper_expected=(
                    None if report["paper_c"] is None else round(expected_speedup(alpha, g, report["paper_c"]), 3)
                ),
                window_over_step=w,
                projected_speedup=round(expected_speedup(alpha, g, report["c"], w), 3),
                projected_speedup_cost_model=None if raw is None else round(raw, 3),
            )
        )
    report["projections"] = projections


# ----------------------------------------------------------------------------------------------------------
# The table


def _gb(x) -> str:
    return "—" if x is None else f"{x / 1e9:.2f}"


def format_report(report: dict) -> str:
    """The report as markdown tables (programs, pieces, loop, projections)."""
    chip = report["chip"]
    s = report["settings"]
    mesh = report["mesh"]
    lines = [
        f"TPU {report['topology']} ({report['topology_name']}, {report['devices']} {chip['name']} device(s), "
        f"{report['hosts']} host(s)), {report['parallel']} parallel, mesh data:{mesh['data']},model:{mesh['model']}; "
        f"target {report['target']}, draft {report['draft']}, {s['dtype']}, γ {s['gamma']}, batch {s['batch']}, "
        f"{s['input_length']} in / {s['output_length']} out, temperature {s['temperature']}, {s['verification']} "
        "verification. Compiled on this host, no TPU.",
        "",
        "| program | compiled | compile s | code MB | per device GB: arguments | temporaries | output | of HBM GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in report["programs"]:
        if p["compiled"]:
            m = p["bytes_per_device"]
            lines.append(
                f"| {p['name']} | yes | {p['compile_seconds']:.1f} | {p['generated_code_bytes'] / 1e6:.1f} | "
                f"{_gb(m['arguments'])} | {_gb(m['temporaries'])} | {_gb(m['output'])} | {_gb(p['hbm_bytes'])} |"
            )
        else:
            lines.append(
                f"| {p['name']} | no: {p['error'].splitlines()[0][:150]} | {p['compile_seconds']:.1f} | | | | | |"
            )
    pieces = report.get("pieces") or {}
    if pieces:
        lines += [
            "",
            "Per piece, not a measurement: XLA's cost model (GB accessed, its HBM ms = bytes accessed / "
            f"{chip['hbm_bandwidth'] / 1e9:.0f} GB/s; it counts each on-chip prefetch as more accesses) and the "
            "HBM traffic read from the compiled HLO (each buffer moved between HBM and the chip once); MXU ms = "
            f"flops / {chip['peak_flops'] / 1e12:.0f} TFLOP/s; estimate = max(traffic, MXU), what c and window / "
            "step use; floor = (weights a step reads + caches and memory per device) / bandwidth.",
            "",
            "| piece | compile s | GFLOP | XLA GB accessed | XLA ms | HBM traffic GB | MXU ms | estimate ms | floor ms "
            "| XLA / floor | estimate / floor |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        names = ["target_step"] + sorted(k for k in pieces if k.startswith("target_window_")) + ["draft_step"]
        for name in names:
            p = pieces.get(name)
            if p is None:
                continue
            if not p["compiled"]:
                lines.append(f"| {name} | no: {p['error'].splitlines()[0][:150]} | | | | | | | | | |")
                continue
            lines.append(
                f"| {name} | {p['compile_seconds']:.1f} | {p['flops'] / 1e9:.1f} | {p['bytes_accessed'] / 1e9:.3f} | "
                f"{p['cost_model_seconds'] * 1e3:.3f} | {p['hbm_traffic_bytes'] / 1e9:.3f} | "
                f"{p['mxu_seconds'] * 1e3:.3f} | {p['estimate_seconds'] * 1e3:.3f} | {p['floor_seconds'] * 1e3:.3f} | "
                f"{p['cost_model_seconds'] / p['floor_seconds']:.2f} | "
                f"{p['estimate_seconds'] / p['floor_seconds']:.2f} |"
            )
        for suffix, what in (("", "HBM traffic estimate"), ("_cost_model", "XLA's cost model")):
            c, w = report.get("c" + suffix), report.get("window_over_step" + suffix)
            lines += [
                "",
                f"{what}: c = draft step / target step = {'—' if c is None else f'{c:.4f}'} (paper, Table 4: "
                f"{report.get('paper_c') or '—'}); window / step = {'—' if w is None else f'{w:.3f}'} at γ "
                f"{s['gamma']} (the paper's formula assumes 1)"
                + "".join(f"; γ {g}: {v:.3f}" for g, v in report.get("window_over_step_by_gamma" + suffix, {}).items())
                + ".",
            ]
    for p in report["programs"]:
        loop = p.get("loop")
        if not loop:
            continue
        coll = ", ".join(f"{op} {v['count']} ({v['bytes'] / 1e6:.2f} MB)" for op, v in loop["collectives"].items())
        bad = loop["host_transfers"] + loop["host_callbacks"]
        lines.append(
            f"\n{p['name']}: {loop['decode_loops']} decode loop(s) at top level (and {len(loop['layer_loops'])} "
            f"layer loop(s), trip counts {loop['layer_loops']}); per decode iteration: {coll}; host "
            f"transfers / callbacks: {', '.join(bad) if bad else 'none'}; whole-cache copies: "
            f"{loop['cache_copies']['count']} ({loop['cache_copies']['bytes'] / 1e6:.1f} MB)."
        )
    if report.get("projections"):
        lines += [
            "",
            "Paper Table 2 rows projected with this c and window cost: (1 - α^(γ+1)) / ((1 - α)(γc + w)) "
            "(Leviathan et al. 2023, §3, with w = window / step; the paper's formula has w = 1); projected from the "
            "HBM traffic estimate, and from XLA's cost model as it stands.",
            "",
            "| task | draft | temperature | γ | paper α | paper speedup | Table 4 expectation | w | projected | "
            "projected, XLA's cost model |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["projections"]:
            raw = r.get("projected_speedup_cost_model")
            lines.append(
                f"| {r['task']} | {r['draft']} | {r['temperature']} | {r['gamma']} | {r['paper_alpha']} | "
                f"{r['paper_speedup']}x | {r['paper_expected']}x | {r['window_over_step']:.3f} | "
                f"{r['projected_speedup']:.2f}x | {'—' if raw is None else f'{raw:.2f}x'} |"
            )
    return "\n".join(lines)
