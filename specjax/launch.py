"""Several JAX processes on one machine: ``specjax generate --processes N`` (JAX's multi-controller runtime).

On a Cloud TPU slice every host runs the same command and JAX finds its peers itself (docs/tpu.md). On one
machine ``--processes N`` starts ``N`` copies of the command, joined by JAX's coordination service exactly as
the hosts of a slice are: process ``i`` gets

- ``JAX_COORDINATOR_ADDRESS=localhost:PORT`` (a free port: the launcher binds port 0 and reads it back),
  ``SPECJAX_NUM_PROCESSES=N``, ``SPECJAX_PROCESS_ID=i`` (read by ``specjax.parallel.maybe_initialize_distributed``,
  which passes them to ``jax.distributed.initialize``), ``SPECJAX_HEARTBEAT_SECONDS`` (the coordination
  service's heartbeat timeout);
- ``JAX_PLATFORMS=cpu``, ``XLA_FLAGS=--xla_force_host_platform_device_count=D`` (its own ``D`` host devices) and
  ``JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo`` (collectives across processes on CPU).

Process 0 writes the output and its messages go to this terminal; the others' messages go to a log file each, and
the launcher reports a failing process in one line. When a process dies (killed, out of memory, an error only it
met) the launcher stops the others at once, so nothing waits on a collective that cannot complete; the output holds
only whole lines, in order (``specjax.cli._common.OutputLines``), and the same command run again resumes after them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

__all__ = ["free_port", "launch_local", "process_environment"]

HEARTBEAT_SECONDS = 20  # the coordination service's heartbeat timeout for local processes (JAX's default: 100)
POLL_SECONDS = 0.1
STOP_SECONDS = 10.0  # after the first failure: how long the others get to exit before they are stopped


def free_port() -> int:
    """A TCP port free on localhost now (bind port 0 and read the port the kernel chose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def process_environment(base: dict, port: int, processes: int, index: int, devices: int) -> dict:
    """The environment of local process ``index`` of ``processes`` with ``devices`` host devices (the module
    docstring lists the variables): ``base`` with them set; an earlier device-count flag in ``XLA_FLAGS`` is
    replaced."""
    env = dict(base)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env.update(
        JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
        SPECJAX_NUM_PROCESSES=str(processes),
        SPECJAX_PROCESS_ID=str(index),
        SPECJAX_HEARTBEAT_SECONDS=env.get("SPECJAX_HEARTBEAT_SECONDS", str(HEARTBEAT_SECONDS)),
        JAX_PLATFORMS="cpu",
        JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
        XLA_FLAGS=" ".join(flags + [f"--xla_force_host_platform_device_count={devices}"]),
    )
    return env


def _how(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by signal {-status} ({signal.Signals(-status).name})"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def _last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _stop(procs: list) -> None:
    """SIGTERM to every process still running, then SIGKILL to any left after 5 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def launch_local(
    argv: list[str], processes: int, devices: int, *, command: str = "generate", after_failure=None
) -> int:
    """Runs ``python -m specjax *argv`` as ``processes`` local JAX processes of ``devices`` host devices
    each, joined by JAX's coordination service on a free localhost port, and waits for them.

    Args:
      argv: the command line of every process (each sees ``SPECJAX_PROCESS_ID`` and runs the command itself).
      processes: ``N`` >= 1.
      devices: host devices per process, >= 1.
      command: the subcommand's name, for the messages.
      after_failure: None, or a callable returning a sentence about what was kept (e.g. the lines in the output),
        appended to the failure line.
    Returns:
      0 when every process exits 0; else the first failing process's status (1 for one killed by a signal).
      A failure is reported in one line on stderr (process 0 reports its own errors itself).
    Raises:
      ValueError: ``processes`` or ``devices`` < 1.
      KeyboardInterrupt: Ctrl-C (the processes are stopped first).
    """
    if processes < 1 or devices < 1:
        raise ValueError(f"--processes and --devices-per-process must be >= 1, got {processes} and {devices}.")
    port = free_port()
    logs = tempfile.mkdtemp(prefix="specjax-processes-")
    procs, files = [], []

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i in range(processes):
            err = None
            if i > 0:
                err = open(os.path.join(logs, f"process{i}.log"), "w", encoding="utf-8")
                files.append(err)
            env = process_environment(os.environ, port, processes, i, devices)
            procs.append(subprocess.Popen([sys.executable, "-m", "specjax", *argv], env=env, stderr=err))
        first = None  # (index, status) of the first process to fail
        deadline = None
        while True:
            states = [p.poll() for p in procs]
            if first is None:
                bad = [(i, s) for i, s in enumerate(states) if s not in (None, 0)]
                if bad:
                    first = bad[0]
                    deadline = time.monotonic() + (0 if first[1] < 0 else STOP_SECONDS)  # killed: stop at once
            if all(s is not None for s in states):
                break
            if deadline is not None and time.monotonic() >= deadline:
                _stop(procs)
                break
            time.sleep(POLL_SECONDS)
    except BaseException:
        _stop(procs)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for f in files:
            f.close()
    if first is None:
        shutil.rmtree(logs, ignore_errors=True)  # kept only when a process failed (the message names them)
        return 0
    if procs[0].returncode in (2, 130):
        return procs[0].returncode  # process 0 printed its own error line (a refused argument or input; Ctrl-C)
    index, status = first
    detail = ""
    if index > 0:
        last = _last_line(os.path.join(logs, f"process{index}.log"))
        detail = f" ({last})" if last else ""
    kept = f"; {after_failure()}" if after_failure is not None else ""
    print(
        f"specjax {command}: error: process {index} of {processes} {_how(status)}{detail}; the other processes were "
        f"stopped (logs of processes 1..{processes - 1}: {logs}){kept}",
        file=sys.stderr,
    )
    return status if status > 0 else 1
