"""The paper's α of one or more drafts against the small (or mini) pair's target, on Multi30k lines.

Usage (from the repository root, data in ../shared/data):
  python benchmarks/draft_alpha.py specjax/assets/small_pair/draft_distilled RUN_DIR/snapshots/step_N.msgpack
  python benchmarks/draft_alpha.py specjax/assets/small_pair/draft_distilled --target RUN_DIR/snapshots/step_N.msgpack

Each draft (a Hugging Face directory as ``--export`` writes, or a ``specjax train`` snapshot whose config is read
from RUN_DIR/config.json) is run with ``speculative_sample`` against the target at batch 16 on the first
``--num-inputs`` validation lines (``--split test``: test 2016 lines; the training sees neither), γ 5, at
temperatures 0 and 1, and the acceptance rate α (Leviathan et al. 2023, §3.1: the mean of
β = Σ_x min(p(x), q(x)) over verified positions, accumulated in the loop) is printed per draft. α does not
depend on the machine's speed, so this runs beside a training job.

Cited by docs/training.md and docs/models.md (the shipped drafts' α). Output, as committed:
``python benchmarks/draft_alpha.py ... --split test >> benchmarks/results/small_pair/YYYY-MM-DD_alpha.txt``.
"""

import argparse
import json
import pathlib

import jax
import numpy as np
from flax import serialization

import specjax
from specjax import bench
from specjax.config import T5Config
from specjax.models.t5 import T5Model


def load(path: str) -> T5Model:
    """A draft from an HF directory or a ``specjax train`` snapshot (RUN_DIR/snapshots/step_N.msgpack)."""
    if path.endswith(".msgpack"):
        raw = serialization.msgpack_restore(pathlib.Path(path).read_bytes())
        raw = raw.get("params", raw)
        cfg = T5Config(**json.loads((pathlib.Path(path).parent.parent / "config.json").read_text())["model"])
        return T5Model(cfg, jax.tree_util.tree_map(np.asarray, raw))
    return specjax.load_checkpoint(path, dtype="float32")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("drafts", nargs="+", help="draft checkpoints or snapshots")
    p.add_argument("--size", default="small", choices=["mini", "small"], help="whose target (default: small)")
    p.add_argument("--num-inputs", type=int, default=256, help="lines (default: 256)")
    p.add_argument("--gamma", type=int, default=5, help="γ (default: 5)")
    p.add_argument(
        "--split", default="val", choices=["val", "test"], help="Multi30k validation (default) or test 2016 lines"
    )
    p.add_argument(
        "--target",
        default=None,
        help="another target: a checkpoint directory or a training snapshot (default: the pair's own)",
    )
    a = p.parse_args()
    target, _, tok = specjax.load_default_pair(size=a.size)
    if a.target:
        target = load(a.target)
    name = {"val": "val", "test": "test_2016_flickr"}[a.split]
    lines = open(f"../shared/data/train/multi30k/{name}.en", encoding="utf-8").read().splitlines()[: a.num_inputs]
    batches = bench.pad_batches([tok.encode(s)[:63] for s in lines], batch_size=16)
    for path in a.drafts:
        draft = load(path)
        for temperature in (0.0, 1.0):
            beta = verified = 0.0
            for j, x in enumerate(batches):
                out = jax.device_get(
                    specjax.speculative_sample(
                        target,
                        draft,
                        x,
                        rng=jax.random.PRNGKey(j),
                        gamma=a.gamma,
                        max_decode_length=64,
                        temperature=temperature,
                    )
                )
                beta += float(np.sum(out.beta_sum))
                verified += float(np.sum(out.num_verified))
            print(
                f"{path}  temperature {temperature:g}: α = {beta / verified:.4f} "
                f"({int(verified)} verified positions, {len(lines)} {a.split} lines, γ {a.gamma})",
                flush=True,
            )


if __name__ == "__main__":
    main()
