"""Checkpoint averaging: the element-wise mean of a run's weight snapshots, exported as a Hugging Face checkpoint.

Usage (from the repository root):
  python benchmarks/average_snapshots.py OUT_DIR RUN_DIR/snapshots/step_5000.msgpack ... [--dtype bfloat16]
  python benchmarks/average_snapshots.py OUT_DIR --last 4 RUN_DIR        # the run's 4 newest snapshots

Averaging the parameters of the last few checkpoints of a run (Vaswani et al. 2017, "Attention Is All You
Need", section 6.1: "the last 5 checkpoints, written at 10-minute intervals"; fairseq's
`scripts/average_checkpoints.py`) typically adds a fraction of a BLEU point to a translation model at no
training cost. Each snapshot is the float32 params of `specjax train --snapshot-every` (flax msgpack); the mean
is taken in float64 and the result written as a Hugging Face checkpoint (`save_checkpoint(..., format="hf")`,
bfloat16 by default, the shipped files' dtype) with RUN_DIR/config.json's model config, STEP (the newest
snapshot's step) and spiece.model (--vocab). `benchmarks/target_bleu.py OUT_DIR val` then measures it.

Raises SystemExit with a message for: no snapshots, snapshots of different parameter trees or shapes, a
missing RUN_DIR/config.json.

Cited by docs/training.md (the small target: the mean of its last five snapshots, as shipped). Output: OUT_DIR, a
checkpoint; its BLEU lines went to ``benchmarks/results/training/2026-12-06_target_bleu.txt``.
"""

import argparse
import json
import pathlib
import re
import shutil

import jax
import numpy as np
from flax import serialization

from specjax.checkpoints import save_checkpoint
from specjax.config import T5Config
from specjax.models.t5 import T5Model


def snapshot_step(path: pathlib.Path) -> int:
    """``.../step_<N>.msgpack`` -> N (tokens of the name; SystemExit for another name)."""
    m = re.fullmatch(r"step_(\d+)\.msgpack", path.name)
    if not m:
        raise SystemExit(f"{path}: not a snapshot of `specjax train --snapshot-every` (step_<N>.msgpack).")
    return int(m.group(1))


def average(paths: list[pathlib.Path]):
    """The float64 mean of the snapshots' parameter trees (every leaf float32 [..] as stored) -> numpy tree."""
    total, reference = None, None
    for path in paths:
        raw = serialization.msgpack_restore(path.read_bytes())
        tree = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), raw.get("params", raw))
        shapes = jax.tree_util.tree_map(np.shape, tree)
        if reference is None:
            reference, total = shapes, tree
            continue
        if jax.tree_util.tree_structure(shapes) != jax.tree_util.tree_structure(reference) or shapes != reference:
            raise SystemExit(
                f"{path}: its parameters differ in names or shapes from {paths[0]}; average snapshots of one run only."
            )
        total = jax.tree_util.tree_map(np.add, total, tree)
    return jax.tree_util.tree_map(lambda x: (x / len(paths)).astype(np.float32), total)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=pathlib.Path)
    p.add_argument("inputs", nargs="+", type=pathlib.Path, help="snapshots, or one RUN_DIR with --last")
    p.add_argument("--last", type=int, help="average the run's LAST newest snapshots (inputs: RUN_DIR)")
    p.add_argument("--vocab", type=pathlib.Path, default=pathlib.Path("specjax/assets/small_pair/spiece.model"))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a = p.parse_args()
    if a.last is not None:
        if len(a.inputs) != 1 or not a.inputs[0].is_dir() or a.last < 1:
            raise SystemExit("--last N takes one RUN_DIR (with a snapshots/ folder) and N >= 1.")
        found = sorted((a.inputs[0] / "snapshots").glob("step_*.msgpack"), key=snapshot_step)
        if not found:
            raise SystemExit(f"{a.inputs[0]}/snapshots holds no step_<N>.msgpack.")
        paths = found[-a.last :]
    else:
        paths = sorted(a.inputs, key=snapshot_step)
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"{path} does not exist.")
    meta = paths[0].parent.parent / "config.json"  # RUN_DIR/config.json of RUN_DIR/snapshots/step_N.msgpack
    if not meta.is_file():
        raise SystemExit(f"{meta} does not exist: the snapshots must sit in RUN_DIR/snapshots of a specjax run.")
    config = T5Config(**json.loads(meta.read_text())["model"])
    model = T5Model(config, average(paths))
    tmp = a.out_dir.with_name(a.out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(model.astype(a.dtype), tmp, format="hf")
    (tmp / "STEP").write_text(f"{snapshot_step(paths[-1])}\n")
    (tmp / "AVERAGED").write_text("".join(f"{path.name}\n" for path in paths))
    shutil.copy(a.vocab, tmp / "spiece.model")
    shutil.rmtree(a.out_dir, ignore_errors=True)
    tmp.rename(a.out_dir)
    print(
        f"averaged {len(paths)} snapshots (steps {', '.join(str(snapshot_step(x)) for x in paths)}) into "
        f"{a.out_dir} ({a.dtype})"
    )


if __name__ == "__main__":
    main()
