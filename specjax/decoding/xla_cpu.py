"""XLA:CPU compile options for the decode loops (and the training step): chosen from a profile, applied only
on CPU, never over a user's ``XLA_FLAGS``.

What the trace showed (``specjax bench --profile``; ``benchmarks/results/cpu_options/2026-12-01_profile_after.md``): at
batch 1 the target's (γ + 1)-token verification window spent its time in XLA:CPU's YNNPACK dot fusions
(``ynn_fusion`` thunks), 2.3-3× one step, while the same dots run by XLA:CPU's own dot thunks cost 1.4-1.5×
one step (the weights are streamed once for the few rows either way; on this 2-core CPU the decode is bound
by reading the weights from memory). YNNPACK wins again once a dot has many rows (batch 32 × a 4-token window:
its window was 1.1× faster). So the loops are compiled with ``xla_cpu_experimental_ynn_fusion_type=""`` (no
YNNPACK fusions) and ``xla_cpu_use_xnnpack=false`` (window 1.37× a step instead of 1.49× with the first
alone) when the batch is one row (``SMALL_DOT_BATCH``), the largest dot has at most ``SMALL_DOT_ROWS`` rows
(``b × window``) and the target computes in float32, and with XLA's defaults otherwise.

Why one row only: the options are per program, and a program holds the encoder too, whose dots have ``b × s``
rows. On an Intel Xeon (Ice Lake server: AVX-512 F/BW/VL/VNNI, no AVX512_BF16), the small pair in float32, 64
output tokens, inputs padded to 64, the options measured (A/B in one process, alternating; the machine loaded):
at batch 1, 16 lines, faster — the target alone 1.00 against 0.88, speculative γ 3 / 5 / 7 1.31 / 1.32 / 1.26
against 1.25 / 1.21 / 1.25 (relative to the target alone with them); at batch 2 and above, slower — a batch of
4: the target alone 401 ms against 324 with XLA's defaults, γ 3 493 against 319; a batch of 32: the target alone
3.98 s against 3.11 s (the encoder alone, [32, 64] tokens: 1.31 s against 1.07 s).

bfloat16 is the other way round (the small pair; `benchmarks/decoding.py dtypes`): XLA:CPU's own dot
thunks have no native bfloat16 kernel, while YNNPACK's run bfloat16 x bfloat16 -> float32 with AVX512-BF16. With
the options above a bfloat16 target's speculative loop was slower than the float32 target's (γ 3: 0.90x the
float32 baseline); with XLA's defaults the same loop ran 1.57x (γ 3) and 1.77x (γ 5) the float32 baseline,
2.0-2.2x the bfloat16 baseline (12 Multi30k lines, batch 1, one process, alternating).

The training step (``specjax.train``) is compiled with ``TRAIN_STEP_OPTIONS``: YNNPACK for the dots alone. A
trace of the small target's bfloat16 step showed XLA's default YNNPACK fusions taking the loss's reductions too,
the log-softmax's max over [2048, 8000] logits alone 108 ms of a 1.6 s step; with YNNPACK for dots only the
step measured 1.35 s against 1.45 s (median of 6, alternating; no YNNPACK at all: 2.84 s).

Window invariance comes first, so the few-row options are a mode, off by default: XLA:CPU's own dot thunks run
a float32 dot of 8 or more rows on another kernel than one of 2 to 7 rows when the contracted dimension is 1,024
(the small target's MLP output), so a verification window of γ + 1 >= 8 tokens rounds differently from the
target alone's step and greedy speculative output can part from it (docs/performance.md, "Window invariance").
XLA's defaults ran every float32 dot of 2 to 32 rows of the small target on one kernel (windows and steps equal bit
for bit at γ 3, 7 and 8). ``SPECJAX_XLA_CPU_OPTIONS=few-row-dots`` turns the options back on for batch-1 float32
programs, for speed where bit-for-bit greedy identity matters less (``FEW_ROW_DOTS_MODE``).

The options are per program (``jax.jit(..., compiler_options=...)``), so nothing global changes. They are not
used: on any backend but CPU; when ``XLA_FLAGS`` mentions one of them (the user's choice wins); when
``SPECJAX_XLA_CPU_OPTIONS=0``; inside a user's ``jax.jit`` / ``shard_map`` / ``pmap`` (XLA takes compile
options only for a top-level program: the user's own jit then decides).
"""

