"""Tests of weight-only int8 quantization (specjax.quantize, Qwix): the quantized values against a NumPy reference,
the decode programs against the float model on the NumPy-dequantized weights, and the exactness contract with a
quantized draft (the target's output, bit for bit when greedy, in law when sampled) and a quantized target (the
quantized target's own output).

Statistical tests: fixed seeds, chi-square at significance 0.001 (``test_decoding.SIGNIFICANCE``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decoding import SIGNIFICANCE, _chi_square, _exact_sequence_distribution, _inputs, _t5_config, tiny_pair

from specjax import BulkDecoder, T5Config, T5Model, speculative_sample, temperature_sample
from specjax.checkpoints import load_checkpoint, save_checkpoint
from specjax.decoder import Decoder
from specjax.models.adapter import T5Decoding
from specjax.quantize import (
    QuantizedDecoding,
    QuantizedT5Model,
    dequantize_params,
    is_quantized,
    quantize,
    quantize_params,
)
from specjax.sampling import Sampler


def _numpy_dequantized(params):
    """The float32 tree the int8 model stands for, computed in NumPy from its int8 values and scales."""
    return jax.tree_util.tree_map(
        lambda x: (
            np.asarray(x.qvalue, np.float32) * np.asarray(x.scale, np.float32)
            if hasattr(x, "qvalue")
            else np.asarray(x)
        ),
        params,
        is_leaf=lambda x: hasattr(x, "qvalue"),
    )


@pytest.fixture(scope="module")
def tiny():
    config = _t5_config(vocab=32, d=32)
    return T5Model.random(config, seed=3), T5Model.random(config, seed=4)


def test_kernels_are_int8_per_output_column_against_numpy(tiny):
    """Every dense kernel [i, o]: scale = max |w| over i / 127.5 (float32 [1, o]; Qwix's symmetric int8 bound,
    qmax + 0.5), values = round(w / scale) clipped to [-128, 127] (int8); every other leaf unchanged."""
    target, _ = tiny
    q = quantize_params(target.params)
    flat = jax.tree_util.tree_flatten_with_path(target.params)[0]
    qflat = dict(jax.tree_util.tree_flatten_with_path(q, is_leaf=lambda x: hasattr(x, "qvalue"))[0])
    kernels = 0
    for path, w in flat:
        got = qflat[path]
        if jax.tree_util.keystr(path).endswith("['kernel']"):
            kernels += 1
            w = np.asarray(w, np.float32)
            scale = np.abs(w).max(axis=0, keepdims=True) / 127.5
            np.testing.assert_allclose(np.asarray(got.scale), scale, rtol=1e-6)
            assert got.qvalue.dtype == jnp.int8 and got.qvalue.shape == w.shape
            values = np.asarray(got.qvalue, np.int32)
            assert np.abs(values - np.clip(np.round(w / scale), -128, 127)).max() <= 1  # an exact tie may round apart
            err = np.abs(values * np.asarray(got.scale) - w)
            assert (err <= 0.5 * scale * (1 + 1e-4)).all()  # to nearest: half a step (the extreme clipped)
        else:
            np.testing.assert_array_equal(np.asarray(got), np.asarray(w))
    assert kernels == 2 * 7 + 2 * 11 + 1  # encoder q/k/v/o + wi_0/wi_1/wo, decoder + cross q/k/v/o, logits
    assert is_quantized(q) and not is_quantized(target.params)
    with pytest.raises(ValueError, match="quantized already"):
        quantize_params(q)
    with pytest.raises(ValueError, match="qtype must be one of"):
        quantize_params(target.params, "int4")


def test_quantized_model_decodes_as_the_float_model_on_the_dequantized_weights(tiny):
    """float32 compute: the int8 model's logits and its greedy / sampled decodes equal, bit for bit, those of a
    plain T5Model holding the NumPy-dequantized weights (so the programs read the int8 values and the scales)."""
    target, _ = tiny
    q8 = quantize(target)
    assert isinstance(q8, QuantizedT5Model) and q8.num_params == target.num_params
    assert q8.weight_bytes < 0.45 * sum(x.nbytes for x in jax.tree_util.tree_leaves(target.params))
    reference = T5Model(q8.config, jax.tree_util.tree_map(jnp.asarray, _numpy_dequantized(q8.params)))
    x = _inputs(np.random.default_rng(0), 8, 10, 32)
    dec = np.zeros((8, 5), np.int32)
    np.testing.assert_array_equal(np.asarray(q8.logits(x, dec)), np.asarray(reference.logits(x, dec)))
    for temperature in (0.0, 1.0):
        a = temperature_sample(q8, x, rng=1, max_decode_length=8, temperature=temperature)
        b = temperature_sample(reference, x, rng=1, max_decode_length=8, temperature=temperature)
        np.testing.assert_array_equal(a.sequences, b.sequences)
    # Not the float model: int8 rounding moves the logits.
    assert not np.array_equal(np.asarray(q8.logits(x, dec)), np.asarray(target.logits(x, dec)))


@pytest.mark.parametrize("case", ["int8 draft", "int8 target, float draft", "int8 target, int8 draft", "bf16 int8"])
def test_greedy_speculative_equals_its_target_alone(tiny, case):
    """100 inputs of mixed lengths, gamma in {1, 4}: token for token equal to the (possibly int8) target
    alone; "bf16 int8": int8 target and draft computing in bfloat16."""
    target, draft = tiny
    if case == "int8 draft":
        draft = quantize(target)  # a quantized copy of the target: a close draft, so both paths are exercised
    elif case == "int8 target, float draft":
        target = quantize(target)
    elif case == "int8 target, int8 draft":
        target, draft = quantize(target), quantize(draft)
    else:
        target, draft = quantize(target, compute_dtype="bfloat16"), quantize(draft, compute_dtype="bfloat16")
    inputs = _inputs(np.random.default_rng(7), 100, 12, 32)
    base = temperature_sample(target, inputs, rng=0, max_decode_length=16, temperature=0)
    for gamma in (1, 4):
        r = speculative_sample(target, draft, inputs, rng=0, gamma=gamma, max_decode_length=16, temperature=0)
        np.testing.assert_array_equal(r.sequences, base.sequences, err_msg=f"gamma={gamma}")
        np.testing.assert_array_equal(r.lengths, base.lengths)
    if case == "int8 draft":
        assert 0.5 < float(r.acceptance_rate) < 1.0


def test_decoder_and_bulk_greedy_equal_the_int8_target_alone(tiny):
    """``Decoder`` and ``BulkDecoder`` (slots refilled) with an int8 target and draft give the
    int8 target's greedy output row by row."""
    target, draft = quantize(tiny[0]), quantize(tiny[1])
    inputs = _inputs(np.random.default_rng(11), 12, 10, 32)
    base = temperature_sample(target, inputs, rng=0, max_decode_length=12, temperature=0)
    r = Decoder(target, draft, gamma=3, max_decode_length=12)(inputs, rng=0, temperature=0.0)
    np.testing.assert_array_equal(r.sequences, base.sequences)
    rows = [list(row[row != 0]) for row in inputs]
    bulk = BulkDecoder(target, draft, batch_size=4, gamma=2, max_decode_length=12, read_ahead=1)
    for got in bulk.generate(rows, temperature=0.0, rng=0):
        n = int(base.lengths[got.index])
        np.testing.assert_array_equal(got.tokens, np.asarray(base.sequences[got.index, :n]))


