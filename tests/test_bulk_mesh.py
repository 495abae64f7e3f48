"""Bulk decoding beyond one device (``specjax.bulk`` with ``mesh=``, several processes): a line's output is the same
as on one device.

The mesh checks run ``tests/_bulk_mesh_check.py`` in a subprocess with 8 forced CPU devices (this process keeps one
device) and assert on the JSON it prints: the shipped mini pair in float32 on 12 newstest2014 lines through 8 slots,
greedy on meshes data:4,model:2 and data:8,model:1 against one device's bulk output and each line decoded alone, and
sampled (same seed) against one device.

The multi-process path runs with real processes in ``tests/test_processes.py``; here its parts are checked alone:
``process_share`` directly, and ``BulkDecoder.generate`` run by 3 threads in the roles of 3 processes
(``specjax.bulk._processes`` gives each thread its process index and an exchange that stacks the threads' packed
arrays, as ``process_allgather`` stacks the processes'), which covers uneven shares and rounds quickly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from test_decoding import _inputs, tiny_pair  # noqa: F401

from specjax import bulk
from specjax.bulk import BulkDecoder, merge_processes, process_share

HERE = Path(__file__).parent
DATA = HERE.parent.parent / "shared" / "data"


@pytest.fixture(scope="module")
def eight_devices() -> dict:
    """The JSON of ``_bulk_mesh_check.py`` run on 8 forced host devices."""
    if not (DATA / "wmt" / "newstest2014.en").exists():
        pytest.skip(f"data not found under {DATA}")
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(HERE / "_bulk_mesh_check.py")], capture_output=True, text=True, env=env, timeout=1800
    )
    assert proc.returncode == 0, f"_bulk_mesh_check.py failed:\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["data4_model2", "data8"])
def test_greedy_sharded_slots_equal_one_device_and_each_line_alone(eight_devices, mesh):
    """Temperature 0, float32, γ 3: every line through slots split over the mesh equals, token for token, the
    one-device bulk output and the line decoded alone by temperature_sample; results come back in input order."""
    r = eight_devices
    assert r["device_count"] == 8
    got, one, alone = r[f"greedy_{mesh}"], r["greedy_one"], r["alone"]
    assert got["indices"] == list(range(12)) == one["indices"]
    assert len({len(a) for a in alone}) > 1  # outputs of several lengths: rows end at different iterations
    for i in range(12):
        assert got["tokens"][i] == one["tokens"][i] == alone[i], f"line {i}"
    assert got["runs"] > 1  # 12 lines through 8 slots: the slots were refilled


@pytest.mark.slow
def test_sampled_sharded_slots_equal_one_device(eight_devices):
    """Temperature 1, γ 3, the same seed: data:4,model:2 gives every line the tokens one device gives it (line i
    samples with fold_in(seed, i) wherever its slot is)."""
    r = eight_devices
    got, one = r["sampled_data4_model2"], r["sampled_one"]
    assert got["indices"] == list(range(12))
    assert got["tokens"] == one["tokens"]
    assert one["tokens"] != r["greedy_one"]["tokens"]  # sampled, not greedy


@pytest.mark.slow
def test_slot_state_is_split_on_the_devices(eight_devices):
    """The slots' shardings (the programs' in and out shardings): the target's cache [b, n, L, h] rows over data
    and heads over model; per-row state rows over data."""
    assert eight_devices["cache_spec"] == "P('data', 'model', None, None)"
    assert eight_devices["positions_spec"] == "P('data',)"


@pytest.mark.slow
def test_slots_that_do_not_split_over_data_are_rounded_up_with_one_note(eight_devices):
    """``BulkDecoder(batch_size=6)`` on data:4,model:2 holds 8 slots and says so in one warning line."""
    assert eight_devices["uneven_batch"] == 8
    (message,) = eight_devices["uneven_warnings"]
    assert "\n" not in message and "batch_size=6 decode slots rounded up to 8" in message


@pytest.mark.slow
def test_generate_command_on_a_mesh_writes_the_one_device_lines(eight_devices):
    """`specjax generate --mesh data:4,model:2` (greedy, γ 3), resuming after 5 lines already written, leaves the
    12 lines one device's bulk decode gives, in order; `--data-parallel --batch-size 13` over 8 devices rounds the
    slots up to 16 with one note and writes the same 12 lines."""
    r = eight_devices
    assert r["cli_status"] == 0
    assert r["cli_lines"] == r["cli_expected"] and len(r["cli_lines"]) == 12
    assert r["cli_uneven_status"] == 0
    assert r["cli_uneven_lines"] == r["cli_expected"]
    rounding = [line for line in r["cli_uneven_notes"] if "decode slots" in line]
    assert rounding == [
        "note: --batch-size 13 rounded up to 16 decode slots, a multiple of the data axis (8); outputs do not depend "
        "on the slot count."
    ]


def test_process_share_splits_lines_round_robin():
    """10 lines over 3 processes: process p gets lines p, p + 3, ...; the shares are disjoint and cover every
    line, in order."""
    pairs = [(i, [i]) for i in range(10)]
    shares = [list(process_share(iter(pairs), p, 3)) for p in range(3)]
    assert [[i for i, _ in s] for s in shares] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert list(process_share(iter(pairs), 0, 1)) == pairs
    with pytest.raises(ValueError, match=r"process_index 3 is not in \[0, 3\)"):
        process_share(iter(pairs), 3, 3)


class _Threads:
    """3 threads standing in for 3 processes: each gets its process index, and ``exchange`` stacks every thread's
    packed arrays (what ``process_allgather(tiled=False)`` returns on every process)."""

    def __init__(self, count: int):
        self.count, self.local = count, threading.local()
        self.slots: list = [None] * count
        self.barrier = threading.Barrier(count, timeout=600)
        self.rounds = [0] * count

    def processes(self):
        return self.local.index, self.count, self.exchange

    def exchange(self, tree: dict) -> dict:
        me = self.local.index
        self.rounds[me] += 1
        self.slots[me] = tree
        self.barrier.wait()
        out = {k: np.stack([self.slots[p][k] for p in range(self.count)]) for k in tree}
        self.barrier.wait()  # every thread has read this round before any writes the next
        return out


def test_processes_decode_their_shares_and_merge_in_input_order(tiny_pair, monkeypatch):  # noqa: F811
    """11 lines, temperature 1, γ 2, 2 slots: 3 stand-in processes each decode their share (lines i ≡ p mod 3) and
    every one yields all 11 lines in input order (rounds of 2 lines per process, the last ones short), each equal,
    token for token, to a one-process run with the same seed."""
    target, draft = tiny_pair
    rows = [list(r[r != 0]) for r in _inputs(np.random.default_rng(4), 11, 5, 6)]
    settings = dict(batch_size=2, gamma=2, max_decode_length=4, read_ahead=1)
    expected = list(BulkDecoder(target, draft, **settings).generate(rows, temperature=1.0, rng=3))
    threads = _Threads(3)
    monkeypatch.setattr(bulk, "_processes", threads.processes)
    got, lines_decoded, errors = [None] * 3, [0] * 3, []

    def process(p):
        threads.local.index = p
        try:
            decoder = BulkDecoder(target, draft, **settings)
            got[p] = list(decoder.generate(rows, temperature=1.0, rng=3))
            lines_decoded[p] = decoder.stats.lines
        except Exception as e:  # reported below; a thread's exception would otherwise be lost
            errors.append(e)
            threads.barrier.abort()

    workers = [threading.Thread(target=process, args=(p,)) for p in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    assert lines_decoded == [4, 4, 3]  # each process decoded only its share
    assert threads.rounds == [3, 3, 3]  # 2 rounds of results and the empty round that ends them
    for p in range(3):
        assert [r.index for r in got[p]] == list(range(11)), f"process {p}"
        for r, e in zip(got[p], expected):
            np.testing.assert_array_equal(r.tokens, e.tokens, err_msg=f"process {p}, line {e.index}")
            assert (r.num_target_calls, r.num_draft_tokens, r.num_accepted, r.num_verified) == (
                e.num_target_calls,
                e.num_draft_tokens,
                e.num_accepted,
                e.num_verified,
            )
            assert r.beta_sum == e.beta_sum  # float32 values: exact through the packed float32 arrays


def test_merge_of_one_process_is_its_own_stream(tiny_pair):  # noqa: F811
    """``merge_processes`` with a one-process exchange (each array stacked once) returns the stream unchanged."""
    target, draft = tiny_pair
    rows = [list(r[r != 0]) for r in _inputs(np.random.default_rng(5), 5, 5, 6)]
    results = list(BulkDecoder(target, draft, batch_size=2, gamma=2, max_decode_length=4).generate(rows, rng=1))
    one = lambda tree: {k: np.asarray(v)[None] for k, v in tree.items()}  # noqa: E731
    merged = list(merge_processes(iter(results), one, 2, 4))
    assert [r.index for r in merged] == list(range(5))
    for r, e in zip(merged, results):
        np.testing.assert_array_equal(r.tokens, e.tokens)
        assert r.gamma == e.gamma and r.beta_sum == e.beta_sum
