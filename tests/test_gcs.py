"""gs:// for real: T5X checkpoints and a SentencePiece model read from a Cloud Storage emulator.

A real local server (``gcp-storage-emulator``, in the ``test`` extra) serves the Cloud Storage JSON API; TensorStore's
gcs driver, which specjax reads gs:// paths with, is pointed at it with TensorStore's endpoint override
``TENSORSTORE_GCS_HTTP_URL``. The objects are t5x's own checkpoint files (``../shared/data/fixtures/t5x``: the
per-array zarr layout and the Orbax OCDBT layout, both written by t5x), copied into the bucket object by object with
TensorStore's kvstore. The references are the same files read from disk. Skipped, with the reason, only where the
emulator is not installed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import specjax
from specjax.checkpoints import CheckpointError
from specjax.cli import main as cli
from specjax.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "specjax-test"


def _upload(store, local: Path, prefix: str) -> None:
    """Copies every file under ``local`` to ``prefix/<relative path>`` in the bucket (TensorStore kvstore writes)."""
    for f in sorted(p for p in local.rglob("*") if p.is_file()):
        store.write(f"{prefix}/{f.relative_to(local).as_posix()}", f.read_bytes()).result()


@pytest.fixture(scope="module")
def bucket(fixtures_dir, spiece_model):
    """The emulator on a free port with bucket ``specjax-test`` holding the two t5x checkpoints (``legacy_ts/`` and
    ``orbax/``, ``checkpoint_0`` each) and T5's spiece.model beside the Orbax one (``orbax/spiece.model``)."""
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError:
        pytest.skip("gcp-storage-emulator is not installed (pip install 'specjax[test]')")
    import tensorstore as ts

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, str(Path(__file__).parent / "_gcs_emulator.py"), "start", "--port", str(port), "--in-memory"]
    server = subprocess.Popen(
        cmd + ["--default-bucket", BUCKET], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    previous = os.environ.get("TENSORSTORE_GCS_HTTP_URL")
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, "the storage emulator exited"
            try:
                socket.create_connection(("localhost", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the storage emulator did not start in 60 s"
                time.sleep(0.2)
        store = ts.KvStore.open({"driver": "gcs", "bucket": BUCKET}).result()
        for layout in ("legacy_ts", "orbax"):
            _upload(store, fixtures_dir / "t5x" / layout, layout)
        store.write("orbax/spiece.model", spiece_model.read_bytes()).result()
        yield {"url": f"http://localhost:{port}", "fixtures": fixtures_dir / "t5x", "spiece": spiece_model}
    finally:
        if previous is None:
            os.environ.pop("TENSORSTORE_GCS_HTTP_URL", None)
        else:
            os.environ["TENSORSTORE_GCS_HTTP_URL"] = previous
        server.kill()
        server.wait(timeout=30)


@pytest.mark.parametrize("layout", ["legacy_ts", "orbax"])
def test_t5x_checkpoints_load_from_the_bucket_as_from_disk(bucket, layout):
    """``load_checkpoint("gs://bucket/<layout>/checkpoint_0")``: the same config and every parameter bit for bit
    as the same checkpoint on disk."""
    remote = specjax.load_checkpoint(f"gs://{BUCKET}/{layout}/checkpoint_0")
    local = specjax.load_checkpoint(bucket["fixtures"] / layout / "checkpoint_0")
    assert remote.config == local.config
    a, b = specjax.checkpoints.rules.flatten(remote.params), specjax.checkpoints.rules.flatten(local.params)
    assert sorted(a) == sorted(b) and len(a) > 20
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


def test_tokenizer_from_the_bucket(bucket):
    """``Tokenizer("gs://...spiece.model")`` gives the ids and text the local file gives."""
    text = "A man rides a bicycle down the street."
    remote, local = Tokenizer(f"gs://{BUCKET}/orbax/spiece.model"), Tokenizer(bucket["spiece"])
    assert remote.vocab_size == local.vocab_size == 32100
    assert remote.encode(text) == local.encode(text)
    assert remote.decode(local.encode(text)) == local.decode(local.encode(text))


def test_generate_with_gs_checkpoints_writes_the_local_lines(bucket, tmp_path, capsys):
    """``specjax generate --input gs://.../in.en --target gs://.../orbax/checkpoint_0 --draft
    gs://.../legacy_ts/checkpoint_0`` (its vocabulary found beside the target in the bucket) writes the lines the
    same command with the local copies writes (greedy, γ 2)."""
    import tensorstore as ts

    src = tmp_path / "in.en"
    src.write_text("A dog runs on the beach.\nTwo people sit at a table.\n", encoding="utf-8")
    ts.KvStore.open({"driver": "gcs", "bucket": BUCKET}).result().write("in.en", src.read_bytes()).result()
    common = ["generate", "--gamma", "2", "--temperature", "0", "--max-decode-length", "6"]
    remote = common + ["--input", f"gs://{BUCKET}/in.en", "--target", f"gs://{BUCKET}/orbax/checkpoint_0"]
    remote += ["--draft", f"gs://{BUCKET}/legacy_ts/checkpoint_0"]
    assert cli(remote + ["--output", str(tmp_path / "remote.txt")]) == 0
    assert f"tokenizer: the target checkpoint's own vocabulary, gs://{BUCKET}/orbax/spiece.model" in (
        capsys.readouterr().err
    )
    fixtures = bucket["fixtures"]
    local = common + ["--input", str(src), "--target", str(fixtures / "orbax/checkpoint_0")]
    local += ["--draft", str(fixtures / "legacy_ts")]
    assert cli(local + ["--tokenizer", str(bucket["spiece"]), "--output", str(tmp_path / "local.txt")]) == 0
    lines = (tmp_path / "remote.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and lines == (tmp_path / "local.txt").read_text(encoding="utf-8").splitlines()


def test_a_missing_object_and_a_missing_bucket_are_one_line_errors(bucket):
    with pytest.raises(CheckpointError, match=r"No T5X checkpoint at 'gs://specjax-test/nothing/checkpoint_0'") as e:
        specjax.load_checkpoint(f"gs://{BUCKET}/nothing/checkpoint_0")
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match=r"gs://no-such-bucket: no such bucket") as e:
        specjax.load_checkpoint("gs://no-such-bucket/t5x/checkpoint_0")
    assert "\n" not in str(e.value) and "gsutil ls gs://no-such-bucket/" in str(e.value)
    with pytest.raises(FileNotFoundError, match=r"No object at 'gs://specjax-test/orbax/none.model'"):
        Tokenizer(f"gs://{BUCKET}/orbax/none.model")


def test_unusable_credentials_are_one_line_from_the_command(bucket, tmp_path):
    """``GOOGLE_APPLICATION_CREDENTIALS`` naming a file that holds no key: `specjax generate --target gs://...`
    exits 2 with one error line that names the fix (the credentials are read once per process: a subprocess)."""
    key = tmp_path / "key.json"
    key.write_text('{"type": "service_account"}', encoding="utf-8")
    src = tmp_path / "in.en"
    src.write_text("A dog runs.\n", encoding="utf-8")
    env = dict(os.environ, GOOGLE_APPLICATION_CREDENTIALS=str(key), TENSORSTORE_GCS_HTTP_URL=bucket["url"])
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    target = f"gs://{BUCKET}/orbax/checkpoint_0"
    cmd = [sys.executable, "-m", "specjax", "generate", "--input", str(src), "--output", str(tmp_path / "o.txt")]
    cmd += ["--target", target, "--draft", target, "--gamma", "1", "--temperature", "0"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("specjax generate: error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert "refused the credentials" in errors[0] and "GOOGLE_APPLICATION_CREDENTIALS" in errors[0]
    assert not (tmp_path / "o.txt").exists()
