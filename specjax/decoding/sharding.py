"""Logical axis names -> mesh axes, and the decoding model pinned to a mesh: what the slot programs
(``specjax.decoding.slots``) and ``specjax.parallel`` both place by.

The rules table (``STANDARD_RULES``, t5x's standard logical axis rules; ``logical_to_mesh_spec``), the
``DecodingModel`` wrapper that pins a ``T5Decoding``'s encoder outputs, caches and logits to a ``("data",
"model")`` mesh (``mesh_decoding_model``, ``mesh_draft_source``), and the shardings of per-row arrays and of a
``t5.Encoded`` / ``t5.KVCache`` (``batch_sharding``, ``activation_shardings``). It imports the model adapter and
the draft sources, never ``specjax.parallel`` (which imports it). Sources: the JAX sharding guides
(``jax.sharding.NamedSharding``), t5x ``partitioning.py`` (``standard_logical_axis_rules``).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``l`` layers, ``L`` cache length, ``n`` heads,
``h`` head dim, ``v`` vocab, ``k`` branches, ``w`` branch width.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specjax.decoding.drafts import ModelDraft
from specjax.models import t5
from specjax.models.adapter import T5Decoding

__all__ = [
    "Rules",
    "DATA",
    "MODEL",
    "STANDARD_RULES",
    "logical_to_mesh_spec",
    "mesh_decoding_model",
    "mesh_draft_source",
    "activation_shardings",
    "batch_sharding",
]


Rules = tuple[tuple[str, "str | None"], ...]
"""A logical-to-mesh rules table: ``((logical_name, mesh_axis_or_None), ...)``, one entry per name."""


DATA, MODEL = "data", "model"


STANDARD_RULES: Rules = (
    # t5x partitioning.standard_logical_axis_rules (1-D model parallelism): batch over "data", the wide
    # dimensions of attention / MLP / vocabulary over "model", the model width replicated.
    ("batch", DATA),
    ("vocab", MODEL),
    ("mlp", MODEL),
    ("heads", MODEL),
    ("joined_kv", MODEL),
    ("embed", None),
    ("relpos_buckets", None),
    # Activation-only names (decoder caches, encoder outputs).
    ("layers", None),
    ("length", None),
    ("kv", None),
)
"""The default rules: t5x's standard logical axis rules for a ``("data", "model")`` mesh."""


def _check_rules(rules: Rules, mesh: Mesh) -> dict[str, str | None]:
    table: dict[str, str | None] = {}
    for entry in rules:
        if not (
            isinstance(entry, tuple)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and (entry[1] is None or isinstance(entry[1], str))
        ):
            raise ValueError(f"Rules entry {entry!r} must be a (logical_name, mesh_axis_or_None) pair.")
        name, axis = entry
        if name in table:
            raise ValueError(
                f"Rules map logical axis {name!r} twice ({table[name]!r} and {axis!r}); give each "
                "logical name exactly one mesh axis (or None to replicate)."
            )
        if axis is not None and axis not in mesh.axis_names:
            raise ValueError(
                f"Rules map logical axis {name!r} to mesh axis {axis!r}, which the mesh lacks "
                f"(its axes: {mesh.axis_names})."
            )
        table[name] = axis
    return table


