"""Runs the multi-device checks of ``test_parallel.py`` on 8 forced CPU devices and prints one JSON object.

Run in its own process (``python tests/_parallel_check.py``) so the rest of the suite keeps one device:
``jax_num_cpu_devices`` must be set before JAX starts its CPU backend. Each check compares a one-device
result (``specjax.temperature_sample`` / ``speculative_sample``) with ``data_parallel_sample`` over 8
devices and ``model_parallel_sample`` over mesh data:2,model:4, on a tiny random T5 and a batch of 13 rows
(not a multiple of 8 or 2, so padding is exercised).
"""

from __future__ import annotations

import json
import re
import sys

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402

from specjax import T5Config, T5Model, parallel, speculative_sample, temperature_sample  # noqa: E402

COLLECTIVES = r"\b(all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)\b"


def _same(a, b) -> bool:
    return (
        all(
            np.array_equal(getattr(a, f), getattr(b, f))
            for f in (
                "sequences",
                "lengths",
                "num_target_calls",
                "num_draft_tokens",
                "num_accepted",
                "num_verified",
                "accepted_per_position",
            )
        )
        and (a.accepted_per_branch is None) == (b.accepted_per_branch is None)
        and (a.accepted_per_branch is None or np.array_equal(a.accepted_per_branch, b.accepted_per_branch))
    )


