"""``specjax train``: deterministic given the seed, resumable from its own checkpoints, and the
loss goes down; DistillSpec's objective is the forward KL, checked against numpy."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import serialization

from specjax import train as tr
from specjax.cli import main


@pytest.fixture(scope="module")
def vocab500(tmp_path_factory, data_dir):
    """The 500-piece vocabulary ``specjax train --vocab-size 500`` trains on Multi30k (the same call), made once
    per module: runs that pass it with --vocab skip the 10–20 s SentencePiece training, which is deterministic,
    so they tokenize exactly as a run that trains its own."""
    d = data_dir / "train" / "multi30k"
    return tr.train_sentencepiece([d / "train.en", d / "train.de"], tmp_path_factory.mktemp("vocab") / "spiece", 500)


def _run(tmp_path, name, steps, data_dir, extra=(), vocab=None):
    """``specjax train`` of the mini draft on 600 Multi30k pairs; trains its vocabulary unless ``vocab``."""
    d = data_dir / "train" / "multi30k"
    vocab_args = ("--vocab", str(vocab)) if vocab else ("--vocab-size", "500")
    args = [
        "train",
        "--run-dir",
        str(tmp_path / name),
        "--model",
        "draft",
        "--source",
        str(d / "train.en"),
        "--target-text",
        str(d / "train.de"),
        *vocab_args,
        "--max-examples",
        "600",
        "--tokens-per-batch",
        "256",
        "--steps",
        str(steps),
        "--seed",
        "3",
        *extra,
    ]
    assert main(args) == 0
    return serialization.msgpack_restore((tmp_path / name / "state.msgpack").read_bytes())


def test_train_is_deterministic_and_resumable(tmp_path, data_dir):
    # With dropout: its key is a function of (seed, step), so a resumed run draws the same masks.
    straight = _run(tmp_path, "a", 4, data_dir, ("--dropout", "0.1", "--snapshot-every", "2"))  # trains a vocab
    vocab = tmp_path / "a" / "spiece.model"  # the others tokenize with run a's vocabulary
    _run(tmp_path, "b", 2, data_dir, ("--dropout", "0.1"), vocab=vocab)
    resumed = _run(tmp_path, "b", 4, data_dir, ("--dropout", "0.1"), vocab=vocab)  # same command, more steps
    snaps = sorted(p.name for p in (tmp_path / "a" / "snapshots").iterdir())
    assert snaps == ["step_2.msgpack", "step_4.msgpack"]
    snap4 = serialization.msgpack_restore((tmp_path / "a" / "snapshots" / "step_4.msgpack").read_bytes())
    for a, b in zip(jax_leaves(snap4), jax_leaves(straight["params"])):
        np.testing.assert_array_equal(a, b)
    without = _run(tmp_path, "n", 4, data_dir, vocab=vocab)  # dropout off: a different (deterministic) trajectory
    assert any(not np.array_equal(a, b) for a, b in zip(jax_leaves(without["params"]), jax_leaves(straight["params"])))
    assert int(straight["step"]) == int(resumed["step"]) == 4
    flat_a = jax_leaves(straight["params"])
    flat_b = jax_leaves(resumed["params"])
    for a, b in zip(flat_a, flat_b):
        np.testing.assert_array_equal(a, b)
    log = [json.loads(l) for l in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert log and np.isfinite(log[-1]["loss"])


def jax_leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def test_distill_loss_is_forward_kl():
    rng = np.random.default_rng(0)
    s, t = rng.normal(size=(2, 3, 7)), rng.normal(size=(2, 3, 7))
    targets = np.array([[4, 2, 0], [1, 0, 0]])
    p_t = np.exp(t) / np.exp(t).sum(-1, keepdims=True)
    p_s = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    kl = (p_t * (np.log(p_t) - np.log(p_s))).sum(-1)
    w = targets > 0
    np.testing.assert_allclose(float(tr.distill_loss(s, t, targets)), kl[w].mean(), rtol=1e-5)
    ce, count = tr.cross_entropy_loss(s, targets)
    nll = -np.log(np.take_along_axis(p_s, targets[..., None], -1)[..., 0])
    np.testing.assert_allclose(float(ce), nll[w].mean(), rtol=1e-5)
    assert float(count) == 3


def test_label_smoothed_cross_entropy_matches_numpy_soft_targets():
    """Label smoothing (Szegedy et al. 2016, §7) against an explicit soft-target cross-entropy in NumPy: 1 - ε
    on the reference, ε / (V - 1) on every other token, padding (target 0) excluded; ε = 0 is the plain NLL,
    and the gradient pulls the non-reference logits up (the point of smoothing), unlike the plain loss's."""
    import jax

    rng = np.random.default_rng(1)
    V, eps = 11, 0.1
    s = rng.normal(size=(2, 4, V)).astype(np.float32) * 3
    targets = np.array([[4, 2, 7, 0], [1, 10, 0, 0]])
    logp = s - np.log(np.exp(s).sum(-1, keepdims=True))
    q = np.full(s.shape, eps / (V - 1))
    np.put_along_axis(q, targets[..., None], 1 - eps, -1)
    assert np.allclose(q.sum(-1), 1.0)
    w = targets > 0
    want = -(q * logp).sum(-1)[w].mean()
    got, count = tr.cross_entropy_loss(s, targets, label_smoothing=eps)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    assert float(count) == w.sum()
    plain = -np.take_along_axis(logp, targets[..., None], -1)[..., 0][w].mean()
    np.testing.assert_allclose(float(tr.cross_entropy_loss(s, targets, label_smoothing=0.0)[0]), plain, rtol=1e-5)
    assert abs(want - plain) > 1e-2  # the two differ on these logits, so the comparison above can fail
    # d loss / d logits = softmax - q at each counted position, / the count; zero at padding
    g = np.asarray(jax.grad(lambda x: tr.cross_entropy_loss(x, targets, label_smoothing=eps)[0])(s))
    want_g = (np.exp(logp) - q) * w[..., None] / w.sum()
    np.testing.assert_allclose(g, want_g, atol=1e-6)
    with pytest.raises(ValueError, match="label_smoothing"):
        tr.TrainConfig(label_smoothing=1.0)
    with pytest.raises(ValueError, match="reference"):
        tr.TrainConfig(objective="distill", label_smoothing=0.1)


