"""Teacher-forced cross-entropy of a target on Multi30k validation (nats per target token; float32, no dropout).

Usage (from the repository root, data in ../shared/data):
  python benchmarks/target_val_ce.py specjax/assets/small_pair/target RUN_DIR/snapshots/step_N.msgpack ...

Each checkpoint is a Hugging Face directory or a ``specjax train`` snapshot (its model config read from
RUN_DIR/config.json). The 1,014 validation pairs are tokenized and batched as ``specjax train`` batches them
(``train.batches``, 1,024 tokens a batch; the ragged tail of each length bucket is left out, the same lines for
every checkpoint: 16,037 target tokens with the 8k vocabulary), and the cross-entropy is
``train.cross_entropy_loss`` of the model's logits, the training loss without label smoothing or dropout. A
smoother signal than greedy BLEU for comparing snapshots of one recipe with another.

Cited by docs/training.md (the small target's validation cross-entropy). Output, as committed:
``python benchmarks/target_val_ce.py MODEL... > benchmarks/results/training/YYYY-MM-DD_target_val_ce.txt``.
"""

import pathlib
import sys

import jax
from draft_alpha import load  # a Hugging Face directory or a specjax train snapshot (benchmarks/ is on sys.path)

from specjax import train as tr
from specjax.models import t5
from specjax.tokenizer import Tokenizer


def main(paths):
    tok = Tokenizer("specjax/assets/small_pair/spiece.model", extra_ids=0)
    data = pathlib.Path("../shared/data/train/multi30k")
    src, tgt = tr.tokenize_pairs(
        tok, (data / "val.en").read_text().splitlines(), (data / "val.de").read_text().splitlines()
    )
    for path in paths:
        model = load(path)
        f = jax.jit(lambda p, e, d: tr.cross_entropy_loss(t5.logits(model.config, p, e, tr.shift_right(d)), d))
        total = count = 0.0
        for enc, dec, _ in tr.batches(src, tgt, 1024, 0, 0):
            ce, n = f(model.params, enc, dec)
            total += float(ce) * float(n)
            count += float(n)
        print(f"{path} val CE {total / count:.4f} nats/token over {int(count)} tokens", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
