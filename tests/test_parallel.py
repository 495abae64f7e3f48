"""specjax.parallel: data parallel and model parallel decoding equal one device; meshes, rules, errors.

The multi-device checks run ``tests/_parallel_check.py`` in a subprocess with 8 forced CPU devices (this
process keeps one device) and assert on the JSON it prints. Mesh / rules errors are checked in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from specjax import T5Config, T5Model, parallel, temperature_sample
from specjax.models import t5

HERE = Path(__file__).parent
TINY = T5Config(
    vocab_size=64, d_model=32, num_heads=4, head_dim=8, mlp_dim=64, num_encoder_layers=2, num_decoder_layers=2
)


@pytest.fixture(scope="module")
def eight_devices() -> dict:
    """The JSON of ``_parallel_check.py`` run on 8 forced host devices."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(HERE / "_parallel_check.py")], capture_output=True, text=True, env=env, timeout=1800
    )
    assert proc.returncode == 0, f"_parallel_check.py failed:\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_eight_devices_and_mesh_shape(eight_devices):
    assert eight_devices["device_count"] == 8
    assert eight_devices["mesh_shape"] == {"data": 2, "model": 4}


@pytest.mark.parametrize(
    "case", ["greedy", "sampled", "speculative_sampled", "speculative_mixed", "speculative_multi_draft"]
)
def test_identical_to_one_device(eight_devices, case):
    r = eight_devices[case]
    assert r["data_parallel_equal"], f"{case}: data parallel over 8 devices differs from one device"
    assert r["mesh_equal"], f"{case}: mesh data:2,model:4 differs from one device"


@pytest.mark.parametrize("case", ["greedy", "sampled", "speculative_sampled"])
def test_thirteen_rows_come_back_in_order(eight_devices, case):
    r = eight_devices[case]
    assert r["rows"] == [13, 13]
    # Row-for-row equality with one device is an order check when the rows differ from one another (the
    # sampled cases; under greedy several rows are just [EOS]).
    if case != "greedy":
        assert r["distinct_rows"] == 13


def test_rows_finish_at_different_times(eight_devices):
    # The greedy case must exercise early finishes (EOS) on some devices while others run to T.
    lengths = eight_devices["greedy"]["lengths"]
    assert min(lengths) < 10 and max(lengths) == 10


def test_data_parallel_loops_are_per_device(eight_devices):
    # No collective anywhere in the data-parallel program: each device's while loop stops on its own rows.
    assert eight_devices["data_parallel_collectives"] == []


def test_pmap_over_the_core_equals_one_device(eight_devices):
    assert eight_devices["pmap_equal"], "jax.pmap over speculative_sample differs from one device"


def test_no_recompilation_for_same_shapes(eight_devices):
    before, after = eight_devices["compiled_programs"]
    # (temperature_sample, speculative_sample, speculative_sample with num_drafts=2 (static)) x (data parallel,
    # mesh): sampling values are traced arrays, so greedy and sampled calls (and mixed per-row settings) share one
    # program.
    assert before == 6
    assert after == before


def test_model_parallel_params_are_split(eight_devices):
    shards = eight_devices["shards"]
    model = 4
    expect = {  # parameter -> (global shape, dimension split over "model")
        "encoder/layers_0/attention/query/kernel": ([32, 32], 1),  # embed, joined_kv
        "encoder/layers_0/attention/out/kernel": ([32, 32], 0),  # joined_kv, embed
        "decoder/layers_1/mlp/wi_0/kernel": ([32, 64], 1),  # embed, mlp
        "decoder/layers_1/mlp/wo/kernel": ([64, 32], 0),  # mlp, embed
        "token_embedder/embedding": ([64, 32], 0),  # vocab, embed
        "decoder/logits_dense/kernel": ([32, 64], 1),  # embed, vocab
        "encoder/relpos_bias/rel_embedding": ([4, 32], 0),  # heads, relpos_buckets
    }
    for name, (shape, dim) in expect.items():
        s = shards[name]
        assert s["global"] == shape, name
        local = list(shape)
        local[dim] //= model
        assert s["shard_shapes"] == [local], (name, s)
        assert s["devices"] == 8
        assert s["spec"][dim] == "model" and all(a is None for i, a in enumerate(s["spec"]) if i != dim)
    norm = shards["encoder/encoder_norm/scale"]
    assert norm["shard_shapes"] == [[32]] and norm["spec"] == [None]
    # Every device holds about 1/4 of the parameters (all but the small layer-norm scales are split).
    total = eight_devices["param_bytes_total"]
    for dev, nbytes in eight_devices["param_bytes_per_device"].items():
        assert nbytes < total / model * 1.1, (dev, nbytes, total)
    assert eight_devices["draft_replicated"]


# ----------------------------------------------------------------------------------------------------------
# In-process: parsing, rules, errors (one device here)


def test_parse_mesh():
    assert parallel.parse_mesh("data:2,model:4") == {"data": 2, "model": 4}
    assert parallel.parse_mesh(" model:8 ") == {"data": 1, "model": 8}
    assert parallel.parse_mesh("data:8") == {"data": 8, "model": 1}


