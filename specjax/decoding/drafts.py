"""Draft sources: where the γ proposed tokens of an iteration come from. One interface (``DraftSource``).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``g`` gamma,
``v`` vocab, ``L`` cache length.

``ModelDraft``: a small draft model samples ``x_1..x_g`` autoregressively (Leviathan et al. 2023, Alg. 1).
Its cache invariant (per row, ``n`` = tokens emitted so far; the decoder input sequence is ``d[0] = pad_id``,
``d[j] = sequences[j - 1]``): the draft cache holds ``d[0..n-2]`` at the start of an iteration (one slot less
than the target's: after a full accept it never consumed ``x_g``), so its first step each iteration is a
2-token window ``[d[n-1], d[n]]`` at positions ``n-1, n`` (at ``n = 0``: ``[d[0], d[0]]`` at ``0, 1``, the stale
slot 1 being rewritten later), then ``g - 1`` one-token steps feed ``x_1..x_{g-1}``. Rolling back a rejected
suffix is just the next iteration's smaller ``n``: stale slots are masked, then overwritten.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from specjax.decoding.verify import Proposal
from specjax.sampling import SamplingParams, sample_rows

__all__ = ["DraftSource", "ModelDraft", "decoder_input_at"]


def decoder_input_at(sequences: jax.Array, j: jax.Array, pad_id: int) -> jax.Array:
    """``d[j]`` per row: ``pad_id`` at j = 0, else ``sequences[j - 1]``. sequences int32[b, T], j int32[b]."""
    prev = jnp.take_along_axis(sequences, jnp.maximum(j - 1, 0)[:, None], axis=1)[:, 0]
    return jnp.where(j == 0, pad_id, prev).astype(jnp.int32)


class DraftSource(Protocol):
    """A way to propose γ tokens per row per iteration (a frozen dataclass, static under jit).

    ``start`` runs once per call before the loop: (context the proposals read, initial carry). ``propose``
    runs once per iteration: (``Proposal``, new carry).
    """

    def start(self, params, encoder_input_tokens: jax.Array, cache_length: int) -> tuple[Any, Any]:
        ...

    def propose(self, params, context, carry, sequences: jax.Array, positions: jax.Array, keys: jax.Array,
                sampling: SamplingParams, gamma: int) -> tuple[Proposal, Any]:
        ...


def _draw(keys, logits, sampling: SamplingParams):
    """One token per row and the distribution it came from: keys uint32[b, 2], logits float[b, v] ->
    (int32[b], float32[b, v]). All rows greedy: the argmax, p left as zeros (the verifier's greedy branch
    does not read it)."""
    def greedy(_):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), jnp.zeros(logits.shape, jnp.float32)

    def sampled(_):
        p = sampling.probs(logits)
        return sample_rows(keys, p), p

    return jax.lax.cond(sampling.all_greedy(), greedy, sampled, None)


@dataclasses.dataclass(frozen=True)
class ModelDraft:
    """A draft model (any ``DecodingModel``): γ autoregressive steps per iteration, p from its own logits.

    Attributes:
      model: the draft's ``DecodingModel`` (its params are passed to ``start`` / ``propose``).
    """
    model: Any

    def start(self, params, encoder_input_tokens, cache_length):
        """(encoded inputs, empty cache [.., b, L, ..])."""
        b = encoder_input_tokens.shape[0]
        return self.model.encode(params, encoder_input_tokens), self.model.init_cache(b, cache_length)

    def propose(self, params, encoded, cache, sequences, positions, keys, sampling, gamma):
        """keys uint32[g, b, 2] (one per draft step) -> (``Proposal`` with p float32[b, g, v], cache)."""
        pad_id, n, b = self.model.pad_id, positions, positions.shape[0]
        start = jnp.maximum(n - 1, 0)
        window = jnp.stack([decoder_input_at(sequences, start, pad_id), decoder_input_at(sequences, n, pad_id)], 1)
        logits2, cache = self.model.decode(params, encoded, window, cache, start)  # [b, 2, v]
        x1, p1 = _draw(keys[0], logits2[jnp.arange(b), n - start], sampling)

        def step(carry, key):
            cache, x_prev, pos = carry  # x_prev [b] sits at decoder position pos [b]
            logits, cache = self.model.decode(params, encoded, x_prev[:, None], cache, pos)
            x, p = _draw(key, logits[:, 0], sampling)
            return (cache, x, pos + 1), (x, p)

        (cache, _, _), (xs, ps) = jax.lax.scan(step, (cache, x1, n + 1), keys[1:gamma])
        tokens = jnp.concatenate([x1[:, None], jnp.swapaxes(xs, 0, 1)], axis=1)  # [b, g]
        probs = jnp.concatenate([p1[:, None], jnp.swapaxes(ps, 0, 1)], axis=1)  # [b, g, v]
        return Proposal(tokens, probs, jnp.full((b,), gamma, jnp.int32)), cache