def test_train_refuses_bad_input(tmp_path, data_dir, capsys):
    with pytest.raises(ValueError, match="objective"):
        tr.TrainConfig(objective="magic")
    d = data_dir / "train" / "multi30k"
    code = main(
        [
            "train",
            "--run-dir",
            str(tmp_path / "c"),
            "--model",
            "draft",
            "--source",
            str(d / "train.en"),
            "--target-text",
            str(d / "train.de"),
            "--vocab-size",
            "500",
            "--max-examples",
            "50",
            "--objective",
            "distill",
        ]
    )
    assert code == 2
    assert "--teacher" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()  # the failed run left no half-written directory behind
    code = main(
        [
            "train",
            "--run-dir",
            str(tmp_path / "d"),
            "--model",
            "draft",
            "--source",
            str(d / "train.en"),
            "--target-text",
            str(d / "train.de"),
            "--vocab-size",
            "500",
            "--max-examples",
            "600",
            "--tokens-per-batch",
            "1000000",
        ]
    )
    assert code == 2
    assert "lower --tokens-per-batch" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    # A missing text file without --vocab: named before the vocabulary would be trained on it.
    for flag, other in (("--source", "--target-text"), ("--target-text", "--source")):
        code = main(
            [
                "train",
                "--run-dir",
                str(tmp_path / "s"),
                "--model",
                "draft",
                flag,
                str(tmp_path / "no.txt"),
                other,
                str(d / "train.de"),
            ]
        )
        assert code == 2
        err = capsys.readouterr().err
        assert f"{flag} {tmp_path / 'no.txt'} does not exist" in err and "Traceback" not in err
        assert not (tmp_path / "s").exists()


def test_dropout_drops_at_the_rate_and_scales_the_rest():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from specjax.models import t5

    class Drop(nn.Module):
        rate: float

        @nn.compact
        def __call__(self, x):
            return t5._dropout(self, x, self.rate)

    x = jnp.ones((200, 500), jnp.float32)
    y = np.asarray(Drop(0.1).apply({}, x, rngs={"dropout": jax.random.PRNGKey(0)}))
    dropped = (y == 0).mean()
    # 100,000 Bernoulli(0.1) draws: standard deviation 0.00095; 5 sigma bounds (significance ~6e-7).
    assert abs(dropped - 0.1) < 5 * np.sqrt(0.1 * 0.9 / y.size)
    np.testing.assert_allclose(y[y != 0], 1 / 0.9, rtol=1e-6)  # inverted dropout: expectation kept
    np.testing.assert_array_equal(np.asarray(Drop(0.0).apply({}, x)), np.asarray(x))  # no rng needed at 0
    # Independent decisions: neighbours (along both axes) and the masks of two keys are both dropped at rate²;
    # every row and column is dropped near the rate (no structure from the generator's counter). Each count
    # is within 5 binomial standard deviations (significance ~6e-7 each, ~5e-4 for all 703 together).
    d = y == 0
    z = np.asarray(Drop(0.1).apply({}, x, rngs={"dropout": jax.random.PRNGKey(1)})) == 0
    for both in (d[:, 1:] & d[:, :-1], d[1:] & d[:-1], d & z):
        assert abs(both.mean() - 0.01) < 5 * np.sqrt(0.01 * 0.99 / both.size)
    assert (d != z).any()
    rows, cols = d.mean(1), d.mean(0)
    assert np.all(np.abs(rows - 0.1) < 5 * np.sqrt(0.09 / 500)) and np.all(np.abs(cols - 0.1) < 5 * np.sqrt(0.09 / 200))
    # the same key, the same mask; any dtype keeps it
    y2 = np.asarray(Drop(0.1).apply({}, x.astype(jnp.bfloat16), rngs={"dropout": jax.random.PRNGKey(0)}))
    np.testing.assert_array_equal(y2 == 0, d)


