"""The command line under Ctrl-C and operating-system errors, run as a user runs it.

Ctrl-C (SIGINT) at any moment of ``demo``, ``translate``, ``generate``, ``bench`` and ``aot`` -- while Python imports,
while XLA compiles the first program, between output lines -- exits with status 130 and exactly one line on stderr
(no traceback, no segmentation fault), keeping every finished line and creating no empty output file. An OS error
(a missing directory, no permission, a full disk) is one line naming the path and its fix, exit status 2, and
leaves nothing behind. Each interrupt test starts ``python -m specjax`` in a subprocess with an empty compilation
cache of its own (so the first program really compiles) and sends the signal when the command's own progress
line shows the phase; no test asserts a time.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from specjax.cli import main
from specjax.cli._common import OutputLines, check_output_path, os_error_line

REPO = Path(__file__).resolve().parents[1]
BAD_OUTPUT = ("Traceback", "Segmentation", "Fatal Python error", "core dumped")


class Command:
    """``python -m specjax ARGS`` in a subprocess, its stdout and stderr collected as they come."""

    def __init__(self, args, tmp_path: Path):
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO),
            SPECJAX_CACHE_DIR=str(tmp_path / "cache"),
            JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla"),  # empty: the first program compiles
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specjax", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.started = time.monotonic()
        self.out, self.err = [], []
        self.threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self.threads:
            t.start()

    @staticmethod
    def _read(stream, sink):
        for chunk in iter(lambda: stream.read1(4096), b""):
            sink.append(chunk)

    @property
    def stdout(self) -> str:
        return b"".join(self.out).decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return b"".join(self.err).decode("utf-8", "replace")

    def wait_for(self, ready, timeout: float = 600.0) -> None:
        """Waits until ``ready(self)`` is true; fails if the command ends first."""
        deadline = time.monotonic() + timeout
        while not ready(self):
            assert self.proc.poll() is None, f"ended (status {self.proc.returncode}) too early:\n{self.stderr}"
            assert time.monotonic() < deadline, f"not ready after {timeout} s:\n{self.stderr}"
            time.sleep(0.05)

    def interrupt(self, after: float = 0.0) -> int:
        """Sends SIGINT ``after`` seconds from now; returns the exit status."""
        time.sleep(after)
        assert self.proc.poll() is None, f"ended (status {self.proc.returncode}) before the signal:\n{self.stderr}"
        self.proc.send_signal(signal.SIGINT)
        status = self.proc.wait(timeout=120)
        for t in self.threads:
            t.join(timeout=10)
        return status


def assert_interrupted(cmd: Command, status: int, command: str) -> str:
    """Status 130; stderr's last line, and only it, says the command was interrupted; nothing crashed."""
    err = cmd.stderr
    assert status == 130, err
    for bad in BAD_OUTPUT:
        assert bad not in err, err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    said = [line for line in lines if "interrupted" in line]
    assert len(said) == 1 and said[0] == lines[-1], err
    assert said[0].startswith("specjax"), said[0]
    assert command in said[0] or "before the command started" in said[0], said[0]
    return said[0]


def test_ctrl_c_while_python_imports_exits_130_with_one_line(tmp_path):
    cmd = Command(["translate", "--size", "mini", "A dog runs."], tmp_path)
    line = assert_interrupted(cmd, cmd.interrupt(after=1.0), "translate")
    assert cmd.stdout == ""
    assert "nothing was written" in line or "finished output" in line


@pytest.mark.slow
def test_demo_ctrl_c_while_compiling_exits_130_with_one_line(tmp_path):
    cmd = Command(["demo", "--size", "mini", "--num-lines", "3"], tmp_path)
    cmd.wait_for(lambda c: "building or loading" in c.stderr)  # the first decode program is being built
    assert_interrupted(cmd, cmd.interrupt(after=1.0), "demo")


@pytest.mark.slow
def test_translate_ctrl_c_after_start_exits_130_with_one_line(tmp_path):
    cmd = Command(["translate", "--size", "mini", "--gamma", "3", "A dog runs in the park."], tmp_path)
    # translate prints nothing before its result: 4 s in, the models are loaded or loading, or the program compiles.
    cmd.wait_for(lambda c: time.monotonic() - c.started >= 4.0)
    assert_interrupted(cmd, cmd.interrupt(), "translate")


