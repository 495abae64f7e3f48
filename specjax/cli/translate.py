"""``specjax translate "..."``: translate sentences given on the command line with speculative sampling."""

from __future__ import annotations

import argparse
import sys

from specjax.cli import SHIPPED_PAIR_DOMAIN, add_decoding_args, add_size_arg, resolve_decoding_defaults


def add_parser(sub) -> None:
    """Registers ``specjax translate``."""
    p = sub.add_parser(
        "translate",
        help="translate English sentences given as arguments",
        description="Translates each argument English->German with the embedded default "
        "pair (or --target/--draft checkpoints) by speculative sampling. " + SHIPPED_PAIR_DOMAIN,
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
    from specjax.bulk import BulkDecoder
    from specjax.cli import draft_source, speculative_kwargs

    bulk = BulkDecoder(  # every sentence in one slot batch; sentence i samples with fold_in(PRNGKey(seed), i)
        target,
        draft_source(args, draft),
        batch_size=len(rows),
        gamma=args.gamma,
        max_decode_length=args.max_decode_length,
        max_input_length=args.max_input_length,
        truncate=args.truncate,
        eos_id=tokenizer.eos_id,
        **speculative_kwargs(args),
    )
    sampling = dict(rng=args.seed, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    for r in bulk.generate(rows, **sampling):
        print(tokenizer.decode(r.tokens), flush=True)
    s = bulk.stats
    if args.verbose:
        for reason in s.reasons:
            print(reason, file=sys.stderr)
    fraction = s.accepted / s.drafted if s.drafted else float("nan")
    per_call = s.tokens / s.target_calls if s.target_calls else float("nan")
    print(
        f"# acceptance rate alpha {s.alpha:.3f} (the paper's, per token), accepted/drafted "
        f"{fraction:.3f}, tokens per target call {per_call:.2f}",
        file=sys.stderr,
    )
    return 0
