"""seqio interop: vocabularies, ``seqio_decode`` and ``specjax generate --seqio-task``.

References are independent: seqio's own ``SentencePieceVocabulary`` encode/decode for the tokenizer, and the
plain ``specjax generate`` path (text file in, text file out) plus sacrebleu for the Task decode. The Task is a
real seqio Task over Multi30k test 2016 lines (``FunctionDataSource``, ``tokenize``, ``append_eos``, a
sacrebleu metric), registered by a module this test writes, as a user's ``--seqio-module`` would.

seqio comes with the ``seqio`` extra (``pip install -e '.[test,seqio]'``, as .ci/run does). Without it these
tests skip locally, and fail under CI (``CI`` set), so CI cannot pass without running them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from specjax.cli import main

N_LINES = 8
TASK = "specjax_test_multi30k_ende"
T5_TASK = "specjax_test_multi30k_t5_vocab"


def _seqio():
    try:
        import seqio
    except ImportError as e:
        if os.environ.get("CI"):
            pytest.fail(f"seqio is not installed in CI ({e}); .ci/run must install the seqio extra.")
        pytest.skip("seqio not installed (pip install -e '.[test,seqio]')")
    return seqio


def test_import_specjax_loads_neither_tensorflow_nor_torch():
    code = (
        "import specjax, sys; specjax.seqio_decode; "
        "assert 'tensorflow' not in sys.modules and 'torch' not in sys.modules, "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'torch', 'seqio'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


# ---------------------------------------------------------------------------------------------- tokenizer

TEXTS = [
    "Hello world.",
    "A man in a blue shirt is riding a bicycle down the street.",
    "Zwei Männer unterhalten sich über Äpfel und Öl.",
    "translate English to German: That is good.",
    "Fill <extra_id_0> the blank <extra_id_1>.",
    "  spaces   and\ttabs ",
    "",
    "1,234.5 €",
]


@pytest.mark.parametrize("which", ["t5", "mini_pair", "t5_forward_extra_ids"])
def test_tokenizer_from_seqio_matches_seqio(which, spiece_model):
    seqio = _seqio()
    from specjax import Tokenizer
    from specjax.defaults import PAIRS
    from specjax.tokenizer import as_tokenizer

    if which == "mini_pair":
        vocab = seqio.SentencePieceVocabulary(str(PAIRS["mini"] / "spiece.model"), extra_ids=0)
    else:
        vocab = seqio.SentencePieceVocabulary(str(spiece_model), extra_ids=100, reverse_extra_ids=(which == "t5"))
    tok = Tokenizer.from_seqio(vocab)
    assert as_tokenizer(vocab).same_vocabulary(tok)
    assert tok.vocab_size == vocab.vocab_size == (8000 if which == "mini_pair" else 32100)
    assert (tok.pad_id, tok.eos_id, tok.unk_id) == (vocab.pad_id, vocab.eos_id, vocab.unk_id)
    for text in TEXTS:
        assert tok.encode(text) == list(vocab.encode(text)) + [vocab.eos_id], text
        assert tok.encode(text, add_eos=False) == list(vocab.encode(text))
    if which != "mini_pair":
        first = vocab.encode("<extra_id_0>")
        assert first == [32099 if which == "t5" else 32000]
        assert tok.encode("<extra_id_0>", add_eos=False) == first
        # The plain constructor agrees with seqio's default (reversed) extra ids.
        assert Tokenizer(spiece_model).same_vocabulary(tok) == (which == "t5")
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = rng.integers(3, tok.vocab_size, size=12).tolist()
        ids.insert(int(rng.integers(0, 12)), vocab.eos_id)  # both stop at EOS
        assert tok.decode(ids) == vocab.decode(ids)
    # ids past the vocabulary (a 32128-row model's last 28): unk, as seqio decodes them
    assert tok.decode([100, tok.vocab_size + 3, 200], out_of_range="unk") == vocab.decode(
        [100, tok.vocab_size + 3, 200]
    )


def test_tokenizer_from_seqio_refuses_other_vocabularies():
    seqio = _seqio()
    from specjax import Tokenizer

    with pytest.raises(ValueError, match="not a seqio.SentencePieceVocabulary"):
        Tokenizer.from_seqio(seqio.ByteVocabulary())


# ---------------------------------------------------------------------------------------------- the Task

TASKS_MODULE = """
import seqio, sacrebleu, tensorflow as tf

