"""Scanned layers (``T5Decoding.scan_layers``): the same model as the unrolled layers.

The scanned program (parameters stacked by ``t5.stack_layers``, one ``lax.scan`` over the layers in encode and
in every decode window, caches and cross-attention memory stacked per layer) is checked against the unrolled
one, which ``tests/test_cache.py`` checks against the uncached teacher-forced pass: float32 logits and caches
within 1e-5 (the two programs sum in different orders only where XLA fuses differently), greedy speculative
output token for token, and stacking that round-trips exactly.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import T5Config, T5Model, speculative_sample
from specjax.models import t5
from specjax.models.adapter import T5Decoding

ATOL = 1e-5
TINY = dict(
    vocab_size=50,
    d_model=16,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=3,
    num_decoder_layers=2,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
)
FAMILIES = {
    "t5_1_0": dict(gated_gelu=False, logits_via_embedding=True),
    "t5_1_1": dict(gated_gelu=True, logits_via_embedding=False),
    # umT5: a relative position table per layer (scanned with the layer); UL2's gated SiLU; an unscaled tied head.
    "umt5": dict(per_layer_relpos_bias=True),
    "silu_tied": dict(mlp_activations=("silu", "linear"), logits_via_embedding=True, logits_scaling=False),
}


@functools.partial(jax.jit, static_argnums=(0, 1, 7))
def _decode(config, scanned, params, encoded, tokens, cache, positions, slice_rows=False):
    run = t5.decode_scanned if scanned else t5.decode
    return run(config, params, encoded, tokens, cache, positions, slice_rows)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _encode(config, scanned, params, tokens):
    return (t5.encode_scanned if scanned else t5.encode)(config, params, tokens)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def setup(request):
    cfg = T5Config(**TINY, **FAMILIES[request.param])
    model = T5Model.random(cfg, seed=2)
    rng = np.random.default_rng(0)
    enc = rng.integers(3, cfg.vocab_size, size=(3, 9)).astype(np.int32)
    enc[0, 6:] = 0  # padding in row 0
    enc[2, 3:] = 0
    return cfg, model, t5.stack_layers(cfg, model.params), enc


def test_stack_round_trip_and_shapes(setup):
    cfg, model, stacked, _ = setup
    kernel = stacked["decoder"]["layers"]["mlp"]["wo"]["kernel"]
    assert kernel.shape == (cfg.num_decoder_layers, cfg.mlp_dim, cfg.d_model)
    np.testing.assert_array_equal(kernel[1], model.params["decoder"]["layers_1"]["mlp"]["wo"]["kernel"])
    assert stacked["encoder"]["layers"]["attention"]["query"]["kernel"].shape[0] == cfg.num_encoder_layers
    assert "layers_0" not in stacked["encoder"]
    if cfg.per_layer_relpos_bias:  # umT5: the tables are per layer, stacked with the layers
        table = stacked["decoder"]["layers"]["relpos_bias"]["rel_embedding"]
        assert table.shape == (cfg.num_decoder_layers, cfg.num_heads, cfg.relative_attention_num_buckets)
    else:
        assert "relpos_bias" in stacked["encoder"]
    back = t5.unstack_layers(cfg, stacked)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(model.params)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(model.params)):
        np.testing.assert_array_equal(a, b)
    # Host (NumPy) and abstract trees stack the same way; the logical axes gain "layers" first.
    host = t5.stack_layers(cfg, jax.tree_util.tree_map(np.asarray, model.params))
    assert isinstance(host["decoder"]["layers"]["mlp"]["wo"]["kernel"], np.ndarray)
    abstract = t5.stack_layers(cfg, t5.abstract_params(cfg))
    assert jax.tree_util.tree_map(lambda x: x.shape, abstract) == jax.tree_util.tree_map(lambda x: x.shape, stacked)
    shapes = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), t5.unstack_layers(cfg, abstract))
    assert shapes == jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), model.params)
    axes = t5.stacked_param_logical_axes(cfg)
    assert tuple(axes["decoder"]["layers"]["mlp"]["wo"]["kernel"]) == ("layers", "mlp", "embed")
    assert tuple(axes["token_embedder"]["embedding"]) == ("vocab", "embed")
    # The decoder's query / key / value (self) and query (cross) kernels are stacked transposed: [l, n*h, d].
    for block, kernel in (
        ("self_attention", "query"),
        ("self_attention", "value"),
        ("encoder_decoder_attention", "query"),
    ):
        stacked_kernel = stacked["decoder"]["layers"][block][kernel]["kernel"]
        assert stacked_kernel.shape == (cfg.num_decoder_layers, cfg.num_heads * cfg.head_dim, cfg.d_model)
        np.testing.assert_array_equal(stacked_kernel[1], model.params["decoder"]["layers_1"][block][kernel]["kernel"].T)
        assert tuple(axes["decoder"]["layers"][block][kernel]["kernel"]) == ("layers", "joined_kv", "embed")
        assert abstract["decoder"]["layers"][block][kernel]["kernel"].shape == stacked_kernel.shape
    assert stacked["decoder"]["layers"]["encoder_decoder_attention"]["key"]["kernel"].shape[1] == cfg.d_model
    assert stacked["encoder"]["layers"]["attention"]["query"]["kernel"].shape[1] == cfg.d_model


def test_stacking_errors_name_the_problem(setup):
    cfg, model, stacked, enc = setup
    with pytest.raises(ValueError, match="stacked already"):
        t5.stack_layers(cfg, stacked)
    with pytest.raises(ValueError, match="not stacked"):
        t5.unstack_layers(cfg, model.params)
    with pytest.raises(ValueError, match="lacks layers_2"):
        t5.stack_layers(cfg.replace(num_decoder_layers=3), model.params)
    with pytest.raises(ValueError, match="stack_layers"):
        t5.encode_scanned(cfg, model.params, enc)


def test_encode_scanned_equals_unrolled(setup):
    cfg, model, stacked, enc = setup
    plain = _encode(cfg, False, model.params, enc)
    scanned = _encode(cfg, True, stacked, enc)
    l, b, n, h, s = cfg.num_decoder_layers, enc.shape[0], cfg.num_heads, cfg.head_dim, enc.shape[1]
    assert scanned.cross_k.shape == (l, b, n, h, s) and scanned.cross_v.shape == (l, b, n, s, h)
    np.testing.assert_array_equal(scanned.mask, plain.mask)
    np.testing.assert_allclose(scanned.cross_k, np.stack(plain.cross_k), atol=ATOL, rtol=0)
    np.testing.assert_allclose(scanned.cross_v, np.stack(plain.cross_v), atol=ATOL, rtol=0)
    assert t5.stacked_logical_axes(scanned).cross_k == ("layers", "batch", "heads", "kv", "length")


def test_decode_windows_equal_unrolled(setup):
    """Windows of 1, 3 and 8 tokens, rows at their own positions (advancing by different amounts, so later
    windows overwrite stale slots): logits and the whole cache after every window within 1e-5."""
    cfg, model, stacked, enc = setup
    windows = (1, 3, 8, 1, 3)
    b, length = enc.shape[0], 16
    plain_enc, scan_enc = _encode(cfg, False, model.params, enc), _encode(cfg, True, stacked, enc)
    plain_cache, scan_cache = t5.init_cache(cfg, b, length), t5.init_cache(cfg, b, length, stacked=True)
    assert scan_cache.k.shape == (cfg.num_decoder_layers, b, cfg.num_heads, length, cfg.head_dim)
    rng = np.random.default_rng(sum(windows))
    positions = np.array([0, 2, 5], np.int32)
    for k in windows:
        tokens = rng.integers(2, cfg.vocab_size, size=(b, k)).astype(np.int32)
        plain_logits, plain_cache = _decode(cfg, False, model.params, plain_enc, tokens, plain_cache, positions)
        scan_logits, scan_cache = _decode(cfg, True, stacked, scan_enc, tokens, scan_cache, positions)
        np.testing.assert_allclose(scan_logits, plain_logits, atol=ATOL, rtol=0)
        np.testing.assert_allclose(scan_cache.k, np.stack(plain_cache.k), atol=ATOL, rtol=0)
        np.testing.assert_allclose(scan_cache.v, np.stack(plain_cache.v), atol=ATOL, rtol=0)
        positions = np.minimum(positions + rng.integers(1, k + 1, size=b).astype(np.int32), length - 1)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("scanned", [False, True])
def test_slice_rows_equal_scatter(setup, scanned, rows):
    """``slice_rows`` (a one-row window written into the cache with a dynamic slice, TPU / GPU programs; more rows
    keep the scatter) gives the logits and caches of the scatter, for windows of 1, 3 and 5 tokens, including
    windows that run past the cache's last slot (their writes there dropped, nothing clamped onto earlier slots)
    and rows past it."""
    cfg, model, stacked, enc = setup
    params = stacked if scanned else model.params
    encoded = _encode(cfg, scanned, params, enc[:rows])
    length = 8
    caches = [t5.init_cache(cfg, rows, length, stacked=scanned) for _ in range(2)]
    rng = np.random.default_rng(5)
    schedule = [(1, [0, 1, 2]), (3, [1, 2, 4]), (5, [2, 3, 6]), (3, [6, 7, 5]), (1, [9, 8, 3]), (5, [4, 9, 7])]
    for k, positions in schedule:
        tokens = rng.integers(2, cfg.vocab_size, size=(rows, k)).astype(np.int32)
        positions = np.asarray(positions[:rows], np.int32)
        outs = [_decode(cfg, scanned, params, encoded, tokens, c, positions, fast) for c, fast in zip(caches, (0, 1))]
        np.testing.assert_allclose(outs[1][0], outs[0][0], atol=ATOL, rtol=0)
        for a, c in zip(jax.tree_util.tree_leaves(outs[1][1]), jax.tree_util.tree_leaves(outs[0][1])):
            np.testing.assert_allclose(a, c, atol=ATOL, rtol=0)
        caches = [out[1] for out in outs]
    assert T5Decoding(cfg).slice_rows is False and model.decoding_model()[0].slice_rows is False  # CPU


def _pair(model: T5Model, scanned: bool):
    """(DecodingModel, params) of ``model`` with scanned or unrolled layers."""
    params = t5.stack_layers(model.config, model.params) if scanned else model.params
    return T5Decoding(model.config, scan_layers=scanned), params


def test_greedy_speculative_output_identical():
    """The speculative loop gives the same tokens and counts with scanned layers; inputs of 20 tokens exercise
    two run-time encoder widths (16, 20)."""
    cfg = T5Config(**TINY)
    target, draft = T5Model.random(cfg, seed=3), T5Model.random(cfg.replace(num_decoder_layers=1), seed=4)
    rng = np.random.default_rng(1)
    tokens = rng.integers(2, cfg.vocab_size, size=(3, 20)).astype(np.int32)
    tokens[0, 10:] = 0
    settings = dict(rng=0, max_decode_length=12, temperature=0.0, eos_id=7)
    results = [
        speculative_sample(_pair(target, s), _pair(draft, s), tokens, gamma=3, **settings) for s in (False, True)
    ]
    for field in ("sequences", "lengths", "num_target_calls", "num_draft_tokens", "num_accepted"):
        np.testing.assert_array_equal(getattr(results[1], field), getattr(results[0], field), err_msg=field)


def test_decoding_model_scans_off_cpu_only(setup):
    """``T5Model.decoding_model()`` keeps the layers unrolled for a CPU program and scans when asked."""
    cfg, model, _, _ = setup
    decoding, params = model.decoding_model()
    assert not decoding.scan_layers and "layers_0" in params["decoder"]
    decoding, params = model.decoding_model(scan_layers=True)
    assert decoding.scan_layers and params["decoder"]["layers"]["mlp"]["wo"]["kernel"].shape[0] == 2
    assert model.decoding_model(scan_layers=True)[1] is params  # stacked once, kept


def test_tpu_program_scans():
    """Abstract parameters sharded over a TPU topology (compiled ahead of time on a CPU host) get scanned layers
    and stacked shardings with a replicated leading "layers" axis."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes may hold libtpu's lock file
    try:
        from jax.experimental import topologies

        devices = topologies.get_topology_desc(
            "v4:1x1x1", "tpu", chip_config_name="megacore", chips_per_host_bounds=(1, 1, 1), num_slices=1
        ).devices
    except Exception as err:  # no libtpu: nothing to compile for
        pytest.skip(f"no TPU topology without libtpu (pip install 'jax[tpu]'): {type(err).__name__}")
    from specjax import parallel

    cfg = T5Config(**TINY)
    mesh = parallel.make_mesh("data:1,model:1", devices=devices[:1])
    shardings = parallel.param_shardings(cfg, mesh)
    abstract = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), t5.abstract_params(cfg), shardings
    )
    decoding, params = T5Model(cfg, abstract).decoding_model()
    assert decoding.scan_layers and decoding.slice_rows
    kernel = params["decoder"]["layers"]["mlp"]["wi_0"]["kernel"]
    assert kernel.shape == (cfg.num_decoder_layers, cfg.d_model, cfg.mlp_dim)
    stacked = parallel.param_shardings(cfg, mesh, stacked=True)
    assert tuple(stacked["decoder"]["layers"]["mlp"]["wi_0"]["kernel"].spec) == (None, None, "model")
    assert tuple(stacked["decoder"]["layers"]["self_attention"]["query"]["kernel"].spec) == (None, "model", None)
    query = params["decoder"]["layers"]["self_attention"]["query"]["kernel"]
    assert query.shape == (cfg.num_decoder_layers, cfg.num_heads * cfg.head_dim, cfg.d_model)
    assert jnp.dtype(kernel.dtype) == jnp.float32


def test_stacked_copy_fits_reads_the_devices_free_memory():
    """The scanned form's stacked weight copy is made only where it fits beside the weights: a device reporting
    less free memory than the parameters' bytes (× 1.05) keeps the unrolled layers; abstract parameters and
    devices without memory statistics always fit."""
    from specjax.models.t5 import _stacked_copy_fits

    params = {"w": jnp.zeros((256, 256), jnp.float32)}  # 262,144 bytes on the one CPU device
    nbytes = 256 * 256 * 4
    assert _stacked_copy_fits(params, memory_stats=lambda d: {"bytes_limit": 10 * nbytes, "bytes_in_use": nbytes})
    assert not _stacked_copy_fits(params, memory_stats=lambda d: {"bytes_limit": 2 * nbytes, "bytes_in_use": nbytes})
    assert _stacked_copy_fits(params, memory_stats=lambda d: None)
    assert _stacked_copy_fits({"w": jax.ShapeDtypeStruct((256, 256), jnp.float32)}, memory_stats=lambda d: {})
