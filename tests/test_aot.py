"""``specjax aot``: ahead-of-time TPU compiles of the decode programs on a CPU host (tiny T5 configs only).

The compile tests need libtpu (``pip install 'specjax[tpu-aot]'``) and are skipped, with that reason, without it.
References are independent of ``specjax.aot``: parameter bytes summed by hand from ``param_logical_axes``, loop
counts from a hand-written HLO module, memory from the shapes of the T5 1.1 XXL config.
"""

from __future__ import annotations

import importlib.util
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specjax import aot, parallel
from specjax.config import T5Config
from specjax.decoding import xla_cpu
from specjax.decoding.loop import speculative_sample
from specjax.models import t5

HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(
    not HAVE_LIBTPU, reason=f"libtpu is not installed (the TPU compiler): {aot.INSTALL_HINT}"
)

# Every dimension, and every shard of one over 4 devices, a multiple of 128: TPU arrays are stored in (8, 128)
# tiles, so narrower ones (d 32) would take up to 4x their bytes in padding and hide what is measured.
TINY = T5Config.preset("t5_1_1_small").replace(
    name="tiny",
    vocab_size=512,
    d_model=128,
    num_heads=4,
    head_dim=128,
    mlp_dim=512,
    num_encoder_layers=2,
    num_decoder_layers=2,
    dtype="bfloat16",
    param_dtype="bfloat16",
)
TINY_DRAFT = TINY.replace(name="tiny_draft", num_encoder_layers=1, num_decoder_layers=1)
SPLIT = ("heads", "joined_kv", "mlp", "vocab")  # what STANDARD_RULES put over "model"


def _hand_param_bytes(config: T5Config, model_ways: int) -> int:
    """Per-device bytes of ``config``'s parameters when every dimension named in ``SPLIT`` is cut ``model_ways``
    ways (at most one per tensor), from the logical axes and shapes alone."""
    axes = jax.tree_util.tree_leaves(t5.param_logical_axes(config), is_leaf=lambda x: isinstance(x, P))
    shapes = jax.tree_util.tree_leaves(t5.abstract_params(config))
    total = 0
    for spec, x in zip(axes, shapes, strict=True):
        ways = model_ways if any(name in SPLIT for name in spec if name) else 1
        total += math.prod(x.shape) * np.dtype(x.dtype).itemsize // ways
    return total


def _tokens(b=2, s=16):
    tokens = np.full((b, s), 3, np.int32)
    tokens[:, -1] = 1
    return tokens


def _abstract(config, sharding):
    params = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), t5.abstract_params(config)
    )
    return t5.T5Model(config, params)


# ----------------------------------------------------------------------------------------------------------
# Without a TPU compiler


def test_no_libtpu_message(monkeypatch, capsys):
    from specjax import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(aot.importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    assert cli.main(["aot", "--topology", "v4-8"]) == 2
    err = capsys.readouterr().err
    assert "libtpu" in err and "pip install 'specjax[tpu-aot]'" in err
    assert len(err.strip().splitlines()) == 1
    # an unknown topology is named first: nobody installs libtpu to learn the name was wrong
    assert cli.main(["aot", "--topology", "v9-8"]) == 2
    err = capsys.readouterr().err
    assert "Unknown TPU topology 'v9-8'" in err and "v4-8" in err and "libtpu" not in err


def test_loop_analysis_counts_a_hand_written_module():
    hlo = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%inner_cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%inner_body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %r = f32[8]{0} all-reduce(%x), to_apply=%add
  ROOT %t = (s32[], f32[8]) tuple(%i, %r)
}

%cond (p: (pred[], bf16[4,16])) -> pred[] {
  %p = (pred[], bf16[4,16]) parameter(0)
  %d = pred[] get-tuple-element(%p), index=0
  %all = pred[] all-reduce(%d), to_apply=%add
  ROOT %n = pred[] not(%all)
}

