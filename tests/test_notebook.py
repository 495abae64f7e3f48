"""Every notebook in notebooks/ runs top to bottom in a real Jupyter kernel (nbclient), as Colab would run it.

A failing cell fails the test (nbclient raises CellExecutionError naming the cell). Each notebook runs with
notebooks/ as its working directory, on the CPU, and prints what the assertions below check; the wall time of
each run is printed (pytest -s) and kept in the report of the test.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

# notebook -> texts its outputs must contain (checked after a clean run)
EXPECTED = {
    "quickstart.ipynb": ["Ein Mann in einem blauen Hemd"],  # the first translation, greedy
    "reproduce_paper.ipynb": ["implied c", "falling back to the shipped", "T=1.0 γ=4: α", "sweep took"],
    "bring_your_own_t5.ipynb": ["greedy identity: True", "tokens per target call"],
}


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_runs_top_to_bottom(name, data_dir, record_property):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert "/work/" not in cell.source and "../shared" not in cell.source, f"{name}: a path Colab does not have"
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    record_property("seconds", round(seconds, 1))
    print(f"{name}: {seconds:.0f} s")
    text = _text(nb)
    for expected in EXPECTED[name]:
        assert expected in text, f"{name}: {expected!r} not in its outputs:\n{text[-3000:]}"
