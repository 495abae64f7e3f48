"""The T5 family beyond T5 / Flan-T5 (mT5, umT5, UL2, ByT5, MADLAD-400) against transformers' PyTorch classes.

Every model here is a tiny random one written by the test with transformers' ``save_pretrained`` (no
downloads) and read with ``specjax.load_checkpoint``. References: transformers ``T5ForConditionalGeneration``,
``MT5ForConditionalGeneration`` and ``UMT5ForConditionalGeneration`` (an independent implementation) for the
logits (float32, atol 1e-4, every decoder position and real encoder position); a greedy decode by repeated
teacher-forced forward passes (no cache, no loop) for the speculative greedy outputs; transformers'
``ByT5Tokenizer`` for the byte vocabulary; the released sizes for the presets (±3 %).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402

import specjax  # noqa: E402
from specjax import PRESETS, T5Config, T5Model, speculative_sample  # noqa: E402
from specjax.checkpoints import rules  # noqa: E402
from specjax.checkpoints.t5x import write_t5x  # noqa: E402
from specjax.models import t5  # noqa: E402
from specjax.tokenizer import Tokenizer, checkpoint_tokenizer, madlad_language_prefix  # noqa: E402

HERE = Path(__file__).parent
ATOL = 1e-4
CLASSES = {
    "t5": (transformers.T5Config, transformers.T5ForConditionalGeneration),
    "mt5": (transformers.MT5Config, transformers.MT5ForConditionalGeneration),
    "umt5": (transformers.UMT5Config, transformers.UMT5ForConditionalGeneration),
}
TINY = dict(
    vocab_size=96,
    d_model=16,
    d_kv=8,
    num_heads=2,
    d_ff=24,
    num_layers=2,
    num_decoder_layers=2,
    dropout_rate=0.0,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,
)
# Real ids avoid 0 (padding) and 1 (EOS, placed last); rows of different lengths exercise the padding mask.
ENC = np.array([[5, 9, 23, 17, 44, 1, 0, 0], [7, 3, 61, 1, 0, 0, 0, 0], [12, 80, 33, 2, 90, 4, 5, 1]], np.int32)
DEC = np.array([[0, 14, 3, 77, 8, 1], [0, 6, 1, 0, 0, 0], [0, 95, 2, 2, 40, 11]], np.int32)


def hf_model(model_type: str, seed: int = 0, **fields):
    """A random tiny transformers model with non-trivial layer norms and position tables."""
    config_cls, model_cls = CLASSES[model_type]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY, **fields})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5))
            elif "relative_attention_bias" in name:
                p.copy_(torch.randn_like(p))
    return model


def hf_logits(model, enc, dec, pad_id: int = 0):
    """float32 logits [b, t, v] of transformers for encoder ids ``enc`` padded with ``pad_id``."""
    with torch.no_grad():
        ids = torch.tensor(enc, dtype=torch.long)
        mask = torch.tensor(enc != pad_id, dtype=torch.long)
        return model(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.tensor(dec)).logits.numpy()


def saved(model, path: Path, **kwargs) -> Path:
    model.save_pretrained(path, **kwargs)
    return path


# ----------------------------------------------------------------------------------------------------------
# Logits against PyTorch: each model_type x each activation, ByT5- and MADLAD-shaped configs.

ACTIVATIONS = {"relu": ("relu",), "gated-gelu": ("gelu", "linear"), "gated-silu": ("silu", "linear")}


@pytest.mark.parametrize("model_type", sorted(CLASSES))
@pytest.mark.parametrize("proj", sorted(ACTIVATIONS))
def test_logits_match_pytorch(tmp_path, model_type, proj):
    ref = hf_model(model_type, seed=len(proj) + len(model_type), feed_forward_proj=proj)
    model = specjax.load_checkpoint(saved(ref, tmp_path / "m"))
    cfg = model.config
    assert cfg.activations == ACTIVATIONS[proj]
    assert cfg.per_layer_relpos_bias == (model_type == "umt5")
    flat = rules.flatten(model.params)
    tables = [k for k in flat if k.endswith("relpos_bias/rel_embedding")]
    assert len(tables) == (2 * 2 if model_type == "umt5" else 2)  # umT5: one per layer of each stack
    want = hf_logits(ref, ENC, DEC)
    got = np.asarray(model.logits(ENC, DEC))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    assert np.abs(want).max() > 0.1  # not a comparison of near-zero numbers


def test_umt5_tables_differ_per_layer(tmp_path):
    """Each umT5 layer reads its own table: zeroing layer 1's changes the logits, as it does in PyTorch."""
    ref = hf_model("umt5", seed=3)
    with torch.no_grad():
        ref.encoder.block[1].layer[0].SelfAttention.relative_attention_bias.weight.mul_(0.0)
    model = specjax.load_checkpoint(saved(ref, tmp_path / "m"))
    np.testing.assert_allclose(np.asarray(model.logits(ENC, DEC)), hf_logits(ref, ENC, DEC), atol=ATOL, rtol=0)
    flat = rules.flatten(model.params)
    assert not np.any(np.asarray(flat["encoder/layers_1/relpos_bias/rel_embedding"]))
    assert np.any(np.asarray(flat["encoder/layers_0/relpos_bias/rel_embedding"]))


