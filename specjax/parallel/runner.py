"""Processes and the command line: ``maybe_initialize_distributed`` (``jax.distributed.initialize`` when this
process is one of several) and the decode runner the ``--data-parallel`` / ``--mesh`` flags ask for
(``decode_fn_from_flags``, ``ParallelRunner``)."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax
import numpy as np
from jax.sharding import Mesh

from specjax.decoding.result import DecodeResult
from specjax.decoding.sharding import (
    DATA,
    STANDARD_RULES,
    Rules,
)
from specjax.models import t5
from specjax.parallel.mesh import host_loading, make_mesh, replicate_params, shard_params
from specjax.parallel.programs import data_parallel_sample, model_parallel_sample

# ----------------------------------------------------------------------------------------------------------
# Processes and the command line


def maybe_initialize_distributed() -> bool:
    """Calls ``jax.distributed.initialize()`` when this process is one of several (a TPU pod slice, SLURM,
    Open MPI, Kubernetes); a no-op on one process (a laptop, a single-host TPU VM, CPU tests).

    Detection: ``SPECJAX_DISTRIBUTED=1`` / ``0`` forces it on / off; ``JAX_COORDINATOR_ADDRESS`` set means
    on (with ``SPECJAX_NUM_PROCESSES``, ``SPECJAX_PROCESS_ID`` and ``SPECJAX_HEARTBEAT_SECONDS`` passed to
    ``jax.distributed.initialize`` as ``num_processes``, ``process_id``, ``heartbeat_timeout_seconds``: what
    ``specjax generate --processes N`` sets, ``specjax.launch``); otherwise JAX's own cluster detection (the
    environments ``jax.distributed.initialize()`` reads). Must run before anything touches a device (call it
    first thing in the program).

    Returns:
      True if the distributed runtime is (now) initialized, False if this is a single process.
    Raises:
      RuntimeError: (from JAX) a device was used before the call on a multi-process run.
    """
    if jax.distributed.is_initialized():
        return True
    forced = os.environ.get("SPECJAX_DISTRIBUTED")
    if forced == "0":
        return False
    if forced == "1" or os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize(**_distributed_arguments())
        return True
    try:
        from jax._src import clusters  # JAX's detection of the environments initialize() understands

        detected = any(
            not env.opt_in_only_method and env.is_env_present() for env in clusters.ClusterEnv._cluster_types
        )
    except Exception:  # private API moved, or a metadata query failed: treat as one process
        detected = False
    if detected:
        jax.distributed.initialize()
    return detected


def _distributed_arguments() -> dict:
    """``jax.distributed.initialize`` keyword arguments from ``SPECJAX_NUM_PROCESSES``, ``SPECJAX_PROCESS_ID``
    and ``SPECJAX_HEARTBEAT_SECONDS`` (each only where set; an int)."""
    out = {}
    for env, name in (
        ("SPECJAX_NUM_PROCESSES", "num_processes"),
        ("SPECJAX_PROCESS_ID", "process_id"),
        ("SPECJAX_HEARTBEAT_SECONDS", "heartbeat_timeout_seconds"),
    ):
        value = os.environ.get(env)
        if value:
            try:
                out[name] = int(value)
            except ValueError:
                raise ValueError(f"{env}={value!r} is not an int.") from None
    return out


@dataclasses.dataclass(frozen=True)
class ParallelRunner:
    """How to run a decode, as chosen by the CLI flags (``decode_fn_from_flags``).

    Call it as ``runner(fn, *args, **kwargs)`` with ``fn`` = ``temperature_sample`` or ``speculative_sample``
    and ``fn``'s arguments: ``fn(*args, **kwargs)`` on one device, ``data_parallel_sample`` or
    ``model_parallel_sample`` on ``mesh``. Returns ``fn``'s ``DecodeResult``.

    Attributes:
      mode: "single", "data" (``--data-parallel``) or "mesh" (``--mesh``).
      mesh: the ``("data", "model")`` mesh in "mesh" mode, else None.
      rules: the logical-to-mesh rules ("mesh" mode).
    """

    mode: str = "single"
    mesh: Mesh | None = None
    rules: Rules = STANDARD_RULES

    def __call__(self, fn: Callable, *args, **kwargs) -> DecodeResult:
        if self.mode == "data":
            return data_parallel_sample(fn, *args, **kwargs)
        if self.mode == "mesh":
            return model_parallel_sample(fn, *args, mesh=self.mesh, rules=self.rules, **kwargs)
        return fn(*args, **kwargs)

    def loading(self):
        """A context for loading checkpoints: in "mesh" mode arrays are created in host memory (the CPU
        backend) rather than on the first accelerator, which a target larger than one device would overflow;
        ``place`` then sends each device its slices. Elsewhere (or without a CPU backend) a no-op."""
        import contextlib

        return host_loading() if self.mode == "mesh" else contextlib.nullcontext()

    def place(self, target: t5.T5Model, draft: t5.T5Model | None = None):
        """Puts the models where the mode wants them once, so calls do not copy them: "mesh": target split
        by ``rules`` (``shard_params``), draft replicated; "data": both replicated on every device; "single":
        unchanged. Returns ``(target, draft)``."""
        if self.mode == "single":
            return target, draft
        mesh = self.mesh if self.mode == "mesh" else Mesh(np.asarray(jax.devices()), (DATA,))
        target = shard_params(target, mesh, self.rules) if self.mode == "mesh" else replicate_params(target, mesh)
        return target, (None if draft is None else replicate_params(draft, mesh))


def decode_fn_from_flags(
    data_parallel: bool = False, mesh: str | None = None, rules: Rules = STANDARD_RULES
) -> ParallelRunner:
    """The decode runner the CLI flags ``--data-parallel`` and ``--mesh data:N,model:M`` ask for.

    Call it (and ``maybe_initialize_distributed()`` before it) before anything touches a device. Returns a
    ``ParallelRunner``: ``runner(fn, *args, **kwargs)`` runs ``fn`` (``temperature_sample`` or
    ``speculative_sample``) plainly with neither flag, with ``data_parallel_sample`` with ``data_parallel``,
    with ``model_parallel_sample`` on ``make_mesh(mesh)`` with ``mesh``.

    Raises:
      ValueError: both flags given, or a malformed mesh / one whose sizes do not multiply to the device
        count (raised here, before any model is loaded onto devices).
    """
    if data_parallel and mesh:
        raise ValueError(
            "--data-parallel and --mesh are alternatives: --data-parallel splits the batch over "
            "all devices with replicated weights; --mesh data:N,model:M also splits the weights "
            "(use --mesh data:<devices>,model:1 for pure data parallelism on a mesh)."
        )
    if data_parallel:
        return ParallelRunner("data")
    if mesh:
        return ParallelRunner("mesh", make_mesh(mesh), tuple(rules))
    return ParallelRunner()
