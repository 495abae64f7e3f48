"""Compiled programs kept on disk (``specjax.decoding.stored``): a second process loads what the first built,
traces nothing, and gets the same bits; bad entries are rebuilt; concurrent writers lose nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decoding import stored

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache root for the test, and no compiled program left in memory."""
    monkeypatch.setenv("SPECJAX_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECJAX_PROGRAM_CACHE", raising=False)
    stored.clear_memory()
    yield tmp_path
    stored.clear_memory()


TRACES = []


def _make_step():
    """A new function object each call (JAX caches traces per function object; a new process has none), the same
    module and name (so the same stored program): tanh(x @ w) * scale, counting its traces in ``TRACES``."""

    def step(x, w, scale):
        TRACES.append(1)
        return jnp.tanh(x @ w) * scale

    return step


def _reference(x, w, scale):
    return np.asarray(jax.jit(lambda x, w, scale: jnp.tanh(x @ w) * scale)(x, w, scale))


def _args(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((4, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((8, 8)), jnp.float32)
    return x, w, jnp.float32(0.5)


def test_a_stored_program_is_loaded_without_tracing_and_gives_the_same_bits(cache):
    x, w, s = _args()
    reference = _reference(x, w, s)
    since = len(stored.events())
    first = stored.StoredJit(_make_step(), name="step", identity="v1")
    TRACES.clear()
    out1 = np.asarray(first(x, w, s))
    assert len(TRACES) == 1
    assert [e.how for e in stored.events(since)] == ["built"]
    assert len(list((cache / "programs").glob("*.jaxexe"))) == 1
    stored.clear_memory()  # as a new process: nothing in memory
    second = stored.StoredJit(_make_step(), name="step", identity="v1")
    TRACES.clear()
    out2 = np.asarray(second(x, w, s))
    assert TRACES == []  # not traced, not lowered, not compiled
    assert [e.how for e in stored.events(since)] == ["built", "loaded"]
    np.testing.assert_array_equal(out1, reference)
    np.testing.assert_array_equal(out2, reference)
    # other values of the same shapes: the same program; another shape: another program
    x2, w2, _ = _args(1)
    np.testing.assert_array_equal(np.asarray(second(x2, w2, s)), _reference(x2, w2, s))
    assert [e.how for e in stored.events(since)] == ["built", "loaded"]
    second(x[:2], w, s)
    assert [e.how for e in stored.events(since)] == ["built", "loaded", "built"]


def test_the_key_tells_identities_dtypes_and_options_apart(cache):
    x, w, s = _args()
    since = len(stored.events())
    stored.StoredJit(_make_step(), name="step", identity="a")(x, w, s)
    stored.StoredJit(_make_step(), name="step", identity="b")(x, w, s)  # another closure state: another program
    stored.StoredJit(_make_step(), name="step", identity="a")(x.astype(jnp.bfloat16), w, s)
    stored.StoredJit(_make_step(), name="step", identity="a", donate_argnums=(0,))(jnp.array(x), w, s)
    assert [e.how for e in stored.events(since)] == ["built"] * 4
    assert len(list((cache / "programs").glob("*.jaxexe"))) == 4


@pytest.mark.parametrize("damage", ["truncated", "garbage", "foreign"])
def test_a_bad_entry_is_rebuilt_never_used(cache, damage):
    x, w, s = _args()
    stored.StoredJit(_make_step(), name="step", identity="v1")(x, w, s)
    stored.StoredJit(_make_step(), name="other", identity="v2")(x, w, s)
    files = sorted((cache / "programs").glob("*.jaxexe"), key=os.path.getmtime)
    path, other = files[0], files[1]
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a program")
    else:  # a whole, valid entry of another key under this key's name
        path.write_bytes(other.read_bytes())
    stored.clear_memory()
    since = len(stored.events())
    TRACES.clear()
    out = stored.StoredJit(_make_step(), name="step", identity="v1")(x, w, s)
    assert TRACES == [1] and [e.how for e in stored.events(since)] == ["built"]
    np.testing.assert_array_equal(np.asarray(out), _reference(x, w, s))
    stored.clear_memory()  # the rebuilt entry was written over the bad one and loads
    stored.StoredJit(_make_step(), name="step", identity="v1")(x, w, s)
    assert [e.how for e in stored.events(since)] == ["built", "loaded"]


def test_an_identity_naming_a_memory_address_stays_in_memory(cache):
    x, w, s = _args()
    since = len(stored.events())
    f = lambda v: v  # noqa: E731
    stored.StoredJit(_make_step(), name="step", identity=repr(f))(x, w, s)
    assert [e.how for e in stored.events(since)] == ["built (memory only)"]
    assert not list((cache / "programs").glob("*.jaxexe")) if (cache / "programs").exists() else True


def test_off_stores_nothing(cache, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE_DIR", "off")
    x, w, s = _args()
    since = len(stored.events())
    out = stored.StoredJit(_make_step(), name="step", identity="v1")(x, w, s)
    assert [e.how for e in stored.events(since)] == ["built (memory only)"]
    np.testing.assert_array_equal(np.asarray(out), _reference(x, w, s))


def test_inside_a_trace_it_is_the_plain_jit(cache):
    x, w, s = _args()
    since = len(stored.events())
    inner = stored.StoredJit(_make_step(), name="step", identity="v1")
    out = jax.jit(lambda x, w: inner(x, w, s) + 1.0)(x, w)
    assert stored.events(since) == []
    np.testing.assert_allclose(np.asarray(out), _reference(x, w, s) + 1.0, rtol=0, atol=0)


_BULK = textwrap.dedent(
    """
    import json, sys, numpy as np, specjax
    from specjax.decoding import stored
    target, draft, tok = specjax.load_default_pair(size="mini", dtype="float32")
    lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8")][:6]
    rows = [tok.encode(l) for l in lines]
    dec = specjax.BulkDecoder(target, draft, batch_size=4, gamma=int(sys.argv[2]), max_decode_length=24, refill=2)
    out = [r.tokens.tolist() for r in dec.generate(rows, temperature=float(sys.argv[3]), rng=3)]
    print(json.dumps({"out": out, "events": [[e.name, e.how] for e in stored.events()]}))
    """
)


def _bulk_process(env, data_dir, gamma, temperature):
    src = data_dir / "wmt" / "newstest2014.en"
    proc = subprocess.run(
        [sys.executable, "-c", _BULK, str(src), str(gamma), str(temperature)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_builds_no_bulk_program_and_decodes_the_same(tmp_path, data_dir):
    """Two processes in turn, one cache: the second loads every slot program (insert, run, collect, the line
    keys) and builds none; its tokens equal the first's (speculative γ 3, sampled: the draft's and the target's
    programs, and the keys)."""
    env = dict(os.environ, SPECJAX_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("SPECJAX_PROGRAM_CACHE", None)
    for gamma, temperature in ((3, 1.0),):
        first = _bulk_process(env, data_dir, gamma, temperature)
        second = _bulk_process(env, data_dir, gamma, temperature)
        assert first["out"] == second["out"]
        built = [name for name, how in first["events"] if how == "built"]
        assert any(n.startswith("slots.run") for n in built) and any(n.startswith("slots.insert") for n in built)
        assert [e for e in second["events"] if e[1] != "loaded"] == []
        assert sorted(n for n, _ in second["events"]) == sorted(n for n, _ in first["events"])


def test_a_users_class_is_keyed_by_its_source_file(cache, tmp_path, monkeypatch):
    """A model class of one's own whose code changes while its ``repr`` does not is a new key (its file's digest
    is part of the key): an edited model is never served the old program."""
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    src = tmp_path / "my_model_for_stored.py"
    body = "import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass Model:\n    width: int = 8\n    # {}\n"
    x, w, s = _args()
    since = len(stored.events())
    for version in ("one", "one", "two"):
        src.write_text(body.format(version))
        sys.modules.pop("my_model_for_stored", None)
        stored._file_digests.clear()  # as a new process, which reads the file again
        stored.clear_memory()
        module = importlib.import_module("my_model_for_stored")
        stored.StoredJit(_make_step(), name="step", identity=("v1", module.Model()))(x, w, s)
    assert [e.how for e in stored.events(since)] == ["built", "loaded", "built"]
