"""Where the time of a decode goes: a ``jax.profiler`` trace of the real compiled loop, read back per named scope.

The decode functions are called exactly as a user calls them (``speculative_sample`` / ``temperature_sample``,
eagerly, after a warm-up call that compiles), under ``jax.profiler.trace``. XLA:CPU records every thunk it
executes (an event with the ``hlo_op`` and ``hlo_module`` it runs, and ``run_id`` per execution); the trace
also carries each compiled module's HLO (``enable_hlo_proto``), whose instructions hold the
``jax.named_scope`` path in their ``op_name`` metadata. Joining the two gives the time per scope:

- speculative body: ``draft``, ``verify``, ``accept``, ``commit``; baseline body: ``step``, ``sample``;
  ``encode`` before the loop. (Older loops named the baseline's model call ``target``: read as ``step``.)
- per loop iteration: the loop's wall time (first to last thunk run by the outer ``while``) over its iterations
  (executions of the loop body), the thunk time per scope (summed over threads), thunks executed per iteration;
- per call: the call's wall time, the loop, ``encode``, other device work, other compiled programs the call
  runs (key folding, conversions), and the host time left (validation, dispatch, transfers).

Beside them, this machine's limits (``machine_limits``): memory bandwidth from a large NumPy copy and
matmul throughput from a jitted large matmul, giving a floor per iteration of
max(weight bytes read / bandwidth, FLOPs / throughput) (``model_costs``: decoder weights read per step and
2 FLOPs per weight per token). The XSpace protobuf is read with a small wire-format reader (no extra
packages); the field numbers are those of ``tsl/profiler/protobuf/xplane.proto`` and
``xla/service/hlo.proto``.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import tempfile
import time
from typing import Callable, Sequence

import jax
import numpy as np

from specjax.bench.timing import finish
from specjax.decoding import speculative_sample, temperature_sample

__all__ = [
    "SCOPES",
    "read_trace",
    "Trace",
    "profile_calls",
    "CallsProfile",
    "machine_limits",
    "model_costs",
    "profile_decode",
    "format_profile",
]

#: The named scopes of the decode loops, in the order a report lists them.
SCOPES = ("encode", "draft", "verify", "accept", "commit", "step", "sample")
_ALIASES = {"target": "step"}  # the baseline's model call before the scopes were renamed
_CONTAINERS = {"while", "conditional", "call"}  # thunks whose time is that of the thunks they run


# ----------------------------------------------------------------------------------------------------------
# Protobuf wire format (https://protobuf.dev/programming-guides/encoding/)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def _fields(buf: bytes) -> dict[int, list]:
    """A message's fields: number -> list of values (int for varints, bytes for length-delimited)."""
    out: dict[int, list] = {}
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            v, i = buf[i : i + 8], i + 8
        elif wt == 2:
            ln, i = _varint(buf, i)
            v, i = buf[i : i + ln], i + ln
        elif wt == 5:
            v, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"Unsupported protobuf wire type {wt} (a corrupt trace?).")
        out.setdefault(f, []).append(v)
    return out


def _packed(values: list) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, int):
            out.append(v)
        else:
            i = 0
            while i < len(v):
                x, i = _varint(v, i)
                out.append(x)
    return out


def _str(d: dict, f: int) -> str:
    return d[f][0].decode("utf-8", "replace") if f in d else ""


@dataclasses.dataclass(frozen=True)
class _Op:
    """One HLO instruction of a compiled module: opcode, scope path (op_name metadata), computation id."""

    opcode: str
    op_name: str
    computation: int
    called: tuple[int, ...]


def _hlo_ops(hlo_proto: bytes) -> tuple[dict[str, _Op], dict[int, str], str]:
    """HloProto -> (instruction name -> _Op, computation id -> name, entry computation name)."""
    module = _fields(_fields(hlo_proto)[1][0])  # HloProto.hlo_module
    ops, comps = {}, {}
    for comp_buf in module.get(3, []):  # HloModuleProto.computations
        comp = _fields(comp_buf)
        cid = comp[5][0] if 5 in comp else -1  # HloComputationProto.id
        comps[cid] = _str(comp, 1)
        for ins_buf in comp.get(2, []):  # HloComputationProto.instructions
            ins = _fields(ins_buf)
            meta = _fields(ins[7][0]) if 7 in ins else {}  # HloInstructionProto.metadata -> OpMetadata
            ops[_str(ins, 1)] = _Op(_str(ins, 2), _str(meta, 2), cid, tuple(_packed(ins.get(38, []))))
    return ops, comps, _str(module, 2)