def test_logits_with_dropout_are_random_only_in_training():
    import jax

    from specjax.config import T5Config
    from specjax.models import t5

    cfg = T5Config(
        vocab_size=50, d_model=16, num_heads=2, head_dim=8, mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1
    )
    params = t5.init_params(cfg, 0)
    enc = np.array([[5, 6, 7, 1]], np.int32)
    dec = np.array([[0, 8, 9]], np.int32)
    plain = np.asarray(t5.logits(cfg, params, enc, dec))
    a = np.asarray(t5.logits(cfg, params, enc, dec, dropout_rate=0.3, dropout_rng=jax.random.PRNGKey(1)))
    b = np.asarray(t5.logits(cfg, params, enc, dec, dropout_rate=0.3, dropout_rng=jax.random.PRNGKey(1)))
    c = np.asarray(t5.logits(cfg, params, enc, dec, dropout_rate=0.3, dropout_rng=jax.random.PRNGKey(2)))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - plain).max() > 1e-3 and np.abs(a - c).max() > 1e-3
    with pytest.raises(ValueError, match="dropout_rng"):
        t5.logits(cfg, params, enc, dec, dropout_rate=0.3)
    with pytest.raises(ValueError, match="dropout_rate"):
        tr.TrainConfig(dropout_rate=1.0)


def test_model_config_json_sets_the_size(tmp_path, data_dir, capsys, vocab500):
    """``--model-config`` trains the size it names (T5Config fields, a run's config.json, or HF config.json)."""
    from specjax.cli.train import load_model_config
    from specjax.config import T5Config

    fields = {
        "d_model": 24,
        "num_heads": 3,
        "head_dim": 8,
        "mlp_dim": 40,
        "num_encoder_layers": 1,
        "num_decoder_layers": 2,
        "name": "probe",
    }
    (tmp_path / "size.json").write_text(json.dumps(fields))
    _run(tmp_path, "m", 1, data_dir, ("--model-config", str(tmp_path / "size.json")), vocab=vocab500)
    saved = json.loads((tmp_path / "m" / "config.json").read_text())["model"]
    assert {k: saved[k] for k in fields} == fields and saved["vocab_size"] == 500  # vocab from the tokenizer
    state = serialization.msgpack_restore((tmp_path / "m" / "state.msgpack").read_bytes())
    assert state["params"]["decoder"]["layers_1"]["mlp"]["wi_0"]["kernel"].shape == (24, 40)
    assert "layers_1" not in state["params"]["encoder"]
    # The run's own config.json reads back as the same config; so does the HF form of it.
    cfg = load_model_config(tmp_path / "m" / "config.json")
    assert cfg == T5Config(**saved)
    (tmp_path / "hf.json").write_text(json.dumps(cfg.to_hf_config()))
    assert load_model_config(tmp_path / "hf.json").replace(name="probe") == cfg
    (tmp_path / "bad.json").write_text(json.dumps({"d_model": 24, "layers": 3}))
    d = data_dir / "train" / "multi30k"
    code = main(
        [
            "train",
            "--run-dir",
            str(tmp_path / "e"),
            "--model-config",
            str(tmp_path / "bad.json"),
            "--source",
            str(d / "train.en"),
            "--target-text",
            str(d / "train.de"),
            "--vocab-size",
            "500",
            "--max-examples",
            "600",
        ]
    )
    assert code == 2
    assert "layers" in capsys.readouterr().err and not (tmp_path / "e").exists()


