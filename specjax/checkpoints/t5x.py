"""T5X checkpoints: legacy msgpack (+ TensorStore/zarr) and Orbax/OCDBT, read and written without t5x.

Formats (google-research/t5x ``t5x/checkpoints.py``, ``Checkpointer.save`` and
``OrbaxCheckpointManagerInterface``):

- **Legacy**: ``checkpoint_N/checkpoint`` is a msgpack file in flax's serialization format
  (``flax.serialization.msgpack_serialize``): ``{'version': 3, 'optimizer': {'target': params,
  'state': {...}}}``. Each leaf is either an inline ndarray or a TensorStore spec dict
  ``{'driver': 'zarr', 'kvstore': {'driver': 'file', 'path': '<dotted.name>/'}, ...}`` whose path is
  relative to the checkpoint directory (zarr v2, gzip chunks). Older files may be a single msgpack file
  with every array inline (``t5x/testdata/test_t5_tiny.checkpoint_0``).
- **Orbax**: ``checkpoint_N/state/`` holds ``_METADATA`` (JSON) and an OCDBT key-value store
  (``manifest.ocdbt`` and data files) in which each array is a zarr array named by its dotted path,
  e.g. ``target.encoder.layers_0.attention.query.kernel/``. Read through TensorStore's ``ocdbt`` driver,
  so ``orbax-checkpoint`` is not needed.

Only ``target`` (the model parameters) is read; optimizer state is ignored. T5X checkpoints carry no
model config, so ``infer_config`` derives it from the parameter shapes.

``gs://`` paths are read through TensorStore's ``gcs`` kvstore driver, both layouts (``tests/test_gcs.py`` runs them
against a Cloud Storage emulator; ``TENSORSTORE_GCS_HTTP_URL`` is TensorStore's endpoint override). A missing object,
a missing bucket and refused credentials each raise one line (``gcs_error``, ``check_gcs_path``).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

import numpy as np

from specjax.checkpoints.rules import CheckpointError, check_t5x_params, flatten, unflatten
from specjax.config import T5Config

__all__ = ["find_t5x", "read_t5x", "unscan_t5x", "infer_config", "write_t5x", "is_gcs", "read_gcs_bytes"]

_MSGPACK_FILE = "checkpoint"


def is_gcs(path: str) -> bool:
    """True for ``gs://bucket/...`` paths (read through TensorStore's gcs driver)."""
    return str(path).startswith("gs://")


GCS_RETRIES = {"max_retries": 6, "initial_delay": "0.5s", "max_delay": "8s"}
"""TensorStore's ``gcs_request_retries`` for every gs:// request: a failing request (no network, a transient
error) is tried 6 times over about 20 s, then fails with one line, instead of TensorStore's default 32 retries of up
to 32 s each (minutes of silence on a host that cannot reach Cloud Storage)."""


def gcs_spec(bucket: str, path: str = "") -> dict:
    """TensorStore's gcs kvstore spec for ``gs://bucket/path`` with ``GCS_RETRIES``."""
    return {"driver": "gcs", "bucket": bucket, "path": path, "context": {"gcs_request_retries": dict(GCS_RETRIES)}}


def _kvstore(path: str) -> dict:
    """A TensorStore kvstore spec for a local or gs:// directory (trailing ``/``)."""
    path = str(path).rstrip("/") + "/"
    if is_gcs(path):
        bucket, _, rest = path[len("gs://") :].partition("/")
        return gcs_spec(bucket, rest)
    return {"driver": "file", "path": os.path.abspath(path) + "/"}


_CREDENTIAL_WORDS = ("credential", "unauthenticated", "permission_denied", "401", "403", "oauth", "token")