%body (p: (pred[], bf16[4,16])) -> (pred[], bf16[4,16]) {
  %p = (pred[], bf16[4,16]) parameter(0)
  %c = bf16[4,16]{1,0} get-tuple-element(%p), index=1
  %g = bf16[4,64]{1,0} all-gather(%c), dimensions={1}
  %w = (s32[], f32[8]) while(%init), condition=%inner_cond, body=%inner_body
  %k = bf16[4,16]{1,0} copy(%c)
  ROOT %t = (pred[], bf16[4,16]) tuple(%d, %k)
}

ENTRY %main (x: bf16[4,16]) -> (pred[], bf16[4,16]) {
  %x = bf16[4,16]{1,0} parameter(0)
  %scan = (s32[], f32[8]) while(%init), condition=%inner_cond, body=%inner_body
  ROOT %loop = (pred[], bf16[4,16]) while(%x), condition=%cond, body=%body
}
"""
    loop = aot.loop_analysis(hlo, cache_layer_bytes=4 * 16 * 2)
    assert loop["top_level_whiles"] == 2 and loop["decode_loops"] == 1 and loop["layer_loops"] == [3]
    # per iteration: the inner loop's all-reduce 3 times (f32[8]: 32 bytes) + the condition's (pred: 1 byte)
    assert loop["collectives"]["all-reduce"] == {"count": 4, "bytes": 3 * 32 + 1}
    assert loop["collectives"]["all-gather"] == {"count": 1, "bytes": 4 * 64 * 2}
    assert loop["cache_copies"] == {"count": 1, "bytes": 128}
    assert loop["host_transfers"] == [] and loop["host_callbacks"] == []


def test_expected_speedup_is_the_papers_formula():
    # Leviathan et al. 2023 §3, α .75, γ 7, c .02: (1 - .75^8) / (.25 * 1.14) = 3.157...
    assert aot.expected_speedup(0.75, 7, 0.02) == pytest.approx((1 - 0.75**8) / (0.25 * (7 * 0.02 + 1)))
    assert aot.expected_speedup(0.75, 7, 0.02, window=1.2) == pytest.approx((1 - 0.75**8) / (0.25 * (0.14 + 1.2)))
    assert aot.expected_speedup(1.0, 3, 0.0) == pytest.approx(4.0)


def test_cpu_programs_keep_their_cpu_choices():
    """Abstract parameters placed on CPU devices (or with no sharding, on this CPU host) take the CPU paths."""
    cpu = NamedSharding(jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:1]), ("data",)), P())
    fns, params = _abstract(TINY, cpu).decoding_model()
    assert fns.kv_dtype == "float32"
    table = params["token_embedder"]["embedding"]
    assert isinstance(table, jax.ShapeDtypeStruct) and table.dtype == jnp.float32
    assert xla_cpu.program_platform(params) == "cpu"
    if xla_cpu.few_row_dots() and not xla_cpu._user_chose(xla_cpu.SMALL_DOT_OPTIONS):
        assert xla_cpu.cpu_compiler_options(8, jnp.float32, "cpu") is not None


# ----------------------------------------------------------------------------------------------------------
# Compiled for a deviceless TPU v4 slice


@needs_libtpu
def test_tpu_programs_take_the_tpu_choices():
    devices = aot.topology_devices("v4-8")
    assert len(devices) == 4 and all(d.platform == "tpu" for d in devices)
    tpu = NamedSharding(parallel.make_mesh("data:1,model:4", devices=list(devices)), P())
    fns, params = _abstract(TINY, tpu).decoding_model()
    assert fns.kv_dtype is None  # no float32 attention memory: that is XLA:CPU's choice
    assert params["token_embedder"]["embedding"].dtype == jnp.bfloat16  # no float32 embedding copy
    assert xla_cpu.program_platform(params) == "tpu"
    assert xla_cpu.cpu_compiler_options(8, jnp.float32, "tpu") is None


@needs_libtpu
@pytest.mark.parametrize("mode", ["model", "data"])
def test_tiny_pair_compiles_for_v4(mode):
    """Model parallel (data:1,model:4) and data parallel (4 loops) programs of a tiny pair compile for a v4-8
    slice: one decode loop at top level, nothing sent to the host, arguments = the sharded parameters."""
    devices = list(aot.topology_devices("v4-8"))
    if mode == "model":
        mesh = parallel.make_mesh("data:1,model:4", devices=devices)
        rep = NamedSharding(mesh, P())
        program = parallel.model_parallel_program(
            speculative_sample, _abstract(TINY, rep), _abstract(TINY_DRAFT, rep), _tokens(), mesh=mesh,
            gamma=3, max_decode_length=8, max_input_length=16,
        )  # fmt: skip
        expected = _hand_param_bytes(TINY, 4) + _hand_param_bytes(TINY_DRAFT, 1)
    else:
        rep = NamedSharding(jax.sharding.Mesh(np.asarray(devices), ("data",)), P())
        program = parallel.data_parallel_program(
            speculative_sample, _abstract(TINY, rep), _abstract(TINY_DRAFT, rep), _tokens(), devices=devices,
            gamma=3, max_decode_length=8, max_input_length=16,
        )  # fmt: skip
        expected = _hand_param_bytes(TINY, 1) + _hand_param_bytes(TINY_DRAFT, 1)
    compiled = program.trace().lower().compile()
    loop = aot.loop_analysis(compiled.as_text())
    assert loop["decode_loops"] == 1
    assert loop["host_transfers"] == [] and loop["host_callbacks"] == []
    text = compiled.as_text()
    for op in (" infeed(", " outfeed(", " send(", " recv(", "callback"):
        assert op not in text
    if mode == "data":  # a loop per device: no collective inside it
        assert all(v["count"] == 0 for v in loop["collectives"].values())
    arguments = compiled.memory_analysis().argument_size_in_bytes
    assert arguments == pytest.approx(expected, rel=0.10)


@needs_libtpu
def test_report_keys_and_pieces(tmp_path, capsys):
    """The CLI on a config.json (no weights) writes the issue's JSON keys; the pieces are costed."""
    from specjax import cli

    cfg = {
        "model_type": "t5",
        "vocab_size": 512,
        "d_model": 128,
        "d_kv": 128,
        "d_ff": 512,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": 4,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    }
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "report.json"
    argv = ["aot", "--topology", "v4-8", "--target", str(tmp_path / "tiny"), "--draft", str(tmp_path / "tiny")]
    argv += ["--gamma", "3", "--batch", "2", "--input-length", "16", "--output-length", "8", "--programs", "none"]
    assert cli.main(argv + ["--mesh", "data:2,model:2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mesh"] == {"data": 2, "model": 2} and report["programs"] == []
    for name in ("target_step", "target_window", "draft_step"):
        piece = report["pieces"][name]
        assert piece["compiled"] and piece["flops"] > 0 and piece["bytes_accessed"] > 0
        assert piece["cost_model_seconds"] == max(piece["hbm_seconds"], piece["mxu_seconds"])
        assert piece["hbm_seconds"] == pytest.approx(piece["bytes_accessed"] / 1.2e12)
        assert 0 < piece["hbm_traffic_bytes"] <= piece["bytes_accessed"]  # each HBM buffer once, not per access
        assert piece["estimate_seconds"] == max(piece["hbm_traffic_bytes"] / 1.2e12, piece["mxu_seconds"])
        assert piece["floor_bytes"] < piece["decoder_floor_bytes"]  # a step reads no cross-attention key kernel
    for suffix, key in (("", "estimate_seconds"), ("_cost_model", "cost_model_seconds")):
        step = report["pieces"]["target_step"][key]
        assert report["c" + suffix] == pytest.approx(report["pieces"]["draft_step"][key] / step)
        window = report["pieces"]["target_window"][key]
        assert report["window_over_step" + suffix] == pytest.approx(window / step)
    assert "projections" in report and "cost model" in capsys.readouterr().out


@needs_libtpu
def test_too_big_is_refused_before_compiling():
    """T5 1.1 XXL in float32 (44.6 GB of weights) on one v5e chip (16 GiB): a one-line error naming a mesh that
    fits; that mesh's estimate is checked against the weights' bytes by hand."""
    with pytest.raises(aot.DoesNotFit) as info:
        aot.compile_report("v5e-1", "t5_1_1_xxl", "t5_1_1_small", dtype="float32", programs=(), pieces=False)
    message = str(info.value)
    assert "\n" not in message and "16 GiB" in message and "--mesh data:" in message
    assert "--topology v5e-" in message  # one chip holds no mesh: a bigger slice is named
    xxl = T5Config.preset("t5_1_1_xxl").replace(dtype="float32", param_dtype="float32")
    weights = sum(math.prod(x.shape) * 4 for x in jax.tree_util.tree_leaves(t5.abstract_params(xxl)))
    assert 44e9 < weights < 46e9 and weights > aot.CHIPS["v5e"].hbm_bytes
    model = int(message.rsplit("model:", 1)[1].split()[0])  # the mesh named as the fix
    assert weights / model < aot.CHIPS["v5e"].hbm_bytes
    # the default mesh for the paper's setup (bfloat16, one v4 chip) is the chip itself
    assert aot.choose_mesh(
        "v4-1", xxl.replace(dtype="bfloat16", param_dtype="bfloat16"), T5Config.preset("t5_1_1_small"),
        batch=1, input_length=512, output_length=128, gamma=7,
    ) == (1, 1)  # fmt: skip
    # batch 1 on a v4-8: every chip splits the model (README's table row), never data:4 with three filler rows;
    # batch 8: the data axis takes the rows, the model fitting one chip
    bf16, small = xxl.replace(dtype="bfloat16", param_dtype="bfloat16"), T5Config.preset("t5_1_1_small")
    shape = dict(input_length=512, output_length=128, gamma=7)
    assert aot.choose_mesh("v4-8", bf16, small, batch=1, **shape) == (1, 4)
    assert aot.choose_mesh("v4-8", bf16, small, batch=8, **shape) == (4, 1)


TRAFFIC_HLO = """HloModule traffic

%fused_row (param_0: bf16[1024,256], param_1: s32[]) -> bf16[1,256] {
  %param_0 = bf16[1024,256]{1,0} parameter(0)
  %param_1 = s32[]{:T(128)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  ROOT %row = bf16[1,256]{1,0:S(3)} dynamic-slice(%param_0, %param_1, %zero), dynamic_slice_sizes={1,256}
}

%fused_write (param_0: bf16[64,256], param_1: bf16[1,256], param_2: s32[]) -> bf16[64,256] {
  %param_0 = bf16[64,256]{1,0} parameter(0)
  %param_1 = bf16[1,256]{1,0} parameter(1)
  %param_2 = s32[]{:T(128)} parameter(2)
  %zero = s32[]{:T(128)} constant(0)
  ROOT %dus = bf16[64,256]{1,0} dynamic-update-slice(%param_0, %param_1, %param_2, %zero)
}

ENTRY %main (kernel: bf16[256,512], table: bf16[1024,256], cache: bf16[64,256], id: s32[]) -> bf16[1,512] {
  %kernel = bf16[256,512]{1,0} parameter(0)
  %table = bf16[1024,256]{1,0} parameter(1)
  %cache = bf16[64,256]{1,0} parameter(2)
  %id = s32[]{:T(128)} parameter(3)
  %prefetch = (bf16[256,512]{1,0:S(3)}, bf16[256,512]{1,0}, u32[]{:S(2)}) copy-start(%kernel)
  %on_chip = bf16[256,512]{1,0:S(3)} copy-done(%prefetch)
  %embedded = bf16[1,256]{1,0:S(3)} fusion(%table, %id), kind=kLoop, calls=%fused_row
  %written = bf16[64,256]{1,0} fusion(%cache, %embedded, %id), kind=kLoop, calls=%fused_write
  ROOT %out = bf16[1,512]{1,0} dot(%embedded, %on_chip), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_hbm_traffic_counts_each_buffer_once():
    """``hbm_traffic`` on a hand-written module: a kernel prefetched on chip (``S(3)``) counts its HBM bytes once,
    not for the copy's on-chip side nor again for the dot reading it there; an embedding row looked up from a
    [1024, 256] table counts one row; an in-place cache write counts the row written, not the cache."""
    traffic = aot.hbm_traffic(TRAFFIC_HLO)
    kernel, row, out, index = 256 * 512 * 2, 256 * 2, 512 * 2, 4  # the int32 id is read by both fusions
    assert traffic["by_opcode"] == {"copy-start": kernel, "fusion": 2 * row + 2 * index, "dot": out}
    assert traffic["bytes"] == kernel + 2 * row + 2 * index + out


NESTED_HLO = """HloModule nested

%pick (param_0: bf16[4,256,512], param_1: s32[]) -> bf16[256,512] {
  %param_0 = bf16[4,256,512]{2,1,0} parameter(0)
  %param_1 = s32[]{:T(128)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  %s = bf16[1,256,512]{2,1,0} dynamic-slice(%param_0, %param_1, %zero, %zero), dynamic_slice_sizes={1,256,512}
  ROOT %b = bf16[256,512]{1,0} bitcast(%s)
}

%layer (param_0: bf16[4,256,512], param_1: s32[], param_2: bf16[8,256]) -> bf16[8,512] {
  %param_0 = bf16[4,256,512]{2,1,0} parameter(0)
  %param_1 = s32[]{:T(128)} parameter(1)
  %param_2 = bf16[8,256]{1,0:S(3)} parameter(2)
  %kernel = bf16[256,512]{1,0} fusion(%param_0, %param_1), kind=kLoop, calls=%pick
  ROOT %d = bf16[8,512]{1,0:S(3)} dot(%param_2, %kernel), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (stack: bf16[4,256,512], i: s32[], x: bf16[8,256]) -> bf16[8,512] {
  %stack = bf16[4,256,512]{2,1,0} parameter(0)
  %i = s32[]{:T(128)} parameter(1)
  %x = bf16[8,256]{1,0:S(3)} parameter(2)
  ROOT %y = bf16[8,512]{1,0:S(3)} fusion(%stack, %i, %x), kind=kOutput, calls=%layer
}
"""


def test_hbm_traffic_reads_a_stacked_kernel_sliced_in_a_nested_fusion():
    """A scanned layer's fusion takes the whole stack [4, 256, 512] of a kernel and slices its layer inside a
    nested fusion: one layer's kernel (256 x 512 bf16) is read, not the stack; plus the int32 index."""
    assert aot.hbm_traffic(NESTED_HLO)["bytes"] == 256 * 512 * 2 + 4
    # a nested fusion that hands the parameter on whole (a bitcast to its output) reads it all
    whole = NESTED_HLO.replace(
        "%s = bf16[1,256,512]{2,1,0} dynamic-slice(%param_0, %param_1, %zero, %zero), dynamic_slice_sizes={1,256,512}",
        "%s = bf16[4,256,512]{2,1,0} bitcast(%param_0)",
    )
    assert aot.hbm_traffic(whole)["bytes"] == 4 * 256 * 512 * 2  # (the index, now unused, is not read)


# ----------------------------------------------------------------------------------------------------------
# One decode-loop iteration read from HLO; bulk decoding's slot programs

LOOP_HLO = """HloModule loop

%fused_dot (param_0: bf16[4,16], param_1: bf16[16,8]) -> bf16[4,8] {
  %param_0 = bf16[4,16]{1,0} parameter(0)
  %param_1 = bf16[16,8]{1,0} parameter(1)
  ROOT %d = bf16[4,8]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%layer_cond (p: (s32[], bf16[4,16])) -> pred[] {
  %p = (s32[], bf16[4,16]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%layer_body (p: (s32[], bf16[4,16])) -> (s32[], bf16[4,16]) {
  %p = (s32[], bf16[4,16]) parameter(0)
  %x = bf16[4,16]{1,0} get-tuple-element(%p), index=1
  %w = bf16[16,16]{1,0} constant({...})
  %c = bf16[4,16]{1,0} convolution(%x, %w), dim_labels=bf_io->bf
  ROOT %t = (s32[], bf16[4,16]) tuple(%i, %c)
}

%cheap (p: bf16[4,16]) -> bf16[4,16] {
  %p = bf16[4,16]{1,0} parameter(0)
  ROOT %n = bf16[4,16]{1,0} negate(%p)
}

%costly (p: bf16[4,16]) -> bf16[4,16] {
  %p = bf16[4,16]{1,0} parameter(0)
  %a = bf16[4,16]{1,0} negate(%p)
  ROOT %b = bf16[4,16]{1,0} negate(%a)
}

%cond (p: (pred[], bf16[4,16])) -> pred[] {
  %p = (pred[], bf16[4,16]) parameter(0)
  ROOT %d = pred[] get-tuple-element(%p), index=0
}

%body (p: (pred[], bf16[4,16])) -> (pred[], bf16[4,16]) {
  %p = (pred[], bf16[4,16]) parameter(0)
  %x = bf16[4,16]{1,0} get-tuple-element(%p), index=1
  %k = bf16[16,8]{1,0} constant({...})
  %y = bf16[4,8]{1,0} fusion(%x, %k), kind=kOutput, calls=%fused_dot
  %l = (s32[], bf16[4,16]) while(%init), condition=%layer_cond, body=%layer_body
  %z = bf16[4,16]{1,0} conditional(%d, %x, %x), branch_computations={%cheap, %costly}
  %o = token[] outfeed(%z, %tok)
  ROOT %t = (pred[], bf16[4,16]) tuple(%d, %z)
}

ENTRY %main (x: bf16[4,16]) -> (pred[], bf16[4,16]) {
  %x = bf16[4,16]{1,0} parameter(0)
  %cb = bf16[4,16]{1,0} custom-call(%x), custom_call_target="xla_python_cpu_callback"
  ROOT %loop = (pred[], bf16[4,16]) while(%x), condition=%cond, body=%body
}
"""


def test_loop_iteration_costs_of_a_hand_written_module():
    """Per iteration of the data-dependent loop: the fusion's dot (4x16 @ 16x8) once, the layer loop's convolution
    (4x16 @ 16x16) 3 times; a conditional counts its costlier branch only; host transfers found anywhere."""
    it = aot.loop_iteration_costs(LOOP_HLO)
    assert it["flops"] == 2 * 4 * 8 * 16 + 3 * (2 * 4 * 16 * 16)
    x = 4 * 16 * 2  # bytes of a bf16[4,16]
    # the fusion reads x and its kernel (a constant operand, in HBM) and writes y;
    # the costly branch negates twice (read + write each); the outfeed reads z
    fused = x + 16 * 8 * 2 + 4 * 8 * 2
    assert it["by_opcode"]["fusion"] == fused
    assert it["by_opcode"]["negate"] == 2 * (x + x)
    assert it["bytes"] == sum(it["by_opcode"].values())
    assert aot.hbm_traffic(LOOP_HLO)["by_opcode"]["negate"] == 3 * (x + x)  # a whole-program read: every branch
    assert aot.program_flops(LOOP_HLO) == it["flops"]  # the only dots are in the loop, which runs once here
    # attention's batched dot as XLA:TPU writes it: the rows and heads as base-dilated spatial dimensions, so each
    # output multiplies one position: [8 rows, 64 heads, 2 queries] x 64 head dims -> 512 memory slots
    batched = """HloModule attend

ENTRY %main (q: bf16[8,64,2,64], k: bf16[8,64,64,512]) -> f32[8,64,2,512] {
  %q = bf16[8,64,2,64]{3,2,1,0} parameter(0)
  %k = bf16[8,64,64,512]{3,2,1,0} parameter(1)
  ROOT %s = f32[8,64,2,512]{3,2,1,0} convolution(%q, %k), window={size=8x64 stride=7x63 lhs_dilate=8x64}, LABELS
}
""".replace("LABELS", "dim_labels=01bf_01io->01bf")
    assert aot.program_flops(batched) == 2 * (8 * 64 * 2 * 512) * 64
    assert sorted(aot.host_transfers(LOOP_HLO)) == ["custom-call cb", "outfeed o"]
    assert aot.loop_analysis(LOOP_HLO)["host_transfers"] == ["outfeed"]


@needs_libtpu
def test_bulk_slot_programs_compile_for_v4(tmp_path):
    """``specjax aot --bulk-slots``: the slot insert and the run loop (γ 2 and the target alone) of a tiny pair
    compile for a v4-8 slice; nothing in them talks to the host; the target alone's iteration moves about the
    weights a decoder step reads (summed by hand from the shapes); tokens/s per chip is slots x E(α, γ) / the
    iteration's time / chips, E summed term by term."""
    from specjax import cli

    out = tmp_path / "bulk.json"
    cfg = {
        "model_type": "t5", "vocab_size": 512, "d_model": 128, "d_kv": 128, "d_ff": 512, "num_layers": 1,
        "num_decoder_layers": 1, "num_heads": 4, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
    }  # fmt: skip
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(cfg))
    tiny = str(tmp_path / "tiny")
    argv = ["aot", "--topology", "v4-8", "--target", tiny, "--draft", tiny, "--bulk-slots", "8", "--gamma", "2"]
    argv += ["--input-length", "16", "--output-length", "8", "--mesh", "data:2,model:2", "--alpha", "0.6"]
    assert cli.main(argv + ["--json", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = {p["name"]: p for p in report["programs"]}
    assert set(runs) == {"empty", "insert", "run_gamma_2", "run_gamma_0"} and all(p["compiled"] for p in runs.values())
    insert = runs["insert"]
    assert insert["host_transfers"] == []
    assert insert["estimate_seconds"] == max(insert["hbm_traffic_bytes"] / 1.2e12, insert["flops"] / 275e12)
    # at least the target encoder's kernels (1 layer: 4 attention + 3 MLP, 128 x 512 each, split 2 ways) over the
    # 2 inserted rows x 16 tokens, split over data:2
    assert insert["flops"] >= 2 * (7 * 128 * 512 // 2) * (2 * 16 // 2)
    config = aot.resolve_config(tiny, "bfloat16")
    axes = jax.tree_util.tree_leaves(t5.param_logical_axes(config), is_leaf=lambda x: isinstance(x, P))
    flat = jax.tree_util.tree_flatten_with_path(t5.abstract_params(config))[0]
    step = whole = 0  # the decoder's weights but the cross-attention key / value kernels: split 2 ways where
    for spec, (path, x) in zip(axes, flat, strict=True):  # SPLIT says (the target), and whole (the draft)
        name = jax.tree_util.keystr(path)
        if "'decoder'" in name and not ("encoder_decoder_attention" in name and ("'key'" in name or "'value'" in name)):
            step += math.prod(x.shape) * 2 // (2 if any(a in SPLIT for a in spec if a) else 1)
            whole += math.prod(x.shape) * 2
    for g in (2, 0):
        run = runs[f"run_gamma_{g}"]
        assert run["loop"]["decode_loops"] == 1
        assert run["host_transfers"] == [] and run["loop"]["host_transfers"] == run["loop"]["host_callbacks"] == []
        seconds = max(run["iteration"]["bytes"] / 1.2e12, run["iteration"]["flops"] / 275e12)
        tokens = sum(0.6**i for i in range(g + 1))
        assert run["tokens_per_second_per_chip"] == pytest.approx(8 * tokens / seconds / 4)
    # the loop's arguments hold both decoders' step weights (the encoders' are pruned: the loop never encodes)
    assert runs["run_gamma_2"]["bytes_per_device"]["arguments"] >= step + whole
    assert 0.9 * step <= runs["run_gamma_0"]["iteration"]["bytes"] <= 1.5 * step
    # the speculative iteration adds the draft's γ steps (replicated: every weight of a step, unsplit)
    assert runs["run_gamma_2"]["iteration"]["bytes"] >= runs["run_gamma_0"]["iteration"]["bytes"] + 0.9 * step


# ----------------------------------------------------------------------------------------------------------
# Multi-draft: the k-branch window and the paper's rows with k drafts


def test_multi_draft_tokens_model():
    """k = 1 is the paper's E(α, γ); the model reproduces the small pair's measured k / k = 1 tokens per call
    (γ 5, each row with its own measured α) within 0.5 % at temperature 0 and 2 % at temperature 1; and a
    simulation of the branch point (position 1 accepted with probability a_k, later positions with α, until the
    first rejection; fixed seed, 200,000 calls: the standard error of the mean is below 0.004) gives the
    formula's E_k."""
    from specjax.aot import projection

    assert projection.multi_draft_tokens(0.75, 7, 1, 0) == pytest.approx((1 - 0.75**8) / 0.25)
    one = {0: 0.375, 1: 0.460}  # α of k = 1 in the same measurement
    for (t, k), m in projection.MULTI_DRAFT_MEASURED.items():
        e1 = (1 - one[t] ** 6) / (1 - one[t])
        model = projection.multi_draft_tokens(m["alpha"], 5, k, t) / e1
        assert model == pytest.approx(m["tokens_ratio"], rel=0.005 if t == 0 else 0.02)
    rng = np.random.default_rng(0)
    alpha, gamma, k = 0.75, 7, 4
    a = alpha + (1 - alpha) * projection.branch_recovery(0, k)
    n = 200_000
    accepted = np.concatenate([rng.random((n, 1)) < a, rng.random((n, gamma - 1)) < alpha], axis=1)
    run = np.cumprod(accepted, axis=1).sum(axis=1)  # accepted draft tokens before the first rejection
    assert abs((run + 1).mean() - projection.multi_draft_tokens(alpha, gamma, k, 0)) < 4 * 0.004
    with pytest.raises(ValueError, match="k=3"):
        projection.branch_recovery(0, 3)


@needs_libtpu
def test_multi_draft_pieces_and_projection():
    """``compile_report(num_drafts=(1, 2))`` on a tiny pair named as the paper's T5-small draft: the 2-branch
    window and the draft's step over 2 rows compile, and each k = 2 projection is E_2 / (γ c_2 + w_2) recomputed
    from the pieces' estimates, E_2 = 1 + a_2 (1 - α^γ) / (1 - α) written out here."""
    draft = TINY_DRAFT.replace(name="t5_1_1_small")
    report = aot.compile_report(
        "v4-8", TINY, draft, gamma=7, batch=2, input_length=16, output_length=8, mesh="data:2,model:2",
        programs=(), num_drafts=(1, 2), branch_gammas=(7,),
    )  # fmt: skip
    pieces = report["pieces"]
    for name in ("target_branches_2_7", "draft_step_k2"):
        assert pieces[name]["compiled"] and pieces[name]["hbm_traffic_bytes"] > 0
    step = pieces["target_step"]["estimate_seconds"]
    w2 = pieces["target_branches_2_7"]["estimate_seconds"] / step
    c2 = pieces["draft_step_k2"]["estimate_seconds"] / step
    assert report["window_over_step_branches"]["2_7"] == pytest.approx(w2)
    rows = [r for r in report["multi_draft_projections"] if r["num_drafts"] == 2]
    assert {(r["task"], r["temperature"]) for r in rows} == {("EnDe", 0), ("EnDe", 1)}  # the γ 7 rows of T5-small
    measured = {0: (0.139, 0.371), 1: (0.117, 0.458)}
    for r in rows:
        alpha, (later, first) = r["paper_alpha"], measured[r["temperature"]]
        a2 = alpha + (1 - alpha) * later / (1 - first)
        e2 = 1 + a2 * (1 - alpha**7) / (1 - alpha)
        assert r["projected_speedup"] == pytest.approx(e2 / (7 * c2 + w2), abs=1e-3)  # rounded to 3 places
