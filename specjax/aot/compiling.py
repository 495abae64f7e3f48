"""Compiling for a TPU slice: one program's memory and costs (``_compile``, ``_piece_costs``), and the loop-free
pieces of one decode iteration (the target's step and window, the draft's step), each its own program with the
loop's shardings and cache shapes.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``k`` window (γ+1), ``L`` cache length.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import parallel
from specjax.aot.hlo import hbm_traffic
from specjax.aot.memory import _memory_bytes, _mesh, _sharded_bytes
from specjax.aot.projection import _PAPER_DRAFTS
from specjax.aot.topologies import Chip
from specjax.config import T5Config
from specjax.models import t5

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


def _abstract_decode_inputs(fns, params, mesh, rules, rows: int, input_length: int, length: int):
    """(the mesh-wrapped model, the rows' ``NamedSharding`` over "data", abstract encoder output and cache of
    ``length`` slots) with the loop's shardings (rows over "data", heads over "model" as ``rules`` say): what the
    decode pieces are traced on."""
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
    return wrapped, batch, encoded, cache


def _piece_trace(fns, params, mesh, rules, rows: int, input_length: int, length: int, window: int):
    """A trace of one decode call ``fns.decode`` with ``window`` tokens per row, the loop's shardings (caches'
    heads over "model" as ``rules`` say, rows over "data") and a cache of ``length`` slots; the cache is donated
    (written in place, as in the loop)."""
    wrapped, batch, encoded, cache = _abstract_decode_inputs(fns, params, mesh, rules, rows, input_length, length)
    window_tokens = jax.ShapeDtypeStruct((rows, window), jnp.int32, sharding=batch)
    positions = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=batch)
    jitted = jax.jit(wrapped.decode, donate_argnums=(3,))
    return lambda: jitted.trace(params, encoded, window_tokens, cache, positions)


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
    num_drafts=(1,),
    branch_gammas=None,
):
    """Compiles the loop-free pieces, each its own program with the loop's parameter shardings (``program``'s
    mesh and rules; data parallel: one device's program) and cache shapes; ``({piece: costs}, {gamma: window /
    step})``.

    The pieces run with the layers unrolled even where the loop scans them: XLA's ``cost_analysis`` counts a
    while loop's body once, so a scanned step would be costed as one layer. Unrolled and scanned layers do the
    same arithmetic on the same bytes.

    With ``num_drafts`` k > 1: the k-branch window ``target_branches_{k}_{g}`` (``_branch_trace``: k · (γ + 1) query
    rows and the kept branch's commit) for each γ of ``branch_gammas`` (default: every window's γ), and the draft's
    step over k · b rows ``draft_step_k{k}`` (the k branches draft side by side); their ratios to the target step
    come back under ``"branches"`` (``{key: {"k_g": window / step}}``) and ``"draft_k"`` (``{key: {"k": c}}``)."""
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
    ks = sorted({k for k in num_drafts if k > 1}) if dcfg is not None else []
    todo = [("target_step", tfns, tparams, rules, 1, shape["gamma"], 1)]
    todo += [(f"target_window_{g}", tfns, tparams, rules, g + 1, g, 1) for g in gammas]
    todo += [
        (f"target_branches_{k}_{g}", tfns, tparams, rules, g + 1, g, k)
        for k in ks
        for g in sorted(branch_gammas or gammas)
    ]
    if dcfg is not None:
        drules = parallel._drop_axis(rules, "data")  # the draft replicated over "model", as the loop has it
        dfns, dparams = _unrolled(dcfg, mesh, drules)
        todo.append(("draft_step", dfns, dparams, drules, 1, shape["gamma"], 1))
        todo += [(f"draft_step_k{k}", dfns, dparams, drules, 1, shape["gamma"], k) for k in ks]
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
    for name, fns, params, prules, window, g, k in todo:
        is_draft = name.startswith("draft_step")
        if not is_draft and reuse.get(name, {}).get("compiled"):
            out[name] = reuse[name]
            continue
        cache_length = shape["output_length"] + g + 1
        if name.startswith("target_branches"):
            log(f"compiling piece {name} ({k} branches x {window} token(s) x {total_rows} row(s)) ...")
            trace = _branch_trace(fns, params, mesh, prules, total_rows, s, cache_length, k, window)
        else:
            log(f"compiling piece {name} ({window} token(s) x {total_rows * k} row(s)) ...")
            trace = _piece_trace(fns, params, mesh, prules, total_rows * k, s, cache_length, window)
        record, compiled = _compile(name, trace, chip.hbm_bytes)
        if compiled is not None:
            record.update(_piece_costs(compiled, chip, floors["draft" if is_draft else "target"]))
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
        for name in out:
            w, d = out[name].get(key), out["draft_step"].get(key) if "draft_step" in out else None
            if name.startswith("target_branches_") and step and w:
                windows.setdefault("branches", {}).setdefault(key, {})[name[len("target_branches_") :]] = w / step
            if name.startswith("draft_step_k") and step and w:
                windows.setdefault("draft_k", {}).setdefault(key, {})[name[len("draft_step_k") :]] = w / step
            if name == "draft_step" and step and d:
                windows.setdefault("draft_k", {}).setdefault(key, {})["1"] = d / step
    out["target_window"] = out[f"target_window_{shape['gamma']}"]
    return out, windows


def _branch_trace(fns, params, mesh, rules, rows: int, input_length: int, length: int, k: int, width: int):
    """A trace of one multi-draft verification (``specjax.decoding.branches``' target call): ``decode_branches``
    of k windows of ``width`` tokens per row (int32[b, k, w] over the committed cache and the row's one encoder
    output), then ``commit_branch`` of one branch into the donated cache, with the loop's shardings (rows over
    "data", caches' heads over "model" as ``rules`` say)."""
    wrapped, batch, encoded, cache = _abstract_decode_inputs(fns, params, mesh, rules, rows, input_length, length)
    window_tokens = jax.ShapeDtypeStruct((rows, k, width), jnp.int32, sharding=batch)
    positions = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=batch)

    def verify(params, encoded, window, cache, positions, branch):
        logits, kv = wrapped.inner.decode_branches(params, encoded, window, cache, positions)
        return logits, wrapped.inner.commit_branch(cache, kv, branch, positions, width)

    jitted = jax.jit(verify, donate_argnums=(3,))
    return lambda: jitted.trace(params, encoded, window_tokens, cache, positions, positions)


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