@pytest.fixture
def inputs(tmp_path) -> Path:
    path = tmp_path / "in.en"
    path.write_text("A dog runs in the park.\n" * 200, encoding="utf-8")  # one input width: one program
    return path


@pytest.mark.slow
@pytest.mark.parametrize("existing", [None, "Ein Hund.\nZwei Hunde.\n"])
def test_generate_ctrl_c_while_compiling_leaves_the_output_as_it_was(tmp_path, inputs, existing):
    out = tmp_path / "out.de"
    if existing is not None:
        out.write_text(existing, encoding="utf-8")
    args = ["generate", "--size", "mini", "--input", str(inputs), "--output", str(out), "--gamma", "3"]
    cmd = Command(args + ["--batch-size", "4"], tmp_path)
    cmd.wait_for(lambda c: "generate:" in c.stderr)  # the progress bar: the first batch is compiling
    assert_interrupted(cmd, cmd.interrupt(after=1.0), "generate")
    if existing is None:
        assert not out.exists()  # no empty file left behind
    else:
        assert out.read_text(encoding="utf-8") == existing


@pytest.mark.slow
def test_generate_ctrl_c_between_lines_keeps_every_finished_line(tmp_path, inputs):
    out = tmp_path / "out.de"
    args = ["generate", "--size", "mini", "--input", str(inputs), "--output", str(out), "--gamma", "3"]
    cmd = Command(args + ["--batch-size", "1", "--max-decode-length", "16"], tmp_path)
    cmd.wait_for(lambda c: out.exists() and out.read_bytes().count(b"\n") >= 2)
    line = assert_interrupted(cmd, cmd.interrupt(), "generate")
    data = out.read_text(encoding="utf-8")
    n = data.count("\n")
    assert data.endswith("\n") and 2 <= n < 200  # whole lines only, every one finished before the signal
    assert len(set(data.splitlines())) == 1  # the same input line: the same greedy translation each time
    assert f"{n} finished lines in {out}" in line and "rerun the same command to resume" in line


@pytest.mark.slow
def test_bench_ctrl_c_while_compiling_exits_130_with_one_line(tmp_path):
    args = ["bench", "--config", "configs/mini_pair_cpu.json", "--task", "multi30k", "--num-inputs", "2"]
    cmd = Command(args + ["--out", str(tmp_path / "bench"), "--no-plots", "--no-quality"], tmp_path)
    cmd.wait_for(lambda c: "bench:" in c.stderr)  # the progress bar: loading and compiling the first row
    assert_interrupted(cmd, cmd.interrupt(after=1.0), "bench")


@pytest.mark.slow
def test_aot_ctrl_c_while_compiling_exits_130_with_one_line(tmp_path):
    args = ["aot", "--topology", "v4-8", "--target", "t5_small", "--draft", "none", "--programs", "none"]
    cmd = Command(args + ["--input-length", "16", "--output-length", "8"], tmp_path)
    cmd.wait_for(lambda c: "compiling piece" in c.stderr)
    assert_interrupted(cmd, cmd.interrupt(after=0.5), "aot")


# --- operating-system errors: one line naming the path and the fix, exit status 2, nothing left behind ----------


def _one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"specjax {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_generate_into_a_missing_directory_is_one_line_before_any_model_loads(tmp_path, inputs, capsys):
    out = tmp_path / "no" / "such" / "out.de"
    assert main(["generate", "--size", "mini", "--input", str(inputs), "--output", str(out)]) == 2
    line = _one_error_line(capsys, "generate")
    assert str(out.parent) in line and "mkdir -p" in line
    assert not out.parent.exists()


def test_generate_into_a_directory_it_may_not_write_is_one_line(tmp_path, inputs, capsys):
    # /sys refuses new files even to root (sysfs); a plain chmod'ed directory would not stop root.
    out = "/sys/specjax-out.de"
    assert main(["generate", "--size", "mini", "--input", str(inputs), "--output", out]) == 2
    line = _one_error_line(capsys, "generate")
    assert repr(out) in line and "permission denied" in line and "chmod" in line
    assert not os.path.exists(out)


def test_aot_json_into_a_missing_directory_is_one_line_before_compiling(tmp_path, capsys):
    path = tmp_path / "missing" / "report.json"
    assert main(["aot", "--topology", "v4-8", "--json", str(path)]) == 2
    assert str(path.parent) in _one_error_line(capsys, "aot")


