"""Compiled programs kept on disk, so that a second run traces, lowers and compiles nothing (DESIGN.md,
"Start-up"; STYLE.md item 24).

JAX's persistent compilation cache saves XLA's compile but not what comes before it: its key is the lowered
program's hash, so every run still traces and lowers every program (seconds each for the slot loop) and
compiles again what took less than its threshold to compile. Here a program is found **before** tracing, by a
key made of everything that can change it:

- the program's name and identity: the function's module and name plus the ``repr`` of everything it closes over
  (the models' frozen-dataclass configs, γ, slot count, ``max_decode_length``, verification, mesh, rules) and of
  its static arguments, given by the caller;
- the signature of its array arguments: the pytree structure and, per leaf, shape, dtype, weak type and
  sharding;
- ``jax.jit``'s options (donation, shardings, XLA compiler options);
- the environment: jax and jaxlib versions, the backend and its platform version, the devices (kind, count,
  processes), this CPU's model and feature flags, ``XLA_FLAGS``, the jax settings that change lowering, and a
  digest of specjax's own source files (a changed line of the package is a new key).

A hit loads the executable with ``jax.experimental.serialize_executable.deserialize_and_load`` (the compiled
program, as MaxText's ``train_compile.py`` saves one for ``train.py``); a miss lowers and compiles as ``jax.jit``
would (XLA's own cache still applies) and stores the result. A loaded program is the program that would have
been built: results are the same bit for bit (``tests/test_stored.py``).

Entries live in ``<cache root>/programs/`` (``specjax.hardware.cache_dir()``: ``~/.cache/specjax`` or
``$SPECJAX_CACHE_DIR``; nothing is stored when it is "off"). Each file holds its own key and a SHA-256 of its
payload: a truncated, stale or foreign entry fails those checks (or fails to load) and is rebuilt and
overwritten, never used. Writes go to a temporary file in the same folder, then ``os.replace``: two processes
writing the same entry at once each write a whole file and the last one stays (they are the same program). A
``repr`` that names a memory address (``<function f at 0x...>``, e.g. a test's hand-made logits) cannot key a
program across processes: such programs are compiled and kept in memory only. So are the programs of a run of
several JAX processes (an executable spanning processes does not load back in jaxlib 0.10.2).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from specjax import hardware

__all__ = [
    "StoredJit",
    "ProgramEvent",
    "events",
    "listening",
    "program_dir",
    "environment_key",
    "foreign_code",
    "clear_memory",
]

FORMAT = 1
"""The entries' file format; a new one makes every old entry a miss."""

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class ProgramEvent(tuple):
    """``(name, how, seconds)``: a program ``name`` was "loaded" from disk, "built" (traced, lowered, compiled)
    and stored, or "built (memory only)"; ``seconds`` wall seconds it took."""

    __slots__ = ()

    def __new__(cls, name: str, how: str, seconds: float):
        return super().__new__(cls, (name, how, seconds))

    @property
    def name(self) -> str:
        return self[0]

    @property
    def how(self) -> str:
        return self[1]

    @property
    def seconds(self) -> float:
        return self[2]


_events: list[ProgramEvent] = []
_listeners: list[Callable[[str, str], None]] = []
_memory: dict[str, Any] = {}  # key -> jax.stages.Compiled, shared by every StoredJit of the process
_instances: "weakref.WeakSet[StoredJit]" = weakref.WeakSet()
_lock = threading.Lock()


def events(since: int = 0) -> list[ProgramEvent]:
    """The programs this process has loaded or built, in order (``events()[since:]``)."""
    return list(_events[since:])


@contextlib.contextmanager
def listening(callback: Callable[[str, str], None]):
    """Within the block, ``callback(name, what)`` is called when a program starts to be loaded ("loading") or built
    ("building") and when it is done (``ProgramEvent.how``): for a progress line that says what a first run is
    doing. Exceptions of the callback propagate."""
    _listeners.append(callback)
    try:
        yield
    finally:
        _listeners.remove(callback)


def _tell(name: str, what: str) -> None:
    for callback in list(_listeners):
        callback(name, what)


def _record(event: ProgramEvent) -> None:
    _events.append(event)
    _tell(event.name, event.how)


def clear_memory() -> None:
    """Forgets the compiled programs held in memory (the next call loads them from disk or builds them)."""
    with _lock:
        _memory.clear()
        for jitted in list(_instances):
            jitted._local.clear()


