"""Draft sources: where the γ proposed tokens of an iteration come from. One interface (``DraftSource``).

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``g`` gamma,
``v`` vocab, ``L`` cache length.

``ModelDraft``: a small draft model samples ``x_1..x_g`` autoregressively (Leviathan et al. 2023, Alg. 1).
Its cache invariant (per row, ``n`` = tokens emitted so far; the decoder input sequence is ``d[0] = pad_id``,
``d[j] = sequences[j - 1]``): the draft cache holds ``d[0..n-2]`` at the start of an iteration, and also
``d[n-1]`` unless the previous iteration accepted every draft (the draft never consumed ``x_g``). Its carry
records which: ``limit`` int32[b], the first slot it has not written (``n + g`` after drafting from ``n``),
so ``d[n-1]`` is in the cache iff ``n <= limit``. Its first step each iteration is therefore one token
``d[n]`` at position ``n`` when every row has ``n <= limit``, else (some row accepted all) a 2-token window
``[d[n-1], d[n]]`` at positions ``n-1, n`` (rewriting ``d[n-1]`` where it was already there); a run-time
``lax.cond``. On this CPU a 2-row window of the small draft costs 1.4x a one-token step alone and ~2x beside
the target (measured on a 2-core AMD EPYC, Zen 4), and at α ≈ 0.8 and γ 3-5 most iterations reject a draft.
Then ``g - 1`` one-token steps feed ``x_1..x_{g-1}``. Rolling back a rejected suffix is just the next
iteration's smaller ``n``: stale slots are masked, then overwritten.

``ModelDraft(confidence_threshold=c)`` drafts ``L <= g`` tokens per row (a nested while loop, shapes fixed at
``g``): the cache then holds correct slots up to ``n + L - 1`` (``limit = n + L``), and the next iteration
starts at ``n' <= n + L + 1``, so it needs slots ``<= n' - 2 <= n + L - 1``, and ``n' - 1`` too unless
``n' > limit``; what a stopped row writes in later steps lands in stale slots (masked, then overwritten), and
the invariant holds.

``PromptLookupDraft``: no model; copies the tokens that followed the most recent earlier occurrence of the
row's last emitted n-gram in its encoder input or its own output (Saxena 2023, "prompt lookup decoding";
Hugging Face's ``prompt_lookup_num_tokens``, vLLM's n-gram proposer). Its proposal is a point mass.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from specjax.decoding.verify import Proposal
from specjax.sampling import SamplingParams, argmax, sample_rows

__all__ = ["DraftSource", "ModelDraft", "PromptLookupDraft", "decoder_input_at"]


def decoder_input_at(sequences: jax.Array, j: jax.Array, pad_id: int) -> jax.Array:
    """``d[j]`` per row: ``pad_id`` at j = 0, else ``sequences[j - 1]``. sequences int32[b, T], j int32[b]."""
    prev = jnp.take_along_axis(sequences, jnp.maximum(j - 1, 0)[:, None], axis=1)[:, 0]
    return jnp.where(j == 0, pad_id, prev).astype(jnp.int32)


class DraftSource(Protocol):
    """A way to propose γ tokens per row per iteration (a frozen dataclass, static under jit).

    ``start`` runs once per call before the loop: (context the proposals read, initial carry). ``propose``
    runs once per iteration: (``Proposal``, new carry).
    """

    def start(self, params, encoder_input_tokens: jax.Array, cache_length: int) -> tuple[Any, Any]: ...

    def propose(
        self,
        params,
        context,
        carry,
        sequences: jax.Array,
        positions: jax.Array,
        keys: jax.Array,
        sampling: SamplingParams,
        gamma: int,
    ) -> tuple[Proposal, Any]: ...


def _draw_greedy(keys, logits, sampling: SamplingParams):
    """Every row greedy: (the argmax int32[b], p float32[b, v] left as zeros: the verifier's greedy branch does
    not read it)."""
    return argmax(logits), jnp.zeros(logits.shape, jnp.float32)


def _draw_sampled(keys, logits, sampling: SamplingParams):
    """One token per row from its warped distribution p (one-hot on greedy rows): (int32[b], p float32[b, v])."""
    p = sampling.probs(logits)
    return sample_rows(keys, p), p


def _draw(keys, logits, sampling: SamplingParams):
    """One token per row and the distribution it came from: keys uint32[b, 2], logits float[b, v] ->
    (int32[b], float32[b, v]). All rows greedy: the argmax, p left as zeros (the verifier's greedy branch
    does not read it); chosen at run time (``lax.cond``)."""
    return jax.lax.cond(
        sampling.all_greedy(),
        lambda _: _draw_greedy(keys, logits, sampling),
        lambda _: _draw_sampled(keys, logits, sampling),
        None,
    )


def _confidence(logits, x, p, sampling: SamplingParams):
    """float32[b]: how sure the draft is of its token x int32[b]: its p at x (warped, the distribution x was
    drawn from); on greedy rows (p one-hot there) the softmax probability of x at temperature 1 instead."""
    raw = jnp.take_along_axis(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), x[:, None], axis=1)[:, 0]
    drawn = jnp.take_along_axis(p, x[:, None], axis=1)[:, 0]
    return jnp.where(sampling.temperature <= 0, raw, drawn)


@dataclasses.dataclass(frozen=True)
class ModelDraft:
    """A draft model (any ``DecodingModel``): γ autoregressive steps per iteration, p from its own logits.

    Attributes:
      model: the draft's ``DecodingModel`` (its params are passed to ``start`` / ``propose``).
      confidence_threshold: None (draft γ tokens every iteration), or a float in [0, 1]: each row stops
        drafting after a token whose confidence is below it (adaptive γ, as Hugging Face's
        ``assistant_confidence_threshold``; SpecDec++, DISCO). Confidence is the draft's probability of its own
        token under the distribution it was drawn from (warped p); on greedy rows, where that p is one-hot,
        the softmax probability of the argmax at temperature 1. Convention (Hugging Face's): the
        low-confidence token is kept and drafting stops after it, so every row drafts 1 to γ tokens; a row
        also stops when its next token would be past ``max_decode_length``. The draft steps are a nested
        ``while_loop`` that ends when every row has stopped. Exact with either verifier (the length is a
        stopping time of the drafts). Static: each value compiles its own program.
    Raises:
      ValueError: a threshold that is not a number in [0, 1].
    """

    model: Any
    confidence_threshold: float | None = None

    def __post_init__(self):
        c = self.confidence_threshold
        if c is not None and (isinstance(c, bool) or not isinstance(c, numbers.Real) or not 0.0 <= c <= 1.0):
            raise ValueError(
                f"draft_confidence_threshold must be None or a number in [0, 1], got {c!r}; "
                "try 0.3 to 0.6 (None drafts gamma tokens every iteration)."
            )
        if c is not None:
            object.__setattr__(self, "confidence_threshold", float(c))

    def start(self, params, encoder_input_tokens, cache_length):
        """(encoded inputs, carry): the carry is (empty cache [.., b, L, ..], ``limit`` int32[b] zeros: no slot
        written yet)."""
        b = encoder_input_tokens.shape[0]
        return (
            self.model.encode(params, encoder_input_tokens),
            (self.model.init_cache(b, cache_length), jnp.zeros((b,), jnp.int32)),
        )

    def _catch_up(self, params, encoded, cache, sequences, n, limit):
        """The draft's logits at position ``n`` (float32[b, v]) and its cache holding ``d[0..n]``: one token
        ``d[n]`` at ``n`` when every row already holds ``d[n-1]`` (``n <= limit``), else the 2-token window
        ``[d[n-1], d[n]]`` at ``n-1, n`` (at ``n = 0``: ``[d[0], d[0]]`` at ``0, 1``, slot 1 stale). Chosen at
        run time (``lax.cond``)."""
        pad_id, b = self.model.pad_id, n.shape[0]

        def one(cache):
            logits, cache = self.model.decode(
                params, encoded, decoder_input_at(sequences, n, pad_id)[:, None], cache, n
            )
            return logits[:, 0], cache

        def two(cache):
            start = jnp.maximum(n - 1, 0)
            window = jnp.stack(
                [decoder_input_at(sequences, start, pad_id), decoder_input_at(sequences, n, pad_id)], 1
            )  # [b, 2]
            logits2, cache = self.model.decode(params, encoded, window, cache, start)  # [b, 2, v]
            return logits2[jnp.arange(b), n - start], cache

        return jax.lax.cond(jnp.any(n > limit), two, one, cache)

    def propose(self, params, encoded, carry, sequences, positions, keys, sampling, gamma):
        """carry (cache, limit int32[b]), keys uint32[g, b, 2] (one per draft step) -> (``Proposal`` with
        p float32[b, g, v], (cache, limit))."""
        n, b = positions, positions.shape[0]
        cache, limit = carry
        first_logits, cache = self._catch_up(params, encoded, cache, sequences, n, limit)  # [b, v]
        if self.confidence_threshold is not None:
            x1, p1 = _draw(keys[0], first_logits, sampling)
            proposal, cache = self._propose_until_unsure(
                params, encoded, cache, sequences, n, keys, sampling, gamma, first_logits, x1, p1
            )
            return proposal, (cache, n + proposal.lengths)

        def steps(draw, cache):
            """The γ draws, the first from the catch-up window's logits, then γ − 1 one-token steps."""
            x1, p1 = draw(keys[0], first_logits, sampling)

            def step(carry, key):
                cache, x_prev, pos = carry  # x_prev [b] sits at decoder position pos [b]
                logits, cache = self.model.decode(params, encoded, x_prev[:, None], cache, pos)
                x, p = draw(key, logits[:, 0], sampling)
                return (cache, x, pos + 1), (x, p)

            (cache, _, _), (xs, ps) = jax.lax.scan(step, (cache, x1, n + 1), keys[1:gamma])
            tokens = jnp.concatenate([x1[:, None], jnp.swapaxes(xs, 0, 1)], axis=1)  # [b, g]
            probs = jnp.concatenate([p1[:, None], jnp.swapaxes(ps, 0, 1)], axis=1)  # [b, g, v]
            return tokens, probs, cache

        # Greedy or sampled is chosen once per iteration, not once per draft step: a conditional inside the
        # scan body costs its dispatch γ times per iteration (measured:
        # benchmarks/results/loop_overhead/2026-12-03_loop_overhead.md).
        tokens, probs, cache = jax.lax.cond(
            sampling.all_greedy(), lambda c: steps(_draw_greedy, c), lambda c: steps(_draw_sampled, c), cache
        )
        return Proposal(tokens, probs, jnp.full((b,), gamma, jnp.int32)), (cache, n + gamma)

    def _propose_until_unsure(self, params, encoded, cache, sequences, n, keys, sampling, gamma, first_logits, x1, p1):
        """Confidence-stopped drafting: slot i is drafted while every earlier token was confident enough
        (and the slot is within max_decode_length). A nested while_loop over slots 1..g-1 that ends when every
        row has stopped; undrafted slots hold token 0 and p = 0, ``lengths`` counts the drafted slots."""
        b, v, T = n.shape[0], first_logits.shape[-1], sequences.shape[1]
        threshold = self.confidence_threshold
        tokens = jnp.zeros((b, gamma), jnp.int32).at[:, 0].set(x1)
        probs = jnp.zeros((b, gamma, v), jnp.float32).at[:, 0].set(p1)
        going = (_confidence(first_logits, x1, p1, sampling) >= threshold) & (n + 1 < T)  # draft slot 1?

        def cond(carry):
            i, going = carry[0], carry[-1]
            return (i < gamma) & jnp.any(going)

        def body(carry):
            i, cache, x_prev, tokens, probs, lengths, going = carry  # x_prev [b] sits at position n + i
            logits, cache = self.model.decode(params, encoded, x_prev[:, None], cache, n + i)
            x, p = _draw(keys[i], logits[:, 0], sampling)
            tokens = tokens.at[:, i].set(jnp.where(going, x, 0))
            probs = probs.at[:, i].set(jnp.where(going[:, None], p, 0.0))
            lengths = lengths + going.astype(jnp.int32)
            confident = _confidence(logits[:, 0], x, p, sampling) >= threshold
            going = going & confident & (n + i + 1 < T)
            return i + 1, cache, x, tokens, probs, lengths, going

        init = (jnp.int32(1), cache, x1, tokens, probs, jnp.ones((b,), jnp.int32), going)
        _, cache, _, tokens, probs, lengths, _ = jax.lax.while_loop(cond, body, init)
        return Proposal(tokens, probs, lengths), cache


@dataclasses.dataclass(frozen=True)
class PromptLookupDraft:
    """Prompt-lookup (n-gram) drafting: no draft model (Saxena 2023, "prompt lookup decoding"; Hugging Face's
    ``prompt_lookup_num_tokens``, vLLM's n-gram speculator). Use it in place of a draft model:
    ``speculative_sample(target, PromptLookupDraft(max_ngram=3), x, gamma=..., ...)``.

    Per row and iteration: for n from ``max_ngram`` down to ``min_ngram``, look for the most recent earlier
    occurrence of the row's last n emitted tokens in its own output so far, else in its encoder input (the
    latest position wins: output before input, later before earlier); the first n with a match proposes the
    up-to-γ tokens that followed it (within the same segment: the input's real tokens, or the output emitted
    so far). No match (or fewer than ``min_ngram`` tokens emitted): ``lengths`` 0, and the iteration emits the
    target's own token alone. The proposal is a point mass (``probs=None``, p one-hot), so token and block
    verification stay exact. Everything is fixed-shape ``jnp``: a [b, s + 1 + T] comparison per n-gram size.

    Attributes:
      max_ngram: the longest n-gram tried (tokens), >= min_ngram.
      min_ngram: the shortest n-gram tried (tokens), >= 1.
      pad_id: the encoder inputs' padding (never matched nor copied); T5's is 0.
    Raises:
      ValueError: n-gram sizes out of range.
    """

    max_ngram: int = 3
    min_ngram: int = 1
    pad_id: int = 0

    def __post_init__(self):
        for name in ("max_ngram", "min_ngram", "pad_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "pad_id" else 1):
                raise ValueError(
                    f"PromptLookupDraft.{name} must be an int >= {0 if name == 'pad_id' else 1}, got "
                    f"{value!r}; max_ngram=3, min_ngram=1 is the usual choice."
                )
        if self.min_ngram > self.max_ngram:
            raise ValueError(
                f"PromptLookupDraft needs min_ngram <= max_ngram, got {self.min_ngram} > {self.max_ngram}."
            )

    def start(self, params, encoder_input_tokens, cache_length):
        """(the encoder input with padding replaced by -1: int32[b, s], no carry)."""
        tokens = jnp.asarray(encoder_input_tokens).astype(jnp.int32)
        return jnp.where(tokens == self.pad_id, -1, tokens), None

    def propose(self, params, context, carry, sequences, positions, keys, sampling, gamma):
        """context int32[b, s], sequences int32[b, T], positions int32[b] ``n`` -> (``Proposal`` with
        tokens int32[b, g], probs None, lengths int32[b] in [0, g]; carry unchanged)."""
        b, T = sequences.shape
        n = positions
        t = jnp.arange(T)[None, :]
        out = jnp.where(t < n[:, None], sequences, -1)  # [b, T] emitted tokens, -1 after
        # The haystack: input, a separator, output; -1 (never a token) marks what may not be matched or copied.
        hay = jnp.concatenate([context, jnp.full((b, 1), -1, jnp.int32), out], axis=1)  # [b, S]
        S = hay.shape[1]
        width = self.max_ngram + gamma
        hay_pad = jnp.concatenate([hay, jnp.full((b, width), -1, jnp.int32)], axis=1)  # [b, S + width]
        shifted = jnp.stack([hay_pad[:, k : k + S] for k in range(width)], axis=1)  # [b, width, S]: hay[j + k]
        start = jnp.arange(S)[None, :]

        found = jnp.zeros((b,), bool)
        follow = jnp.zeros((b,), jnp.int32)  # hay index of the first copied token
        for m in range(self.max_ngram, self.min_ngram - 1, -1):
            last = jnp.take_along_axis(
                sequences, jnp.clip(n[:, None] - m + jnp.arange(m)[None, :], 0, T - 1), axis=1
            )  # [b, m] the last m emitted tokens
            match = shifted[:, m] >= 0  # at least one token follows the occurrence
            for k in range(m):
                match = match & (shifted[:, k] == last[:, k : k + 1])
            match = match & (n >= m)[:, None]
            latest = jnp.max(jnp.where(match, start, -1), axis=1)  # [b]
            use = ~found & (latest >= 0)
            follow = jnp.where(use, latest + m, follow)
            found = found | use
        idx = follow[:, None] + jnp.arange(gamma)[None, :]  # [b, g]
        tokens = jnp.take_along_axis(hay_pad, idx, axis=1)
        copied = jnp.cumprod((tokens >= 0).astype(jnp.int32), axis=1) * found[:, None]  # [b, g]
        lengths = jnp.sum(copied, axis=1).astype(jnp.int32)
        tokens = jnp.where(copied > 0, tokens, 0).astype(jnp.int32)
        return Proposal(tokens, None, lengths), carry
