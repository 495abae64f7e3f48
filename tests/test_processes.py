"""Several JAX processes for real: two local processes of 4 host devices each, joined by JAX's coordination service
(the multi-controller runtime a TPU slice's hosts use; ``specjax generate --processes 2``, ``specjax.launch``).

- ``specjax generate --processes 2 --mesh data:4,model:2`` (each process decodes its share of the lines on
  data:2,model:2 of its own devices, the results merged with ``process_allgather``; process 0 writes) gives, line
  for line, the file one process on one device writes: greedy, and sampled with the same seed.
- A process killed mid-run: the launcher stops the other one and exits non-zero within 2 minutes with one error
  line; the output holds only whole lines, the first lines of the one-device output; the same command run again
  resumes and completes it.
- The whole run interrupted (Ctrl-C, SIGINT to every process): exit status 130, whole lines kept; a rerun resumes.
- ``model_parallel_sample`` on a mesh spanning both processes equals one device (``tests/_processes_check.py``).

The models are tiny random T5s (2 layers, width 32; output logits × 8, so their distributions are peaked as a
trained model's are) with the shipped mini pair's 8,000-piece vocabulary, saved as Hugging Face checkpoints, so each
process compiles small programs. Every child process runs in its own session and
is killed on any failure or timeout (no test waits without a limit).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_decoding import _scaled

from specjax import T5Config, T5Model, launch
from specjax.checkpoints import save_checkpoint
from specjax.cli import main as cli

HERE = Path(__file__).parent
ROOT = HERE.parent
DATA = ROOT.parent / "shared" / "data"
SPIECE = ROOT / "specjax" / "assets" / "mini_pair" / "spiece.model"
LINES = 64
WAIT = 600  # seconds: the most any child process may take (compiles on a loaded machine)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLA_FLAGS", None)
    return env


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """Tiny target and draft checkpoints, 64 input lines (Multi30k test captions of at most 16 tokens) and the
    one-process, one-device outputs of ``specjax generate`` for them: greedy and sampled (seed 5).

    Sampled lines are compared bit for bit, which DESIGN.md promises across companies only in law: the encoder runs
    in insert programs of another row count when a rerun resumes elsewhere, and a last-bit difference can flip a
    sampled token where the distribution is near uniform (unscaled random models over 8,000 pieces: seen once in
    64 lines). Peaked distributions (× 8) and one encoder width (inputs of at most 16 tokens) keep such flips out.
    """
    captions = DATA / "train" / "multi30k" / "test_2016_flickr.en"
    if not captions.exists():
        pytest.fail(f"data not found: {captions}")
    tmp = tmp_path_factory.mktemp("processes")
    cfg = T5Config(
        vocab_size=8000, d_model=32, num_heads=4, head_dim=8, mlp_dim=64, num_encoder_layers=2, num_decoder_layers=2
    )
    target, draft = tmp / "target", tmp / "draft"
    save_checkpoint(_scaled(T5Model.random(cfg, 0), 8.0), str(target))
    save_checkpoint(_scaled(T5Model.random(cfg.replace(num_decoder_layers=1), 1), 8.0), str(draft))
    from specjax.tokenizer import Tokenizer

    tok = Tokenizer(SPIECE)
    lines = [line for line in captions.read_text(encoding="utf-8").splitlines() if len(tok.encode(line)) <= 16]
    src = tmp / "in.en"
    src.write_text("\n".join(lines[:LINES]) + "\n", encoding="utf-8")
    common = ["generate", "--target", str(target), "--draft", str(draft), "--tokenizer", str(SPIECE)]
    common += ["--input", str(src), "--gamma", "2", "--max-decode-length", "8"]
    out = {"tmp": tmp, "common": common}
    for name, sampling in (("greedy", ["--temperature", "0"]), ("sampled", ["--temperature", "1", "--seed", "5"])):
        dst = tmp / f"one_{name}.txt"
        assert cli(common + sampling + ["--output", str(dst), "--batch-size", "4"]) == 0
        out[name] = dst.read_text(encoding="utf-8")
        out[f"{name}_args"] = sampling
    assert out["greedy"] != out["sampled"] and out["greedy"].count("\n") == LINES
    return out


def _start(argv: list[str], stderr) -> subprocess.Popen:
    """``python -m specjax *argv`` in its own session (its processes are one group: killed together)."""
    cmd = [sys.executable, "-m", "specjax", *argv]
    return subprocess.Popen(cmd, env=_env(), cwd=ROOT, stderr=stderr, start_new_session=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _wait_for_a_line(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT
    while not (path.exists() and path.stat().st_size > 0):
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before its first line"
        assert time.monotonic() < deadline, f"no line in {path} after {WAIT} s"
        time.sleep(0.02)


def _process(launcher: int, index: int) -> int:
    """The pid of local process ``index`` started by the launcher ``launcher`` (its ``SPECJAX_PROCESS_ID``)."""
    for child in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"SPECJAX_PROCESS_ID={index}".encode() in environ:
            return int(child)
    raise AssertionError(f"no process {index} under the launcher {launcher}")


def _run_processes(setup, name: str, dst: Path, interrupt=None) -> tuple[int, str, float]:
    """``specjax generate --processes 2 --mesh data:4,model:2`` into ``dst``; ``interrupt(launcher)`` is called once
    the first line is written. Returns (exit status, stderr, seconds from the interrupt to the exit)."""
    argv = setup["common"] + setup[f"{name}_args"] + ["--output", str(dst), "--batch-size", "4"]
    argv += ["--processes", "2", "--mesh", "data:4,model:2"]
    log = setup["tmp"] / f"{dst.name}.stderr"
    with open(log, "w", encoding="utf-8") as err:
        proc = _start(argv, err)
        try:
            t0 = time.monotonic()
            if interrupt is not None:
                _wait_for_a_line(dst, proc)
                t0 = time.monotonic()
                interrupt(proc.pid)
            status = proc.wait(timeout=WAIT)
            seconds = time.monotonic() - t0
        finally:
            _kill_group(proc)
    return status, log.read_text(encoding="utf-8", errors="replace"), seconds


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower() and "gloo" not in line.lower()]


@pytest.mark.slow
def test_two_processes_write_the_one_device_lines_and_survive_a_killed_process(setup):
    """Greedy, γ 2: process 1 killed (SIGKILL) after the first line is written: exit non-zero within 2 minutes
    with one error line naming it; whole lines only, the one-device output's first ones; the rerun completes the
    file and it equals the one-device output line for line."""
    dst = setup["tmp"] / "two_greedy.txt"
    status, stderr, seconds = _run_processes(setup, "greedy", dst, lambda pid: os.kill(_process(pid, 1), 9))
    assert status != 0 and seconds < 120, (status, seconds)
    errors = _error_lines(stderr)
    assert len(errors) == 1 and "process 1 of 2 was killed by signal 9 (SIGKILL)" in errors[0], stderr[-3000:]
    assert "run the same command again to resume" in errors[0]
    kept = dst.read_text(encoding="utf-8")
    assert kept.endswith("\n") and setup["greedy"].startswith(kept)
    assert 1 <= kept.count("\n") < LINES
    status, stderr, _ = _run_processes(setup, "greedy", dst)
    assert status == 0, stderr[-3000:]
    assert dst.read_text(encoding="utf-8").splitlines() == setup["greedy"].splitlines()


@pytest.mark.slow
def test_two_processes_sampled_resume_after_an_interrupt_of_the_whole_run(setup):
    """Temperature 1, seed 5: Ctrl-C (SIGINT to every process) after the first line: status 130, whole lines of
    the one-device output kept; the rerun resumes and the file equals the one-device output line for line."""
    dst = setup["tmp"] / "two_sampled.txt"
    status, stderr, seconds = _run_processes(setup, "sampled", dst, lambda pid: os.killpg(pid, signal.SIGINT))
    assert status == 130 and seconds < 120, (status, seconds, stderr[-3000:])
    kept = dst.read_text(encoding="utf-8")
    assert kept.endswith("\n") and setup["sampled"].startswith(kept)
    status, stderr, _ = _run_processes(setup, "sampled", dst)
    assert status == 0, stderr[-3000:]
    assert dst.read_text(encoding="utf-8").splitlines() == setup["sampled"].splitlines()


@pytest.mark.slow
def test_model_parallel_sample_across_two_processes_equals_one_device():
    """``model_parallel_sample`` over the global mesh data:4,model:2 (4 devices of each process): speculative
    greedy and sampled results equal the one-device ones, every field, on both processes."""
    port = launch.free_port()
    procs = []
    try:
        for i in range(2):
            env = launch.process_environment(_env(), port, 2, i, 4)
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "_processes_check.py")],
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        outputs = [p.communicate(timeout=WAIT) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
        r = json.loads(out.strip().splitlines()[-1])
        assert (r["processes"], r["devices"], r["local_devices"], r["mesh_processes"]) == (2, 8, 4, [0, 1])
        for case in ("speculative_greedy", "speculative_sampled"):
            assert r[case]["equal"], (r["process"], case)
            assert r[case]["distinct_rows"] > 1
        assert set(r["speculative_greedy"]["lengths"]) != {8}  # some rows end early (eos 58): uneven rows


def test_a_mesh_that_does_not_span_the_processes_is_one_line(setup):
    """``--processes 2 --devices-per-process 4 --mesh data:2,model:2`` (4 devices, not the 8 of both processes):
    status 2 and one error line, from process 0, naming the sizes that fit; no output file."""
    dst = setup["tmp"] / "bad_mesh.txt"
    argv = setup["common"] + setup["greedy_args"] + ["--output", str(dst), "--processes", "2"]
    argv += ["--devices-per-process", "4", "--mesh", "data:2,model:2"]
    log = setup["tmp"] / "bad_mesh.stderr"
    with open(log, "w", encoding="utf-8") as err:
        proc = _start(argv, err)
        try:
            status = proc.wait(timeout=WAIT)
        finally:
            _kill_group(proc)
    errors = _error_lines(log.read_text(encoding="utf-8", errors="replace"))
    assert status == 2 and len(errors) == 1, errors
    assert "the mesh spans every process's devices (8)" in errors[0] and "data:8,model:1" in errors[0]
    assert not dst.exists()