def program_dir() -> Path | None:
    """``<cache root>/programs`` (``specjax.hardware.cache_dir()``), or None when the cache is off
    (``SPECJAX_CACHE_DIR=off``, ``specjax --no-cache``) or ``SPECJAX_PROGRAM_CACHE=off``."""
    if os.environ.get("SPECJAX_PROGRAM_CACHE", "").strip().lower() in ("0", "off", "false", "no"):
        return None
    root = hardware.cache_dir()
    return None if root is None else root / "programs"


_code_digest_value: str | None = None


def _code_digest() -> str:
    """SHA-256 (16 hex digits) of every ``.py`` file of the specjax package, path and bytes."""
    global _code_digest_value
    if _code_digest_value is None:
        package = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for path in sorted(package.rglob("*.py")):
            h.update(str(path.relative_to(package)).encode())
            h.update(path.read_bytes())
        _code_digest_value = h.hexdigest()[:16]
    return _code_digest_value


_file_digests: dict[str, str] = {}
_OWN_MODULES = ("specjax", "jax", "jaxlib", "numpy", "builtins", "flax", "ml_dtypes")


def foreign_code(obj, depth: int = 4) -> list[str]:
    """Digests of the source files that define the classes (and functions) found in ``obj`` outside specjax and
    its libraries: a user's own ``DecodingModel`` or draft source, whose behaviour its ``repr`` does not show.
    Walks tuples, lists, dicts and dataclass fields ``depth`` levels deep. A class without a source file gives
    its qualified name only."""
    import dataclasses
    import inspect

    found: set[str] = set()

    def note(thing):
        module = getattr(thing, "__module__", "") or ""
        if module.split(".")[0] in _OWN_MODULES:
            return
        try:
            path = inspect.getsourcefile(thing)
        except (TypeError, OSError):
            path = None
        if path is None:
            found.add(f"{module}.{getattr(thing, '__qualname__', '?')}")
            return
        if path not in _file_digests:
            try:
                _file_digests[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
            except OSError:
                _file_digests[path] = "unreadable"
        found.add(f"{path}:{_file_digests[path]}")

    def walk(x, level):
        if level < 0 or x is None or isinstance(x, (str, bytes, int, float, bool)):
            return
        if isinstance(x, (tuple, list)):
            for y in x:
                walk(y, level - 1)
            return
        if isinstance(x, dict):
            for y in x.values():
                walk(y, level - 1)
            return
        if callable(x) and not isinstance(x, type) and hasattr(x, "__code__"):
            note(x)
            return
        note(type(x))
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name, None), level - 1)

    walk(obj, depth)
    return sorted(found)


def environment_key() -> str:
    """Everything outside a program's own description that changes what it compiles to (the module
    docstring): versions, backend, devices, CPU, XLA flags, lowering settings and specjax's source digest."""
    import jaxlib

    devices = jax.devices()
    info = hardware.cpu_info()
    parts = [
        f"format={FORMAT}",
        f"jax={jax.__version__}",
        f"jaxlib={jaxlib.__version__}",
        f"platform={devices[0].platform}",
        f"platform_version={getattr(devices[0].client, 'platform_version', '')}",
        f"devices={len(devices)}:{sorted({d.device_kind for d in devices})}",
        f"processes={jax.process_count()}:{jax.process_index()}",
        f"cpu={info.model}|{' '.join(sorted(info.flags))}",
        f"xla_flags={os.environ.get('XLA_FLAGS', '')}",
        f"x64={jax.config.jax_enable_x64}",
        f"matmul={jax.config.jax_default_matmul_precision}",
        f"prng={jax.config.jax_default_prng_impl}|{jax.config.jax_threefry_partitionable}",
        f"specjax={_code_digest()}",
    ]
    return "\n".join(parts)


_env_value: str | None = None


def _environment() -> str:
    global _env_value
    if _env_value is None:
        _env_value = environment_key()
    return _env_value


def _sharding_text(sharding) -> str:
    """A sharding's repr with its devices' ids in order (a ``Mesh``'s repr names its axes, not its devices)."""
    if sharding is None:
        return "None"
    mesh = getattr(sharding, "mesh", None)
    devices = getattr(mesh, "devices", None)
    ids = [d.id for d in devices.flat] if devices is not None else sorted(d.id for d in sharding.device_set)
    return f"{sharding!r}@{ids}"


