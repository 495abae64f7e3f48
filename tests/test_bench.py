"""Smoke tests of the benchmark harness (nothing here is timed or compared against a time).

- The paper's formulas against hand-computed values.
- ``specjax bench`` end to end on a tiny random pair saved to temporary checkpoints, T5's real
  SentencePiece vocabulary (32128-row embeddings), 3 input lines, γ ∈ {1, 2}, temperatures 0 and 1: the
  Markdown / CSV tables hold the expected rows and columns with finite values, the PNGs are valid.
- The experiment files in ``configs/`` parse (twelve paper rows with the paper's numbers).
- transformers assisted generation against specjax speculative_sample on a tiny random pair with the same
  weights: greedy tokens equal, token for token.
- The profile reader on a jitted loop of known trip count and named scopes: iterations and per-scope time.
- CTranslate2 (converted with its own converter) against specjax on a tiny random target: greedy tokens equal.
- Drafting variants through ``specjax bench`` on the shipped mini pair (3 inputs, 6 tokens, T 0): token and
  block verification with a confidence threshold, prompt lookup (greedy outputs equal temperature_sample's),
  the variant columns, experiment-file keys, and one-line errors for bad flag combinations.
"""

from __future__ import annotations

import collections
import csv
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from specjax import T5Config, T5Model, bench, save_checkpoint
from specjax.cli import main

REPO = Path(__file__).parents[1]


def test_expected_improvement_hand_computed():
    # (1 − 0.8^4) / ((1 − 0.8)(3·0.1 + 1)) = 0.5904 / 0.26
    assert bench.expected_improvement(0.8, 3, 0.1) == pytest.approx(0.5904 / 0.26, rel=1e-12)
    assert bench.expected_improvement(0.8, 3, 0.1) == pytest.approx(2.2708, abs=1e-4)
    assert bench.expected_tokens_per_call(0.5, 1) == pytest.approx(1.5)
    assert bench.expected_tokens_per_call(0.0, 5) == pytest.approx(1.0)
    assert bench.expected_tokens_per_call(1.0, 4) == 5.0  # the α → 1 limit, γ + 1
    # The per-token α the theory takes inverts the tokens-per-call formula.
    for alpha, gamma in ((0.3, 1), (0.7, 4), (0.9, 7)):
        tau = bench.expected_tokens_per_call(alpha, gamma)
        assert bench.alpha_from_tokens_per_call(tau, gamma) == pytest.approx(alpha, abs=1e-7)
    assert bench.alpha_from_tokens_per_call(1.0, 3) == 0.0 and bench.alpha_from_tokens_per_call(4.0, 3) == 1.0
    # c = 0: the walltime improvement is the tokens per call.
    assert bench.expected_improvement(0.75, 7, 0.0) == pytest.approx((1 - 0.75**8) / 0.25)