def test_convert_into_a_place_it_may_not_write_is_one_line(capsys):
    src = REPO / "specjax" / "assets" / "mini_pair" / "draft_distilled"
    assert main(["convert", str(src), "/sys/specjax-converted", "--to", "hf"]) == 2
    line = _one_error_line(capsys, "convert")
    assert "/sys/specjax-converted" in line and ("permission denied" in line or "not permitted" in line)


@pytest.mark.slow
def test_generate_onto_a_full_disk_is_one_line(tmp_path, inputs):
    """/dev/full: every write fails with ENOSPC, as on a full disk; the error comes with the first batch's lines."""
    args = ["generate", "--size", "mini", "--input", str(inputs), "--output", "/dev/full", "--gamma", "3"]
    cmd = Command(args + ["--max-decode-length", "8", "--batch-size", "8"], tmp_path)
    assert cmd.proc.wait(timeout=600) == 2
    for t in cmd.threads:
        t.join(timeout=10)
    lines = [line for line in cmd.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert lines[-1] == (
        "specjax generate: error: '/dev/full': no space left on the device: free some space (df -h shows how much "
        "is left) or write elsewhere."
    ), cmd.stderr
    assert not any(bad in cmd.stderr for bad in BAD_OUTPUT)


def test_output_lines_creates_the_file_with_its_first_line(tmp_path):
    path = tmp_path / "out.txt"
    with OutputLines(str(path)) as out:
        assert not path.exists()
        out.write([])
        assert not path.exists()
        out.write(["eins", "zwei"])
        assert path.read_text() == "eins\nzwei\n" and out.written == 2
    with OutputLines(str(path)) as out:  # appends: a resumed run
        out.write(["drei"])
    assert path.read_text() == "eins\nzwei\ndrei\n"


def test_output_lines_on_a_full_disk_names_the_path(tmp_path):
    out = OutputLines("/dev/full")
    with pytest.raises(OSError) as e:
        out.write(["eins"])
    assert e.value.errno == errno.ENOSPC and e.value.filename == "/dev/full"
    out.close()


def test_a_device_as_output_has_no_lines_to_resume_after():
    """Reading /dev/full or /dev/zero never ends (a run with --output /dev/full once read it until memory ran out)."""
    from specjax.cli._common import lines_done

    assert lines_done("/dev/full") == lines_done("/dev/null") == lines_done("-") == 0


def test_check_output_path_leaves_nothing_behind(tmp_path):
    path = tmp_path / "out.txt"
    check_output_path(str(path))
    assert not path.exists()
    path.write_text("kept\n")
    check_output_path(str(path))
    assert path.read_text() == "kept\n"
    with pytest.raises(IsADirectoryError, match="is a directory; pass a file name"):
        check_output_path(str(tmp_path))
    check_output_path("-")


@pytest.mark.parametrize(
    "error,expected",
    [
        (PermissionError(errno.EACCES, "Permission denied", "/srv/out.txt"), "'/srv/out.txt': permission denied: "),
        (OSError(errno.ENOSPC, "No space left on device", "/dev/full"), "'/dev/full': no space left on the device"),
        (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/x"), "'/mnt/ro/x': read-only file system: write"),
        (FileNotFoundError(errno.ENOENT, "No such file", "a/b"), "'a/b': no such file or directory: check the path"),
        (FileNotFoundError("No input file 'x'; pass a text file."), "No input file 'x'; pass a text file."),
    ],
)
def test_os_error_line_names_the_path_and_the_fix(error, expected):
    line = os_error_line(error)
    assert line.startswith(expected) and "\n" not in line


# --- libtpu quiet: no start-up lines on a host without a TPU ---------------------------------------------------


LIBTPU_LINES = ("host bounds", "InitGoogle", "E0000", "TPU_WORKER_HOSTNAMES", "libtpu_init_utils")


def _no_tpu_env(tmp_path) -> dict:
    """The environment of a fresh shell: none of the variables the tests' own set-up puts in place; libtpu may load
    while another process holds it (ALLOW_MULTIPLE_LIBTPU_LOAD: it then prints its start-up lines, as it does
    when it is the only one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS")}
    return dict(env, PYTHONPATH=str(REPO), ALLOW_MULTIPLE_LIBTPU_LOAD="1", SPECJAX_CACHE_DIR=str(tmp_path / "c"))


def test_a_command_prints_no_libtpu_lines(tmp_path):
    pytest.importorskip("libtpu", reason="libtpu is not installed: it has nothing to print")
    from specjax.cli._common import _has_tpu

    if _has_tpu():
        pytest.skip("this host has a TPU: libtpu's start-up lines are its own business there")
    env = _no_tpu_env(tmp_path)
    bare = subprocess.run(
        [sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True, text=True, timeout=300
    )
    assert any(s in bare.stderr for s in LIBTPU_LINES), bare.stderr  # what a plain `import jax` user sees
    src = REPO / "specjax" / "assets" / "mini_pair" / "draft_distilled"
    run = subprocess.run(
        [sys.executable, "-m", "specjax", "convert", str(src), str(tmp_path / "hf"), "--to", "hf"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert not any(s in run.stderr for s in LIBTPU_LINES), run.stderr
    assert run.stdout.startswith("wrote hf checkpoint to ")


def test_a_missing_checkpoint_is_the_only_line(tmp_path, capsys):
    missing = tmp_path / "no_such_checkpoint"
    assert main(["translate", "--target", str(missing), "--draft", str(missing), "A dog runs."]) == 2
    line = _one_error_line(capsys, "translate")  # no "tokenizer: ..." line before it
    assert str(missing) in line


@pytest.mark.parametrize("gamma", ["3", "auto"])
def test_a_draft_with_another_vocabulary_leaves_no_output_file(tmp_path, inputs, capsys, gamma):
    from specjax import T5Config, T5Model, save_checkpoint

    tiny = T5Config(
        vocab_size=32128, d_model=16, num_heads=2, head_dim=8, mlp_dim=32, num_encoder_layers=1,
        num_decoder_layers=1, name="tiny",
    )  # fmt: skip
    draft = save_checkpoint(T5Model.random(tiny, seed=1), tmp_path / "draft")
    target = REPO / "specjax" / "assets" / "mini_pair" / "target"  # 8000 pieces
    out = tmp_path / "out.de"
    args = ["generate", "--target", str(target), "--draft", str(draft), "--input", str(inputs), "--output", str(out)]
    assert main(args + ["--gamma", gamma]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("specjax generate: error: ")]
    assert len(lines) == 1 and "draft vocabulary (32128 tokens) differs from the target's (8000)" in lines[0], err
    assert "Traceback" not in err
    assert not out.exists()


def test_main_called_from_python_gives_ctrl_c_back(tmp_path):
    """The command's own Ctrl-C handler (exit at once) is for the `specjax` process; a test or a notebook calling
    main() keeps its own handler afterwards."""
    before = signal.getsignal(signal.SIGINT)
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out"), "--to", "hf"]) == 2
    assert signal.getsignal(signal.SIGINT) is before


def test_an_ignored_ctrl_c_stays_ignored():
    """A background job (SIGINT ignored by the shell that started it) is not made killable by Ctrl-C."""
    from specjax.cli._common import install_interrupt_handler

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        install_interrupt_handler("generate")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


# --- the caches kept between runs ---------------------------------------------------------------------------------


def test_cache_settings_follow_the_flags_and_the_environment(tmp_path, monkeypatch):
    from specjax import hardware
    from specjax.cli._common import cache_settings

    for var in ("SPECJAX_CACHE_DIR", "JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    default = cache_settings()
    assert default["root"] == tmp_path / "home" / ".cache" / "specjax"
    assert Path(default["xla"]).parent == default["root"] / "xla"  # one folder per CPU below it
    assert cache_settings(cache_dir=str(tmp_path / "c"))["root"] == tmp_path / "c"
    assert cache_settings(no_cache=True) == {"root": None, "xla": None}
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert cache_settings()["xla"] == str(tmp_path / "jax")  # JAX's own variable wins for the programs
    monkeypatch.setenv("JAX_ENABLE_COMPILATION_CACHE", "false")
    assert cache_settings()["xla"] is None and cache_settings()["root"] is not None
    monkeypatch.setenv("SPECJAX_CACHE_DIR", "off")
    assert cache_settings() == {"root": None, "xla": None}
    assert hardware.cache_dir() is None and hardware.CostCache().path is None  # costs kept in memory only
    costs = hardware.CostCache()
    costs.put("k", {"a": 1.0})
    assert costs.get("k") == {"a": 1.0} and not (tmp_path / "home").exists()
