"""Tools for training and measuring the shipped pairs' models (docs/training.md): BLEU, validation
cross-entropy and the draft's α of a checkpoint or a ``specjax train`` snapshot; averaging snapshots; loss curves;
a shallower copy of a checkpoint as a draft's starting point.

    python benchmarks/training.py bleu specjax/assets/small_pair/target test
    python benchmarks/training.py val-ce specjax/assets/small_pair/target RUN_DIR/snapshots/step_N.msgpack
    python benchmarks/training.py alpha specjax/assets/small_pair/draft_distilled RUN_DIR/snapshots/step_N.msgpack
    python benchmarks/training.py average OUT_DIR --last 4 RUN_DIR
    python benchmarks/training.py plot OUT.png RUN_DIR ...
    python benchmarks/training.py select-layers IN_DIR OUT_DIR --decoder-layers 0 3

Run from the repository root with the data in ../shared/data. Each subcommand's ``--help`` gives its flags (``bleu``
and ``val-ce`` take checkpoint paths, ``bleu`` then ``val``, ``test`` or ``news``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import shutil
import sys
import time
from pathlib import Path

import jax
import numpy as np
import sacrebleu
from flax import serialization, traverse_util

import specjax
from specjax import bench
from specjax import train as tr
from specjax.bench.report import run_subcommands
from specjax.checkpoints import load_checkpoint, save_checkpoint
from specjax.cli.train import _model_sizes
from specjax.config import T5Config
from specjax.decoding import temperature_sample
from specjax.models import t5
from specjax.models.t5 import T5Model
from specjax.tokenizer import Tokenizer

# ------------------------------------------------------------------------------------------------------------
# bleu (formerly benchmarks/target_bleu.py)

_BLEU_DOC = """\
Greedy BLEU (sacrebleu, 13a) of a target on Multi30k val / test 2016 or newstest2014.

Usage (from the repository root, data in ../shared/data):
  python benchmarks/training.py bleu specjax/assets/small_pair/target test   # or val, news
  python benchmarks/training.py bleu runs/target2/snapshots/step_2400.msgpack val  # a training snapshot
  python benchmarks/training.py bleu runs/target2/snapshots/step_{2000,2200,2400}.msgpack val  # several, one process

Inputs are sorted by length and decoded with temperature_sample in batches of 128
(max_decode_length 64, 128 for news). Prints the sacrebleu line and the seconds taken.

