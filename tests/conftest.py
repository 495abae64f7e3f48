"""Shared test setup: the project's data directory and small helpers.

The data (t5x fixtures, T5's SentencePiece model) lives outside the repository in ``../shared/data``;
tests that need it fail -- not skip -- when it is missing, so CI cannot pass silently without it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

# One persistent XLA compilation cache for the whole run, shared by both pytest-xdist workers and by the
# subprocesses tests start (tests/_parallel_check.py): the same program (the same model, shapes and loop) is
# compiled once, and a module whose compiled programs were dropped (``_free_compiled_programs``) or the other
# worker loads it from disk instead of compiling it again. The controller process sets the variables before
# the workers start, so they inherit the same fresh directory; a user may point JAX_COMPILATION_CACHE_DIR at
# a directory of their own to keep the cache between runs. Results do not depend on it (the cache key is the
# program's HLO, the compile options and the jax/XLA versions).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="specjax-tests-xla-cache-")
    _OWN_CACHE_DIR = os.environ["JAX_COMPILATION_CACHE_DIR"]  # this process made it: it removes it at the end
else:
    _OWN_CACHE_DIR = None
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
# The compiled programs specjax keeps (specjax.decoding.stored) and γ auto's measured costs: one directory for the
# run, shared the same way (a test that needs a cache of its own sets SPECJAX_CACHE_DIR itself).
if "SPECJAX_CACHE_DIR" not in os.environ:
    os.environ["SPECJAX_CACHE_DIR"] = os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], "specjax")

import jax  # noqa: E402  (after the cache variables, which jax reads at import)
import pytest

from specjax.cli._common import quiet_libtpu  # noqa: E402

# No libtpu start-up lines on a host without a TPU (libtpu loads when JAX first looks for backends, after this);
# set in the controller, inherited by the xdist workers and the subprocesses tests start.
quiet_libtpu()

jax.config.update("jax_enable_x64", False)

DATA = (Path(__file__).parents[1] / ".." / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``../shared/data`` (resolved). Fails the test with instructions when it is missing."""
    if not DATA.is_dir():
        pytest.fail(
            f"Test data directory {DATA} is missing. It holds the t5x fixtures and T5's spiece.model "
            "(see shared/data/SOURCES.md); check it out beside the repository as ../shared/data."
        )
    return DATA


@pytest.fixture(scope="session")
def fixtures_dir(data_dir) -> Path:
    """``../shared/data/fixtures``: t5x checkpoints and reference outputs (README.md there)."""
    path = data_dir / "fixtures"
    if not (path / "t5x" / "params_target.npz").is_file():
        pytest.fail(f"{path} lacks t5x/params_target.npz; the shared data checkout is incomplete.")
    return path


@pytest.fixture(scope="session")
def spiece_model(data_dir) -> Path:
    """T5's SentencePiece model, ``../shared/data/tokenizer/t5/spiece.model``."""
    path = data_dir / "tokenizer" / "t5" / "spiece.model"
    if not path.is_file():
        pytest.fail(f"{path} is missing; the shared data checkout is incomplete.")
    return path


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs():
    """Drops JAX's compiled programs after each test module.

    A long single pytest process that had compiled several hundred XLA programs was seen to crash with a
    segmentation fault inside XLA:CPU's compiler (``backend_compile_and_load``; twice, at different tests,
    jax 0.10.2). The suite therefore runs in two worker processes (``-n 2 --dist loadfile`` in
    pyproject.toml, pytest-xdist: a worker that crashes fails its test and is replaced, instead of ending the
    run), and each module starts with empty compilation caches.
    """
    yield
    jax.clear_caches()
    from specjax.decoding import stored

    stored.clear_memory()  # the programs loaded or built here: the next module loads them from disk


# The order in which the two pytest-xdist workers take the test files: ``--dist loadfile`` hands out whole files (a
# module's fixtures are built once), in collection order as ``--no-loadscope-reorder`` (pyproject.toml) keeps it. The
# longest files go first, so the run does not end with one worker idle beside the other's long file (longest
# processing time first): the files that load the shipped pairs, run notebooks, train or start subprocesses, roughly by
# their time alone on a 2-core CPU; reorder them when the ``--durations=15`` report at the end of a run says otherwise.
# Files not named here follow in collection order; tests/test_seqio.py comes last of all (below).
LONGEST_FIRST = (
    "test_default_pair.py",
    "test_processes.py",
    "test_notebook.py",
    "test_train.py",
    "test_quantize.py",
    "test_window_invariance.py",
    "test_multidraft.py",
    "test_decoding.py",
    "test_bench.py",
    "test_aot.py",
    "test_families.py",
    "test_parallel.py",
    "test_bulk_mesh.py",
    "test_generate_cli.py",
    "test_cli_robustness.py",
    "test_auto.py",
    "test_verifiers_and_drafts.py",
    "test_stored.py",
    "test_gcs.py",
)


def _file_rank(item) -> tuple[int, int]:
    """(after everything else?, rank): test_seqio.py last, then the files of LONGEST_FIRST in that order."""
    name = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
    if name == "test_seqio.py":
        return (1, 0)
    return (0, LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST))


def pytest_collection_modifyitems(session, config, items):
    """Orders the test files: LONGEST_FIRST's first, then the rest, and the tests that import TensorFlow
    (tests/test_seqio.py, the ``seqio`` extra) last.

    TensorFlow brings its own LLVM and protobuf; once it is loaded, a later XLA compile in the same process
    was seen to crash with a segmentation fault (in ``backend_compile_and_load``, from tests/test_train.py).
    Every other test therefore runs before TensorFlow is imported: in one process, and under xdist, where each
    worker collects in this order and ``--no-loadscope-reorder`` keeps it (xdist's default reorders files by their
    number of tests, which put test_seqio.py in the middle of a worker's run).
    """
    items.sort(key=_file_rank)  # stable: the tests of a file keep their order


def pytest_collection_finish(session):
    """No "no tests collected" run: an empty collection is an error (CI must really test something)."""
    if not session.items and not session.config.option.collectonly:
        raise pytest.UsageError("no tests collected; run `python -m pytest -q tests` from the repository root.")


def pytest_unconfigure(config):
    """Removes the run's compilation cache directory (in the process that made it: the controller)."""
    if _OWN_CACHE_DIR is not None:
        shutil.rmtree(_OWN_CACHE_DIR, ignore_errors=True)