def logical_to_mesh_spec(
    logical: Sequence[str | None], rules: Rules, mesh: Mesh, *, what: str = "tensor", shape: Sequence[int] | None = None
) -> P:
    """Maps one tensor's logical axis names to a mesh ``PartitionSpec`` through ``rules``.

    Args:
      logical: one logical name (or None: replicated) per tensor dimension, e.g. ``("embed", "mlp")``.
      rules: the rules table (``STANDARD_RULES``).
      mesh: the mesh the spec is for.
      what: the tensor's name, for messages.
      shape: if given, each sharded dimension must divide by its mesh axis size.
    Returns:
      ``PartitionSpec`` of mesh axis names (None where replicated), e.g. ``P(None, "model")``.
    Raises:
      ValueError: a logical name missing from the rules; two dimensions of one tensor mapped to the same
        mesh axis (a collision: one mesh axis can split a tensor only once); a dimension that does not
        divide by its mesh axis size.
    """
    table = _check_rules(rules, mesh)
    out: list[str | None] = []
    used: dict[str, str] = {}
    for dim, name in enumerate(logical):
        if name is None:
            out.append(None)
            continue
        if name not in table:
            raise ValueError(
                f"{what}: logical axis {name!r} has no rule; add ({name!r}, None) to the rules to "
                f"replicate it or ({name!r}, 'model') to split it."
            )
        axis = table[name]
        if axis is not None:
            if axis in used:
                raise ValueError(
                    f"{what}: logical axes {used[axis]!r} and {name!r} both map to mesh axis {axis!r}; a mesh "
                    f"axis can split a tensor only once. Map one of them to None in the rules."
                )
            used[axis] = name
            if shape is not None and shape[dim] % mesh.shape[axis]:
                raise ValueError(
                    f"{what}: dimension {dim} ({name!r}, size {shape[dim]}) does not divide by mesh axis "
                    f"{axis!r} of size {mesh.shape[axis]}. Use a 'model' size that divides it, or map {name!r} "
                    "to None in the rules."
                )
        out.append(axis)
    return P(*out)


def _drop_axis(rules: Rules, keep: str) -> Rules:
    """``rules`` with every mesh axis but ``keep`` replaced by None (e.g. a draft replicated over "model")."""
    return tuple((name, axis if axis == keep else None) for name, axis in rules)


_PER_LAYER = ("batch", "heads", "length", "kv")  # t5's per-layer caches and cross values: [b, n, L | s, h]


def _encoded_axes(encoded: t5.Encoded) -> t5.Encoded:
    """Logical axes of ``t5.Encoded`` (``t5.ENCODED_AXES`` per layer: mask [b, s]; cross keys [b, n, h, s],
    values [b, n, s, h]; stacked memory [l, ...] of scanned layers: ``t5.stacked_logical_axes``)."""
    if not isinstance(encoded.cross_k, tuple):
        return t5.stacked_logical_axes(encoded)
    return t5.Encoded(
        t5.ENCODED_AXES.mask,
        tuple(t5.ENCODED_AXES.cross_k for _ in encoded.cross_k),
        tuple(t5.ENCODED_AXES.cross_v for _ in encoded.cross_v),
    )


def _cache_axes(cache: t5.KVCache) -> t5.KVCache:
    """Logical axes of ``t5.KVCache`` (per-layer k, v [b, n, L, h]; stacked [l, b, n, L, h]: with "layers")."""
    if not isinstance(cache.k, tuple):
        return t5.stacked_logical_axes(cache)
    return t5.KVCache(tuple(_PER_LAYER for _ in cache.k), tuple(_PER_LAYER for _ in cache.v))


