"""Decode throughput on one device vs data parallel / model parallel over N devices, and compile counts.

Usage (CPU with forced host devices; on a TPU VM drop --cpu-devices):

    python benchmarks/parallel_throughput.py --cpu-devices 8 --batch 64 --repeats 3

Prints one JSON object: for each mode (one device, ``data_parallel_sample``, ``model_parallel_sample``
on ``--mesh``) the median wall time of ``--repeats`` calls after a warm-up call, output tokens per second,
and the number of XLA programs compiled during the timed calls (counted with ``jax.monitoring``'s
``/jax/core/compile/backend_compile_duration`` event; it must be 0: same shapes reuse one program) plus
``parallel.num_compiled_programs()``. On CPU the forced host devices share the host's cores, so the
speedup is bounded by the number of free cores, not by the device count.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time


def main(argv=None) -> dict:
    """Runs the benchmark described in the module docstring; returns the JSON-able results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-devices", type=int, default=0, help="force N host CPU devices (0: leave as is)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input-length", type=int, default=16)
    parser.add_argument("--max-decode-length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mesh", default=None, help="mesh for model parallel, e.g. data:2,model:4")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument(
        "--data-parallel-devices",
        default="2",
        help="also run data parallel on these device counts (comma-separated); all always",
    )
    args = parser.parse_args(argv)

    import jax

    if args.cpu_devices:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    import numpy as np

    from specjax import T5Config, T5Model, parallel, temperature_sample

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: (
            compiles.append(event) if event == "/jax/core/compile/backend_compile_duration" else None
        )
    )

    n = jax.device_count()
    cfg = T5Config(
        vocab_size=256,
        d_model=args.d_model,
        num_heads=8,
        head_dim=16,
        mlp_dim=4 * args.d_model,
        num_encoder_layers=2,
        num_decoder_layers=2,
    )
    model = T5Model.random(cfg, 0)
    rs = np.random.RandomState(0)
    tokens = rs.randint(2, cfg.vocab_size, size=(args.batch, args.input_length)).astype(np.int32)
    tokens[:, -1] = 1
    kwargs = dict(max_decode_length=args.max_decode_length, temperature=1.0, eos_id=1)
    mesh = parallel.make_mesh(args.mesh or f"data:{max(n // 4, 1)},model:{min(n, 4)}")
    # Parameters are placed once, as a user would (replicate_params / shard_params), not on every call.
    modes = {"one_device": lambda key: temperature_sample(model, tokens, rng=key, **kwargs)}
    for d in sorted({int(x) for x in args.data_parallel_devices.split(",")} | {n}):
        if d > n:
            continue
        devices = jax.devices()[:d]
        replicated = parallel.replicate_params(model, jax.sharding.Mesh(np.asarray(devices), ("data",)))
        modes[f"data_parallel_{d}"] = functools.partial(
            lambda key, devices, replicated: parallel.data_parallel_sample(
                temperature_sample, replicated, tokens, rng=key, devices=devices, **kwargs
            ),
            devices=devices,
            replicated=replicated,
        )
    sharded = parallel.shard_params(model, mesh)
    modes["mesh_" + ",".join(f"{k}:{v}" for k, v in mesh.shape.items())] = lambda key: parallel.model_parallel_sample(
        temperature_sample, sharded, tokens, rng=key, mesh=mesh, **kwargs
    )
    results = {
        "devices": n,
        "platform": jax.devices()[0].platform,
        "batch": args.batch,
        "max_decode_length": args.max_decode_length,
        "d_model": args.d_model,
        "modes": {},
    }
    for name, run in modes.items():
        run(key=jax.random.PRNGKey(0))  # warm-up: compiles
        compiles.clear()
        times, tokens_out = [], 0
        for r in range(args.repeats):
            t0 = time.perf_counter()
            result = run(key=jax.random.PRNGKey(r + 1))
            times.append(time.perf_counter() - t0)
            tokens_out = int(result.lengths.sum())
        sec = statistics.median(times)
        results["modes"][name] = {
            "median_s": round(sec, 4),
            "tokens": tokens_out,
            "tokens_per_s": round(tokens_out / sec, 1),
            "compiles_during_timed_calls": len(compiles),
        }
    results["parallel_compiled_programs"] = parallel.num_compiled_programs()
    return results


if __name__ == "__main__":
    json.dump(main(), sys.stdout, indent=1)
    print()