def test_byt5_shaped(tmp_path):
    """ByT5: 384 ids, an encoder 3x deeper than the decoder, gated GELU, untied head."""
    ref = hf_model("t5", seed=5, vocab_size=384, num_layers=3, num_decoder_layers=1, feed_forward_proj="gated-gelu")
    ref.config.tokenizer_class = "ByT5Tokenizer"
    path = saved(ref, tmp_path / "byt5")
    model = specjax.load_checkpoint(path)
    assert (model.config.num_encoder_layers, model.config.num_decoder_layers, model.config.vocab_size) == (3, 1, 384)
    tok, origin = checkpoint_tokenizer(path)
    assert isinstance(tok, specjax.tokenizer.ByteTokenizer) and "ByT5" in origin and tok.vocab_size == 384
    enc = tok.encode_batch(["Zwei Männer.", "Ein Hund läuft über die Wiese."])
    dec = np.concatenate([np.zeros((2, 1), np.int32), enc[:, :5]], 1)
    np.testing.assert_allclose(np.asarray(model.logits(enc, dec)), hf_logits(ref, enc, dec), atol=ATOL, rtol=0)


def test_madlad_shaped(tmp_path):
    """MADLAD-400: pad 1 / eos 2 / decoding from 0, heads wider than d_model / num_heads. transformers pads
    its inputs with 1; specjax pads with its pad_id, the decoder start 0, and masks the same positions."""
    ref = hf_model(
        "t5",
        seed=6,
        d_kv=16,
        feed_forward_proj="gated-gelu",
        pad_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=0,
        tie_word_embeddings=False,
    )
    model = specjax.load_checkpoint(saved(ref, tmp_path / "madlad"))
    assert (model.config.pad_id, model.config.eos_id, model.config.head_dim) == (0, 2, 16)
    enc = np.where(ENC == 1, 2, ENC)  # EOS is 2; real ids are >= 2
    enc = np.where(enc == 0, 1, enc)  # transformers' padding: 1
    want = hf_logits(ref, enc, DEC, pad_id=1)
    got = np.asarray(model.logits(np.where(enc == 1, model.config.pad_id, enc), DEC))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_sharded_safetensors_and_pytorch_bin(tmp_path):
    """A sharded ``model.safetensors.index.json`` and a ``pytorch_model.bin`` load to the same parameters."""
    ref = hf_model("umt5", seed=7, feed_forward_proj="gated-silu")
    sharded = saved(ref, tmp_path / "sharded", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    assert len(json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]) > 10
    binary = tmp_path / "bin"
    binary.mkdir()
    (binary / "config.json").write_text((sharded / "config.json").read_text())
    torch.save(ref.state_dict(), binary / "pytorch_model.bin")
    a, b = specjax.load_checkpoint(sharded), specjax.load_checkpoint(binary)
    fa, fb = rules.flatten(a.params), rules.flatten(b.params)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)
    np.testing.assert_allclose(np.asarray(a.logits(ENC, DEC)), hf_logits(ref, ENC, DEC), atol=ATOL, rtol=0)


def test_untied_scaled_head(tmp_path):
    """An ``lm_head`` that is not the embedding, with the d**-0.5 scaling (``logits_scaling``)."""
    ref = hf_model("t5", seed=8, feed_forward_proj="gated-gelu")
    assert ref.config.scale_decoder_outputs
    ref.lm_head.weight = torch.nn.Parameter(torch.randn_like(ref.shared.weight))
    model = specjax.load_checkpoint(saved(ref, tmp_path / "m"))
    assert not model.config.logits_via_embedding and model.config.scales_logits
    np.testing.assert_allclose(np.asarray(model.logits(ENC, DEC)), hf_logits(ref, ENC, DEC), atol=ATOL, rtol=0)