def test_sigterm_keeps_the_trained_steps(tmp_path, data_dir, vocab500):
    """A job manager's SIGTERM (a session ending) saves the resume point as Ctrl-C does: with no periodic save
    due (--save-every 10000), state.msgpack appears holding the steps done, and the process ends cleanly."""
    import os
    import signal
    import subprocess
    import sys
    import time

    d = data_dir / "train" / "multi30k"
    run = tmp_path / "t"
    cmd = [
        sys.executable,
        "-m",
        "specjax",
        "train",
        "--run-dir",
        str(run),
        "--model",
        "draft",
        "--source",
        str(d / "train.en"),
        "--target-text",
        str(d / "train.de"),
        "--vocab",
        str(vocab500),
        "--max-examples",
        "600",
        "--tokens-per-batch",
        "256",
        "--steps",
        "100000",
        "--seed",
        "3",
        "--snapshot-every",
        "1",
        "--save-every",
        "10000",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    try:
        deadline = time.time() + 600
        while not (run / "snapshots" / "step_1.msgpack").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "no training step within 600 s"
            time.sleep(0.5)
        assert not (run / "state.msgpack").exists()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "Traceback" not in err, err
    state = serialization.msgpack_restore((run / "state.msgpack").read_bytes())
    assert int(state["step"]) >= 1


def test_resume_from_parameters_alone_continues_the_schedule_with_a_rewarm(tmp_path, data_dir, vocab500):
    """The portable resume point (``--init-from CKPT --start-step N``: parameters only, fresh Adam moments):
    the run continues at step N of the learning-rate schedule, and its first update is scaled by
    1/REWARM_STEPS. Adam's first step moves every coordinate with a non-zero gradient by exactly the learning
    rate (|m̂/√v̂| = 1), so the largest change after one resumed step must be lr(N)/REWARM_STEPS (plus the
    decoupled weight decay), not lr(N). Also runs that step with bfloat16 activations (--compute-dtype)."""
    import jax
    import optax

    from specjax.checkpoints import save_checkpoint
    from specjax.config import T5Config
    from specjax.models.t5 import T5Model

    sched_args = ("--warmup-steps", "1", "--learning-rate", "1e-3")
    a = _run(tmp_path, "a", 2, data_dir, sched_args, vocab=vocab500)
    config = T5Config(**json.loads((tmp_path / "a" / "config.json").read_text())["model"])
    save_checkpoint(T5Model(config, jax.tree_util.tree_map(np.asarray, a["params"])), tmp_path / "p", format="hf")
    b = _run(
        tmp_path,
        "b",
        3,
        data_dir,
        (*sched_args, "--init-from", str(tmp_path / "p"), "--start-step", "2", "--compute-dtype", "bfloat16"),
        vocab=vocab500,
    )
    assert int(b["step"]) == 3
    counts = [int(x) for x in jax.tree_util.tree_leaves(b["opt_state"]) if np.ndim(x) == 0]
    assert sorted(counts) == [1, 3]  # Adam's own count started again; the schedule's continued from 2
    lr = float(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 1, 3, end_value=1e-4)(2))
    wd = tr.TrainConfig().weight_decay
    deltas, bounds = [], []
    for w0, w1 in zip(jax_leaves(a["params"]), jax_leaves(b["params"])):
        deltas.append(np.abs(np.asarray(w1, np.float64) - w0).max())
        wmax = np.float32(np.abs(w0).max())  # float32 parameters: w1 - w0 is exact only to 2 ulps of |w|
        bounds.append((lr / tr.REWARM_STEPS) * (1 + wd * wmax) * 1.001 + 2 * np.spacing(wmax))
    assert all(d <= bd for d, bd in zip(deltas, bounds)), (deltas, bounds)
    assert max(deltas) >= 0.5 * lr / tr.REWARM_STEPS  # it did move, by about lr/REWARM_STEPS
    assert json.loads((tmp_path / "b" / "rewarm.json").read_text()) == {"rewarm_from": 2}


def test_start_step_needs_init_from(tmp_path):
    from specjax.cli.train import _model_sizes

    src = tgt = [np.arange(2, 12, dtype=np.int32)] * 40
    with pytest.raises(ValueError, match="--init-from"):
        tr.train(
            _model_sizes()["draft"],
            tr.TrainConfig(num_steps=4, tokens_per_batch=256),
            src,
            tgt,
            tmp_path / "r",
            start_step=2,
            progress=False,
        )


def test_cached_teacher_log_probs_equal_the_teachers_own_and_the_same_distill_loss(tmp_path):
    """``teacher_log_probs`` (DistillSpec's teacher distributions, computed once): each pair's rows equal the
    teacher's log_softmax computed for that pair alone, unpadded (float16 rounding: 2e-2 absolute at
    log-probabilities down to ~-10), and one distill step from the cache gives the loss of one step that runs
    the teacher, to 1e-3 relative."""
    import jax

    from specjax.cli.train import _model_sizes
    from specjax.models import t5
    from specjax.models.t5 import T5Model

    config = _model_sizes()["draft"].replace(vocab_size=300)
    teacher = T5Model(config, t5.init_params(config, 7))
    rng = np.random.default_rng(0)
    src = [rng.integers(2, 300, rng.integers(3, 20)).astype(np.int32) for _ in range(70)]
    tgt = [rng.integers(2, 300, rng.integers(3, 30)).astype(np.int32) for _ in range(70)]
    lp, offsets = tr.teacher_log_probs(teacher, src, tgt, tmp_path / "t.f16", tokens_per_batch=256, progress=False)
    assert lp.shape == (sum(len(t) for t in tgt), 300) and offsets[-1] == lp.shape[0]
    for i in (0, 13, 69):
        ref = jax.nn.log_softmax(t5.logits(config, teacher.params, src[i][None], tr.shift_right(tgt[i][None])))[0]
        np.testing.assert_allclose(
            lp[offsets[i] : offsets[i + 1]].astype(np.float32), np.asarray(ref), atol=2e-2, rtol=0
        )
    losses = {}
    for cache in (True, False):
        tc = tr.TrainConfig(objective="distill", num_steps=1, tokens_per_batch=256, cache_teacher=cache)
        tr.train(config, tc, src, tgt, tmp_path / f"run_{cache}", teacher=teacher, progress=False)
        losses[cache] = json.loads((tmp_path / f"run_{cache}" / "log.jsonl").read_text().splitlines()[-1])["loss"]
    assert (tmp_path / "run_True" / "teacher_logprobs.f16").exists()
    assert not (tmp_path / "run_False" / "teacher_logprobs.f16").exists()
    assert abs(losses[True] - losses[False]) <= 1e-3 * abs(losses[False]), losses
    assert losses[False] > 0.0


