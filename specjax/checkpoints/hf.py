"""Hugging Face T5-family checkpoints (``model_type`` t5, mt5, umt5): a directory with ``config.json`` and
the weights.

Weights are read from, in this order: ``model.safetensors``, ``model.safetensors.index.json`` (shards),
``pytorch_model.bin``, ``pytorch_model.bin.index.json``. Safetensors files are parsed here
(format: https://github.com/huggingface/safetensors, "Format" section: 8-byte little-endian header
length, JSON header ``{name: {dtype, shape, data_offsets}}``, then raw little-endian data) and memory
mapped, so neither PyTorch nor a full copy is needed; bfloat16 comes back as ``ml_dtypes.bfloat16``.
``pytorch_model.bin`` needs PyTorch, imported only then.

The key mapping and its checks live in ``specjax.checkpoints.rules``.

transformers >= 5 writes ``tie_word_embeddings: true`` for every T5 and says whether logits are scaled by
``1/sqrt(d)`` in ``scale_decoder_outputs``; older versions used ``tie_word_embeddings`` for both. A head
that is not scaled is read as an untied ``logits_dense`` (a copy of ``shared`` when no ``lm_head`` was
saved), which is exact.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from specjax.checkpoints.rules import CheckpointError, hf_to_t5x, t5x_to_hf
from specjax.config import T5Config

__all__ = ["find_hf", "load_hf", "write_hf", "read_safetensors", "write_safetensors", "hf_config"]

_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

_ST_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def find_hf(path: str) -> tuple[str, str] | None:
    """Recognises a Hugging Face checkpoint: a directory with ``config.json`` and a weights file, or the
    weights file itself (its directory must hold ``config.json``).

    Returns:
      (directory, weights file), or None.
    """
    path = os.fspath(path)
    if os.path.isfile(path) and os.path.basename(path) in _WEIGHT_FILES:
        return os.path.dirname(os.path.abspath(path)), path
    if os.path.isfile(path) and path.endswith(".safetensors"):
        return os.path.dirname(os.path.abspath(path)), path
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        for name in _WEIGHT_FILES:
            if os.path.isfile(os.path.join(path, name)):
                return path, os.path.join(path, name)
    return None


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Memory-maps every tensor of a ``.safetensors`` file as a read-only numpy array.

    Raises:
      CheckpointError: the header is malformed or the file is shorter than the header says (truncated).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path!r} is truncated: {size} bytes, not even a safetensors header.")
        n = int.from_bytes(head, "little")
        if n > size - 8 or n > 100_000_000:
            raise CheckpointError(
                f"{path!r} is truncated or not a safetensors file: header claims {n} bytes, "
                f"file has {size}. Download or copy it again."
            )
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path!r}: safetensors header is not valid JSON ({e}).") from e
    header.pop("__metadata__", None)
    start = 8 + n
    end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    if start + end > size:
        raise CheckpointError(
            f"{path!r} is truncated: its header needs {start + end} bytes, the file has "
            f"{size}. Download or copy it again."
        )
    if not header:
        return {}
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=(end,)) if end else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if info["dtype"] not in _ST_DTYPES:
            raise CheckpointError(f"{path!r}: tensor {name!r} has dtype {info['dtype']}, which specjax does not read.")
        dtype = _np_dtype(_ST_DTYPES[info["dtype"]])
        a, b = (int(x) for x in info["data_offsets"])
        shape = tuple(int(s) for s in info["shape"])
        if (b - a) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise CheckpointError(f"{path!r}: tensor {name!r} has {b - a} bytes for shape {shape} {dtype}.")
        out[name] = data[a:b].view(dtype).reshape(shape)
    return out


def write_safetensors(tensors: Mapping[str, np.ndarray], path: str, metadata: Mapping[str, str] | None = None):
    """Writes numpy arrays (float32/16, bfloat16, ints) as a safetensors file (``format: pt`` metadata, as
    transformers requires). Written to a temporary name, then renamed."""
    rev = {v: k for k, v in _ST_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    arrays = []
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        dname = "bfloat16" if arr.dtype.name == "bfloat16" else arr.dtype.name
        if dname not in rev:
            raise ValueError(f"write_safetensors: {name!r} has dtype {arr.dtype}, which safetensors cannot hold.")
        header[name] = {"dtype": rev[dname], "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for arr in arrays:
            f.write(arr.tobytes())
    os.replace(tmp, path)


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError as e:
        raise CheckpointError(
            f"{path!r} is a PyTorch file; reading it needs torch (pip install torch), or convert it to safetensors."
        ) from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"{path!r} cannot be read by torch.load ({type(e).__name__}: {e}); is it truncated?"
        ) from e
    out = {}
    for k, t in state.items():
        t = t.detach().contiguous()
        if t.dtype == torch.bfloat16:
            out[k] = t.view(torch.int16).numpy().view(_np_dtype("bfloat16"))
        else:
            out[k] = t.numpy()
    return out


def _read_weights(file: str) -> dict[str, np.ndarray]:
    if file.endswith(".index.json"):
        with open(file) as f:
            index = json.load(f)
        directory = os.path.dirname(file)
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(index["weight_map"].values())):
            shard_path = os.path.join(directory, shard)
            if not os.path.isfile(shard_path):
                raise CheckpointError(f"{file!r} names shard {shard!r}, which is missing. Download it.")
            tensors.update(_read_weights(shard_path))
        return tensors
    if file.endswith(".safetensors"):
        return read_safetensors(file)
    return _read_torch_bin(file)


def hf_config(config_json: Mapping[str, Any], **overrides) -> T5Config:
    """``T5Config`` from a parsed Hugging Face ``config.json`` (``model_type`` t5, mt5 or umt5), reading
    ``scale_decoder_outputs`` (transformers >= 5) before ``tie_word_embeddings`` to decide whether the head is
    scaled by ``1/sqrt(d)`` (``logits_via_embedding``; ``load_hf`` then looks at the weights for an untied
    ``lm_head``). transformers 5's mT5 writes ``tie_word_embeddings: true`` without the key and never scales;
    mT5 written by transformers 4 scaled exactly when ``tie_word_embeddings`` (its released checkpoints: false).

    Raises:
      ValueError: a model type or activation specjax does not read (``T5Config.from_hf_config``).
    """
    scale = config_json.get("scale_decoder_outputs")
    if scale is None:
        scale = config_json.get("tie_word_embeddings", True)
        if config_json.get("model_type") == "mt5" and _major_version(config_json) >= 5:
            scale = False
    fields = {"logits_via_embedding": bool(scale)}
    fields.update(overrides)
    return T5Config.from_hf_config(config_json, **fields)


def _major_version(config_json: Mapping[str, Any]) -> int:
    """The major version of the transformers that wrote ``config.json`` (4 when it does not say)."""
    try:
        return int(str(config_json.get("transformers_version", "4")).split(".")[0])
    except ValueError:
        return 4


def _untied_scaled_head(tensors: Mapping[str, Any], config: T5Config) -> bool:
    """True when a scaled head (``logits_via_embedding``) comes with an ``lm_head.weight`` that is not the
    embedding: then it is an untied head with the scaling (``logits_scaling``)."""
    if not config.logits_via_embedding or "lm_head.weight" not in tensors or "shared.weight" not in tensors:
        return False
    head, shared = tensors["lm_head.weight"], tensors["shared.weight"]
    return np.shape(head) != np.shape(shared) or not np.array_equal(np.asarray(head), np.asarray(shared))


def load_hf(path: str, dtype: Any = None) -> tuple[T5Config, dict[str, np.ndarray]]:
    """Reads a Hugging Face T5 checkpoint.

    Args:
      path: directory or weights file (see ``find_hf``).
      dtype: numpy dtype to cast to after the checks, or None to keep the stored dtype.
    Returns:
      (config, flat t5x-named numpy parameters in t5x layout).
    Raises:
      CheckpointError: not a Hugging Face T5 checkpoint, truncated files, keys or shapes that do not match
        config.json.
    """
    found = find_hf(path)
    if found is None:
        raise CheckpointError(
            f"{path!r} is not a Hugging Face checkpoint (needs config.json and one of {', '.join(_WEIGHT_FILES)})."
        )
    directory, file = found
    cfg_path = os.path.join(directory, "config.json")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"{file!r} has no config.json beside it; specjax needs it for the model shape.")
    try:
        with open(cfg_path) as f:
            cfg_json = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path!r} is not valid JSON ({e}).") from e
    try:
        config = hf_config(cfg_json, name=os.path.basename(os.path.abspath(directory)))
    except ValueError as e:
        raise CheckpointError(f"{cfg_path}: {e}") from e
    tensors = _read_weights(file)
    if _untied_scaled_head(tensors, config):
        config = config.replace(logits_via_embedding=False, logits_scaling=True)
    return config, hf_to_t5x(tensors, config, source=file, dtype=dtype)


def write_hf(config: T5Config, params: Mapping[str, Any], directory: str) -> str:
    """Writes ``config.json`` (``T5Config.to_hf_config``) and ``model.safetensors`` for
    ``transformers.T5ForConditionalGeneration.from_pretrained(directory)``.

    Untied heads are written as ``lm_head.weight``; the embedding once, as ``shared.weight``.

    Returns:
      ``directory``.
    Raises:
      CheckpointError: parameters that do not match ``config``.
    """
    tensors = t5x_to_hf(params, config)
    os.makedirs(directory, exist_ok=True)
    hf = config.to_hf_config()
    # transformers >= 5 reads the head scaling from here; older versions ignore the key.
    hf["scale_decoder_outputs"] = config.scales_logits
    hf["dtype"] = config.param_dtype
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
    write_safetensors(tensors, os.path.join(directory, "model.safetensors"))
    return directory