def test_unsupported_model_type_and_activation(tmp_path):
    cfg = dict(TINY, model_type="longt5", num_heads=2)
    with pytest.raises(ValueError, match="model_type='longt5'.*LongT5"):
        T5Config.from_hf_config(cfg)
    with pytest.raises(ValueError, match="feed_forward_proj='gated-tanhshrink' is not supported"):
        T5Config.from_hf_config(dict(TINY, model_type="t5", feed_forward_proj="gated-tanhshrink"))


# ----------------------------------------------------------------------------------------------------------
# Round trips


def test_umt5_t5x_tree_round_trip(tmp_path):
    """umT5's per-layer ``layers_<i>/relpos_bias`` tree through save_checkpoint / load_checkpoint (t5x and
    Hugging Face), bit for bit; the Hugging Face export reads back in transformers with the same logits."""
    cfg = T5Config(
        vocab_size=96,
        d_model=16,
        num_heads=2,
        head_dim=8,
        mlp_dim=24,
        num_encoder_layers=2,
        num_decoder_layers=3,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        per_layer_relpos_bias=True,
        mlp_activations=("silu", "linear"),
    )
    model = T5Model.random(cfg, seed=2)
    flat = rules.flatten(model.params)
    assert {k for k in flat if "relpos" in k} == {
        *(f"encoder/layers_{i}/relpos_bias/rel_embedding" for i in range(2)),
        *(f"decoder/layers_{i}/relpos_bias/rel_embedding" for i in range(3)),
    }
    t5x_dir = specjax.save_checkpoint(model, tmp_path / "checkpoint_0", format="t5x")
    back = specjax.load_checkpoint(t5x_dir, mlp_activations=("silu", "linear"))
    assert back.config.per_layer_relpos_bias and back.config.num_decoder_layers == 3
    for k, v in rules.flatten(back.params).items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(flat[k]), err_msg=k)
    hf_dir = specjax.save_checkpoint(model, tmp_path / "hf", format="hf")
    assert json.loads((Path(hf_dir) / "config.json").read_text())["model_type"] == "umt5"
    again = specjax.load_checkpoint(hf_dir)
    assert again.config.activations == ("silu", "linear") and again.config.per_layer_relpos_bias
    for k, v in rules.flatten(again.params).items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(flat[k]), err_msg=k)
    reference = transformers.UMT5ForConditionalGeneration.from_pretrained(hf_dir).eval()
    np.testing.assert_allclose(np.asarray(model.logits(ENC, DEC)), hf_logits(reference, ENC, DEC), atol=ATOL, rtol=0)


def test_scanned_t5x_tree_loads(tmp_path):
    """A scanned umT5 T5X tree (layers on axis 1, heads kept apart, as the released umT5 checkpoints are stored:
    transformers' ``convert_umt5_checkpoint_to_pytorch.py`` slices ``[:, i]``) loads as the per-layer model."""
    cfg = T5Config(
        vocab_size=96, d_model=16, num_heads=2, head_dim=8, mlp_dim=24, num_encoder_layers=2, num_decoder_layers=2,
        relative_attention_num_buckets=8, per_layer_relpos_bias=True,
    )  # fmt: skip
    model = T5Model.random(cfg, seed=4)
    flat = {k: np.asarray(v) for k, v in rules.flatten(model.params).items()}
    scanned = {}
    for stack in ("encoder", "decoder"):
        names = sorted({k.split("/", 2)[2] for k in flat if k.startswith(f"{stack}/layers_")})
        for rest in names:
            per_layer = [flat[f"{stack}/layers_{i}/{rest}"] for i in range(2)]
            if rest.endswith(("query/kernel", "key/kernel", "value/kernel")):
                per_layer = [a.reshape(16, 2, 8) for a in per_layer]  # [d, n, h]
            elif rest.endswith("out/kernel"):
                per_layer = [a.reshape(2, 8, 16) for a in per_layer]  # [n, h, d]
            scanned[f"{stack}/{stack}/{rest}"] = np.stack(per_layer, axis=1)
    scanned.update({k: v for k, v in flat.items() if "/layers_" not in k})
    assert scanned["encoder/encoder/relpos_bias/rel_embedding"].shape == (2, 2, 8)  # [n, l, buckets]
    write_t5x(rules.unflatten(scanned), str(tmp_path / "checkpoint_0"))
    back = specjax.load_checkpoint(tmp_path / "checkpoint_0")
    assert back.config.per_layer_relpos_bias
    for k, v in rules.flatten(back.params).items():
        np.testing.assert_array_equal(np.asarray(v), flat[k], err_msg=k)


