"""Bulk decoding's programs compiled for a TPU slice ahead of time: the slot insert and the "run until m slots are
free or N iterations" loop of ``specjax.decoding.slots``, their memory per chip, whether anything in the loop
talks to the host, and tokens/s per chip estimated from the HBM traffic of one loop iteration.

Legend for shapes (STYLE.md): ``b`` slots, ``m`` rows inserted at once, ``S`` encoder width, ``T``
max_decode_length, ``L`` cache length, ``D`` devices.

The programs are ``SlotPrograms.empty`` / ``insert`` / ``run`` themselves on the slice's mesh (the bulk path's own
jitted functions with their in / out shardings and donations, traced and compiled with abstract TPU arrays; never
a copy of them), with the models and parameters placed as ``BulkDecoder(mesh=...)`` places them: the target's
weights split by ``STANDARD_RULES`` over "model", the draft replicated, slots over "data", caches' heads over
"model" (``SlotPrograms.slot_shardings``).

Tokens/s per chip = ``b`` × E(α, γ) / t_iteration / ``D``: E(α, γ) = (1 - α^(γ+1)) / (1 - α) the expected tokens
per iteration and slot (Leviathan et al. 2023, §3; 1 for the target alone), t_iteration = max(HBM bytes of one
iteration / bandwidth, matrix flops of one iteration / peak) read from the compiled loop (``loop_iteration_costs``).
An estimate, not a run: it assumes every slot busy (refilled as soon as it frees), and leaves out the inserts
(costed apart, per call), collectives' latency, the loop's scalar work and the host.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import parallel
from specjax.aot.compiling import _abstract_model, _compile
from specjax.aot.hlo import hbm_traffic, host_transfers, loop_analysis, loop_iteration_costs, program_flops
from specjax.aot.memory import (
    HBM_HEADROOM,
    DoesNotFit,
    _cache_layer_bytes,
    _fitting_hint,
    _mesh,
    choose_mesh,
    memory_estimate,
    resolve_config,
)
from specjax.aot.projection import _PAPER_DRAFTS, _paper_rows
from specjax.aot.topologies import CHIPS, GiB, _topology, topology_devices
from specjax.config import T5Config
from specjax.decoding.loop import as_draft_source
from specjax.decoding.slots import SlotPrograms
from specjax.sampling import SamplingParams

__all__ = ["bulk_report", "format_bulk_report", "paper_alpha"]


def paper_alpha(draft: str | None, temperature: float, task: str = "EnDe", paper_table: str | None = None):
    """The paper's measured α (Leviathan et al. 2023, Table 2) for a T5 1.1 draft preset of T5-XXL at
    ``temperature`` on ``task``; None when the table has no such row (another draft, or no table)."""
    for row in _paper_rows(paper_table):
        if _PAPER_DRAFTS.get(row["draft"]) == draft and row["task"] == task and row["temperature"] == temperature:
            return row["paper"]["alpha"]
    return None


def _expected_tokens(alpha: float, gamma: int) -> float:
    """E(α, γ) = (1 - α^(γ+1)) / (1 - α) tokens per iteration (γ + 1 at α = 1; 1 for the target alone)."""
    return float(gamma + 1) if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


class _Built(Exception):
    """Raised in place of running a ``SlotPrograms`` program; carries the jitted program (``args[0]``)."""


def _capture_programs(programs: SlotPrograms) -> None:
    """Makes ``programs`` hand over each program it builds (``SlotPrograms._jit``: ``jax.jit`` with the slots' in /
    out shardings and donations) instead of running it: abstract TPU arrays cannot run here."""
    real = programs._jit

    def capture(*args, **kwargs):
        jitted = real(*args, **kwargs)

        def instead(*_, **__):
            raise _Built(jitted)

        return instead

    programs._jit = capture


def _program(call: Callable[[], Any]):
    """The jitted program a ``SlotPrograms`` method call builds (``_capture_programs``), to trace and compile."""
    try:
        call()
    except _Built as built:
        return built.args[0]
    raise RuntimeError("SlotPrograms ran a program instead of building one; its methods may have changed.")


def _with_shardings(shapes, shardings):
    return jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)


def bulk_report(
    topology: str,
    target: str | T5Config = "t5_1_1_xxl",
    draft: str | T5Config | None = "t5_1_1_small",
    *,
    slots: int = 32,
    gamma: int = 7,
    input_length: int = 512,
    output_length: int = 128,
    temperature: float = 0.0,
    verification: str = "token",
    mesh: str | None = None,
    dtype: str = "bfloat16",
    refill: int | None = None,
    alpha: float | None = None,
    target_alone: bool = True,
    paper_table: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Compiles bulk decoding's slot programs for a TPU slice on this host (no TPU, no weights) and estimates
    tokens/s per chip from one loop iteration's HBM traffic.

    Args:
      topology: a key of ``TOPOLOGIES`` (``v4-8``).
      target, draft: presets, checkpoint directories / ``config.json`` paths or ``T5Config``s; ``draft=None``:
        the target alone only.
      slots: ``b`` decode slots (the bulk batch size). gamma: γ of the speculative run program.
      input_length: ``S``, the slots' encoder width (tokens). output_length: ``T`` (tokens).
      temperature: 0 or 1 (traced: one program); it picks the paper's α. verification: "token" or "block".
      mesh: ``"data:N,model:M"``; None: ``choose_mesh`` at ``slots`` rows. dtype: parameters' and compute dtype.
      refill: ``m``, rows per insert call (default ``b // 4``, as ``BulkDecoder``).
      alpha: α for the expected tokens per iteration; None: the paper's EnDe row for this draft and temperature.
      target_alone: also compile the target alone's run program (γ 0) at the same slots, for the comparison.
      paper_table: the paper's Table 2 rows (default ``configs/paper_table2.json``). log: progress lines.
    Returns:
      a JSON-ready dict: ``topology``, ``chip``, ``mesh``, ``settings``, ``alpha`` and ``alpha_source``,
      ``memory_estimate``, ``programs`` (``empty``, ``insert``, ``run_gamma_<g>``: ``_compile``'s record; the insert
      with ``hbm_traffic_bytes``, ``flops`` (``program_flops``), ``estimate_seconds`` = max(traffic / bandwidth, flops /
      peak) and ``seconds_per_line``; each run with ``loop`` (``loop_analysis``),
      ``host_transfers`` (the whole program's, ``host_transfers``), ``iteration`` (``loop_iteration_costs``),
      ``iteration_seconds``, ``tokens_per_iteration`` (per slot), ``tokens_per_second_per_chip``),
      ``peak_bytes_per_device`` (the largest program's arguments + temporaries + outputs - aliased).
    Raises:
      LibtpuMissing: no libtpu. DoesNotFit: the configuration exceeds a device's HBM (before compiling).
      ValueError: unknown topology / preset, a mesh that does not match the slice, slots not a multiple of the
        data axis, no α known for this draft (pass ``alpha``).
    """
    log = log or (lambda line: None)
    topo = _topology(topology)
    chip = CHIPS[topo.chip]
    devices = topology_devices(topo.name)
    tcfg = resolve_config(target, dtype)
    dcfg = None if draft is None else resolve_config(draft, dtype)
    gamma = gamma if dcfg is not None else 0
    if alpha is None and dcfg is not None:
        alpha = paper_alpha(dcfg.name, temperature, paper_table=paper_table)
        source = "the paper's Table 2, EnDe row of this draft and temperature"
        if alpha is None:
            raise ValueError(
                f"no paper α for draft {dcfg.name!r} at temperature {temperature:g}: pass --alpha (e.g. 0.75)."
            )
    else:
        source = "given"
    shape = dict(batch=slots, input_length=input_length, output_length=output_length, gamma=gamma)
    if mesh is None:
        data, model = choose_mesh(topo.name, tcfg, dcfg, **shape)
    else:
        sizes = parallel.parse_mesh(mesh)
        data, model = sizes["data"], sizes["model"]
    if slots % data:
        raise ValueError(f"--bulk-slots {slots} is not a multiple of the mesh's data axis ({data}): use a multiple.")
    the_mesh = _mesh(devices, data, model)
    need = memory_estimate(tcfg, dcfg, the_mesh, **shape)
    if need["total"] > HBM_HEADROOM * chip.hbm_bytes:
        raise DoesNotFit(
            f"{tcfg.name} ({dtype}) with {dcfg.name if dcfg else 'no draft'} at {slots} slots needs "
            f"{need['total'] / 1e9:.1f} GB per device on {topo.name} with mesh data:{data},model:{model} (a "
            f"{topo.chip} chip has {chip.hbm_bytes / GiB:.0f} GiB): "
            + _fitting_hint(topo, tcfg, dcfg, chip.hbm_bytes, **shape)
        )
    rules = parallel.STANDARD_RULES
    replicated = NamedSharding(the_mesh, P())
    # the models and parameters as BulkDecoder(mesh=...) places them: the target split by the rules, the draft
    # replicated; SlotPrograms wraps both for the mesh (parallel.mesh_decoding_model / mesh_draft_source)
    tfns, tparams = _abstract_model(tcfg, replicated).decoding_model()
    tparams = parallel.place_decoding_params(tfns, tparams, the_mesh, rules)
    source_fns, dparams = None, None
    if dcfg is not None:
        source_fns, dparams = as_draft_source(_abstract_model(dcfg, replicated).decoding_model())
        dparams = parallel.place_decoding_params(None, dparams, the_mesh)
    programs = SlotPrograms(
        tfns,
        source_fns,
        batch=slots,
        max_decode_length=output_length,
        max_gamma=gamma,
        eos_id=1,
        verification=verification,
        mesh=the_mesh,
        rules=rules,
    )
    m = max(1, slots // 4) if refill is None else min(refill, slots)
    m = -(-m // data) * data  # inserts come in multiples of the data size (SlotPrograms.row_multiple)
    report: dict = dict(
        topology=topo.name,
        topology_name=topo.topology_name,
        chip=dataclasses.asdict(chip),
        devices=topo.devices,
        hosts=topo.hosts,
        mesh=dict(data=data, model=model),
        target=tcfg.name,
        draft=None if dcfg is None else dcfg.name,
        settings=dict(
            slots=slots,
            refill=m,
            gamma=gamma,
            input_length=input_length,
            output_length=output_length,
            cache_length=programs.cache_length,
            temperature=temperature,
            verification=verification,
            dtype=dtype,
        ),
        alpha=alpha,
        alpha_source=source,
        memory_estimate=need,
        programs=[],
    )

    def compile_one(name, trace):
        log(f"compiling bulk {name} for {topo.name} (data:{data},model:{model}, {slots} slots) ...")
        record, compiled = _compile(name, trace, chip.hbm_bytes)
        log(f"  {name}: " + (f"{record['compile_seconds']} s" if compiled is not None else record["error"][:300]))
        report["programs"].append(record)
        return record, compiled

    # --- empty: the slots' shapes and the shardings the program hands over --------------------------------------
    _capture_programs(programs)
    make = _program(lambda: programs.empty(tparams, dparams, input_length))
    record, compiled = compile_one("empty", lambda: make.trace(tparams, dparams))
    if compiled is None:
        return report
    slot_shardings = programs.slot_shardings(tparams, dparams, input_length)
    slot_specs = _with_shardings(make.eval_shape(tparams, dparams), slot_shardings)

    # --- insert: m new inputs into their slots (slots donated) --------------------------------------------------
    def spec(shape_, dtype_):
        return jax.ShapeDtypeStruct(shape_, dtype_, sharding=replicated)

    # the m new inputs come from the host replicated (SlotPrograms.insert encodes them split over "data")
    rows_sharding = replicated

    def row_spec(shape_, dtype_):
        return jax.ShapeDtypeStruct(shape_, dtype_, sharding=rows_sharding)

    sampling = _with_shardings(
        jax.eval_shape(lambda: SamplingParams.broadcast(m, temperature)),
        jax.tree_util.tree_map(lambda _: rows_sharding, jax.eval_shape(lambda: SamplingParams.broadcast(m))),
    )

    args = (
        slot_specs,
        row_spec((m, input_length), jnp.int32),
        row_spec((m,), jnp.int32),
        row_spec((m, 2), jnp.uint32),
        sampling,
        spec((), jnp.int32),  # the rows in use (every one on a mesh)
        tparams,
        dparams,
    )
    insert = _program(lambda: programs.insert(tparams, dparams, *args[:5]))
    record, compiled = compile_one("insert", lambda: insert.trace(*args))
    if compiled is not None:
        text = compiled.as_text()
        record["hbm_traffic_bytes"] = hbm_traffic(text)["bytes"]
        record["flops"] = program_flops(text)
        record["traffic_seconds"] = record["hbm_traffic_bytes"] / chip.hbm_bandwidth
        record["mxu_seconds"] = record["flops"] / chip.peak_flops
        record["estimate_seconds"] = max(record["traffic_seconds"], record["mxu_seconds"])
        record["seconds_per_line"] = record["estimate_seconds"] / m
        record["host_transfers"] = host_transfers(text)

    # --- run: the loop until min_done slots are done or max_iterations --------------------------------------------
    scalar = spec((), jnp.int32)
    layer_bytes = _cache_layer_bytes(tcfg, slots // data, programs.cache_length, model)
    for g in [gamma] + ([0] if target_alone and gamma > 0 else []):
        run = _program(lambda g=g: programs.run(tparams, dparams, slot_specs, g, 1, 1))
        record, compiled = compile_one(
            f"run_gamma_{g}", lambda run=run: run.trace(slot_specs, scalar, scalar, tparams, dparams)
        )
        if compiled is None:
            continue
        text = compiled.as_text()
        record["gamma"] = g
        record["loop"] = loop_analysis(text, layer_bytes)
        record["host_transfers"] = host_transfers(text)
        iteration = loop_iteration_costs(text)
        record["iteration"] = iteration
        if iteration is not None:
            traffic_s = iteration["bytes"] / chip.hbm_bandwidth
            mxu_s = iteration["flops"] / chip.peak_flops
            seconds = max(traffic_s, mxu_s)
            tokens = 1.0 if g == 0 else _expected_tokens(alpha, g)
            record.update(
                traffic_seconds=traffic_s,
                mxu_seconds=mxu_s,
                iteration_seconds=seconds,
                tokens_per_iteration=tokens,
                tokens_per_second_per_chip=slots * tokens / seconds / topo.devices,
            )
    used = [
        p["bytes_per_device"]["arguments"]
        + p["bytes_per_device"]["temporaries"]
        + p["bytes_per_device"]["output"]
        - p["bytes_per_device"]["aliased"]
        for p in report["programs"]
        if p["compiled"]
    ]
    report["peak_bytes_per_device"] = max(used) if used else None
    return report


def format_bulk_report(report: dict) -> str:
    """The bulk report as markdown: one row per program (memory per device, host transfers, the loop iteration's
    HBM traffic, flops and estimated tokens/s per chip)."""
    s, chip, mesh = report["settings"], report["chip"], report["mesh"]
    lines = [
        f"Bulk decoding on TPU {report['topology']} ({report['devices']} {chip['name']} chip(s)), mesh "
        f"data:{mesh['data']},model:{mesh['model']}; target {report['target']}, draft {report['draft']}, "
        f"{s['dtype']}, {s['slots']} slots, inserts of {s['refill']} rows, encoder width {s['input_length']}, "
        f"max_decode_length {s['output_length']} (cache {s['cache_length']}), temperature {s['temperature']:g}, "
        f"α {report['alpha']} ({report['alpha_source']}). Compiled on this host, no TPU; times are estimates.",
        "",
        "| program | compile s | per chip GB: arguments | temporaries | output | aliased | host transfers | "
        "iteration HBM GB | iteration GFLOP | iteration ms | tokens / iteration / slot | tokens/s per chip |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["programs"]:
        if not p["compiled"]:
            lines.append(f"| {p['name']} | no: {p['error'].splitlines()[0][:150]} |" + " |" * 10)
            continue
        m = p["bytes_per_device"]
        hosts = p.get("host_transfers")
        cells = [
            p["name"],
            f"{p['compile_seconds']:.1f}",
            f"{m['arguments'] / 1e9:.2f}",
            f"{m['temporaries'] / 1e9:.2f}",
            f"{m['output'] / 1e9:.2f}",
            f"{m['aliased'] / 1e9:.2f}",
            "—" if hosts is None else (", ".join(hosts[:3]) or "none"),
        ]
        if p.get("iteration_seconds"):
            cells += [
                f"{p['iteration']['bytes'] / 1e9:.3f}",
                f"{p['iteration']['flops'] / 1e9:.1f}",
                f"{p['iteration_seconds'] * 1e3:.3f}",
                f"{p['tokens_per_iteration']:.3f}",
                f"{p['tokens_per_second_per_chip']:.0f}",
            ]
        elif p.get("estimate_seconds") is not None:
            one_call = [
                f"{p['hbm_traffic_bytes'] / 1e9:.3f} (one call)",
                f"{p['flops'] / 1e9:.1f}",
                f"{p['estimate_seconds'] * 1e3:.3f} ({p['seconds_per_line'] * 1e3:.3f} per line)",
            ]
            cells += one_call + ["", ""]
        else:
            cells += [""] * 5
        lines.append("| " + " | ".join(cells) + " |")
    runs = {p.get("gamma"): p for p in report["programs"] if p.get("iteration_seconds")}
    for p in runs.values():
        loop = p["loop"]
        coll = ", ".join(f"{op} {v['count']}" for op, v in loop["collectives"].items() if v["count"]) or "none"
        inside = loop["host_transfers"] + loop["host_callbacks"]
        lines.append(
            f"\n{p['name']}: {loop['decode_loops']} decode loop(s); per iteration: collectives {coll}; host "
            f"transfers / callbacks inside the loop: {', '.join(inside) if inside else 'none'}; whole-cache copies "
            f"{loop['cache_copies']['count']}."
        )
    if report.get("peak_bytes_per_device"):
        lines.append(
            f"\nPeak per chip (the largest program's arguments + temporaries + outputs - aliased): "
            f"{report['peak_bytes_per_device'] / 1e9:.2f} GB of {chip['hbm_bytes'] / GiB:.0f} GiB."
        )
    g = report["settings"]["gamma"]
    if g in runs and 0 in runs:
        ratio = runs[g]["tokens_per_second_per_chip"] / runs[0]["tokens_per_second_per_chip"]
        lines.append(f"Speculative (γ {g}) over the target alone at {s['slots']} slots: {ratio:.2f}x (estimate).")
    return "\n".join(lines)
