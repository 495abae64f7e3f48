"""Greedy BLEU (sacrebleu, 13a) of a target on Multi30k val / test 2016 or newstest2014.

Usage (from the repository root, data in ../shared/data):
  python benchmarks/target_bleu.py specjax/assets/small_pair/target test   # or val, news
  python benchmarks/target_bleu.py runs/target2/snapshots/step_2400.msgpack val  # a training snapshot
  python benchmarks/target_bleu.py runs/target2/snapshots/step_{2000,2200,2400}.msgpack val  # several, one process

Inputs are sorted by length and decoded with temperature_sample in batches of 128
(max_decode_length 64, 128 for news). Prints the sacrebleu line and the seconds taken.

Cited by docs/training.md and docs/models.md (the targets' BLEU). Output, as committed:
``python benchmarks/target_bleu.py MODEL... val|test >> benchmarks/results/training/YYYY-MM-DD_target_bleu.txt``.
"""

import sys
import time

import jax
import numpy as np
import sacrebleu
from flax import serialization

from specjax import bench
from specjax.cli.train import _model_sizes
from specjax.decoding import temperature_sample
from specjax.models.t5 import T5Model
from specjax.tokenizer import Tokenizer

args = sys.argv[1:]
split = args.pop() if args and args[-1] in ("val", "test", "news") else "val"
tok = Tokenizer("specjax/assets/small_pair/spiece.model", extra_ids=0)
files = {"val": ("multi30k/val", 64), "test": ("multi30k/test_2016_flickr", 64), "news": ("../wmt/newstest2014", 128)}
base, T = files[split]
s = open(f"../shared/data/train/{base}.en").read().splitlines()
r = open(f"../shared/data/train/{base}.de").read().splitlines()
order = sorted(range(len(s)), key=lambda i: len(s[i]))
for path in args:
    if path.endswith(".msgpack"):
        raw = serialization.msgpack_restore(open(path, "rb").read())
        raw = raw.get("params", raw)
        import json
        import pathlib

        from specjax.config import T5Config

        meta = pathlib.Path(path).parent.parent / "config.json"  # RUN_DIR/config.json of RUN_DIR/snapshots/step_N
        cfg = T5Config(**json.loads(meta.read_text())["model"]) if meta.exists() else _model_sizes()["target"]
        m = T5Model(cfg, jax.tree_util.tree_map(np.asarray, raw))
    else:
        from specjax.checkpoints import load_checkpoint

        m = load_checkpoint(path, dtype="float32")
    hyp = [None] * len(s)
    t0 = time.time()
    for k in range(0, len(s), 128):
        idx = order[k : k + 128]
        x = bench.pad_batches([tok.encode(s[i])[:255] for i in idx], batch_size=128)[0]
        out = jax.device_get(temperature_sample(m, x, rng=jax.random.PRNGKey(0), max_decode_length=T, temperature=0.0))
        for j, i in enumerate(idx):
            hyp[i] = tok.decode(out.sequences[j][: out.lengths[j]])
    print(path, split, len(s), "lines", sacrebleu.corpus_bleu(hyp, [r]), f"{time.time() - t0:.0f}s", flush=True)
