"""Helpers shared by the ``specjax`` subcommands, so that no subcommand module imports another.

- Output: ``OutputLines`` (a line writer that creates its file only when the first line is written, so a run that
  fails before its first line leaves no new file and an existing output as it was), ``check_output_path`` (the
  early check of an output path) and ``lines_done`` (where a rerun resumes).
- Errors: ``os_error_line`` turns any ``OSError`` (permissions, a full disk, a missing directory, a read-only file
  system) into one line naming the path and the fix; ``specjax.cli.main`` prints it and exits with status 2.
- Interrupts: ``install_interrupt_handler`` makes Ctrl-C (SIGINT) at any moment, compilation included, exit with
  status 130 and one line, keeping every finished line (see its docstring for why it exits at once).
- The process's set-up before JAX starts: ``quiet_libtpu`` (no libtpu start-up lines on a host without a TPU) and
  ``enable_caches`` (XLA's persistent compilation cache and γ auto's measured costs in the user's cache directory).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import weakref
from pathlib import Path

__all__ = [
    "lines_done",
    "OutputLines",
    "check_output_path",
    "os_error_line",
    "install_interrupt_handler",
    "quiet_libtpu",
    "enable_caches",
    "phase_line",
    "process_seconds",
    "cache_settings",
    "flush_stdout",
    "discard_stdout",
    "INTERRUPT_EXIT",
]

INTERRUPT_EXIT = 130
"""The exit status after Ctrl-C (128 + SIGINT), as a shell reports a command ended by it."""


def lines_done(path: str) -> int:
    """Complete lines already in the output file ``path`` (0 if absent or ``-``, stdout, or not a regular file: a
    device such as ``/dev/full`` or ``/dev/null``, or a pipe, holds no earlier run's lines and may never end when
    read): where a rerun resumes.

    A trailing partial line (an interrupted write) is cut off the file.

    Raises:
      OSError: ``path`` exists but cannot be read and written.
    """
    if path == "-" or not os.path.isfile(path):
        return 0
    with open(path, "rb+") as f:
        data = f.read()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):  # an interrupted write: drop the partial line
            f.truncate(complete)
    return data[:complete].count(b"\n")


# Writers with lines in flight, flushed by the interrupt handler before the process exits.
_OPEN_WRITERS: weakref.WeakSet = weakref.WeakSet()


class OutputLines:
    """Appends lines of text to ``path`` (``-``: stdout), creating the file only when the first line is written.

    So a run that fails before its first line (a bad flag found late, a refused draft, Ctrl-C while compiling)
    leaves no new file, and an existing output (a resumed run's) exactly as it was. Every ``write`` is flushed
    (a rerun resumes after the lines on disk, ``lines_done``). A failing write (a full disk) raises an ``OSError``
    that names ``path``; a file this writer created and wrote nothing complete to is removed, and a partial last
    line is cut off, so the file holds whole lines only.

    Use as a context manager, or call ``close``.

    Args:
      path: the output file, or ``-`` for stdout.
    """

    def __init__(self, path: str):
        self.path = path
        self.written = 0  # lines written (and flushed) by this writer
        self._file = None
        self._created = False
        self._good_size = 0  # bytes of the file known to hold whole lines

    def _open(self):
        if self.path == "-":
            self._file = sys.stdout
            return
        self._created = not os.path.exists(self.path)
        try:
            self._file = open(self.path, "a", encoding="utf-8")
            self._good_size = self._file.tell()
        except OSError as e:
            raise _with_path(e, self.path) from None
        _OPEN_WRITERS.add(self)

    def write(self, lines) -> None:
        """Writes each string of ``lines`` as one line (a newline added) and flushes.

        Raises:
          OSError: the file cannot be created or written; its ``filename`` is ``path``.
        """
        lines = list(lines)
        if not lines:
            return
        if self._file is None:
            self._open()
        try:
            self._file.write("".join(line + "\n" for line in lines))
            self._file.flush()
        except OSError as e:
            self._undo_partial()
            raise _with_path(e, self.path) from None
        self.written += len(lines)
        if self._file is not sys.stdout:
            self._good_size = self._file.tell()

    def _undo_partial(self) -> None:
        """After a failed write: remove a file this writer created and finished no line in, else cut it back to
        its last whole line."""
        if self._file is None or self._file is sys.stdout:
            return
        try:
            self._file.close()
        except OSError:
            pass
        self._file = None
        _OPEN_WRITERS.discard(self)
        try:
            if self._created and self.written == 0:
                os.remove(self.path)
            else:
                os.truncate(self.path, self._good_size)
        except OSError:
            pass

    def flush(self) -> None:
        """Flushes what was written (the interrupt handler's call; errors ignored)."""
        if self._file is not None:
            try:
                self._file.flush()
            except (OSError, ValueError, RuntimeError):
                pass

    def close(self) -> None:
        """Closes the file (not stdout). Raises OSError (naming ``path``) if the last flush fails."""
        f, self._file = self._file, None
        _OPEN_WRITERS.discard(self)
        if f is not None and f is not sys.stdout:
            try:
                f.close()
            except OSError as e:
                raise _with_path(e, self.path) from None

    def __enter__(self) -> OutputLines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def flush_stdout() -> None:
    """Flushes stdout. Raises OSError with ``filename`` "stdout" when it cannot be written (``> /dev/full``)."""
    try:
        sys.stdout.flush()
    except OSError as e:
        raise _with_path(e, "stdout") from None


def discard_stdout() -> None:
    """Points file descriptor 1 at ``os.devnull``, so that what stdout still buffers after a failed write is
    dropped at exit instead of failing again ("Exception ignored ... BrokenPipeError" at shutdown)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def _with_path(e: OSError, path: str) -> OSError:
    """``e`` with ``filename`` set to ``path`` when it has none (a write's error names no file)."""
    if e.filename is None and e.errno is not None:
        return type(e)(e.errno, e.strerror or os.strerror(e.errno), path)
    return e


def check_output_path(path: str, flag: str = "--output") -> None:
    """Checks, before any work, that ``path`` can be written: its directory exists, it is not a directory, and the
    file can be opened for appending (tried for real: permission bits do not bind root, and a read-only file system
    shows only on opening). A file the check creates is removed again, so nothing is left behind. ``-`` (stdout)
    passes.

    Raises:
      FileNotFoundError / NotADirectoryError / IsADirectoryError / PermissionError / OSError: with ``filename``
        ``path``; ``os_error_line`` words each as one line with its fix.
    """
    if path == "-":
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(
            f"{flag} {path!r}: the directory {parent!r} does not exist; create it first (mkdir -p {parent})."
        )
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"{flag} {path!r} is a directory; pass a file name (e.g. {os.path.join(path, 'outputs.txt')!r})."
        )
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise _with_path(e, path) from None
    if not existed:
        try:
            os.remove(path)
        except OSError:
            pass


_FIXES = {
    errno.EACCES: "permission denied: write somewhere you may write (e.g. under your home directory), or change the "
    "permissions (chmod / chown)",
    errno.EPERM: "operation not permitted: write somewhere you may write, or change the permissions (chmod / chown)",
    errno.ENOENT: "no such file or directory: check the path, or create the directory first (mkdir -p)",
    errno.ENOTDIR: "a part of the path is a file, not a directory: check the path",
    errno.EISDIR: "it is a directory: pass a file name inside it",
    errno.ENOSPC: "no space left on the device: free some space (df -h shows how much is left) or write elsewhere",
    errno.EDQUOT: "disk quota exceeded: free some space or write elsewhere",
    errno.EROFS: "read-only file system: write somewhere else",
    errno.EEXIST: "it already exists: remove it or choose another name",
    errno.ENAMETOOLONG: "the name is too long: choose a shorter path",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or close other programs",
    errno.EIO: "input/output error: the device failed; check the disk or write elsewhere",
}


def os_error_line(e: OSError) -> str:
    """One line for an ``OSError``: the path it concerns and the fix, e.g. "cannot write 'out/x.txt': permission
    denied: write somewhere you may write ... (chmod / chown)". An error raised with a message of its own (no
    ``errno``, as specjax's checks raise ``FileNotFoundError("... ; create it first")``) is that message."""
    if e.errno is None:
        return str(e)
    what = _FIXES.get(e.errno, f"{(e.strerror or os.strerror(e.errno)).lower()}")
    if e.filename is None:
        return what[:1].upper() + what[1:] + "."
    names = repr(os.fspath(e.filename)) + (f" -> {os.fspath(e.filename2)!r}" if e.filename2 else "")
    return f"{names}: {what}."


def _announce(line: str) -> None:
    """Writes ``line`` to stderr on a line of its own (after a progress bar's unfinished line), unbuffered."""
    bar_open = False
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None:
        try:
            bar_open = any(not getattr(b, "disable", False) for b in list(tqdm.tqdm._instances))
        except Exception:  # a tqdm without _instances: no bar to step over
            bar_open = False
    data = (("\n" if bar_open else "") + line + "\n").encode("utf-8", "replace")
    try:
        os.write(2, data)
    except OSError:
        pass


def install_interrupt_handler(command: str) -> None:
    """Ctrl-C (SIGINT) ends ``specjax COMMAND`` at once with exit status 130 and one line on stderr, after flushing
    every finished line (``OutputLines`` writers and stdout).

    Why exit at once (``os._exit``) rather than raise ``KeyboardInterrupt``: while XLA compiles, jaxlib polls for
    signals and raises ``KeyboardInterrupt`` in Python with the compile still running on XLA's own threads; the
    interpreter's teardown then frees the client under it and the process dies with a segmentation fault (seen in
    ``xla::ifrt::MakeShardings`` with libtpu loaded; on XLA:CPU alone too), after leaving an empty output file.
    Nothing after the handler runs needs tearing down: outputs are flushed line by line, γ auto's cost file and
    JAX's compilation cache are written whole or not at all by their owners.

    ``specjax train`` installs its own handler while it trains (save the resume point, then stop) and restores
    this one afterwards. A process started with SIGINT ignored (a job a non-interactive shell put in the
    background with ``&``, or under ``nohup``) keeps ignoring it: that is how its starter asked for it to outlive a
    Ctrl-C in the terminal.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return

    def _on_sigint(signum, frame):
        kept = []
        for w in list(_OPEN_WRITERS):
            w.flush()
            if w.written:
                kept.append(f"{w.written} finished line{'s' if w.written != 1 else ''} in {w.path}")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, RuntimeError):  # a closed pipe, a full disk, a reentrant flush
                pass
        if kept:
            what = "; ".join(kept) + " (rerun the same command to resume after them)"
        else:
            what = "no line was finished yet" if command == "generate" else "finished output was kept"
        _announce(f"specjax {command}: interrupted; {what}.")
        os._exit(INTERRUPT_EXIT)

    signal.signal(signal.SIGINT, _on_sigint)


def quiet_libtpu() -> None:
    """On a host without a TPU, sets the environment so that libtpu, when loaded, prints none of its start-up lines.

    With libtpu installed (``specjax[tpu-aot]``), JAX loads it when it looks for backends (and ``specjax aot``
    loads it to compile for a TPU topology). On a host without a TPU, libtpu then looks for the TPU VM's metadata,
    finds none and prints "Failed to find host bounds for accelerator type: WARNING: could not determine TPU
    accelerator type ...", "WARNING: Logging before InitGoogle() is written to STDERR" and "E0000 ...
    INVALID_ARGUMENT: Error: unexpected worker hostname ... TPU_WORKER_HOSTNAMES ...". Giving it a one-host
    answer (``TPU_WORKER_HOSTNAMES=localhost``, ``TPU_HOST_BOUNDS=1,1,1``) silences them; JAX still finds no TPU
    and runs on the CPU, and ``specjax aot`` compiles the same programs for the topology it names (the topology
    is given explicitly; the report is unchanged). Does nothing where a TPU is present, where the user set any of
    these variables, or where libtpu is not installed. Call it before JAX loads a backend.
    """
    if any(k in os.environ for k in ("TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS", "TPU_ACCELERATOR_TYPE")):
        return
    if _has_tpu():
        return
    os.environ["TPU_WORKER_HOSTNAMES"] = "localhost"
    os.environ["TPU_HOST_BOUNDS"] = "1,1,1"


def _has_tpu() -> bool:
    """Whether this host has a TPU chip: a Google TPU on the PCI bus (JAX's own test,
    ``jax._src.hardware_utils``), else a ``/dev/accel*`` or ``/dev/vfio/<n>`` device."""
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # a JAX without the helper: look for the device files
        import glob

        return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def cache_settings(cache_dir: str | None = None, no_cache: bool = False) -> dict:
    """Where the command line keeps what it learns between runs, from its flags and the environment.

    - The root: ``--cache-dir``, else ``$SPECJAX_CACHE_DIR``, else ``~/.cache/specjax``.
    - XLA's persistent compilation cache: ``$JAX_COMPILATION_CACHE_DIR`` if set (JAX's own variable), else
      ``<root>/xla/<cpu>``, one folder per CPU model and feature set (XLA:CPU code is built for the CPU that
      compiled it, and JAX's cache key does not name the CPU: a home directory shared by several machines keeps
      one folder for each).
    - γ auto's measured costs: ``<root>/costs.json`` (``specjax.hardware.CostCache``).

    Off with ``--no-cache``, ``SPECJAX_CACHE_DIR=off`` (both) or ``JAX_ENABLE_COMPILATION_CACHE=false`` (XLA's
    alone). Returns ``{"root": Path | None, "xla": str | None}`` (None: off).
    """
    env_root = os.environ.get("SPECJAX_CACHE_DIR")
    if no_cache or (cache_dir is None and env_root is not None and env_root.strip().lower() in ("", "off", "none")):
        return {"root": None, "xla": None}
    root = Path(cache_dir or env_root or Path.home() / ".cache" / "specjax").expanduser()
    if os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "").strip().lower() in ("0", "false", "no", "off"):
        return {"root": root, "xla": None}
    xla = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(root / "xla" / _cpu_tag())
    return {"root": root, "xla": xla}


def _cpu_tag() -> str:
    """A short name for this CPU's model and feature flags (12 hex digits of a digest)."""
    import hashlib

    from specjax.hardware import cpu_info

    info = cpu_info()
    return hashlib.sha256(f"{info.model}|{' '.join(sorted(info.flags))}".encode()).hexdigest()[:12]


def process_seconds() -> float | None:
    """Wall seconds since this process started (Linux: ``/proc/self/stat``'s start time against
    ``/proc/uptime``); None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


def phase_line(phases: dict) -> str:
    """``{"import": 1.2, "load": 0.8, ...}`` (seconds, None skipped) -> "phases: import 1.2 s; load 0.8 s; ..."."""
    parts = [f"{name} {sec:.1f} s" for name, sec in phases.items() if sec is not None]
    return "phases: " + "; ".join(parts)


def enable_caches(cache_dir: str | None = None, no_cache: bool = False) -> dict:
    """Turns on, for this process, what ``cache_settings`` names: JAX's persistent compilation cache (programs
    however quick to compile; ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` overrides; the decode programs are
    kept whole, traced and lowered, by ``specjax.decoding.stored`` under the same root) and the costs file's
    location (``SPECJAX_CACHE_DIR``, read by ``specjax.hardware.cache_dir``; "off" when disabled). A cached
    program is the same program (the key is its HLO, the compile options and the jax/XLA versions): results do
    not depend on the cache. A cache directory that
    cannot be created or written (a read-only home) turns XLA's cache off for the run instead of failing it, as
    the costs file's writes are skipped (``CostCache``). Returns the settings.
    """
    settings = cache_settings(cache_dir, no_cache)
    if settings["xla"] is not None:
        try:
            os.makedirs(settings["xla"], exist_ok=True)
            if not os.access(settings["xla"], os.W_OK):
                raise PermissionError(errno.EACCES, "not writable", settings["xla"])
        except OSError:
            settings["xla"] = None
    os.environ["SPECJAX_CACHE_DIR"] = str(settings["root"]) if settings["root"] is not None else "off"
    import jax

    if settings["xla"] is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return settings
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", settings["xla"])
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        # Every program, however quick to compile: a warm run then compiles none of the small ones either (the
        # decode programs themselves are kept whole, traced and lowered, by specjax.decoding.stored).
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return settings