def _leaf_signature(x) -> tuple:
    """A hashable description of one argument leaf: (shape, dtype, weak type, sharding) for arrays, the
    value's type and repr for anything else (a Python scalar is traced as a weak-typed scalar)."""
    if isinstance(x, jax.Array):
        sharding = x.sharding if getattr(x, "committed", True) else None
        return ("a", x.shape, str(x.dtype), bool(getattr(x, "weak_type", False)), sharding)
    if isinstance(x, (np.ndarray, np.generic)):
        return ("n", x.shape, str(x.dtype))
    if isinstance(x, (bool, int, float, complex)):
        return ("p", type(x).__name__)
    if isinstance(x, jax.ShapeDtypeStruct):
        return ("s", x.shape, str(x.dtype), bool(x.weak_type), x.sharding)
    return ("o", type(x).__qualname__, repr(x))


def _leaf_text(x) -> str:
    sig = _leaf_signature(x)
    if sig[0] in ("a", "s"):
        return repr(sig[:-1]) + _sharding_text(sig[-1])
    return repr(sig)


def _in_trace(tree) -> bool:
    """Whether a call with ``tree`` runs inside a JAX trace (a tracer among the arguments, or any trace open)."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree)):
        return True
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover - a JAX without it: tracers alone decide
        return False
    return not trace_state_clean()


class StoredJit:
    """``jax.jit(fn, static_argnums=..., **jit_kwargs)`` whose compiled programs are kept on disk and loaded in the
    next process (the module docstring): called at top level with concrete arrays, it finds the program by its
    key in memory, then on disk, else builds (``lower(...).compile()``) and stores it; called inside a trace
    (a user's ``jax.jit`` / ``shard_map``, tracers among the arguments) it is the plain jit, inlined.

    Args:
      fn: the function (its arguments: arrays, pytrees of arrays, and the static ones).
      name: a short name for progress lines and events ("slots.run", "speculative_sample").
      identity: everything ``fn`` closes over that changes its program: an object whose ``repr`` tells it (frozen
        dataclasses, tuples, ints, strings); static arguments are added per call. The source files of classes
        found in it (and in the static arguments) outside specjax are part of the key (``foreign_code``). A
        ``repr`` naming a memory address (" at 0x") turns the disk off for this function (memory only).
      static_argnums: as ``jax.jit``.
      **jit_kwargs: as ``jax.jit`` (donate_argnums, in_shardings, out_shardings, compiler_options).

    ``__call__`` returns what ``fn`` returns; ``lower`` is ``jax.jit``'s; ``_cache_size`` counts the programs this
    object holds. Raises what ``jax.jit`` raises for the arguments (a failed build is not stored).
    """

    def __init__(
        self, fn: Callable, *, name: str, identity: Any = "", static_argnums: Sequence[int] = (), **jit_kwargs
    ):
        self._fn, self.name = fn, name
        self._static = tuple(static_argnums)
        self._jit_kwargs = jit_kwargs
        self.jitted = jax.jit(fn, static_argnums=self._static, **jit_kwargs)
        options = {k: v for k, v in sorted(jit_kwargs.items())}
        module = getattr(fn, "__module__", "")
        qual = getattr(fn, "__qualname__", getattr(fn, "__name__", type(fn).__name__))
        text = identity if isinstance(identity, str) else repr(identity)
        self._identity = f"{module}.{qual}|{text}|{options!r}|{foreign_code(identity)}"
        self._local: dict = {}  # cheap signature -> Compiled
        _instances.add(self)

    # --- jax.jit's face ------------------------------------------------------------------------------------------
    def lower(self, *args) -> jax.stages.Lowered:
        """``jax.jit(fn).lower(*args)``."""
        return self.jitted.lower(*args)

    def _cache_size(self) -> int:
        return len(self._local) + self.jitted._cache_size()

    def __getattr__(self, name):  # the rest of jax.jit's face (trace, eval_shape, ...): the plain jit's
        if name.startswith("__") or name in ("jitted", "_local", "_static", "_identity"):
            raise AttributeError(name)
        return getattr(self.jitted, name)

    def __call__(self, *args):
        if _in_trace(args):
            return self.jitted(*args)
        compiled = self.compiled(*args)
        dynamic = [a for i, a in enumerate(args) if i not in self._static]
        return compiled(*dynamic)

    # --- the store ---------------------------------------------------------------------------------------------
    def compiled(self, *args) -> jax.stages.Compiled:
        """The compiled program for ``args`` (loaded, or built and stored)."""
        dynamic = [a for i, a in enumerate(args) if i not in self._static]
        leaves, treedef = jax.tree_util.tree_flatten(dynamic)
        static = tuple(args[i] for i in self._static if i < len(args))
        try:
            local_key = (treedef, tuple(_leaf_signature(x) for x in leaves), static)
            hash(local_key)
        except TypeError:
            local_key = None
        if local_key is not None and local_key in self._local:
            return self._local[local_key]
        key, storable = self._key(treedef, leaves, static)
        with _lock:
            compiled = _memory.get(key)
        if compiled is None:
            compiled = self._load_or_build(key, storable, args)
            with _lock:
                _memory[key] = compiled
        if local_key is not None:
            self._local[local_key] = compiled
        return compiled

    def _key(self, treedef, leaves, static) -> tuple[str, bool]:
        text = "\n".join(
            [
                self._identity,
                f"static={static!r}|{foreign_code(static)}",
                f"tree={treedef}",
                *(_leaf_text(x) for x in leaves),
                _environment(),
            ]
        )
        storable = _ADDRESS.search(text) is None
        return hashlib.sha256(text.encode()).hexdigest(), storable

    def _load_or_build(self, key: str, storable: bool, args) -> jax.stages.Compiled:
        # Several processes (a slice, or --processes): an executable spanning processes does not load back
        # (jaxlib 0.10.2 aborts the process in DeserializeLoadedExecutable), so each process keeps its programs in
        # memory only.
        folder = program_dir() if storable and jax.process_count() == 1 else None
        path = folder / f"{key}.jaxexe" if folder is not None else None
        if path is not None and path.is_file():
            t0 = time.perf_counter()
            _tell(self.name, "loading")
            compiled = _read(path, key)
            if compiled is not None:
                _record(ProgramEvent(self.name, "loaded", time.perf_counter() - t0))
                return compiled
        t0 = time.perf_counter()
        _tell(self.name, "building")
        lowered = self.jitted.lower(*args)
        if path is None:
            compiled = lowered.compile()
        else:
            compiled = _compile_fresh(lowered)
            if compiled is None:  # JAX's persistent cache could not be stepped around: keep it in memory only
                compiled, path = lowered.compile(), None
        how = "built (memory only)"
        if path is not None and _write(path, key, compiled):
            how = "built"
        _record(ProgramEvent(self.name, how, time.perf_counter() - t0))
        return compiled


def _compile_fresh(lowered):
    """``lowered.compile()`` by XLA itself, never loaded from JAX's persistent compilation cache; None when that
    cannot be ensured.

    An executable that XLA:CPU loaded from a serialized form serializes again without some of its functions
    (jaxlib 0.10.2: the copy loads, then fails with "NOT_FOUND: Function ... not found" when run), so what is
    stored here must come from a compile. JAX's cache is stepped around for this one compile (its "in use" flag,
    under JAX's own lock); the fresh executable is what JAX's cache would have stored too.
    """
    try:
        from jax._src import compilation_cache as cc
        from jax._src import xla_bridge

        cc.is_cache_used(xla_bridge.get_backend())  # decided once per process: decide it now
        mutex = cc._cache_initialized_mutex
        if not cc._cache_used:
            return lowered.compile()
    except (ImportError, AttributeError):
        return None
    with _lock:
        with mutex:
            cc._cache_used = False
        try:
            return lowered.compile()
        finally:
            with mutex:
                cc._cache_used = True


def _read(path: Path, key: str):
    """The executable stored at ``path`` for ``key``, or None (missing, truncated, foreign or unloadable)."""
    from jax.experimental import serialize_executable

    try:
        with open(path, "rb") as f:
            entry = pickle.load(f)
        if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
            return None
        payload = entry["payload"]
        if hashlib.sha256(payload).hexdigest() != entry.get("sha256"):
            return None
        return serialize_executable.deserialize_and_load(payload, entry["in_tree"], entry["out_tree"])
    except Exception:  # a bad entry is a miss: it is rebuilt and overwritten
        return None


def _write(path: Path, key: str, compiled) -> bool:
    """Stores ``compiled`` at ``path`` (temporary file, then ``os.replace``); False when it cannot (a read-only
    cache, a backend that cannot serialize)."""
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        entry = dict(
            format=FORMAT,
            key=key,
            sha256=hashlib.sha256(payload).hexdigest(),
            payload=payload,
            in_tree=in_tree,
            out_tree=out_tree,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return True
    except Exception:
        return False
