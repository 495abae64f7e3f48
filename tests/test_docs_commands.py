"""Every command in a ```bash block of README.md, CONTRIBUTING.md and docs/*.md is exercised as written.

Each ``specjax ...`` command is parsed by the command line's own parser (``specjax.cli.build_parser``): an unknown
flag, a bad value or a missing argument fails here, naming the document and the line. Files a command names inside
the repository (``configs/...``, ``benchmarks/....py``, ``tools/...``, ``tests/...``, ``specjax/assets/...``) must
exist; ``pip install`` extras must be declared in pyproject.toml; ``python -m build DIR`` needs a ``pyproject.toml``
there. The cheap ones also run: the translations in docs/cli.md (two processes sharing one cache directory, as a
user's two runs do). Cloud, venv and shell commands (gcloud, cd, mkdir, ``.``) are left to their own tools.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from specjax.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
SEPARATORS = {"&&", "||", ";", "|"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1"}
REPO_PATH = re.compile(r"^(configs|benchmarks|tools|tests|specjax/assets)/")


def _blocks(path: Path):
    """(first line number, text) of each ```bash block."""
    text = path.read_text(encoding="utf-8")
    for m in re.finditer(r"```bash\n(.*?)```", text, re.S):
        yield text[: m.start()].count("\n") + 2, m.group(1)


def _commands(text: str, first_line: int):
    """(line number, argv) of every simple command in a block: continuation lines joined, comments dropped, a
    quoted string spanning lines kept whole, split at && || ; |, redirections and leading VAR=value removed; a
    ``--command=...`` value (gcloud's remote command) yields its own commands."""
    lines = text.replace("\\\n", " ").split("\n")
    i = 0
    while i < len(lines):
        start, chunk = i, lines[i]
        while True:
            try:
                tokens = shlex.split(chunk, comments=True)
                break
            except ValueError:  # an open quote: the string goes on over the next line
                i += 1
                chunk += "\n" + lines[i]
        i += 1
        argv: list[str] = []
        for token in tokens + [";"]:
            ends = token not in SEPARATORS and token.endswith(";")  # `for x in a b; do`: the ; ends the command
            if ends:
                argv.append(token[:-1])
            if token in SEPARATORS or ends:
                while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
                    argv.pop(0)
                if argv:
                    yield first_line + start, [re.sub(r"\$\w+", "1", a) for a in argv]  # a loop variable: any value
                argv = []
            else:
                argv.append(token)
        for token in tokens:
            if token.startswith("--command="):
                yield from _commands(token[len("--command=") :], first_line + start)


def _all_commands():
    out = []
    for doc in DOCS:
        for first, block in _blocks(doc):
            for line, argv in _commands(block, first):
                out.append(pytest.param(argv, id=f"{doc.relative_to(REPO)}:{line}:{' '.join(argv)[:60]}"))
    return out


COMMANDS = _all_commands()


def _extras() -> set[str]:
    """The extras declared under ``[project.optional-dependencies]`` in pyproject.toml (Python 3.10 has no tomllib)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, re.M))


EXTRAS = _extras()


def _strip_redirects(argv: list[str]) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in REDIRECTS:
            skip = token != "2>&1"
        else:
            out.append(token)
    return out


def test_the_documents_have_commands():
    specjax = [p.values[0] for p in COMMANDS if p.values[0][0] == "specjax"]
    used = {argv[1] for argv in specjax if len(argv) > 1}
    assert {"demo", "translate", "generate", "convert", "train", "bench", "aot"} <= used, used


@pytest.mark.parametrize("argv", COMMANDS)
def test_a_documented_command_is_valid_as_written(argv):
    argv = _strip_redirects(argv)
    name = argv[0]
    for token in argv[1:]:
        if REPO_PATH.match(token) and "$" not in token and "*" not in token:
            assert (REPO / token).exists(), f"{token} does not exist in the repository"
    if name == "specjax":
        parser = build_parser()
        try:
            args, unknown = parser.parse_known_args(argv[1:])
        except SystemExit as e:
            pytest.fail(f"the parser refused {' '.join(argv)!r} (exit {e.code})")
        assert not unknown, f"unknown arguments {unknown}"
        assert getattr(args, "func", None) is not None, "no subcommand"
    elif name in ("python", "python3") and len(argv) > 1 and argv[1].endswith(".py"):
        assert (REPO / argv[1]).is_file(), f"{argv[1]} does not exist"
    elif name in ("python", "python3") and argv[1:3] == ["-m", "pytest"]:
        for token in argv[3:]:
            if token.startswith("tests"):
                assert (REPO / token).exists(), token
    elif name in ("python", "python3") and argv[1:3] == ["-m", "build"]:
        assert (REPO / argv[-1] / "pyproject.toml").is_file(), argv[-1]
    elif name == "pip" and argv[1:2] == ["install"]:
        for token in argv[2:]:
            m = re.fullmatch(r"(?:\.|specjax)\[([\w,-]+)\]", token)
            if m:
                missing = set(m.group(1).split(",")) - EXTRAS
                assert not missing, f"pip extras {missing} are not in pyproject.toml ({sorted(EXTRAS)})"


@pytest.mark.slow
def test_the_translate_commands_of_cli_md_run_as_written(tmp_path):
    """docs/cli.md's two translate commands, in two processes sharing a cache directory: each prints one German
    line on stdout and the acceptance line on stderr; the second finds the compiled programs and costs on disk."""
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    block = next(b for _, b in _blocks_of(text) if "specjax translate" in b)
    commands = [_strip_redirects(argv) for _, argv in _commands(block, 1)]
    assert len(commands) == 2 and all(c[:2] == ["specjax", "translate"] for c in commands)
    env = dict(os.environ, PYTHONPATH=str(REPO), SPECJAX_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the command's own default: under SPECJAX_CACHE_DIR
    for argv in commands:
        run = subprocess.run(
            [sys.executable, "-m", "specjax", *argv[1:]], env=env, cwd=REPO, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert len(lines) == 1 and lines[0] and not lines[0].startswith("#"), run.stdout
        assert "# acceptance rate alpha" in run.stderr
    assert (tmp_path / "cache" / "costs.json").is_file()
    assert any(p.is_file() for p in (tmp_path / "cache" / "xla").rglob("jit_*"))  # compiled decode programs kept


def _blocks_of(text: str):
    for m in re.finditer(r"```bash\n(.*?)```", text, re.S):
        yield 0, m.group(1)
