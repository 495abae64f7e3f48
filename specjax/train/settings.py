"""What a training run does (``TrainConfig``) and the length buckets its batches are padded to."""

from __future__ import annotations

import dataclasses

from specjax.models import t5

BUCKETS = (16, 24, 32, 48, 64)  # padded lengths (tokens); a pair goes to the first bucket >= both sides


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What a training run does.

    Attributes:
      objective: "reference" (cross-entropy on references) or "distill" (DistillSpec forward KL to a teacher).
      num_steps: optimizer steps.
      tokens_per_batch: padded target tokens per batch (batch rows = tokens_per_batch // bucket length).
      learning_rate: peak learning rate (linear warmup, cosine decay to 10%). For "adafactor" it is the
        relative step size: each tensor's update is this times its RMS (t5x pre-trains T5 at 1e-2).
      warmup_steps: linear warmup length (steps).
      weight_decay: decoupled weight decay: each step subtracts learning rate × this × the parameter
        (AdamW's, Loshchilov & Hutter 2019; the same rule with "adafactor", where t5x uses none: pass 0).
      optimizer: "adamw" (default: optax.adamw, β 0.9 / 0.98, global-norm clipping at 1) or "adafactor"
        (optax.adafactor with t5x's settings: factored second moments, decay rate 0.8, update clipping at
        RMS 1, no momentum, updates scaled by each parameter's RMS; Shazeer & Stern 2018, Algorithm 4 and §8).
        t5x trains T5 with Adafactor and initialises for it: the embedding at RMS 1, the kernels at
        fan-in scale and the attention queries at RMS (d_model · head_dim)^-1/2, so under Adafactor every
        tensor moves at about the same rate relative to its size, while AdamW's absolute steps moved the queries
        6× and the embedding 0.04× as far as Adafactor does (docs/training.md, "What did not work").
      seed: initialisation and data-order seed.
      save_every: steps between resumable checkpoints.
      snapshot_every: keep the params every this many steps as ``snapshots/step_<N>.msgpack`` (flax
        msgpack of the params tree) for model selection or checkpoint averaging; 0 keeps none.
      log_every: steps between loss/throughput log lines.
      distill_alpha: weight of the forward-KL term in "distill" (the rest is cross-entropy on the
        teacher's outputs).
      dropout_rate: dropout on embeddings, sub-layer outputs and final norms during training (T5's
        fine-tuning uses 0.1; the small default target overfits Multi30k without it). 0 disables it.
      dropout_style: where and how dropout draws its masks (``t5.logits``): "sublayers" (the default:
        independent decisions on the embeddings, every sub-layer output and the final norms) or "t5x" (t5x's
        network.py: those masks shared along the length axis, plus the attention weights and the MLP's hidden
        layer).
      label_smoothing: ε of label smoothing (Szegedy et al. 2016, §7; Vaswani et al. 2017, §5.4 use 0.1) in
        the "reference" objective: the training target puts 1 - ε on the reference token and ε / (vocab - 1)
        on each other token (t5x's and fairseq's convention). 0 (default) is the plain cross-entropy. The
        logged ``ce`` stays the plain cross-entropy, so runs with and without it compare.
      compute_dtype: dtype name of activations and matmuls in the training step ("float32" or "bfloat16";
        None: the model config's ``dtype``). Parameters, gradients' accumulation into them and the optimizer
        state stay in the config's ``param_dtype``, and the saved model config is unchanged, as in t5x's
        bfloat16-activation training. bfloat16 measured 0.84x the float32 step time for the small target
        on a 2-core AMD EPYC CPU (Zen 4).
      embedding_lr_multiplier: the shared token embedding's learning rate (and so its decoupled weight decay)
        is ``learning_rate`` times this; every other parameter's is ``learning_rate``. t5x initialises the
        embedding at unit scale (RMS 1) and its kernels at fan-in scale (RMS d^-1/2, 0.044 at d 512), and
        trains T5 with Adafactor, whose updates are proportional to each parameter's RMS (Shazeer & Stern
        2018, §8 "relative step size"), so the embedding moves as fast relative to its size as the kernels do.
        Adam's updates are not: with 1 (the default, plain AdamW) the small target's embedding moved 1.3 %
        from its initialisation in 1,300 steps against 20-35 % for the kernels (docs/training.md).
        ``d_model ** 0.5`` (22.6 at d 512) restores Adafactor's ratio for the embedding alone.
      cache_teacher: with "distill", compute the teacher's log-probabilities at every target position of
        every pair once (``teacher_log_probs``: float16 on disk in the run directory) instead of running the
        teacher's forward pass in every step. The teacher is deterministic (no dropout), so this is the same
        objective up to float16 rounding of the log-probabilities, at the cost of one forward pass over the
        data and 2 bytes × vocab of disk per target token (16 KB with an 8k vocabulary; Multi30k: ~7 GB).
    """

    objective: str = "reference"
    num_steps: int = 3000
    tokens_per_batch: int = 4096
    learning_rate: float = 7e-4
    warmup_steps: int = 400
    weight_decay: float = 0.01
    seed: int = 0
    save_every: int = 250
    snapshot_every: int = 0
    log_every: int = 50
    distill_alpha: float = 1.0
    dropout_rate: float = 0.0
    label_smoothing: float = 0.0
    compute_dtype: str | None = None
    embedding_lr_multiplier: float = 1.0
    cache_teacher: bool = True
    optimizer: str = "adamw"
    dropout_style: str = "sublayers"

    def __post_init__(self):
        if self.compute_dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f"compute_dtype must be 'float32' or 'bfloat16', got {self.compute_dtype!r}.")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing (--label-smoothing) must be in [0, 1), got {self.label_smoothing}.")
        if self.dropout_style not in t5.DROPOUT_STYLES:
            raise ValueError(
                f"dropout_style (--dropout-style) must be one of {t5.DROPOUT_STYLES}, got {self.dropout_style!r}."
            )
        if self.optimizer not in ("adamw", "adafactor"):
            raise ValueError(f"optimizer (--optimizer) must be 'adamw' or 'adafactor', got {self.optimizer!r}.")
        if self.weight_decay < 0.0:
            raise ValueError(f"weight_decay (--weight-decay) must be >= 0, got {self.weight_decay}.")
        if self.objective not in ("reference", "distill"):
            raise ValueError(f"objective must be 'reference' or 'distill', got {self.objective!r}.")
        if self.label_smoothing and self.objective != "reference":
            raise ValueError(
                "label_smoothing (--label-smoothing) applies to the 'reference' objective only: "
                "DistillSpec's target is the teacher's own distribution; drop it for --objective "
                "distill."
            )
        if not self.embedding_lr_multiplier > 0.0:
            raise ValueError(
                f"embedding_lr_multiplier (--embedding-lr-multiplier) must be > 0, got {self.embedding_lr_multiplier}."
            )
        if self.num_steps < 1:
            raise ValueError(f"num_steps (--steps) must be >= 1, got {self.num_steps}.")
        if self.tokens_per_batch < BUCKETS[-1]:
            raise ValueError(
                f"tokens_per_batch (--tokens-per-batch) must be >= the largest length bucket "
                f"({BUCKETS[-1]} tokens), got {self.tokens_per_batch}."
            )
