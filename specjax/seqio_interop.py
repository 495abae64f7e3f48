"""seqio interop: decode a seqio Task's split with speculative sampling and score it with the Task's metrics.

Needs the optional extra (``pip install 'specjax[seqio]'``, which brings TensorFlow); seqio is imported only
inside these functions, so ``import specjax`` stays free of TensorFlow.

What is seqio's and what is ours:
  - data: the Task's own ``get_dataset`` (its source, its preprocessors, its ``inputs`` feature tokenized
    with its vocabulary), read in order (``shuffle=False``), through ``seqio.Evaluator`` with the
    ``EncDecFeatureConverter`` (no packing) exactly as t5x's eval does;
  - decoding: ``speculative_sample`` (or ``temperature_sample`` without a draft), in fixed-size batches of
    power-of-2 input lengths (``specjax.decoding.inputs``), example ``i`` sampling with
    ``fold_in(PRNGKey(seed), i)`` -- the same keys as line ``i`` of ``specjax generate``;
  - metrics: ``seqio.Evaluator.evaluate`` with our tokens as its ``predict_fn``'s output, so predictions are
    ``vocabulary.decode``-d and ``postprocess_fn``-ed and the Task's ``metric_fns`` / ``metric_objs`` run as
    in t5x. Score metrics (log-likelihood of the targets) need a ``score_fn`` specjax does not have: a Task
    with them is refused.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import os
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from specjax.bulk import BulkDecoder
from specjax.decoding import speculative_sample, temperature_sample
from specjax.decoding.inputs import bucket_length, pad_batch
from specjax.tokenizer import Tokenizer, as_tokenizer

__all__ = [
    "SeqioDecodeResult",
    "seqio_decode",
    "import_seqio",
    "import_task_module",
    "get_task",
    "task_tokenizer",
    "check_vocabulary",
]

INSTALL_HINT = "pip install 'specjax[seqio]' (it brings TensorFlow)"


def import_seqio():
    """``import seqio``; ModuleNotFoundError naming the extra to install when it is absent."""
    try:
        import seqio
        import tensorflow as tf
    except ImportError as e:
        raise ModuleNotFoundError(f"seqio is not installed ({e}); {INSTALL_HINT}.") from e
    try:  # as t5x does: TensorFlow only reads data, JAX keeps the accelerators' memory
        tf.config.set_visible_devices([], "GPU")
    except (RuntimeError, ValueError):  # already initialised
        pass
    return seqio


def import_task_module(module: str) -> None:
    """Imports the module that registers the Tasks (t5x's ``MIXTURE_OR_TASK_MODULE``): a dotted module name
    on ``sys.path`` (``my_project.tasks``) or a ``.py`` file path.

    Raises:
      ValueError: the module is not found or raises while importing (one line: the module, the error and
        the way out).
    """
    try:
        if module.endswith(".py"):
            if not os.path.isfile(module):
                raise FileNotFoundError(f"no file {module!r}")
            name = "_specjax_seqio_tasks_" + os.path.splitext(os.path.basename(module))[0]
            spec = importlib.util.spec_from_file_location(name, module)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        else:
            importlib.import_module(module)
    except Exception as e:  # the user's module: anything it raises is the user's problem to see in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(
            f"--seqio-module {module!r} failed to import ({type(e).__name__}: {first}); pass the module that "
            "registers your Tasks, importable from here (check PYTHONPATH), or a .py file path."
        ) from e


def get_task(task) -> Any:
    """The ``seqio.Task`` named ``task`` (or ``task`` itself when it is a Task).

    Raises:
      ValueError: no Task or Mixture of that name (the message lists close registered names and says to pass
        the module that registers it), or a Mixture (decode its Tasks one by one; they are listed).
    """
    seqio = import_seqio()
    if isinstance(task, seqio.Task):
        return task
    if isinstance(task, seqio.Mixture):
        task = task.name
    if not isinstance(task, str):
        raise ValueError(f"task must be a seqio.Task or a registered Task name, got {type(task).__name__}.")
    if task in seqio.MixtureRegistry.names():
        subtasks = [t.name for t in seqio.get_subtasks(seqio.get_mixture_or_task(task))]
        raise ValueError(
            f"{task!r} is a seqio Mixture; decode each of its Tasks (each has its own metrics): {', '.join(subtasks)}."
        )
    names = sorted(seqio.TaskRegistry.names())
    if task not in names:
        close = difflib.get_close_matches(task, names, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"No seqio Task named {task!r} is registered ({len(names)} are).{hint} Pass "
            "--seqio-module MODULE (Python: import it first) with the module that registers it."
        )
    return seqio.get_mixture_or_task(task)


def task_tokenizer(task):
    """The ``Tokenizer`` of the Task's ``inputs`` vocabulary (``Tokenizer.from_seqio``).

    Raises:
      ValueError: the Task has no ``inputs`` feature (a decoder-only Task: specjax decodes encoder-decoder
        T5), its ``inputs`` and ``targets`` vocabularies differ, or they are not SentencePiece.
    """
    features = task.output_features
    if "inputs" not in features or "targets" not in features:
        raise ValueError(
            f"Task {task.name!r} has features {sorted(features)}; specjax decodes encoder-decoder "
            "Tasks with 'inputs' and 'targets' (T5's)."
        )
    tok = Tokenizer.from_seqio(features["inputs"].vocabulary)
    if features["targets"].vocabulary != features["inputs"].vocabulary:
        if not tok.same_vocabulary(Tokenizer.from_seqio(features["targets"].vocabulary)):
            raise ValueError(
                f"Task {task.name!r} has different 'inputs' and 'targets' vocabularies; a T5 model "
                "pair shares one vocabulary."
            )
    return tok


def check_vocabulary(task, task_tok, target, draft=None, tokenizer=None) -> None:
    """Refuses a Task whose vocabulary is not the models'.

    The models carry only their embedding size: the Task's vocabulary must fit in it (a 32128-row T5 model
    and T5's 32100-id vocabulary do). When the models' own vocabulary is known (``tokenizer``: the default
    pair's, or the ``--tokenizer`` given with the checkpoints), every piece must also match.

    Raises:
      ValueError: one line naming both vocabularies and the way out.
    """
    way_out = (
        "decode the Task with the models trained on its vocabulary, or register the Task with the "
        "models' vocabulary (seqio.SentencePieceVocabulary(<their spiece.model>))"
    )
    for name, model in (("target", target), ("draft", draft)):
        if model is None:
            continue
        rows = model.config.vocab_size
        if task_tok.vocab_size > rows:
            raise ValueError(
                f"Task {task.name!r}'s vocabulary ({task_tok.path}, {task_tok.vocab_size} ids) is not "
                f"the models': the {name} has {rows} embedding rows; {way_out}."
            )
    if tokenizer is not None and not task_tok.same_vocabulary(tokenizer):
        raise ValueError(
            f"Task {task.name!r}'s vocabulary ({task_tok.path}, {task_tok.vocab_size} ids) differs "
            f"from the models' ({tokenizer.path}, {tokenizer.vocab_size} ids); {way_out}."
        )


def check_split(task, split: str) -> None:
    """Raises ValueError (listing the Task's splits) when ``split`` is not one of them."""
    splits = list(task.splits)
    if split not in splits:
        raise ValueError(
            f"Task {task.name!r} has no split {split!r}; its splits are {', '.join(map(repr, splits))}"
            " (pass one with --split)."
        )


@dataclasses.dataclass
class SeqioDecodeResult:
    """What ``seqio_decode`` returns.

    Attributes:
      task, split: what was decoded.
      predictions: one decoded text per example, in the split's order (``vocabulary.decode`` of the tokens,
        before the Task's ``postprocess_fn``).
      tokens: the output token ids per example (EOS included when emitted).
      metrics: the Task's metrics as seqio's Evaluator computes them ({} for a Task without metrics).
      acceptance_rate: the paper's α over every example (Σβ / verified positions, Leviathan et al. 2023
        §3.1); NaN for the baseline.
      tokens_per_target_call: output tokens per target call (1.0 for the baseline).
      speedup: baseline wall time / speculative wall time on the same batches (compilation excluded), or
        None without ``compare_baseline``.
      seconds: decode wall time (speculative, or the baseline without a draft), compilation excluded.
      baseline_seconds: the baseline's wall time with ``compare_baseline``, else None.
    """

    task: str
    split: str
    predictions: list
    tokens: list
    metrics: dict
    acceptance_rate: float
    tokens_per_target_call: float
    speedup: float | None
    seconds: float
    baseline_seconds: float | None = None

    def summary(self) -> str:
        """One line per metric, then α, tokens per target call and the speedup."""
        lines = [f"{self.task} ({self.split}, {len(self.predictions)} examples)"]
        lines += [f"  {k}: {v:.3f}" if isinstance(v, (int, float)) else f"  {k}: {v}" for k, v in self.metrics.items()]
        lines.append(
            f"  acceptance rate (alpha) {self.acceptance_rate:.3f}, tokens per target call "
            f"{self.tokens_per_target_call:.2f}"
        )
        if self.speedup is not None:
            lines.append(f"  speedup {self.speedup:.2f}x over the target alone (wall time, same inputs)")
        return "\n".join(lines)


class _Stats:
    def __init__(self):
        self.lengths = self.calls = self.verified = 0
        self.beta = 0.0
        self.seconds = self.base_seconds = 0.0


def decode_rows(
    rows: Sequence[Sequence[int]],
    indices: Sequence[int],
    target,
    draft,
    *,
    batch_size: int,
    seed: int,
    gamma: int,
    max_decode_length: int,
    eos_id: int,
    max_input_length: int,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    compare_baseline: bool = False,
    runner: Callable | None = None,
    on_batch: Callable | None = None,
    progress: bool = False,
):
    """Decodes token-id rows; row ``j`` samples with ``fold_in(PRNGKey(seed), indices[j])`` (as ``specjax generate``
    does for line ``indices[j]``). On one device (no ``runner``) with consecutive indices, through the bulk decoder
    (``specjax.bulk``: ``batch_size`` slots refilled as rows end); else in static batches:

    Batches: ``batch_size`` rows, inputs right-padded to a power-of-2 length (``bucket_length``), filler rows
    copying the batch's first row (with its key), dropped here (``specjax.decoding.inputs.pad_batch``). The
    first call of each (sampler, shape) compiles and is not timed.

    Args:
      rows: encoder inputs, token ids ending in EOS, each at most ``max_input_length`` long.
      on_batch: called with each batch's output token lists (EOS included) in order, e.g. to write them.
    Returns:
      (list of output token lists, ``_Stats``).
    """
    import jax

    consecutive = list(indices) == list(range(indices[0], indices[0] + len(indices))) if len(indices) else False
    if runner is None and consecutive:
        return _decode_rows_bulk(
            rows,
            indices[0],
            target,
            draft,
            batch_size=batch_size,
            seed=seed,
            gamma=gamma,
            max_decode_length=max_decode_length,
            eos_id=eos_id,
            max_input_length=max_input_length,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            compare_baseline=compare_baseline,
            on_batch=on_batch,
            progress=progress,
        )
    run = runner or (lambda fn, *a, **kw: fn(*a, **kw))
    seed_key = jax.random.PRNGKey(seed)
    common = dict(
        max_decode_length=max_decode_length,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
        max_input_length=max_input_length,
    )
    stats, out, warm = _Stats(), [], set()

    def timed(kind, fn, x, keys):
        if (kind, x.shape) not in warm:  # compile first, untimed
            jax.block_until_ready(fn(x, keys))
            warm.add((kind, x.shape))
        start = time.perf_counter()
        result = jax.block_until_ready(fn(x, keys))
        return result, time.perf_counter() - start

    def spec(x, keys):
        return run(speculative_sample, target, draft, x, rng=keys, gamma=gamma, **common)

    def base(x, keys):
        return run(temperature_sample, target, x, rng=keys, **common)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(rows), unit="example", file=sys.stderr, desc="seqio decode")
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            x = pad_batch(chunk, batch_size, bucket_length(max(len(r) for r in chunk), max_input_length))
            ids = np.asarray(indices[start : start + batch_size], np.int64)
            ids = np.concatenate([ids, np.full(batch_size - len(chunk), ids[0])])
            keys = jax.vmap(lambda i: jax.random.fold_in(seed_key, i))(ids)
            if draft is not None:
                r, seconds = timed("spec", spec, x, keys)
            else:
                r, seconds = timed("base", base, x, keys)
            stats.seconds += seconds
            if draft is not None and compare_baseline:
                _, seconds = timed("base", base, x, keys)
                stats.base_seconds += seconds
            n = len(chunk)
            lengths = np.asarray(r.lengths)[:n]
            sequences = np.asarray(r.sequences)[:n]
            stats.lengths += int(lengths.sum())
            stats.calls += int(np.asarray(r.num_target_calls)[:n].sum())
            stats.verified += int(np.asarray(r.num_verified)[:n].sum())
            stats.beta += float(np.asarray(r.beta_sum, np.float64)[:n].sum())
            batch_tokens = [seq[:k].tolist() for seq, k in zip(sequences, lengths)]
            out.extend(batch_tokens)
            if on_batch is not None:
                on_batch(batch_tokens)
            if bar is not None:
                bar.update(n)
    finally:
        if bar is not None:
            bar.close()
    return out, stats


def _decode_rows_bulk(
    rows,
    first: int,
    target,
    draft,
    *,
    batch_size,
    seed,
    gamma,
    max_decode_length,
    eos_id,
    max_input_length,
    temperature,
    top_k,
    top_p,
    compare_baseline,
    on_batch,
    progress,
):
    """``decode_rows`` on one device through the bulk decoder (``specjax.bulk.BulkDecoder``: slots refilled as rows
    end, inputs sorted by length in a read-ahead window); row ``j`` is example ``first + j`` and samples with
    ``fold_in(PRNGKey(seed), first + j)``, the same tokens as the static batches. ``on_batch`` gets each line as it
    is emitted (in order); the seconds are wall time with compiles."""
    settings = dict(
        batch_size=max(1, min(batch_size, len(rows))),
        max_decode_length=max_decode_length,
        eos_id=eos_id,
        max_input_length=max_input_length,
    )
    sampling = dict(rng=seed, temperature=temperature, top_k=top_k, top_p=top_p, start_index=first)
    bulk = BulkDecoder(target, draft, gamma=gamma if draft is not None else 0, **settings)
    stats, out = _Stats(), []
    progress_bar = dict(total=len(rows), desc="seqio decode", unit="example") if progress else False
    for r in bulk.generate(rows, progress=progress_bar, **sampling):
        tokens = r.tokens.tolist()
        out.append(tokens)
        stats.lengths += len(tokens)
        stats.calls += r.num_target_calls
        stats.verified += r.num_verified
        stats.beta += r.beta_sum
        if on_batch is not None:
            on_batch([tokens])
    stats.seconds = bulk.stats.seconds
    if draft is not None and compare_baseline:
        base = BulkDecoder(target, None, gamma=0, **settings)
        for _ in base.generate(rows, **sampling):
            pass
        stats.base_seconds = base.stats.seconds
    return out, stats


def _prepare(row: Sequence[int], index: int, eos_id: int, max_input_length: int, truncate: bool) -> list[int]:
    """One encoder input as ``specjax generate`` prepares a line: at most ``max_input_length`` tokens, cut
    to its first ``max_input_length - 1`` and EOS with ``truncate``."""
    row = [int(t) for t in row]
    if len(row) > max_input_length:
        if not truncate:
            raise ValueError(
                f"Example {index} has {len(row)} input tokens, more than max_input_length "
                f"{max_input_length}; pass truncate=True (CLI: --truncate) to cut it."
            )
        row = row[: max_input_length - 1] + [eos_id]
    return row


def _strip_pad(x: np.ndarray, pad_id: int) -> list[int]:
    real = np.nonzero(x != pad_id)[0]
    return x[: real[-1] + 1].tolist() if len(real) else []


def seqio_decode(
    task,
    split: str,
    target,
    draft=None,
    *,
    tokenizer=None,
    batch_size: int = 8,
    max_decode_length: int = 128,
    gamma: int = 4,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    seed: int = 0,
    max_input_length: int = 512,
    truncate: bool = False,
    num_examples: int | None = None,
    compare_baseline: bool = True,
    use_cached: bool = False,
    runner: Callable | None = None,
    skip: int = 0,
    previous_tokens: Sequence[Sequence[int]] = (),
    on_batch: Callable | None = None,
    progress: bool = False,
) -> SeqioDecodeResult:
    """Decodes a seqio Task's split with speculative sampling and computes the Task's metrics.

    Reads ``split`` of the Task through ``seqio.Evaluator`` (the Task's source and preprocessors; its
    ``inputs`` feature, tokenized with its vocabulary; order kept), decodes the ``inputs`` with
    ``speculative_sample(target, draft, ...)`` (``temperature_sample(target, ...)`` when ``draft`` is None),
    and hands the output tokens to the Evaluator, which decodes them with the vocabulary, applies the Task's
    ``postprocess_fn`` to predictions and targets and runs its ``metric_fns`` (Leviathan et al. 2023 report
    BLEU / ROUGE this way through t5x).

    Args:
      task: a ``seqio.Task`` or the name of a registered one (import the module that registers it first).
      split: the split to decode, e.g. "validation" or "test".
      target, draft: ``T5Model``s sharing the Task's vocabulary (``draft=None``: the target alone).
      tokenizer: the models' own vocabulary when known (a ``Tokenizer`` or ``seqio.SentencePieceVocabulary``)
        to check the Task's against, piece by piece; else only the size is checked.
      batch_size: rows per decode call; max_decode_length: output tokens per example at most (tokens).
      gamma, temperature, top_k, top_p, seed: as ``speculative_sample``; example ``i`` samples with
        ``fold_in(PRNGKey(seed), i)``.
      max_input_length, truncate: inputs longer than ``max_input_length`` tokens raise, or are cut (EOS kept).
      num_examples: decode only the first ``num_examples`` examples (seqio's Evaluator ``num_examples``).
      compare_baseline: also time the target alone on the same batches and report the speedup.
      use_cached: read the Task's offline cache (seqio ``use_cached``).
      runner: how to call the sampler (``specjax.parallel.decode_fn_from_flags``); default: directly.
      skip, previous_tokens: resume: the first ``skip`` examples are not decoded, their output tokens are
        ``previous_tokens`` (used for the metrics only).
      on_batch: called with each decoded batch's token lists, in order (the CLI writes them).
    Returns:
      ``SeqioDecodeResult``: predictions in the split's order, metrics, α, tokens per target call, speedup.
    Raises:
      ModuleNotFoundError: seqio not installed. ValueError: unknown Task, a Mixture, a split the Task does not
        have, a vocabulary that is not the models', a Task with score metrics, an input too long.
    Source: seqio ``evaluation.py`` (``Evaluator.evaluate``, ``predict_fn`` returning ``(index, tokens)``).
    """
    import_seqio()
    import seqio
    import tensorflow_datasets as tfds

    task = get_task(task)
    check_split(task, split)
    task_tok = task_tokenizer(task)
    check_vocabulary(task, task_tok, target, draft, None if tokenizer is None else as_tokenizer(tokenizer))
    if getattr(task, "score_metric_fns", None):
        raise ValueError(
            f"Task {task.name!r} has score metrics (log-likelihood of its targets), which need a "
            "scoring function specjax does not provide; register a Task without them to decode."
        )
    if num_examples is not None and num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}.")
    eos, pad = task_tok.eos_id, task_tok.pad_id

    evaluator = seqio.Evaluator(
        task.name,
        feature_converter=seqio.EncDecFeatureConverter(pack=False),
        eval_split=split,
        use_cached=use_cached,
        num_examples=num_examples,
        async_compute_metrics=False,
    )
    has_metrics = bool(evaluator.eval_tasks)
    if has_metrics:
        examples = [
            (int(i), _strip_pad(ex["encoder_input_tokens"], pad))
            for i, ex in tfds.as_numpy(evaluator.cached_model_datasets[task.name])
        ]
    else:  # no metrics: the Evaluator keeps nothing; read the same examples directly
        ds = task.get_dataset(sequence_length=None, split=split, shuffle=False, num_epochs=1, use_cached=use_cached)
        if num_examples is not None:
            ds = ds.take(num_examples)
        examples = [(i, ex["inputs"].tolist()) for i, ex in enumerate(tfds.as_numpy(ds))]
    examples.sort()
    if skip > len(examples):
        raise ValueError(
            f"{skip} predictions were already written, more than the {len(examples)} examples of "
            f"{task.name!r} {split!r}; is the output file from another Task or split?"
        )
    if len(previous_tokens) != skip:
        raise ValueError(f"previous_tokens has {len(previous_tokens)} rows for skip={skip}.")
    todo = examples[skip:]
    rows = [_prepare(r, i, eos, max_input_length, truncate) for i, r in todo]
    for i, r in todo:
        if not r:
            raise ValueError(f"Example {i} of {task.name!r} {split!r} has no input tokens; its 'inputs' is empty.")
    tokens, stats = (
        decode_rows(
            rows,
            [i for i, _ in todo],
            target,
            draft,
            batch_size=batch_size,
            seed=seed,
            gamma=gamma,
            max_decode_length=max_decode_length,
            eos_id=eos,
            max_input_length=max_input_length,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            compare_baseline=compare_baseline,
            runner=runner,
            on_batch=on_batch,
            progress=progress,
        )
        if rows
        else ([], _Stats())
    )
    all_tokens = [list(map(int, t)) for t in previous_tokens] + tokens

    metrics = {}
    if has_metrics:
        # Fixed-length rows padded with pad_id, as t5x's predict_batch returns them (the Evaluator turns them
        # into one array; vocabulary.decode stops at EOS and drops pads).
        width = max([len(t) for t in all_tokens] + [1])
        padded = np.full((len(all_tokens), width), pad, np.int32)
        for j, t in enumerate(all_tokens):
            padded[j, : len(t)] = t

        def predict_fn(ds):
            return [(i, padded[i]) for i, _ in tfds.as_numpy(ds)]

        future, _ = evaluator.evaluate(compute_metrics=True, predict_fn=predict_fn)
        metrics = {k: _plain(v) for k, v in future.result()[task.name].items()}
    evaluator.close()

    alpha = stats.beta / stats.verified if stats.verified else float("nan")
    per_call = stats.lengths / stats.calls if stats.calls else float("nan")
    speedup = None
    if draft is not None and compare_baseline and stats.seconds:
        speedup = stats.base_seconds / stats.seconds
    return SeqioDecodeResult(
        task=task.name,
        split=split,
        predictions=[task_tok.decode(t, out_of_range="unk") for t in all_tokens],
        tokens=all_tokens,
        metrics=metrics,
        acceptance_rate=alpha,
        tokens_per_target_call=per_call,
        speedup=speedup,
        seconds=stats.seconds,
        baseline_seconds=stats.base_seconds if (draft is not None and compare_baseline) else None,
    )


def _plain(v):
    """A seqio metric value as a plain Python number where it is one (seqio.metrics.Scalar -> float)."""
    value = getattr(v, "value", v)
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value
