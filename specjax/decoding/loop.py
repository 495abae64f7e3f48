"""Speculative sampling: the while loop whose body reads like Algorithm 1 — draft → verify → accept → commit.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``T`` max_decode_length, ``g`` gamma,
``k`` window (g + 1), ``v`` vocab, ``L`` the target's cache length (``target_cache_length``: T + max(g, 8) + 1).

Sources: Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding",
Algorithm 1 and section 3.1 (α); Chen et al. 2023, Algorithm 2; Sun et al. 2025 (block verification).

One call is one jit-compiled XLA program: a single top-level ``lax.while_loop`` over fixed-shape windows.
Rows carry their own positions, keys, done flags and counters, so every row accepts its own number of tokens.
The target's cache invariant (per row, ``n`` = tokens emitted = ``positions``; decoder inputs ``d[0] = pad_id``,
``d[j] = sequences[j - 1]``): the cache holds ``d[0..n-1]`` at the start of an iteration; verification feeds
``[d[n], x_1..x_g]`` at positions ``n..n+g``, so after accepting ``a`` drafts slots ``n..n+a`` hold exactly
``d[n..n+a]``; later slots are stale (masked, then overwritten). The draft's invariant: ``drafts.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specjax.decoding.baseline import temperature_sample
from specjax.decoding.branches import BranchDraft, branch_verify
from specjax.decoding.drafts import DraftSource, ModelDraft, decoder_input_at
from specjax.decoding.inputs import DecodeConfig, prepare_tokens, raw_keys, row_keys, split_rows, target_cache_length
from specjax.decoding.model import BranchDecodingModel, DecodingModel, as_decoding_model
from specjax.decoding.result import Counters, DecodeResult
from specjax.decoding.verifiers import get_verifier
from specjax.decoding.verify import Proposal, Verdict
from specjax.decoding.xla_cpu import TunedJit
from specjax.sampling import SamplingParams

__all__ = ["speculative_sample", "lower_speculative_sample", "speculative_body", "SpecState"]


class SpecState(NamedTuple):
    """Carry of the speculative while loop (the models' caches apart from the loop's bookkeeping).

    Attributes:
      target_cache: the target's cache; holds ``d[0..n-1]``.
      draft_carry: the draft source's carry (a draft model's cache and the first slot it has not written).
      positions: int32[b] ``n``, tokens emitted so far; ``d[n]`` is the next decoder input.
      sequences: int32[b, T] emitted tokens, pad after the row's end.
      done: bool[b] finished (EOS emitted or T reached); finished rows stop changing.
      keys: uint32[b, 2] per-row PRNG keys, split once per iteration.
      counters: ``Counters``.
    """

    target_cache: Any
    draft_carry: Any
    positions: jax.Array
    sequences: jax.Array
    done: jax.Array
    keys: jax.Array
    counters: Counters


def verify_window(target: DecodingModel, params, encoded, state: SpecState, proposal: Proposal):
    """The target scores ``[d[n], x_1..x_g]`` at positions ``n..n+g`` in one call: (logits [b, k, v], cache)."""
    last = decoder_input_at(state.sequences, state.positions, target.pad_id)  # [b]
    window = jnp.concatenate([last[:, None], proposal.tokens], axis=1)  # [b, k]
    return target.decode(params, encoded, window, state.target_cache, state.positions)


def commit(state: SpecState, proposal: Proposal, verdict: Verdict, config: DecodeConfig) -> SpecState:
    """Emit ``x_1..x_a`` and the next token per unfinished row, cut at the first EOS and at the length budget;
    scatter them into ``sequences``; advance positions; update ``done`` and the counters (the caches and keys
    are replaced by the caller)."""
    b, g = proposal.tokens.shape
    T, eos, n, a = config.max_decode_length, config.eos_id, state.positions, verdict.num_accepted
    j = jnp.arange(g + 1)[None, :]  # [1, k]
    drafted = jnp.concatenate([proposal.tokens, jnp.zeros((b, 1), jnp.int32)], axis=1)  # [b, k]
    emitted = jnp.where(j < a[:, None], drafted, verdict.next_token[:, None])  # [b, k]
    is_eos = (emitted == eos) & (j <= a[:, None])
    first_eos = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1) + 1, g + 2)  # 1-based
    room = T - n
    active = ~state.done
    kept = jnp.where(active, jnp.minimum(jnp.minimum(a + 1, first_eos), room), 0)  # [b]
    idx = jnp.where(j < kept[:, None], n[:, None] + j, T)  # T is out of bounds: dropped
    sequences = state.sequences.at[jnp.arange(b)[:, None], idx].set(emitted, mode="drop")
    positions = n + kept
    done = state.done | (active & ((first_eos <= kept) | (positions >= T)))

    # Counters over the drafts that could have been kept (within room and the draft's length, up to the
    # first drafted EOS); verified positions are the accepted ones plus the first rejected one.
    draft_eos = proposal.tokens == eos
    first_draft_eos = jnp.where(draft_eos.any(1), jnp.argmax(draft_eos, axis=1) + 1, g)
    useful = jnp.minimum(jnp.minimum(first_draft_eos, room), jnp.minimum(proposal.lengths, g))
    accepted = jnp.minimum(a, useful)
    verified = jnp.minimum(a + 1, useful)
    slot = jnp.arange(g)[None, :]
    act = active.astype(jnp.int32)
    c = state.counters
    counters = Counters(
        target_calls=c.target_calls + act,
        draft_tokens=c.draft_tokens + act * useful,
        accepted=c.accepted + act * accepted,
        beta_sum=c.beta_sum
        + jnp.where(active, jnp.sum(jnp.where(slot < verified[:, None], verdict.beta, 0.0), 1), 0.0),
        num_verified=c.num_verified + act * verified,
        accepted_per_position=c.accepted_per_position + act[:, None] * (slot < accepted[:, None]),
    )
    return state._replace(positions=positions, sequences=sequences, done=done, counters=counters)


def branch_iteration(
    target: DecodingModel,
    draft: BranchDraft,
    config: DecodeConfig,
    target_params,
    draft_params,
    encoded,
    draft_context,
    sampling: SamplingParams,
    state: SpecState,
) -> SpecState:
    """One multi-draft iteration (``num_drafts`` = k > 1; ``specjax.decoding.branches``, steps 1-6), every row:
    the draft proposes k continuations, the target scores the k windows in one call, recursive rejection
    sampling picks the branch, the token / block rule runs along it, and the kept branch is committed."""
    g, k = config.gamma, config.num_drafts
    step_keys = split_rows(state.keys, g + 2)  # [g + 2, b, 2]
    with jax.named_scope("draft"):
        proposal, branch_carry = draft.propose(
            draft_params, draft_context, state.draft_carry, state.sequences, state.positions, step_keys[2:], sampling, g
        )
    with jax.named_scope("verify"):
        window = draft.window(state.sequences, state.positions, proposal, target.pad_id)  # [b, k, w]
        target_logits, target_window = target.decode_branches(
            target_params, encoded, window, state.target_cache, state.positions
        )
    with jax.named_scope("accept"):
        branch, verdict = branch_verify(step_keys[1], proposal, target_logits, sampling, config.verification)
    with jax.named_scope("commit"):
        b = branch.shape[0]
        chain = Proposal(
            jnp.take_along_axis(proposal.tokens, branch[:, None, None], axis=1)[:, 0],
            None,
            jnp.full((b,), g, jnp.int32),
        )
        active = ~state.done
        target_cache = target.commit_branch(state.target_cache, target_window, branch, state.positions, g + 1)
        draft_carry = draft.keep(branch_carry, branch)
        kept = active & (verdict.num_accepted > 0)
        new = commit(state, chain, verdict, config)
        per_branch = state.counters.accepted_per_branch + (kept[:, None] & (jnp.arange(k)[None, :] == branch[:, None]))
        counters = new.counters._replace(accepted_per_branch=per_branch.astype(jnp.int32))
    return new._replace(target_cache=target_cache, draft_carry=draft_carry, keys=step_keys[0], counters=counters)


def _speculative_loop(
    target: DecodingModel,
    draft: DraftSource,
    config: DecodeConfig,
    target_params,
    draft_params,
    encoder_input_tokens,
    raw_key,
    sampling: SamplingParams,
) -> DecodeResult:
    b = encoder_input_tokens.shape[0]
    T, g = config.max_decode_length, config.gamma
    if config.num_drafts > 1:
        draft = BranchDraft(draft.model, config.num_drafts)
    with jax.named_scope("encode"):
        keys = row_keys(raw_key, b)
        encoded = target.encode(target_params, encoder_input_tokens)
        draft_context, draft_carry = draft.start(draft_params, encoder_input_tokens, T + g + 1)
    init = SpecState(
        target.init_cache(b, target_cache_length(T, g)),  # the target alone's length too (window invariance)
        draft_carry,
        jnp.zeros((b,), jnp.int32),
        jnp.full((b, T), target.pad_id, jnp.int32),
        jnp.zeros((b,), bool),
        keys,
        Counters.zeros(b, g, config.num_drafts),
    )
    body = speculative_body(target, draft, config, target_params, draft_params, encoded, draft_context, sampling)
    final = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, init)
    return DecodeResult.from_loop(final.sequences, final.positions, final.counters)


def speculative_body(
    target: DecodingModel,
    draft: DraftSource,
    config: DecodeConfig,
    target_params,
    draft_params,
    encoded,
    draft_context,
    sampling: SamplingParams,
):
    """One iteration of the speculative loop as a function ``SpecState -> SpecState`` (traced code).

    ``_speculative_loop`` runs it until every row is done; the bulk decoder (``specjax.decoding.slots``) runs it
    over a fixed set of slots until enough of them are done, refilling them between runs. Each row only reads
    its own state, encoder memory, sampling parameters and key: its tokens do not depend on the other rows.

    Args:
      target, draft, config: as ``speculative_sample``'s (static).
      target_params, draft_params: the models' parameters.
      encoded: the target's encoder output for the rows (``target.encode``).
      draft_context: what the draft source's ``start`` returned as context.
      sampling: per-row ``SamplingParams`` [b].
    Returns:
      ``body(state: SpecState) -> SpecState``.
    """
    g = config.gamma
    verifier = get_verifier(config.verification)

    def body(state: SpecState) -> SpecState:  # Leviathan et al. 2023, Algorithm 1, every row at once
        step_keys = split_rows(state.keys, g + 2)  # [g + 2, b, 2]
        with jax.named_scope("draft"):
            proposal, draft_carry = draft.propose(
                draft_params,
                draft_context,
                state.draft_carry,
                state.sequences,
                state.positions,
                step_keys[2:],
                sampling,
                g,
            )
        with jax.named_scope("verify"):
            target_logits, target_cache = verify_window(target, target_params, encoded, state, proposal)
        with jax.named_scope("accept"):
            verdict = verifier.verify(step_keys[1], proposal, target_logits, sampling)
        with jax.named_scope("commit"):
            state = commit(state, proposal, verdict, config)
        return state._replace(target_cache=target_cache, draft_carry=draft_carry, keys=step_keys[0])

    if config.num_drafts > 1:  # multi-draft: its own iteration; num_drafts=1 runs `body` above, unchanged

        def body(state: SpecState) -> SpecState:
            return branch_iteration(
                target, draft, config, target_params, draft_params, encoded, draft_context, sampling, state
            )

    return body


# Arguments: (target, draft, config, target_params, draft_params, tokens [b, s], key, sampling); the largest
# dot is the target's window, b x (gamma + 1) rows.
_speculative_jit = TunedJit(
    _speculative_loop,
    (0, 1, 2),
    lambda *a: a[5].shape[0] * (a[2].gamma + 1) * a[2].num_drafts,
    lambda *a: a[3],
    lambda *a: a[5].shape[0],
)


def as_draft_source(draft) -> tuple[DraftSource, Any]:
    """A draft model (``T5Model`` or ``(DecodingModel, params)``) or a draft source object -> (source, params)."""
    if hasattr(draft, "propose") and hasattr(draft, "start"):
        return draft, None
    fns, params = as_decoding_model(draft, "draft")
    return ModelDraft(fns), params


def _check_branching(target_fns, source, config: DecodeConfig) -> None:
    """What ``num_drafts`` > 1 needs: a draft model without a confidence stop, both models able to branch
    (``BranchDecodingModel``), and more vocabulary than drafts. Raises ValueError naming the way out."""
    k = config.num_drafts
    if not isinstance(source, ModelDraft) or source.confidence_threshold is not None:
        what = type(source).__name__ if not isinstance(source, ModelDraft) else "a confidence-stopped draft"
        raise ValueError(
            f"num_drafts={k} needs a draft model drafting gamma tokens, got {what}; pass a draft T5Model without "
            "draft_confidence_threshold, or num_drafts=1."
        )
    for what, fns in (("target", target_fns), ("draft", source.model)):
        if not isinstance(fns, BranchDecodingModel):
            raise ValueError(
                f"num_drafts={k} needs a {what} that scores several branches per call (a BranchDecodingModel: "
                f"decode_branches, commit_branch, fork_rows, take_rows), got {type(fns).__name__}; use a specjax "
                "T5Model or num_drafts=1."
            )
    if k > target_fns.vocab_size:
        raise ValueError(
            f"num_drafts={k} is more than the vocabulary ({target_fns.vocab_size} tokens): the drafts' first tokens "
            f"must differ; use num_drafts <= {target_fns.vocab_size}."
        )


def _speculative_args(
    target,
    draft,
    encoder_input_tokens,
    rng,
    gamma,
    max_decode_length,
    temperature,
    top_k,
    top_p,
    eos_id,
    max_input_length,
    truncate,
    verification,
    draft_confidence_threshold=None,
    num_drafts=1,
):
    target_fns, target_params = as_decoding_model(target, "target")
    source, draft_params = as_draft_source(draft)
    if draft_confidence_threshold is not None:
        if not isinstance(source, ModelDraft):
            raise ValueError(
                f"draft_confidence_threshold needs a draft model, got {type(source).__name__}; drop "
                "it (a prompt-lookup proposal has no confidence)."
            )
        source = dataclasses.replace(source, confidence_threshold=draft_confidence_threshold)
    draft_fns = getattr(source, "model", None)
    if draft_fns is not None and target_fns.vocab_size != draft_fns.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft_fns.vocab_size} tokens) differs from the target's ({target_fns.vocab_size});"
            " speculative sampling compares both models' probabilities token by token, so use a draft trained "
            "with the target's tokenizer and vocabulary size (all public T5 / T5 1.1 / Flan-T5 checkpoints use "
            "32128)."
        )
    if draft_fns is not None and target_fns.pad_id != draft_fns.pad_id:
        raise ValueError(
            f"draft pad_id {draft_fns.pad_id} differs from the target's {target_fns.pad_id}; both "
            "models must start decoding from the same token."
        )
    if isinstance(gamma, (int,)) and not isinstance(gamma, bool) and gamma < 1:
        raise ValueError(
            f"gamma must be an int >= 1 (or 0, the target alone, in speculative_sample), got {gamma!r}; it is the "
            "number of draft tokens per target call (try 3 to 7)."
        )
    config = DecodeConfig(max_decode_length, gamma, eos_id, verification, num_drafts)
    if config.num_drafts > 1:
        _check_branching(target_fns, source, config)
    if config.eos_id >= target_fns.vocab_size:
        raise ValueError(
            f"eos_id={eos_id!r} is outside the vocabulary [0, {target_fns.vocab_size}); T5's SentencePiece EOS is 1."
        )
    tokens = prepare_tokens(
        encoder_input_tokens,
        vocab_size=target_fns.vocab_size,
        pad_id=target_fns.pad_id,
        eos_id=config.eos_id,
        max_input_length=max_input_length,
        truncate=truncate,
    )
    b = tokens.shape[0]
    sampling = SamplingParams.broadcast(b, temperature, top_k, top_p)
    return target_fns, source, config, target_params, draft_params, tokens, raw_keys(rng, b), sampling


def speculative_sample(
    target,
    draft,
    encoder_input_tokens,
    *,
    rng=None,
    gamma: int,
    max_decode_length: int,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    eos_id: int = 1,
    max_input_length: int = 512,
    truncate: bool = False,
    verification: str = "token",
    draft_confidence_threshold: float | None = None,
    num_drafts: int = 1,
) -> DecodeResult:
    """Speculative sampling: a draft proposes ``gamma`` tokens, the target checks them in one call.

    Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023, Algorithm 2) for encoder-decoders: each model
    encodes the input once; each loop iteration, per row, the draft samples ``x_1..x_g`` from ``p_1..p_g``,
    the target scores ``[last, x_1..x_g]`` in one call giving ``q_1..q_{g+1}``, ``x_i`` is accepted while
    ``r_i < min(1, q_i(x_i)/p_i(x_i))``, and the first rejection is replaced by a sample from
    ``norm(max(0, q_i - p_i))`` (or, if all are accepted, a bonus token from ``q_{g+1}``). Each iteration emits
    1 to g + 1 tokens per unfinished row and the output has exactly the target's distribution under the same
    warping (temperature / top-k / top-p applied to p and q). Rows at temperature 0 equal target-greedy
    ``temperature_sample`` token for token, also in a batch with sampled rows.

    One jit-compiled XLA program (a single ``lax.while_loop``; no host callbacks). Traceable: it runs eagerly
    with friendly errors, and inside a user's ``jax.jit`` / ``shard_map`` / ``pmap`` with traced tokens, keys
    and sampling parameters. Static (a new value compiles a new program, ~10-30 s on a 2-core CPU for the
    shipped pair): ``gamma``, ``max_decode_length``, ``eos_id``, ``verification``, ``max_input_length``,
    ``truncate``, the models' configs and the input shape. Traced (one program serves every value):
    tokens, ``rng``, ``temperature``, ``top_k``, ``top_p``, parameters.

    Args:
      target: a ``T5Model`` or a ``(DecodingModel, params)`` pair.
      draft: a ``T5Model`` / ``(DecodingModel, params)`` with the target's vocabulary, or a draft source
        (``specjax.PromptLookupDraft``).
      encoder_input_tokens: int[b, s] inputs, right-padded with ``pad_id``.
      rng: a PRNG key (row ``i`` uses ``fold_in(rng, i)``), an int seed, per-row keys [b], or None
        (``PRNGKey(0)``: deterministic; pass your own key for independent samples).
      gamma: draft tokens per iteration, >= 1 (clipped to ``max_decode_length``; the loop clips each
        iteration at the room left); 0: the target alone (``temperature_sample``'s program and result: one
        token per target call, no drafts, ``accepted_per_position`` [b, 0], α NaN; the draft is not run or
        checked, and ``verification`` / ``draft_confidence_threshold`` do not apply).
      max_decode_length: ``T``, the most output tokens per row.
      temperature: float >= 0 or float[b] per row (0: greedy). top_k: int >= 0 or int[b] (0: all).
      top_p: float in (0, 1] or float[b] (1: all).
      eos_id: the token that ends a row (kept).
      max_input_length: the longest input accepted (tokens, padding excluded); 512 is T5's training length.
      truncate: cut longer inputs to ``max_input_length`` tokens (ending in EOS if they did) instead of raising.
      verification: "token" (Algorithm 1) or "block" (Sun et al. 2025, never fewer accepted tokens in
        expectation).
      draft_confidence_threshold: None, or a number in [0, 1]: each row stops drafting after a draft token
        whose probability under the draft is below it (adaptive gamma up to ``gamma``; ``ModelDraft``). Static.
      num_drafts: ``k`` in 1..4, static: the draft proposes k continuations whose first tokens differ (drawn
        without replacement; at temperature 0 its top k), the target scores all k windows of gamma + 1 tokens
        in one call, and recursive rejection sampling (SpecInfer; Jeon et al. 2024) keeps at most one of them,
        then the ``verification`` rule runs along it: the output distribution is still the target's, and rows
        at temperature 0 still equal target-greedy token for token (``specjax.decoding.branches``: a branch
        window's logits are the target's step's bit for bit, ``specjax.models.t5.decode_branches``). 1:
        single-draft decoding.
        Needs a draft model (not prompt lookup nor a confidence stop); the target window is k (gamma + 1) rows
        and the draft runs k rows per row after its first step.
    Returns:
      ``DecodeResult`` (a pytree of jax arrays): ``sequences`` int32[b, T], ``lengths``, per-row counters;
      ``.acceptance_rate`` is the paper's α, ``.accepted_fraction`` accepted/drafted,
      ``.tokens_per_target_call``.
    Raises:
      ValueError (before anything compiles): vocabularies or pad ids differ; gamma < 0;
        empty batch, ids outside the vocabulary, input longer than ``max_input_length`` without ``truncate``;
        temperature < 0, top_k < 0, top_p outside (0, 1]; eos_id outside the vocabulary; an unknown
        verification; a bad rng; num_drafts outside 1..4 or above the vocabulary size, or > 1 with a draft
        that is not a model or models that cannot branch. Value checks are skipped for traced values.
    """
    if isinstance(gamma, int) and not isinstance(gamma, bool) and gamma == 0:  # no draft token: the target alone
        return temperature_sample(
            target,
            encoder_input_tokens,
            rng=rng,
            max_decode_length=max_decode_length,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_id=eos_id,
            max_input_length=max_input_length,
            truncate=truncate,
        )
    return _speculative_jit(
        *_speculative_args(
            target,
            draft,
            encoder_input_tokens,
            rng,
            gamma,
            max_decode_length,
            temperature,
            top_k,
            top_p,
            eos_id,
            max_input_length,
            truncate,
            verification,
            draft_confidence_threshold,
            num_drafts,
        )
    )


def lower_speculative_sample(target, draft, encoder_input_tokens, **kwargs) -> jax.stages.Lowered:
    """The lowered XLA program ``speculative_sample`` runs for these arguments (same keywords); for
    inspection, tests and ahead-of-time compilation (``.compile()``)."""
    kwargs = dict(
        dict(
            rng=None,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_id=1,
            max_input_length=512,
            truncate=False,
            verification="token",
        ),
        **kwargs,
    )
    args = _speculative_args(
        target,
        draft,
        encoder_input_tokens,
        kwargs.pop("rng"),
        kwargs.pop("gamma"),
        kwargs.pop("max_decode_length"),
        **kwargs,
    )
    return _speculative_jit.lower(*args)


def _check_speculative_arguments(target, draft, encoder_input_tokens, **kwargs) -> None:
    """Every check ``speculative_sample`` makes, eagerly, compiling nothing (used by ``specjax.parallel``)."""
    kwargs = dict(
        dict(
            rng=None,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            eos_id=1,
            max_input_length=512,
            truncate=False,
            verification="token",
        ),
        **kwargs,
    )
    _speculative_args(
        target,
        draft,
        encoder_input_tokens,
        kwargs.pop("rng"),
        kwargs.pop("gamma"),
        kwargs.pop("max_decode_length"),
        **kwargs,
    )


speculative_sample.check_arguments = _check_speculative_arguments
