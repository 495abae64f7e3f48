"""``compile_report``: the decode programs compiled for a TPU slice, their loop pieces costed and the paper's
Table 2 projected; ``format_report``: the same as markdown tables.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import parallel
from specjax.aot.compiling import _abstract_model, _compile, _one_line, _pieces
from specjax.aot.hlo import loop_analysis
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
from specjax.aot.projection import _paper_rows, _summarise, branch_recovery
from specjax.aot.topologies import CHIPS, GiB, _topology, topology_devices
from specjax.config import T5Config
from specjax.decoding.baseline import temperature_sample
from specjax.decoding.loop import speculative_sample
from specjax.quantize import abstract_quantized_model


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
    num_drafts: Sequence[int] = (1,),
    branch_gammas: Sequence[int] | None = None,
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
      verification: "token" or "block". dtype: parameters' and compute dtype; "int8": weight-only int8 kernels of
        target and draft (``specjax.quantize``) computing in bfloat16, whole programs only (``pieces=False``).
      mesh: ``"data:N,model:M"`` over the slice's devices; None: ``choose_mesh`` (a data axis no larger than the
        batch, then the smallest model split that fits).
      data_parallel: compile ``data_parallel_sample``'s program (a loop per device, both models replicated).
      programs: which whole programs to compile. pieces: compile the target step, window and draft step.
      window_gammas: more γ values for which the target window is compiled (``window_over_step_by_gamma``;
        default: every γ of the paper rows projected for this draft).
      paper_table: path of the paper's Table 2 rows (default ``configs/paper_table2.json``).
      num_drafts: k values; each k > 1 adds the k-branch verification window (``decode_branches`` +
        ``commit_branch``) and the draft's step over k · b rows to the pieces, and ``multi_draft_projections``: the
        paper's rows with k drafts (``projection.multi_draft_tokens``; the model in ``multi_draft_model``).
      branch_gammas: the γ values of the k-branch windows (default: every window's γ).
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
    for k in num_drafts:  # a k without a measured branch acceptance fails here, before minutes of compiling
        branch_recovery(temperature, k)
    topo = _topology(topology)
    chip = CHIPS[topo.chip]
    devices = topology_devices(topo.name)
    quantized = dtype == "int8"  # weight-only int8 (specjax.quantize): bfloat16 compute, int8 kernels
    if quantized and pieces:
        raise ValueError("dtype int8 compiles the whole programs only: pass pieces=False (--no-pieces).")
    tcfg = resolve_config(target, "bfloat16" if quantized else dtype)
    dcfg = None if draft is None else resolve_config(draft, "bfloat16" if quantized else dtype)
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
    _abstract_model_of = abstract_quantized_model if quantized else _abstract_model
    tmodel = _abstract_model_of(tcfg, replicated)
    dmodel = None if dcfg is None else _abstract_model_of(dcfg, replicated)
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
            num_drafts=tuple(num_drafts),
            branch_gammas=branch_gammas,
        )
        _summarise(report, _paper_rows(paper_table))
    return report


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
        names = ["target_step"] + sorted(k for k in pieces if k.startswith("target_window_"))
        names += sorted(k for k in pieces if k.startswith("target_branches_")) + ["draft_step"]
        names += sorted(k for k in pieces if k.startswith("draft_step_k"))
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
    if report.get("multi_draft_projections"):
        lines += [
            "",
            "With k drafts (multi-draft verification: k branches of γ tokens whose first tokens differ, one target "
            "call over k · (γ + 1) query rows): E_k / (γ c_k + w_k), w_k = k-branch window / step, c_k = the draft's "
            "step over k rows / the target's step (HBM traffic estimate). Tokens per call: "
            f"{report['multi_draft_model']}. The ratio model column instead multiplies k = 1's tokens per call by the "
            "small pair's measured k / k = 1 ratio (measured at α ≈ 0.37-0.46, where a first-token rejection is "
            "commoner: it overstates the gain at the paper's higher α).",
            "",
            "| task | draft | temperature | γ | k | paper α | paper speedup | w_k | c_k | tokens / call | × k = 1 | "
            "projected k = 1 | projected | ratio model |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["multi_draft_projections"]:
            lines.append(
                f"| {r['task']} | {r['draft']} | {r['temperature']} | {r['gamma']} | {r['num_drafts']} | "
                f"{r['paper_alpha']} | {r['paper_speedup']}x | {r['window_over_step']:.3f} | {r['c']:.4f} | "
                f"{r['tokens_per_call']:.3f} | {r['tokens_over_one_draft']:.3f} | "
                f"{r['projected_speedup_one_draft']:.2f}x | {r['projected_speedup']:.2f}x | "
                f"{r['projected_speedup_ratio_model']:.2f}x |"
            )
    return "\n".join(lines)