def main() -> dict:
    out: dict = {"device_count": jax.device_count()}
    cfg = T5Config(
        vocab_size=64, d_model=32, num_heads=4, head_dim=8, mlp_dim=64, num_encoder_layers=2, num_decoder_layers=2
    )
    target = T5Model.random(cfg, 0)
    draft = T5Model.random(cfg.replace(num_decoder_layers=1), 1)
    rs = np.random.RandomState(0)
    tokens = rs.randint(2, 64, size=(13, 7)).astype(np.int32)  # 13 rows: pads to 16 (data) and 14 (mesh)
    tokens[:, -1] = 1
    tokens[3, 4:] = 0  # a shorter, padded input row
    mesh = parallel.make_mesh("data:2,model:4")
    out["mesh_shape"] = dict(mesh.shape)
    # eos_id 58 ends some rows after 1, 2 or 5 tokens under greedy (others run to T = 10): rows finish at
    # different times on different devices.
    cases = {
        "greedy": (
            temperature_sample,
            (target,),
            dict(rng=jax.random.PRNGKey(3), max_decode_length=10, temperature=0.0, eos_id=58),
        ),
        "sampled": (
            temperature_sample,
            (target,),
            dict(rng=jax.random.PRNGKey(4), max_decode_length=10, temperature=1.0, eos_id=58),
        ),
        "speculative_sampled": (
            speculative_sample,
            (target, draft),
            dict(rng=jax.random.PRNGKey(5), gamma=3, max_decode_length=10, temperature=1.0, eos_id=58),
        ),
        # Per-row sampling arrays: greedy, sampled and top-k / top-p rows in one batch, split over devices.
        "speculative_mixed": (
            speculative_sample,
            (target, draft),
            dict(
                rng=jax.random.PRNGKey(6),
                gamma=3,
                max_decode_length=10,
                eos_id=58,
                temperature=np.tile([0.0, 1.0, 0.7], 5)[:13],
                top_k=np.tile([0, 0, 5], 5)[:13],
                top_p=np.tile([1.0, 0.9, 1.0], 5)[:13],
            ),
        ),
        # Multi-draft verification: 2 branches per row, sampled, split over devices and over the mesh.
        "speculative_multi_draft": (
            speculative_sample,
            (target, draft),
            dict(rng=jax.random.PRNGKey(7), gamma=3, max_decode_length=10, temperature=1.0, eos_id=58, num_drafts=2),
        ),
    }
    for name, (fn, models, kwargs) in cases.items():
        ref = fn(*models, tokens, **kwargs)
        dp = parallel.data_parallel_sample(fn, *models, tokens, **kwargs)
        mp = parallel.model_parallel_sample(fn, *models, tokens, mesh=mesh, **kwargs)
        out[name] = {
            "rows": [int(dp.sequences.shape[0]), int(mp.sequences.shape[0])],
            "data_parallel_equal": _same(ref, dp),
            "mesh_equal": _same(ref, mp),
            "lengths": ref.lengths.tolist(),
            "distinct_rows": len({tuple(r) for r in ref.sequences.tolist()}),
        }

    # jax.pmap over the core itself (one slice of the batch per device) gives the one-device tokens.
    fn, models, kwargs = cases["speculative_sampled"]
    ref = fn(*models, tokens[:8], **kwargs)
    row_keys = jax.vmap(lambda i: jax.random.fold_in(kwargs["rng"], i))(np.arange(8))
    static = {k: v for k, v in kwargs.items() if k != "rng"}
    pmapped = jax.pmap(lambda x, k: speculative_sample(target, draft, x, rng=k, **static))
    pm = pmapped(tokens[:8].reshape(8, 1, -1), np.asarray(row_keys).reshape(8, 1, 2))
    pm = jax.tree_util.tree_map(lambda x: np.asarray(x).reshape((8,) + x.shape[2:]), pm)
    out["pmap_equal"] = _same(ref, pm)

    # No recompilation: the same shapes again (new key) reuse the compiled programs.
    before = parallel.num_compiled_programs()
    fn, models, kwargs = cases["greedy"]
    parallel.data_parallel_sample(fn, *models, tokens[::-1].copy(), **kwargs)
    parallel.model_parallel_sample(fn, *models, tokens[::-1].copy(), mesh=mesh, **kwargs)
    out["compiled_programs"] = [before, parallel.num_compiled_programs()]

    # Per-device loops: the data-parallel program has no cross-device collective at all; the mesh program
    # does (its sharded matmuls and its global stop test).
    call = parallel._split_call(fn, (*models, tokens), kwargs)
    prog_dp = parallel._data_parallel_jit(
        fn, call.models, call.static, jax.sharding.Mesh(np.asarray(jax.devices()), ("data",))
    )
    padded = np.concatenate([tokens, np.repeat(tokens[-1:], 3, 0)])
    keys = np.zeros((16, 2), np.uint32)
    per_row = {k: np.resize(v, 16) for k, v in call.per_row.items()}
    hlo = prog_dp.lower(call.params, padded, keys, per_row).compile().as_text()
    out["data_parallel_collectives"] = sorted(set(re.findall(COLLECTIVES, hlo)))

    # Model-parallel parameters really are split: shard shapes per device.
    sharded = parallel.shard_params(target, mesh)
    flat = jax.tree_util.tree_flatten_with_path(sharded.params)[0]
    shards = {}
    device_bytes = {str(d.id): 0 for d in jax.devices()}
    for path, x in flat:
        name = "/".join(str(k.key) for k in path)
        shards[name] = {
            "global": list(x.shape),
            "spec": [a for a in x.sharding.spec],
            "shard_shapes": sorted({tuple(s.data.shape) for s in x.addressable_shards}),
            "devices": len({s.device.id for s in x.addressable_shards}),
        }
        for s in x.addressable_shards:
            device_bytes[str(s.device.id)] += s.data.nbytes
    out["shards"] = {k: {**v, "shard_shapes": [list(s) for s in v["shard_shapes"]]} for k, v in shards.items()}
    out["param_bytes_total"] = int(sum(x.nbytes for _, x in flat))
    out["param_bytes_per_device"] = device_bytes
    replicated = parallel.replicate_params(draft, mesh)
    out["draft_replicated"] = all(
        tuple(s.data.shape) == x.shape
        for x in jax.tree_util.tree_leaves(replicated.params)
        for s in x.addressable_shards
    )
    return out


if __name__ == "__main__":
    json.dump(main(), sys.stdout)
    print()
