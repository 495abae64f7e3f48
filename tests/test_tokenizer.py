"""specjax.Tokenizer against T5's SentencePiece model (seqio.SentencePieceVocabulary behaviour)."""

from __future__ import annotations

import numpy as np
import pytest

from specjax import Tokenizer

REFERENCE = "translate English to German: The house is wonderful."
REFERENCE_IDS = [13959, 1566, 12, 2968, 10, 37, 629, 19, 1627, 5, 1]


@pytest.fixture(scope="module")
def tok(spiece_model):
    return Tokenizer(spiece_model)


def test_reference_encoding(tok):
    assert tok.encode(REFERENCE) == REFERENCE_IDS
    assert tok.encode(REFERENCE, add_eos=False) == REFERENCE_IDS[:-1]


def test_special_ids_and_vocab_size(tok):
    assert (tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2)
    assert tok.vocab_size == 32000 + 100


def test_extra_ids_are_reversed_sentinels(tok):
    # seqio: <extra_id_0> is the last id, <extra_id_99> the first after the pieces.
    assert tok.encode("<extra_id_0>", add_eos=False)[-1] == 32099
    assert tok.encode("<extra_id_99>", add_eos=False)[-1] == 32000
    assert tok.decode([27, 114, 32099, 1]).endswith("<extra_id_0>")


def test_decode_stops_at_eos_and_drops_pad(tok):
    assert tok.decode(REFERENCE_IDS) == REFERENCE
    assert tok.decode(REFERENCE_IDS + [37, 629, 1]) == REFERENCE
    assert tok.decode([0] + REFERENCE_IDS[:-1] + [0, 0]) == REFERENCE
    assert tok.decode(np.asarray(REFERENCE_IDS, np.int32)) == REFERENCE


def test_encode_batch_pads_and_truncates(tok):
    texts = ["The house is wonderful.", REFERENCE]
    batch = tok.encode_batch(texts)
    assert batch.dtype == np.int32 and batch.shape == (2, len(REFERENCE_IDS))
    assert batch[1].tolist() == REFERENCE_IDS
    n = len(tok.encode(texts[0]))
    assert batch[0, :n].tolist() == tok.encode(texts[0]) and not batch[0, n:].any()
    assert tok.decode_batch(batch) == texts
    wide = tok.encode_batch(texts, length=16)
    assert wide.shape == (2, 16) and not wide[:, 11:].any()
    cut = tok.encode_batch(texts, length=4, truncate=True)
    assert cut[1].tolist() == REFERENCE_IDS[:3] + [1]


def test_encode_batch_too_long_names_the_line(tok):
    with pytest.raises(ValueError, match=r"Line 1 .*wonderful.*truncate=True"):
        tok.encode_batch(["short", REFERENCE], length=5)


def test_decode_rejects_ids_outside_vocabulary(tok):
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 32100\).*32127"):
        tok.decode([37, 32127, 1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([-1])
    assert tok.decode([37, 32127, 1], out_of_range="unk") == tok.decode([37, 2, 1])
    with pytest.raises(ValueError, match="in row 1"):
        tok.decode_batch([[37, 1], [40000]])


def test_missing_model_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="No SentencePiece model"):
        Tokenizer(tmp_path / "nope.model")


def test_matches_transformers_t5_tokenizer(tok, spiece_model):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(spiece_model.parent))
    for text in [
        REFERENCE,
        "I like <extra_id_0> sandwiches",
        "Übermäßig   viele Leerzeichen!\n neue Zeile",
        "café 🎉 naïve 1,234.5",
    ]:
        assert tok.encode(text) == hf(text).input_ids, text
