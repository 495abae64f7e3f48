"""Fails on an import circle among a package's modules: the layering rule of docs/architecture.md, checked in CI.

    python tools/check_import_cycles.py specjax        # prints each circle; exit status 1 if there is one

Every ``import`` and ``from ... import`` in every module is an edge, at module level and inside functions alike
(a function-level import is still a dependency, only a later one), relative imports resolved against the
importing module's package. ``from package import name`` counts as an edge to ``package.name`` when that is a
module, else to ``package``. A module importing its own package (``from specjax.models import t5`` inside
``specjax.models.adapter``) is not an edge to the package: a package's ``__init__`` re-exporting its submodules
would otherwise make every submodule a circle. Circles are the strongly connected components of more than one
module (Tarjan 1972), printed with one path through each.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_files(package_dir: Path) -> dict[str, Path]:
    """{dotted module name: file} for every ``.py`` under ``package_dir`` (a package's ``__init__.py`` is the
    package itself)."""
    root = package_dir.resolve()
    mods = {}
    for f in sorted(root.rglob("*.py")):
        parts = f.relative_to(root.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


def import_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, from the ``ast`` of each file.

    Raises:
      SyntaxError: a module does not parse (its file and line are in the message).
    """
    package = next(iter(mods)).split(".")[0] if mods else ""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        is_package = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), filename=str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_package else m.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and t.split(".")[0] == package and not m.startswith(t + "."):
                    edges[m].add(t)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (iterative Tarjan), each as a closed path
    ``[a, b, ..., a]`` through its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(_path(sorted(comp), edges))
    return comps


def _path(comp: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A closed path from the component's first module back to itself, through the component (breadth first)."""
    members, first = set(comp), comp[0]
    previous: dict[str, str] = {}
    frontier = [first]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & members):
                if w == first:
                    path = [v]
                    while path[-1] != first:
                        path.append(previous[path[-1]])
                    return [first, *reversed(path[:-1]), first] if len(path) > 1 else [first, v, first]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def main(argv: list[str] | None = None) -> int:
    """Prints each circle and a summary line; returns 1 if there is a circle, 2 for a bad argument, else 0."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0], "__init__.py").is_file():
        print("usage: python tools/check_import_cycles.py PACKAGE_DIR (a folder with an __init__.py)", file=sys.stderr)
        return 2
    mods = module_files(Path(argv[0]))
    found = circles(import_edges(mods))
    for c in found:
        print("import circle: " + " -> ".join(c))
    print(f"{len(found)} import circle(s) among {len(mods)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