def test_bfloat16_matmul_equals_the_plain_einsum_forward_and_backward():
    """``t5._dense_matmul`` (Dense's product: bfloat16 x bfloat16 -> float32 dots, forward and backward, for XLA:CPU's
    native bfloat16 path) gives the plain bfloat16 einsum's values and gradients: both accumulate in float32
    and round once to bfloat16, so they agree to one bfloat16 rounding (rtol 2^-7) and mostly exactly; float32
    operands take the plain einsum."""
    import jax
    import jax.numpy as jnp

    from specjax.models import t5

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 5, 64)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((64, 48)), jnp.bfloat16)

    def loss(mm):
        return lambda x, w: jnp.sum(jnp.sin(mm(x, w).astype(jnp.float32)))

    plain = lambda a, b: jnp.einsum("...i,io->...o", a, b)
    got, want = jax.jit(t5._dense_matmul)(x, w), plain(x, w)
    assert got.dtype == jnp.bfloat16 and got.shape == (3, 5, 48)
    grads = jax.jit(jax.grad(loss(t5._dense_matmul), (0, 1)))(x, w)
    refs = jax.jit(jax.grad(loss(plain), (0, 1)))(x, w)
    for a, b in [(got, want), *zip(grads, refs)]:
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=2**-7, atol=1e-6)
        assert np.mean(a == b) > 0.9
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.bfloat16]
    x32 = jnp.asarray(rng.standard_normal((2, 64)), jnp.float32)
    np.testing.assert_array_equal(t5._dense_matmul(x32, w.astype(jnp.float32)), plain(x32, w.astype(jnp.float32)))


def test_embedding_lr_multiplier_scales_the_embeddings_adamw_step_alone():
    """``embedding_lr_multiplier`` k: the token embedding's update is exactly k times plain AdamW's (its
    learning rate and so its decoupled weight decay, PyTorch's param-group semantics), every other parameter's
    is plain AdamW's, checked over three steps against an independent NumPy AdamW."""
    rng = np.random.default_rng(0)
    params = {
        "token_embedder": {"embedding": rng.normal(size=(6, 4)).astype(np.float32)},
        "decoder": {"logits_dense": {"kernel": (0.1 * rng.normal(size=(4, 6))).astype(np.float32)}},
    }
    grads = [
        jax.tree_util.tree_map(lambda v: (0.01 * rng.normal(size=v.shape)).astype(np.float32), params) for _ in range(3)
    ]
    base = dict(learning_rate=1e-2, warmup_steps=1, num_steps=10, weight_decay=0.1)

    def run(k):
        opt = tr._optimizer(tr.TrainConfig(**base, embedding_lr_multiplier=k))
        p, state, updates = params, opt.init(params), []
        for g in grads:
            u, state = opt.update(g, state, p)
            p = jax.tree_util.tree_map(lambda a, b: a + b, p, u)
            updates.append(u)
        return updates

    def numpy_adamw(x, gs, lr_mult):  # optax.adamw(b1=0.9, b2=0.98, eps=1e-8) with global-norm clip 1
        m = v = np.zeros_like(x)
        out = []
        for t, g in enumerate(gs, start=1):
            lr = lr_mult * float(tr.optax.warmup_cosine_decay_schedule(0.0, 1e-2, 1, 10, end_value=1e-3)(t - 1))
            m, v = 0.9 * m + 0.1 * g, 0.98 * v + 0.02 * g * g
            u = -lr * ((m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.98**t)) + 1e-8) + 0.1 * x)
            out.append(u)
            x = x + u
        return out

    for k in (1.0, 22.6):
        got = run(k)
        emb = [g["token_embedder"]["embedding"] for g in grads]
        ker = [g["decoder"]["logits_dense"]["kernel"] for g in grads]
        # global norms stay below 1 here, so the clip is the identity
        assert all(np.sqrt(sum(float(np.sum(a**2)) for a in jax.tree_util.tree_leaves(g))) < 1 for g in grads)
        want_emb = numpy_adamw(params["token_embedder"]["embedding"], emb, k)
        want_ker = numpy_adamw(params["decoder"]["logits_dense"]["kernel"], ker, 1.0)
        for u, we, wk in zip(got, want_emb, want_ker):
            np.testing.assert_allclose(u["token_embedder"]["embedding"], we, rtol=2e-5, atol=1e-9)
            np.testing.assert_allclose(u["decoder"]["logits_dense"]["kernel"], wk, rtol=2e-5, atol=1e-9)
    with pytest.raises(ValueError, match="--embedding-lr-multiplier"):
        tr.TrainConfig(embedding_lr_multiplier=0.0)


