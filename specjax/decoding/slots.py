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

from specjax.decoding import sharding
from specjax.decoding.baseline import decode_step, sample_next
from specjax.decoding.drafts import DraftSource, decoder_input_at
from specjax.decoding.inputs import DecodeConfig, split_rows, target_cache_length
from specjax.decoding.loop import SpecState, speculative_body
from specjax.decoding.model import DecodingModel
from specjax.decoding.result import Counters
from specjax.decoding.stored import StoredJit
from specjax.decoding.xla_cpu import cpu_compiler_options, program_platform, weights_dtype
from specjax.sampling import SamplingParams

__all__ = ["Slots", "SlotPrograms", "check_slot_mesh", "target_body"]


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


def encode_alone(model: DecodingModel, params, tokens, count=None):
    """``model.encode(params, tokens)`` with every row encoded as a batch of one (a loop over the rows):
    int32[m, S] -> the encoder output of m rows, each bit for bit what the row alone gives.

    XLA:CPU's encoder program rounds a row's output differently when other rows share the call (the shipped small
    pair: float32 from 2 rows, bfloat16 from 4 rows of width 64 on; every element of one cross-attention layer's
    keys can move in the last bit), and a near-tie in the decoder then parts the greedy output of a line inserted
    with others from the line decoded alone. Encoding each row alone keeps a line's output independent of the rows
    inserted with it (DESIGN.md, "Bulk decoding and company"); the work is the same, in m calls of one row.

    Args:
      count: int32[] (traced or static), the rows to encode: the first ``count`` rows (None: all ``m``); the
        other rows' outputs are zeros. One program then serves every number of new rows up to ``m``.
    The batch axis of each output leaf is found from its shapes at 1 and 2 rows (0, or 1 for stacked layers).
    """
    m = tokens.shape[0]
    one = jax.eval_shape(lambda t: model.encode(params, t), jax.ShapeDtypeStruct((1,) + tokens.shape[1:], tokens.dtype))
    two = jax.eval_shape(lambda t: model.encode(params, t), jax.ShapeDtypeStruct((2,) + tokens.shape[1:], tokens.dtype))
    axes = jax.tree.map(lambda a, b: next(i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y), one, two)

    def zeros(x, axis):  # the m-row shape of a one-row leaf
        shape = list(x.shape)
        shape[axis] = m
        return jnp.zeros(shape, x.dtype)

    def body(i, out):
        row = model.encode(params, jax.lax.dynamic_slice_in_dim(tokens, i, 1, 0))
        return jax.tree.map(lambda o, r, axis: jax.lax.dynamic_update_slice_in_dim(o, r, i, axis), out, row, axes)

    return jax.lax.fori_loop(0, m if count is None else count, body, jax.tree.map(zeros, one, axes))


def target_body(target: DecodingModel, config: DecodeConfig, params, encoded, sampling: SamplingParams):
    """The target alone's iteration over slots, ``SpecState -> SpecState``: one token per unfinished row at its own
    position. The same per-row arithmetic as ``temperature_sample``'s step (``baseline.decode_step``, key split,
    ``sample_next``, the EOS and length rules), so a row's tokens equal that call's for the row's key;
    ``target_calls`` counts the row's tokens."""
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


def _batch_axes(make, *args, rows: tuple[int, int] = (1, 2)):
    """The batch axis of every leaf of ``make(rows, *args)``'s pytree (found by comparing two row counts: 1 and 2,
    or two multiples of a mesh's data axis, which the activation constraints of a sharded model need)."""
    one = jax.eval_shape(lambda *a: make(rows[0], *a), *args)  # args as arguments: abstract parameters work too
    two = jax.eval_shape(lambda *a: make(rows[1], *a), *args)

    def axis(a, b):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        return diff[0] if diff else None

    return jax.tree.map(axis, one, two)