def test_scanned_layers_read_the_int8_kernels_as_the_unrolled_ones(tiny):
    """``decoding_model(scan_layers=True)`` (stacked int8 values and scales, some transposed) gives the unrolled
    program's greedy output and logits within float32 rounding."""
    target = quantize(tiny[0])
    x = _inputs(np.random.default_rng(5), 6, 10, 32)
    results = []
    for scan in (False, True):
        fns, params = target.decoding_model(scan_layers=scan)
        results.append(temperature_sample((fns, params), x, rng=0, max_decode_length=10, temperature=0))
        enc = fns.encode(params, jnp.asarray(x))
        window, cache = jnp.zeros((6, 3), jnp.int32), fns.init_cache(6, 10)
        logits, _ = fns.decode(params, enc, window, cache, jnp.zeros(6, jnp.int32))
        results.append(np.asarray(logits))
    np.testing.assert_array_equal(results[0].sequences, results[2].sequences)
    np.testing.assert_allclose(results[1], results[3], atol=1e-5)


def test_scanned_int8_decode_dequantizes_one_layer_at_a_time():
    """The scanned int8 decode program (``decoding_model(scan_layers=True)``) dequantizes each layer's slice inside
    the scan body: its temporaries (``memory_analysis`` of the compiled program) stay below the bytes of the
    decoder's dequantized layer stack, and its logits equal, bit for bit, those of the program that dequantizes the
    whole stacked tree before the scan. That program is the control: its temporaries hold the whole stack, so the
    measure does see such a copy."""
    config = T5Config(
        vocab_size=32, d_model=64, num_heads=4, head_dim=16, mlp_dim=512, num_encoder_layers=2,
        num_decoder_layers=6, name="tiny",
    )  # fmt: skip
    q8 = quantize(T5Model.random(config, seed=5))
    fns, params = q8.decoding_model(scan_layers=True)
    assert isinstance(fns, QuantizedDecoding) and fns.scan_layers
    is_q = lambda x: hasattr(x, "qvalue")  # noqa: E731
    kernels = [x for x in jax.tree_util.tree_leaves(params["decoder"]["layers"], is_leaf=is_q) if is_q(x)]
    assert len(kernels) == 11 and all(k.qvalue.shape[0] == config.num_decoder_layers for k in kernels)
    stack_bytes = sum(k.qvalue.size for k in kernels) * np.dtype(config.param_dtype).itemsize  # 3.1 MB
    float_fns = T5Decoding(fns.config, fns.encode_widths, fns.kv_dtype, fns.scan_layers, fns.slice_rows)

    def whole_tree_first(params, encoded, tokens, cache, positions):
        return float_fns.decode(dequantize_params(params, config.param_dtype), encoded, tokens, cache, positions)

    x = jnp.asarray(_inputs(np.random.default_rng(2), 2, 10, 32))
    args = (
        params,
        fns.encode(params, x),
        jnp.full((2, 3), 5, jnp.int32),
        fns.init_cache(2, 16),
        jnp.zeros(2, jnp.int32),
    )
    per_layer = jax.jit(fns.decode).lower(*args).compile()
    whole = jax.jit(whole_tree_first).lower(*args).compile()
    assert per_layer.memory_analysis().temp_size_in_bytes < stack_bytes / 2
    assert whole.memory_analysis().temp_size_in_bytes >= stack_bytes
    np.testing.assert_array_equal(np.asarray(per_layer(*args)[0]), np.asarray(whole(*args)[0]))


