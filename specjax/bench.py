"""Measuring speculative sampling against the baseline, side by side in one run.

Everything here times compiled programs only (compile time is measured apart, on a first call of each
shape), alternates the two methods on the same inputs, and reports ratios, never absolute thresholds.
Theory (Leviathan et al. 2023, section 3.1 and Theorem 3.8): with acceptance rate α, γ draft tokens per
iteration and cost ratio c (one draft step over one target call),
  expected tokens per target call       = (1 − α^(γ+1)) / (1 − α)
  expected walltime improvement factor  = (1 − α^(γ+1)) / ((1 − α)(γc + 1)).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import DecodeResult, speculative_sample, temperature_sample
from specjax.models import t5
from specjax.models.t5 import T5Model

__all__ = [
    "expected_tokens_per_call", "expected_improvement", "measure_cost_ratio", "PairMeasurement",
    "measure_pair", "pad_batches", "environment",
]


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """(1 − α^(γ+1)) / (1 − α): expected tokens per target call (Leviathan et al. 2023, eq. 1); γ+1 at α=1."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_improvement(alpha: float, gamma: int, c: float) -> float:
    """(1 − α^(γ+1)) / ((1 − α)(γc + 1)): expected walltime speedup (Leviathan et al. 2023, Theorem 3.8)."""
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def environment() -> dict:
    """jax version, backend, device kind and count: recorded with every result."""
    devices = jax.devices()
    return {"jax": jax.__version__, "backend": jax.default_backend(),
            "device_kind": devices[0].device_kind, "device_count": len(devices)}


def pad_batches(rows: Sequence[Sequence[int]], batch_size: int, length: int | None = None,
                pad_id: int = 0) -> list[np.ndarray]:
    """Token id lists -> int32[batch_size, L] arrays (the last batch padded with copies of its first row,
    which callers drop); L = ``length`` or the next power of two >= the longest row (>= 8), so every batch
    of a run shares one compiled shape."""
    if not rows:
        raise ValueError("No inputs to batch.")
    longest = max(len(r) for r in rows)
    L = length or max(8, 1 << (longest - 1).bit_length())
    if longest > L:
        raise ValueError(f"An input has {longest} tokens, more than the padded length {L}.")
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = list(rows[start:start + batch_size])
        chunk += [chunk[0]] * (batch_size - len(chunk))
        arr = np.full((batch_size, L), pad_id, np.int32)
        for i, r in enumerate(chunk):
            arr[i, :len(r)] = r
        out.append(arr)
    return out


# ----------------------------------------------------------------------------------------------------------
# The cost ratio c


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _steps(config, params, encoded, cache, k: int, n: int):
    """n decode calls of a k-token window in one jitted loop (what the decode loop runs)."""
    b = cache.k.shape[1]

    def body(i, carry):
        cache, acc = carry
        tokens = jnp.full((b, k), 3, jnp.int32) + (acc[:, None] > 1e30)  # data dependence: no hoisting
        logits, cache = t5.decode(config, params, encoded, tokens, cache, jnp.full((b,), i % 8, jnp.int32))
        return cache, acc + logits[:, -1, 0]

    return jax.lax.fori_loop(0, n, body, (cache, jnp.zeros((b,), jnp.float32)))[1]


def _time_steps(model: T5Model, encoder_input_tokens, k: int, n: int, repeats: int) -> float:
    encoded = model.encode(encoder_input_tokens)
    cache = model.init_cache(encoder_input_tokens.shape[0], 16 + k)
    jax.block_until_ready(_steps(model.config, model.params, encoded, cache, k, n))  # compile
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(_steps(model.config, model.params, encoded, cache, k, n))
        best = min(best, time.perf_counter() - t0)
    return best / n


def measure_cost_ratio(target: T5Model, draft: T5Model, encoder_input_tokens, gamma: int,
                       steps: int = 64, repeats: int = 5) -> dict:
    """Measures one decode call of each model inside a jitted loop (seconds per call, best of ``repeats``).

    Args:
      encoder_input_tokens: int32[b, s] (the batch size matters: c depends on it).
    Returns:
      dict with ``draft_step_s`` (k=1), ``target_step_s`` (k=1), ``target_window_s`` (k=γ+1),
      ``c`` = draft_step_s / target_step_s (the paper's cost ratio, which assumes a window costs as much as
      one step), and ``window_over_step`` = target_window_s / target_step_s (how far that assumption holds).
    """
    tokens = np.asarray(encoder_input_tokens, np.int32)
    d = _time_steps(draft, tokens, 1, steps, repeats)
    t1 = _time_steps(target, tokens, 1, steps, repeats)
    tw = _time_steps(target, tokens, gamma + 1, steps, repeats)
    return {"draft_step_s": d, "target_step_s": t1, "target_window_s": tw, "c": d / t1,
            "window_over_step": tw / t1}


