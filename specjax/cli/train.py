"""``specjax train``: train a target, a reference-only draft, or a DistillSpec draft on parallel text."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specjax.config import PRESETS

DATA = Path("../shared/data/train/multi30k")
STUDENT_SEED = 1000
"""``--student-samples``: round k draws with seed ``STUDENT_SEED + k`` (the teacher's round k with seed k)."""


def add_parser(sub) -> None:
    """Registers ``specjax train`` and its options."""
    p = sub.add_parser(
        "train",
        help="train a T5 (target or draft) with optax on parallel text",
        description="Train a T5 1.1 model on English->German text (Multi30k by default). Resumable: re-run "
        "the same command to continue from RUN_DIR/state.msgpack. Deterministic given --seed.",
    )
    p.add_argument("--run-dir", required=True, help="directory for state.msgpack, log.jsonl, config.json")
    p.add_argument(
        "--source",
        default=str(DATA / "train.en"),
        help=f"source-language text, one line each (default: {DATA / 'train.en'}, relative to the current directory)",
    )
    p.add_argument(
        "--target-text",
        default=str(DATA / "train.de"),
        help=f"target-language text, line-aligned with --source (default: {DATA / 'train.de'})",
    )
    p.add_argument(
        "--vocab",
        help="SentencePiece .model; trained on --source/--target-text when absent (written to RUN_DIR/spiece.model)",
    )
    p.add_argument("--vocab-size", type=int, default=8000, help="pieces when training the vocabulary (default: 8000)")
    p.add_argument(
        "--model",
        default="target",
        choices=[*_model_sizes(), *PRESETS],
        help="model size: the mini pair's 'target' or 'draft', the small pair's 'small-target', "
        "'small-draft' or 'small-draft-shallow', or a T5 preset name (default: target)",
    )
    p.add_argument(
        "--model-config",
        metavar="JSON",
        help='model size from a JSON file instead of --model: T5Config fields (e.g. {"d_model": 512, '
        "\"num_heads\": 8, ...}; fields left out take T5Config's defaults), a run directory's "
        "config.json, or a Hugging Face config.json. The vocabulary size always comes from --vocab",
    )
    p.add_argument(
        "--objective",
        default="reference",
        choices=["reference", "distill"],
        help="reference: cross-entropy on the training targets; distill: DistillSpec forward KL to "
        "--teacher's token distributions (Zhou et al. 2023) (default: reference)",
    )
    p.add_argument(
        "--teacher",
        help="checkpoint of the target to distill from (objective=distill): a Hugging Face "
        "directory (config.json + model.safetensors, as --export writes) or a T5X checkpoint",
    )
    p.add_argument(
        "--train-on",
        default=None,
        choices=["references", "teacher"],
        help="training targets: the reference translations, or the teacher's greedy outputs "
        "(default: teacher for --objective distill, references otherwise)",
    )
    p.add_argument(
        "--teacher-samples",
        type=int,
        default=0,
        metavar="N",
        help="with --train-on teacher: N more training targets per source, sampled from the teacher at "
        "temperature 1 (DistillSpec's sampled teacher data; each source then appears N + 1 times, "
        "once with the greedy output), computed once into RUN_DIR/teacher_outputs.npz (default 0)",
    )
    p.add_argument(
        "--student-samples",
        type=int,
        default=0,
        metavar="N",
        help="with --train-on teacher and --init-from: N more training targets per source, sampled at "
        "temperature 1 from the --init-from model (the draft as it starts: DistillSpec's on-policy "
        "data, drawn once), after the teacher's; cached with them (default 0)",
    )
    p.add_argument(
        "--no-teacher-cache",
        dest="cache_teacher",
        action="store_false",
        help="distill: run the teacher's forward pass in every step instead of computing its "
        "log-probabilities once into RUN_DIR/teacher_logprobs.f16 (float16, ~16 KB per target "
        "token with an 8k vocabulary)",
    )
    p.add_argument(
        "--init-from",
        help="checkpoint to start from instead of a random initialisation, of the same size: a "
        "Hugging Face directory (as --export writes) or a T5X checkpoint (e.g. the "
        "reference-trained draft, for DistillSpec)",
    )
    p.add_argument("--max-examples", type=int, default=0, help="use only the first N pairs (default 0: all)")
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps in the whole run (default: 3000)")
    p.add_argument(
        "--tokens-per-batch",
        type=int,
        default=2048,
        help="target tokens per batch; batches group pairs of similar length (default: 2048)",
    )
    p.add_argument(
        "--learning-rate",
        type=float,
        default=7e-4,
        help="peak learning rate: linear warmup, then cosine decay to 10%% of it over --steps "
        "(default: 7e-4, for AdamW; Adafactor's is a relative step size, t5x uses 1e-2)",
    )
    p.add_argument(
        "--optimizer",
        default="adamw",
        choices=["adamw", "adafactor"],
        help="adamw (default) or adafactor with t5x's settings (factored second moments, decay 0.8, "
        "update clipping 1, no momentum, steps scaled by each parameter's RMS)",
    )
    p.add_argument(
        "--weight-decay",
        type=float,
        default=0.01,
        help="decoupled weight decay: each step subtracts learning rate x this x the parameter "
        "(default: 0.01; t5x's Adafactor uses 0)",
    )
    p.add_argument("--warmup-steps", type=int, default=400, help="linear warmup steps (default: 400)")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the initialisation, data order and dropout (default: 0)"
    )
    p.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="dropout rate while training (default: 0; 0.1-0.2 keeps a small target from overfitting Multi30k)",
    )
    p.add_argument(
        "--dropout-style",
        default="sublayers",
        choices=["sublayers", "t5x"],
        help="sublayers (default): independent masks on the embeddings, sub-layer outputs and final "
        "norms; t5x: as t5x's network.py, those masks shared along the length axis plus dropout "
        "on the attention weights and the MLP's hidden layer",
    )
    p.add_argument(
        "--label-smoothing",
        type=float,
        default=0.0,
        help="label smoothing ε for --objective reference: 1-ε on the reference token, ε/(vocab-1) on "
        "each other (default: 0; 0.1 is the usual value with dropout 0.3 on small data)",
    )
    p.add_argument(
        "--embedding-lr-multiplier",
        type=float,
        default=1.0,
        help="the token embedding's learning rate is --learning-rate times this (default: 1, plain "
        "AdamW). t5x initialises the embedding at RMS 1 and the kernels at d_model^-1/2 and trains "
        "with Adafactor, whose steps scale with each parameter's RMS; d_model^0.5 (22.6 for "
        "small-target) gives the embedding that ratio under AdamW",
    )
    p.add_argument(
        "--snapshot-every",
        type=int,
        default=0,
        help="also keep the weights every N steps as RUN_DIR/snapshots/step_N.msgpack (0: never)",
    )
    p.add_argument(
        "--save-every",
        type=int,
        default=250,
        help="write the resume point RUN_DIR/state.msgpack every N steps (also on Ctrl-C and SIGTERM; default: 250)",
    )
    p.add_argument(
        "--compute-dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="dtype of activations and matmuls in the training step (default: the model's, float32); "
        "parameters and optimizer state stay float32 and the saved config is unchanged",
    )
    p.add_argument(
        "--start-step",
        type=int,
        default=0,
        help="with --init-from: continue a run from its parameters alone at this step (schedule and "
        "data order), fresh optimizer moments with a 50-step re-warmup; for a run whose "
        "state.msgpack was lost. Ignored when RUN_DIR/state.msgpack exists",
    )
    p.add_argument("--export", help="write the trained model here as a Hugging Face safetensors directory")
    p.add_argument(
        "--export-dtype",
        default="bfloat16",
        choices=["float32", "bfloat16", "float16"],
        help="dtype of the exported weights (default: bfloat16)",
    )
    p.set_defaults(func=run)


def _model_sizes():
    from specjax.config import T5Config

    # The mini pair. Target: T5 1.1, 4+4 layers, d 256, 13.5M parameters with an 8k
    # vocabulary. Draft: d 64, 4 encoder + 2 decoder layers: 0.66M per-token decode multiply-adds vs the
    # target's 6.77M (1/10.3; the 8k-way logits alone are 0.51M). The encoder runs once per input, so its
    # depth is not part of the per-token cost.
    sizes = {
        "target": T5Config(
            vocab_size=8000,
            d_model=256,
            num_heads=4,
            head_dim=64,
            mlp_dim=1024,
            num_encoder_layers=4,
            num_decoder_layers=4,
            name="specjax_target_ende",
        ),
        "draft": T5Config(
            vocab_size=8000,
            d_model=64,
            num_heads=2,
            head_dim=32,
            mlp_dim=256,
            num_encoder_layers=4,
            num_decoder_layers=2,
            name="specjax_draft_ende",
        ),
        # The small pair (docs/training.md). Target: d 512, 8 x 64 heads,
        # 6+6 layers, 46.0M parameters, 99.6 MiB of float32 decoder weights (beyond a 32 MB L3 cache),
        # 23.0M per-token decode multiply-adds. Draft: d 128, 4 x 32 heads, 6 encoder + 4 decoder layers,
        # 2.20M per-token multiply-adds (1/10.4 of the target; the 8k-way logits are 1.02M of them).
        "small-target": T5Config(
            vocab_size=8000,
            d_model=512,
            num_heads=8,
            head_dim=64,
            mlp_dim=1024,
            num_encoder_layers=6,
            num_decoder_layers=6,
            name="specjax_small_target_ende",
        ),
        "small-draft": T5Config(
            vocab_size=8000,
            d_model=128,
            num_heads=4,
            head_dim=32,
            mlp_dim=512,
            num_encoder_layers=6,
            num_decoder_layers=4,
            name="specjax_small_draft_ende",
        ),
    }
    # The small pair's shipped distilled draft: the same with 2 decoder
    # layers (1.61M per-token multiply-adds, 1/14.2 of the target), its first and last layers kept
    # (benchmarks/training.py select-layers) and distilled again; a draft step on a CPU is mostly per-op overhead,
    # so the decoder's depth is what it costs (docs/training.md).
    sizes["small-draft-shallow"] = sizes["small-draft"].replace(num_decoder_layers=2)
    return sizes


def load_model_config(path: str | Path):
    """The ``T5Config`` of ``specjax train --model-config``.

    Args:
      path: a JSON file holding either T5Config fields (``{"d_model": 512, "num_heads": 8, ...}``; missing
        fields take ``T5Config``'s defaults), a run directory's ``config.json`` (its ``"model"`` entry), or a
        Hugging Face T5 ``config.json`` (recognised by ``model_type`` or ``d_ff``).
    Returns:
      ``specjax.config.T5Config``.
    Raises:
      FileNotFoundError: no such file. ValueError: not a JSON object, or fields ``T5Config`` does not have
      (the message lists them and the known ones).
    """
    import dataclasses

    from specjax.config import T5Config

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--model-config {path} does not exist.")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--model-config {path} is not valid JSON: {e}.") from None
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = data["model"]  # a run directory's config.json
    if not isinstance(data, dict):
        raise ValueError(f"--model-config {path} must hold a JSON object of T5Config fields.")
    if "model_type" in data or "d_ff" in data:
        return T5Config.from_hf_config(data)
    known = {f.name for f in dataclasses.fields(T5Config)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"--model-config {path} has fields T5Config does not know: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known))})."
        )
    return T5Config(**data)


