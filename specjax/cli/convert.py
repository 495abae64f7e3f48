"""``specjax convert SRC DST --to hf|t5x``: rewrite a T5 checkpoint in another format.

Reads anything ``specjax.load_checkpoint`` reads (Hugging Face, T5X legacy msgpack/zarr, T5X Orbax) and
writes Hugging Face (``config.json`` + ``model.safetensors``) or T5X legacy (``DST/checkpoint`` msgpack).
"""

from __future__ import annotations


def add_parser(subparsers) -> None:
    """Registers ``convert`` and its arguments."""
    p = subparsers.add_parser(
        "convert",
        help="convert a T5 checkpoint between Hugging Face and T5X formats",
        description="Convert a T5 checkpoint (Hugging Face directory, T5X legacy or Orbax checkpoint_N) to "
        "Hugging Face safetensors or a T5X legacy msgpack checkpoint. Parameters are copied bit "
        "for bit unless --dtype is given.",
    )
    p.add_argument("src", metavar="SRC", help="checkpoint to read (directory or T5X msgpack file)")
    p.add_argument("dst", metavar="DST", help="output directory (created)")
    p.add_argument("--to", required=True, choices=("hf", "t5x"), help="output format")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="cast parameters (default: keep the stored dtype)",
    )
    p.add_argument("--step", type=int, default=0, help="train step recorded in a T5X output (default 0)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Loads ``args.src``, writes ``args.dst`` in ``args.to`` format; prints a one-line summary."""
    import os

    from specjax.checkpoints import load_checkpoint, save_checkpoint

    if os.path.abspath(args.src) == os.path.abspath(args.dst):
        raise ValueError("SRC and DST are the same path; write the converted checkpoint elsewhere.")
    model = load_checkpoint(args.src, dtype=args.dtype)
    out = save_checkpoint(model, args.dst, format=args.to, step=args.step)
    cfg = model.config
    print(
        f"wrote {args.to} checkpoint to {out}: {cfg.family}, d_model={cfg.d_model}, "
        f"layers={cfg.num_encoder_layers}/{cfg.num_decoder_layers}, vocab={cfg.vocab_size}, "
        f"{model.num_params:,} parameters, {cfg.param_dtype}"
    )
    return 0
