"""``specjax translate "..."``: translate sentences given on the command line with speculative sampling."""

from __future__ import annotations

import argparse
import sys

from specjax.cli import add_decoding_args, add_size_arg, resolve_decoding_defaults


def add_parser(sub) -> None:
    """Registers ``specjax translate``."""
    p = sub.add_parser(
        "translate",
        help="translate English sentences given as arguments",
        description="Translates each argument English->German with the embedded default "
        "pair (or --target/--draft checkpoints) by speculative sampling.",
    )
    p.add_argument("text", nargs="+", help="English sentences")
    p.add_argument("--target", help="target checkpoint (default: the embedded pair)")
    p.add_argument(
        "--draft",
        help="draft checkpoint, or 'prompt-lookup' (n-gram proposals, no draft model; "
        "default: the embedded pair's distilled draft)",
    )
    p.add_argument(
        "--tokenizer",
        help="SentencePiece model, or 'byt5', for --target/--draft checkpoints (default: the target "
        "checkpoint's own spiece.model or ByT5 bytes; stderr says which)",
    )
    p.add_argument("--prefix", default="", help='task prefix, e.g. "translate English to German: "')
    p.add_argument(
        "--to",
        metavar="LANG",
        help="target language for a MADLAD-400 model: prepends its <2LANG> token to each input (e.g. --to de)",
    )
    add_decoding_args(p, task="translation")
    add_size_arg(p)
    p.add_argument("--max-input-length", type=int, default=512, help="input tokens at most (default 512)")
    p.add_argument(
        "--truncate",
        action="store_true",
        help="cut longer inputs to --max-input-length tokens (ending in EOS) instead of refusing them",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Prints one translation per input on stdout, then the paper's α and tokens per target call on stderr."""
    resolve_decoding_defaults(args, "translation")
    import jax

    from specjax.decoding import inputs, speculative_sample

    empty = [i for i, t in enumerate(args.text) if not t.strip()]
    if empty:
        raise ValueError(f"argument {empty[0] + 1} is empty; give the English sentences to translate.")
    if args.tokenizer and not args.target:
        raise ValueError("--tokenizer applies to --target/--draft checkpoints; the embedded pair uses its own.")
    lookup = args.draft == "prompt-lookup"
    if bool(args.target) != bool(args.draft) and not lookup:
        raise ValueError(
            "Give both --target and --draft, or neither (to use the embedded default pair); "
            "--draft prompt-lookup needs no draft model."
        )
    if args.target:
        from specjax.checkpoints import load_checkpoint
        from specjax.cli.generate import DEFAULT_TOKENIZER
        from specjax.tokenizer import resolve_tokenizer

        target = load_checkpoint(args.target)  # first: a missing checkpoint is the one line to read
        draft = None if lookup else load_checkpoint(args.draft)
        tokenizer, origin = resolve_tokenizer(args.target, args.tokenizer, DEFAULT_TOKENIZER)
        print(f"tokenizer: {origin}", file=sys.stderr)
    else:
        from specjax.defaults import load_default_pair

        target, draft, tokenizer = load_default_pair(size=args.size)
    prefix = args.prefix
    if args.to:
        from specjax.tokenizer import madlad_language_prefix

        prefix = madlad_language_prefix(tokenizer, args.to) + prefix  # MADLAD-400: "<2de> " before the text
    rows = [tokenizer.encode(prefix + t) for t in args.text]
    (x,) = inputs.batches(rows, batch_size=len(rows))
    from specjax.cli import draft_source, speculative_kwargs

    spec_kwargs = speculative_kwargs(args)
    sampling = dict(rng=jax.random.PRNGKey(args.seed), temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.gamma == "auto" or args.gamma == 0:  # specjax.Decoder: the target alone, or γ from measured costs
        from specjax.cli import make_decoder

        decoder = make_decoder(
            args, target, draft_source(args, draft), max_input_length=args.max_input_length, truncate=args.truncate
        )
        r = decoder(x, **sampling)
        if args.verbose:
            print(decoder.last_choice.describe(), file=sys.stderr)
    else:
        r = speculative_sample(
            target,
            draft_source(args, draft),
            x,
            gamma=args.gamma,
            **spec_kwargs,
            max_decode_length=args.max_decode_length,
            **sampling,
            max_input_length=args.max_input_length,
            truncate=args.truncate,
        )
    r = jax.device_get(r)
    for seq, n in zip(r.sequences, r.lengths):
        print(tokenizer.decode(seq[:n]))
    print(
        f"# acceptance rate alpha {r.acceptance_rate:.3f} (the paper's, per token), accepted/drafted "
        f"{r.accepted_fraction:.3f}, tokens per target call {r.tokens_per_target_call:.2f}",
        file=sys.stderr,
    )
    return 0
