"""Checkpoint readers and writers: t5x's own fixtures (bit-exact), round trips, and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import specjax
from specjax import CheckpointError, T5Config, T5Model
from specjax.checkpoints import detect_format
from specjax.checkpoints.rules import flatten

T5X_FIXTURES = ["t5x_test_t5_tiny.checkpoint_0", "t5x/legacy_ts/checkpoint_0", "t5x/orbax/checkpoint_0"]
TINY = dict(
    vocab_size=64,
    d_model=16,
    num_heads=2,
    head_dim=4,
    mlp_dim=24,
    num_encoder_layers=2,
    num_decoder_layers=3,
    relative_attention_num_buckets=8,
)
FAMILIES = {
    "t5_1_0": dict(gated_gelu=False, logits_via_embedding=True),
    "t5_1_1": dict(gated_gelu=True, logits_via_embedding=False),
}


def assert_same_params(a, b):
    fa, fb = flatten(a), flatten(b)
    assert sorted(fa) == sorted(fb)
    for k in fa:
        x, y = np.asarray(fa[k]), np.asarray(fb[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert x.tobytes() == y.tobytes(), f"{k} differs"


@pytest.fixture(scope="module")
def target_params(fixtures_dir):
    with np.load(fixtures_dir / "t5x" / "params_target.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny_model(request):
    cfg = T5Config(**TINY, **FAMILIES[request.param], name="tiny")
    return T5Model.random(cfg, seed=3)


# ----------------------------------------------------------------------------------------------------------
# t5x fixtures


@pytest.mark.parametrize("name", T5X_FIXTURES)
def test_t5x_fixture_loads_bit_exact(fixtures_dir, target_params, name):
    model = specjax.load_checkpoint(fixtures_dir / name)
    assert_same_params(model.params, target_params)
    cfg = model.config
    # README: emb_dim=8, num_heads=4, head_dim=3, mlp_dim=16, 2+2 layers, gated GELU, untied logits.
    assert (cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (32128, 8, 4, 3, 16)
    assert (cfg.num_encoder_layers, cfg.num_decoder_layers) == (2, 2)
    assert cfg.gated_gelu and not cfg.logits_via_embedding and cfg.param_dtype == "float32"


def test_t5x_msgpack_file_and_directory_forms(fixtures_dir):
    assert detect_format(fixtures_dir / "t5x/legacy_ts/checkpoint_0")[0] == "t5x"
    a = specjax.load_checkpoint(fixtures_dir / "t5x/legacy_ts/checkpoint_0/checkpoint")
    b = specjax.load_checkpoint(fixtures_dir / "t5x/legacy_ts")  # a model dir: its latest checkpoint_N
    assert_same_params(a.params, b.params)


def test_t5x_fixture_logits_match_case1(fixtures_dir):
    model = specjax.load_checkpoint(fixtures_dir / "t5x/orbax/checkpoint_0")
    case = np.load(fixtures_dir / "t5x" / "case1.npz")
    logits = np.asarray(model.logits(case["encoder_input_tokens"], case["decoder_input_tokens"]))
    encoded = np.asarray(model.encoder_outputs(case["encoder_input_tokens"]))
    weights = case["decoder_loss_weights"] == 1
    real = case["encoder_input_tokens"] > 0
    np.testing.assert_allclose(logits[weights], case["logits"][weights], atol=1e-4, rtol=0)
    np.testing.assert_allclose(encoded[real], case["encoded"][real], atol=1e-4, rtol=0)


def test_t5x_to_hf_to_specjax_round_trip(fixtures_dir, tmp_path):
    model = specjax.load_checkpoint(fixtures_dir / "t5x/legacy_ts/checkpoint_0")
    specjax.save_checkpoint(model, tmp_path / "hf", format="hf")
    assert detect_format(tmp_path / "hf")[0] == "hf"
    back = specjax.load_checkpoint(tmp_path / "hf")
    assert_same_params(back.params, model.params)
    assert back.config.replace(name="x") == model.config.replace(name="x")


# ----------------------------------------------------------------------------------------------------------
# Round trips of random models, both families


def test_specjax_t5x_specjax_round_trip(tiny_model, tmp_path):
    specjax.save_checkpoint(tiny_model, tmp_path / "checkpoint_7", format="t5x", step=7)
    back = specjax.load_checkpoint(tmp_path / "checkpoint_7")
    assert_same_params(back.params, tiny_model.params)
    # T5X checkpoints carry no config: it is inferred from the shapes.
    assert back.config.replace(name="tiny") == tiny_model.config


def test_specjax_hf_specjax_round_trip(tiny_model, tmp_path):
    specjax.save_checkpoint(tiny_model, tmp_path / "hf", format="hf")
    back = specjax.load_checkpoint(tmp_path / "hf")
    assert_same_params(back.params, tiny_model.params)
    assert back.config.replace(name="tiny") == tiny_model.config


def test_bfloat16_round_trip_and_dtype_cast(tiny_model, tmp_path):
    bf16 = tiny_model.astype("bfloat16")
    for fmt in ("hf", "t5x"):
        specjax.save_checkpoint(bf16, tmp_path / fmt, format=fmt)
        back = specjax.load_checkpoint(tmp_path / fmt, dtype=None)  # None keeps the stored dtype
        assert back.config.param_dtype == "bfloat16"
        assert_same_params(back.params, bf16.params)
        default = specjax.load_checkpoint(tmp_path / fmt)  # the one default everywhere: float32
        assert default.config.param_dtype == "float32"
        stored = flatten(bf16.params)
        for name, x in flatten(default.params).items():  # bf16 -> float32 is exact
            np.testing.assert_array_equal(np.asarray(x), np.asarray(stored[name], np.float32), err_msg=name)
    cast = specjax.load_checkpoint(tmp_path / "hf", dtype="float32")
    assert cast.config.dtype == "float32"
    assert {np.asarray(x).dtype.name for x in flatten(cast.params).values()} == {"float32"}


def test_convert_cli(fixtures_dir, tmp_path, capsys):
    from specjax.cli import main

    assert (
        main(["convert", str(fixtures_dir / "t5x_test_t5_tiny.checkpoint_0"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    )
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "checkpoint_0"), "--to", "t5x"]) == 0
    assert "wrote t5x checkpoint" in capsys.readouterr().out
    a = specjax.load_checkpoint(fixtures_dir / "t5x_test_t5_tiny.checkpoint_0")
    assert_same_params(specjax.load_checkpoint(tmp_path / "checkpoint_0").params, a.params)
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "x"), "--to", "hf"]) == 2
    assert "does not exist" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------
# Clear errors


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        specjax.load_checkpoint(tmp_path / "no_such_checkpoint")


def test_folder_without_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match=r"No recognisable checkpoint.*notes\.txt.*config\.json"):
        specjax.load_checkpoint(tmp_path)


def test_truncated_msgpack(fixtures_dir, tmp_path):
    data = (fixtures_dir / "t5x_test_t5_tiny.checkpoint_0").read_bytes()
    (tmp_path / "checkpoint").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        specjax.load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="truncated"):
        specjax.load_checkpoint(tmp_path / "checkpoint")


def test_truncated_safetensors(tiny_model, tmp_path):
    specjax.save_checkpoint(tiny_model, tmp_path, format="hf")
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated"):
        specjax.load_checkpoint(tmp_path)
    path.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="truncated"):
        specjax.load_checkpoint(tmp_path)


def test_config_that_does_not_match_the_weights(tiny_model, tmp_path):
    specjax.save_checkpoint(tiny_model, tmp_path, format="hf")
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["d_ff"] = 30
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"has shape \(24, 16\).*mlp_dim=30.*config\.json"):
        specjax.load_checkpoint(tmp_path)
    cfg["d_ff"], cfg["num_layers"] = 24, 1
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"does not expect.*encoder\.block\.1"):
        specjax.load_checkpoint(tmp_path)


def test_unknown_hf_key(tiny_model, tmp_path):
    from specjax.checkpoints.hf import read_safetensors, write_safetensors

    specjax.save_checkpoint(tiny_model, tmp_path, format="hf")
    tensors = dict(read_safetensors(tmp_path / "model.safetensors"))
    tensors["encoder.block.0.layer.0.SelfAttention.q.bias"] = np.zeros(8, np.float32)
    write_safetensors(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no rule maps.*SelfAttention\.q\.bias"):
        specjax.load_checkpoint(tmp_path)


def test_missing_parameter(tiny_model, tmp_path):
    from specjax.checkpoints.t5x import write_t5x

    flat = flatten(tiny_model.params)
    del flat["decoder/layers_1/mlp/wo/kernel"]
    write_t5x(flat, str(tmp_path))
    with pytest.raises(CheckpointError, match=r"missing parameters decoder/layers_1/mlp/wo/kernel"):
        specjax.load_checkpoint(tmp_path)


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"Unknown T5 preset 't5_1_1_huge'.*t5_1_1_xxl"):
        T5Config.preset("t5_1_1_huge")


def test_tokens_outside_the_vocabulary(tiny_model):
    enc = np.array([[3, 4, 1]], np.int32)
    with pytest.raises(ValueError, match=r"encoder_input_tokens .*outside the vocabulary \[0, 64\).*max 64"):
        tiny_model.logits(np.array([[3, 64, 1]], np.int32), np.array([[0, 5]], np.int32))
    with pytest.raises(ValueError, match=r"decoder_input_tokens .*outside the vocabulary"):
        tiny_model.logits(enc, np.array([[0, 99]], np.int32))