@dataclasses.dataclass
class Trace:
    """A profiler trace read back.

    Attributes:
      events: per (module key, run_id): list of (op name, start ns, duration ns) thunk executions; the module
        key is ``name(program_id)``.
      modules: module key -> (ops by instruction name, computation names by id, entry computation name),
        for every module whose HLO the trace carries.
    """

    events: dict[tuple[str, int], list[tuple[str, float, float]]]
    modules: dict[str, tuple[dict[str, _Op], dict[int, str], str]]


def read_trace(log_dir: str) -> Trace:
    """Reads the newest ``*.xplane.pb`` under ``log_dir`` (as ``jax.profiler.trace(log_dir)`` writes it).

    Raises:
      FileNotFoundError: no trace file under ``log_dir``.
    """
    files = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        raise FileNotFoundError(f"No *.xplane.pb under {log_dir} (did jax.profiler.trace run?).")
    path = max(files, key=os.path.getmtime)
    data = jax.profiler.ProfileData.from_file(path)
    events: dict[tuple[str, int], list] = collections.defaultdict(list)
    for plane in data.planes:
        for line in plane.lines:
            for e in line.events:
                st = dict(e.stats)
                if "hlo_op" in st and "hlo_module" in st:
                    key = (f"{st['hlo_module']}({st.get('program_id', '')})", int(st.get("run_id", 0)))
                    events[key].append((str(st["hlo_op"]), float(e.start_ns), float(e.duration_ns)))
    modules = {}
    with open(path, "rb") as f:
        space = _fields(f.read())
    for plane_buf in space.get(1, []):  # XSpace.planes
        plane = _fields(plane_buf)
        stat_names = {}
        for entry in plane.get(5, []):  # XPlane.stat_metadata (map<int64, XStatMetadata>)
            md = _fields(_fields(entry)[2][0])
            stat_names[md[1][0]] = _str(md, 2)
        for entry in plane.get(4, []):  # XPlane.event_metadata (map<int64, XEventMetadata>)
            md = _fields(_fields(entry)[2][0])
            for stat_buf in md.get(5, []):  # XEventMetadata.stats
                stat = _fields(stat_buf)
                if stat_names.get(stat.get(1, [None])[0]) == "Hlo Proto" and 6 in stat:  # XStat.bytes_value
                    modules[_str(md, 2)] = _hlo_ops(stat[6][0])
    return Trace(dict(events), modules)


def _source_of(op: str, ops: dict) -> str:
    """The last three parts of an instruction's JAX source name (its ``op_name`` metadata, e.g.
    ``layers_0/mlp/dot_general``): which part of the model a fusion comes from ("" when unknown)."""
    return "/".join(ops[op].op_name.split("/")[-3:]) if op in ops else ""


def _scope_of(op_name: str) -> str | None:
    for part in op_name.split("/"):
        part = _ALIASES.get(part, part)
        if part in SCOPES:
            return part
    return None


# ----------------------------------------------------------------------------------------------------------
# Profiling calls


@dataclasses.dataclass
class CallsProfile:
    """Time of repeated calls of one decode function, from a trace (milliseconds unless named otherwise).

    Attributes:
      calls: traced calls. iterations: loop iterations over all traced calls.
      call_ms: mean wall time of one call, untraced (best estimate of what a user sees).
      traced_call_ms: the same under the profiler (profiler overhead = traced − untraced).
      loop_ms: mean loop wall time per call (first to last thunk of the outer ``while``).
      iteration_ms: loop wall time per iteration.
      scope_ms_per_iteration: scope -> thunk time per iteration (summed over threads; "loop (unscoped)" for
        thunks of the loop without a scope).
      thunks_per_iteration: thunks executed per iteration (the loop's, nested loops included).
      outside_loop_ms: per call: scope (``encode``, "other") -> thunk time of the decode program outside the loop.
      other_programs_ms: per call: other compiled programs the call ran (name -> ms).
      host_ms: per call: traced call time − time spans of every program it ran (validation, dispatch,
        transfers, result conversion).
      fixed_ms: traced_call_ms − loop_ms (both from the traced calls, so a busy machine moves both alike).
      module: the decode program's name.
      top_ops: the 12 costliest thunks of the loop: (op, scope, ms per iteration, executions per iteration).
      top_outside_ops: the 12 costliest thunks of the decode program outside the loop (the fixed per-call cost:
        encoders, conversions): (op, scope, ms per call, executions per call).
      op_sources: for each of ``top_ops``, the last three parts of its JAX source name (``_source_of``).
    """

    calls: int
    iterations: int
    call_ms: float
    traced_call_ms: float
    loop_ms: float
    iteration_ms: float
    scope_ms_per_iteration: dict[str, float]
    thunks_per_iteration: float
    outside_loop_ms: dict[str, float]
    other_programs_ms: dict[str, float]
    host_ms: float
    fixed_ms: float
    module: str
    top_ops: list[tuple[str, str, float, float]]
    top_outside_ops: list[tuple[str, str, float, float]] = dataclasses.field(default_factory=list)
    op_sources: dict[str, str] = dataclasses.field(default_factory=dict)