EN, DE, N = {en!r}, {de!r}, {n}

def dataset_fn(split, shuffle_files, seed=None):
    en = open(EN, encoding="utf-8").read().splitlines()[:N]
    de = open(DE, encoding="utf-8").read().splitlines()[:N]
    return tf.data.Dataset.from_tensor_slices({{"inputs": en, "targets": de}})

def bleu(targets, predictions):
    return {{"bleu": sacrebleu.corpus_bleu(predictions, [targets]).score}}

def register(name, spiece, extra_ids):
    if name in seqio.TaskRegistry.names():
        return
    vocab = seqio.SentencePieceVocabulary(spiece, extra_ids=extra_ids)
    seqio.TaskRegistry.add(
        name, source=seqio.FunctionDataSource(dataset_fn, splits=["test"]),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features={{k: seqio.Feature(vocab, add_eos=True) for k in ("inputs", "targets")}},
        metric_fns=[bleu])

register({task!r}, {pair_spiece!r}, 0)
register({t5_task!r}, {t5_spiece!r}, 100)
"""


@pytest.fixture(scope="module")
def tasks_module(tmp_path_factory, data_dir):
    _seqio()
    from specjax.defaults import PAIRS
    from specjax.seqio_interop import import_task_module

    en = data_dir / "train" / "multi30k" / "test_2016_flickr.en"
    path = tmp_path_factory.mktemp("seqio") / "my_tasks.py"
    path.write_text(
        TASKS_MODULE.format(
            en=str(en),
            de=str(en.with_suffix(".de")),
            n=N_LINES,
            task=TASK,
            t5_task=T5_TASK,
            pair_spiece=str(PAIRS["mini"] / "spiece.model"),
            t5_spiece=str(data_dir / "tokenizer" / "t5" / "spiece.model"),
        )
    )
    import_task_module(str(path))
    return path


@pytest.fixture(scope="module")
def pair():
    import specjax

    return specjax.load_default_pair(size="mini")


@pytest.fixture(scope="module")
def plain_generate(tmp_path_factory, data_dir):
    """The plain path on the same lines: ``specjax generate --input`` (temperature 1, seed 3)."""
    d = tmp_path_factory.mktemp("plain")
    lines = (data_dir / "train" / "multi30k" / "test_2016_flickr.en").read_text().splitlines()[:N_LINES]
    (d / "in.en").write_text("\n".join(lines) + "\n")
    assert (
        main(
            [
                "generate",
                "--size",
                "mini",
                "--input",
                str(d / "in.en"),
                "--output",
                str(d / "out.de"),
                "--batch-size",
                "4",
                "--max-decode-length",
                "24",
                "--gamma",
                "3",
                "--temperature",
                "1",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    return (d / "out.de").read_text().splitlines()


def test_seqio_decode_equals_plain_generate(tasks_module, pair, plain_generate, data_dir):
    import sacrebleu

    import specjax

    target, draft, tok = pair
    refs = (data_dir / "train" / "multi30k" / "test_2016_flickr.de").read_text().splitlines()[:N_LINES]
    r = specjax.seqio_decode(
        TASK, "test", target, draft, tokenizer=tok, batch_size=4, max_decode_length=24, gamma=3, temperature=1.0, seed=3
    )
    assert r.predictions == plain_generate
    assert len(r.tokens) == N_LINES and all(t[-1] == tok.eos_id or len(t) == 24 for t in r.tokens)
    assert r.metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(plain_generate, [refs]).score, abs=1e-9)
    assert 0.0 < r.acceptance_rate < 1.0
    assert 1.0 < r.tokens_per_target_call <= 4.0
    assert r.speedup is not None and r.speedup > 0
    assert f"bleu: {r.metrics['bleu']:.3f}" in r.summary()


def test_generate_seqio_task_cli_and_resume(tasks_module, pair, tmp_path, capsys):
    import specjax

    target, draft, tok = pair
    ref = specjax.seqio_decode(
        TASK,
        "test",
        target,
        draft,
        tokenizer=tok,
        batch_size=4,
        max_decode_length=24,
        gamma=3,
        temperature=0.0,
        compare_baseline=False,
    )
    out = tmp_path / "pred.de"
    argv = [
        "generate",
        "--size",
        "mini",
        "--seqio-task",
        TASK,
        "--seqio-module",
        str(tasks_module),
        "--split",
        "test",
        "--output",
        str(out),
        "--batch-size",
        "4",
        "--max-decode-length",
        "24",
        "--gamma",
        "3",
    ]
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().err  # the metrics and statistics go to stderr
    assert out.read_text().splitlines() == ref.predictions
    assert f"bleu {ref.metrics['bleu']:.3f}" in printed
    assert f"acceptance rate (alpha) {ref.acceptance_rate:.3f}" in printed
    assert "tokens per target call" in printed
    # Resume: keep 3 lines and half of the 4th (an interrupted write), run again: same file, same BLEU.
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:3]) + "\n" + lines[3][:5])
    assert main(argv) == 0
    printed = capsys.readouterr().err  # the metrics and statistics go to stderr
    assert out.read_text().splitlines() == ref.predictions
    assert "(5 decoded now)" in printed and f"bleu {ref.metrics['bleu']:.3f}" in printed


def _error(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("specjax generate: error:")]
    assert len(err) == 1
    return err[0]


def test_generate_seqio_bad_inputs(tasks_module, tmp_path, capsys):
    out = ["--output", str(tmp_path / "o.txt"), "--max-decode-length", "8"]
    base = ["generate", "--seqio-module", str(tasks_module)]
    msg = _error(capsys, base + ["--seqio-task", TASK + "_typo", "--split", "test"] + out)
    assert "No seqio Task named" in msg and repr(TASK) in msg and "--seqio-module" in msg
    msg = _error(capsys, ["generate", "--seqio-task", TASK, "--seqio-module", "no_such_tasks_module"] + out)
    assert "'no_such_tasks_module' failed to import (ModuleNotFoundError" in msg and "PYTHONPATH" in msg
    broken = tmp_path / "broken_tasks.py"
    broken.write_text("import seqio\nraise RuntimeError('bucket not found')\n")
    msg = _error(capsys, ["generate", "--seqio-task", TASK, "--seqio-module", str(broken)] + out)
    assert "failed to import (RuntimeError: bucket not found)" in msg
    msg = _error(capsys, base + ["--seqio-task", TASK, "--split", "validation"] + out)
    assert "has no split 'validation'" in msg and "'test'" in msg
    msg = _error(capsys, base + ["--seqio-task", T5_TASK, "--split", "test"] + out)
    assert "vocabulary" in msg and "32100 ids" in msg and "8000" in msg
    msg = _error(capsys, base + ["--seqio-task", TASK, "--split", "test", "--prefix", "x: "] + out)
    assert "--prefix does not apply" in msg
    assert not (tmp_path / "o.txt").exists()


def test_seqio_decode_vocabulary_checked_piece_by_piece(tasks_module, pair, spiece_model):
    """Same size, different pieces: refused when the models' vocabulary is known."""
    import specjax
    from specjax import Tokenizer
    from specjax.seqio_interop import check_vocabulary, get_task, task_tokenizer

    target, draft, tok = pair
    task = get_task(TASK)
    check_vocabulary(task, task_tokenizer(task), target, draft, tok)  # the pair's own: accepted
    other = Tokenizer(spiece_model, extra_ids=0)  # 32000 pieces, not the pair's 8000
    with pytest.raises(ValueError, match="differs from the models'"):
        check_vocabulary(task, task_tokenizer(task), target, draft, other)
    with pytest.raises(ValueError, match="No seqio Task named 'no_such_task'"):
        specjax.seqio_decode("no_such_task", "test", target, draft)