# ----------------------------------------------------------------------------------------------------------
# Speculative vs baseline


@dataclasses.dataclass
class PairMeasurement:
    """Speculative sampling and temperature_sample on the same inputs, timed alternately after compilation.

    Attributes:
      spec_seconds, base_seconds: total wall time (seconds) over all batches and repeats (compiled calls).
      spec_compile_seconds, base_compile_seconds: the first call of each (compile + run), seconds.
      spec, base: ``DecodeResult`` per batch (from the last repeat).
      num_inputs: real rows (padding rows excluded).
    """
    spec_seconds: float
    base_seconds: float
    spec_compile_seconds: float
    base_compile_seconds: float
    spec: list[DecodeResult]
    base: list[DecodeResult]
    num_inputs: int

    def _rows(self, results, field):
        vals = np.concatenate([getattr(r, field) for r in results])
        return vals[:self.num_inputs]

    @property
    def speedup(self) -> float:
        """base_seconds / spec_seconds."""
        return self.base_seconds / self.spec_seconds

    @property
    def acceptance_rate(self) -> float:
        """α over all real rows: accepted / drafted."""
        return float(self._rows(self.spec, "num_accepted").sum() / max(1, self._rows(self.spec, "num_draft_tokens").sum()))

    @property
    def row_acceptance_rates(self) -> np.ndarray:
        """float[num_inputs] α per row (NaN where nothing was drafted)."""
        drafted = self._rows(self.spec, "num_draft_tokens").astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._rows(self.spec, "num_accepted") / drafted

    @property
    def tokens_per_target_call(self) -> float:
        """Emitted tokens / target calls of the speculative runs."""
        return float(self._rows(self.spec, "lengths").sum() / max(1, self._rows(self.spec, "num_target_calls").sum()))

    @property
    def output_tokens(self) -> int:
        """Tokens emitted by the speculative runs (real rows, one repeat)."""
        return int(self._rows(self.spec, "lengths").sum())

    def sequences(self, which: str = "spec") -> list[np.ndarray]:
        """Output token rows (real rows only), each trimmed to its length."""
        results = self.spec if which == "spec" else self.base
        seqs = np.concatenate([r.sequences for r in results])[:self.num_inputs]
        lens = self._rows(results, "lengths")
        return [s[:n] for s, n in zip(seqs, lens)]


def measure_pair(target: T5Model, draft: T5Model, batches: Sequence[np.ndarray], *, gamma: int,
                 temperature: float, max_decode_length: int, num_inputs: int | None = None, seed: int = 0,
                 repeats: int = 1, top_k: int = 0, top_p: float = 1.0,
                 on_batch: Callable[[], None] | None = None) -> PairMeasurement:
    """Runs speculative_sample and temperature_sample on the same batches, alternating, after compiling each.

    Args:
      batches: int32[b, s] arrays sharing one shape (see ``pad_batches``).
      num_inputs: real rows in total (trailing padding rows of the last batch are excluded from counts).
      seed: batch ``j`` uses ``PRNGKey(seed + j)`` for both methods.
      repeats: passes over all batches; times are summed, results kept from the last pass.
      on_batch: called after each batch (progress bars).
    Returns:
      ``PairMeasurement``.
    Raises:
      ValueError: from the decode functions' validation (gamma, temperature, …) before compiling.
    """
    kw = dict(max_decode_length=max_decode_length, temperature=temperature, top_k=top_k, top_p=top_p)

    def spec(j, x):
        r = speculative_sample(target, draft, x, rng=jax.random.PRNGKey(seed + j), gamma=gamma, **kw)
        return r

    def base(j, x):
        return temperature_sample(target, x, rng=jax.random.PRNGKey(seed + j), **kw)

    t0 = time.perf_counter()
    spec(0, batches[0])
    spec_compile = time.perf_counter() - t0
    t0 = time.perf_counter()
    base(0, batches[0])
    base_compile = time.perf_counter() - t0
    spec_s = base_s = 0.0
    for _ in range(repeats):
        spec_results, base_results = [], []
        for j, x in enumerate(batches):
            order = (spec, base) if j % 2 == 0 else (base, spec)  # alternate who goes first
            for fn in order:
                t0 = time.perf_counter()
                r = fn(j, x)  # DecodeResult holds numpy arrays: the call has finished
                dt = time.perf_counter() - t0
                if fn is spec:
                    spec_s += dt
                    spec_results.append(r)
                else:
                    base_s += dt
                    base_results.append(r)
            if on_batch:
                on_batch()
    n = num_inputs if num_inputs is not None else sum(b.shape[0] for b in batches)
    return PairMeasurement(spec_s, base_s, spec_compile, base_compile, spec_results, base_results, n)
