"""The T5 adapter: ``specjax.models.t5`` seen through the decode loops' ``DecodingModel`` interface.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``k`` window, ``v`` vocab, ``L`` cache length.
"""

from __future__ import annotations

import dataclasses

from specjax.models import t5

__all__ = ["T5Decoding"]


@dataclasses.dataclass(frozen=True)
class T5Decoding:
    """``DecodingModel`` for specjax's T5: the config is static (hashable), parameters are jit arguments.

    Attributes:
      config: ``T5Config``.
    """
    config: t5.T5Config

    @property
    def vocab_size(self) -> int:
        """``v``."""
        return self.config.vocab_size

    @property
    def pad_id(self) -> int:
        """Padding id and the decoder start token (T5: 0)."""
        return self.config.pad_id

    def encode(self, params, encoder_input_tokens):
        """int32[b, s] -> ``t5.Encoded`` (see ``specjax.models.t5.encode``)."""
        return t5.encode(self.config, params, encoder_input_tokens)

    def decode(self, params, encoded, tokens, cache, positions):
        """int32[b, k] at int32[b] -> (float32 logits [b, k, v], cache) (``specjax.models.t5.decode``)."""
        return t5.decode(self.config, params, encoded, tokens, cache, positions)

    def init_cache(self, batch, length):
        """An empty cache for ``batch`` rows and ``length`` positions (``specjax.models.t5.init_cache``)."""
        return t5.init_cache(self.config, batch, length)
