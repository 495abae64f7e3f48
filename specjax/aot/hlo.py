"""Reading compiled HLO text: what one iteration of a decode loop does (collectives, host transfers, whole-cache
copies), the HBM traffic a TPU program moves and the matrix flops it does.

Pure text processing (no JAX): the input is ``compiled.as_text()`` of an executable compiled for a TPU.
"""

from __future__ import annotations

import math
import re

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


def _top_level_whiles(comps: dict, entry: str | None) -> list[tuple[str, str, int | None]]:
    """``(body, condition, static trip count or None)`` of each ``while`` of the entry computation."""
    whiles = []
    for ins in comps.get(entry, []):
        if ins[2] == "while":
            body = re.search(r"body=%?([\w.\-]+)", ins[3]).group(1)
            cond = re.search(r"condition=%?([\w.\-]+)", ins[3]).group(1)
            whiles.append((body, cond, _trip_count(comps, cond)))
    return whiles


def _main_loop(comps: dict, whiles: list) -> tuple[str, str]:
    """``(body, condition)`` of the main decode loop: the data-dependent top-level loop with the largest body (any
    top-level loop when none is data-dependent)."""
    decode = [w for w in whiles if w[2] is None]
    body, cond, _ = max(decode or whiles, key=lambda w: len(comps.get(w[0], [])))
    return body, cond


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
    whiles = _top_level_whiles(comps, entry)
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
    body, cond = _main_loop(comps, whiles)
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
    use of the parameter (through bitcasts, and into nested fusions: a scanned layer's stacked kernel is sliced
    inside one) slices it, nothing when it is only updated in place, else all."""
    ops = comps.get(fused, [])
    params = [i[0] for i in ops if i[2] == "parameter" and re.match(rf"parameter\({index}\)", i[3])]
    if not params:
        return full
    total, frontier = 0, [params[0]]
    root = ops[-1][0]
    while frontier:
        name = frontier.pop()
        if name == root:  # the parameter (or a bitcast of it) is the output: whoever uses the output reads all
            return full
        for user, shape, op, rest in ops:
            if op == "parameter" or name not in _operands(rest):
                continue
            first = _operands(rest)[0] == name
            if op == "bitcast":
                frontier.append(user)
            elif op == "fusion":  # what the nested fusion reads of each operand slot that holds the parameter
                nested = re.search(r"calls=%?([\w.\-]+)", rest).group(1)
                slots = [i for i, o in enumerate(_operands(rest)) if o == name]
                read = sum(_fused_read(comps, nested, i, full) for i in slots)
                if read >= full:
                    return full
                total += read
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


def _traffic(comps: dict, name: str, times: int, by_opcode: dict, one_branch: bool) -> None:
    """Adds the HBM bytes computation ``name`` moves, ``times`` times, to ``by_opcode`` (``hbm_traffic``'s
    reading). ``one_branch``: a ``conditional`` counts its costliest branch (one runs); else every branch."""
    shapes = {ins[0]: ins[1] for ins in comps.get(name, [])}
    for _, shape, op, rest in comps.get(name, []):
        if op in _NO_TRAFFIC or op.endswith("-done"):
            continue
        if op in ("while", "conditional", "call"):
            trips = 1
            if op == "while":
                cond = re.search(r"condition=%?([\w.\-]+)", rest)
                trips = (_trip_count(comps, cond.group(1)) if cond else None) or 1
            if op == "conditional" and one_branch:
                branches = []
                for sub in _called(rest):
                    branch: dict[str, int] = {}
                    _traffic(comps, sub, times, branch, one_branch)
                    branches.append(branch)
                costliest = max(branches, key=lambda b: sum(b.values()), default={})
                for key, value in costliest.items():
                    by_opcode[key] = by_opcode.get(key, 0) + value
                continue
            for sub in _called(rest):
                _traffic(comps, sub, times * trips, by_opcode, one_branch)
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
    if entry is not None:
        _traffic(comps, entry, 1, by_opcode, one_branch=False)
    return dict(bytes=int(sum(by_opcode.values())), by_opcode=dict(sorted(by_opcode.items(), key=lambda kv: -kv[1])))


_DIMS_RE = re.compile(r"(lhs_contracting_dims)=\{([\d,]*)\}")
_DIM_LABELS_RE = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")


def _dims(shape: str) -> list[int]:
    m = _ARRAY_RE.search(shape)
    return [int(d) for d in m.group(2).split(",") if d] if m else []


def _taps(rest: str) -> int:
    """Input positions one output of a convolution multiplies: the window's size over its base dilation per spatial
    dimension (a batched dot written as a convolution, ``window={size=8x64 stride=7x63 lhs_dilate=8x64}``, takes one
    position: its spatial dimensions are batch dimensions), over ``feature_group_count``."""
    window = re.search(r"window=\{([^}]*)\}", rest)
    taps = 1
    if window:
        size = re.search(r"size=([\dx]+)", window.group(1))
        dilate = re.search(r"lhs_dilate=([\dx]+)", window.group(1))
        sizes = [int(v) for v in size.group(1).split("x")] if size else []
        dilations = [int(v) for v in dilate.group(1).split("x")] if dilate else [1] * len(sizes)
        taps = math.prod(-(-n // d) for n, d in zip(sizes, dilations))
    groups = re.search(r"feature_group_count=(\d+)", rest)
    return max(1, taps // (int(groups.group(1)) if groups else 1))


def _flops(comps: dict, name: str, times: int, one_branch: bool, seen: tuple = ()) -> float:
    """Matrix flops (2 per multiply-add) of the ``dot`` and ``convolution`` instructions of computation ``name``
    and every computation it calls (fusions, loops by their static trip counts, a conditional's costliest branch
    when ``one_branch``), ``times`` times."""
    if name in seen or name not in comps:
        return 0.0
    seen = seen + (name,)
    shapes = {ins[0]: ins[1] for ins in comps[name]}
    total = 0.0
    for _, shape, op, rest in comps[name]:
        if op == "dot":
            lhs = _dims(shapes.get(_operands(rest)[0], ""))
            m = _DIMS_RE.search(rest)
            contracted = math.prod(lhs[int(d)] for d in m.group(2).split(",") if d) if m and lhs else 1
            total += times * 2.0 * math.prod(_dims(shape)) * contracted
            continue
        if op == "convolution":  # XLA:TPU writes dots as convolutions: dim_labels=bf_io->bf
            rhs = _dims(shapes.get(_operands(rest)[1], "")) if len(_operands(rest)) > 1 else []
            m = _DIM_LABELS_RE.search(rest)
            if m and len(m.group(2)) == len(rhs):
                features = math.prod(d for d, label in zip(rhs, m.group(2)) if label == "i")
                total += times * 2.0 * math.prod(_dims(shape)) * features * _taps(rest)
            continue
        trips = 1
        if op == "while":
            cond = re.search(r"condition=%?([\w.\-]+)", rest)
            trips = (_trip_count(comps, cond.group(1)) if cond else None) or 1
        subs = [_flops(comps, sub, times * trips, one_branch, seen) for sub in _called(rest)]
        if subs:
            total += max(subs) if op == "conditional" and one_branch else sum(subs)
    return total


def loop_iteration_costs(hlo: str) -> dict:
    """The HBM traffic and matrix flops of one iteration of the program's main decode loop (``loop_analysis``'s:
    the data-dependent top-level ``while`` with the largest body), read from compiled TPU HLO text.

    The loop's body and condition are read as ``hbm_traffic`` reads a program (each HBM buffer moved once; nested
    loops with a static trip count, e.g. scanned layers or the draft's γ steps, counted that many times), except
    that a ``conditional`` counts only its costliest branch (one branch runs per iteration: an upper bound).
    Flops: 2 × output elements × contracted size of every ``dot`` / ``convolution`` (XLA's ``cost_analysis``
    counts a loop body once, so it cannot give a scanned loop's iteration).

    Args:
      hlo: ``compiled.as_text()`` of a TPU executable with a decode loop.
    Returns:
      ``{"bytes": HBM bytes per device, "by_opcode": {opcode: bytes}, "flops": float}`` per iteration, or None
      when the program has no top-level loop.
    """
    comps, entry = _computations(hlo)
    whiles = _top_level_whiles(comps, entry)
    if not whiles:
        return None
    body, cond = _main_loop(comps, whiles)
    by_opcode: dict[str, int] = {}
    flops = 0.0
    for name in (body, cond):
        _traffic(comps, name, 1, by_opcode, one_branch=True)
        flops += _flops(comps, name, 1, one_branch=True)
    return dict(
        bytes=int(sum(by_opcode.values())),
        by_opcode=dict(sorted(by_opcode.items(), key=lambda kv: -kv[1])),
        flops=flops,
    )


def program_flops(hlo: str) -> float:
    """Matrix flops (2 per multiply-add of every ``dot`` / ``convolution``) of a whole compiled program, loops with
    a static trip count (scanned layers) counted that many times, a data-dependent loop once and a conditional by
    its costliest branch (XLA's ``cost_analysis`` counts every loop body once)."""
    comps, entry = _computations(hlo)
    return _flops(comps, entry, 1, one_branch=True) if entry is not None else 0.0


def host_transfers(hlo: str) -> list[str]:
    """Every instruction of the whole program that moves data to or from the host: ``infeed``, ``outfeed``,
    ``send`` / ``recv`` (and their ``-done``), an array placed in host memory (``S(5)``), a custom call whose
    target names a callback or the host. ``["opcode name", ...]``; [] for a program that stays on the device."""
    comps, _ = _computations(hlo)
    found = []
    for comp in comps.values():
        for name, shape, op, rest in comp:
            target = re.search(r'custom_call_target="([^"]+)"', rest) if op == "custom-call" else None
            if op in _HOST_OPS or "S(5)" in shape or (target and re.search(r"callback|host", target.group(1), re.I)):
                found.append(f"{op} {name}")
    return found
