"""The losses (cross-entropy on references, DistillSpec's forward KL), the optimizer and the jitted training
step."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.config import T5Config
from specjax.decoding.xla_cpu import train_step_compiler_options
from specjax.models import t5
from specjax.train.settings import TrainConfig

# ----------------------------------------------------------------------------------------------------------
# Losses


def shift_right(decoder_target_tokens: jax.Array, pad_id: int = 0) -> jax.Array:
    """Decoder inputs int32[b, t]: targets shifted right by one, starting with ``pad_id`` (t5x)."""
    return jnp.pad(decoder_target_tokens, ((0, 0), (1, 0)), constant_values=pad_id)[:, :-1]


def cross_entropy_loss(
    logits_btv: jax.Array, targets_bt: jax.Array, label_smoothing: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Mean token cross-entropy (nats) over positions with ``targets > 0``; returns (loss, token count).

    Args:
      logits_btv: float[b, t, vocab] logits (any float dtype; computed in float32).
      targets_bt: int32[b, t] target ids, 0 (padding) where there is no target.
      label_smoothing: ε in [0, 1): the cross-entropy to the smoothed target that puts 1 - ε on the
        reference token and ε / (vocab - 1) on every other one (Szegedy et al. 2016, §7; the convention of
        t5x's ``cross_entropy_with_logits`` and fairseq's ``label_smoothed_cross_entropy``, without t5x's
        constant that shifts the minimum to 0). 0: the plain negative log-likelihood.

    Returns:
      (float32 scalar loss in nats per target token, float32 scalar count of target tokens, at least 1).
    """
    weights = (targets_bt > 0).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, targets_bt[..., None], axis=-1)[..., 0]
    if label_smoothing:
        off = label_smoothing / (logp.shape[-1] - 1)
        # -Σ_v q_v log p_v with q = (1 - ε) at the reference and ε / (V - 1) elsewhere
        nll = (1.0 - label_smoothing - off) * nll - off * logp.sum(axis=-1)
    count = jnp.maximum(weights.sum(), 1.0)
    return (nll * weights).sum() / count, count


def distill_loss(student_btv: jax.Array, teacher_btv: jax.Array, targets_bt: jax.Array) -> jax.Array:
    """Forward KL(teacher || student) per token (nats), averaged over ``targets > 0`` (DistillSpec FKL)."""
    weights = (targets_bt > 0).astype(jnp.float32)
    t_logp = jax.nn.log_softmax(teacher_btv.astype(jnp.float32))
    s_logp = jax.nn.log_softmax(student_btv.astype(jnp.float32))
    kl = jnp.sum(jnp.exp(t_logp) * (t_logp - s_logp), axis=-1)
    return (kl * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def _optimizer(tc: TrainConfig) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, tc.learning_rate, tc.warmup_steps, max(tc.num_steps, tc.warmup_steps + 1), end_value=tc.learning_rate * 0.1
    )
    if tc.optimizer == "adafactor":  # t5x's defaults; no global-norm clip (Adafactor clips each update's RMS)
        decay = (lambda count: schedule(count) * tc.weight_decay) if tc.weight_decay else None
        chain = [
            optax.adafactor(
                schedule,
                decay_rate=0.8,
                clipping_threshold=1.0,
                momentum=None,
                multiply_by_parameter_scale=True,
                weight_decay_rate=decay,
            )
        ]
    else:
        chain = [optax.clip_by_global_norm(1.0), optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=tc.weight_decay)]
    if tc.embedding_lr_multiplier != 1.0:  # appended only then: runs without it keep their optimizer state's layout
        chain.append(_scale_embedding_updates(tc.embedding_lr_multiplier))
    return optax.chain(*chain)


EMBEDDING = ("token_embedder", "embedding")  # t5x's name of the shared token embedding


def _scale_embedding_updates(multiplier: float) -> optax.GradientTransformation:
    """Multiply the updates of the shared token embedding (``EMBEDDING``) by ``multiplier``, others by 1.

    After ``optax.adamw`` this is a parameter group with ``multiplier`` times the learning rate (PyTorch's
    param-group semantics: the decoupled weight decay scales with it). Stateless.
    """

    def update(updates, state, params=None):
        del params
        if EMBEDDING[0] not in updates or EMBEDDING[1] not in updates[EMBEDDING[0]]:
            raise ValueError(f"embedding_lr_multiplier: the parameters have no {'/'.join(EMBEDDING)}.")
        inner = dict(updates[EMBEDDING[0]])
        u = inner[EMBEDDING[1]]
        inner[EMBEDDING[1]] = (u * multiplier).astype(u.dtype)
        return {**updates, EMBEDDING[0]: inner}, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _make_step(
    config: T5Config,
    opt,
    objective: str,
    alpha: float,
    teacher_config: T5Config | None,
    dropout_rate: float = 0.0,
    seed: int = 0,
    compute_dtype: str | None = None,
    label_smoothing: float = 0.0,
    dropout_style: str = "sublayers",
):
    """The jitted training step ``(params, opt_state, enc, dec, teacher, step, update_scale)``.

    ``teacher`` (with objective "distill"): the teacher's parameters when ``teacher_config`` is given, else
    the teacher's cached log-probabilities for this batch, float16[b, L, vocab] (``teacher_log_probs``).

    ``update_scale`` (float32 scalar) multiplies the optimizer's updates: 1 except during the re-warmup
    after a resume from parameters alone (``train(start_step=...)``). Dropout's key is an "rbg" key folded
    with the step (``t5._dropout`` draws each mask with XLA's RngBitGenerator, Threefry). On CPU the step is
    compiled with ``xla_cpu.train_step_compiler_options()``.
    """
    if compute_dtype is not None:
        config = config.replace(dtype=compute_dtype)

    def loss_fn(params, enc, dec, teacher_params, step):
        rng = jax.random.fold_in(jax.random.key(seed, impl="rbg"), step) if dropout_rate > 0 else None
        logits = t5.logits(
            config,
            params,
            enc,
            shift_right(dec),
            dropout_rate=dropout_rate,
            dropout_rng=rng,
            dropout_style=dropout_style,
        )
        ce, count = cross_entropy_loss(logits, dec)
        if objective == "distill":
            if teacher_config is None:  # cached log-probabilities (log_softmax renormalises their rounding)
                teacher = teacher_params.astype(jnp.float32)
            else:
                teacher = jax.lax.stop_gradient(t5.logits(teacher_config, teacher_params, enc, shift_right(dec)))
            kl = distill_loss(logits, teacher, dec)
            return alpha * kl + (1 - alpha) * ce, (ce, kl, count)
        if label_smoothing:
            return cross_entropy_loss(logits, dec, label_smoothing)[0], (ce, jnp.zeros(()), count)
        return ce, (ce, jnp.zeros(()), count)

    full_update = np.float32(1.0)  # the update scale outside a re-warmup (a float32 array: one traced program)

    # no buffer donation: a Ctrl-C inside the call would leave the loop's params deleted, unsavable
    @functools.partial(jax.jit, compiler_options=train_step_compiler_options())
    def step(params, opt_state, enc, dec, teacher_params, step, update_scale=full_update):
        (loss, (ce, kl, count)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, enc, dec, teacher_params, step
        )
        updates, opt_state = opt.update(grads, opt_state, params)
        updates = jax.tree_util.tree_map(lambda u: (u * update_scale).astype(u.dtype), updates)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "ce": ce, "kl": kl, "tokens": count}

    return step
