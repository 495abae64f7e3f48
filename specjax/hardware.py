"""The machine a decode runs on: its CPU's features, the dtype path they call for, and a cache of measured costs.

Three things live here, all on the host, above the decode loops (DESIGN.md, "Platforms and policy"):

- ``cpu_info()``: the CPU model and feature flags (``/proc/cpuinfo`` on Linux; ``platform.processor()``
  elsewhere, with no flags).
- ``auto_dtypes(pair_preference, platform)``: the compute dtypes "auto" means for a (target, draft) pair. A
  bfloat16 model computes in bfloat16 on a CPU only where the CPU has native bfloat16 dot kernels
  (``avx512_bf16``: AVX512-BF16, Zen 4 / Cooper Lake and later; ``amx_bf16``: Intel AMX, Sapphire Rapids and
  later); without them XLA:CPU emulates bfloat16 dots by converting to float32 on every call and the model is
  upcast to float32 once at load instead (AVX2-only Zen 3: the bfloat16 target alone ran 0.70x the float32
  target alone). On TPU and GPU bfloat16 stays bfloat16.
- ``CostCache``: measured decode costs (seconds) per machine, JAX version, model and shape, kept as JSON in
  ``$SPECJAX_CACHE_DIR/costs.json`` (default ``~/.cache/specjax/costs.json``), so each shape is measured once
  per machine (``specjax.Decoder`` reads and writes it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from pathlib import Path

__all__ = [
    "BF16_DOT_FLAGS",
    "CpuInfo",
    "cpu_info",
    "native_bf16_dots",
    "auto_dtypes",
    "resolve_dtypes",
    "machine_identity",
    "cache_dir",
    "CostCache",
]

BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags naming native bfloat16 dot instructions (``VDPBF16PS``; AMX ``TDPBF16PS``)."""
_SHOWN_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    """The host CPU as the dtype choice and the cost cache see it.

    Attributes:
      model: the CPU's model name (``/proc/cpuinfo`` "model name"), e.g. "AMD EPYC".
      flags: its feature flags (lower case), empty where they cannot be read.
      cores: logical CPUs visible to this process (``os.sched_getaffinity`` where available).
    """

    model: str
    flags: frozenset[str]
    cores: int

    @property
    def shown_flags(self) -> list[str]:
        """The flags that matter for the decode's dot kernels, in a fixed order (for headers and logs)."""
        return [f for f in _SHOWN_FLAGS if f in self.flags]

    def describe(self) -> str:
        """One line: model, cores and the dot-relevant flags, e.g. "AMD EPYC, 2 cores, avx2 avx512f avx512_bf16"."""
        flags = " ".join(self.shown_flags) or "no AVX flags found"
        return f"{self.model}, {self.cores} cores, {flags}"


def _read_cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine() or "unknown CPU", frozenset()
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:  # x86 "flags", ARM "Features"
            flags = frozenset(value.lower().split())
    return model or platform.processor() or platform.machine() or "unknown CPU", flags


def cpu_info() -> CpuInfo:
    """The host CPU (model, flags, cores); read from ``/proc/cpuinfo`` each call (cheap: a few kB).

    Tests replace it with ``monkeypatch.setattr(specjax.hardware, "cpu_info", ...)``: every choice here calls
    it through the module.
    """
    model, flags = _read_cpuinfo()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return CpuInfo(model, flags, cores)


def native_bf16_dots(info: CpuInfo | None = None) -> bool:
    """True when the CPU has native bfloat16 dot instructions (any of ``BF16_DOT_FLAGS``)."""
    info = cpu_info() if info is None else info
    return any(f in info.flags for f in BF16_DOT_FLAGS)


def _platform(platform_name: str | None) -> str:
    if platform_name is not None:
        return platform_name
    import jax

    return jax.devices()[0].platform


def auto_dtypes(preferred: tuple[str, str] = ("bfloat16", "float32"), platform_name: str | None = None) -> tuple:
    """The (target, draft) compute dtypes "auto" stands for, and why.

    Args:
      preferred: the pair's fastest (target, draft) dtypes on a CPU with native bfloat16 dots (the shipped
        small pair: bfloat16 target, float32 draft; the mini pair: float32 for both, its decoder fits the
        L3 cache). Only a "bfloat16" entry is ever changed.
      platform_name: "cpu", "gpu", "tpu"; None: the first JAX device's platform.
    Returns:
      ``((target_dtype, draft_dtype), reason)``: on TPU/GPU bfloat16 for both (the checkpoints' own dtype);
      on a CPU with ``avx512_bf16`` / ``amx_bf16`` the ``preferred`` pair; on any other CPU float32 for both
      (a bfloat16 model upcast once at load). ``reason`` is one line naming the CPU and its flags.
    """
    plat = _platform(platform_name)
    if plat != "cpu":
        return ("bfloat16", "bfloat16"), f"{plat}: bfloat16 kept (native on the accelerator)"
    info = cpu_info()
    if native_bf16_dots(info):
        found = [f for f in BF16_DOT_FLAGS if f in info.flags]
        return tuple(preferred), (
            f"CPU {info.describe()}: native bfloat16 dots ({', '.join(found)}): target {preferred[0]}, "
            f"draft {preferred[1]}"
        )
    upcast = tuple("float32" if d == "bfloat16" else d for d in preferred)
    return upcast, (
        f"CPU {info.describe()}: no native bfloat16 dots (no avx512_bf16 / amx_bf16), so bfloat16 weights are "
        f"upcast to float32 once at load: target {upcast[0]}, draft {upcast[1]}"
    )


