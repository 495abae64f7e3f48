"""What the ``specjax`` command sets up before anything heavy is imported (standard library only).

Importing ``specjax`` imports JAX, Flax and the models: a few seconds on a 2-core CPU, during which Ctrl-C would
otherwise end the command with a ``KeyboardInterrupt`` traceback. When this process is the command (``specjax
...`` or ``python -m specjax ...``), ``early_setup`` makes Ctrl-C exit with status 130 and one line from the very
start; ``specjax.cli.main`` then installs the full handler (``specjax.cli._common.install_interrupt_handler``,
which also flushes finished output). Nothing happens when ``specjax`` is imported as a library.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["running_as_command", "early_setup"]


def running_as_command() -> bool:
    """Whether this process runs the ``specjax`` command: the console script (``argv[0]`` named ``specjax``) or
    ``python -m specjax`` (``sys.orig_argv``)."""
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if argv0 in ("specjax", "specjax.exe"):
        return True
    orig = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b == "specjax" for a, b in zip(orig, orig[1:]))


def _interrupted(signum, frame) -> None:
    """Ctrl-C before the command started its work: one line, exit status 130, no teardown."""
    try:
        os.write(2, b"specjax: interrupted before the command started; nothing was written.\n")
    finally:
        os._exit(130)


def early_setup() -> None:
    """Installs the start-up Ctrl-C handler when this process is the ``specjax`` command and SIGINT is not ignored
    (a job started in the background by a shell without job control keeps ignoring it)."""
    if running_as_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


early_setup()  # at import: ``specjax/__init__.py`` imports this module before anything heavy
