"""The one table that maps t5x parameter names to Hugging Face ``T5ForConditionalGeneration`` names.

Every checkpoint reader goes through this module, which fails loudly (STYLE.md item 9, after t5x
``checkpoint_importer`` and nanoGPT ``from_pretrained``):

- every source key must match a rule (or be a known alias / a key transformers itself ignores);
- every parameter of ``specjax.models.t5.abstract_params(config)`` must be present;
- every shape is checked against the config *before* any transpose.

Layouts (shape legend of STYLE.md): t5x kernels are ``[in, out]`` (``query/kernel`` [d, n*h],
``out/kernel`` [n*h, d], ``wi/kernel`` [d, f], ``wo/kernel`` [f, d], ``logits_dense/kernel`` [d, v],
``relpos_bias/rel_embedding`` [n, buckets]); Hugging Face ``nn.Linear`` weights are ``[out, in]`` and
``relative_attention_bias`` is an ``nn.Embedding`` [buckets, n] -- so all of those are transposed.
Embeddings (``[v, d]``) and RMSNorm scales (``[d]``) are not. Hugging Face keeps the relative position
table in block 0 of each stack only, as t5x keeps one per stack; umT5 (``per_layer_relpos_bias``) has one in
every block, t5x ``<stack>/layers_<i>/relpos_bias/rel_embedding``. The same table serves ``model_type`` t5,
mt5 and umt5 (transformers' three classes share their state-dict keys).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np

from specjax.config import T5Config
from specjax.models.t5 import abstract_params

__all__ = [
    "CheckpointError",
    "Rule",
    "RULES",
    "HF_ALIASES",
    "HF_IGNORED",
    "flatten",
    "unflatten",
    "expected_shapes",
    "check_t5x_params",
    "hf_to_t5x",
    "t5x_to_hf",
]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as the model it claims to be: unknown or missing keys, wrong
    shapes, truncated or corrupt files, or a folder with no recognisable checkpoint."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One tensor's names in both formats.

    Attributes:
      t5x: t5x name with ``/`` separators, ``{i}`` standing for a layer index.
      hf: Hugging Face state-dict key with ``{i}`` for the block index.
      transpose: True when the Hugging Face tensor is the transpose of the t5x one (2-D only).
      when: predicate on the config; the rule applies only where it is True (e.g. gated MLPs).
    """

    t5x: str
    hf: str
    transpose: bool
    when: Callable[[T5Config], bool] = lambda cfg: True

    @staticmethod
    def _regex(pattern: str) -> re.Pattern:
        return re.compile("^" + re.escape(pattern).replace(r"\{i\}", r"(\d+)") + "$")

    def match_hf(self, key: str) -> str | None:
        """The t5x name for Hugging Face ``key``, or None when this rule does not match."""
        m = self._regex(self.hf).match(key)
        return None if m is None else self.t5x.replace("{i}", m.group(1)) if m.groups() else self.t5x

    def match_t5x(self, name: str) -> str | None:
        """The Hugging Face key for t5x ``name``, or None when this rule does not match."""
        m = self._regex(self.t5x).match(name)
        return None if m is None else self.hf.replace("{i}", m.group(1)) if m.groups() else self.hf


def _gated(cfg: T5Config) -> bool:
    return cfg.is_gated


def _relu(cfg: T5Config) -> bool:  # one input kernel ``wi`` (its activation relu or another)
    return not cfg.is_gated


def _untied(cfg: T5Config) -> bool:
    return not cfg.logits_via_embedding


def _shared_relpos(cfg: T5Config) -> bool:
    return not cfg.per_layer_relpos_bias


def _per_layer_relpos(cfg: T5Config) -> bool:
    return cfg.per_layer_relpos_bias