def test_adafactor_matches_shazeer_and_sterns_algorithm_in_numpy():
    """``optimizer="adafactor"``: three steps equal an independent NumPy Adafactor (Shazeer & Stern 2018,
    Algorithm 4 with β̂2_t = 1 - t^-0.8, update clipping d = 1 (§6), relative step size ρ_t times
    max(ε2, RMS(x)) (§8), ε1 = 1e-30, ε2 = 1e-3; factored second moments for a matrix whose two dimensions
    are >= 128, a full one otherwise) with t5x's settings (no momentum, no global-norm clip), plus the
    decoupled weight decay -ρ_t · wd · x and the same warmup-cosine schedule as AdamW."""
    rng = np.random.default_rng(1)
    params = {
        "a": {"kernel": (0.04 * rng.normal(size=(128, 136))).astype(np.float32)},
        "b": {"scale": (1.0 + 0.1 * rng.normal(size=(6,))).astype(np.float32)},
        "c": {"kernel": (0.0005 * rng.normal(size=(4, 6))).astype(np.float32)},
    }  # RMS below ε2
    grads = [
        jax.tree_util.tree_map(lambda v: (rng.normal(size=v.shape) * rng.uniform(0.01, 3)).astype(np.float32), params)
        for _ in range(3)
    ]
    wd = 0.1
    opt = tr._optimizer(
        tr.TrainConfig(learning_rate=1e-2, warmup_steps=1, num_steps=10, weight_decay=wd, optimizer="adafactor")
    )
    p, state, got = params, opt.init(params), []
    for g in grads:
        u, state = opt.update(g, state, p)
        p = jax.tree_util.tree_map(lambda a, b: a + b, p, u)
        got.append(u)

    def numpy_adafactor(x, gs):
        x = x.astype(np.float64)
        factored = x.ndim == 2 and min(x.shape) >= 128
        vr, vc, v = np.zeros(x.shape[0]), np.zeros(x.shape[1] if x.ndim == 2 else 1), np.zeros_like(x)
        out = []
        for t, g in enumerate(gs, start=1):
            g = g.astype(np.float64)
            beta = 1.0 - t**-0.8
            g2 = g * g + 1e-30
            if factored:
                vr = beta * vr + (1 - beta) * g2.mean(axis=1)
                vc = beta * vc + (1 - beta) * g2.mean(axis=0)
                vhat = np.outer(vr, vc) / vr.mean()
            else:
                v = beta * v + (1 - beta) * g2
                vhat = v
            u = g / np.sqrt(vhat)
            u = u / max(1.0, np.sqrt(np.mean(u * u)))
            rho = float(tr.optax.warmup_cosine_decay_schedule(0.0, 1e-2, 1, 10, end_value=1e-3)(t - 1))
            u = -(rho * max(1e-3, np.sqrt(np.mean(x * x))) * u + rho * wd * x)
            out.append(u)
            x = x + u
        return out

    for path in (("a", "kernel"), ("b", "scale"), ("c", "kernel")):
        want = numpy_adafactor(params[path[0]][path[1]], [g[path[0]][path[1]] for g in grads])
        for u, w in zip(got, want):
            np.testing.assert_allclose(u[path[0]][path[1]], w, rtol=1e-4, atol=1e-10)
    with pytest.raises(ValueError, match="--optimizer"):
        tr.TrainConfig(optimizer="sgd")