def _tiny_pair(vocab: int, noise: float = 0.05):
    cfg = T5Config(
        vocab_size=vocab,
        d_model=32,
        num_heads=2,
        head_dim=16,
        mlp_dim=64,
        num_encoder_layers=1,
        num_decoder_layers=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        name="tiny",
    )
    target = T5Model.random(cfg, seed=0)
    rng = np.random.default_rng(1)
    # The draft: the target's weights plus noise, so α is strictly between 0 and 1.
    draft_params = jax.tree_util.tree_map(
        lambda x: (
            np.asarray(x) + noise * float(np.std(np.asarray(x))) * rng.standard_normal(x.shape).astype(np.float32)
        ),
        target.params,
    )
    return target, T5Model(cfg, draft_params)


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory, spiece_model):
    tmp = tmp_path_factory.mktemp("bench")
    target, draft = _tiny_pair(32128)
    save_checkpoint(target, tmp / "target")
    save_checkpoint(draft, tmp / "draft")
    (tmp / "in.en").write_text("A man rides a bike.\nTwo dogs play in the snow.\nA child eats an apple.\n")
    (tmp / "in.de").write_text("Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\nEin Kind isst einen Apfel.\n")
    out = tmp / "out"
    argv = [
        "bench",
        "--target",
        str(tmp / "target"),
        "--draft",
        str(tmp / "draft"),
        "--tokenizer",
        str(spiece_model),
        "--input",
        str(tmp / "in.en"),
        "--references",
        str(tmp / "in.de"),
        "--gammas",
        "1",
        "2",
        "--temperatures",
        "0",
        "1",
        "--max-decode-length",
        "6",
        "--cost-steps",
        "4",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    # --profile on the same shapes (compiled programs are reused in-process).
    prof = tmp / "prof"
    assert (
        main(
            argv[:-4]
            + [
                "--temperatures",
                "0",
                "--gammas",
                "1",
                "--no-plots",
                "--no-quality",
                "--profile",
                "--cost-steps",
                "4",
                "--out",
                str(prof),
            ]
        )
        == 0
    )
    return out, prof


def test_bench_markdown_table(bench_run):
    out, _ = bench_run
    lines = [l for l in (out / "table.md").read_text().splitlines() if l.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:6] == ["task", "draft", "temp", "γ", "α", "speedup"]  # the paper's Table 2 layout
    for col in (
        "expected (theory)",
        "measured/expected",
        "c",
        "tokens/call",
        "paper α",
        "quality (spec)",
        "accepted fraction",
        "mean accepted length",
        "accepted per position",
        "α source",
    ):
        assert col in header
    body = [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]
    assert len(body) == 4  # 2 temperatures x 2 γ
    assert sorted((r[2], r[3]) for r in body) == [("0", "1"), ("0", "2"), ("1", "1"), ("1", "2")]
    af = header.index("accepted fraction")
    for r in body:
        assert 0.0 <= float(r[4]) <= 1.0
        assert 0.0 <= float(r[af]) <= 1.0
        assert math.isfinite(float(r[5].rstrip("x"))) and float(r[5].rstrip("x")) > 0
        assert r[-2].startswith("bleu=")
    assert "jax " in (out / "table.md").read_text()


def test_bench_csv_and_json(bench_run):
    out, _ = bench_run
    with open(out / "table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    assert set(bench.CSV_COLUMNS) <= set(rows[0])
    for r in rows:
        for key in (
            "alpha",
            "accepted_fraction",
            "mean_accepted_length",
            "alpha_from_tokens",
            "speedup",
            "c",
            "expected_improvement",
            "speedup_over_expected",
            "tokens_per_call",
            "expected_tokens_per_call",
            "spec_tokens_per_s",
            "base_tokens_per_s",
            "spec_compile_seconds",
            "draft_step_ms",
            "target_window_ms",
        ):
            assert math.isfinite(float(r[key])), key
        assert 1.0 <= float(r["tokens_per_call"]) <= int(r["gamma"]) + 1
        assert 0.0 <= float(r["mean_accepted_length"]) <= int(r["gamma"])  # accepted drafts per iteration
        assert r["alpha_source"] in ("loop", "tokens_per_call")
        assert r["backend"] == jax.default_backend() and int(r["device_count"]) >= 1 and r["jax"] == jax.__version__
        if float(r["temperature"]) == 0:
            assert r["greedy_identical"] == "True"  # speculative == target-greedy, token for token
    results = json.loads((out / "results.json").read_text())
    assert len(results["records"][0]["alpha_rows"]) == 3  # α per input
    for rec in results["records"]:
        if rec["accepted_per_position"] is not None:  # how often draft position i was accepted
            assert len(rec["accepted_per_position"]) == rec["gamma"]
            # Position i+1 is tested only after position i was accepted.
            assert all(a >= b for a, b in zip(rec["accepted_per_position"], rec["accepted_per_position"][1:]))


def test_bench_pngs(bench_run):
    out, _ = bench_run
    for name in ("alpha_vs_gamma.png", "speedup_vs_gamma.png"):
        data = (out / name).read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_profile(bench_run):
    _, prof = bench_run
    text = (prof / "profile.md").read_text()
    for piece in (
        "**speculative**",
        "**baseline**",
        "thunks per iteration",
        "fixed per-call cost",
        "GB/s memory",
        "GFLOP/s matmul",
        "| verify |",
        "| draft |",
        "| accept |",
    ):
        assert piece in text, piece
    data = json.loads((prof / "profile.json").read_text())
    (p,) = data["profiles"]
    spec, base = p["speculative"], p["baseline"]
    assert spec["iterations"] >= 1 and base["iterations"] >= 1
    # The loop's thunk time is attributed to its scopes: draft, verify and accept all ran.
    for scope in ("draft", "verify", "accept"):
        assert spec["scope_ms_per_iteration"][scope] > 0
    assert base["scope_ms_per_iteration"]["step"] > 0
    assert spec["thunks_per_iteration"] > base["thunks_per_iteration"] > 0


def test_profile_reader_on_a_known_loop():
    """A jitted loop of 7 iterations, each a "draft" matmul in a nested loop of 3 and a "verify" matmul."""
    import jax.numpy as jnp

    from specjax.bench import profile

    @jax.jit
    def f(x, w):
        with jax.named_scope("encode"):
            x = jnp.tanh(x @ w)

        def body(i, x):
            with jax.named_scope("draft"):
                x = jax.lax.fori_loop(0, 3, lambda j, y: jnp.tanh(y @ w + j), x)
            with jax.named_scope("verify"):
                x = jnp.tanh(x @ w.T + i)
            return x

        return jax.lax.fori_loop(0, 7, body, x)

    x = jnp.ones((64, 256), jnp.float32)
    w = jnp.full((256, 256), 0.01, jnp.float32)
    calls = []
    p = profile.profile_calls(lambda j: calls.append(j) or f(x, w).block_until_ready(), 2)
    assert calls == [0, 0, 1, 0, 1]  # warm-up, two untraced, two traced
    assert p.calls == 2 and p.iterations == 14  # 7 iterations per call
    assert set(p.scope_ms_per_iteration) >= {"draft", "verify"}
    assert all(v > 0 for v in p.scope_ms_per_iteration.values())
    assert p.outside_loop_ms.get("encode", 0) > 0
    # Execution counts, not times (times on a shared machine are noise): each iteration runs the draft's
    # fused matmul+tanh 3 times (the nested loop) and the verify's once, each op attributed to its scope.
    counts = collections.defaultdict(list)
    for _op, scope, ms, per_iteration in p.top_ops:
        assert ms >= 0
        counts[scope].append(per_iteration)
    assert max(counts["draft"]) == pytest.approx(3.0) and max(counts["verify"]) == pytest.approx(1.0)
    assert p.thunks_per_iteration >= 4  # at least the 3 draft matmuls and the verify matmul
    # Outside the loop, per call: the encode's matmul once (the fixed per-call cost's thunks).
    encode_runs = [per_call for _op, scope, ms, per_call in p.top_outside_ops if scope == "encode"]
    assert encode_runs and max(encode_runs) == pytest.approx(1.0)
    assert all(ms >= 0 for _op, _s, ms, _c in p.top_outside_ops)


def test_protobuf_wire_reader():
    from specjax.bench.profile import _fields, _packed

    # field 1 varint 150 (the protobuf docs' example), field 2 string "hi", field 38 packed [3, 270]
    msg = bytes([0x08, 0x96, 0x01, 0x12, 0x02]) + b"hi" + bytes([0xB2, 0x02, 0x03, 0x03, 0x8E, 0x02])
    d = _fields(msg)
    assert d[1] == [150] and d[2] == [b"hi"] and _packed(d[38]) == [3, 270]


def test_model_costs_count_decoder_weights():
    from specjax.bench.profile import model_costs

    target, _ = _tiny_pair(96)
    c = model_costs(target)
    cfg = target.config
    d, f, L, v = cfg.d_model, cfg.mlp_dim, cfg.num_decoder_layers, cfg.vocab_size
    hd = cfg.num_heads * cfg.head_dim
    # Per layer: self-attention q, k, v, o; cross-attention q, o (k, v depend on the encoder only);
    # gated MLP wi_0, wi_1, wo; then the logits projection (untied) or the embedding (tied).
    per_layer = 4 * d * hd + 2 * d * hd + 3 * d * f
    expected = L * per_layer + (d * v)  # the logits projection: untied kernel or the tied embedding
    assert c["flops_per_token"] == 2 * expected
    assert c["step_weight_bytes"] == 4 * expected


def test_experiment_files_parse():
    meta, rows = bench.load_experiment(str(REPO / "configs" / "paper_table2.json"))
    assert len(rows) == 12
    assert {r.draft for r in rows} == {"T5-small", "T5-base", "T5-large"} and {r.target for r in rows} == {"T5-XXL"}
    assert {(r.task, r.temperature) for r in rows} == {(t, T) for t in ("EnDe", "CNNDM") for T in (0.0, 1.0)}
    assert all(r.paper_alpha is not None and r.paper_speedup is not None for r in rows)
    ende_small_t0 = [r for r in rows if (r.task, r.draft, r.temperature) == ("EnDe", "T5-small", 0.0)][0]
    assert (ende_small_t0.gammas, ende_small_t0.paper_alpha, ende_small_t0.paper_speedup) == ((7,), 0.75, 3.4)
    assert all(r.target_path.startswith("gs://t5-data/pretrained_models/t5x/t5_1_1_") for r in rows)
    _, rows = bench.load_experiment(str(REPO / "configs" / "mini_pair_cpu.json"))
    assert {r.task for r in rows} == {"multi30k", "newstest2014", "cnndm"}


def test_experiment_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "models": {"a": "x"},
                "tasks": {"t": {"input": "i"}},
                "rows": [{"task": "t", "target": "a", "draft": "nope", "temperature": 0, "gamma": 1}],
            }
        )
    )
    with pytest.raises(ValueError, match="draft 'nope'"):
        bench.load_experiment(str(bad))


