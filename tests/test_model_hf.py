"""specjax's T5 against Hugging Face's PyTorch T5 (an independent implementation), through the HF loader.

Random tiny models of both families are built in transformers, saved with ``save_pretrained``, loaded with
``specjax.load_checkpoint`` and compared in float32 on a padded batch (atol 1e-4), at real encoder
positions and at every decoder position (decoder self-attention is causal only in both).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specjax  # noqa: E402

ATOL = 1e-4
FAMILIES = {
    # T5 1.0: ReLU MLP, logits through the tied embedding (scaled by 1/sqrt(d)).
    "t5_1_0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    # T5 1.1 / Flan-T5: gated GELU, untied lm_head.
    "t5_1_1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    # transformers >= 5 ties lm_head to shared for every T5 and saves only shared.weight, with
    # scale_decoder_outputs=false: an unscaled head equal to the embedding.
    "t5_1_1_shared_head": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}
UNTIE = {"t5_1_1"}
ENC = np.array([[5, 9, 23, 17, 44, 1, 0, 0], [7, 3, 61, 1, 0, 0, 0, 0], [12, 80, 33, 2, 90, 4, 5, 1]], np.int32)
DEC = np.array([[0, 14, 3, 77, 8, 1], [0, 6, 1, 0, 0, 0], [0, 95, 2, 2, 40, 11]], np.int32)


def make_hf_model(family: str, seed: int = 0):
    """A random tiny transformers T5 with non-trivial layer norms (and an untied head for 1.1)."""
    torch.manual_seed(seed)
    cfg = transformers.T5Config(
        vocab_size=96,
        d_model=24,
        d_kv=6,
        num_heads=4,
        d_ff=40,
        num_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        **FAMILIES[family],
    )
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5))
            elif "relative_attention_bias" in name:
                p.copy_(torch.randn_like(p))
        if family in UNTIE:
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * 0.3)
    return model


def hf_outputs(model, enc, dec):
    with torch.no_grad():
        ids = torch.tensor(enc, dtype=torch.long)
        mask = torch.tensor(enc != 0, dtype=torch.long)
        encoded = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        logits = model(
            input_ids=ids, attention_mask=mask, decoder_input_ids=torch.tensor(dec, dtype=torch.long)
        ).logits.numpy()
    return encoded, logits


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def hf_dir(request, tmp_path_factory):
    family = request.param
    model = make_hf_model(family)
    path = tmp_path_factory.mktemp(family)
    model.save_pretrained(path, safe_serialization=True)
    return family, model, path


def test_hf_checkpoint_matches_transformers(hf_dir):
    family, hf_model, path = hf_dir
    model = specjax.load_checkpoint(path)
    cfg = model.config
    assert cfg.family == family[:6]
    assert cfg.logits_via_embedding == (family == "t5_1_0")
    assert (cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (24, 4, 6, 40)
    assert (cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance) == (8, 16)
    want_enc, want_logits = hf_outputs(hf_model, ENC, DEC)
    got_enc = np.asarray(model.encoder_outputs(ENC))
    got_logits = np.asarray(model.logits(ENC, DEC))
    real = ENC != 0
    np.testing.assert_allclose(got_enc[real], want_enc[real], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got_logits, want_logits, atol=ATOL, rtol=0)
    assert np.abs(want_logits).max() > 0.1  # the comparison is not between near-zero numbers


def test_specjax_hf_export_loads_in_transformers(hf_dir, tmp_path):
    """specjax -> save_checkpoint(format='hf') -> transformers gives the same numbers."""
    family, hf_model, path = hf_dir
    model = specjax.load_checkpoint(path)
    specjax.save_checkpoint(model, tmp_path / "out", format="hf")
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    want_enc, want_logits = hf_outputs(hf_model, ENC, DEC)
    got_enc, got_logits = hf_outputs(reloaded, ENC, DEC)
    np.testing.assert_array_equal(got_logits, want_logits)
    np.testing.assert_array_equal(got_enc[ENC != 0], want_enc[ENC != 0])


def test_pytorch_model_bin(hf_dir, tmp_path):
    """The legacy PyTorch pickle (``pytorch_model.bin``) gives the same parameters as safetensors."""
    family, hf_model, path = hf_dir
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    torch.save(hf_model.state_dict(), tmp_path / "pytorch_model.bin")
    a = specjax.load_checkpoint(path)
    b = specjax.load_checkpoint(tmp_path)
    flat_a = specjax.checkpoints.rules.flatten(a.params)
    flat_b = specjax.checkpoints.rules.flatten(b.params)
    assert flat_a.keys() == flat_b.keys()
    for k in flat_a:
        np.testing.assert_array_equal(np.asarray(flat_a[k]), np.asarray(flat_b[k]), err_msg=k)
