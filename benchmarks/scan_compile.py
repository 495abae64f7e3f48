"""Scanned vs unrolled layers, side by side in one process: TPU compile time and code size, and CPU decode speed.

``tpu``: the speculative program ``model_parallel_sample`` runs (T5 1.1 XXL target and T5 1.1 small draft in
bfloat16, γ 7, batch 1, 512 input tokens, 128 output tokens, greedy) compiled ahead of time for deviceless TPU
topologies (``specjax.aot.topology_devices``; needs libtpu: ``pip install "jax[tpu]"``) with abstract weights,
once with the layers unrolled (``T5Model.decoding_model(scan_layers=False)``) and once scanned (``True``).
Reports compile seconds, generated code bytes, per-device argument and temporary bytes, and what
``specjax.aot.loop_analysis`` reads in the decode loop (layer loops, collectives, whole-cache copies).

``cpu``: the small pair (bfloat16 target, float32 draft) on this CPU, batch 1, greedy, γ 5, Multi30k test 2016
lines: speculative sampling and the target alone with the layers unrolled and scanned, compiled in this one
process and timed alternately line by line (best of the repeats), outputs compared token for token.

    python benchmarks/scan_compile.py tpu --topologies v4-1 v4-8
    python benchmarks/scan_compile.py cpu --num-inputs 16

Output: markdown tables on stdout (``benchmarks/results/scan/YYYY-MM-DD_compile.md`` holds both). Nothing is
asserted; speed figures depend on the machine and its load (the header names the CPU and the load average).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np


def _header() -> str:
    from specjax.hardware import cpu_info

    load = os.getloadavg()
    return (
        f"jax {jax.__version__}; host CPU: {cpu_info().describe()}; load average at start "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min)"
    )


def tpu(args) -> None:
    from specjax import T5Config, aot, parallel, speculative_sample

    print(f"## TPU programs compiled ahead of time (no TPU, abstract weights)\n\n{_header()}\n")
    print(
        f"{args.target} target, {args.draft} draft, {args.dtype}, γ {args.gamma}, batch {args.batch}, "
        f"{args.input_length} input tokens, {args.output_length} output tokens, greedy; "
        "`model_parallel_sample`'s jit.\n"
    )
    print(
        "| topology | mesh | layers | compile s | generated code MB | args + temps GB / device | "
        "HLO instructions | layer loops | decode-loop collectives | whole-cache copies |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    tcfg = T5Config.preset(args.target, dtype=args.dtype, param_dtype=args.dtype)
    dcfg = T5Config.preset(args.draft, dtype=args.dtype, param_dtype=args.dtype)
    tokens = np.full((args.batch, args.input_length), 3, np.int32)
    tokens[:, -1] = 1
    for name in args.topologies:
        devices = aot.topology_devices(name)
        sizes = parallel.parse_mesh(args.mesh.get(name, f"data:1,model:{len(devices)}"))
        data, model = sizes["data"], sizes["model"]
        mesh = aot._mesh(devices, data, model)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        target, draft = aot._abstract_model(tcfg, replicated), aot._abstract_model(dcfg, replicated)
        for scanned in args.variants:
            program = parallel.model_parallel_program(
                speculative_sample,
                target.decoding_model(scan_layers=scanned),
                draft.decoding_model(scan_layers=scanned),
                tokens,
                mesh=mesh,
                gamma=args.gamma,
                max_decode_length=args.output_length,
                temperature=0.0,
            )
            start = time.perf_counter()
            compiled = program.trace().lower().compile()
            seconds = time.perf_counter() - start
            mem = compiled.memory_analysis()
            hlo = compiled.as_text()
            length = args.output_length + args.gamma + 1
            layer_bytes = args.batch * tcfg.num_heads * length * tcfg.head_dim * 2 // model
            loop = aot.loop_analysis(hlo, layer_bytes)
            coll = ", ".join(f"{op} {v['count']}" for op, v in loop["collectives"].items() if v["count"]) or "none"
            instructions = sum(1 for line in hlo.splitlines() if " = " in line and not line.lstrip().startswith("//"))
            print(
                f"| {name} | data:{data},model:{model} | {'scanned' if scanned else 'unrolled'} | {seconds:.1f} | "
                f"{mem.generated_code_size_in_bytes / 1e6:.1f} | {mem.argument_size_in_bytes / 1e9:.2f} + "
                f"{mem.temp_size_in_bytes / 1e9:.2f} | {instructions} | {loop['layer_loops'] or '-'} | {coll} | "
                f"{loop['cache_copies']['count']} |",
                flush=True,
            )
            del compiled, hlo
        jax.clear_caches()


def cpu(args) -> None:
    import specjax
    from specjax.bench.inputs import MULTI30K_TEST, encode_inputs, read_lines

    print(f"## CPU: the small pair, scanned vs unrolled layers (one process, alternating)\n\n{_header()}\n")
    target, draft, tok = specjax.load_default_pair(size="small", dtype="bfloat16")
    _, draft, _ = specjax.load_default_pair(size="small", dtype="float32")
    ids = encode_inputs(tok, read_lines(MULTI30K_TEST, args.num_inputs), "", 64)
    lines = [np.array([r + [0] * (64 - len(r))], np.int32) for r in ids]
    kw = dict(max_decode_length=64, temperature=0.0)
    pairs = {s: (target.decoding_model(scan_layers=s), draft.decoding_model(scan_layers=s)) for s in (False, True)}
    fns = {}
    for s, (t, d) in pairs.items():
        label = "scanned" if s else "unrolled"
        fns[f"speculative γ {args.gamma}, {label}"] = lambda x, t=t, d=d: specjax.speculative_sample(
            t, d, x, gamma=args.gamma, **kw
        )
        fns[f"target alone, {label}"] = lambda x, t=t: specjax.temperature_sample(t, x, **kw)
    compile_s = {}
    for k, f in fns.items():
        start = time.perf_counter()
        jax.block_until_ready(f(lines[0]))
        compile_s[k] = time.perf_counter() - start
    best = {k: np.full(len(lines), np.inf) for k in fns}
    outs = {k: [] for k in fns}
    for r in range(args.repeats):
        for j, x in enumerate(lines):
            for k, f in fns.items():
                start = time.perf_counter()
                out = jax.block_until_ready(f(x))
                best[k][j] = min(best[k][j], time.perf_counter() - start)
                if r == 0:
                    outs[k].append(np.asarray(out.sequences))
    print(
        "small pair: target bfloat16, distilled draft float32; batch 1, greedy, 64 output tokens, "
        f"{len(lines)} Multi30k test 2016 lines, best of {args.repeats}.\n"
    )
    print("| program | layers | first call s (compile + run) | total s over the lines | vs unrolled |")
    print("|---|---|---|---|---|")
    for k in fns:
        program, label = k.rsplit(", ", 1)
        base = best[f"{program}, unrolled"].sum()
        print(f"| {program} | {label} | {compile_s[k]:.1f} | {best[k].sum():.3f} | {base / best[k].sum():.2f}x |")
    same = [
        all(np.array_equal(a, b) for a, b in zip(outs[f"{p}, unrolled"], outs[f"{p}, scanned"]))
        for p in {k.rsplit(", ", 1)[0] for k in fns}
    ]
    print(f"\nOutputs scanned == unrolled token for token: {all(same)}.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tpu")
    t.add_argument("--topologies", nargs="+", default=["v4-1", "v4-8"])
    t.add_argument("--mesh", nargs="*", default=[], help="topology=data:N,model:M (default data:1,model:<devices>)")
    t.add_argument("--target", default="t5_1_1_xxl")
    t.add_argument("--draft", default="t5_1_1_small")
    t.add_argument("--dtype", default="bfloat16")
    t.add_argument("--gamma", type=int, default=7)
    t.add_argument("--batch", type=int, default=1)
    t.add_argument("--input-length", type=int, default=512)
    t.add_argument("--output-length", type=int, default=128)
    t.add_argument("--variants", default="unrolled,scanned", help="comma-separated: unrolled, scanned")
    c = sub.add_parser("cpu")
    c.add_argument("--num-inputs", type=int, default=16)
    c.add_argument("--gamma", type=int, default=5)
    c.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.what == "tpu":
        args.mesh = dict(m.split("=", 1) for m in args.mesh)
        args.variants = [v.strip() == "scanned" for v in args.variants.split(",")]
        tpu(args)
    else:
        cpu(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
