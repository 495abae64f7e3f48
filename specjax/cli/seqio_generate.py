"""``specjax generate --seqio-task NAME``: decode a seqio Task's split, write one prediction per line, print
the Task's metrics, α and tokens per target call.

Example (a TPU VM with t5x's Tasks; needs ``pip install 'specjax[seqio]'``)::

    specjax generate --seqio-task wmt_t2t_ende_v003 --seqio-module t5.data.tasks --split validation \\
        --target t5_1_1_xxl/checkpoint_1000000 --draft t5_1_1_small/checkpoint_1000000 \\
        --tokenizer sentencepiece.model --output ende.txt --gamma 7 --temperature 0 --compare-baseline

The Task's own preprocessors make the inputs (its prefix included: ``--prefix`` does not apply) and its
vocabulary tokenizes them; ``--tokenizer`` (or the default pair's vocabulary) is only checked against it.
Output line ``i`` is example ``i`` of the split (sampled with ``fold_in(PRNGKey(seed), i)``, as line ``i`` of
a plain ``generate``). Running the same command again resumes after the lines already in ``--output``: those
are re-encoded with the Task's vocabulary for the metrics.
"""

from __future__ import annotations

import argparse
import os
import sys


def _validate(args) -> None:
    from specjax.sampling import validate_sampling

    if args.input:
        raise ValueError("--input and --seqio-task are alternatives: the Task's --split is the input.")
    if args.prefix:
        raise ValueError(
            "--prefix does not apply to --seqio-task: the Task's preprocessors make its inputs "
            "(T5's Tasks add 'translate English to German: ' themselves)."
        )
    from specjax.cli import resolve_decoding_defaults

    resolve_decoding_defaults(args, "text", fixed=True)  # one compiled γ per Task run (seqio_interop.seqio_decode)
    validate_sampling(args.temperature, args.top_k, args.top_p)
    if not isinstance(args.gamma, int):
        raise ValueError(f"--gamma {args.gamma} is not available with --seqio-task; give an int gamma >= 1.")
    for name in ("gamma", "batch_size", "max_decode_length", "max_input_length"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.num_examples is not None and args.num_examples < 1:
        raise ValueError(f"--num-examples must be >= 1, got {args.num_examples}.")
    if bool(args.target) != bool(args.draft):
        raise ValueError("Give both --target and --draft checkpoints, or neither (to use the embedded default pair).")


def _quiet_tensorflow() -> None:
    """TensorFlow's C++ and absl INFO/WARNING lines off (set before TensorFlow is imported)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass


def _load(args):
    """(target, draft, the models' Tokenizer or None when unknown)."""
    from specjax.checkpoints import load_checkpoint
    from specjax.defaults import load_default_pair
    from specjax.tokenizer import Tokenizer

    if args.target:
        tokenizer = Tokenizer(args.tokenizer) if args.tokenizer else None
        return load_checkpoint(args.target, dtype=args.dtype), load_checkpoint(args.draft, dtype=args.dtype), tokenizer
    target, draft, tokenizer = load_default_pair(
        **({"dtype": args.dtype} if args.dtype else {}), size=getattr(args, "size", None)
    )
    if args.tokenizer:
        tokenizer = Tokenizer(args.tokenizer)
    return target, draft, tokenizer


def run(args: argparse.Namespace) -> int:
    """Decodes the Task's split (what is not yet in --output); returns 0. Raises ValueError on bad input."""
    _validate(args)
    _quiet_tensorflow()
    from specjax import seqio_interop
    from specjax.cli._common import OutputLines, check_output_path, lines_done

    check_output_path(args.output)

    try:
        seqio_interop.import_seqio()
    except ModuleNotFoundError as e:
        raise ValueError(str(e)) from e
    for module in args.seqio_module:
        seqio_interop.import_task_module(module)
    task = seqio_interop.get_task(args.seqio_task)
    seqio_interop.check_split(task, args.split)
    task_tok = seqio_interop.task_tokenizer(task)

    from specjax import parallel

    parallel.maybe_initialize_distributed()
    runner = parallel.decode_fn_from_flags(args.data_parallel, args.mesh)
    with runner.loading():
        target, draft, models_tok = _load(args)
    seqio_interop.check_vocabulary(task, task_tok, target, draft, models_tok)  # before placing on devices
    target, draft = runner.place(target, draft)

    done = lines_done(args.output)
    previous = []
    if done:
        with open(args.output, encoding="utf-8") as f:
            previous = [task_tok.encode(line) for line in f.read().splitlines()[:done]]
    report = sys.stderr  # statistics and progress; the outputs go to --output (stdout for -)
    out = OutputLines(args.output)  # created with its first line

    def write(batch_tokens):
        out.write(task_tok.decode(t, out_of_range="unk").replace("\n", " ").replace("\r", " ") for t in batch_tokens)

    try:
        result = seqio_interop.seqio_decode(
            task,
            args.split,
            target,
            draft,
            tokenizer=models_tok,
            batch_size=args.batch_size,
            max_decode_length=args.max_decode_length,
            gamma=args.gamma,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            max_input_length=args.max_input_length,
            truncate=args.truncate,
            num_examples=args.num_examples,
            compare_baseline=args.compare_baseline,
            runner=runner,
            skip=done,
            previous_tokens=previous,
            on_batch=write,
            progress=True,
        )
    finally:
        out.close()
    n_new = len(result.predictions) - done
    if n_new == 0:
        print(f"{args.output}: all {done} examples already written; metrics over them:", file=report)
    print(
        f"task {result.task}, split {result.split}, examples {len(result.predictions)} ({n_new} decoded now), "
        f"gamma {args.gamma}, temperature {args.temperature}",
        file=report,
    )
    for k, v in result.metrics.items():
        print(f"{k} {v:.3f}" if isinstance(v, (int, float)) else f"{k} {v}", file=report)
    if n_new:
        print(
            f"acceptance rate (alpha) {result.acceptance_rate:.3f}, tokens per target call "
            f"{result.tokens_per_target_call:.2f}",
            file=report,
        )
    if result.speedup is not None:
        print(
            f"speedup {result.speedup:.2f}x over the target alone (wall time, same inputs, compilation excluded)",
            file=report,
        )
    return 0
