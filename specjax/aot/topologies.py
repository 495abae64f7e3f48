"""TPU chips and named slices, and the abstract devices libtpu gives for them (no TPU on this host).

Sources: Google Cloud's TPU v4 / v5e / v5p system architecture pages (HBM per chip, HBM bandwidth, peak bf16
FLOP/s); axlearn's ``SystemCharacteristics`` and Cloud TPU's slice names; ``jax.experimental.topologies``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re

INSTALL_HINT = "pip install 'specjax[tpu-aot]'"
"""How to install libtpu (the ``tpu-aot`` extra pins ``jax[tpu]`` to the installed JAX's version)."""


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip generation, as the roofline sees it (one JAX device per chip: megacore on v4 / v5p).

    Attributes:
      name: "v4", "v5e", "v5p".
      hbm_bytes: HBM per chip (bytes).
      hbm_bandwidth: HBM bandwidth (bytes / second).
      peak_flops: peak bfloat16 matrix throughput (FLOP / second).
    """

    name: str
    hbm_bytes: int
    hbm_bandwidth: float
    peak_flops: float


GiB = 2**30
CHIPS = {
    "v4": Chip("v4", 32 * GiB, 1.2e12, 275e12),
    "v5e": Chip("v5e", 16 * GiB, 819e9, 197e12),
    "v5p": Chip("v5p", 95 * GiB, 2.76e12, 459e12),
}
"""Google Cloud's published per-chip figures: TPU v4 32 GiB at 1.2 TB/s, 275 TFLOP/s bf16; v5e 16 GiB at
819 GB/s, 197 TFLOP/s; v5p 95 GiB at 2.76 TB/s, 459 TFLOP/s."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """A named TPU slice, as ``jax.experimental.topologies.get_topology_desc`` takes it (axlearn's
    ``SystemCharacteristics``).

    Attributes:
      name: the slice's name (``v4-8``: Cloud TPU's count of TensorCores for v4 / v5p, of chips for v5e).
      topology_name: ``"v4:2x2x1"`` (chips along each axis).
      chip: a key of ``CHIPS``.
      chip_config_name: "megacore" (v4, v5p: one device per chip, its two TensorCores together) or "default".
      chips_per_host_bounds: chips per host along each axis ((2, 2, 1): four chips per host).
      devices: JAX devices in the slice (chips).
      hosts: host processes.
    """

    name: str
    topology_name: str
    chip: str
    chip_config_name: str
    chips_per_host_bounds: tuple[int, int, int]
    devices: int
    hosts: int


TOPOLOGIES = {
    t.name: t
    for t in (
        Topology("v4-1", "v4:1x1x1", "v4", "megacore", (1, 1, 1), 1, 1),  # one v4 chip: the paper's setup
        Topology("v4-8", "v4:2x2x1", "v4", "megacore", (2, 2, 1), 4, 1),
        Topology("v4-16", "v4:2x2x2", "v4", "megacore", (2, 2, 1), 8, 2),
        Topology("v4-32", "v4:2x2x4", "v4", "megacore", (2, 2, 1), 16, 4),
        Topology("v5e-1", "v5e:1x1", "v5e", "default", (1, 1, 1), 1, 1),
        Topology("v5e-4", "v5e:2x2", "v5e", "default", (2, 2, 1), 4, 1),
        Topology("v5e-8", "v5e:2x4", "v5e", "default", (2, 4, 1), 8, 1),
        Topology("v5p-8", "v5p:2x2x1", "v5p", "megacore", (2, 2, 1), 4, 1),
        Topology("v5p-16", "v5p:2x2x2", "v5p", "megacore", (2, 2, 1), 8, 2),
    )
}
"""Named slices (axlearn's and Cloud TPU's names); ``v5litepod-N`` is accepted for ``v5e-N``."""


class LibtpuMissing(RuntimeError):
    """libtpu is not installed: no TPU compiler on this host (the message says how to install it)."""


def require_libtpu() -> None:
    """Raises ``LibtpuMissing`` (with ``INSTALL_HINT``) when the ``libtpu`` package cannot be imported."""
    if importlib.util.find_spec("libtpu") is None:
        raise LibtpuMissing(
            f"compiling for a TPU ahead of time needs libtpu, the TPU compiler, which is not installed: "
            f"{INSTALL_HINT} (about 680 MB; no TPU needed)."
        )


def _topology(name: str) -> Topology:
    key = re.sub(r"^v5litepod-", "v5e-", name)
    if key not in TOPOLOGIES:
        raise ValueError(f"Unknown TPU topology {name!r}; known: {', '.join(TOPOLOGIES)} (v5litepod-N = v5e-N).")
    return TOPOLOGIES[key]


@functools.lru_cache(maxsize=None)
def topology_devices(name: str) -> tuple:
    """The abstract JAX devices (one per chip) of the named slice; none of them exists on this host.

    Raises:
      ValueError: an unknown name. LibtpuMissing: no libtpu.
    """
    topo = _topology(name)
    require_libtpu()
    # libtpu takes /tmp/libtpu_lockfile for the one process that may drive a host's TPU; a compile-only client
    # drives none, so it must not fail (or block others) because another JAX process on the host holds it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    desc = topologies.get_topology_desc(
        topology_name=topo.topology_name,
        platform="tpu",
        chip_config_name=topo.chip_config_name,
        chips_per_host_bounds=topo.chips_per_host_bounds,
        num_slices=1,
    )
    devices = tuple(desc.devices)
    if len(devices) != topo.devices:
        raise RuntimeError(f"{name}: libtpu lists {len(devices)} devices, expected {topo.devices}.")
    return devices