def _span(evs) -> float:
    return (max(s + d for _, s, d in evs) - min(s for _, s, _ in evs)) if evs else 0.0


def _analyse_run(evs, ops: dict[str, _Op], comps: dict[int, str], entry: str):
    """One execution of the decode program -> (loop ns, iterations, scope ns, thunks in loop, outside ns,
    per-op (ns, count) in loop, scope function, per-op (ns, count) outside the loop)."""
    entry_ids = {cid for cid, name in comps.items() if name == entry}
    loops = [
        (d, name)
        for name, s, d in evs
        if name in ops and ops[name].opcode == "while" and ops[name].computation in entry_ids
    ]
    if not loops:
        return None
    _, loop_op = max(loops)
    called = ops[loop_op].called
    by_comp = collections.defaultdict(list)
    for name, op in ops.items():
        by_comp[op.computation].append(name)
    # Computations run by the loop: its condition and body and, transitively, what they call.
    inside, todo = set(), list(called)
    while todo:
        c = todo.pop()
        if c in inside:
            continue
        inside.add(c)
        for name in by_comp.get(c, []):
            todo += list(ops[name].called)
    # A computation's scope: its instructions' (majority), else its caller's.
    comp_scope: dict[int, str | None] = {}
    for c, names in by_comp.items():
        found = collections.Counter(s for s in (_scope_of(ops[n].op_name) for n in names) if s)
        comp_scope[c] = found.most_common(1)[0][0] if found else None
    parent = {c: ops[n].computation for n in ops for c in ops[n].called}

    def scope(name: str) -> str:
        op = ops[name]
        s = _scope_of(op.op_name) or comp_scope.get(op.computation)
        c = op.computation
        while s is None and c in parent:
            c = parent[c]
            s = comp_scope.get(c)
        if s:
            return s
        return "loop (unscoped)" if op.computation in inside else "other"

    counts = collections.Counter(name for name, _, _ in evs)
    # The body: of the while's two computations (body, condition), the one with more instructions.
    body_ids = {max(called, key=lambda c: len(by_comp.get(c, [])))} if called else set()
    body_counts = [counts[n] for n in counts if n in ops and ops[n].computation in body_ids]
    iterations = max(body_counts) if body_counts else 0
    # The while thunk returns before its iterations end (XLA:CPU runs them asynchronously): the loop's wall
    # time is the span of the thunks it ran.
    loop_ns = _span([e for e in evs if e[0] == loop_op or (e[0] in ops and ops[e[0]].computation in inside)])
    scope_ns, outside_ns = collections.Counter(), collections.Counter()
    per_op = collections.defaultdict(lambda: [0.0, 0])
    per_op_outside = collections.defaultdict(lambda: [0.0, 0])
    thunks = 0
    for name, _, d in evs:
        op = ops.get(name)
        if op is None or name == loop_op:
            continue
        if op.computation in inside:
            thunks += 1
            if op.opcode not in _CONTAINERS:
                scope_ns[scope(name)] += d
                per_op[name][0] += d
                per_op[name][1] += 1
        elif op.opcode not in _CONTAINERS:
            outside_ns["encode" if scope(name) == "encode" else "other"] += d
            per_op_outside[name][0] += d
            per_op_outside[name][1] += 1
    return loop_ns, iterations, scope_ns, thunks, outside_ns, per_op, scope, per_op_outside


