"""One of two JAX processes of ``test_processes.py``: ``model_parallel_sample`` on a mesh that spans both.

Started twice by the test, with the environment ``specjax.launch.process_environment`` gives a process of
``specjax generate --processes 2`` (4 host devices each, JAX's coordination service on a free localhost port,
gloo collectives). Each process builds the same tiny random T5 pair and batch, runs ``speculative_sample``
(greedy and sampled) with ``model_parallel_sample`` over the global mesh data:4,model:2
(8 devices, 4 of each process: the batch and the weights are split across the processes) and alone on its first
local device, and prints one JSON object: whether every result field is equal, plus the mesh's make-up.
"""

from __future__ import annotations

import json
import sys

from specjax import parallel

parallel.maybe_initialize_distributed()  # before anything touches a device

import jax  # noqa: E402
import numpy as np  # noqa: E402

from specjax import T5Config, T5Model, speculative_sample  # noqa: E402

FIELDS = ("sequences", "lengths", "num_target_calls", "num_draft_tokens", "num_accepted", "num_verified")


def main() -> dict:
    mesh = parallel.make_mesh("data:4,model:2")  # every process's devices
    out: dict = {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "mesh_processes": sorted({d.process_index for d in mesh.devices.flat}),
    }
    cfg = T5Config(
        vocab_size=64, d_model=32, num_heads=4, head_dim=8, mlp_dim=64, num_encoder_layers=2, num_decoder_layers=2
    )
    target = T5Model.random(cfg, 0)
    draft = T5Model.random(cfg.replace(num_decoder_layers=1), 1)
    tokens = np.random.RandomState(0).randint(2, 64, size=(6, 7)).astype(np.int32)  # 6 rows: padded to 8
    tokens[:, -1] = 1
    cases = {
        "speculative_greedy": (speculative_sample, (target, draft), dict(rng=jax.random.PRNGKey(4), temperature=0.0)),
        "speculative_sampled": (speculative_sample, (target, draft), dict(rng=jax.random.PRNGKey(5), temperature=1.0)),
    }
    for name, (fn, models, kwargs) in cases.items():
        kwargs = dict(kwargs, max_decode_length=8, eos_id=58, gamma=3)
        ref = fn(*models, tokens, **kwargs)  # this process's first device alone
        mp = parallel.model_parallel_sample(fn, *models, tokens, mesh=mesh, **kwargs)
        out[name] = {
            "equal": all(np.array_equal(np.asarray(getattr(ref, f)), getattr(mp, f)) for f in FIELDS),
            "lengths": np.asarray(ref.lengths).tolist(),
            "distinct_rows": len({tuple(r) for r in np.asarray(ref.sequences).tolist()}),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
    sys.stdout.flush()
