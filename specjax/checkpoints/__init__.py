"""Checkpoints -> ``T5Model``: T5X (legacy msgpack + TensorStore/zarr, Orbax/OCDBT) and Hugging Face.

``load_checkpoint`` detects the format; ``save_checkpoint`` writes Hugging Face (``config.json`` +
``model.safetensors``) or T5X legacy (one inline msgpack file). Every reader goes through the rule table of
``specjax.checkpoints.rules``, which refuses unknown keys and checks every shape before any transpose.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from specjax.checkpoints import hf, rules, t5x
from specjax.checkpoints.rules import CheckpointError, unflatten
from specjax.hardware import auto_dtypes
from specjax.models.t5 import T5Model
from specjax.quantize import quantize

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint", "detect_format"]

_DTYPES = ("float32", "bfloat16", "float16")  # float dtypes; "int8" (load_checkpoint) quantizes at load


def detect_format(path: str) -> tuple[str, str]:
    """Which checkpoint is at ``path``.

    Returns:
      ``("hf", path)``, ``("t5x", path)``; for a T5X model directory holding ``checkpoint_<N>``
      subdirectories, the one with the highest N.
    Raises:
      FileNotFoundError: the path does not exist.
      CheckpointError: nothing recognisable there (the message lists what was looked for and found).
    """
    path = os.fspath(path)
    if t5x.is_gcs(path):
        if t5x.find_t5x(path) is None:
            t5x.check_gcs_path(path)  # a missing bucket reads like a missing object: say which
            raise CheckpointError(
                f"No T5X checkpoint at {path!r}: no 'checkpoint' msgpack file or Orbax 'state/_METADATA' object "
                f"there (gs:// paths are read as T5X only; gsutil ls {path.rstrip('/')}/ lists what is there)."
            )
        return "t5x", path
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"No checkpoint at {path!r}: the path does not exist. Check the spelling, or download the checkpoint first."
        )
    if hf.find_hf(path) is not None:
        return "hf", path
    if os.path.isdir(path):
        if t5x.find_t5x(path) is not None:
            return "t5x", path
        steps = [
            (int(m.group(1)), e)
            for e in os.listdir(path)
            for m in [re.fullmatch(r"checkpoint_(\d+)", e)]
            if m and os.path.isdir(os.path.join(path, e))
        ]
        if steps:
            return "t5x", os.path.join(path, max(steps)[1])
        entries = sorted(os.listdir(path))
        shown = ", ".join(entries[:10]) + (" …" if len(entries) > 10 else "") if entries else "nothing"
        raise CheckpointError(
            f"No recognisable checkpoint in {path!r} (it holds: {shown}). specjax reads a Hugging Face "
            "directory (config.json + model.safetensors or pytorch_model.bin), a T5X checkpoint_N directory "
            "(a 'checkpoint' msgpack file, or Orbax 'state/_METADATA'), or a T5X msgpack file."
        )
    if os.path.basename(path) == "config.json":
        raise CheckpointError(f"{path!r} is a config, not weights: pass its directory.")
    return "t5x", path  # a bare file: the T5X msgpack (its reader reports a clear error otherwise)


def _target_dtype(flat: dict[str, np.ndarray], dtype: Any) -> str:
    if dtype is not None:
        name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
        if name not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES + ('int8',)}, got {dtype!r}.")
        return name
    stored = {np.asarray(v).dtype.name for v in flat.values()}
    return stored.pop() if len(stored) == 1 and next(iter(stored)) in _DTYPES else "float32"


def load_checkpoint(
    path: str | os.PathLike, *, dtype: Any = "float32", compute_dtype: str | None = None, **config_overrides
) -> T5Model:
    """Loads a T5 checkpoint of any supported format into a ``T5Model``.

    Families: T5 1.0 / 1.1 / Flan-T5, mT5, umT5, UL2 / Flan-UL2, ByT5, MADLAD-400 (Hugging Face ``model_type``
    t5, mt5 or umt5; ``feed_forward_proj`` relu, gated-gelu or gated-silu; see docs/models.md).

    Formats (detected, see ``detect_format``): Hugging Face directory (``config.json`` +
    ``model.safetensors`` [sharded or not] or ``pytorch_model.bin``, the latter needing PyTorch); T5X legacy
    (``checkpoint_N/`` with a ``checkpoint`` msgpack, arrays inline or TensorStore/zarr; or the msgpack
    file itself); T5X Orbax (``checkpoint_N/`` with ``state/_METADATA`` and an OCDBT store); a T5X model
    directory (the highest ``checkpoint_N`` in it). For T5X the config is inferred from the shapes
    (``specjax.checkpoints.t5x.infer_config``), and scanned trees (layers stacked on axis 1) are unstacked
    (``unscan_t5x``); the MLP's activation is not in a T5X checkpoint (pass ``mlp_activations=("silu", "linear")``
    for UL2).

    Args:
      path: local path, or ``gs://`` for T5X checkpoints (TensorStore's gcs driver).
      dtype: "float32" (the default everywhere in specjax: ``load_default_pair``, ``specjax generate``,
        ``translate``, ``bench``, so the same weights give the same greedy text wherever they are loaded),
        "bfloat16" or "float16" (parameters and compute; bfloat16 is what a TPU runs T5-XXL in), or None to
        keep the stored dtype (float32 when the checkpoint mixes dtypes); or "int8": weight-only int8 with Qwix
        (``specjax.quantize``: every dense kernel as int8 values and a float32 scale per output column, quantized
        from the checkpoint's values at load), computing in ``compute_dtype``. The result is then a
        ``specjax.quantize.QuantizedT5Model`` (``weight_bytes`` tells its memory); it is another model than the
        float one: speculative output equals *its* output (a quantized draft changes nothing but α).
      compute_dtype: with ``dtype="int8"`` only: "float32", "bfloat16" or "float16"; None: what "auto" picks for
        a target on this machine (``specjax.hardware.auto_dtypes``: bfloat16 on TPU / GPU and on CPUs with native
        bfloat16 dots, else float32).
      **config_overrides: ``T5Config`` fields to set, e.g. ``relative_attention_max_distance`` or ``name``
        (T5X checkpoints do not store them).
    Returns:
      ``T5Model`` whose params are a nested dict of jax arrays with t5x names.
    Raises:
      FileNotFoundError: the path does not exist.
      ValueError: an unknown ``dtype`` or ``compute_dtype``, or ``compute_dtype`` without ``dtype="int8"``.
      CheckpointError (a ValueError): unrecognised, truncated or corrupt checkpoints; keys or shapes that do
        not match the config.
    """
    import jax

    if dtype == "int8":
        if compute_dtype is None:
            compute_dtype = auto_dtypes(("bfloat16", "bfloat16"))[0][0]
        return quantize(load_checkpoint(path, dtype="float32", **config_overrides), "int8", compute_dtype)
    if compute_dtype is not None:
        raise ValueError(f"compute_dtype is for dtype='int8' (the int8 model's compute dtype), got dtype={dtype!r}.")
    kind, where = detect_format(path)
    if kind == "hf":
        config, flat = hf.load_hf(where)
        if config_overrides:
            config = config.replace(**config_overrides)
    else:
        config, flat = t5x.load_t5x(where, **config_overrides)
    target = _target_dtype(flat, dtype)
    np_dtype = hf._np_dtype(target)
    flat = {k: (v if v.dtype == np_dtype else v.astype(np_dtype)) for k, v in flat.items()}
    config = config.replace(dtype=target, param_dtype=target)
    params = jax.tree_util.tree_map(jax.numpy.asarray, unflatten(flat))
    return T5Model(config, params)


def save_checkpoint(model: T5Model, path: str | os.PathLike, format: str = "hf", *, step: int = 0) -> str:
    """Writes ``model`` as a checkpoint.

    Args:
      model: the ``T5Model``.
      path: output directory (created).
      format: "hf" -- ``config.json`` + ``model.safetensors``, loadable by
        ``transformers.T5ForConditionalGeneration.from_pretrained``; "t5x" -- T5X legacy ``path/checkpoint``
        msgpack with every array inline under ``optimizer/target`` (``t5x.checkpoints.load_t5x_checkpoint``
        reads it; name the directory ``checkpoint_<step>``).
      step: T5X only, stored as the train step.
    Returns:
      The directory written.
    Raises:
      ValueError: unknown format.
      CheckpointError: parameters that do not match ``model.config``.
    """
    path = os.fspath(path)
    if format == "hf":
        return hf.write_hf(model.config, model.params, path)
    if format == "t5x":
        rules.check_t5x_params(rules.flatten(model.params), model.config, "model parameters")
        t5x.write_t5x(model.params, path, step=step)
        return path
    raise ValueError(f"Unknown checkpoint format {format!r}; use 'hf' or 't5x'.")