def _attention(t5x_prefix: str, hf_prefix: str) -> list[Rule]:
    names = (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
    return [Rule(f"{t5x_prefix}/{a}/kernel", f"{hf_prefix}.{b}.weight", True) for a, b in names]


def _mlp(t5x_prefix: str, hf_prefix: str) -> list[Rule]:
    return [
        Rule(f"{t5x_prefix}/wi/kernel", f"{hf_prefix}.wi.weight", True, _relu),
        Rule(f"{t5x_prefix}/wi_0/kernel", f"{hf_prefix}.wi_0.weight", True, _gated),
        Rule(f"{t5x_prefix}/wi_1/kernel", f"{hf_prefix}.wi_1.weight", True, _gated),
        Rule(f"{t5x_prefix}/wo/kernel", f"{hf_prefix}.wo.weight", True),
    ]


_E = "encoder.block.{i}.layer"
_D = "decoder.block.{i}.layer"

RULES: tuple[Rule, ...] = tuple(
    [
        Rule("token_embedder/embedding", "shared.weight", False),
        # Encoder stack.
        Rule(
            "encoder/relpos_bias/rel_embedding",
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            True,
            _shared_relpos,
        ),
        # umT5: every layer's own table (transformers UMT5 keeps one in every block).
        Rule(
            "encoder/layers_{i}/relpos_bias/rel_embedding",
            f"{_E}.0.SelfAttention.relative_attention_bias.weight",
            True,
            _per_layer_relpos,
        ),
        Rule("encoder/layers_{i}/pre_attention_layer_norm/scale", f"{_E}.0.layer_norm.weight", False),
        *_attention("encoder/layers_{i}/attention", f"{_E}.0.SelfAttention"),
        Rule("encoder/layers_{i}/pre_mlp_layer_norm/scale", f"{_E}.1.layer_norm.weight", False),
        *_mlp("encoder/layers_{i}/mlp", f"{_E}.1.DenseReluDense"),
        Rule("encoder/encoder_norm/scale", "encoder.final_layer_norm.weight", False),
        # Decoder stack.
        Rule(
            "decoder/relpos_bias/rel_embedding",
            "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            True,
            _shared_relpos,
        ),
        Rule(
            "decoder/layers_{i}/relpos_bias/rel_embedding",
            f"{_D}.0.SelfAttention.relative_attention_bias.weight",
            True,
            _per_layer_relpos,
        ),
        Rule("decoder/layers_{i}/pre_self_attention_layer_norm/scale", f"{_D}.0.layer_norm.weight", False),
        *_attention("decoder/layers_{i}/self_attention", f"{_D}.0.SelfAttention"),
        Rule("decoder/layers_{i}/pre_cross_attention_layer_norm/scale", f"{_D}.1.layer_norm.weight", False),
        *_attention("decoder/layers_{i}/encoder_decoder_attention", f"{_D}.1.EncDecAttention"),
        Rule("decoder/layers_{i}/pre_mlp_layer_norm/scale", f"{_D}.2.layer_norm.weight", False),
        *_mlp("decoder/layers_{i}/mlp", f"{_D}.2.DenseReluDense"),
        Rule("decoder/decoder_norm/scale", "decoder.final_layer_norm.weight", False),
        Rule("decoder/logits_dense/kernel", "lm_head.weight", True, _untied),
    ]
)
"""The mapping, t5x <-> Hugging Face. Sources: t5x ``examples/t5/network.py`` (names, kernel layouts) and
transformers ``models/t5/modeling_t5.py`` (state-dict keys)."""

HF_ALIASES: Mapping[str, str] = {
    "encoder.embed_tokens.weight": "shared.weight",
    "decoder.embed_tokens.weight": "shared.weight",
}
"""Hugging Face keys that hold the same tensor as another key (tied in transformers). When present they
must equal their target bit for bit. ``lm_head.weight`` is also an alias of ``shared.weight`` when the
logits go through the embedding (T5 1.0)."""

HF_IGNORED: tuple[str, ...] = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)
"""Keys transformers itself ignores on load (``_keys_to_ignore_on_load_unexpected``): some old exports
carry an unused cross-attention position table."""


# ----------------------------------------------------------------------------------------------------------
# Pytree helpers


