"""Helpers shared by the ``specjax`` subcommands that write one output line per input (``generate`` and its seqio
form), so that neither subcommand module imports the other."""

from __future__ import annotations

import os

__all__ = ["lines_done"]


def lines_done(path: str) -> int:
    """Complete lines already in the output file ``path`` (0 if absent or ``-``, stdout): where a rerun resumes.

    A trailing partial line (an interrupted write) is cut off the file.

    Raises:
      OSError: ``path`` exists but cannot be read and written.
    """
    if path == "-" or not os.path.exists(path):
        return 0
    with open(path, "rb+") as f:
        data = f.read()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):  # an interrupted write: drop the partial line
            f.truncate(complete)
    return data[:complete].count(b"\n")