def test_transformers_assisted_greedy_equals_specjax():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from specjax.bench import peers

    target, draft = _tiny_pair(96, noise=0.1)
    rows = [[5, 9, 23, 17, 1], [12, 80, 33, 2, 90, 4, 5, 1]]
    r = peers.compare_with_transformers(target, draft, rows, gamma=2, max_decode_length=8, temperatures=(0.0,))
    g = r["greedy"]
    assert g["matches_assisted"] == len(rows), g["mismatches"]
    assert g["matches_plain"] == len(rows), g["mismatches"]
    assert g["specjax_spec_tokens"] == g["hf_assisted_tokens"] > 0
    assert math.isfinite(g["hf_assisted_over_specjax_spec"]) and 0.0 <= g["specjax_accepted_fraction"] <= 1.0
    assert g["specjax_alpha"] is None or 0.0 <= g["specjax_alpha"] <= 1.0


def test_ctranslate2_greedy_equals_specjax(tmp_path):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'specjax[bench]')")
    pytest.importorskip("transformers")
    from specjax.bench import peers

    target, draft = _tiny_pair(96, noise=0.1)
    rows = [[5, 9, 23, 17, 1], [12, 80, 33, 2, 90, 4, 5, 1], [7, 7, 40, 1]]
    r = peers.compare_with_ctranslate2(
        target,
        draft,
        rows,
        gammas=(2,),
        max_decode_length=8,
        batch_sizes=(1, 2),
        compute_types=("float32", "int8"),
        threads=(1,),
        workdir=str(tmp_path),
    )
    by = {(x["batch_size"], x["method"]): x for x in r["records"]}
    for bs in (1, 2):
        # Same weights, float32, greedy: CTranslate2's tokens equal specjax's, line for line.
        assert by[(bs, "ctranslate2 float32 1 thread")]["identical"] == len(rows)
        assert by[(bs, "specjax speculative γ=2")]["identical"] == len(rows)
        assert (
            by[(bs, "ctranslate2 float32 1 thread")]["tokens"] == by[(bs, "specjax temperature_sample")]["tokens"] > 0
        )
        assert 0 <= by[(bs, "ctranslate2 int8 1 thread")]["identical"] <= len(rows)
        assert all(math.isfinite(x["tokens_per_s"]) and x["tokens_per_s"] > 0 for x in r["records"])
        assert r["best"][bs]["method"] == "specjax speculative γ=2"
    assert "| ctranslate2 int8 1 thread |" in peers.format_ctranslate2(r).replace(" (best)", "")