def test_resuming_with_another_optimizer_is_refused(tmp_path, data_dir, vocab500, capsys):
    _run(tmp_path, "r", 2, data_dir, vocab=vocab500)
    d = data_dir / "train" / "multi30k"
    code = main(
        [
            "train",
            "--run-dir",
            str(tmp_path / "r"),
            "--model",
            "draft",
            "--source",
            str(d / "train.en"),
            "--target-text",
            str(d / "train.de"),
            "--vocab",
            str(vocab500),
            "--max-examples",
            "600",
            "--tokens-per-batch",
            "256",
            "--steps",
            "4",
            "--seed",
            "3",
            "--optimizer",
            "adafactor",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--optimizer adamw" in err and "Traceback" not in err
    adafactor = _run(tmp_path, "f", 2, data_dir, ("--optimizer", "adafactor", "--weight-decay", "0"), vocab=vocab500)
    assert all(np.isfinite(a).all() for a in jax_leaves(adafactor["params"]))


def test_t5x_dropout_style_draws_t5xs_masks_in_t5xs_places():
    """``dropout_style="t5x"`` draws the masks t5x's ``examples/t5/network.py`` draws, with its shapes: the
    embeddings, every sub-layer output and the decoder's final norm shared along the length axis ([b, 1, d]),
    the encoder's final norm independent ([b, s, d]), the attention weights shared by the queries
    ([b, n, 1, keys]) and the MLP's hidden layer shared along the length axis ([b, 1, mlp]); "sublayers" draws
    independent [b, length, d] masks on the embeddings, sub-layer outputs and final norms only. The shapes are
    read from the traced program's RngBitGenerator calls (one per mask)."""
    import jax

    from specjax.config import T5Config
    from specjax.models import t5

    cfg = T5Config(
        vocab_size=50, d_model=16, num_heads=2, head_dim=8, mlp_dim=24, num_encoder_layers=2, num_decoder_layers=1
    )
    params = t5.init_params(cfg, 0)
    b, s, t = 3, 5, 4
    enc = np.tile(np.array([[5, 6, 7, 8, 1]], np.int32), (b, 1))
    dec = np.tile(np.array([[0, 8, 9, 10]], np.int32), (b, 1))

    def mask_shapes(style):
        jaxpr = jax.make_jaxpr(
            lambda p, key: t5.logits(cfg, p, enc, dec, dropout_rate=0.2, dropout_rng=key, dropout_style=style)
        )(params, jax.random.PRNGKey(0))
        shapes = []

        def walk(jp):
            for eqn in jp.eqns:
                if eqn.primitive.name == "rng_bit_generator":
                    shapes.append(tuple(eqn.outvars[1].aval.shape))
                for v in eqn.params.values():  # sub-programs: jit (ClosedJaxpr), custom_vjp, ...
                    for sub in v if isinstance(v, (tuple, list)) else (v,):
                        if hasattr(sub, "eqns"):
                            walk(sub)
                        elif hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                            walk(sub.jaxpr)

        walk(jaxpr.jaxpr)
        return sorted(shapes)

    d, n, m = cfg.d_model, cfg.num_heads, cfg.mlp_dim
    # encoder: embedding, 2 × (attention out, mlp out), final norm; decoder: embedding, 3 sub-layers, final norm
    assert mask_shapes("sublayers") == sorted([(b, s, d)] * 6 + [(b, t, d)] * 5)
    want = (
        [(b, 1, d)] * 5
        + [(b, s, d)]  # encoder: embedding + 4 sub-layer outputs shared; final independent
        + [(b, n, 1, s)] * 2
        + [(b, 1, m)] * 2  # encoder: attention weights, MLP hidden, per layer
        + [(b, 1, d)] * 5  # decoder: embedding, 3 sub-layer outputs, final norm
        + [(b, n, 1, t), (b, n, 1, s), (b, 1, m)]
    )  # decoder: self and cross attention weights, MLP hidden
    assert mask_shapes("t5x") == sorted(want)
    # shared along the length axis in the values too; no dropout at rate 0 in either style
    a = np.asarray(
        t5.logits(cfg, params, enc, dec, dropout_rate=0.5, dropout_rng=jax.random.PRNGKey(3), dropout_style="t5x")
    )
    plain = np.asarray(t5.logits(cfg, params, enc, dec))
    assert np.abs(a - plain).max() > 1e-3
    np.testing.assert_array_equal(np.asarray(t5.logits(cfg, params, enc, dec, dropout_style="t5x")), plain)
    with pytest.raises(ValueError, match="dropout_style"):
        t5.logits(cfg, params, enc, dec, dropout_style="magic")
    with pytest.raises(ValueError, match="--dropout-style"):
        tr.TrainConfig(dropout_style="magic")


def test_dropout_shared_along_an_axis_keeps_one_decision_along_it():
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from specjax.models import t5

    class Drop(nn.Module):
        @nn.compact
        def __call__(self, x):
            return t5._dropout(self, x, 0.2, (-2,))

    y = np.asarray(Drop().apply({}, jnp.ones((40, 7, 300), jnp.float32), rngs={"dropout": jax.random.PRNGKey(0)}))
    d = y == 0
    assert (d == d[:, :1, :]).all()  # one decision per (row, feature), shared by the 7 positions
    # 12,000 Bernoulli(0.2) decisions: 5 standard deviations (significance ~6e-7)
    assert abs(d[:, 0].mean() - 0.2) < 5 * np.sqrt(0.2 * 0.8 / d[:, 0].size)
    np.testing.assert_allclose(y[~d], 1 / 0.8, rtol=1e-6)


def test_teacher_samples_follow_the_teachers_distribution():
    """``teacher_outputs(..., temperature=1)`` (``specjax train --teacher-samples``) draws from the teacher's
    own distribution: over 1,536 samples for one source, the first tokens' counts match the teacher's exact
    first-token probabilities (softmax of its logits; chi-square test, significance level 0.001, bins with an
    expected count below 5 merged). The same seed gives the same samples, another seed others, and temperature
    0 gives the greedy output in every row."""
    from scipy import stats

    from specjax.cli.train import _model_sizes
    from specjax.models import t5
    from specjax.models.t5 import T5Model

    config = _model_sizes()["draft"].replace(vocab_size=300)
    params = t5.init_params(config, 5)
    # Sharpen the logits (a random initialisation is near uniform) so the test has a shape to find.
    params["decoder"]["logits_dense"]["kernel"] = params["decoder"]["logits_dense"]["kernel"] * 6.0
    teacher = T5Model(config, params)
    source = np.asarray([17, 42, 99, 7, 1], np.int32)
    n = 1536
    samples = tr.teacher_outputs(teacher, [source] * n, temperature=1.0, seed=1, progress=False)
    again = tr.teacher_outputs(teacher, [source] * n, temperature=1.0, seed=1, progress=False)
    other = tr.teacher_outputs(teacher, [source] * n, temperature=1.0, seed=2, progress=False)
    assert all(np.array_equal(a, b) for a, b in zip(samples, again))
    assert sum(not np.array_equal(a, b) for a, b in zip(samples, other)) > n // 2
    first = np.asarray([s[0] for s in samples])
    logits = t5.logits(config, params, source[None], np.zeros((1, 1), np.int32))[0, 0]
    probs = np.asarray(jax.nn.softmax(logits), np.float64)
    probs /= probs.sum()
    expected = probs * n
    big = expected >= 5
    assert big.sum() >= 5  # enough bins for the test to have power
    observed = np.bincount(first, minlength=300)
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    assert stats.chisquare(obs, exp).pvalue > 1e-3, (obs, exp)
    greedy = tr.teacher_outputs(teacher, [source] * 4, progress=False)
    assert all(np.array_equal(g, greedy[0]) for g in greedy) and greedy[0][0] == int(np.argmax(probs))
    with pytest.raises(ValueError, match="temperature"):
        tr.teacher_outputs(teacher, [source], temperature=-1.0, progress=False)


def test_teacher_samples_flag_adds_sampled_targets_and_refuses_a_mismatched_resume(
    tmp_path, data_dir, vocab500, capsys
):
    """``specjax train --teacher-samples 1``: RUN_DIR/teacher_outputs.npz holds the teacher's greedy output for
    each of the 40 sources, then one sample each (exactly ``teacher_outputs`` at temperature 1, seed 1); with
    ``--student-samples 1`` the greedy outputs then one sample each of the ``--init-from`` model. A resume with
    another count, the flags without the teacher's outputs as targets, and student samples without
    ``--init-from`` are refused with a message and exit code 2."""
    from specjax.checkpoints import save_checkpoint
    from specjax.cli.train import _model_sizes
    from specjax.models.t5 import T5Model
    from specjax.tokenizer import Tokenizer

    config = _model_sizes()["draft"].replace(vocab_size=500)
    teacher = T5Model.random(config, seed=11)
    save_checkpoint(teacher, tmp_path / "teacher", format="hf")
    d = data_dir / "train" / "multi30k"
    args = [
        "train",
        "--run-dir",
        str(tmp_path / "r"),
        "--model",
        "draft",
        "--source",
        str(d / "train.en"),
        "--target-text",
        str(d / "train.de"),
        "--vocab",
        str(vocab500),
        "--max-examples",
        "40",
        "--tokens-per-batch",
        "256",
        "--steps",
        "1",
        "--objective",
        "distill",
        "--teacher",
        str(tmp_path / "teacher"),
    ]
    assert main(args + ["--teacher-samples", "1"]) == 0
    saved = np.load(tmp_path / "r" / "teacher_outputs.npz")
    got = np.split(saved["flat"], saved["ends"][:-1])
    sources, refs = tr.read_parallel(d / "train.en", d / "train.de")
    src, _ = tr.tokenize_pairs(Tokenizer(str(vocab500), extra_ids=0), sources[:40], refs[:40])
    want = tr.teacher_outputs(teacher, src, progress=False) + tr.teacher_outputs(
        teacher, src, temperature=1.0, seed=1, progress=False
    )
    assert len(got) == 80 and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert any(not np.array_equal(a, b) for a, b in zip(want[:40], want[40:]))
    capsys.readouterr()
    assert main(args + ["--teacher-samples", "2", "--steps", "2"]) == 2
    assert "--teacher-samples" in capsys.readouterr().err
    # --student-samples: after the teacher's outputs, samples of the --init-from model (the student as it starts).
    student = T5Model.random(config, seed=12)
    save_checkpoint(student, tmp_path / "student", format="hf")
    assert (
        main(
            args[:2]
            + [str(tmp_path / "s")]
            + args[3:]
            + ["--student-samples", "1", "--init-from", str(tmp_path / "student")]
        )
        == 0
    )
    saved = np.load(tmp_path / "s" / "teacher_outputs.npz")
    got = np.split(saved["flat"], saved["ends"][:-1])
    from specjax.cli.train import STUDENT_SEED

    want_s = tr.teacher_outputs(student, src, temperature=1.0, seed=STUDENT_SEED + 1, progress=False)
    assert len(got) == 80 and all(np.array_equal(a, b) for a, b in zip(got, want[:40] + want_s))
    capsys.readouterr()
    assert main(args[:2] + [str(tmp_path / "u")] + args[3:] + ["--student-samples", "1"]) == 2
    assert "--init-from" in capsys.readouterr().err and not (tmp_path / "u").exists()
    args[args.index("distill")] = "reference"
    assert main(args[:-2] + ["--run-dir", str(tmp_path / "q"), "--teacher-samples", "1"]) == 2
    assert "--teacher-samples" in capsys.readouterr().err and not (tmp_path / "q").exists()
