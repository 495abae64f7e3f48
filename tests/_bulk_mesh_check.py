"""Runs the multi-device checks of ``test_bulk_mesh.py`` on 8 forced CPU devices and prints one JSON object.

Run in its own process (``python tests/_bulk_mesh_check.py``) so the rest of the suite keeps one device:
``jax_num_cpu_devices`` must be set before JAX starts its CPU backend. The shipped mini pair in float32 decodes
the first 12 newstest2014 lines of at most 32 tokens (mixed lengths) through 8 slots (γ 3; refilled 4 at a
time: 12 lines), at most ``T`` output tokens, on one device and with the slots split over meshes
data:4,model:2 and data:8,model:1; the references are the one-device bulk output and each line decoded alone
by ``temperature_sample`` (greedy).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402

import specjax  # noqa: E402
from specjax import parallel, temperature_sample  # noqa: E402
from specjax.bulk import BulkDecoder  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
T = 12
LINES = 12
SLOTS = 8


def _bulk(target, draft, rows, gamma, temperature, mesh=None):
    settings = dict(batch_size=SLOTS, gamma=gamma, max_decode_length=T, read_ahead=1, refill=4, mesh=mesh)
    bulk = BulkDecoder(target, draft if gamma else None, **settings)
    got = list(bulk.generate(rows, temperature=temperature, rng=7))
    return [r.index for r in got], [r.tokens.tolist() for r in got], bulk.stats.runs


def _alone(target, rows):
    """Each line decoded alone (greedy, the target alone, one row, width 32): its token list."""
    out = []
    for row in rows:
        x = np.zeros((1, 32), np.int32)
        x[0, : len(row)] = row
        r = temperature_sample(target, x, rng=jax.random.PRNGKey(0)[None], max_decode_length=T, temperature=0.0)
        out.append(np.asarray(r.sequences[0, : int(r.lengths[0])]).tolist())
    return out


def main() -> dict:
    out: dict = {"device_count": jax.device_count()}
    target, draft, tok = specjax.load_default_pair(size="mini", dtype="float32")
    lines = (DATA / "wmt" / "newstest2014.en").read_text(encoding="utf-8").splitlines()[:40]
    kept = [line for line in lines if len(tok.encode(line)) <= 32][:LINES]
    rows = [tok.encode(line) for line in kept]
    out["input_lengths"] = [len(r) for r in rows]
    meshes = {
        "data4_model2": parallel.make_mesh("data:4,model:2"),
        "data8": parallel.make_mesh("data:8,model:1"),
    }
    out["alone"] = _alone(target, rows)
    one = _bulk(target, draft, rows, 3, 0.0)
    out["greedy_one"] = {"indices": one[0], "tokens": one[1], "runs": one[2]}
    for name, mesh in meshes.items():
        got = _bulk(target, draft, rows, 3, 0.0, mesh)
        out[f"greedy_{name}"] = {"indices": got[0], "tokens": got[1], "runs": got[2]}
    one = _bulk(target, draft, rows, 3, 1.0)
    out["sampled_one"] = {"indices": one[0], "tokens": one[1]}
    got = _bulk(target, draft, rows, 3, 1.0, meshes["data4_model2"])
    out["sampled_data4_model2"] = {"indices": got[0], "tokens": got[1]}
    # The slot state stays split on the devices between runs: the programs' slot shardings.
    from specjax.decoding.slots import SlotPrograms

    programs = next(p for p in SlotPrograms._shared.values() if p.mesh is meshes["data4_model2"])
    sh = programs.slot_shardings(None, None)
    out["cache_spec"] = str(jax.tree.leaves(sh.state.target_cache)[0].spec)
    out["positions_spec"] = str(sh.state.positions.spec)
    # The command: `specjax generate --mesh data:4,model:2` writes the one-device greedy lines (its first 5 lines
    # already in the output: it resumes after them), and --data-parallel with a batch size that does not split.
    import tempfile

    from specjax.cli import main as cli

    texts = [tok.decode(t).replace("\n", " ") for t in out["greedy_one"]["tokens"]]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.en", Path(tmp) / "out.de"
        src.write_text("".join(rows_text + "\n" for rows_text in kept), encoding="utf-8")
        dst.write_text("".join(t + "\n" for t in texts[:5]), encoding="utf-8")
        common = ["generate", "--size", "mini", "--dtype", "float32", "--input", str(src), "--output", str(dst)]
        common += ["--gamma", "3", "--temperature", "0", "--max-decode-length", str(T), "--no-cache"]
        out["cli_status"] = cli(common + ["--mesh", "data:4,model:2", "--batch-size", "8"])
        out["cli_lines"] = dst.read_text(encoding="utf-8").splitlines()
        out["cli_expected"] = texts
        other = Path(tmp) / "other.de"
        common[common.index(str(dst))] = str(other)
        import contextlib
        import io

        note = io.StringIO()
        with contextlib.redirect_stderr(note):
            out["cli_uneven_status"] = cli(common + ["--data-parallel", "--batch-size", "13"])
        out["cli_uneven_lines"] = other.read_text(encoding="utf-8").splitlines()
        out["cli_uneven_notes"] = [line for line in note.getvalue().splitlines() if line.startswith("note:")]
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bulk = BulkDecoder(target, draft, batch_size=6, gamma=3, max_decode_length=T, mesh=meshes["data4_model2"])
    out["uneven_batch"] = bulk.batch_size
    out["uneven_warnings"] = [str(w.message) for w in caught]
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
    sys.stdout.flush()
