"""The training loop: deterministic given the seed, resumable from ``state.msgpack`` in the run directory
(params, optimizer state and step, written atomically every ``save_every`` steps and at the end)."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from specjax.config import T5Config
from specjax.models import t5
from specjax.models.t5 import T5Model
from specjax.train.data import batches
from specjax.train.settings import TrainConfig
from specjax.train.step import _make_step, _optimizer
from specjax.train.teacher import _gather_log_probs, teacher_log_probs

# ----------------------------------------------------------------------------------------------------------
# The loop


REWARM_STEPS = 50  # steps over which updates ramp up after a resume from parameters alone


def _at_schedule_step(opt_state, step: int):
    """``opt_state`` with the learning-rate schedule's count set to ``step`` (Adam's own count untouched)."""
    if isinstance(opt_state, optax.ScaleByScheduleState):
        return opt_state._replace(count=jnp.asarray(step, jnp.int32))
    if isinstance(opt_state, tuple) and not hasattr(opt_state, "_fields"):
        return tuple(_at_schedule_step(s, step) for s in opt_state)
    return opt_state


def _saved_rewarm_start(run: Path, step: int) -> int | None:
    """The step a parameters-only resume started at, while its re-warmup is not over (run/rewarm.json)."""
    path = run / "rewarm.json"
    if not path.exists():
        return None
    start = int(json.loads(path.read_text())["rewarm_from"])
    return start if step < start + REWARM_STEPS else None


def _save_state(path: Path, params, opt_state, step: int):
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(serialization.to_bytes({"params": params, "opt_state": opt_state, "step": step}))
    os.replace(tmp, path)


def train(
    config: T5Config,
    tc: TrainConfig,
    src: Sequence[np.ndarray],
    tgt: Sequence[np.ndarray],
    run_dir: str | os.PathLike,
    *,
    teacher: T5Model | None = None,
    init: T5Model | None = None,
    start_step: int = 0,
    stop: threading.Event | None = None,
    progress: bool = True,
) -> T5Model:
    """Trains (or resumes training of) a T5 on tokenized pairs.

    Args:
      config: the model to train (``T5Config``; trained in its dtype, float32 recommended on CPU).
      tc: ``TrainConfig``.
      src, tgt: lists of int32 token arrays (EOS included), as from ``tokenize_pairs``.
      run_dir: directory for ``state.msgpack`` (resume point), ``log.jsonl`` (one line per ``log_every``
        steps: step, loss, ce, kl, tokens/s, seconds) and ``config.json``.
      teacher: the target model for ``objective="distill"`` (same vocabulary).
      init: start from these weights instead of a random initialisation (DistillSpec distils a draft that
        was first trained on its own; its config must equal ``config``). Ignored when resuming.
      start_step: with ``init``, continue a run from its parameters alone (a "portable resume point": e.g.
        the bfloat16 export of a run whose ``state.msgpack`` was lost with its machine): the learning-rate
        schedule and the data order continue at this step, the Adam moments start again from zero, and the
        updates are scaled up linearly over ``REWARM_STEPS`` steps so that the fresh moments do not jolt a
        trained model. Ignored when ``state.msgpack`` exists (a real resume point wins).
      stop: when set (e.g. by a SIGTERM/SIGINT handler), the loop saves ``state.msgpack`` after the step in
        flight and raises ``KeyboardInterrupt``. A flag read by the loop, not an exception raised from the
        signal handler: Python drops an exception raised while a callback such as JAX's garbage-collection
        hook runs, and the run would go on unsaved.
    Returns:
      The trained ``T5Model``.
    Raises:
      ValueError: distill without a teacher, vocabularies that differ, or a run_dir whose saved config
        differs from ``config`` (start a new run_dir instead).
    """
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    if tc.objective == "distill":
        if teacher is None:
            raise ValueError("objective='distill' needs the teacher (target) model.")
        if teacher.config.vocab_size != config.vocab_size:
            raise ValueError(f"Teacher vocab {teacher.config.vocab_size} != student vocab {config.vocab_size}.")
    meta = {"model": dataclasses.asdict(config), "train": dataclasses.asdict(tc)}
    meta_path = run / "config.json"
    if meta_path.exists():
        saved = json.loads(meta_path.read_text())
        if saved["model"] != meta["model"]:
            raise ValueError(f"{run} holds a run of a different model config; use another run directory.")
        was = saved.get("train", {}).get("optimizer", "adamw")  # runs before the flag trained with AdamW
        if was != tc.optimizer and (run / "state.msgpack").exists():
            raise ValueError(
                f"{run} holds a run trained with --optimizer {was}; its saved optimizer state cannot "
                f"resume with {tc.optimizer}. Resume with --optimizer {was}, or use another run "
                "directory."
            )
    meta_path.write_text(json.dumps(meta, indent=1))

    opt = _optimizer(tc)
    if init is not None:
        if init.config.replace(name=config.name, dtype=config.dtype, param_dtype=config.param_dtype) != config:
            ours = init.config.replace(name=config.name, dtype=config.dtype, param_dtype=config.param_dtype)
            diff = ", ".join(
                f"{f.name}: {getattr(ours, f.name)!r} in the checkpoint vs {getattr(config, f.name)!r} being trained"
                for f in dataclasses.fields(config)
                if getattr(ours, f.name) != getattr(config, f.name)
            )
            raise ValueError(
                f"--init-from checkpoint differs from the model being trained ({diff}); train the "
                "checkpoint's size (--model-config with its config.json) or start without --init-from."
            )
        params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, config.weight_dtype), init.params)
    else:
        params = t5.init_params(config, tc.seed)
    opt_state = opt.init(params)
    step, rewarm_from = 0, None
    state_path = run / "state.msgpack"
    if state_path.exists():
        restored = serialization.from_bytes(
            {"params": params, "opt_state": opt_state, "step": 0}, state_path.read_bytes()
        )
        params, opt_state, step = restored["params"], restored["opt_state"], int(restored["step"])
        rewarm_from = _saved_rewarm_start(run, step)
    elif start_step:
        if init is None:
            raise ValueError(
                "start_step (--start-step) continues a run from its parameters: give them as "
                "init (--init-from CHECKPOINT)."
            )
        if not 0 < start_step < tc.num_steps:
            raise ValueError(f"start_step must be in (0, num_steps={tc.num_steps}), got {start_step}.")
        step, rewarm_from = start_step, start_step
        opt_state = _at_schedule_step(opt_state, start_step)
        (run / "rewarm.json").write_text(json.dumps({"rewarm_from": start_step}))
    cached = None
    if tc.objective == "distill" and tc.cache_teacher:
        cached = teacher_log_probs(
            teacher, src, tgt, run / "teacher_logprobs.f16", tokens_per_batch=tc.tokens_per_batch, progress=progress
        )
    teacher_params = teacher.params if teacher is not None and cached is None else None
    train_step = _make_step(
        config,
        opt,
        tc.objective,
        tc.distill_alpha,
        teacher.config if teacher is not None and cached is None else None,
        tc.dropout_rate,
        tc.seed,
        tc.compute_dtype,
        tc.label_smoothing,
        tc.dropout_style,
    )

    if not batches(src, tgt, tc.tokens_per_batch, tc.seed, 0):
        raise ValueError(
            f"{len(src)} pairs do not fill one batch of {tc.tokens_per_batch} tokens in any length "
            "bucket; lower --tokens-per-batch or give more data."
        )

    def stream() -> Iterator:
        epoch, seen = 0, 0
        while True:
            for batch in batches(src, tgt, tc.tokens_per_batch, tc.seed, epoch):
                if seen >= step:  # resume: skip batches already trained on
                    yield epoch, batch
                seen += 1
            epoch += 1

    from tqdm.auto import tqdm

    bar = tqdm(
        total=tc.num_steps,
        initial=step,
        disable=not progress,
        desc=f"train {tc.objective}",
        unit="step",
        dynamic_ncols=True,
    )
    log = open(run / "log.jsonl", "a")
    t0, tokens, acc = time.perf_counter(), 0.0, []
    data = stream()
    try:
        while step < tc.num_steps:
            epoch, (enc, dec, sel) = next(data)
            if cached is not None:
                teacher_params = _gather_log_probs(*cached, sel, dec.shape)
            scale = 1.0 if rewarm_from is None else min(1.0, (step - rewarm_from + 1) / REWARM_STEPS)
            params, opt_state, m = train_step(
                params, opt_state, enc, dec, teacher_params, np.int32(step), np.float32(scale)
            )
            step += 1
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt("stop requested")  # saved below, like Ctrl-C
            acc.append(m)
            bar.update(1)
            if step % tc.log_every == 0 or step == tc.num_steps:
                ms = jax.device_get(acc)
                acc = []
                tokens = sum(float(x["tokens"]) for x in ms)
                dt = time.perf_counter() - t0
                t0 = time.perf_counter()
                rec = {
                    "step": step,
                    "epoch": epoch,
                    "loss": float(np.mean([x["loss"] for x in ms])),
                    "ce": float(np.mean([x["ce"] for x in ms])),
                    "kl": float(np.mean([x["kl"] for x in ms])),
                    "target_tokens_per_s": tokens / dt,
                    "s_per_step": dt / len(ms),
                }
                log.write(json.dumps(rec) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['target_tokens_per_s']:.0f}")
            if step % tc.save_every == 0 or step == tc.num_steps:
                _save_state(state_path, params, opt_state, step)
            if tc.snapshot_every and step % tc.snapshot_every == 0:
                snap = run / "snapshots" / f"step_{step}.msgpack"
                snap.parent.mkdir(exist_ok=True)
                snap.with_suffix(".tmp").write_bytes(serialization.to_bytes(params))
                os.replace(snap.with_suffix(".tmp"), snap)
    except KeyboardInterrupt:  # keep what was trained: re-running the command resumes from here
        _save_state(state_path, params, opt_state, step)
        raise
    finally:
        bar.close()
        log.close()
    return T5Model(config, params)
