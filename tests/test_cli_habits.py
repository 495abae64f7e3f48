"""The ``specjax`` command's habits, for every subcommand: an error argparse finds in a subcommand's arguments
prints that subcommand's usage (not the top level's) and a one-line message on stderr, exit status 2; an error the
subcommand's own checks find is one line naming it; results go to stdout, statistics to stderr (``translate``'s
acceptance line, ``generate``'s report)."""

from __future__ import annotations

import pytest

from specjax.cli import SUBCOMMANDS, main


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_unknown_flag_shows_the_subcommands_usage(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--no-such-flag"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: specjax {command} " in err, err
    # The subcommand's first complaint: the unknown flag, or a required argument it lacks.
    assert f"specjax {command}: error: " in err
    assert "unrecognized arguments: --no-such-flag" in err or "arguments are required" in err
    assert "usage: specjax [-h] COMMAND" not in err


def test_unknown_top_level_flag_shows_the_top_level_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--no-such-flag"])
    assert e.value.code == 2
    assert "usage: specjax [-h] [--version] COMMAND" in capsys.readouterr().err


def test_version_flag_prints_the_package_version(capsys):
    import specjax

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"specjax {specjax.__version__}" == "specjax 0.2.0"


def test_a_subcommands_own_check_is_one_line_naming_it(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out"), "--to", "hf"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specjax convert: error: ") and "does not exist" in lines[0]


def test_translate_prints_translations_on_stdout_and_statistics_on_stderr(capsys):
    assert main(["translate", "--size", "mini", "--max-decode-length", "16", "A dog runs in the park."]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert len(out) == 1 and out[0] and not out[0].startswith("#")  # the translation alone
    assert "# acceptance rate alpha" in captured.err and "tokens per target call" in captured.err


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse's line breaks undone


@pytest.mark.parametrize("command", ["demo", "translate", "generate"])
def test_help_names_the_shipped_pairs_domain_and_the_way_to_other_text(command, capsys):
    """Every command that offers the shipped pair says what it was trained on and how to load another T5."""
    text = _help(command, capsys)
    assert "Multi30k image captions" in text and "--target/--draft" in text


def test_help_gives_the_defaults_the_commands_use(capsys):
    """``--help`` agrees with ``resolve_decoding_defaults``: generate's length is the translation length with the
    shipped pair and the text length with --target; translate names no flag it lacks (--mesh is generate's)."""
    from specjax.cli import build_parser, resolve_decoding_defaults
    from specjax.defaults import DECODE_DEFAULTS as D

    generate = _help("generate", capsys)
    assert (
        f"(default: {D.max_decode_length['translation']} with the shipped pair, {D.max_decode_length['text']} with "
        "--target checkpoints)" in generate
    )
    args = build_parser().parse_args(["generate", "--output", "-", "--input", "-"])
    resolve_decoding_defaults(args, "translation")  # what generate resolves without --target
    assert args.max_decode_length == D.max_decode_length["translation"]
    assert "--mesh" in generate and f"the default is {D.fixed_gamma}" in generate
    translate = _help("translate", capsys)
    assert "--mesh" not in translate and "--data-parallel" not in translate
    assert f"(default: {D.max_decode_length['translation']})" in translate


@pytest.mark.parametrize("command", ["demo", "generate"])
def test_a_default_named_in_help_is_a_value_the_flag_accepts(command, capsys):
    """``--dtype`` / ``--draft-dtype`` say their default is "auto": passing "auto" is accepted and means the
    default (what the command resolves with the flag absent); ``--max-input-length`` gives its default."""
    from specjax.cli import build_parser

    base = ["demo"] if command == "demo" else ["generate", "--output", "-", "--input", "-"]
    parser = build_parser()
    absent = parser.parse_args(base)
    given = parser.parse_args(base + ["--dtype", "auto", "--draft-dtype", "auto"])
    assert (given.dtype or "auto") == (absent.dtype or "auto") == "auto"
    assert (given.draft_dtype or "auto") == (absent.draft_dtype or "auto") == "auto"
    if command == "generate":
        assert "(default 512)" in " ".join(_help("generate", capsys).split())