# ----------------------------------------------------------------------------------------------------------
# Greedy speculative output equals the target's greedy output


def greedy_reference(model: T5Model, x: np.ndarray, steps: int) -> np.ndarray:
    """Greedy decode by ``steps`` teacher-forced forward passes over the whole prefix (no cache, no loop):
    int32[b, steps], each row padded with ``pad_id`` after its first EOS."""
    b = x.shape[0]
    dec = np.full((b, steps + 1), model.config.pad_id, np.int32)
    for j in range(steps):
        logits = np.asarray(model.logits(x, dec[:, :-1]))  # [b, steps, v]; position j sees dec[:, : j + 1]
        dec[:, j + 1] = logits[:, j].argmax(-1)
    out = dec[:, 1:]
    for row in out:
        ends = np.flatnonzero(row == model.config.eos_id)
        if ends.size:
            row[ends[0] + 1 :] = model.config.pad_id
    return out


def _pair(tmp_path, model_type: str, **fields):
    target = specjax.load_checkpoint(saved(hf_model(model_type, seed=11, **fields), tmp_path / "target"))
    draft_fields = dict(fields, num_decoder_layers=1)
    draft = specjax.load_checkpoint(saved(hf_model(model_type, seed=12, **draft_fields), tmp_path / "draft"))
    return target, draft


def _multi30k(n: int) -> list[str]:
    path = HERE.parent.parent / "shared" / "data" / "train" / "multi30k" / "val.de"
    if not path.is_file():
        pytest.skip(f"{path} is missing (shared/data/SOURCES.md)")
    return path.read_text(encoding="utf-8").splitlines()[:n]


@pytest.mark.parametrize("family", ["mt5", "umt5", "byt5"])
def test_greedy_speculative_equals_greedy_target(tmp_path, family):
    steps = 12
    if family == "byt5":
        # Real text through the byte vocabulary, 384 rows as the released models.
        target, draft = _pair(tmp_path, "t5", vocab_size=384, num_layers=1, feed_forward_proj="gated-gelu")
        x = Tokenizer.byt5().encode_batch(_multi30k(3), length=24, truncate=True)
    else:  # 1 encoder layer (compile time); the decoders: 2 layers (target), 1 (draft)
        target, draft = _pair(tmp_path, family, num_layers=1, feed_forward_proj="gated-gelu")
        x = ENC
    assert target.config.per_layer_relpos_bias == (family == "umt5")
    want = greedy_reference(target, x, steps)
    got = speculative_sample(
        target, draft, x, rng=jax.random.PRNGKey(0), gamma=3, max_decode_length=steps, temperature=0.0
    )
    np.testing.assert_array_equal(np.asarray(got.sequences), want)


# ----------------------------------------------------------------------------------------------------------
# Tokenizers


def test_byt5_tokenizer_equals_transformers():
    ref = transformers.ByT5Tokenizer()
    tok = Tokenizer.byt5()
    assert tok.vocab_size == len(ref) == 384
    lines = _multi30k(20) + ["Ça va? 日本語 — «ok» 🙂"]
    for line in lines:
        ids = ref(line).input_ids
        assert tok.encode(line) == ids, line
        assert tok.decode(ids + [0, 0]) == ref.decode(ids, skip_special_tokens=True) == line
    assert tok.decode([72 + 3, 0xC3 + 3, 105 + 3, 259, 1, 50]) == ref.decode(
        [75, 198, 108, 259], skip_special_tokens=True
    )
    batch = tok.encode_batch(lines[:2])
    assert batch.dtype == np.int32 and (batch[0, len(ref(lines[0]).input_ids) :] == 0).all()


