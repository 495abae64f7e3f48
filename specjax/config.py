"""T5 model configuration: one frozen dataclass, the named sizes, and the Hugging Face converter.

T5 sizes are those of t5x's gin files (``t5x/examples/t5/t5_1_0/*.gin`` and ``t5_1_1/*.gin``) and of the
T5 paper (Raffel et al. 2020, Table 14) / T5 1.1 release notes. The other families (mT5, umT5, UL2 / Flan-UL2,
ByT5, MADLAD-400) take the shapes of their released checkpoints' ``config.json`` (``PRESETS``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

__all__ = ["T5Config", "PRESETS", "MLP_ACTIVATIONS"]

# t5x ``MlpBlock`` activation names specjax implements (``specjax.models.t5.MLP``).
MLP_ACTIVATIONS = ("relu", "gelu", "gelu_exact", "silu", "linear")

# Hugging Face ``model_type`` values read by ``T5Config.from_hf_config`` (one parameter layout, ``rules.py``).
HF_MODEL_TYPES = ("t5", "mt5", "umt5")

# transformers ``ACT2FN`` names -> t5x names (transformers ``activations.py``: "gelu_new" and
# "gelu_pytorch_tanh" are the tanh approximation, "gelu" the erf form; "swish" is "silu").
_FROM_HF_ACT = {
    "relu": "relu",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
    "gelu_fast": "gelu",
    "gelu": "gelu_exact",
    "silu": "silu",
    "swish": "silu",
}
_HF_ACT_NAMES = {"relu": "relu", "gelu": "gelu_new", "gelu_exact": "gelu", "silu": "silu", "linear": "linear"}


def hf_activations(feed_forward_proj: str) -> tuple[str, ...]:
    """t5x ``mlp_activations`` for a transformers ``feed_forward_proj``, read as transformers reads it
    (``T5Config.__post_init__``): ``"<act>"`` or ``"gated-<act>"``, ``dense_act_fn = <act>``, except that
    "gated-gelu" means ``gelu_new`` (the tanh form). "relu" -> ("relu",); "gated-gelu" -> ("gelu", "linear");
    "gated-silu" (UL2) -> ("silu", "linear").

    Raises:
      ValueError: a form or activation specjax does not implement (the message lists the supported ones).
    """
    parts = str(feed_forward_proj).split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    act = parts[-1]
    if len(parts) > 2 or (len(parts) == 2 and not gated) or act not in _FROM_HF_ACT:
        raise ValueError(
            f"feed_forward_proj={feed_forward_proj!r} is not supported; use 'relu' (T5 1.0), 'gated-gelu' "
            "(T5 1.1 / Flan-T5 / mT5 / umT5 / ByT5 / MADLAD-400) or 'gated-silu' (UL2), or another "
            f"'[gated-]<act>' with <act> in {sorted(_FROM_HF_ACT)}."
        )
    name = "gelu" if gated and act == "gelu" else _FROM_HF_ACT[act]
    return (name, "linear") if gated else (name,)


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
        Read only when ``mlp_activations`` is None (configs written before it); otherwise it mirrors
        ``mlp_activations == ("gelu", "linear")``.
      mlp_activations: t5x ``MlpBlock.activations``: one name per input kernel, the hidden layer being their
        product: ``("relu",)`` (T5 1.0, kernel ``wi``), ``("gelu", "linear")`` (T5 1.1 / mT5 / umT5 / ByT5 /
        MADLAD, ``wi_0`` and ``wi_1``), ``("silu", "linear")`` (UL2). Names: ``relu``, ``gelu`` (the tanh
        approximation: flax ``nn.gelu``, transformers ``gelu_new``), ``gelu_exact`` (the erf form), ``silu``,
        ``linear``. None: from ``gated_gelu``.
      logits_via_embedding: True when the logits go through the token embedding (tied; T5 1.0:
        logits = embedding^T h / sqrt(d)); False for an untied ``decoder/logits_dense`` (T5 1.1, mT5, umT5).
      logits_scaling: multiply the decoder output by ``d**-0.5`` before the logits (transformers
        ``scale_decoder_outputs``). None: exactly when ``logits_via_embedding`` (t5x; Hugging Face T5's tied
        head). False with ``logits_via_embedding``: a tied head without the scaling (mT5 as transformers 5
        writes it).
      per_layer_relpos_bias: False for T5 / mT5 (one relative position table per stack, t5x
        ``encoder/relpos_bias``, used by every layer); True for umT5 (Chung et al. 2023, "UniMax"): every layer
        of each stack has its own table (``encoder/layers_<i>/relpos_bias``).
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
    mlp_activations: tuple[str, ...] | None = None
    logits_scaling: bool | None = None
    per_layer_relpos_bias: bool = False

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
        if self.mlp_activations is not None:
            acts = tuple(self.mlp_activations)
            if not acts or len(acts) > 2 or any(a not in MLP_ACTIVATIONS for a in acts):
                raise ValueError(
                    f"T5Config.mlp_activations must be one or two of {MLP_ACTIVATIONS}, e.g. ('relu',) or "
                    f"('gelu', 'linear'); got {self.mlp_activations!r}."
                )
            object.__setattr__(self, "mlp_activations", acts)  # a list (from JSON) becomes a hashable tuple
            object.__setattr__(self, "gated_gelu", acts == ("gelu", "linear"))
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
    def activations(self) -> tuple[str, ...]:
        """The MLP's activations (``mlp_activations``, or ``gated_gelu``'s): one per input kernel."""
        if self.mlp_activations is not None:
            return self.mlp_activations
        return ("gelu", "linear") if self.gated_gelu else ("relu",)

    @property
    def is_gated(self) -> bool:
        """True when the MLP has two input kernels ``wi_0``, ``wi_1`` (a gated MLP), False for one ``wi``."""
        return len(self.activations) == 2

    @property
    def scales_logits(self) -> bool:
        """True when the decoder output is multiplied by ``d**-0.5`` before the logits (``logits_scaling``)."""
        return self.logits_via_embedding if self.logits_scaling is None else bool(self.logits_scaling)

    @property
    def family(self) -> str:
        """ "t5_1_1" (gated GELU, untied logits), "t5_1_0" (ReLU, logits through the embedding), or, for
        other layouts, a short description such as "umt5 gated-silu" (for messages)."""
        if self.per_layer_relpos_bias or self.activations not in (("gelu", "linear"), ("relu",)):
            prefix = "umt5" if self.per_layer_relpos_bias else "t5"
            acts = self.activations
            return f"{prefix} {'gated-' + acts[0] if len(acts) == 2 else acts[0]}"
        return "t5_1_1" if self.gated_gelu else "t5_1_0"

    def replace(self, **changes) -> "T5Config":
        """``dataclasses.replace`` shorthand."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides) -> "T5Config":
        """A named size with t5x's checkpoint names.

        Args:
          name: one of ``PRESETS`` (``t5_1_1_small`` … ``t5_1_1_xxl``, ``t5_small`` … ``t5_11B``,
            ``flan_t5_*``, ``mt5_small`` … ``mt5_xxl``, ``umt5_small/base/xl/xxl``, ``ul2``, ``flan_ul2``,
            ``byt5_small`` … ``byt5_xxl``, ``madlad400_3b/7b/10b``).
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

        Reads ``model_type`` (t5, mt5 or umt5; umt5 gives ``per_layer_relpos_bias``), ``vocab_size, d_model,
        d_kv, d_ff, num_layers, num_decoder_layers, num_heads, relative_attention_num_buckets,
        relative_attention_max_distance, layer_norm_epsilon, feed_forward_proj, tie_word_embeddings,
        scale_decoder_outputs`` (transformers ``T5Config`` / ``MT5Config`` / ``UMT5Config``). The activation is
        read from ``feed_forward_proj`` as transformers does (``[gated-]<act>``; its ``dense_act_fn`` is
        derived from it, "gated-gelu" meaning the tanh form ``gelu_new``); see ``hf_activations``.

        Raises:
          FileNotFoundError: the path does not exist.
          ValueError: not a T5-family config, or an activation specjax does not implement.
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
        if model_type not in HF_MODEL_TYPES:
            raise ValueError(
                f"config.json has model_type={model_type!r}; specjax reads {', '.join(map(repr, HF_MODEL_TYPES))} "
                "(T5, mT5, umT5, UL2, ByT5, MADLAD-400). LongT5 and T5Gemma are other architectures (docs/models.md)."
            )
        acts = hf_activations(config.get("feed_forward_proj", "gated-gelu" if model_type != "t5" else "relu"))
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
            gated_gelu=acts == ("gelu", "linear"),
            logits_via_embedding=tie,
            relative_attention_num_buckets=int(config.get("relative_attention_num_buckets", 32)),
            relative_attention_max_distance=int(config.get("relative_attention_max_distance", 128)),
            layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-6)),
            # specjax's pad_id is both the decoder's start token and the encoder's padding: MADLAD-400 pads
            # with 1 but starts decoding at 0 (<unk>, never an input id with its byte fallback), so its
            # decoder_start_token_id is read first and inputs are padded (and masked) with it.
            pad_id=int(config.get("decoder_start_token_id", config.get("pad_token_id", 0)) or 0),
            eos_id=int(config.get("eos_token_id", 1)),
            name=str(config.get("_name_or_path", "hf")) or "hf",
        )
        if acts not in (("gelu", "linear"), ("relu",)):
            fields["mlp_activations"] = acts
        if model_type == "umt5":
            fields["per_layer_relpos_bias"] = True
        fields.update(overrides)
        return cls(**fields)

    @property
    def hf_feed_forward_proj(self) -> str:
        """transformers' ``feed_forward_proj`` for this MLP ("relu", "gated-gelu", "gated-silu" …).

        Raises:
          ValueError: an MLP transformers cannot express (second activation not linear).
        """
        acts = self.activations
        if len(acts) == 2 and acts[1] != "linear":
            raise ValueError(
                f"mlp_activations={acts!r} has no transformers feed_forward_proj (it needs (act, 'linear'))."
            )
        name = "gelu" if acts[0] == "gelu" and len(acts) == 2 else _HF_ACT_NAMES[acts[0]]
        return ("gated-" if len(acts) == 2 else "") + name

    def to_hf_config(self) -> dict:
        """The Hugging Face ``config.json`` dict (transformers ``T5Config`` / ``UMT5Config`` fields) for this
        config: ``model_type`` "umt5" for per-layer relative position tables, else "t5"."""
        model_type = "umt5" if self.per_layer_relpos_bias else "t5"
        return {
            "architectures": [
                "UMT5ForConditionalGeneration" if self.per_layer_relpos_bias else "T5ForConditionalGeneration"
            ],
            "model_type": model_type,
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
            "feed_forward_proj": self.hf_feed_forward_proj,
            "is_gated_act": self.is_gated,
            "dense_act_fn": _HF_ACT_NAMES[self.activations[0]],
            "tie_word_embeddings": self.logits_via_embedding,
            "scale_decoder_outputs": self.scales_logits,
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


def _family(name, d, n, f, enc, dec=None, *, vocab, head_dim=64, **fields):
    """A released T5-family size (gated GELU, untied logits unless ``fields`` say otherwise)."""
    base = dict(gated_gelu=True, logits_via_embedding=False)
    base.update(fields)
    return T5Config(
        vocab_size=vocab,
        d_model=d,
        num_heads=n,
        head_dim=head_dim,
        mlp_dim=f,
        num_encoder_layers=enc,
        num_decoder_layers=enc if dec is None else dec,
        name=name,
        **base,
    )


# Shapes of the released checkpoints (their Hugging Face config.json files: google/mt5-*, google/umt5-*,
# google/ul2, google/flan-ul2, google/byt5-*, google/madlad400-*-mt). Parameter counts are checked against
# the published sizes in tests/test_families.py.
_MT5 = 250112  # mT5's SentencePiece vocabulary (250000 pieces + 100 extra ids, padded to a multiple of 128)
_UMT5 = 256384  # umT5's (UniMax) vocabulary
for _name, _d, _n, _f, _l in (
    ("small", 512, 6, 1024, 8),
    ("base", 768, 12, 2048, 12),
    ("large", 1024, 16, 2816, 24),
    ("xl", 2048, 32, 5120, 24),
    ("xxl", 4096, 64, 10240, 24),
):
    # mT5 (Xue et al. 2021): the T5 1.1 shapes with a 250k vocabulary.
    PRESETS[f"mt5_{_name}"] = _family(f"mt5_{_name}", _d, _n, _f, _l, vocab=_MT5)
    if _name != "large":  # umT5 (Chung et al. 2023) was released as small, base, xl and xxl
        PRESETS[f"umt5_{_name}"] = _family(f"umt5_{_name}", _d, _n, _f, _l, vocab=_UMT5, per_layer_relpos_bias=True)
# UL2 20B (Tay et al. 2023) and Flan-UL2: gated SiLU, 256-wide heads, logits through the tied embedding.
for _name in ("ul2", "flan_ul2"):
    PRESETS[_name] = _family(
        _name,
        4096,
        16,
        16384,
        32,
        vocab=32128,
        head_dim=256,
        mlp_activations=("silu", "linear"),
        logits_via_embedding=True,
    )
# ByT5 (Xue et al. 2022, Table 1): 384 ids (256 bytes + 3 specials, padded), encoders 3x deeper than decoders.
for _name, _d, _n, _f, _enc, _dec in (
    ("small", 1472, 6, 3584, 12, 4),
    ("base", 1536, 12, 3968, 18, 6),
    ("large", 1536, 16, 3840, 36, 12),
    ("xl", 2560, 32, 6720, 36, 12),
    ("xxl", 4672, 64, 12352, 36, 12),
):
    PRESETS[f"byt5_{_name}"] = _family(f"byt5_{_name}", _d, _n, _f, _enc, _dec, vocab=384)
# MADLAD-400 MT (Kudugunta et al. 2023): 256k vocabulary, 128-wide heads, eos 2; decoding starts at 0.
for _name, _d, _n, _f, _l in (("3b", 1024, 16, 8192, 32), ("7b", 2048, 16, 8192, 48), ("10b", 2048, 32, 16384, 32)):
    PRESETS[f"madlad400_{_name}"] = _family(
        f"madlad400_{_name}", _d, _n, _f, _l, vocab=256000, head_dim=128, pad_id=0, eos_id=2
    )