def gcs_error(path: str, error: Exception) -> CheckpointError:
    """One line for a failed Google Cloud Storage request on ``path`` (TensorStore's error): credentials or
    permissions refused (with the fix), or the request's own message."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if any(w in first.lower() for w in _CREDENTIAL_WORDS):
        return CheckpointError(
            f"{path}: Google Cloud Storage refused the credentials ({first}); run `gcloud auth application-default "
            "login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file (a TPU VM uses its "
            "service account, which needs read access to the bucket)."
        )
    return CheckpointError(f"{path}: cannot read it from Google Cloud Storage ({first}).")


def _gcs_read(path: str) -> bytes | None:
    import tensorstore as ts

    parent, _, name = str(path).rstrip("/").rpartition("/")
    try:
        store = ts.KvStore.open(_kvstore(parent)).result()
        result = store.read(name).result()
    except ValueError as e:  # TensorStore's errors: credentials, network, a malformed response
        raise gcs_error(path, e) from None
    return None if result.state == "missing" else bytes(result.value)


def check_gcs_path(path: str) -> None:
    """Checks that the bucket of a ``gs://bucket/path`` can be listed (GCS answers a missing object and a missing
    bucket alike when an object is read).

    Raises:
      CheckpointError: no such bucket (or no access to it), or credentials refused; one line naming the fix.
    """
    import tensorstore as ts

    bucket, _, rest = str(path)[len("gs://") :].partition("/")
    try:
        ts.KvStore.open(gcs_spec(bucket, rest)).result().list().result()
    except ValueError as e:
        error = gcs_error(f"gs://{bucket}", e)
        if "credentials" in str(error):
            raise error from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(
            f"gs://{bucket}: no such bucket, or it cannot be listed ({first}); check the bucket's name "
            f"(gsutil ls gs://{bucket}/) and your access to it."
        ) from None


def read_gcs_bytes(path: str) -> bytes:
    """The bytes of the object ``gs://bucket/name`` (TensorStore's gcs driver; ``TENSORSTORE_GCS_HTTP_URL``
    points it at another endpoint, e.g. a storage emulator).

    Raises:
      FileNotFoundError: no such object (the bucket exists).
      CheckpointError: no such bucket, credentials refused, or another storage error (one line each).
    """
    data = _gcs_read(path)
    if data is None:
        check_gcs_path(path)
        raise FileNotFoundError(f"No object at {path!r} (gsutil ls {path.rpartition('/')[0]}/ lists what is there).")
    return data


def _exists(path: str) -> bool:
    if is_gcs(path):
        return _gcs_read(path) is not None
    return os.path.exists(path)


def _read_bytes(path: str) -> bytes:
    if is_gcs(path):
        return read_gcs_bytes(path)
    with open(path, "rb") as f:
        return f.read()


def find_t5x(path: str) -> tuple[str, str] | None:
    """Recognises a T5X checkpoint at ``path``.

    Accepts the msgpack file itself, a ``checkpoint_N`` directory (legacy: holds ``checkpoint``;
    Orbax: holds ``state/_METADATA``) or an Orbax ``state`` directory.

    Returns:
      ``("legacy", msgpack file)`` or ``("orbax", state directory)``, or None when nothing matches.
    """
    path = str(path)
    if is_gcs(path):
        if path.rstrip("/").endswith("/" + _MSGPACK_FILE):
            return "legacy", path
        for kind, probe, result in (
            ("legacy", f"{path.rstrip('/')}/{_MSGPACK_FILE}", None),
            ("orbax", f"{path.rstrip('/')}/state/_METADATA", "state"),
            ("orbax", f"{path.rstrip('/')}/_METADATA", ""),
        ):
            if _exists(probe):
                return kind, probe if kind == "legacy" else f"{path.rstrip('/')}/{result}".rstrip("/")
        return None
    if os.path.isfile(path):
        return "legacy", path
    if os.path.isfile(os.path.join(path, _MSGPACK_FILE)):
        return "legacy", os.path.join(path, _MSGPACK_FILE)
    for state in (os.path.join(path, "state"), path):
        if os.path.isfile(os.path.join(state, "_METADATA")) or os.path.isfile(os.path.join(state, "manifest.ocdbt")):
            return "orbax", state
    return None


def read_t5x(path: str) -> dict[str, np.ndarray]:
    """Reads the ``target`` parameters of a T5X checkpoint.

    Args:
      path: see ``find_t5x``.
    Returns:
      ``{t5x name: np.ndarray}`` with ``/``-joined names relative to ``target``
      (e.g. ``encoder/layers_0/attention/query/kernel``), dtypes as stored.
    Raises:
      FileNotFoundError: the path does not exist.
      CheckpointError: no T5X checkpoint there, or a truncated / corrupt file or array.
    """
    found = find_t5x(path)
    if found is None:
        if not _exists(path):
            raise FileNotFoundError(f"No checkpoint at {path!r}: the path does not exist.")
        raise CheckpointError(
            f"{path!r} is not a T5X checkpoint (no 'checkpoint' msgpack file, no Orbax 'state/_METADATA')."
        )
    kind, where = found
    return _read_legacy(where) if kind == "legacy" else _read_orbax(where)


def _is_ts_spec(x: Any) -> bool:
    return isinstance(x, Mapping) and "driver" in x and ("kvstore" in x or "path" in x)


def _read_legacy(file: str) -> dict[str, np.ndarray]:
    from flax import serialization

    data = _read_bytes(file)
    try:
        contents = serialization.msgpack_restore(data)
    except Exception as e:  # msgpack raises several types (ValueError, ExtraData, FormatError …)
        raise CheckpointError(
            f"{file!r} is truncated or not a T5X msgpack checkpoint ({type(e).__name__}: {e}; "
            f"{len(data)} bytes). Copy or download it again."
        ) from e
    if not isinstance(contents, Mapping):
        raise CheckpointError(f"{file!r} holds a {type(contents).__name__}, not a T5X checkpoint dict.")
    target = None
    if isinstance(contents.get("optimizer"), Mapping):
        target = contents["optimizer"].get("target")
    elif "target" in contents:  # version-0 files
        target = contents["target"]
    if not isinstance(target, Mapping):
        raise CheckpointError(
            f"{file!r} has no 'optimizer/target' parameters (top-level keys: "
            f"{sorted(contents)}); is it a T5X checkpoint?"
        )
    ckpt_dir = file.rstrip("/").rpartition("/")[0] if is_gcs(file) else os.path.dirname(os.path.abspath(file))
    out = {}
    for name, leaf in _flatten_specs(target).items():
        if _is_ts_spec(leaf):
            out[name] = _read_ts_leaf(leaf, ckpt_dir, name, file)
        else:
            out[name] = np.array(leaf)
    return out


def _flatten_specs(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in tree.items():
        name = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, Mapping) and not _is_ts_spec(v):
            out.update(_flatten_specs(v, name))
        else:
            out[name] = v
    return out


def _read_ts_leaf(spec: Mapping, ckpt_dir: str, name: str, file: str) -> np.ndarray:
    import tensorstore as ts

    spec = dict(spec)
    kv = spec.get("kvstore")
    rel = kv.get("path") if isinstance(kv, Mapping) else spec.pop("path", None)
    if rel is None:
        raise CheckpointError(f"{file!r}: TensorStore spec of {name!r} has no path: {spec}.")
    if is_gcs(rel) or os.path.isabs(rel):  # absolute (t5x rewrites gs:// specs to relative on save)
        location = rel
    else:
        location = f"{ckpt_dir.rstrip('/')}/{rel}"
    spec["kvstore"] = _kvstore(location)
    try:
        return np.asarray(ts.open(spec, open=True, read=True).result().read().result())
    except Exception as e:
        raise CheckpointError(
            f"{file!r}: cannot read parameter {name!r} from {location!r} "
            f"({type(e).__name__}: {e}). Is the checkpoint directory complete?"
        ) from e


def _read_orbax(state_dir: str) -> dict[str, np.ndarray]:
    import tensorstore as ts

    ocdbt = _exists(f"{state_dir.rstrip('/')}/manifest.ocdbt")
    base = _kvstore(state_dir)
    store_spec = {"driver": "ocdbt", "base": base} if ocdbt else base
    try:
        keys = ts.KvStore.open(store_spec).result().list().result()
    except Exception as e:
        raise CheckpointError(
            f"Orbax checkpoint {state_dir!r} cannot be listed ({type(e).__name__}: {e}); "
            "is manifest.ocdbt truncated or the directory incomplete?"
        ) from e
    arrays: dict[str, str] = {}
    for key in keys:
        key = key.decode() if isinstance(key, bytes) else key
        m = re.match(r"^(target|params)\.(.+)/(\.zarray|zarr\.json)$", key)
        if m:
            arrays[key.split("/")[0]] = "zarr3" if m.group(3) == "zarr.json" else "zarr"
    if not arrays:
        raise CheckpointError(
            f"Orbax checkpoint {state_dir!r} holds no 'target' arrays ({len(keys)} keys); is it a T5X train state?"
        )
    prefixes = {a.split(".")[0] for a in arrays}
    prefix = "target" if "target" in prefixes else "params"
    out = {}
    for stored, driver in sorted(arrays.items()):
        if not stored.startswith(prefix + "."):
            continue
        name = stored[len(prefix) + 1 :].replace(".", "/")
        spec = (
            {"driver": driver, "kvstore": {**store_spec, "path": stored + "/"}}
            if ocdbt
            else {"driver": driver, "kvstore": _kvstore(f"{state_dir.rstrip('/')}/{stored}")}
        )
        try:
            out[name] = np.asarray(ts.open(spec, open=True, read=True).result().read().result())
        except Exception as e:
            raise CheckpointError(
                f"Orbax checkpoint {state_dir!r}: cannot read {stored!r} ({type(e).__name__}: {e})."
            ) from e
    return out


def infer_config(flat: Mapping[str, Any], source: str = "checkpoint", **overrides) -> T5Config:
    """Derives a ``T5Config`` from t5x parameter shapes (T5X checkpoints carry no config).

    ``d_model`` and ``vocab_size`` from ``token_embedder/embedding`` [v, d]; ``num_heads`` and the number
    of relative-position buckets from ``encoder/relpos_bias/rel_embedding`` [n, buckets]; ``head_dim`` from
    ``encoder/layers_0/attention/query/kernel`` [d, n*h]; ``mlp_dim`` from ``wi``/``wi_0`` [d, f]; layer
    counts from ``layers_<i>``; ``gated_gelu`` when ``wi_0`` exists; ``logits_via_embedding`` when there is
    no ``decoder/logits_dense``; ``per_layer_relpos_bias`` (umT5) when the tables are
    ``encoder/layers_<i>/relpos_bias/rel_embedding`` instead of one ``encoder/relpos_bias``.
    ``relative_attention_max_distance`` (128), ``layer_norm_epsilon`` (1e-6) and the MLP's activations
    (gelu, as T5 1.1 / mT5 / umT5 / MADLAD-400; UL2 needs ``mlp_activations=("silu", "linear")``) cannot be
    seen in shapes and take t5x's defaults unless given in ``overrides``.

    Raises:
      CheckpointError: a parameter needed for the inference is missing.
    """

    def shape(name):
        if name not in flat:
            raise CheckpointError(
                f"{source}: cannot infer the T5 config, {name!r} is missing "
                f"(found {len(flat)} parameters, e.g. {sorted(flat)[:4]})."
            )
        return tuple(np.shape(flat[name]))

    vocab, d_model = shape("token_embedder/embedding")
    per_layer = "encoder/relpos_bias/rel_embedding" not in flat and "encoder/layers_0/relpos_bias/rel_embedding" in flat
    num_heads, buckets = shape(f"encoder/{'layers_0/' if per_layer else ''}relpos_bias/rel_embedding")
    nh = shape("encoder/layers_0/attention/query/kernel")[1]
    gated = "encoder/layers_0/mlp/wi_0/kernel" in flat
    mlp_dim = shape("encoder/layers_0/mlp/wi_0/kernel" if gated else "encoder/layers_0/mlp/wi/kernel")[1]

    def layers(stack):
        idx = {int(m.group(1)) for n in flat for m in [re.match(rf"^{stack}/layers_(\d+)/", n)] if m}
        return max(idx) + 1 if idx else 0

    if nh % num_heads:
        raise CheckpointError(f"{source}: query width {nh} is not a multiple of num_heads={num_heads}.")
    fields = dict(
        vocab_size=vocab,
        d_model=d_model,
        num_heads=num_heads,
        head_dim=nh // num_heads,
        mlp_dim=mlp_dim,
        num_encoder_layers=layers("encoder"),
        num_decoder_layers=layers("decoder"),
        gated_gelu=gated,
        logits_via_embedding="decoder/logits_dense/kernel" not in flat,
        relative_attention_num_buckets=buckets,
        name=os.path.basename(str(source).rstrip("/")),
    )
    if per_layer:
        fields["per_layer_relpos_bias"] = True
    fields.update(overrides)
    return T5Config(**fields)


def write_t5x(params: Mapping[str, Any], directory: str, step: int = 0) -> str:
    """Writes a T5X legacy checkpoint: ``directory/checkpoint``, one msgpack file, every array inline.

    The layout is ``{'version': 3, 'optimizer': {'target': params, 'state': {'step': step,
    'param_states': {}}}}``, which t5x's ``checkpoints.load_t5x_checkpoint`` reads; arrays over 1 GiB are
    chunked by flax's serializer as t5x's own writer does. Name the directory ``checkpoint_<step>`` for t5x's
    step discovery. Inline arrays keep the writer dependency-free; t5x writes zarr for sharded arrays.

    Args:
      params: nested or flat (``/``-joined) t5x-named parameters.
      directory: created if missing; an existing ``checkpoint`` file in it is replaced.
      step: stored as ``optimizer/state/step``.
    Returns:
      The path of the msgpack file.
    """
    import jax
    from flax import serialization

    if is_gcs(directory):
        raise CheckpointError("Writing T5X checkpoints to gs:// is not supported; write locally and copy.")
    flat = flatten(params) if any(isinstance(v, Mapping) for v in params.values()) else dict(params)
    target = unflatten({k: np.asarray(jax.device_get(v)) for k, v in flat.items()})
    state = {
        "version": 3,
        "optimizer": {"target": target, "state": {"step": np.asarray(step, np.int32), "param_states": {}}},
    }
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, _MSGPACK_FILE)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(serialization.msgpack_serialize(state))
    os.replace(tmp, path)
    return path


def unscan_t5x(flat: Mapping[str, Any]) -> dict[str, Any]:
    """A scanned T5X tree (flaxformer ``scan_layers``, as umT5, MADLAD-400 and other scalable-T5 checkpoints were
    trained) as the per-layer tree specjax reads; an unscanned tree comes back unchanged but for the kernel shapes.

    Scanned parameters live under ``<stack>/<stack>/...`` with the layers on axis 1 (``attention/key/kernel``
    [d, l, n, h], ``out/kernel`` [n, l, h, d], ``mlp/wi_0/kernel`` [d, l, f], ``*_layer_norm/scale`` [d, l],
    ``relpos_bias/rel_embedding`` [n, l, buckets]); they become ``<stack>/layers_<i>/...``. Attention kernels kept
    with separate heads ([d, n, h], [n, h, d]: t5x's ``DenseGeneral``) are flattened to [d, n*h] and [n*h, d].
    Source: transformers ``models/umt5/convert_umt5_checkpoint_to_pytorch.py`` (``t5x_attention_lookup``,
    ``t5x_relpos_bias_lookup``: the ``[:, i]`` slices).
    """

    def flat_heads(name: str, a):
        if np.ndim(a) != 3 or not name.endswith("/kernel"):
            return a
        a = np.asarray(a)
        return a.reshape(-1, a.shape[-1]) if name.endswith("/out/kernel") else a.reshape(a.shape[0], -1)

    out: dict[str, Any] = {}
    for name, value in flat.items():
        stack = name.split("/", 1)[0]
        scanned = f"{stack}/{stack}/"
        if stack in ("encoder", "decoder") and name.startswith(scanned):
            rest = name[len(scanned) :]
            value = np.asarray(value)
            for i in range(value.shape[1]):
                out[f"{stack}/layers_{i}/{rest}"] = flat_heads(rest, np.take(value, i, axis=1))
        else:
            out[name] = flat_heads(name, value)
    return out


def load_t5x(path: str, **config_overrides) -> tuple[T5Config, dict[str, np.ndarray]]:
    """Reads a T5X checkpoint (unscanned, or scanned: ``unscan_t5x``) and infers its config; checks every name and
    shape against it.

    Returns:
      (config, flat t5x-named numpy parameters).
    Raises:
      FileNotFoundError, CheckpointError: see ``read_t5x`` and ``infer_config``.
    """
    flat = unscan_t5x(read_t5x(path))
    config = infer_config(flat, path, **config_overrides)
    check_t5x_params(flat, config, path)
    return config, flat
