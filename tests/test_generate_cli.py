"""Tests of ``specjax generate``: order, batching, resuming, statistics and errors, with tiny random T5
checkpoints and T5's SentencePiece vocabulary."""

from pathlib import Path

import numpy as np
import pytest

from specjax import T5Config, T5Model, Tokenizer, save_checkpoint, temperature_sample
from specjax.cli import main

SPIECE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tokenizer" / "t5" / "spiece.model"
pytestmark = pytest.mark.skipif(not SPIECE.exists(), reason=f"T5 spiece.model not found at {SPIECE}")

LINES = [
    "A man is riding a bike.",
    "",
    "Two dogs play in the snow near a red house.",
    "Hello",
    "The quick brown fox jumps over the lazy dog again and again.",
    "Yes.",
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    config = T5Config(
        vocab_size=32128,
        d_model=16,
        num_heads=2,
        head_dim=8,
        mlp_dim=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        name="tiny",
    )
    target, draft = T5Model.random(config, seed=0), T5Model.random(config, seed=1)
    return save_checkpoint(target, root / "target"), save_checkpoint(draft, root / "draft"), target


def _run(tmp_path, checkpoints, *extra, lines=LINES, output="out.txt"):
    target, draft, _ = checkpoints
    src = tmp_path / "in.txt"
    src.write_text("".join(l + "\n" for l in lines), encoding="utf-8")
    out = tmp_path / output
    rc = main(
        [
            "generate",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--input",
            str(src),
            "--output",
            str(out),
            "--tokenizer",
            str(SPIECE),
            "--max-decode-length",
            "6",
            "--gamma",
            "3",
            *extra,
        ]
    )
    return rc, out


def test_generate_writes_greedy_target_outputs_in_order(tmp_path, checkpoints, capsys):
    rc, out = _run(tmp_path, checkpoints, "--batch-size", "4", "--compare-baseline")
    assert rc == 0
    got = out.read_text(encoding="utf-8").split("\n")
    assert len(got) == len(LINES) + 1 and got[-1] == ""
    # Greedy speculative output equals target-greedy decoding of each line.
    tok = Tokenizer(SPIECE)
    x = tok.encode_batch(LINES)
    base = temperature_sample(checkpoints[2], x, rng=0, max_decode_length=6, temperature=0)
    expected = [tok.decode([t for t in s[:n] if t < tok.vocab_size]) for s, n in zip(base.sequences, base.lengths)]
    expected = ["" if not line.strip() else e for line, e in zip(LINES, expected)]  # an empty line stays empty
    assert got[:-1] == expected
    report = capsys.readouterr().err  # statistics on stderr, outputs in --output
    assert "acceptance rate" in report and "tokens per target call" in report and "tokens/s" in report
    assert "speedup" in report


def test_outputs_do_not_depend_on_batch_size_and_runs_resume(tmp_path, checkpoints, capsys):
    sample = ("--temperature", "1.0", "--seed", "3")
    rc, full = _run(tmp_path, checkpoints, "--batch-size", "4", *sample, output="full.txt")
    assert rc == 0
    # Another batch size gives the same lines (keys are per input line).
    rc, other = _run(tmp_path, checkpoints, "--batch-size", "3", *sample, output="other.txt")
    assert other.read_text(encoding="utf-8") == full.read_text(encoding="utf-8")
    # A run stopped after two lines (and half a third) resumes after the finished lines.
    lines = full.read_text(encoding="utf-8").split("\n")
    partial = tmp_path / "partial.txt"
    partial.write_text(lines[0] + "\n" + lines[1] + "\n" + "half a li", encoding="utf-8")
    capsys.readouterr()
    rc, resumed = _run(tmp_path, checkpoints, "--batch-size", "4", *sample, output="partial.txt")
    assert rc == 0 and resumed.read_text(encoding="utf-8") == full.read_text(encoding="utf-8")
    n = len(LINES)
    assert f"partial.txt: 2 of {n} lines already written; resuming at line 3." in capsys.readouterr().err
    # Nothing left to do.
    rc, _ = _run(tmp_path, checkpoints, "--batch-size", "4", *sample, output="partial.txt")
    assert rc == 0 and resumed.read_text(encoding="utf-8") == full.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "args,message",
    [
        (("--batch-size", "0"), "--batch-size must be >= 1"),
        (("--top-p", "0"), "top_p must be in"),
        (("--max-input-length", "4"), "pass --truncate"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, checkpoints, capsys, args, message):
    rc, out = _run(tmp_path, checkpoints, *args)
    assert rc == 2
    assert message in capsys.readouterr().err


def test_target_without_draft_is_an_error(tmp_path, checkpoints, capsys):
    src = tmp_path / "in.txt"
    src.write_text("hi\n")
    rc = main(["generate", "--target", str(checkpoints[0]), "--input", str(src), "--output", str(tmp_path / "o.txt")])
    assert rc == 2 and "--draft" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------
# Bad input a new user hits


def test_checkpoint_folder_vocabulary_is_used_before_t5s(tmp_path, capsys):
    """A checkpoint shipping its own spiece.model (the default pair's 8k vocabulary) decodes with it, and
    the report says which vocabulary was used; load_checkpoint's default dtype equals load_default_pair's."""
    import shutil

    import specjax
    from specjax.defaults import PAIRS

    target, _, tok = specjax.load_default_pair(size="mini")
    root = tmp_path / "pair"
    for name in ("target", "draft_distilled"):
        shutil.copytree(PAIRS["mini"] / name, root / name)
    assert (root / "target" / "spiece.model").is_file()
    loaded = specjax.load_checkpoint(root / "target")
    assert loaded.config.dtype == target.config.dtype == "float32"
    src = tmp_path / "in.txt"
    src.write_text("A man is riding a bicycle.\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    rc = main(
        [
            "generate",
            "--target",
            str(root / "target"),
            "--draft",
            str(root / "draft_distilled"),
            "--input",
            str(src),
            "--output",
            str(out),
            "--max-decode-length",
            "16",
        ]
    )
    assert rc == 0
    assert "the target checkpoint's own vocabulary" in capsys.readouterr().err
    x = tok.encode_batch(["A man is riding a bicycle."])
    base = temperature_sample(target, x, max_decode_length=16, temperature=0)
    assert out.read_text(encoding="utf-8") == tok.decode(np.asarray(base.sequences)[0]) + "\n"


def test_gamma_above_max_decode_length_is_clipped(tmp_path, checkpoints, capsys, monkeypatch):
    import specjax.bulk as bulk

    gammas = []
    real = bulk.BulkDecoder

    def recording(*args, **kwargs):
        gammas.append(kwargs["gamma"])
        return real(*args, **kwargs)

    monkeypatch.setattr(bulk, "BulkDecoder", recording)
    rc, out = _run(tmp_path, checkpoints, "--gamma", "1000", "--batch-size", "4")
    assert rc == 0 and len(out.read_text(encoding="utf-8").splitlines()) == len(LINES)
    assert gammas == [6]  # one bulk decode of every line, gamma clipped to 6
    assert "using gamma 6" in capsys.readouterr().err


def test_empty_and_non_utf8_inputs_are_clear_errors(tmp_path, checkpoints, capsys):
    target, draft, _ = checkpoints
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    base = ["generate", "--target", str(target), "--draft", str(draft), "--tokenizer", str(SPIECE)]
    rc = main(base + ["--input", str(empty), "--output", str(tmp_path / "o.txt")])
    assert rc == 2 and "has no lines" in capsys.readouterr().err
    assert not (tmp_path / "o.txt").exists()
    latin = tmp_path / "latin.txt"
    latin.write_bytes("fine\nM\u00fcller\n".encode("latin-1"))
    rc = main(base + ["--input", str(latin), "--output", str(tmp_path / "o.txt")])
    err = capsys.readouterr().err
    assert rc == 2 and f"{latin}, line 2: not UTF-8" in err


def test_demo_refuses_bad_flags_before_loading_models(monkeypatch, capsys):
    import specjax.defaults

    monkeypatch.setattr(
        specjax.defaults, "load_default_pair", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded models"))
    )
    assert main(["demo", "--num-lines", "0"]) == 2  # --gamma 0 is valid: the target alone
    assert "--num-lines must be >= 1" in capsys.readouterr().err


def test_translate_has_truncate(capsys):
    assert (
        main(
            [
                "translate",
                "--size",
                "mini",
                "--max-input-length",
                "3",
                "--truncate",
                "--max-decode-length",
                "4",
                "A man is riding a bicycle down the street.",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "translate",
                "--size",
                "mini",
                "--max-input-length",
                "3",
                "--max-decode-length",
                "4",
                "A man is riding a bicycle down the street.",
            ]
        )
        == 2
    )
    assert "--truncate" in capsys.readouterr().err


def test_mesh_error_names_each_suggestion_once():
    from specjax import parallel

    with pytest.raises(ValueError) as e:
        parallel.make_mesh("data:2,model:2")
    assert str(e.value).count("data:1,model:1") == 1


@pytest.mark.parametrize(
    "flags",
    [
        ("--verification", "block"),
        ("--draft-confidence-threshold", "0.5"),
        ("--draft", "prompt-lookup", "--max-ngram", "2"),
    ],
)
def test_drafting_flags_keep_the_greedy_target_output(tmp_path, checkpoints, flags):
    """In the CLI: block verification, confidence-stopped drafting and prompt lookup (no draft model)
    each give token for token the target's greedy output."""
    target, draft, model = checkpoints
    src = tmp_path / "in.txt"
    src.write_text("".join(l + "\n" for l in LINES), encoding="utf-8")
    out = tmp_path / "out.txt"
    args = [
        "generate",
        "--target",
        str(target),
        "--input",
        str(src),
        "--output",
        str(out),
        "--tokenizer",
        str(SPIECE),
        "--max-decode-length",
        "6",
        "--gamma",
        "3",
        "--batch-size",
        "4",
    ]
    if "prompt-lookup" not in flags:
        args += ["--draft", str(draft)]
    assert main(args + list(flags)) == 0
    tok = Tokenizer(SPIECE)
    base = temperature_sample(model, tok.encode_batch(LINES), rng=0, max_decode_length=6, temperature=0)
    expected = [tok.decode([t for t in s[:n] if t < tok.vocab_size]) for s, n in zip(base.sequences, base.lengths)]
    expected = ["" if not line.strip() else e for line, e in zip(LINES, expected)]  # an empty line stays empty
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected


def test_drafting_flag_errors(tmp_path, checkpoints, capsys):
    target, draft, _ = checkpoints
    src = tmp_path / "in.txt"
    src.write_text("Hello\n", encoding="utf-8")
    base = [
        "generate",
        "--target",
        str(target),
        "--input",
        str(src),
        "--output",
        str(tmp_path / "o.txt"),
        "--tokenizer",
        str(SPIECE),
    ]
    assert main(base + ["--draft", str(draft), "--draft-confidence-threshold", "1.5"]) == 2
    assert "--draft-confidence-threshold must be in [0, 1]" in capsys.readouterr().err
    assert main(base + ["--draft", "prompt-lookup", "--draft-confidence-threshold", "0.5"]) == 2
    assert "needs a draft model" in capsys.readouterr().err
    assert not (tmp_path / "o.txt").exists()


def test_directory_paths_are_clear_errors(tmp_path, checkpoints, capsys):
    """A directory as --input or --output, or an --output in a missing directory: one line naming the path
    and what to pass instead (exit 2), not an IsADirectoryError traceback."""
    target, draft, _ = checkpoints
    src = tmp_path / "in.txt"
    src.write_text("hi\n", encoding="utf-8")
    base = ["generate", "--target", str(target), "--draft", str(draft), "--tokenizer", str(SPIECE)]
    cases = [
        (["--input", str(tmp_path), "--output", str(tmp_path / "o.txt")], "is a directory"),
        (["--input", str(src), "--output", str(tmp_path)], "is a directory; pass a file name"),
        (["--input", str(src), "--output", str(tmp_path / "no" / "such" / "o.txt")], "does not exist"),
    ]
    for args, message in cases:
        assert main(base + args) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_short_file_is_not_padded_to_the_batch_size(tmp_path, checkpoints, monkeypatch):
    """Three lines with the default --batch-size 32 decode in 3 slots, not 32."""
    import specjax.bulk as bulk

    slots = []
    real = bulk.BulkDecoder

    def recording(*args, **kwargs):
        slots.append(kwargs["batch_size"])
        return real(*args, **kwargs)

    monkeypatch.setattr(bulk, "BulkDecoder", recording)
    rc, out = _run(tmp_path, checkpoints, lines=LINES[:3])
    assert rc == 0 and len(out.read_text(encoding="utf-8").splitlines()) == 3
    assert slots == [3]


def test_empty_input_lines_get_empty_output_lines(tmp_path, checkpoints, capsys):
    """A blank line in the input keeps its place: its output line is empty, a note says so once, and the other
    lines are the target's greedy decodes of themselves (the blank line's key index does not shift them)."""
    lines = [LINES[0], "", "   ", LINES[2]]
    rc, out = _run(tmp_path, checkpoints, "--batch-size", "2", lines=lines)
    assert rc == 0
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    tok = Tokenizer(SPIECE)
    base = temperature_sample(
        checkpoints[2], tok.encode_batch([LINES[0], LINES[2]]), rng=0, max_decode_length=6, temperature=0
    )
    expected = [tok.decode([t for t in s[:n] if t < tok.vocab_size]) for s, n in zip(base.sequences, base.lengths)]
    assert got == [expected[0], "", "", expected[1]]
    err = capsys.readouterr().err
    assert "note: 2 empty input line(s) (first: line 2)" in err