@dataclasses.dataclass(frozen=True)
class _MeshT5Decoding:
    """``T5Decoding`` plus ``with_sharding_constraint`` on what the loop carries (encoder outputs and caches:
    batch over data, heads over model) and on the logits [b, k, v] (batch only: the vocabulary is gathered
    once per call before sampling); a ``BranchDecodingModel`` too, so ``num_drafts`` > 1 runs on a mesh."""

    inner: T5Decoding
    mesh: Mesh
    rules: Rules

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def pad_id(self) -> int:
        return self.inner.pad_id

    def _pin(self, x, logical):
        spec = logical_to_mesh_spec(logical, self.rules, self.mesh, what="activation")
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def _pin_tree(self, tree, axes):
        # axes mirror ``tree`` down to its arrays; each array's entry is a tuple of logical names.
        return jax.tree_util.tree_map(self._pin, tree, axes)

    def encode(self, params, encoder_input_tokens):
        encoded = self.inner.encode(params, encoder_input_tokens)
        return self._pin_tree(encoded, _encoded_axes(encoded))

    @property
    def query_rows(self) -> bool:
        return getattr(self.inner, "query_rows", False)

    def decode(self, params, encoded, tokens, cache, positions, **kwargs):
        logits, cache = self.inner.decode(params, encoded, tokens, cache, positions, **kwargs)
        return self._pin(logits, ("batch", None, None)), self._pin_tree(cache, _cache_axes(cache))

    def init_cache(self, batch, length):
        cache = self.inner.init_cache(batch, length)
        return self._pin_tree(cache, _cache_axes(cache))

    # Multi-draft verification (``num_drafts`` > 1): the branch window's logits [b, k, w, v] batch only, the caches
    # as above; a branch window's keys/values [(l,) b, k · w, n, h] are left to the partitioner (used once, then
    # committed).
    def decode_branches(self, params, encoded, tokens, cache, positions):
        logits, window = self.inner.decode_branches(params, encoded, tokens, cache, positions)
        return self._pin(logits, ("batch", None, None, None)), window

    def commit_branch(self, cache, window, branch, positions, width: int):
        cache = self.inner.commit_branch(cache, window, branch, positions, width)
        return self._pin_tree(cache, _cache_axes(cache))

    def fork_rows(self, tree, k: int):
        return self.inner.fork_rows(tree, k)

    def take_rows(self, cache, rows):
        cache = self.inner.take_rows(cache, rows)
        return self._pin_tree(cache, _cache_axes(cache))


def mesh_decoding_model(fns, mesh: Mesh, rules: Rules = STANDARD_RULES):
    """``fns`` as a bulk decode over ``mesh`` runs it: a ``T5Decoding`` gets the activation constraints of
    ``model_parallel_sample`` (encoder outputs and caches batch over "data", heads over "model"; logits batch
    over "data"); any other ``DecodingModel`` is returned unchanged (its activations follow its inputs)."""
    return _MeshT5Decoding(fns, mesh, tuple(rules)) if isinstance(fns, T5Decoding) else fns


def mesh_draft_source(source, mesh: Mesh, rules: Rules = STANDARD_RULES, shard_draft: bool = False):
    """A draft source (``ModelDraft``, ``PromptLookupDraft``, None) for a bulk decode over ``mesh``: a draft
    model's activations batch over "data" and, unless ``shard_draft``, replicated over "model" (as
    ``model_parallel_sample`` treats the draft); a source without a model is returned unchanged."""
    if not isinstance(source, ModelDraft):
        return source
    draft_rules = tuple(rules) if shard_draft else _drop_axis(tuple(rules), DATA)
    return dataclasses.replace(source, model=mesh_decoding_model(source.model, mesh, draft_rules))


def activation_shardings(tree, mesh: Mesh, rules: Rules = STANDARD_RULES):
    """``NamedSharding``s for a ``t5.Encoded`` or ``t5.KVCache`` (what ``_MeshT5Decoding`` pins them to: batch
    over "data", heads over "model" by ``rules``), or None for any other tree."""
    if isinstance(tree, t5.Encoded):
        axes = _encoded_axes(tree)
    elif isinstance(tree, t5.KVCache):
        axes = _cache_axes(tree)
    else:
        return None
    spec = lambda x, logical: NamedSharding(mesh, logical_to_mesh_spec(logical, rules, mesh, what="activation"))
    return jax.tree_util.tree_map(spec, tree, axes)  # axes mirror ``tree`` down to its arrays, as in ``_pin_tree``


def batch_sharding(mesh: Mesh, ndim: int, axis: int | None) -> NamedSharding:
    """The sharding of a per-row array of ``ndim`` dimensions whose rows are on ``axis``: rows over "data",
    the rest replicated (``axis`` None: all replicated)."""
    spec = [None] * ndim
    if axis is not None:
        spec[axis] = DATA
    return NamedSharding(mesh, P(*spec))