def test_checkpoint_spiece_and_madlad_prefix(tmp_path):
    """A folder's own ``spiece.model`` is used, with its sentinels counted from the embedding rows, and
    ``<2xx>`` language pieces are found (or refused with the fix)."""
    spiece = HERE.parent.parent / "shared" / "data" / "tokenizer" / "t5" / "spiece.model"
    if not spiece.is_file():
        pytest.skip(f"{spiece} is missing")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "spiece.model").write_bytes(spiece.read_bytes())
    (folder / "config.json").write_text(json.dumps({"vocab_size": 32128}))
    tok, origin = checkpoint_tokenizer(folder)
    assert tok.vocab_size == 32100 and str(folder / "spiece.model") in origin
    (folder / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    assert checkpoint_tokenizer(folder)[0].vocab_size == 32000  # no room for 100 sentinels: the file's own
    with pytest.raises(ValueError, match="no <2de> piece.*MADLAD-400"):
        madlad_language_prefix(tok, "de")
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(spiece.read_bytes())
    for code in ("de", "fr"):
        proto.pieces.add(
            piece=f"<2{code}>", score=0.0, type=sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
        )
    (folder / "spiece.model").write_bytes(proto.SerializeToString())
    madlad = Tokenizer(folder, extra_ids=0)
    assert madlad_language_prefix(madlad, "de") == "<2de> "
    assert madlad.piece_id("<2de>") == 32000 and 32000 in madlad.encode("<2de> A dog.")[:2]


def test_translate_cli_tokenizer_and_to(tmp_path, capsys):
    """``specjax translate`` with checkpoints: the folder's own spiece.model is used and named on stderr, and
    ``--to de`` on a vocabulary without ``<2de>`` stops with one line naming the piece (before any decoding)."""
    from specjax.cli import main

    spiece = HERE.parent.parent / "shared" / "data" / "tokenizer" / "t5" / "spiece.model"
    if not spiece.is_file():
        pytest.skip(f"{spiece} is missing")
    folder = saved(hf_model("mt5", seed=9, vocab_size=32128), tmp_path / "mt5")
    (folder / "spiece.model").write_bytes(spiece.read_bytes())
    capsys.readouterr()  # transformers' own progress lines
    rc = main(["translate", "--target", str(folder), "--draft", str(folder), "--to", "de", "A dog."])
    err = capsys.readouterr().err
    assert rc == 2 and "the target checkpoint's own vocabulary" in err
    assert "--to de: the vocabulary" in err and "no <2de> piece" in err and len(err.strip().splitlines()) == 2


def test_vocabulary_mismatch_refused():
    """mT5's 250112 rows against T5's 32128 are refused, with the reason."""
    small = dict(d_model=8, num_heads=2, head_dim=4, mlp_dim=8, num_encoder_layers=1, num_decoder_layers=1)

    def zeros(config):  # the refusal comes before any computation: no weights needed
        return T5Model(config, jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype), t5.abstract_params(config)))

    target, mt5_draft = zeros(T5Config(vocab_size=32128, **small)), zeros(T5Config(vocab_size=250112, **small))
    x = np.array([[5, 6, 1]], np.int32)
    with pytest.raises(ValueError, match="draft vocabulary \\(250112 tokens\\) differs from the target's \\(32128\\)"):
        speculative_sample(target, mt5_draft, x, rng=jax.random.PRNGKey(0), gamma=2, max_decode_length=3)


# ----------------------------------------------------------------------------------------------------------
# Presets and sharding


RELEASED = {
    # Published parameter counts: mT5 (Xue et al. 2021, section 3), ByT5 (Xue et al. 2022, Table 1), UL2 20B
    # (Tay et al. 2023; Flan-UL2's 19.46B), MADLAD-400 MT (Kudugunta et al. 2023: 3B and 10.7B; its 7.2B counts
    # the layers without the two 256k x 2048 embeddings, checked below).
    "mt5_small": 300e6,
    "mt5_base": 580e6,
    "mt5_large": 1.2e9,
    "mt5_xl": 3.7e9,
    "mt5_xxl": 13e9,
    "byt5_small": 300e6,
    "byt5_base": 582e6,
    "byt5_large": 1.2e9,
    "byt5_xl": 3.74e9,
    "byt5_xxl": 12.9e9,
    "ul2": 19.46e9,
    "flan_ul2": 19.46e9,
    "madlad400_3b": 3e9,
    "madlad400_10b": 10.7e9,
}


