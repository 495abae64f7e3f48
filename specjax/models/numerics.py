"""The numerics under the T5 layers that keep a row's values independent of the call's shape.

``fixed_order_sum``, ``fixed_order_max`` and ``fixed_order_softmax`` reduce in one fixed order (a halving tree of
elementwise operations, never an XLA reduction, whose vectorisation XLA picks from the whole shape), so a row's
RMSNorm and attention weights are the same bits in a window of ``k`` tokens as in a one-token step
(``tests/test_window_invariance.py``). ``_dense_matmul`` is the dense layers' product: bfloat16 operands get
bfloat16 x bfloat16 -> float32 dots, forward and backward (a custom VJP), with the plain einsum's values.

Legend for shapes (STYLE.md): ``b`` batch, ``s`` encoder length, ``t`` decoder length, ``k`` window,
``L`` cache length, ``n`` heads, ``h`` head dim, ``d`` model dim, ``f`` MLP dim, ``v`` vocab, ``l`` layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _dense_matmul(x, kernel):
    """``x [..., i] @ kernel [i, o]`` in the operands' dtype (``Dense``).

    float32 operands: the plain einsum. bfloat16 operands: the plain einsum's values, forward and backward
    (each product accumulated in float32 and rounded once to bfloat16; bfloat16 is exact in float32), but every
    dot, the backward pass's two included (a custom VJP), is bfloat16 x bfloat16 -> float32, which XLA:CPU runs
    natively (AVX512-BF16: ~1,000 GFLOP/s here for [2048, 512] x [512, 1024]) where it rewrites a bfloat16 ->
    bfloat16 dot into converts and a float32 dot (~470 GFLOP/s): the small target's training step 0.7x.
    Only for these 2-D-kernel products: XLA:CPU's plain dot thunk (batched attention dots with the decode loops'
    options) has no bfloat16 x bfloat16 -> float32 kernel.
    """
    if x.dtype == jnp.float32 or x.dtype != kernel.dtype:
        return jnp.einsum("...i,io->...o", x, kernel)
    return _bf16_dense_matmul(x, kernel)


def _f32_accumulated(spec: str, x, y, dtype):
    return jnp.einsum(spec, x, y, preferred_element_type=jnp.float32).astype(dtype)


@jax.custom_vjp
def _bf16_dense_matmul(x, kernel):
    return _f32_accumulated("...i,io->...o", x, kernel, x.dtype)


def _bf16_dense_matmul_fwd(x, kernel):
    return _bf16_dense_matmul(x, kernel), (x, kernel)


def _bf16_dense_matmul_bwd(residuals, g):
    """dx [..., i] = g [..., o] @ kernel^T, dkernel [i, o] = x^T @ g (summed over the leading dims)."""
    x, kernel = residuals
    g = g.astype(x.dtype)
    return (
        _f32_accumulated("...o,io->...i", g, kernel, x.dtype),
        _f32_accumulated("...i,...o->io", x, g, kernel.dtype),
    )


_bf16_dense_matmul.defvjp(_bf16_dense_matmul_fwd, _bf16_dense_matmul_bwd)


def _halving_tree(x, combine, fill: float):
    """``x`` [..., m] reduced over its last axis by ``combine`` in a halving tree: padded with ``fill`` to the next
    power of two ``w``, then ``combine(x[..., :w/2], x[..., w/2:])`` until one column is left. [...]"""
    m = x.shape[-1]
    w = 1 << max(m - 1, 0).bit_length()
    if w != m:
        x = jnp.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, w - m),), constant_values=fill)
    while w > 1:
        w //= 2
        x = combine(x[..., :w], x[..., w:])
    return x[..., 0]


def fixed_order_sum(x):
    """The sum of ``x`` [..., m] over its last axis in one fixed order: a halving tree of elementwise adds.

    The last axis is zero-padded to the next power of two ``w``, then ``x[..., :w/2] + x[..., w/2:]`` is taken
    until one column is left. Elementwise adds are never reassociated by XLA, so every row's sum is the same
    bits whatever the other dimensions are: the number of rows in a call (a one-token step or a window of γ + 1),
    the batch, and the width ``m`` itself as long as entries past a row's real ones are zeros (masked attention
    weights are exactly 0). XLA's own reductions pick a vectorisation from the whole shape (XLA:CPU: across the
    rows when there are enough of them, along the reduced axis otherwise), which rounds a row's sum differently
    in a window than in a step. Returns [...], in ``x``'s dtype.
    """
    return _halving_tree(x, jnp.add, 0.0)


def fixed_order_max(x):
    """The max of ``x`` [..., m] over its last axis by the same halving tree as ``fixed_order_sum`` (elementwise
    ``maximum``, padded with -inf). A max is exact in any order, but an XLA:CPU reduction fused with what follows
    it changed how that fusion computed ``exp``: ``exp(x - max(x))`` differed in the last bit between a one-token
    step and a window of 4 or more rows (batch 1), where the same exp after this tree did not. Returns [...]."""
    return _halving_tree(x, jnp.maximum, -jnp.inf)


def fixed_order_softmax(scores):
    """``softmax(scores)`` over the last axis from ``fixed_order_max`` and ``fixed_order_sum``: no XLA reduction,
    so each row's weights are the same bits in a window and in a one-token step, whatever the row count."""
    shifted = jnp.exp(scores - jax.lax.stop_gradient(fixed_order_max(scores))[..., None])
    return shifted / fixed_order_sum(shifted)[..., None]