def profile_calls(
    call: Callable[[int], object], num: int, *, warmup: bool = True, log_dir: str | None = None
) -> CallsProfile:
    """Times ``call(0) … call(num-1)`` untraced, then again under ``jax.profiler.trace``, and reads the trace.

    Args:
      call: ``call(j)`` runs the j-th decode and waits for its result (``timing.finish``).
      num: how many calls (e.g. one per batch of inputs).
      warmup: call ``call(0)`` first, untimed (compilation).
      log_dir: where the trace goes (a temporary directory by default, removed afterwards).
    Returns:
      ``CallsProfile``.
    Raises:
      RuntimeError: the trace holds no program with a loop (the HLO or the thunk events are missing).
    """
    if warmup:
        call(0)
    t0 = time.perf_counter()
    for j in range(num):
        call(j)
    call_ms = (time.perf_counter() - t0) / num * 1e3
    tmp = tempfile.TemporaryDirectory() if log_dir is None else None
    log_dir = log_dir or tmp.name
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # Python tracing would inflate the host time
    options.enable_hlo_proto = True
    with jax.profiler.trace(log_dir, profiler_options=options):
        t0 = time.perf_counter()
        for j in range(num):
            call(j)
        traced_call_ms = (time.perf_counter() - t0) / num * 1e3
    trace = read_trace(log_dir)
    if tmp is not None:
        tmp.cleanup()
    # The decode program: the module with the longest total span over its runs that has a loop.
    spans = collections.Counter()
    for (mod, _run), evs in trace.events.items():
        spans[mod] += _span(evs)
    main = next(
        (
            m
            for m, _ in spans.most_common()
            if m in trace.modules and any(op.opcode == "while" for op in trace.modules[m][0].values())
        ),
        None,
    )
    if main is None:
        raise RuntimeError(f"The trace holds no compiled loop with its HLO (programs seen: {sorted(spans)}).")
    ops, comps, entry = trace.modules[main]
    loop_ns = iterations = thunks = 0
    scope_ns, outside_ns = collections.Counter(), collections.Counter()
    per_op = collections.defaultdict(lambda: [0.0, 0])
    per_op_outside = collections.defaultdict(lambda: [0.0, 0])
    scope_fn = None
    runs = 0
    for (mod, _run), evs in trace.events.items():
        if mod != main:
            continue
        res = _analyse_run(evs, ops, comps, entry)
        if res is None:
            continue
        runs += 1
        l, it, s, th, o, po, scope_fn, poo = res
        loop_ns += l
        iterations += it
        thunks += th
        scope_ns.update(s)
        outside_ns.update(o)
        for acc, got in ((per_op, po), (per_op_outside, poo)):
            for k, (d, c) in got.items():
                acc[k][0] += d
                acc[k][1] += c
    other = collections.Counter()
    for (mod, _run), evs in trace.events.items():
        if mod != main:
            other[mod.rsplit("(", 1)[0]] += _span(evs)
    busy_ns = sum(_span(evs) for evs in trace.events.values())
    it = max(1, iterations)
    top = sorted(per_op.items(), key=lambda kv: -kv[1][0])[:12]
    top_outside = sorted(per_op_outside.items(), key=lambda kv: -kv[1][0])[:12]
    n = max(1, runs)
    return CallsProfile(
        calls=runs,
        iterations=iterations,
        call_ms=call_ms,
        traced_call_ms=traced_call_ms,
        loop_ms=loop_ns / max(1, runs) / 1e6,
        iteration_ms=loop_ns / it / 1e6,
        scope_ms_per_iteration={k: v / it / 1e6 for k, v in scope_ns.items()},
        thunks_per_iteration=thunks / it,
        outside_loop_ms={k: v / max(1, runs) / 1e6 for k, v in outside_ns.items()},
        other_programs_ms={k: v / max(1, runs) / 1e6 for k, v in other.items()},
        host_ms=traced_call_ms - busy_ns / max(1, runs) / 1e6,
        fixed_ms=traced_call_ms - loop_ns / max(1, runs) / 1e6,
        module=main,
        top_ops=[(k, scope_fn(k) if scope_fn else "", d / it / 1e6, c / it) for k, (d, c) in top],
        op_sources={k: _source_of(k, ops) for k, _ in top},
        top_outside_ops=[(k, scope_fn(k) if scope_fn else "", d / n / 1e6, c / n) for k, (d, c) in top_outside],
    )


# ----------------------------------------------------------------------------------------------------------
# This machine's limits and the models' costs