def preset_params(c: T5Config) -> int:
    """Parameters of a T5 of config ``c``, by formula (Raffel et al. 2020 section 2.1; umT5's table per layer):
    embedding [v, d] (+ an untied head [d, v]); per encoder layer 4 attention kernels [d, n*h], the MLP's input
    kernels [d, f] and output [f, d], 2 norms [d]; per decoder layer twice the attention and 3 norms; 2 final
    norms; relative position tables [n, buckets], one per stack or one per layer."""
    d, f, nh = c.d_model, c.mlp_dim, c.num_heads * c.head_dim
    attention, mlp = 4 * d * nh, (len(c.activations) + 1) * d * f
    layers = c.num_encoder_layers * (attention + mlp + 2 * d) + c.num_decoder_layers * (2 * attention + mlp + 3 * d)
    tables = (c.num_encoder_layers + c.num_decoder_layers) if c.per_layer_relpos_bias else 2
    embeddings = c.vocab_size * d * (1 if c.logits_via_embedding else 2)
    return embeddings + layers + 2 * d + tables * c.num_heads * c.relative_attention_num_buckets


def test_preset_parameter_counts():
    # The formula is the model's own count for every layout (checked on 2-layer copies: shapes only).
    for name in ("mt5_small", "umt5_small", "ul2", "byt5_small", "madlad400_3b", "t5_small"):
        shallow = PRESETS[name].replace(num_encoder_layers=2, num_decoder_layers=2)
        assert preset_params(shallow) == t5.count_params(t5.abstract_params(shallow)), name
    for name, released in RELEASED.items():
        assert preset_params(PRESETS[name]) == pytest.approx(released, rel=0.03), name
    c = PRESETS["madlad400_7b"]
    assert preset_params(c) - 2 * c.vocab_size * c.d_model == pytest.approx(7.2e9, rel=0.03)
    for size in ("small", "base", "xl", "xxl"):
        u, m = PRESETS[f"umt5_{size}"], PRESETS[f"mt5_{size}"]
        assert u.per_layer_relpos_bias and u.vocab_size == 256384
        assert (u.d_model, u.num_heads, u.mlp_dim, u.num_encoder_layers) == (
            m.d_model,
            m.num_heads,
            m.mlp_dim,
            m.num_encoder_layers,
        )
    assert PRESETS["ul2"].activations == ("silu", "linear") and PRESETS["flan_ul2"].logits_via_embedding
    assert (PRESETS["madlad400_10b"].pad_id, PRESETS["madlad400_10b"].eos_id) == (0, 2)


PARALLEL_CHECK = r"""
import json, jax
jax.config.update("jax_num_cpu_devices", 8)
import numpy as np
from jax.sharding import PartitionSpec as P
from specjax import T5Config, T5Model, parallel, temperature_sample
cfg = T5Config(vocab_size=64, d_model=16, num_heads=4, head_dim=4, mlp_dim=32, num_encoder_layers=2,
               num_decoder_layers=2, per_layer_relpos_bias=True)
target = T5Model.random(cfg, 0)
x = np.random.RandomState(0).randint(2, 64, size=(5, 6)).astype(np.int32)
x[:, -1] = 1
mesh = parallel.make_mesh("data:2,model:4")
specs = parallel.param_shardings(cfg, mesh)
flat = {"/".join(str(getattr(k, "key", k)) for k in path): s.spec
        for path, s in jax.tree_util.tree_flatten_with_path(specs)[0]}
tables = {k: v for k, v in flat.items() if "relpos" in k}
kw = dict(rng=jax.random.PRNGKey(5), max_decode_length=6, temperature=1.0)
one = temperature_sample(target, x, **kw)
many = parallel.model_parallel_sample(temperature_sample, target, x, mesh=mesh, **kw)
print(json.dumps({"devices": jax.device_count(), "equal": bool(np.array_equal(one.sequences, many.sequences)),
                  "tables": sorted(tables), "heads_over_model": all(v == P("model", None) for v in tables.values())}))
"""


def test_umt5_model_parallel_on_eight_host_devices():
    """umT5's per-layer tables are placed by the standard rules (heads over "model"), and a model-parallel
    sampled decode over mesh data:2,model:4 equals one device's token for token."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", PARALLEL_CHECK], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8 and out["equal"]
    names = [f"{stack}/layers_{i}/relpos_bias/rel_embedding" for stack in ("decoder", "encoder") for i in (0, 1)]
    assert out["tables"] == names and out["heads_over_model"]
