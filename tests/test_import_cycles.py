"""``tools/check_import_cycles.py``: import circles found from ``ast`` imports (module level and inside functions,
absolute and relative), on small packages written here; a package's ``__init__`` re-exporting its submodules is not
a circle."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_import_cycles", REPO / "tools" / "check_import_cycles.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


def test_function_level_circle_is_found(tmp_path, capsys):
    pkg = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "def f():\n    from pkg.high import g\n    return g\n",
            "pkg/high.py": "from pkg import low\n\ndef g():\n    return low\n",
            "pkg/other.py": "import pkg.low\n",
        },
    )
    edges = tool.import_edges(tool.module_files(pkg))
    assert edges["pkg.low"] == {"pkg.high"} and edges["pkg.high"] == {"pkg.low"} and edges["pkg.other"] == {"pkg.low"}
    assert tool.circles(edges) == [["pkg.high", "pkg.low", "pkg.high"]]
    assert tool.main([str(pkg)]) == 1
    out = capsys.readouterr().out
    assert "import circle: pkg.high -> pkg.low -> pkg.high" in out and "1 import circle(s) among 4 modules" in out


def test_relative_imports_and_a_three_module_circle(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from . import a  # a package re-exporting its module: not a circle\n",
            "pkg/sub/a.py": "from .b import x\n",
            "pkg/sub/b.py": "from ..c import y\nx = 1\n",
            "pkg/c.py": "def y():\n    from pkg.sub.a import x\n",
        },
    )
    edges = tool.import_edges(tool.module_files(pkg))
    assert edges["pkg.sub"] == {"pkg.sub.a"} and edges["pkg.sub.a"] == {"pkg.sub.b"}
    assert edges["pkg.sub.b"] == {"pkg.c"} and edges["pkg.c"] == {"pkg.sub.a"}
    assert tool.circles(edges) == [["pkg.c", "pkg.sub.a", "pkg.sub.b", "pkg.c"]]


def test_layered_package_passes_and_outside_imports_are_ignored(tmp_path, capsys):
    pkg = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.top import run\n",
            "pkg/models/__init__.py": "from pkg.models import adapter, t5\n",
            "pkg/models/t5.py": "import numpy as np\nimport os.path\n",
            "pkg/models/adapter.py": "from pkg.models import t5\n",
            "pkg/top.py": "from pkg.models.adapter import *\n\ndef run():\n    import json\n",
        },
    )
    assert tool.main([str(pkg)]) == 0
    assert "0 import circle(s) among 5 modules" in capsys.readouterr().out


def test_bad_argument(tmp_path, capsys):
    assert tool.main([str(tmp_path)]) == 2
    assert "usage: python tools/check_import_cycles.py PACKAGE_DIR" in capsys.readouterr().err