def run(args: argparse.Namespace) -> int:
    """Runs ``specjax train``; returns 0 on success.

    A run directory this command created is removed again when the run fails before its first checkpoint
    (bad data, bad flags), so a corrected re-run does not meet a half-written directory.
    """
    import shutil

    run_dir = Path(args.run_dir)
    created = not run_dir.exists()
    try:
        return _run(args)
    except Exception:
        if created and run_dir.is_dir() and not (run_dir / "state.msgpack").exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _run(args: argparse.Namespace) -> int:
    import dataclasses

    import numpy as np

    from specjax import train as tr
    from specjax.config import T5Config
    from specjax.tokenizer import Tokenizer

    sizes = _model_sizes()
    if args.model_config:  # read before anything is written: a bad file fails at once
        config = load_model_config(args.model_config)
    else:
        config = sizes[args.model] if args.model in sizes else T5Config.preset(args.model)
    # the run's settings first: a bad flag fails before any file is read or written
    tc = tr.TrainConfig(
        objective=args.objective,
        num_steps=args.steps,
        tokens_per_batch=args.tokens_per_batch,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        seed=args.seed,
        dropout_rate=args.dropout,
        label_smoothing=args.label_smoothing,
        snapshot_every=args.snapshot_every,
        save_every=args.save_every,
        compute_dtype=args.compute_dtype,
        embedding_lr_multiplier=args.embedding_lr_multiplier,
        cache_teacher=args.cache_teacher,
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
        dropout_style=args.dropout_style,
    )
    for flag, path in (("--source", args.source), ("--target-text", args.target_text)):
        if not Path(path).is_file():  # before the vocabulary is trained on them (SentencePiece's own error is a
            raise FileNotFoundError(  # RuntimeError from deep inside it)
                f"{flag} {path} does not exist. The defaults are Multi30k's training files in {DATA}, relative "
                "to the current directory: run from the repository root, or pass --source and --target-text."
            )
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    vocab = Path(args.vocab) if args.vocab else run_dir / "spiece.model"
    if not vocab.exists():
        if args.vocab:
            raise FileNotFoundError(f"--vocab {vocab} does not exist.")
        tr.train_sentencepiece([args.source, args.target_text], run_dir / "spiece", args.vocab_size)
    tokenizer = Tokenizer(str(vocab), extra_ids=0)
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)

    sources, references = tr.read_parallel(args.source, args.target_text)
    if args.max_examples:
        sources, references = sources[: args.max_examples], references[: args.max_examples]
    src, tgt = tr.tokenize_pairs(tokenizer, sources, references)
    train_on = args.train_on or ("teacher" if args.objective == "distill" else "references")
    for flag, value in (("--teacher-samples", args.teacher_samples), ("--student-samples", args.student_samples)):
        if value < 0:
            raise ValueError(f"{flag} must be an int >= 0, got {value}.")
        if value and train_on != "teacher":
            raise ValueError(
                f"{flag} {value} adds to the teacher's outputs as training targets: use it with "
                "--objective distill --teacher CHECKPOINT (or --train-on teacher)."
            )
    if args.student_samples and not args.init_from:
        raise ValueError(
            f"--student-samples {args.student_samples} draws from the draft that training starts from: "
            "pass --init-from CHECKPOINT."
        )
    init = None
    if args.init_from:
        from specjax.checkpoints import load_checkpoint

        init = load_checkpoint(args.init_from, dtype=config.param_dtype)
    teacher = None
    if args.objective == "distill" or train_on == "teacher":
        if not args.teacher:
            raise ValueError(
                "--objective distill and --train-on teacher need --teacher CHECKPOINT (the trained target)."
            )
        from specjax.checkpoints import load_checkpoint

        teacher = load_checkpoint(args.teacher, dtype="float32")
        if teacher.config.vocab_size != config.vocab_size:
            raise ValueError(
                f"--teacher has a {teacher.config.vocab_size}-token vocabulary but --vocab has "
                f"{config.vocab_size}; pass the teacher's own spiece.model as --vocab."
            )
    if train_on == "teacher":
        cache = run_dir / "teacher_outputs.npz"
        # The greedy outputs, then each round of the teacher's samples, then the student's, source by source.
        copies = 1 + args.teacher_samples + args.student_samples
        if cache.exists():  # resumable: the teacher's outputs are computed once per run directory
            saved = np.load(cache)
            tgt = [np.asarray(t, np.int32) for t in np.split(saved["flat"], saved["ends"][:-1])]
            if len(tgt) != copies * len(src):
                raise ValueError(
                    f"{cache} holds {len(tgt)} teacher outputs, not {copies} x {len(src)} sources: "
                    "it was made with other --teacher-samples / --student-samples or other data; "
                    "resume with the run's own flags, or start a new --run-dir."
                )
        else:
            tgt = tr.teacher_outputs(teacher, src)
            for k in range(1, 1 + args.teacher_samples):
                tgt += tr.teacher_outputs(teacher, src, temperature=1.0, seed=k)
            student = init.astype("float32") if args.student_samples else None
            for k in range(1, 1 + args.student_samples):
                tgt += tr.teacher_outputs(student, src, temperature=1.0, seed=STUDENT_SEED + k)
            ends = np.cumsum([len(t) for t in tgt])
            np.savez(cache, flat=np.concatenate(tgt), ends=ends)
        src = list(src) * copies
    import signal
    import threading

    stop = threading.Event()

    def _interrupt(signum, frame):
        """SIGTERM (a session or job manager ending the run) or SIGINT (Ctrl-C): the loop saves the resume
        point after the step in flight and stops; a second signal stops at once (the last save is kept)."""
        if stop.is_set():
            raise KeyboardInterrupt(f"signal {signum}")
        stop.set()

    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        model = tr.train(
            config, tc, src, tgt, run_dir, teacher=teacher, init=init, start_step=args.start_step, stop=stop
        )
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(json.dumps({"run_dir": str(run_dir), "params": model.num_params, "steps": tc.num_steps}))
    if args.export:
        from specjax.checkpoints import save_checkpoint

        save_checkpoint(model.astype(args.export_dtype), args.export, format="hf")
        import shutil

        shutil.copy(vocab, Path(args.export) / "spiece.model")
        print(f"exported {args.export}")
    return 0