from __future__ import annotations

import os
from typing import Callable

import jax
import jax.numpy as jnp

from specjax.decoding.stored import StoredJit

__all__ = [
    "FEW_ROW_DOTS_MODE",
    "few_row_dots",
    "SMALL_DOT_BATCH",
    "SMALL_DOT_ROWS",
    "SMALL_DOT_OPTIONS",
    "TRAIN_STEP_OPTIONS",
    "YNN_FUSION_OPTION",
    "cpu_compiler_options",
    "train_step_compiler_options",
    "weights_dtype",
    "program_platform",
    "TunedJit",
]

YNN_FUSION_OPTION = "xla_cpu_experimental_ynn_fusion_type"
SMALL_DOT_ROWS = 32
"""Largest ``b × window`` (rows of the biggest decode dot) compiled with ``SMALL_DOT_OPTIONS`` on CPU."""
SMALL_DOT_BATCH = 1
"""Largest batch (rows of the decode) compiled with ``SMALL_DOT_OPTIONS`` on CPU (see the module docstring)."""
SMALL_DOT_OPTIONS = ((YNN_FUSION_OPTION, ""), ("xla_cpu_use_xnnpack", False))
"""No YNNPACK fusions and no XNNPACK: XLA:CPU's own dot thunks (measured best for few-row dots, see above)."""
TRAIN_STEP_OPTIONS = ((YNN_FUSION_OPTION, "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),)
"""YNNPACK for each dot, none of its reduction or elementwise fusions (the training step; see above)."""


FEW_ROW_DOTS_MODE = "few-row-dots"
"""``SPECJAX_XLA_CPU_OPTIONS`` value that compiles batch-1 float32 decode programs with ``SMALL_DOT_OPTIONS``
(faster few-row dots; a window of 8 or more rows may then round differently from a step: see above)."""


def _user_chose(options) -> bool:
    """True when ``SPECJAX_XLA_CPU_OPTIONS=0`` or ``XLA_FLAGS`` names one of ``options`` (the user decides)."""
    flags = os.environ.get("XLA_FLAGS", "")
    return os.environ.get("SPECJAX_XLA_CPU_OPTIONS", "1") == "0" or any(name in flags for name, _ in options)


def few_row_dots() -> bool:
    """True when ``SPECJAX_XLA_CPU_OPTIONS=few-row-dots`` asks for ``SMALL_DOT_OPTIONS`` (off by default)."""
    return os.environ.get("SPECJAX_XLA_CPU_OPTIONS", "") == FEW_ROW_DOTS_MODE


def _top_level() -> bool:
    """True outside any JAX trace (a call that will compile its own top-level program)."""
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover - a JAX without it: never pass options
        return False
    return trace_state_clean()


def cpu_compiler_options(rows: int, dtype=jnp.float32, platform: str | None = None, batch: int = 1) -> dict | None:
    """The compile options for a decode program of ``batch`` rows whose largest dot has ``rows`` rows
    (``b × window``) of ``dtype`` (the target's weights' dtype), compiled for ``platform`` ("cpu", "tpu", "gpu";
    None: JAX's default backend).

    Returns ``dict(SMALL_DOT_OPTIONS)`` with ``SPECJAX_XLA_CPU_OPTIONS=few-row-dots`` (``FEW_ROW_DOTS_MODE``) for
    a CPU program with ``batch <= SMALL_DOT_BATCH``, ``rows <= SMALL_DOT_ROWS`` and a float32 ``dtype``, else None
    (XLA's defaults, the window-invariant path); None for other platforms, when ``XLA_FLAGS`` names one of the
    options, or when ``SPECJAX_XLA_CPU_OPTIONS=0``.
    """
    if (
        not few_row_dots()
        or _user_chose(SMALL_DOT_OPTIONS)
        or batch > SMALL_DOT_BATCH
        or rows > SMALL_DOT_ROWS
        or jnp.dtype(dtype) != jnp.float32
        or (platform or jax.default_backend()) != "cpu"
    ):
        return None
    return dict(SMALL_DOT_OPTIONS)


def weights_dtype(params) -> jnp.dtype:
    """The dtype of the largest array in a parameter tree (what the model's biggest dots read)."""
    leaves = [x for x in jax.tree_util.tree_leaves(params) if hasattr(x, "dtype") and hasattr(x, "size")]
    return jnp.dtype(max(leaves, key=lambda x: x.size).dtype) if leaves else jnp.dtype(jnp.float32)


def program_platform(tree) -> str:
    """The platform ("cpu", "tpu", "gpu") a program reading the arrays of ``tree`` is compiled for: that of the
    first leaf placed on devices (a ``jax.Array``) or given a sharding (a ``jax.ShapeDtypeStruct`` with
    ``sharding=``, as for a TPU topology compiled ahead of time on a CPU host); JAX's default backend when no leaf
    says (NumPy arrays, tracers, abstract arrays without a sharding)."""
    for leaf in jax.tree_util.tree_leaves(tree):
        devices = getattr(leaf, "devices", None)
        if callable(devices) and not isinstance(leaf, jax.core.Tracer):
            return next(iter(devices())).platform
        device_set = getattr(getattr(leaf, "sharding", None), "device_set", None)
        if isinstance(leaf, jax.ShapeDtypeStruct) and device_set:
            return next(iter(device_set)).platform
    return jax.default_backend()


def train_step_compiler_options() -> dict | None:
    """``dict(TRAIN_STEP_OPTIONS)`` on CPU; None on other backends, when ``XLA_FLAGS`` names the option, or when
    ``SPECJAX_XLA_CPU_OPTIONS=0``."""
    if _user_chose(TRAIN_STEP_OPTIONS) or jax.default_backend() != "cpu":
        return None
    return dict(TRAIN_STEP_OPTIONS)


class TunedJit:
    """``jax.jit(fn, static_argnums=...)`` that, called at top level for a CPU program, compiles with
    ``cpu_compiler_options(rows(*args), weights_dtype(params(*args)), program_platform(params(*args)),
    batch(*args))``; nested in a trace it is the plain jit (inlined by the caller's).

    ``__call__``, ``lower`` and ``_cache_size`` behave as ``jax.jit``'s (the cache size sums every variant).
    """

    def __init__(
        self,
        fn: Callable,
        static_argnums: tuple[int, ...],
        rows: Callable[..., int],
        params: Callable[..., object],
        batch: Callable[..., int] = lambda *a: 1,
    ):
        self._fn, self._static, self._rows, self._params, self._batch = fn, static_argnums, rows, params, batch
        name = getattr(fn, "__name__", "program")
        self.plain = StoredJit(fn, name=name, static_argnums=static_argnums)
        self._tuned: dict[tuple, Callable] = {}

    def _pick(self, args):
        params = self._params(*args)
        options = (
            cpu_compiler_options(self._rows(*args), weights_dtype(params), program_platform(params), self._batch(*args))
            if _top_level()
            else None
        )
        if not options:
            return self.plain
        key = tuple(sorted(options.items()))
        if key not in self._tuned:
            name = getattr(self._fn, "__name__", "program")
            self._tuned[key] = StoredJit(self._fn, name=name, static_argnums=self._static, compiler_options=options)
        return self._tuned[key]

    def __call__(self, *args):
        return self._pick(args)(*args)

    def lower(self, *args) -> jax.stages.Lowered:
        """The lowered program ``__call__`` would run (its ``compile()`` uses the same options)."""
        return self._pick(args).lower(*args)

    def _cache_size(self) -> int:
        return self.plain._cache_size() + sum(f._cache_size() for f in self._tuned.values())
