"""``python benchmarks/training.py select-layers``, which made the small pair's 2-decoder-layer draft's starting point.

The reference is T5's pre-norm residual structure: a decoder layer whose three output projections (self-attention
``out``, cross-attention ``out``, MLP ``wo``) are zero adds nothing to the residual stream, so it is the identity.
A 4-layer decoder with layers 1 and 2 zeroed then computes exactly what the 2-layer decoder made of its layers
0 and 3 computes: the teacher-forced logits must agree to float32 rounding, and the speculative loop with the
cut model as the draft must give the target's greedy output.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from flax import traverse_util

from specjax import T5Config, T5Model, load_checkpoint, save_checkpoint, speculative_sample, temperature_sample

REPO = Path(__file__).parents[1]


def _select_layers_module():
    spec = importlib.util.spec_from_file_location("training", REPO / "benchmarks" / "training.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _deep_model() -> T5Model:
    config = T5Config(
        vocab_size=64,
        d_model=32,
        num_heads=2,
        head_dim=16,
        mlp_dim=64,
        num_encoder_layers=2,
        num_decoder_layers=4,
        gated_gelu=True,
        logits_via_embedding=False,
        name="deep",
    )
    model = T5Model.random(config, seed=3)
    flat = traverse_util.flatten_dict(model.params, sep="/")
    for layer in (1, 2):
        for name in ("self_attention/out/kernel", "encoder_decoder_attention/out/kernel", "mlp/wo/kernel"):
            key = f"decoder/layers_{layer}/{name}"
            flat[key] = flat[key] * 0
    return T5Model(config, traverse_util.unflatten_dict(flat, sep="/"))


def test_kept_layers_compute_what_the_deep_model_computes(tmp_path):
    deep = _deep_model()
    save_checkpoint(deep, tmp_path / "deep")
    cut_layers = _select_layers_module().select_layers_main
    cut_layers([str(tmp_path / "deep"), str(tmp_path / "cut"), "--decoder-layers", "0", "3"])
    cut = load_checkpoint(tmp_path / "cut")
    assert (cut.config.num_encoder_layers, cut.config.num_decoder_layers) == (2, 2)
    rng = np.random.default_rng(0)
    enc = rng.integers(2, 64, size=(3, 7)).astype(np.int32)
    dec = np.concatenate([np.zeros((3, 1), np.int32), rng.integers(2, 64, size=(3, 5)).astype(np.int32)], axis=1)
    expected = np.asarray(deep.logits(enc, dec))
    got = np.asarray(cut.logits(enc, dec))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # The cut model as a draft of the deep one: greedy speculative output = the deep target's greedy output.
    base = np.asarray(temperature_sample(deep, enc, max_decode_length=8, temperature=0.0).sequences)
    spec = np.asarray(speculative_sample(deep, cut, enc, gamma=3, max_decode_length=8, temperature=0.0).sequences)
    np.testing.assert_array_equal(spec, base)


@pytest.mark.parametrize("layers", [["0", "4"], ["1", "1"]])
def test_bad_layer_indices_are_refused(tmp_path, layers):
    save_checkpoint(_deep_model(), tmp_path / "deep")
    with pytest.raises(SystemExit, match="give distinct indices in \\[0, 4\\)"):
        cut_layers = _select_layers_module().select_layers_main
        cut_layers([str(tmp_path / "deep"), str(tmp_path / "cut"), "--decoder-layers", *layers])
