"""What a decode returns: ``DecodeResult``, a pytree of arrays, and the per-row counters the loops carry.

Legend for shapes (STYLE.md): ``b`` batch, ``T`` max_decode_length, ``g`` gamma.

The paper's acceptance rate α (Leviathan et al. 2023, section 3.1) is ``E[β]`` with
``β = Σ_x min(p(x), q(x))`` at a position: the probability that the draft token there is accepted. The loop
accumulates β at every *verified* position (those whose acceptance test ran: the accepted ones and the first
rejected one, never a drafted token after a rejection, past a drafted EOS or past the length budget) from the
very p and q the rule used; at temperature 0 (one-hot p and q) β is 1 where the argmaxes agree, else 0.
``accepted_fraction`` (accepted / drafted) is another quantity: smaller for γ > 1, since drafts after the first
rejection of an iteration count as drafted but are never tested.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["DecodeResult", "Counters", "LineResult"]


class Counters(NamedTuple):
    """Per-row counters carried by the loops (see ``DecodeResult`` for each meaning).

    target_calls, draft_tokens, accepted, num_verified: int32[b]; beta_sum: float32[b];
    accepted_per_position: int32[b, g]; accepted_per_branch: int32[b, k] with ``num_drafts`` = k > 1, else None.
    """

    target_calls: jax.Array
    draft_tokens: jax.Array
    accepted: jax.Array
    beta_sum: jax.Array
    num_verified: jax.Array
    accepted_per_position: jax.Array
    accepted_per_branch: jax.Array | None = None

    @classmethod
    def zeros(cls, batch: int, gamma: int, num_drafts: int = 1) -> "Counters":
        z = jnp.zeros((batch,), jnp.int32)
        branches = jnp.zeros((batch, num_drafts), jnp.int32) if num_drafts > 1 else None
        return cls(z, z, z, jnp.zeros((batch,), jnp.float32), z, jnp.zeros((batch, gamma), jnp.int32), branches)


def _concrete(x, what: str) -> np.ndarray:
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            f"DecodeResult.{what} summarises concrete arrays; inside jax.jit compute it from the "
            "fields (e.g. beta_sum.sum() / num_verified.sum()) or return the result first."
        )
    return np.asarray(x)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeResult:
    """What ``temperature_sample`` and ``speculative_sample`` return: a pytree of arrays.

    Fields are JAX arrays straight from the compiled program (NumPy after a ``jax.device_get``); the result
    can be returned from a user's ``jax.jit``. Properties summarise the whole batch and need concrete arrays.

    Attributes:
      sequences: int32[b, T] output tokens (the decoder start token excluded), ``pad_id``-padded after the
        row's first EOS (which is kept) or up to ``max_decode_length``.
      lengths: int32[b] tokens per row, EOS included.
      num_target_calls: int32[b] target forward calls while the row was unfinished (baseline: one per token;
        speculative: one per iteration).
      num_draft_tokens: int32[b] drafted tokens that could have been kept, summed over the row's iterations:
        per iteration ``min(gamma, room left, index of the first drafted EOS)``. 0 for the baseline.
      num_accepted: int32[b] of those, the ones the verifier kept.
      beta_sum: float32[b] sum of the paper's β = Σ_x min(p(x), q(x)) over the row's verified positions.
      num_verified: int32[b] verified positions (acceptance tests run) of the row.
      accepted_per_position: int32[b, g] how many iterations accepted draft position ``i`` (vLLM's
        ``num_accepted_tokens_per_pos``); [b, 0] for the baseline.
      accepted_per_branch: int32[b, k] how many iterations accepted draft branch ``j`` (``num_drafts`` = k;
        branch 0 is the draft's first choice): with k = 1 the iterations that accepted a draft at all
        (``accepted_per_position[:, :1]``); None where a result was built without it.
    With ``num_drafts`` > 1 the per-token counters follow the branch that was kept: drafted tokens count
    ``gamma`` per iteration (not ``k · gamma``), and β at the branch point is that of the first candidate's law.
    """

    sequences: jax.Array
    lengths: jax.Array
    num_target_calls: jax.Array
    num_draft_tokens: jax.Array
    num_accepted: jax.Array
    beta_sum: jax.Array
    num_verified: jax.Array
    accepted_per_position: jax.Array
    accepted_per_branch: jax.Array | None = None

    @classmethod
    def from_loop(cls, sequences, lengths, counters: Counters) -> "DecodeResult":
        """Builds the result from a loop's final sequences, lengths and ``Counters``."""
        c = counters
        return cls(
            sequences,
            lengths,
            c.target_calls,
            c.draft_tokens,
            c.accepted,
            c.beta_sum,
            c.num_verified,
            c.accepted_per_position,
            c.accepted_per_position[:, :1] if c.accepted_per_branch is None else c.accepted_per_branch,
        )

    @property
    def acceptance_rate(self) -> float:
        """The paper's α over the batch: ``Σ beta_sum / Σ num_verified`` (Leviathan et al. 2023, §3.1);
        NaN when nothing was verified (the baseline)."""
        n = int(np.sum(_concrete(self.num_verified, "acceptance_rate")))
        return float(np.sum(_concrete(self.beta_sum, "acceptance_rate"), dtype=np.float64)) / n if n else float("nan")

    @property
    def row_acceptance_rates(self) -> np.ndarray:
        """float64[b]: α per row (NaN for rows with nothing verified)."""
        n = _concrete(self.num_verified, "row_acceptance_rates").astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, _concrete(self.beta_sum, "row_acceptance_rates") / n, np.nan)

    @property
    def accepted_fraction(self) -> float:
        """accepted / drafted over the batch (``Σ num_accepted / Σ num_draft_tokens``); NaN if nothing was
        drafted. Not the paper's α: see the module docstring."""
        drafted = int(np.sum(_concrete(self.num_draft_tokens, "accepted_fraction")))
        return float(np.sum(_concrete(self.num_accepted, "accepted_fraction"))) / drafted if drafted else float("nan")

    @property
    def tokens_per_target_call(self) -> float:
        """``Σ lengths / Σ num_target_calls`` (1.0 for the baseline); NaN if no calls."""
        calls = int(np.sum(_concrete(self.num_target_calls, "tokens_per_target_call")))
        return float(np.sum(_concrete(self.lengths, "tokens_per_target_call"))) / calls if calls else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Accepted draft tokens per iteration: ``Σ num_accepted / Σ num_target_calls``; NaN if no calls."""
        calls = int(np.sum(_concrete(self.num_target_calls, "mean_accepted_length")))
        return float(np.sum(_concrete(self.num_accepted, "mean_accepted_length"))) / calls if calls else float("nan")

    @property
    def acceptance_by_branch(self) -> np.ndarray:
        """float64[k]: the fraction of iterations that accepted draft branch ``j`` (``num_drafts`` = k; branch 0
        is the draft's first choice); their sum is the fraction that accepted any draft."""
        calls = int(np.sum(_concrete(self.num_target_calls, "acceptance_by_branch")))
        counts = _concrete(self.accepted_per_branch, "acceptance_by_branch").sum(axis=0)
        return counts / calls if calls else np.full(counts.shape, np.nan)

    @property
    def acceptance_by_position(self) -> np.ndarray:
        """float64[g]: the fraction of iterations that accepted draft position ``i`` (0-based)."""
        calls = int(np.sum(_concrete(self.num_target_calls, "acceptance_by_position")))
        counts = _concrete(self.accepted_per_position, "acceptance_by_position").sum(axis=0)
        return counts / calls if calls else np.full(counts.shape, np.nan)


@dataclasses.dataclass(frozen=True)
class LineResult:
    """One decoded input.

    Attributes:
      index: the input's index (``start_index`` + its position in ``inputs``).
      tokens: int32[n] output tokens, EOS included when emitted (at most ``max_decode_length``).
      num_target_calls: target forward calls while the line was decoded (γ 0: one per token).
      num_draft_tokens, num_accepted, beta_sum, num_verified: as ``DecodeResult``'s fields for the row.
      gamma: the γ of the last run the line was in (0: the target alone).
    """

    index: int
    tokens: np.ndarray
    num_target_calls: int
    num_draft_tokens: int
    num_accepted: int
    beta_sum: float
    num_verified: int
    gamma: int

    @property
    def acceptance_rate(self) -> float:
        """The paper's α for this line (NaN when nothing was verified)."""
        return self.beta_sum / self.num_verified if self.num_verified else float("nan")
