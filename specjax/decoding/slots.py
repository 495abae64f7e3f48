"""Decode slots: the compiled programs of bulk decoding (``specjax.bulk``) — insert inputs into free slots, and
run the speculative (or target-alone) loop over every slot until enough of them are done.

Legend for shapes (STYLE.md): ``b`` slots, ``m`` rows inserted at once, ``S`` the slots' encoder width,
``T`` max_decode_length, ``g`` gamma, ``G`` the largest gamma of a run, ``L`` cache length.

The shape is JetStream's and MaxText's offline engine's (``insert(prefix, decode_state, slot)`` with
``dynamic_update_index_in_dim`` and donated buffers, a host loop around a compiled multi-step ``generate``):
a fixed set of ``b`` slots, each holding one input's whole decode state — its encoder memory (target and draft),
caches, position, emitted tokens, done flag, PRNG key, counters and sampling parameters. Two programs:

- ``insert``: encodes ``m`` new inputs (``T5Decoding.encode`` picks the encoder width from them at run time,
  ``ENCODE_WIDTHS``) and writes their memory, a fresh position 0, pad tokens, keys, counters and sampling
  parameters into the chosen slots (``.at[slots].set(..., mode="drop")``: a slot id of ``b`` writes nothing,
  so one program serves every number of rows up to ``m``). The target's cache is not cleared: at position 0
  every slot of a row's cache is stale, and stale slots are masked (exactly zero weight) until overwritten.
- ``run``: the speculative loop's own iteration (``loop.speculative_body``, unchanged) or the target alone's
  one-token step (as ``temperature_sample``'s, with per-row positions) in a ``lax.while_loop`` that stops when at
  least ``min_done`` slots are done or after ``max_iterations`` iterations; finished rows stop changing.

A row's result does not depend on its slot or its neighbours (DESIGN.md, "Bulk decoding and company"): every
per-row quantity (memory, cache, position, key, sampling) lives in the row's slot, the key comes from the
caller (``fold_in(seed, line index)``), and the loop bodies read no other row. At temperature 0 a row's tokens
are the target's greedy decode; sampled, its tokens are those the row gets decoded alone with the same key and γ.

Costs of the other design, refill inside the ``while_loop`` from an on-device queue (not built): every
iteration would carry the whole queue's tokens [q, S] and a conditional encode of up to ``m`` rows (a
``lax.cond`` per iteration, and both the encoder's weights and a second set of buffers live inside the loop),
and the loop could no longer hand finished rows back before the queue ends without a host callback; on a CPU,
where one ``run`` of a few dozen iterations takes ~0.1-1 s, the host round trip it saves is a few milliseconds
per refill (an estimate: that design was not built, so not measured).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax.decoding.drafts import DraftSource, decoder_input_at
from specjax.decoding.inputs import DecodeConfig, split_rows, target_cache_length
from specjax.decoding.loop import SpecState, speculative_body
from specjax.decoding.model import DecodingModel
from specjax.decoding.result import Counters
from specjax.decoding.xla_cpu import cpu_compiler_options, program_platform, weights_dtype
from specjax.sampling import SamplingParams

__all__ = ["Slots", "SlotPrograms", "target_body"]


class Slots(NamedTuple):
    """The state of ``b`` decode slots (a pytree; the programs donate it).

    Attributes:
      encoded: the target's encoder output for the slots' inputs (``DecodingModel.encode``; width ``S``).
      draft_context: the draft source's context (``DraftSource.start``), None for the target alone.
      state: ``SpecState`` (the loop's carry: caches, positions int32[b], sequences int32[b, T], done bool[b],
        keys uint32[b, 2], ``Counters`` with ``accepted_per_position`` int32[b, G]); ``draft_carry`` None for the
        target alone. An empty slot is done.
      sampling: ``SamplingParams`` [b] of each slot's row.
    """

    encoded: Any
    draft_context: Any
    state: SpecState
    sampling: SamplingParams


def target_body(target: DecodingModel, config: DecodeConfig, params, encoded, sampling: SamplingParams):
    """The target alone's iteration over slots, ``SpecState -> SpecState``: one token per unfinished row at its own
    position. The same per-row arithmetic as ``temperature_sample``'s step (``baseline.decode_step``, key split,
    ``sample_next``, the EOS and length rules), so a row's tokens equal that call's for the row's key;
    ``target_calls`` counts the row's tokens."""
    from specjax.decoding.baseline import decode_step, sample_next

    T, pad_id = config.max_decode_length, target.pad_id

    def body(state: SpecState) -> SpecState:
        n = state.positions
        b = n.shape[0]
        with jax.named_scope("step"):
            token_b1 = decoder_input_at(state.sequences, n, pad_id)[:, None]
            logits, cache = decode_step(target, params, encoded, token_b1, state.target_cache, n)
        with jax.named_scope("sample"):
            next_keys, sample_keys = split_rows(state.keys, 2)
            token = sample_next(sample_keys, logits, sampling)
            active = ~state.done
            idx = jnp.where(active, n, T)  # T is out of bounds: dropped
            sequences = state.sequences.at[jnp.arange(b), idx].set(token, mode="drop")
            positions = n + active.astype(jnp.int32)
            done = state.done | (active & ((token == config.eos_id) | (positions >= T)))
        c = state.counters
        counters = c._replace(target_calls=c.target_calls + active.astype(jnp.int32))
        return state._replace(
            target_cache=cache, positions=positions, sequences=sequences, done=done, keys=next_keys, counters=counters
        )

    return body