def machine_limits(
    copy_bytes: int = 1 << 28, cache_bytes: int = 1 << 24, matmul_n: int = 2048, repeats: int = 5
) -> dict:
    """Measures memory bandwidth and matmul throughput (best of ``repeats``).

    Args:
      copy_bytes: size of the array copied for the memory bandwidth (default 256 MiB, beyond any cache).
      cache_bytes: size of a second, cache-sized copy (default 16 MiB).
      matmul_n: a float32 [n, n] @ [n, n] matmul, jitted, for the throughput.
    Returns:
      dict: ``memory_gb_s`` and ``cache_gb_s`` (bytes read + written per second / 1e9, NumPy ``copyto``),
      ``matmul_gflop_s`` (2n³ / seconds / 1e9), and the sizes used.
    """

    def copy_rate(nbytes):
        src = np.ones(nbytes // 4, np.float32)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        reps = max(repeats, int(4 * (1 << 28) // nbytes))
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t0)
        return 2 * src.nbytes / best / 1e9

    a = jax.numpy.ones((matmul_n, matmul_n), jax.numpy.float32)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        mm(a, a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return {
        "memory_gb_s": copy_rate(copy_bytes),
        "cache_gb_s": copy_rate(cache_bytes),
        "matmul_gflop_s": 2 * matmul_n**3 / best / 1e9,
        "copy_bytes": copy_bytes,
        "cache_bytes": cache_bytes,
        "matmul_n": matmul_n,
    }


def model_costs(model) -> dict:
    """Weights a decoder step reads and the FLOPs it does per token, from the parameter tree.

    A decoder step reads every decoder matrix except the cross-attention keys and values (a function of the
    encoder output only) plus one embedding row; each weight is one multiply-add (2 FLOPs) per token.
    Attention over the cache (2·t·d per layer per token) is left out: small beside the weights at these lengths.

    Returns:
      dict: ``param_bytes`` (all parameters), ``step_weight_bytes``, ``flops_per_token``.
    """
    flat = jax.tree_util.tree_flatten_with_path(model.params)[0]
    total = step = step_params = 0
    for path, x in flat:
        keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        nbytes = int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
        total += nbytes
        cross_kv = any("encoder_decoder" in k or "cross" in k for k in keys) and keys[-2] in ("key", "value")
        if "decoder" in keys and len(x.shape) >= 2 and not cross_kv and "relpos_bias" not in keys:
            step += nbytes
            step_params += int(np.prod(x.shape))
        elif getattr(model.config, "logits_via_embedding", False) and "embedding" in keys and "decoder" not in keys:
            step += nbytes  # tied embedding: the logits projection reads all of it
            step_params += int(np.prod(x.shape))
    return {"param_bytes": total, "step_weight_bytes": step, "flops_per_token": 2 * step_params}


# ----------------------------------------------------------------------------------------------------------
# The decode functions, profiled


def profile_decode(
    target,
    draft,
    batches: Sequence[np.ndarray],
    *,
    gamma: int,
    temperature: float,
    max_decode_length: int,
    seed: int = 0,
    limits: dict | None = None,
) -> dict:
    """Profiles ``speculative_sample`` and ``temperature_sample`` as a user calls them, on the same batches.

    Args:
      target, draft: ``T5Model``s. batches: int32[b, s] arrays of one shape (``inputs.pad_batches``).
      gamma, temperature, max_decode_length: as the decode functions take them.
      limits: ``machine_limits()`` (measured here when None).
    Returns:
      dict: ``speculative`` and ``baseline`` (``CallsProfile`` as a dict), ``floor_ms`` per iteration of each
      (max(weight bytes / memory bandwidth, FLOPs / matmul throughput), and with the cache bandwidth),
      ``limits``, ``target_costs``, ``draft_costs``, and the settings.
    """
    kw = dict(max_decode_length=max_decode_length, temperature=temperature)

    def spec(j):
        return finish(
            speculative_sample(target, draft, batches[j], rng=jax.random.PRNGKey(seed + j), gamma=gamma, **kw)
        )

    def base(j):
        return finish(temperature_sample(target, batches[j], rng=jax.random.PRNGKey(seed + j), **kw))

    limits = limits or machine_limits()
    tc, dc = model_costs(target), model_costs(draft)
    b = int(batches[0].shape[0])
    out = {
        "gamma": gamma,
        "temperature": temperature,
        "batch_size": b,
        "num_calls": len(batches),
        "max_decode_length": max_decode_length,
        "limits": limits,
        "target_costs": tc,
        "draft_costs": dc,
    }
    reads = {
        "speculative": gamma * dc["step_weight_bytes"] + tc["step_weight_bytes"],
        "baseline": tc["step_weight_bytes"],
    }
    flops = {
        "speculative": b * (gamma * dc["flops_per_token"] + (gamma + 1) * tc["flops_per_token"]),
        "baseline": b * tc["flops_per_token"],
    }
    for name, fn in (("speculative", spec), ("baseline", base)):
        out[name] = dataclasses.asdict(profile_calls(fn, len(batches)))
        out[name]["floor"] = {
            "weight_bytes": reads[name],
            "flops": flops[name],
            "memory_ms": reads[name] / (limits["memory_gb_s"] * 1e9) * 1e3,
            "cache_ms": reads[name] / (limits["cache_gb_s"] * 1e9) * 1e3,
            "compute_ms": flops[name] / (limits["matmul_gflop_s"] * 1e9) * 1e3,
        }
    return out


def format_profile(report: dict) -> str:
    """Markdown of ``profile_decode`` output: per iteration per scope, per call, the floors, the costliest ops."""
    L = report["limits"]
    head = (
        f"### batch {report['batch_size']}, temperature {report['temperature']:g}, γ {report['gamma']} "
        f"({report['num_calls']} calls, max_decode_length {report['max_decode_length']})"
    )
    lines = [head, ""]
    for name in ("speculative", "baseline"):
        p = report[name]
        f = p["floor"]
        it = p["iteration_ms"]
        lines += [
            f"**{name}** (`{p['module']}`): {p['iterations']} iterations in {p['calls']} calls; "
            f"iteration {it:.3f} ms wall, {p['thunks_per_iteration']:.0f} thunks per iteration",
            "",
            "| per iteration | ms | share of iteration |",
            "|---|---|---|",
        ]
        scopes = sorted(
            p["scope_ms_per_iteration"].items(), key=lambda kv: (SCOPES.index(kv[0]) if kv[0] in SCOPES else 99, kv[0])
        )
        total = 0.0
        for s, ms in scopes:
            total += ms
            lines.append(f"| {s} | {ms:.3f} | {ms / it:.0%} |")
        lines += [
            f"| thunks, sum | {total:.3f} | {total / it:.0%} |",
            f"| loop wall − thunk sum (executor, gaps; < 0 where thunks overlap) | {it - total:.3f} | "
            f"{(it - total) / it:.0%} |",
            f"| floor: {f['weight_bytes'] / 1e6:.1f} MB weights / {L['memory_gb_s']:.1f} GB/s memory | "
            f"{f['memory_ms']:.3f} | {f['memory_ms'] / it:.0%} |",
            f"| floor: same from cache at {L['cache_gb_s']:.1f} GB/s | {f['cache_ms']:.3f} | "
            f"{f['cache_ms'] / it:.0%} |",
            f"| floor: {f['flops'] / 1e6:.1f} MFLOP / {L['matmul_gflop_s']:.1f} GFLOP/s matmul | "
            f"{f['compute_ms']:.3f} | {f['compute_ms'] / it:.0%} |",
            "",
            "| per call | ms |",
            "|---|---|",
            f"| call, untraced (wall) | {p['call_ms']:.3f} |",
            f"| call, traced (profiler overhead {p['traced_call_ms'] - p['call_ms']:+.3f}) | "
            f"{p['traced_call_ms']:.3f} |",
            f"| loop (traced) | {p['loop_ms']:.3f} |",
        ]
        for s, ms in sorted(p["outside_loop_ms"].items()):
            lines.append(f"| decode program outside the loop: {s} | {ms:.3f} |")
        for s, ms in sorted(p["other_programs_ms"].items()):
            lines.append(f"| other program `{s}` | {ms:.3f} |")
        lines += [
            f"| host (validation, dispatch, transfers; traced call − programs' spans) | {p['host_ms']:.3f} |",
            f"| **fixed per-call cost** (traced call − traced loop) | {p['fixed_ms']:.3f} |",
            "",
            "| costliest loop thunks | scope | ms per iteration | runs per iteration |",
            "|---|---|---|---|",
        ]
        for op, s, ms, c in p["top_ops"]:
            lines.append(f"| `{op}` | {s} | {ms:.3f} | {c:.1f} |")
        if p.get("top_outside_ops"):
            lines += [
                "",
                "| costliest thunks outside the loop | scope | ms per call | runs per call |",
                "|---|---|---|---|",
            ]
            for op, s, ms, c in p["top_outside_ops"]:
                lines.append(f"| `{op}` | {s} | {ms:.3f} | {c:.1f} |")
        lines.append("")
    return "\n".join(lines)
