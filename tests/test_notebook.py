"""The quickstart notebook's code cells run top to bottom on the embedded pair (shell/magic lines skipped)."""

from __future__ import annotations

import json
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_runs(data_dir, capsys, monkeypatch):
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    code = "\n".join(l for l in code.splitlines() if not l.strip().startswith(("!", "%")))
    monkeypatch.chdir(NOTEBOOK.parent)  # the notebook reads ../../shared/data relative to notebooks/
    exec(compile(code, str(NOTEBOOK), "exec"), {"__name__": "__notebook__"})
    out = capsys.readouterr().out
    assert "Ein Mann in einem blauen Hemd" in out  # the notebook's first translation, greedy