# ----------------------------------------------------------------------------------------------------------
# Drafting variants through `specjax bench`: the shipped mini pair, 3 inputs, 6 output tokens, T 0.

_VARIANT_INPUTS = "A man in a blue shirt is standing on a ladder.\nTwo dogs play in the snow.\nA girl in a red dress.\n"


def _bench_variants(tmp, *flags):
    """Runs `specjax bench` on the shipped pair with ``flags``; returns (out dir, results.json records)."""
    (tmp / "in.en").write_text(_VARIANT_INPUTS)
    out = tmp / "out"
    argv = [
        "bench",
        "--size",
        "mini",
        "--input",
        str(tmp / "in.en"),
        "--gammas",
        "2",
        "--temperatures",
        "0",
        "--max-decode-length",
        "6",
        "--cost-steps",
        "2",
        "--no-plots",
        "--no-quality",
        "--out",
        str(out),
        *flags,
    ]
    assert main(argv) == 0
    return out, json.loads((out / "results.json").read_text())["records"]


def _md_table(out):
    lines = [l for l in (out / "table.md").read_text().splitlines() if l.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return header, [dict(zip(header, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


@pytest.fixture(scope="module")
def variants_run(tmp_path_factory):
    return _bench_variants(
        tmp_path_factory.mktemp("variants"), "--verification", "token", "block", "--draft-confidence-threshold", "0.5"
    )


def test_bench_verification_and_confidence_sweep(variants_run):
    out, records = variants_run
    # verification x threshold, each against temperature_sample on the same 3 inputs.
    assert sorted((r["verification"], r["confidence_threshold"]) for r in records) == [("block", 0.5), ("token", 0.5)]
    for r in records:
        assert r["draft"] == "distilled" and r["gamma"] == 2 and r["num_inputs"] == 3 and r["max_ngram"] is None
        assert r["spec_tokens_per_s"] > 0 and r["base_tokens_per_s"] > 0 and math.isfinite(r["speedup"])
        assert 1.0 <= r["tokens_per_call"] <= 3.0 and 0.0 <= r["alpha"] <= 1.0
        assert r["greedy_identical"] is True  # T = 0: every variant equals target-greedy, token for token
        assert r["c"] > 0 and r["draft_step_ms"] > 0
    header, body = _md_table(out)
    assert header[:8] == ["task", "draft", "temp", "γ", "α", "speedup", "verification", "confidence threshold"]
    assert sorted((b["verification"], b["confidence threshold"]) for b in body) == [("block", "0.5"), ("token", "0.5")]
    assert all(float(b["spec tok/s"]) > 0 for b in body)
    assert "block = Sun et al. 2025" in (out / "table.md").read_text()
    with open(out / "table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["verification"], r["confidence_threshold"]) for r in rows) == [("block", "0.5"), ("token", "0.5")]
    assert all(r["greedy_identical"] == "True" for r in rows)


def test_bench_prompt_lookup(tmp_path):
    out, records = _bench_variants(tmp_path, "--draft", "prompt-lookup", "--max-ngram", "2")
    (r,) = records
    assert (r["draft"], r["verification"], r["confidence_threshold"], r["max_ngram"]) == (
        "prompt-lookup",
        "token",
        None,
        2,
    )
    assert r["spec_tokens_per_s"] > 0 and r["base_tokens_per_s"] > 0 and math.isfinite(r["speedup"])
    assert r["c"] == 0.0 and r["draft_step_ms"] is None  # no draft model
    assert r["greedy_identical"] is True  # prompt lookup at T = 0 equals temperature_sample, token for token
    header, (b,) = _md_table(out)
    assert header[:6] == ["task", "draft", "temp", "γ", "α", "speedup"] and "verification" not in header
    assert b["draft"] == "prompt-lookup" and float(b["spec tok/s"]) > 0
    with open(out / "table.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert (row["draft"], row["verification"], row["max_ngram"], row["greedy_identical"]) == (
        "prompt-lookup",
        "token",
        "2",
        "True",
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--draft", "prompt-lookup", "--draft-confidence-threshold", "0.5"], "needs a draft model"),
        (["--draft-confidence-threshold", "1.5"], "must be in [0, 1]"),
        (["--draft", "prompt-lookup", "--profile"], "--profile needs a draft model"),
        (["--draft", "prompt-lookup", "--max-ngram", "0"], "--max-ngram must be >= 1"),
    ],
)
def test_bench_bad_variant_flags(tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    assert main(["bench", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specjax bench: error: ") and message in err and "\n" not in err, err
    assert not out.exists()  # refused before anything loaded or ran


def test_bench_variant_flags_parse():
    from specjax.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "--verification", "token", "block", "--draft-confidence-threshold", "none", "0.3", "off"]
    )
    assert args.verification == ["token", "block"] and args.draft_confidence_threshold == [None, 0.3, None]
    args = build_parser().parse_args(["bench"])  # defaults: each row's (token, off)
    assert args.verification is None and args.draft_confidence_threshold is None and args.max_ngram is None
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", "--draft-confidence-threshold", "high"])
    assert e.value.code == 2


def test_bench_variant_columns_only_for_variants():
    base = {
        "task": "t",
        "draft": "d",
        "temperature": 0.0,
        "gamma": 2,
        "alpha": 0.5,
        "speedup": 1.0,
        "jax": "x",
        "backend": "cpu",
        "device_count": 1,
        "device_kind": "cpu",
    }
    assert "verification" not in bench.format_markdown([dict(base, verification="token", confidence_threshold=None)])
    assert "| verification | confidence threshold |" in bench.format_markdown(
        [dict(base, verification="block", confidence_threshold=None)]
    )
    assert {"verification", "confidence_threshold", "max_ngram"} <= set(bench.CSV_COLUMNS)


def test_experiment_file_variants(tmp_path):
    spec = {
        "models": {"t": "default:target", "d": "default:distilled"},
        "tasks": {"x": {"input": "in.en"}},
        "rows": [
            {
                "task": "x",
                "target": "t",
                "draft": "d",
                "temperature": 0,
                "gamma": [2, 3],
                "verification": ["token", "block"],
                "draft_confidence_threshold": [None, 0.4],
            },
            {"task": "x", "target": "t", "draft": "prompt-lookup", "temperature": 0, "gamma": 3, "max_ngram": 2},
        ],
    }
    path = tmp_path / "e.json"
    path.write_text(json.dumps(spec))
    _, (model_row, lookup_row) = bench.load_experiment(str(path))
    assert (model_row.verifications, model_row.confidence_thresholds) == (("token", "block"), (None, 0.4))
    assert (lookup_row.draft, lookup_row.draft_path, lookup_row.max_ngram) == ("prompt-lookup", "prompt-lookup", 2)
    assert (lookup_row.verifications, lookup_row.confidence_thresholds) == (("token",), (None,))
    for change, message in (
        ({"draft_confidence_threshold": 0.5}, "needs a draft model"),
        ({"verification": "tree"}, "verification must be one of"),
        ({"max_ngram": 0}, "max_ngram must be an int >= 1"),
    ):
        spec["rows"][1].update(change)
        path.write_text(json.dumps(spec))
        with pytest.raises(ValueError, match=message):
            bench.load_experiment(str(path))
        for key in change:
            spec["rows"][1].pop(key)
