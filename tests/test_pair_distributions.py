"""Where ``specjax.defaults.pair_dir`` finds a shipped pair: the installed distribution first (``importlib.metadata``),
then the source checkout's ``specjax/assets/<size>_pair``, else a one-line error naming the install line.

``importlib.metadata.distribution`` is replaced by a fake (no package is built or installed here); the pair
distributions' own build files are checked as text.
"""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import pytest

from specjax import defaults

REPO = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11


class _FakeDistribution:
    def __init__(self, root: Path):
        self.root = root

    def locate_file(self, path: str) -> Path:
        return self.root / path


def _fake_pair(root: Path, package: str) -> Path:
    """A pair directory with the four entries ``pair_dir`` checks (copied from the mini pair: 4 small files)."""
    pair = root / package
    for name in ("target", "draft_distilled", "draft_reference"):
        (pair / name).mkdir(parents=True)
    shutil.copy(defaults.ASSETS / "mini_pair" / "spiece.model", pair / "spiece.model")
    return pair


def _distributions(monkeypatch, installed: dict[str, Path]):
    def distribution(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return _FakeDistribution(installed[name])

    monkeypatch.setattr(defaults.importlib.metadata, "distribution", distribution)


def test_installed_distribution_comes_first(monkeypatch, tmp_path):
    pair = _fake_pair(tmp_path, "specjax_small_pair")
    _distributions(monkeypatch, {"specjax-small-pair": tmp_path})
    assert defaults.pair_dir("small") == pair
    assert defaults.PAIRS["small"] == pair
    # The other size is not installed: the checkout's copy serves it.
    assert defaults.pair_dir("mini") == defaults.ASSETS / "mini_pair"


def test_checkout_when_no_distribution_is_installed(monkeypatch):
    _distributions(monkeypatch, {})
    assert defaults.pair_dir("small") == defaults.ASSETS / "small_pair"
    assert defaults.pair_dir("mini") == defaults.ASSETS / "mini_pair"
    assert set(defaults.PAIRS) == {"mini", "small"}


def test_incomplete_installed_pair_falls_back_to_the_checkout(monkeypatch, tmp_path):
    (tmp_path / "specjax_mini_pair" / "target").mkdir(parents=True)  # no drafts, no vocabulary
    _distributions(monkeypatch, {"specjax-mini-pair": tmp_path})
    assert defaults.pair_dir("mini") == defaults.ASSETS / "mini_pair"


def test_error_names_the_install_line(monkeypatch, tmp_path):
    _distributions(monkeypatch, {})
    monkeypatch.setattr(defaults, "ASSETS", tmp_path)  # a wheel install: no pairs beside the package
    with pytest.raises(FileNotFoundError) as e:
        defaults.pair_dir("small")
    message = str(e.value)
    assert "\n" not in message
    assert "pip install specjax-small-pair" in message
    assert "pip install ./specjax/assets/small_pair" in message
    with pytest.raises(FileNotFoundError, match="pip install specjax-mini-pair"):
        defaults.load_default_pair(size="mini")
    with pytest.raises(ValueError, match="size must be one of"):
        defaults.pair_dir("large")
    with pytest.raises(KeyError):
        defaults.PAIRS["large"]


@pytest.mark.parametrize("size", ["mini", "small"])
def test_pair_distribution_build_files(size):
    """Each pair folder builds its own distribution, installing its files as ``specjax_<size>_pair/``; the main
    distribution leaves the pairs out and depends on them through the ``pairs`` extra."""
    folder = REPO / "specjax" / "assets" / f"{size}_pair"
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    dist, package = defaults.PAIR_DISTRIBUTIONS[size]
    assert meta["project"]["name"] == dist and meta["project"]["version"] == "0.2.0"
    assert meta["tool"]["hatch"]["build"]["targets"]["wheel"]["sources"] == {"": package}
    assert (folder / "README.md").exists()
    main = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert f"{dist}>=0.2.0" in main["project"]["optional-dependencies"]["pairs"]
    assert not any("_pair" in p for p in main["tool"]["setuptools"]["package-data"]["specjax"])
    assert f"prune specjax/assets/{size}_pair" in (REPO / "MANIFEST.in").read_text()
