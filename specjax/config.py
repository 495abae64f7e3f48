"""T5 model configuration: one frozen dataclass, t5x's named sizes, and the Hugging Face converter.

Sizes are those of t5x's gin files (``t5x/examples/t5/t5_1_0/*.gin`` and ``t5_1_1/*.gin``) and of the
T5 paper (Raffel et al. 2020, Table 14) / T5 1.1 release notes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

__all__ = ["T5Config", "PRESETS"]


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Hyper-parameters of a T5 encoder-decoder (v1.0 or v1.1 / Flan-T5).

    Fields use t5x's ``network.T5Config`` names. Variants are made with ``dataclasses.replace``.

    Attributes:
      vocab_size: rows of the token embedding ``v`` (tokens); 32128 for the public T5 checkpoints.
      d_model: model width ``d`` (t5x ``emb_dim``).
      num_heads: attention heads ``n``.
      head_dim: width of one head ``h``; ``n * h`` need not equal ``d`` (T5 1.0 3B/11B).
      mlp_dim: feed-forward width ``f`` (t5x ``mlp_dim``, HF ``d_ff``).
      num_encoder_layers, num_decoder_layers: stack depths.
      gated_gelu: True for T5 1.1 (``wi_0``/``wi_1`` with tanh-GELU gate), False for T5 1.0 (ReLU ``wi``).
      logits_via_embedding: True for T5 1.0 (logits = embedding^T h / sqrt(d)); False for 1.1
        (untied ``decoder/logits_dense``).
      relative_attention_num_buckets, relative_attention_max_distance: relative position buckets
        (Raffel et al. 2020, section 2.1): 32 and 128.
      layer_norm_epsilon: RMSNorm epsilon (1e-6).
      dtype: compute dtype name ("float32" or "bfloat16").
      param_dtype: parameter storage dtype name.
      pad_id, eos_id: token ids (0 and 1 for T5's SentencePiece vocabulary); decoding starts from pad_id.
      name: preset name or free text, for messages only.
    """

    vocab_size: int = 32128
    d_model: int = 512
    num_heads: int = 8
    head_dim: int = 64
    mlp_dim: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    gated_gelu: bool = True
    logits_via_embedding: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    pad_id: int = 0
    eos_id: int = 1
    name: str = "custom"

    def __post_init__(self):
        for field in (
            "vocab_size",
            "d_model",
            "num_heads",
            "head_dim",
            "mlp_dim",
            "num_encoder_layers",
            "num_decoder_layers",
            "relative_attention_num_buckets",
            "relative_attention_max_distance",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"T5Config.{field} must be a positive int, got {value!r}.")
        for field in ("dtype", "param_dtype"):
            if getattr(self, field) not in ("float32", "bfloat16", "float16"):
                raise ValueError(
                    f"T5Config.{field} must be 'float32', 'bfloat16' or 'float16', got {getattr(self, field)!r}."
                )

    @property
    def compute_dtype(self) -> Any:
        """The jnp dtype activations are computed in."""
        return jnp.dtype(self.dtype)

    @property
    def weight_dtype(self) -> Any:
        """The jnp dtype parameters are stored in."""
        return jnp.dtype(self.param_dtype)

    @property
    def family(self) -> str:
        """ "t5_1_1" (gated GELU, untied logits) or "t5_1_0" (ReLU, logits through the embedding)."""
        return "t5_1_1" if self.gated_gelu else "t5_1_0"

    def replace(self, **changes) -> "T5Config":
        """``dataclasses.replace`` shorthand."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides) -> "T5Config":
        """A named size with t5x's checkpoint names.

        Args:
          name: one of ``PRESETS`` (``t5_1_1_small`` … ``t5_1_1_xxl``, ``t5_small`` … ``t5_11B``,
            ``flan_t5_*``).
          **overrides: fields to change, e.g. ``dtype="bfloat16"``.
        Raises:
          ValueError: unknown name (the message lists the known ones).
        """
        if name not in PRESETS:
            raise ValueError(f"Unknown T5 preset {name!r}. Known presets: {', '.join(sorted(PRESETS))}.")
        return dataclasses.replace(PRESETS[name], **overrides)

    @classmethod
    def from_hf_config(cls, config: str | os.PathLike | Mapping[str, Any], **overrides) -> "T5Config":
        """Builds a config from a Hugging Face ``config.json`` (path, directory or parsed dict).

        Reads ``vocab_size, d_model, d_kv, d_ff, num_layers, num_decoder_layers, num_heads,
        relative_attention_num_buckets, relative_attention_max_distance, layer_norm_epsilon,
        feed_forward_proj, tie_word_embeddings`` (transformers ``T5Config``).

        Raises:
          FileNotFoundError: the path does not exist.
          ValueError: not a T5 config, or an activation specjax does not implement.
        """
        if not isinstance(config, Mapping):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            if not os.path.exists(path):
                raise FileNotFoundError(f"No Hugging Face config.json at {path!r}.")
            with open(path) as f:
                config = json.load(f)
        model_type = config.get("model_type", "t5")
        if model_type != "t5":
            raise ValueError(f"config.json has model_type={model_type!r}; specjax reads only 't5'.")
        proj = config.get("feed_forward_proj", "relu")
        if proj in ("gated-gelu", "gated-gelu_new"):
            gated = True
        elif proj == "relu":
            gated = False
        else:
            raise ValueError(
                f"feed_forward_proj={proj!r} is not supported; use 'relu' (T5 1.0) or 'gated-gelu' (T5 1.1 / Flan-T5)."
            )
        # transformers >= 5 always writes tie_word_embeddings=true for T5 and records whether the decoder
        # output is scaled by 1/sqrt(d) (the T5 1.0 tied head) in scale_decoder_outputs.
        tie = bool(config.get("scale_decoder_outputs", config.get("tie_word_embeddings", True)))
        num_layers = int(config["num_layers"])
        fields = dict(
            vocab_size=int(config["vocab_size"]),
            d_model=int(config["d_model"]),
            num_heads=int(config["num_heads"]),
            head_dim=int(config["d_kv"]),
            mlp_dim=int(config["d_ff"]),
            num_encoder_layers=num_layers,
            num_decoder_layers=int(config.get("num_decoder_layers") or num_layers),
            gated_gelu=gated,
            logits_via_embedding=tie,
            relative_attention_num_buckets=int(config.get("relative_attention_num_buckets", 32)),
            relative_attention_max_distance=int(config.get("relative_attention_max_distance", 128)),
            layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-6)),
            pad_id=int(config.get("pad_token_id", 0) or 0),
            eos_id=int(config.get("eos_token_id", 1)),
            name=str(config.get("_name_or_path", "hf")) or "hf",
        )
        fields.update(overrides)
        return cls(**fields)

    def to_hf_config(self) -> dict:
        """The Hugging Face ``config.json`` dict (transformers ``T5Config`` fields) for this config."""
        return {
            "architectures": ["T5ForConditionalGeneration"],
            "model_type": "t5",
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "d_kv": self.head_dim,
            "d_ff": self.mlp_dim,
            "num_layers": self.num_encoder_layers,
            "num_decoder_layers": self.num_decoder_layers,
            "num_heads": self.num_heads,
            "relative_attention_num_buckets": self.relative_attention_num_buckets,
            "relative_attention_max_distance": self.relative_attention_max_distance,
            "dropout_rate": 0.0,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "initializer_factor": 1.0,
            "feed_forward_proj": "gated-gelu" if self.gated_gelu else "relu",
            "is_gated_act": self.gated_gelu,
            "dense_act_fn": "gelu_new" if self.gated_gelu else "relu",
            "tie_word_embeddings": self.logits_via_embedding,
            "scale_decoder_outputs": self.logits_via_embedding,
            "is_encoder_decoder": True,
            "pad_token_id": self.pad_id,
            "eos_token_id": self.eos_id,
            "decoder_start_token_id": self.pad_id,
            "use_cache": True,
        }


def _v11(name, d, n, layers, f):
    return T5Config(
        d_model=d,
        num_heads=n,
        head_dim=64,
        mlp_dim=f,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        gated_gelu=True,
        logits_via_embedding=False,
        name=name,
    )


def _v10(name, d, n, layers, f, head_dim=64):
    return T5Config(
        d_model=d,
        num_heads=n,
        head_dim=head_dim,
        mlp_dim=f,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        gated_gelu=False,
        logits_via_embedding=True,
        name=name,
    )


PRESETS: dict[str, T5Config] = {
    # T5 1.1 (t5x/examples/t5/t5_1_1/*.gin); Flan-T5 uses the same architecture.
    "t5_1_1_small": _v11("t5_1_1_small", 512, 6, 8, 1024),
    "t5_1_1_base": _v11("t5_1_1_base", 768, 12, 12, 2048),
    "t5_1_1_large": _v11("t5_1_1_large", 1024, 16, 24, 2816),
    "t5_1_1_xl": _v11("t5_1_1_xl", 2048, 32, 24, 5120),
    "t5_1_1_xxl": _v11("t5_1_1_xxl", 4096, 64, 24, 10240),
    # T5 1.0 (t5x/examples/t5/t5_1_0/*.gin).
    "t5_small": _v10("t5_small", 512, 8, 6, 2048),
    "t5_base": _v10("t5_base", 768, 12, 12, 3072),
    "t5_large": _v10("t5_large", 1024, 16, 24, 4096),
    "t5_3B": _v10("t5_3B", 1024, 32, 24, 16384, head_dim=128),
    "t5_11B": _v10("t5_11B", 1024, 128, 24, 65536, head_dim=128),
}
for _size in ("small", "base", "large", "xl", "xxl"):
    PRESETS[f"flan_t5_{_size}"] = dataclasses.replace(PRESETS[f"t5_1_1_{_size}"], name=f"flan_t5_{_size}")