Cited by docs/training.md and docs/models.md (the targets' BLEU). Output, as committed:
``python benchmarks/training.py bleu MODEL... val|test >> benchmarks/results/training/YYYY-MM-DD_target_bleu.txt``.
"""


def bleu() -> None:
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(_BLEU_DOC)
        return
    split = args.pop() if args and args[-1] in ("val", "test", "news") else "val"
    tok = Tokenizer("specjax/assets/small_pair/spiece.model", extra_ids=0)
    files = {
        "val": ("multi30k/val", 64),
        "test": ("multi30k/test_2016_flickr", 64),
        "news": ("../wmt/newstest2014", 128),
    }
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
            out = jax.device_get(
                temperature_sample(m, x, rng=jax.random.PRNGKey(0), max_decode_length=T, temperature=0.0)
            )
            for j, i in enumerate(idx):
                hyp[i] = tok.decode(out.sequences[j][: out.lengths[j]])
        print(path, split, len(s), "lines", sacrebleu.corpus_bleu(hyp, [r]), f"{time.time() - t0:.0f}s", flush=True)


# ------------------------------------------------------------------------------------------------------------
# val-ce (formerly benchmarks/target_val_ce.py)

_VAL_CE_DOC = """\
Teacher-forced cross-entropy of a target on Multi30k validation (nats per target token; float32, no dropout).

Usage (from the repository root, data in ../shared/data):
  python benchmarks/training.py val-ce specjax/assets/small_pair/target RUN_DIR/snapshots/step_N.msgpack ...

Each checkpoint is a Hugging Face directory or a ``specjax train`` snapshot (its model config read from
RUN_DIR/config.json). The 1,014 validation pairs are tokenized and batched as ``specjax train`` batches them
(``train.batches``, 1,024 tokens a batch; the ragged tail of each length bucket is left out, the same lines for
every checkpoint: 16,037 target tokens with the 8k vocabulary), and the cross-entropy is
``train.cross_entropy_loss`` of the model's logits, the training loss without label smoothing or dropout. A
smoother signal than greedy BLEU for comparing snapshots of one recipe with another.

Cited by docs/training.md (the small target's validation cross-entropy). Output, as committed:
``python benchmarks/training.py val-ce MODEL... > benchmarks/results/training/YYYY-MM-DD_target_val_ce.txt``.
"""


def val_ce() -> None:
    paths = sys.argv[1:]
    if not paths or paths[0] in ("-h", "--help"):
        print(_VAL_CE_DOC)
        return
    tok = Tokenizer("specjax/assets/small_pair/spiece.model", extra_ids=0)
    data = pathlib.Path("../shared/data/train/multi30k")
    src, tgt = tr.tokenize_pairs(
        tok, (data / "val.en").read_text().splitlines(), (data / "val.de").read_text().splitlines()
    )
    for path in paths:
        model = load_model(path)
        f = jax.jit(lambda p, e, d: tr.cross_entropy_loss(t5.logits(model.config, p, e, tr.shift_right(d)), d))
        total = count = 0.0
        for enc, dec, _ in tr.batches(src, tgt, 1024, 0, 0):
            ce, n = f(model.params, enc, dec)
            total += float(ce) * float(n)
            count += float(n)
        print(f"{path} val CE {total / count:.4f} nats/token over {int(count)} tokens", flush=True)


# ------------------------------------------------------------------------------------------------------------
# alpha (formerly benchmarks/draft_alpha.py)

_ALPHA_DOC = """\
The paper's α of one or more drafts against the small (or mini) pair's target, on Multi30k lines.

Usage (from the repository root, data in ../shared/data):
  python benchmarks/training.py alpha specjax/assets/small_pair/draft_distilled RUN_DIR/snapshots/step_N.msgpack
  python benchmarks/training.py alpha specjax/assets/small_pair/draft_distilled \\
      --target RUN_DIR/snapshots/step_N.msgpack

Each draft (a Hugging Face directory as ``--export`` writes, or a ``specjax train`` snapshot whose config is read
from RUN_DIR/config.json) is run with ``speculative_sample`` against the target at batch 16 on the first
``--num-inputs`` validation lines (``--split test``: test 2016 lines; the training sees neither), γ 5, at
temperatures 0 and 1, and the acceptance rate α (Leviathan et al. 2023, §3.1: the mean of
β = Σ_x min(p(x), q(x)) over verified positions, accumulated in the loop) is printed per draft. α does not
depend on the machine's speed, so this runs beside a training job.

Cited by docs/training.md and docs/models.md (the shipped drafts' α). Output, as committed:
``python benchmarks/training.py alpha ... --split test >> benchmarks/results/small_pair/YYYY-MM-DD_alpha.txt``.
"""


def load_model(path: str) -> T5Model:
    """A draft from an HF directory or a ``specjax train`` snapshot (RUN_DIR/snapshots/step_N.msgpack)."""
    if path.endswith(".msgpack"):
        raw = serialization.msgpack_restore(pathlib.Path(path).read_bytes())
        raw = raw.get("params", raw)
        cfg = T5Config(**json.loads((pathlib.Path(path).parent.parent / "config.json").read_text())["model"])
        return T5Model(cfg, jax.tree_util.tree_map(np.asarray, raw))
    return specjax.load_checkpoint(path, dtype="float32")


def alpha():
    p = argparse.ArgumentParser(description=_ALPHA_DOC.splitlines()[0])
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
        target = load_model(a.target)
    name = {"val": "val", "test": "test_2016_flickr"}[a.split]
    lines = open(f"../shared/data/train/multi30k/{name}.en", encoding="utf-8").read().splitlines()[: a.num_inputs]
    batches = bench.pad_batches([tok.encode(s)[:63] for s in lines], batch_size=16)
    for path in a.drafts:
        draft = load_model(path)
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


# ------------------------------------------------------------------------------------------------------------
# average (formerly benchmarks/average_snapshots.py)

_AVERAGE_MAIN_DOC = """\
Checkpoint averaging: the element-wise mean of a run's weight snapshots, exported as a Hugging Face checkpoint.

Usage (from the repository root):
  python benchmarks/training.py average OUT_DIR RUN_DIR/snapshots/step_5000.msgpack ... [--dtype bfloat16]
  python benchmarks/training.py average OUT_DIR --last 4 RUN_DIR        # the run's 4 newest snapshots

Averaging the parameters of the last few checkpoints of a run (Vaswani et al. 2017, "Attention Is All You
Need", section 6.1: "the last 5 checkpoints, written at 10-minute intervals"; fairseq's
`scripts/average_checkpoints.py`) typically adds a fraction of a BLEU point to a translation model at no
training cost. Each snapshot is the float32 params of `specjax train --snapshot-every` (flax msgpack); the mean
is taken in float64 and the result written as a Hugging Face checkpoint (`save_checkpoint(..., format="hf")`,
bfloat16 by default, the shipped files' dtype) with RUN_DIR/config.json's model config, STEP (the newest
snapshot's step) and spiece.model (--vocab). `python benchmarks/training.py bleu OUT_DIR val` then measures it.

Raises SystemExit with a message for: no snapshots, snapshots of different parameter trees or shapes, a
missing RUN_DIR/config.json.

Cited by docs/training.md (the small target: the mean of its last five snapshots, as shipped). Output: OUT_DIR, a
checkpoint; its BLEU lines went to ``benchmarks/results/training/2026-12-06_target_bleu.txt``.
"""


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


def average_main():
    p = argparse.ArgumentParser(description=_AVERAGE_MAIN_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
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


# ------------------------------------------------------------------------------------------------------------
# plot (formerly benchmarks/plot_training.py)

_PLOT_DOC = """\
Loss curves of `specjax train` runs, with validation BLEU beside them, as one PNG.

Reads each run's ``log.jsonl`` (one record per ``log_every`` steps: ``step``, ``ce`` — the plain cross-entropy
in nats per target token, also under label smoothing — and ``loss``, the objective optimised) and, optionally,
files of ``python benchmarks/training.py bleu`` output lines (``.../step_N.msgpack val ... BLEU = x ...``), whose
validation BLEU per snapshot step is drawn on a second axis. Nothing is computed here beyond reading.

Cited by docs/training.md ("What did not work": AdamW against Adafactor on the small target). Output, as
committed (R=benchmarks/results/training)::

    python benchmarks/training.py plot $R/2026-12-06_target_curves.png --tokens-per-batch 4096 \
        --log "AdamW 4e-4, embedding learning rate x22.6 (test BLEU 25.81)=$R/2026-12-06_target_adamw_log.jsonl" \
        --log "Adafactor 1e-2, shipped after averaging (test BLEU 31.63)=$R/2026-12-06_target_adafactor_log.jsonl"
"""


BLEU_LINE = re.compile(r"step_(\d+)\.msgpack\s+(val|test)\b.*?BLEU = ([\d.]+)")


def read_log(path: str | Path) -> tuple[list[int], list[float]]:
    """(steps, plain cross-entropy in nats) of a run's log.jsonl; a record without ``ce`` uses ``loss``.

    Raises:
      FileNotFoundError: no such file. ValueError: no records in it.
    """
    steps, ce = [], []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            steps.append(int(rec["step"]))
            ce.append(float(rec.get("ce", rec["loss"])))
    if not steps:
        raise ValueError(f"{path} holds no log records.")
    return steps, ce


def read_bleu(path: str | Path, split: str = "val") -> tuple[list[int], list[float]]:
    """(snapshot steps, BLEU) of the ``split`` lines of a file of ``training.py bleu`` outputs, sorted by step."""
    points = {}
    for line in Path(path).read_text().splitlines():
        m = BLEU_LINE.search(line)
        if m and m.group(2) == split:
            points[int(m.group(1))] = float(m.group(3))
    return sorted(points), [points[k] for k in sorted(points)]


def _labelled(arg: str) -> tuple[str, str]:
    label, sep, path = arg.partition("=")
    return (label, path) if sep else (Path(arg).parent.name or arg, arg)


def plot(argv=None) -> int:
    ap = argparse.ArgumentParser(description=_PLOT_DOC.split("\n\n")[0])
    ap.add_argument("out", help="the PNG to write")
    ap.add_argument("--log", action="append", required=True, metavar="[LABEL=]LOG_JSONL")
    ap.add_argument("--bleu", action="append", default=[], metavar="[LABEL=]BLEU_TXT")
    ap.add_argument(
        "--tokens-per-batch",
        type=int,
        default=2048,
        help="the runs' --tokens-per-batch, for the x axis label (default: 2048)",
    )
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for arg in args.log:
        label, path = _labelled(arg)
        steps, ce = read_log(path)
        ax.plot(steps, ce, label=f"{label}: training cross-entropy")
    ax.set_xlabel(f"step ({args.tokens_per_batch:,} target tokens each)")
    ax.set_ylabel("training cross-entropy (nats / token)")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if args.bleu:
        ax2 = ax.twinx()
        for i, arg in enumerate(args.bleu):
            label, path = _labelled(arg)
            steps, bleu = read_bleu(path)
            ax2.plot(steps, bleu, "o--", color=f"C{len(args.log) + i}", label=f"{label}: validation BLEU (greedy)")
        ax2.set_ylabel("Multi30k validation BLEU")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="center right", fontsize=8)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)
    return 0


# ------------------------------------------------------------------------------------------------------------
# select-layers (formerly benchmarks/select_layers.py)

_SELECT_LAYERS_MAIN_DOC = """\
A shallower copy of a T5 checkpoint: keep some of its decoder (or encoder) layers, renumbered, the rest of the
weights as they are. The starting point of a draft with fewer decoder layers, distilled afterwards.

Usage (from the repository root):
  python benchmarks/training.py select-layers IN_DIR OUT_DIR --decoder-layers 0 3

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


def select_layers_main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=_SELECT_LAYERS_MAIN_DOC.split("\n\n")[0])
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


SUBCOMMANDS = {
    "bleu": (bleu, _BLEU_DOC),
    "val-ce": (val_ce, _VAL_CE_DOC),
    "alpha": (alpha, _ALPHA_DOC),
    "average": (average_main, _AVERAGE_MAIN_DOC),
    "plot": (plot, _PLOT_DOC),
    "select-layers": (select_layers_main, _SELECT_LAYERS_MAIN_DOC),
}


def main() -> int:
    """``python benchmarks/NAME.py SUBCOMMAND [flags]``: runs SUBCOMMAND with the flags its ``--help`` lists."""
    return run_subcommands(__doc__, SUBCOMMANDS)


if __name__ == "__main__":
    sys.exit(main())