def _widen(old: Slots, new: Slots) -> Slots:
    """``old`` written at offset 0 into every leaf of ``new`` whose shape differs (a wider encoder memory)."""
    grow = lambda o, n: jax.lax.dynamic_update_slice(n, o, (0,) * n.ndim) if o.shape != n.shape else o
    return jax.tree.map(grow, old, new)


def _collect(slots: Slots, slot_ids):
    """The finished rows ``slot_ids`` int32[m] of ``slots``: sequences int32[m, T], lengths int32[m] and the
    ``LineResult`` counters [m] (target_calls, draft_tokens, accepted, num_verified int32; beta_sum float32)."""
    st, c = slots.state, slots.state.counters
    take = lambda x: jnp.take(x, slot_ids, axis=0)
    return dict(
        sequences=take(st.sequences),
        lengths=take(st.positions),
        target_calls=take(c.target_calls),
        draft_tokens=take(c.draft_tokens),
        accepted=take(c.accepted),
        beta_sum=take(c.beta_sum),
        num_verified=take(c.num_verified),
    )


class SlotPrograms:
    """The compiled slot programs of one bulk run: fixed models, slot count ``b``, ``T``, ``G`` and cache length.

    On a ``("data", "model")`` mesh (``specjax.parallel.make_mesh``) the slots are split over "data" (``b / D``
    per data group, ``D`` the data size) and the target over "model" exactly as ``model_parallel_sample`` splits
    them: the same activation constraints (``parallel.mesh_decoding_model``; a draft model replicated over "model",
    ``parallel.mesh_draft_source``) and the caller's parameters placed by ``parallel.place_decoding_params``. Every
    program is compiled with the slots' shardings as its in and out shardings, so the slot state stays on the
    devices, split, from one call to the next; the host reads back the done flags [b] after a run and the
    finished rows' tokens (``collect``), nothing else. The loop is one program over the mesh: its stop test is
    one all-reduced count, so the data groups step together.

    Attributes:
      target, draft: ``DecodingModel`` and draft source (None: the target alone), wrapped for the mesh if any.
      batch: ``b`` slots. max_decode_length: ``T``. max_gamma: ``G`` (0: the target alone).
      eos_id, verification: as ``speculative_sample``.
      cache_length: ``L`` (``target_cache_length(T, G)``, the length every loop gives the target's cache).
      mesh: the mesh or None (one device). row_multiple: ``D`` (1 without a mesh): rows inserted or collected at
        once come in multiples of it.
    Raises:
      ValueError: a mesh without the axes ("data", "model"), or ``b`` not a multiple of its data size (the
        message names the nearest batch sizes that are).
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
        mesh=None,
        rules=None,
    ):
        self.mesh, self.rules, self.row_multiple = mesh, rules, 1
        if mesh is not None:
            self.rules = tuple(sharding.STANDARD_RULES if rules is None else rules)
            check_slot_mesh(mesh, batch)
            self.row_multiple = mesh.shape[sharding.DATA]
            target = sharding.mesh_decoding_model(target, mesh, self.rules)
            draft = sharding.mesh_draft_source(draft, mesh, self.rules)
        self.target, self.draft, self.batch = target, draft, batch
        self.max_decode_length, self.max_gamma = max_decode_length, max_gamma if draft is not None else 0
        self.eos_id, self.verification = eos_id, verification
        self.cache_length = target_cache_length(max_decode_length, self.max_gamma)  # as speculative_sample's
        self._run = {}
        self._insert = {}
        self._empty = {}
        self._widen = None
        self._shardings = None  # the slots' NamedShardings (the same for every encoder width)
        self._collect = None
        devices = None if mesh is None else [d.id for d in mesh.devices.flat]
        self._identity = (target, draft, batch, max_decode_length, self.max_gamma, eos_id, verification, devices)
        self._identity += (self.rules,)

    _shared: dict = {}

    @classmethod
    def shared(cls, target, draft, **settings) -> "SlotPrograms":
        """The ``SlotPrograms`` for these models and settings (``mesh`` and ``rules`` included), made once per
        process (the last 8 kept), so every bulk run of the same shape reuses its compiled programs."""
        key = (target, draft, tuple(sorted(settings.items())))
        if key not in cls._shared:
            while len(cls._shared) >= 8:
                cls._shared.pop(next(iter(cls._shared)))
            cls._shared[key] = cls(target, draft, **settings)
        return cls._shared[key]

    # --- building blocks (traced) ----------------------------------------------------------------------------
    def _fresh(self, rows: int, target_params, draft_params, tokens, keys, sampling, count=None) -> Slots:
        """The slot state of ``rows`` new inputs ``tokens`` int32[rows, S]: encoded, position 0, not done (on one
        device only the first ``count`` rows are encoded, int32[] or None for all; the others are dropped)."""
        T, L, G = self.max_decode_length, self.cache_length, self.max_gamma
        alone = self.mesh is None and rows > 1  # one device: each new row encoded as a batch of 1 (encode_alone)
        encoded = (
            encode_alone(self.target, target_params, tokens, count)
            if alone
            else self.target.encode(target_params, tokens)
        )
        context, carry = None, None
        if self.draft is not None:
            context, carry = self.draft.start(draft_params, tokens, L)
            if alone and hasattr(self.draft, "model"):  # a draft model: its encoder too (sampled draws use it)
                context = encode_alone(self.draft.model, draft_params, tokens, count)
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

    def _batch_axes(self, target_params, draft_params, width):
        d = self.row_multiple
        make = lambda r, tp, dp: self._fresh_shapes(r, tp, dp, width)  # noqa: E731
        return _batch_axes(make, target_params, draft_params, rows=(d, 2 * d))

    def slot_shardings(self, target_params, draft_params, width: int = 16):
        """The ``Slots`` of ``NamedSharding``s of the ``b`` slots on the mesh (None without one): every per-row
        leaf's rows over "data", the target's encoder output and cache also heads over "model"
        (``parallel.activation_shardings``, what the model's own constraints pin them to). A ``PartitionSpec``
        names axes, not sizes, so one tree serves every encoder width (``width`` only traces the shapes)."""
        if self.mesh is None:
            return None
        if self._shardings is None:
            shapes = jax.eval_shape(
                lambda tp, dp: self._fresh_shapes(self.batch, tp, dp, width), target_params, draft_params
            )
            axes = self._batch_axes(target_params, draft_params, width)
            per_row = lambda x, a: sharding.batch_sharding(self.mesh, len(x.shape), a)  # noqa: E731
            out = jax.tree.map(per_row, shapes, axes)
            encoded = sharding.activation_shardings(shapes.encoded, self.mesh, self.rules)
            cache = sharding.activation_shardings(shapes.state.target_cache, self.mesh, self.rules)
            if encoded is not None:
                out = out._replace(encoded=encoded)
            if cache is not None:
                out = out._replace(state=out.state._replace(target_cache=cache))
            self._shardings = out
        return self._shardings

    def _stored(self, fn, name: str, **kwargs) -> StoredJit:
        """``jax.jit(fn, **kwargs)`` kept on disk (``specjax.decoding.stored``), keyed by these slots' models and
        settings (``name`` tells the programs of one ``SlotPrograms`` apart)."""
        return StoredJit(fn, name=f"slots.{name}", identity=(name, self._identity), **kwargs)

    def _jit(self, fn, slots_in, slots_out, params, *, n_host: int, name: str, **kwargs):
        """``jax.jit(fn)`` (kept on disk, ``_stored``) with in/out shardings on the mesh: ``fn(slots, *host_args,
        target_params, draft_params)``; ``slots_in`` / ``slots_out`` the slots' shardings (None: not an argument /
        output other than slots), ``n_host`` small host arguments (replicated), parameters where they are
        placed."""
        if self.mesh is None:
            return self._stored(fn, name, **kwargs)
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        replicated = NamedSharding(self.mesh, P())
        placed = lambda tree: jax.tree.map(lambda x: x.sharding, tree)  # noqa: E731
        ins = ((slots_in,) if slots_in is not None else ()) + (replicated,) * n_host + tuple(map(placed, params))
        return self._stored(fn, name, in_shardings=ins, out_shardings=slots_out, **kwargs)

    # --- programs ---------------------------------------------------------------------------------------------
    def empty(self, target_params, draft_params, width: int) -> Slots:
        """``b`` empty slots of encoder width ``width`` (every slot done, greedy, pad inputs)."""
        if width not in self._empty:

            def make(target_params, draft_params):
                # Zeros of the slot state's shapes (an empty slot is done: its values are never read into a
                # live row, and the encoders need not run), pad outputs, greedy sampling.
                b = self.batch
                shapes = jax.eval_shape(
                    lambda tp, dp: self._fresh_shapes(b, tp, dp, width), target_params, draft_params
                )
                slots = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
                state = slots.state._replace(
                    sequences=jnp.full((b, self.max_decode_length), self.target.pad_id, jnp.int32),
                    done=jnp.ones((b,), bool),
                )
                return slots._replace(state=state, sampling=SamplingParams.broadcast(b, 0.0))

            out = self.slot_shardings(target_params, draft_params, width)
            self._empty[width] = self._jit(
                make, None, out, (target_params, draft_params), n_host=0, name=f"empty[{width}]"
            )
        return self._empty[width](target_params, draft_params)

    def widen(self, target_params, draft_params, slots: Slots, width: int) -> Slots:
        """``slots`` with their encoder memory padded to ``width`` (> the current one): every leaf that has a
        length axis is written into an empty slot state of the new width at offset 0 (the new positions are
        masked pad positions, as an input encoded at that width has)."""
        wider = self.empty(target_params, draft_params, width)
        if self._widen is None:
            sh = self.slot_shardings(target_params, draft_params, width)
            self._widen = (
                self._stored(_widen, "widen")
                if sh is None
                else self._stored(_widen, "widen", in_shardings=(sh, sh), out_shardings=sh)
            )
        return self._widen(slots, wider)

    def insert(self, target_params, draft_params, slots: Slots, tokens, slot_ids, keys, sampling, count=None) -> Slots:
        """Writes ``m`` new inputs into the given slots (compiled once per ``m`` and width; ``slots`` donated).

        Args:
          slots: the current ``Slots`` (width ``S``).
          tokens: int32[m, S] inputs, right-padded with ``pad_id``; on a mesh ``m`` is a multiple of
            ``row_multiple`` (the new rows are encoded split over "data").
          slot_ids: int32[m] the slot of each row; ``b`` for a row to drop (padding of the group).
          keys: uint32[m, 2] each row's key (``fold_in(seed, line index)``).
          sampling: ``SamplingParams`` [m].
          count: int, the rows in use (the first ``count``; the others have slot id ``b``), None: ``m``. On one
            device only those rows are encoded, so one program of ``m = b`` rows serves every refill of a width;
            on a mesh every row is (batched, split over "data").
        Returns:
          the new ``Slots``.
        Raises:
          ValueError: on a mesh, ``m`` not a multiple of ``row_multiple``.
        """
        m, width = tokens.shape
        if m % self.row_multiple:
            raise ValueError(
                f"insert: {m} rows do not split over the mesh's data axis of size {self.row_multiple}; pad the "
                f"group to a multiple of it with slot id {self.batch} (dropped)."
            )
        key = (m, width)
        if key not in self._insert:

            def write(slots, tokens, slot_ids, keys, sampling, count, target_params, draft_params):
                axes = self._batch_axes(target_params, draft_params, width)  # traced here: a loaded program skips it
                new = self._fresh(tokens.shape[0], target_params, draft_params, tokens, keys, sampling, count)

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

            sh = self.slot_shardings(target_params, draft_params, width)
            self._insert[key] = self._jit(
                write, sh, sh, (target_params, draft_params), n_host=5, name=f"insert[{m}x{width}]", donate_argnums=(0,)
            )
        count = jnp.int32(m if count is None else count)
        return self._insert[key](slots, tokens, slot_ids, keys, sampling, count, target_params, draft_params)

    def run(self, target_params, draft_params, slots: Slots, gamma: int, min_done: int, max_iterations: int):
        """Runs the loop over the slots until at least ``min_done`` are done (empty slots count) or after
        ``max_iterations`` iterations (``slots`` donated).

        Args:
          gamma: 0 (the target alone) or 1..G draft tokens per iteration (static: one program each, and one
            compile per slot width).
          min_done, max_iterations: int (traced: one program serves every value).
        Returns:
          (``Slots``, int32[] iterations run, bool[b] done flags: replicated, what the host reads back).
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
                return slots._replace(state=state), i, state.done

            options = self._options(target_params, self.batch * max(gamma + 1, 2))  # γ 0: STEP_WINDOW tokens
            sh = None
            if self.mesh is not None:
                from jax.sharding import NamedSharding
                from jax.sharding import PartitionSpec as P

                sh = self.slot_shardings(target_params, draft_params)
                replicated = NamedSharding(self.mesh, P())
                sh = (sh, replicated, replicated)
            self._run[key] = self._jit(
                program,
                None if sh is None else sh[0],
                sh,
                (target_params, draft_params),
                n_host=2,
                name=f"run[gamma {gamma}]",
                donate_argnums=(0,),
                compiler_options=options,
            )
        return self._run[key](slots, jnp.int32(min_done), jnp.int32(max_iterations), target_params, draft_params)

    def collect(self, slots: Slots, slot_ids) -> dict:
        """The finished rows ``slot_ids`` int32[m] read back to the host (compiled once per ``m``; on a mesh
        ``m`` is a multiple of ``row_multiple``; repeat an id to pad): a dict of NumPy arrays, sequences
        int32[m, T], lengths int32[m], target_calls, draft_tokens, accepted, num_verified int32[m], beta_sum
        float32[m]. Only these rows leave the devices."""
        if self._collect is None:
            if self.mesh is None:
                self._collect = self._stored(_collect, "collect")
            else:
                from jax.sharding import NamedSharding
                from jax.sharding import PartitionSpec as P

                replicated = NamedSharding(self.mesh, P())
                sh = self.slot_shardings(None, None)  # made by ``empty`` before any slot exists
                self._collect = self._stored(
                    _collect, "collect", in_shardings=(sh, replicated), out_shardings=replicated
                )
        return jax.device_get(self._collect(slots, slot_ids))


def check_slot_mesh(mesh, batch: int) -> None:
    """Checks that ``batch`` decode slots can be split over ``mesh``: axes ("data", "model") and ``batch`` a
    multiple of the data size ``D``.

    Raises:
      ValueError: naming the fix (a mesh from ``specjax.parallel.make_mesh``; a batch size that is a multiple
        of ``D``, the nearest ones given).
    """
    names = tuple(getattr(mesh, "axis_names", ()))
    if names != ("data", "model"):
        raise ValueError(
            f"bulk decoding needs a mesh with axes ('data', 'model'), got {names}; build one with "
            "specjax.parallel.make_mesh('data:N,model:M')."
        )
    d = mesh.shape["data"]
    if batch % d:
        lower, upper = batch - batch % d, batch + d - batch % d
        options = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(
            f"batch_size={batch} decode slots do not split evenly over the mesh's data axis of size {d}; use a "
            f"multiple of {d} (e.g. batch_size / --batch-size {options}) or a smaller data axis."
        )