@pytest.mark.parametrize(
    "spec, words",
    [
        ("data2,model:4", "cannot read 'data2'"),
        ("data:2;model:4", "cannot read"),
        ("", "empty"),
        ("data:2,tensor:4", "unknown axis 'tensor'"),
        ("data:2,data:4", "given twice"),
        ("data:0,model:1", "size 0"),
        ("data:x", "cannot read"),
    ],
)
def test_malformed_mesh_is_a_clear_error(spec, words):
    with pytest.raises(ValueError, match="--mesh data:2,model:4") as e:
        parallel.make_mesh(spec)
    assert words in str(e.value)


def test_mesh_needing_other_device_count_is_a_clear_error():
    n = jax.device_count()
    with pytest.raises(ValueError) as e:
        parallel.make_mesh("data:2,model:4")
    msg = str(e.value)
    assert "2 x 4 = 8 devices" in msg and f"{n} cpu device(s)" in msg
    assert f"data:1,model:{n}" in msg and "xla_force_host_platform_device_count" in msg


def test_decode_fn_from_flags():
    assert parallel.decode_fn_from_flags(False, None).mode == "single"
    assert parallel.decode_fn_from_flags(True, None).mode == "data"
    with pytest.raises(ValueError, match="alternatives"):
        parallel.decode_fn_from_flags(True, "data:1,model:1")
    with pytest.raises(ValueError, match="devices but"):
        parallel.decode_fn_from_flags(False, "data:4,model:4")
    runner = parallel.decode_fn_from_flags(False, f"data:1,model:{jax.device_count()}")
    assert runner.mode == "mesh" and dict(runner.mesh.shape) == {"data": 1, "model": jax.device_count()}


def test_runner_modes_decode_like_the_plain_call():
    # One device here: the three modes run the same program logic and must agree exactly.
    model = T5Model.random(TINY, 0)
    tokens = np.array([[5, 6, 7, 1], [9, 1, 0, 0], [3, 4, 1, 0]], np.int32)
    kwargs = dict(rng=jax.random.PRNGKey(0), max_decode_length=4, temperature=1.0)
    ref = temperature_sample(model, tokens, **kwargs)
    for data_parallel, mesh in ((False, None), (True, None), (False, "data:1,model:1")):
        runner = parallel.decode_fn_from_flags(data_parallel, mesh)
        with runner.loading():
            placed, _ = runner.place(model)
        out = runner(temperature_sample, placed, tokens, **kwargs)
        np.testing.assert_array_equal(out.sequences, ref.sequences)
        np.testing.assert_array_equal(out.lengths, ref.lengths)


def test_rules_map_logical_axes_and_refuse_collisions():
    mesh = parallel.make_mesh(f"data:1,model:{jax.device_count()}")
    rules = parallel.STANDARD_RULES
    assert parallel.logical_to_mesh_spec(("embed", "mlp"), rules, mesh) == P(None, "model")
    assert parallel.logical_to_mesh_spec(("vocab", "embed"), rules, mesh) == P("model", None)
    assert parallel.logical_to_mesh_spec(("batch", None), rules, mesh) == P("data", None)
    bad = tuple((n, "model" if n == "embed" else a) for n, a in rules)
    with pytest.raises(ValueError, match="'embed' and 'mlp' both map to mesh axis 'model'"):
        parallel.logical_to_mesh_spec(("embed", "mlp"), bad, mesh, what="mlp/wi")
    with pytest.raises(ValueError, match="both map to mesh axis 'model'"):
        parallel.param_shardings(TINY, mesh, bad)
    with pytest.raises(ValueError, match="no rule"):
        parallel.logical_to_mesh_spec(("embed", "unknown"), rules, mesh)
    with pytest.raises(ValueError, match="twice"):
        parallel.logical_to_mesh_spec(("embed",), rules + (("embed", "model"),), mesh)
    with pytest.raises(ValueError, match="mesh lacks"):
        parallel.logical_to_mesh_spec(("embed",), (("embed", "tensor"),), mesh)


def test_every_t5_parameter_has_a_rule():
    mesh = parallel.make_mesh(f"data:1,model:{jax.device_count()}")
    shardings = parallel.param_shardings(TINY, mesh)
    assert len(jax.tree_util.tree_leaves(shardings)) == len(jax.tree_util.tree_leaves(t5.abstract_params(TINY)))


def test_wrong_function_is_a_clear_error():
    with pytest.raises(ValueError, match="temperature_sample or specjax.speculative_sample"):
        parallel.data_parallel_sample(print, None)


def test_maybe_initialize_distributed_is_a_noop_on_one_process(monkeypatch):
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    monkeypatch.setenv("SPECJAX_DISTRIBUTED", "0")
    assert parallel.maybe_initialize_distributed() is False
    monkeypatch.delenv("SPECJAX_DISTRIBUTED")
    assert parallel.maybe_initialize_distributed() is False
    assert jax.process_count() == 1