def _batch_axes(make, *args):
    """The batch axis of every leaf of ``make(rows, *args)``'s pytree (found by comparing 1 and 2 rows)."""
    one, two = jax.eval_shape(lambda: make(1, *args)), jax.eval_shape(lambda: make(2, *args))

    def axis(a, b):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        return diff[0] if diff else None

    return jax.tree.map(axis, one, two)


@jax.jit
def _widen(old: Slots, new: Slots) -> Slots:
    """``old`` written at offset 0 into every leaf of ``new`` whose shape differs (a wider encoder memory)."""
    grow = lambda o, n: jax.lax.dynamic_update_slice(n, o, (0,) * n.ndim) if o.shape != n.shape else o
    return jax.tree.map(grow, old, new)


class SlotPrograms:
    """The compiled slot programs of one bulk run: fixed models, slot count ``b``, ``T``, ``G`` and cache length.

    Attributes:
      target, draft: ``DecodingModel`` and draft source (None: the target alone).
      batch: ``b`` slots. max_decode_length: ``T``. max_gamma: ``G`` (0: the target alone).
      eos_id, verification: as ``speculative_sample``.
      cache_length: ``L`` (``target_cache_length(T, G)``, the length every loop gives the target's cache).
    """

    def __init__(
        self,
        target: DecodingModel,
        draft: DraftSource | None,
        *,
        batch: int,
        max_decode_length: int,
        max_gamma: int,
        eos_id: int,
        verification: str = "token",
    ):
        self.target, self.draft, self.batch = target, draft, batch
        self.max_decode_length, self.max_gamma = max_decode_length, max_gamma if draft is not None else 0
        self.eos_id, self.verification = eos_id, verification
        self.cache_length = target_cache_length(max_decode_length, self.max_gamma)  # as speculative_sample's
        self._run = {}
        self._insert = {}
        self._empty = {}

    _shared: dict = {}

    @classmethod
    def shared(cls, target, draft, **settings) -> "SlotPrograms":
        """The ``SlotPrograms`` for these models and settings, made once per process (the last 8 kept), so every
        bulk run of the same shape reuses its compiled programs."""
        key = (target, draft, tuple(sorted(settings.items())))
        if key not in cls._shared:
            while len(cls._shared) >= 8:
                cls._shared.pop(next(iter(cls._shared)))
            cls._shared[key] = cls(target, draft, **settings)
        return cls._shared[key]

    # --- building blocks (traced) ----------------------------------------------------------------------------
    def _fresh(self, rows: int, target_params, draft_params, tokens, keys, sampling) -> Slots:
        """The slot state of ``rows`` new inputs ``tokens`` int32[rows, S]: encoded, position 0, not done."""
        T, L, G = self.max_decode_length, self.cache_length, self.max_gamma
        encoded = self.target.encode(target_params, tokens)
        context, carry = None, None
        if self.draft is not None:
            context, carry = self.draft.start(draft_params, tokens, L)
        state = SpecState(
            self.target.init_cache(rows, L),
            carry,
            jnp.zeros((rows,), jnp.int32),
            jnp.full((rows, T), self.target.pad_id, jnp.int32),
            jnp.zeros((rows,), bool),
            keys,
            Counters.zeros(rows, G),
        )
        return Slots(encoded, context, state, sampling)

    def _fresh_shapes(self, rows, target_params, draft_params, width):
        tokens = jnp.zeros((rows, width), jnp.int32)
        return self._fresh(
            rows, target_params, draft_params, tokens, jnp.zeros((rows, 2), jnp.uint32), SamplingParams.broadcast(rows)
        )

    def _options(self, params, rows: int):
        return cpu_compiler_options(rows, weights_dtype(params), program_platform(params), self.batch)

    # --- programs ---------------------------------------------------------------------------------------------
    def empty(self, target_params, draft_params, width: int) -> Slots:
        """``b`` empty slots of encoder width ``width`` (every slot done, greedy, pad inputs)."""
        if width not in self._empty:

            def make(target_params, draft_params):
                b = self.batch
                tokens = jnp.full((b, width), self.target.pad_id, jnp.int32)
                slots = self._fresh(
                    b,
                    target_params,
                    draft_params,
                    tokens,
                    jnp.zeros((b, 2), jnp.uint32),
                    SamplingParams.broadcast(b, 0.0),
                )
                return slots._replace(state=slots.state._replace(done=jnp.ones((b,), bool)))

            self._empty[width] = jax.jit(make)
        return self._empty[width](target_params, draft_params)

    def widen(self, target_params, draft_params, slots: Slots, width: int) -> Slots:
        """``slots`` with their encoder memory padded to ``width`` (> the current one): every leaf that has a
        length axis is written into an empty slot state of the new width at offset 0 (the new positions are
        masked pad positions, as an input encoded at that width has)."""
        wider = self.empty(target_params, draft_params, width)
        return _widen(slots, wider)

    def insert(self, target_params, draft_params, slots: Slots, tokens, slot_ids, keys, sampling) -> Slots:
        """Writes ``m`` new inputs into the given slots (compiled once per ``m`` and width; ``slots`` donated).

        Args:
          slots: the current ``Slots`` (width ``S``).
          tokens: int32[m, S] inputs, right-padded with ``pad_id``.
          slot_ids: int32[m] the slot of each row; ``b`` for a row to drop (padding of the group).
          keys: uint32[m, 2] each row's key (``fold_in(seed, line index)``).
          sampling: ``SamplingParams`` [m].
        Returns:
          the new ``Slots``.
        """
        m, width = tokens.shape
        key = (m, width)
        if key not in self._insert:
            axes = _batch_axes(lambda r: self._fresh_shapes(r, target_params, draft_params, width))

            def write(slots, tokens, slot_ids, keys, sampling, target_params, draft_params):
                new = self._fresh(tokens.shape[0], target_params, draft_params, tokens, keys, sampling)

                def put(old, fresh, axis):
                    if axis is None:
                        return old
                    index = (slice(None),) * axis + (slot_ids,)
                    return old.at[index].set(fresh, mode="drop")

                # The target's cache is left as it is: at position 0 every slot is stale (masked, then overwritten).
                new_state = new.state._replace(target_cache=slots.state.target_cache)
                axes_state = axes.state._replace(target_cache=jax.tree.map(lambda _: None, axes.state.target_cache))
                new = new._replace(state=new_state)
                axes_all = axes._replace(state=axes_state)
                return jax.tree.map(put, slots, new, axes_all, is_leaf=lambda x: x is None)

            self._insert[key] = jax.jit(write, donate_argnums=(0,))
        return self._insert[key](slots, tokens, slot_ids, keys, sampling, target_params, draft_params)

    def run(self, target_params, draft_params, slots: Slots, gamma: int, min_done: int, max_iterations: int):
        """Runs the loop over the slots until at least ``min_done`` are done (empty slots count) or after
        ``max_iterations`` iterations (``slots`` donated).

        Args:
          gamma: 0 (the target alone) or 1..G draft tokens per iteration (static: one program each, and one
            compile per slot width).
          min_done, max_iterations: int (traced: one program serves every value).
        Returns:
          (``Slots``, int32[] iterations run).
        """
        key = gamma
        if key not in self._run:
            T, G = self.max_decode_length, self.max_gamma
            config = DecodeConfig(T, gamma, self.eos_id, self.verification)

            def program(slots, min_done, max_iterations, target_params, draft_params):
                b = self.batch
                if gamma == 0:
                    body = target_body(self.target, config, target_params, slots.encoded, slots.sampling)
                else:
                    body = speculative_body(
                        self.target,
                        self.draft,
                        config,
                        target_params,
                        draft_params,
                        slots.encoded,
                        slots.draft_context,
                        slots.sampling,
                    )
                state = slots.state
                per_position = state.counters.accepted_per_position  # [b, G]
                state = state._replace(
                    counters=state.counters._replace(accepted_per_position=jnp.zeros((b, config.gamma), jnp.int32))
                )

                def cond(carry):
                    i, s = carry
                    return (i < max_iterations) & (jnp.sum(s.done.astype(jnp.int32)) < min_done)

                i, state = jax.lax.while_loop(cond, lambda c: (c[0] + 1, body(c[1])), (jnp.int32(0), state))
                got = state.counters.accepted_per_position
                per_position = per_position + jnp.pad(got, ((0, 0), (0, G - got.shape[1])))
                state = state._replace(counters=state.counters._replace(accepted_per_position=per_position))
                return slots._replace(state=state), i

            options = self._options(target_params, self.batch * max(gamma + 1, 2))  # γ 0: STEP_WINDOW tokens
            self._run[key] = jax.jit(program, donate_argnums=(0,), compiler_options=options)
        return self._run[key](slots, jnp.int32(min_done), jnp.int32(max_iterations), target_params, draft_params)
