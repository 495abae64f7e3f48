"""The paper's formulas: what speculative sampling should gain at a given α, γ and c.

Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding", section 3.1
(eq. 1) and Theorem 3.8. α is the per-token acceptance probability E[β], β = Σ_x min(p(x), q(x)); γ the draft
tokens per iteration; c the cost of one draft step over one target call.

  expected tokens per target call       = (1 − α^(γ+1)) / (1 − α)
  expected walltime improvement factor  = (1 − α^(γ+1)) / ((1 − α)(γc + 1))
"""

from __future__ import annotations

__all__ = ["expected_tokens_per_call", "expected_improvement", "alpha_from_tokens_per_call"]


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """(1 − α^(γ+1)) / (1 − α): expected tokens per target call (Leviathan et al. 2023, eq. 1); γ+1 at α=1.

    Args:
      alpha: the paper's α in [0, 1]. gamma: draft tokens per iteration (>= 1).
    Returns:
      tokens per target call, in [1, γ+1].
    """
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_improvement(alpha: float, gamma: int, c: float) -> float:
    """(1 − α^(γ+1)) / ((1 − α)(γc + 1)): expected walltime speedup (Leviathan et al. 2023, Theorem 3.8).

    Args:
      alpha: the paper's α. gamma: γ. c: cost ratio, one draft step over one target call (>= 0).
    """
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def alpha_from_tokens_per_call(tokens_per_call: float, gamma: int) -> float:
    """The α that makes (1 − α^(γ+1)) / (1 − α) equal a measured ``tokens_per_call`` (bisection to 1e-9).

    An estimate of the paper's α (section 3.1) from emitted tokens alone, for results that do not carry the
    in-loop α (``DecodeResult.acceptance_rate``, the mean of β over verified positions). Rows clipped by EOS
    or by ``max_decode_length`` emit fewer tokens in their last iteration, which biases it slightly low.
    ``accepted_fraction`` (accepted / drafted) is another quantity, smaller for γ > 1.

    Returns:
      α in [0, 1]: 0 for tokens_per_call <= 1, 1 for tokens_per_call >= γ+1.
    """
    lo, hi = 0.0, 1.0
    if tokens_per_call <= 1.0:
        return 0.0
    if tokens_per_call >= gamma + 1:
        return 1.0
    while hi - lo > 1e-9:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_call(mid, gamma) < tokens_per_call else (lo, mid)
    return (lo + hi) / 2