def flatten(params: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Nested dict -> ``{"encoder/layers_0/attention/query/kernel": array, ...}``."""
    out: dict[str, Any] = {}

    def walk(node, prefix):
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, f"{prefix}{sep}{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(params, "")
    return out


def unflatten(flat: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Inverse of ``flatten``."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        node = out
        *parents, leaf = name.split(sep)
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def expected_shapes(config: T5Config) -> dict[str, tuple[int, ...]]:
    """t5x name -> shape of every parameter the model built from ``config`` has (from
    ``specjax.models.t5.abstract_params``; nothing is allocated)."""
    return {k: tuple(v.shape) for k, v in flatten(abstract_params(config)).items()}


def _shape_hint(config: T5Config) -> str:
    return (
        f"config: vocab_size={config.vocab_size}, d_model={config.d_model}, num_heads={config.num_heads}, "
        f"head_dim={config.head_dim}, mlp_dim={config.mlp_dim}, "
        f"layers={config.num_encoder_layers}/{config.num_decoder_layers}, "
        f"relative_attention_num_buckets={config.relative_attention_num_buckets}"
    )


def _listing(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names)
    more = f" … and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def check_t5x_params(flat: Mapping[str, Any], config: T5Config, source: str) -> None:
    """Checks a flat t5x-named parameter dict against ``config``: same names, same shapes.

    Raises:
      CheckpointError: unknown names, missing names, or shapes that differ (the message names them,
        the expected shape and the config).
    """
    expected = expected_shapes(config)
    unknown = set(flat) - set(expected)
    if unknown:
        raise CheckpointError(
            f"{source}: parameters not in a {config.family} T5 with this config: {_listing(unknown)}. "
            f"Is it a T5 encoder-decoder checkpoint? ({_shape_hint(config)})"
        )
    missing = set(expected) - set(flat)
    if missing:
        raise CheckpointError(f"{source}: missing parameters {_listing(missing)} ({_shape_hint(config)}).")
    for name, shape in expected.items():
        got = tuple(np.shape(flat[name]))
        if got != shape:
            raise CheckpointError(
                f"{source}: parameter {name!r} has shape {got}, but the config expects {shape} "
                f"({_shape_hint(config)}). The checkpoint and its config disagree."
            )


def _rule_for_hf(key: str, config: T5Config) -> tuple[Rule, str] | None:
    for rule in RULES:
        if rule.when(config):
            name = rule.match_hf(key)
            if name is not None:
                return rule, name
    return None


def hf_to_t5x(
    tensors: Mapping[str, Any], config: T5Config, source: str = "checkpoint", dtype: Any = None
) -> dict[str, np.ndarray]:
    """Hugging Face state dict -> flat t5x-named parameters (numpy), checked against ``config``.

    Args:
      tensors: key -> array-like (numpy arrays or memory maps) in Hugging Face layout.
      config: the model config (from the checkpoint's ``config.json``).
      source: the file name, for messages.
      dtype: when given, cast every tensor to this numpy dtype after the checks.
    Returns:
      ``{t5x name: np.ndarray}`` in t5x layout (Linear weights transposed to ``[in, out]``).
    Raises:
      CheckpointError: keys no rule maps, keys the config does not expect (e.g. a layer index past
        ``num_layers``), missing keys, shape mismatches (checked before transposing), aliases whose
        value differs from their target.
    """
    expected = expected_shapes(config)
    out: dict[str, np.ndarray] = {}
    aliases = dict(HF_ALIASES)
    if config.logits_via_embedding:
        aliases["lm_head.weight"] = "shared.weight"
    unmapped, unexpected, alias_keys = [], [], []
    for key in tensors:
        if key in HF_IGNORED:
            continue
        if key in aliases:
            alias_keys.append(key)
            continue
        found = _rule_for_hf(key, config)
        if found is None:
            unmapped.append(key)
            continue
        rule, name = found
        if name not in expected:
            unexpected.append(key)
            continue
        value = tensors[key]
        want = expected[name][::-1] if rule.transpose else expected[name]
        got = tuple(np.shape(value))
        if got != want:
            raise CheckpointError(
                f"{source}: {key!r} has shape {got}, but {_shape_hint(config)} expects {want} "
                f"(t5x {name!r} {expected[name]}). The weights and config.json disagree: fix config.json "
                "or use the config the checkpoint was saved with."
            )
        arr = np.asarray(value)
        arr = np.ascontiguousarray(arr.T) if rule.transpose else np.array(arr)
        out[name] = arr if dtype is None else arr.astype(dtype)
    if unmapped:
        raise CheckpointError(
            f"{source}: keys no rule maps to a specjax T5 parameter: {_listing(unmapped)}. specjax reads "
            "T5ForConditionalGeneration / MT5ForConditionalGeneration / UMT5ForConditionalGeneration checkpoints; "
            "wi needs a plain feed_forward_proj ('relu'), wi_0/wi_1 a gated one ('gated-gelu', 'gated-silu'), "
            "and a relative_attention_bias in every block needs model_type 'umt5' in config.json."
        )
    if unexpected:
        raise CheckpointError(
            f"{source}: keys the config does not expect: {_listing(unexpected)} ({_shape_hint(config)}). "
            "Does config.json match the weights?"
        )
    for key in alias_keys:
        target = aliases[key]
        if target not in tensors:  # e.g. only encoder.embed_tokens.weight was saved
            if "token_embedder/embedding" not in out:
                tensors_target = np.asarray(tensors[key])
                out["token_embedder/embedding"] = (
                    tensors_target if dtype is None else tensors_target.astype(dtype)
                ).copy()
            continue
        if not np.array_equal(np.asarray(tensors[key]), np.asarray(tensors[target])):
            if key == "lm_head.weight":
                raise CheckpointError(
                    f"{source}: lm_head.weight differs from shared.weight, but the config ties them "
                    "(logits_via_embedding). Load it with specjax.load_checkpoint (which reads such a head as "
                    "untied with logits_scaling), or pass a config with logits_via_embedding=False."
                )
            raise CheckpointError(f"{source}: {key} should equal {target} (tied in transformers) but differs.")
    if (
        not config.logits_via_embedding
        and "decoder/logits_dense/kernel" not in out
        and "token_embedder/embedding" in out
    ):
        # transformers >= 5 ties lm_head to shared and saves only shared.weight (scale_decoder_outputs false).
        out["decoder/logits_dense/kernel"] = np.ascontiguousarray(out["token_embedder/embedding"].T)
    missing = set(expected) - set(out)
    if missing:
        names = [t5x_to_hf_name(n, config) for n in missing]
        raise CheckpointError(
            f"{source}: missing keys {_listing(names)} ({_shape_hint(config)}). Is the file complete?"
        )
    return out


def t5x_to_hf_name(name: str, config: T5Config) -> str:
    """The Hugging Face key of t5x parameter ``name``.

    Raises:
      CheckpointError: no rule maps ``name``.
    """
    for rule in RULES:
        if rule.when(config):
            key = rule.match_t5x(name)
            if key is not None:
                return key
    raise CheckpointError(f"No rule maps t5x parameter {name!r} to a Hugging Face key.")


def t5x_to_hf(params: Mapping[str, Any], config: T5Config) -> dict[str, np.ndarray]:
    """specjax / t5x parameters (nested or flat dict) -> Hugging Face state dict (numpy, HF layout).

    Checks names and shapes against ``config`` first. Writes ``shared.weight`` once (transformers ties
    ``encoder/decoder.embed_tokens``) and ``lm_head.weight`` only for untied heads.

    Raises:
      CheckpointError: names or shapes that do not match ``config``.
    """
    flat = flatten(params) if any(isinstance(v, Mapping) for v in params.values()) else dict(params)
    check_t5x_params(flat, config, "model parameters")
    out = {}
    for name, value in flat.items():
        key = t5x_to_hf_name(name, config)
        rule = next(r for r in RULES if r.when(config) and r.match_t5x(name) is not None)
        arr = np.asarray(jax.device_get(value))
        out[key] = np.ascontiguousarray(arr.T) if rule.transpose else arr
    return out