@pytest.mark.slow
@pytest.mark.parametrize("quantized", ["draft", "target and draft"])
def test_sampled_output_has_its_targets_distribution(tiny_pair, quantized):  # noqa: F811
    """>= 100k speculative samples (temperature 1, γ 3, 3 distinct inputs) against the exact sequence distribution
    of the target (the int8 target's when it is quantized): chi-square, significance 0.001."""
    target, draft = tiny_pair
    draft = quantize(draft)
    if quantized == "target and draft":
        target = quantize(target)
    max_len, batch = 4, 3
    inputs = _inputs(np.random.default_rng(batch), batch, 5, 6)
    dist = _exact_sequence_distribution(target, inputs, Sampler(temperature=1.0), max_len)
    observed, rows_per_input, per_chunk = {}, dict.fromkeys(range(batch), 0), 20_001 // batch
    for c in range(5):
        r = speculative_sample(
            target, draft, np.tile(inputs, (per_chunk, 1)), rng=jax.random.PRNGKey(2000 + c), gamma=3,
            max_decode_length=max_len, temperature=1.0,
        )  # fmt: skip
        for idx, (seq, n) in enumerate(zip(np.asarray(r.sequences), np.asarray(r.lengths))):
            key = (idx % batch, tuple(seq[:n].tolist()))
            observed[key] = observed.get(key, 0) + 1
        for i in range(batch):
            rows_per_input[i] += per_chunk
    assert sum(rows_per_input.values()) >= 100_000
    result, _ = _chi_square(observed, dist, rows_per_input)
    assert 0.01 < float(r.acceptance_rate) < 0.99
    assert result.pvalue > SIGNIFICANCE


def test_load_checkpoint_int8(tiny, tmp_path):
    """``load_checkpoint(dtype="int8")`` quantizes a checkpoint at load (the same int8 values as ``quantize`` of the
    float32 load), in the compute dtype asked for; bad combinations are one-line errors."""
    target, _ = tiny
    save_checkpoint(target, tmp_path / "m")
    q8 = load_checkpoint(tmp_path / "m", dtype="int8", compute_dtype="float32")
    ref = quantize(load_checkpoint(tmp_path / "m", dtype="float32"))
    assert isinstance(q8, QuantizedT5Model) and q8.config.dtype == "float32"
    for a, b in zip(jax.tree_util.tree_leaves(q8.params), jax.tree_util.tree_leaves(ref.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    bf = load_checkpoint(tmp_path / "m", dtype="int8", compute_dtype="bfloat16")
    assert bf.config.dtype == "bfloat16" and bf.params["token_embedder"]["embedding"].dtype == jnp.bfloat16
    f = dequantize_params(bf.params, jnp.bfloat16)
    assert f["decoder"]["logits_dense"]["kernel"].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="compute_dtype is for dtype='int8'"):
        load_checkpoint(tmp_path / "m", dtype="float32", compute_dtype="bfloat16")
    with pytest.raises(ValueError, match="int8"):
        load_checkpoint(tmp_path / "m", dtype="int4")
    with pytest.raises(ValueError, match="quantized already"):
        quantize(q8)


def test_the_cost_ratio_of_an_int8_draft_times_the_steps_the_loops_run(tiny):
    """``bench.measure_cost_ratio`` with an int8 draft (and an int8 target) times the dequantized model's steps,
    as the unscanned loops run them (the dequantization hoisted out of the loop): positive step times and c =
    draft step / target step."""
    from specjax import bench

    target, draft = tiny
    x = _inputs(np.random.default_rng(1), 2, 6, 32)
    for t, d in ((target, quantize(draft)), (quantize(target), quantize(draft))):
        r = bench.measure_cost_ratio(t, d, x, gamma=2, steps=2, repeats=1)
        assert r["draft_step_s"] > 0 and r["target_step_s"] > 0 and r["target_window_s"] > 0
        assert r["c"] == pytest.approx(r["draft_step_s"] / r["target_step_s"])
