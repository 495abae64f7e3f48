"""The model as the decode loops see it (STYLE.md item 4): a typed callable interface, no model imported.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``k`` window, ``v`` vocab, ``L`` cache length.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

__all__ = ["DecodingModel", "BranchDecodingModel", "as_decoding_model"]

Params = Any


@runtime_checkable
class DecodingModel(Protocol):
    """The pure functions the loops call; a hashable object (frozen dataclass), static under ``jax.jit``.

    Parameters are passed separately (jit arguments, not closures). ``specjax.models.adapter.T5Decoding``
    adapts specjax's T5; tests implement it with hand-made logits (t5x ``decoding_test.py`` style).

    Attributes:
      vocab_size: ``v``.
      pad_id: padding of encoder inputs and the first decoder input token.
    """

    vocab_size: int
    pad_id: int

    def encode(self, params: Params, encoder_input_tokens: jax.Array) -> Any:
        """int32[b, s] -> a pytree the decoder reads (computed once per call)."""

    def decode(
        self, params: Params, encoded: Any, tokens: jax.Array, cache: Any, positions: jax.Array
    ) -> tuple[jax.Array, Any]:
        """tokens int32[b, k] at per-row positions int32[b] -> (logits float[b, k, v], cache)."""

    def init_cache(self, batch: int, length: int) -> Any:
        """An empty cache pytree for ``batch`` rows and ``length`` decoder positions."""


@runtime_checkable
class BranchDecodingModel(DecodingModel, Protocol):
    """A ``DecodingModel`` that can also score several branches per row in one call (multi-draft verification,
    ``speculative_sample(..., num_drafts=k)``) and copy rows of its caches (the draft's branches).

    ``specjax.models.adapter.T5Decoding`` implements it.
    """

    def decode_branches(
        self, params: Params, encoded: Any, tokens: jax.Array, cache: Any, positions: jax.Array
    ) -> tuple[jax.Array, Any]:
        """tokens int32[b, k, w] (k branches of w tokens) at per-row positions int32[b] -> (logits float[b, k, w,
        v], window): each branch attends to the row's cache slots before its position and to its own tokens;
        the cache is not written (``commit_branch`` keeps one branch)."""

    def commit_branch(self, cache: Any, window: Any, branch: jax.Array, positions: jax.Array, width: int) -> Any:
        """The cache with branch int32[b] of ``window`` written at positions int32[b] (``width`` = w slots)."""

    def fork_rows(self, tree: Any, k: int) -> Any:
        """A cache or encoded pytree with every row repeated k times (row i's copies at i·k .. i·k + k − 1)."""

    def take_rows(self, cache: Any, rows: jax.Array) -> Any:
        """The cache's rows int32[b'] (a gather)."""


def as_decoding_model(model, what: str) -> tuple[DecodingModel, Params]:
    """A ``T5Model`` (anything with ``decoding_model()``) or a ``(DecodingModel, params)`` pair ->
    ``(DecodingModel, params)``.

    Raises:
      ValueError: anything else, naming ``what`` ("target", "draft", "model") and how to get a model.
    """
    if hasattr(model, "decoding_model") and callable(model.decoding_model):
        return model.decoding_model()
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], DecodingModel):
        return model
    raise ValueError(
        f"{what} must be a specjax T5Model or a (DecodingModel, params) pair, got "
        f"{type(model).__name__}. Load one with specjax.load_checkpoint(path), "
        "specjax.load_default_pair() or T5Model.random(config)."
    )
