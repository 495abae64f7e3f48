"""Export a `specjax train` run's resume point as a bfloat16 Hugging Face checkpoint, with its step.

Usage (from the repository root):
  python benchmarks/export_run.py RUN_DIR OUT_DIR [--vocab spiece.model] [--dtype bfloat16]

Reads RUN_DIR/state.msgpack (params, optimizer state, step: flax msgpack) and RUN_DIR/config.json, and writes
OUT_DIR/model.safetensors + config.json (the format of `save_checkpoint(..., format="hf")`), OUT_DIR/STEP
(the step, one integer) and OUT_DIR/spiece.model (--vocab, else RUN_DIR/spiece.model when the run trained one). This is the *portable* resume point of
benchmarks/train_small_pair.sh: the parameters alone, small enough to commit between sessions, from which
`specjax train --init-from OUT_DIR --start-step $(cat OUT_DIR/STEP)` continues (fresh Adam moments).
"""

import argparse
import json
import pathlib
import shutil

import jax
import numpy as np
from flax import serialization

from specjax.checkpoints import save_checkpoint
from specjax.config import T5Config
from specjax.models.t5 import T5Model

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("run_dir", type=pathlib.Path)
p.add_argument("out_dir", type=pathlib.Path)
p.add_argument("--vocab", type=pathlib.Path)
p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
a = p.parse_args()
state_path = a.run_dir / "state.msgpack"
if not state_path.exists():
    raise SystemExit(f"{state_path} does not exist: nothing to export (has the run saved a resume point yet?).")
raw = serialization.msgpack_restore(state_path.read_bytes())
config = T5Config(**json.loads((a.run_dir / "config.json").read_text())["model"])
model = T5Model(config, jax.tree_util.tree_map(np.asarray, raw["params"]))
tmp = a.out_dir.with_name(a.out_dir.name + ".tmp")
shutil.rmtree(tmp, ignore_errors=True)
save_checkpoint(model.astype(a.dtype), tmp, format="hf")
(tmp / "STEP").write_text(f"{int(raw['step'])}\n")
vocab = a.vocab or (a.run_dir / "spiece.model" if (a.run_dir / "spiece.model").exists() else None)
if vocab:  # the run's own vocabulary when it trained one and --vocab is not given
    shutil.copy(vocab, tmp / "spiece.model")
shutil.rmtree(a.out_dir, ignore_errors=True)
tmp.rename(a.out_dir)  # never a half-written resume point
print(f"exported step {int(raw['step'])} of {a.run_dir} to {a.out_dir} ({a.dtype})")