def resolve_dtypes(dtype, draft_dtype, preferred=("bfloat16", "float32"), platform_name=None) -> tuple:
    """``(target_dtype, draft_dtype, reason)`` with every "auto" (or None draft: "follow the target") resolved.

    An explicit dtype always wins; ``draft_dtype=None`` means the target's dtype when the target's was explicit
    and the "auto" draft dtype when it was "auto". "int8" (weight-only int8, ``specjax.quantize``) is returned as
    it is; its compute dtype is the "auto" one of its role (``auto_dtypes``).

    Raises:
      ValueError: a dtype that is not "auto", "float32", "bfloat16", "float16" or "int8".
    """
    allowed = ("auto", "float32", "bfloat16", "float16", "int8")
    for name, d in (("dtype", dtype), ("draft_dtype", draft_dtype)):
        if d is not None and d not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {d!r} ('auto': the fastest path for this machine).")
    (auto_target, auto_draft), why = auto_dtypes(preferred, platform_name)
    target = auto_target if dtype == "auto" else dtype
    if draft_dtype is None:
        draft = auto_draft if dtype == "auto" else dtype
    else:
        draft = auto_draft if draft_dtype == "auto" else draft_dtype
    reason = why if "auto" in (dtype, draft_dtype) else "explicit dtypes"
    return target, draft, reason


def machine_identity() -> dict:
    """What a measured cost depends on besides the model and shape: the CPU (model + flags + cores) or the
    accelerator's device kind, and the JAX/jaxlib versions. A plain JSON-able dict."""
    import jax

    device = jax.devices()[0]
    ident = {"platform": device.platform, "jax": jax.__version__}
    try:
        import jaxlib

        ident["jaxlib"] = jaxlib.__version__
    except (ImportError, AttributeError):  # pragma: no cover
        pass
    if device.platform == "cpu":
        info = cpu_info()
        ident["cpu"] = info.model
        ident["cpu_flags"] = hashlib.sha1(" ".join(sorted(info.flags)).encode()).hexdigest()[:12]
        ident["cores"] = info.cores
    else:
        ident["device_kind"] = device.device_kind
        ident["device_count"] = jax.device_count()
    return ident


def cache_dir() -> Path | None:
    """``$SPECJAX_CACHE_DIR`` if set, else ``~/.cache/specjax``; None when ``SPECJAX_CACHE_DIR`` is "off" (or
    empty, or "none"): nothing is kept between runs (``specjax --no-cache``)."""
    env = os.environ.get("SPECJAX_CACHE_DIR")
    if env is not None and env.strip().lower() in ("", "off", "none"):
        return None
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specjax"


class CostCache:
    """Measured decode costs on disk: one JSON object ``{key: costs}``, the key a digest of the machine's identity
    and whatever the caller adds (model digests, batch, lengths).

    Reads tolerate a missing or corrupt file (treated as empty); writes go to a temporary file then
    ``os.replace`` (atomic on POSIX), so two processes never leave half a file. Failing writes (a read-only home)
    are ignored: the costs are then measured again next time.

    Args:
      path: the JSON file; None: ``cache_dir() / "costs.json"`` (kept in memory only, for this object's life, when
        ``cache_dir()`` is None).
    """

    def __init__(self, path: str | os.PathLike | None = None):
        root = cache_dir() if path is None else None
        self.path = Path(path) if path is not None else (root / "costs.json" if root is not None else None)
        self._memory: dict = {}

    @staticmethod
    def key(**parts) -> str:
        """A stable key for ``machine_identity()`` plus ``parts`` (JSON-able values): a 20-hex-digit digest."""
        blob = json.dumps({"machine": machine_identity(), **parts}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def _read(self) -> dict:
        if self.path is None:
            return dict(self._memory)
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> dict | None:
        """The costs stored under ``key`` (a dict), or None."""
        value = self._read().get(key)
        return value if isinstance(value, dict) else None

    def put(self, key: str, costs: dict) -> None:
        """Stores ``costs`` (a JSON-able dict) under ``key``, keeping every other entry."""
        data = self._read()
        data[key] = costs
        if self.path is None:
            self._memory = data
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass
