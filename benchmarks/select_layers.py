"""A shallower copy of a T5 checkpoint: keep some of its decoder (or encoder) layers, renumbered, the rest of the
weights as they are. The starting point of a draft with fewer decoder layers, distilled afterwards.

Usage (from the repository root):
  python benchmarks/select_layers.py IN_DIR OUT_DIR --decoder-layers 0 3

Initialising a shallow student from a subset of a deeper model's layers, the first and the last for two, then
distilling it, is what DistilBERT (Sanh et al. 2019, section 3: "taking one layer out of two") and
Distil-Whisper (Gandhi et al. 2023, section 4: "maximally spaced" decoder layers, the first and last for two)
do. A draft's per-token decode cost is its decoder's (the encoder runs once per input), so its decoder depth
is the lever (docs/training.md).

IN_DIR: a Hugging Face directory (`config.json` + `model.safetensors`, as `specjax train --export` writes) or
any checkpoint `specjax.load_checkpoint` reads. OUT_DIR gets `config.json`, `model.safetensors` (the input's
dtype) and the input's `spiece.model` when it has one. SystemExit with a message for a layer index outside the
model, a repeated index, or no layer kept.

Cited by docs/training.md (the shipped small draft's 2-decoder-layer starting point). Output: OUT_DIR, a
checkpoint.
"""

import argparse
import dataclasses
import pathlib
import re
import shutil

from flax import traverse_util

from specjax.checkpoints import load_checkpoint, save_checkpoint
from specjax.models.t5 import T5Model


def select_layers(model: T5Model, stack: str, keep: list[int]) -> T5Model:
    """``model`` with only ``keep`` of ``stack``'s ("encoder" or "decoder") layers, renumbered 0..len(keep)-1
    in the order given; every other parameter (embeddings, relative position biases, norms, logits) as is.

    Raises:
      SystemExit: an index outside the stack, a repeated index, or an empty ``keep``.
    """
    field = "num_decoder_layers" if stack == "decoder" else "num_encoder_layers"
    count = getattr(model.config, field)
    if not keep or len(set(keep)) != len(keep) or any(not 0 <= i < count for i in keep):
        raise SystemExit(
            f"--{stack}-layers {keep}: give distinct indices in [0, {count}) (the {stack} has {count} layers)."
        )
    new_index = {old: new for new, old in enumerate(keep)}
    out = {}
    for key, value in traverse_util.flatten_dict(model.params, sep="/").items():
        m = re.fullmatch(rf"{stack}/layers_(\d+)/(.*)", key)
        if m is None:
            out[key] = value
        elif int(m.group(1)) in new_index:
            out[f"{stack}/layers_{new_index[int(m.group(1))]}/{m.group(2)}"] = value
    config = dataclasses.replace(model.config, **{field: len(keep)})
    return T5Model(config, traverse_util.unflatten_dict(out, sep="/"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", type=pathlib.Path)
    ap.add_argument("output", type=pathlib.Path)
    ap.add_argument("--decoder-layers", type=int, nargs="+", help="decoder layer indices to keep, in order")
    ap.add_argument("--encoder-layers", type=int, nargs="+", help="encoder layer indices to keep, in order")
    args = ap.parse_args(argv)
    if not args.decoder_layers and not args.encoder_layers:
        raise SystemExit("Nothing to do: give --decoder-layers and/or --encoder-layers.")
    model = load_checkpoint(args.input, dtype=None)
    if args.decoder_layers:
        model = select_layers(model, "decoder", args.decoder_layers)
    if args.encoder_layers:
        model = select_layers(model, "encoder", args.encoder_layers)
    save_checkpoint(model, args.output, format="hf")
    vocab = args.input / "spiece.model"
    if vocab.exists():
        shutil.copy(vocab, args.output / "spiece.model")
    print(
        f"{args.output}: {model.config.num_encoder_layers} encoder + {model.config.num_decoder_layers} decoder "
        f"layers, {model.num_params:,} parameters"
    )


if __name__ == "__main__":
    main()
