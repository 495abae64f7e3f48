"""How far training moved each parameter from its initialisation: ‖trained − init‖ / ‖init‖ per tensor.

Usage (from the repository root):
  python benchmarks/param_drift.py specjax/assets/small_pair/target [--seed 0] [--match embedding logits]

The initialisation is ``t5.init_params(config, seed)`` (t5x's initialisers; ``specjax train`` starts every run
from it with ``--seed``, 0 for every shipped model), the trained weights any checkpoint ``load_checkpoint``
reads. Prints, per parameter (t5x names) whose name contains one of ``--match`` (default: all), the RMS at
initialisation and after training and the relative change. A tensor that barely moved while its neighbours
moved tens of percent is one the optimizer does not reach (TRAINING.md of the small pair, twentieth session:
the unit-scale token embedding under AdamW).
"""

import argparse

import numpy as np

from specjax.checkpoints import load_checkpoint
from specjax.checkpoints.rules import flatten
from specjax.models import t5


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--seed", type=int, default=0, help="the run's --seed (default 0)")
    ap.add_argument("--match", nargs="*", default=[], help="print only parameters whose name contains one of these")
    args = ap.parse_args()
    model = load_checkpoint(args.checkpoint, dtype="float32")
    trained, init = flatten(model.params), flatten(t5.init_params(model.config, args.seed))
    for name in sorted(init):
        if args.match and not any(m in name for m in args.match):
            continue
        a, b = np.asarray(init[name], np.float64), np.asarray(trained[name], np.float64)
        print(
            f"{name:60s} rms_init {np.sqrt((a**2).mean()):.4f}  rms_trained {np.sqrt((b**2).mean()):.4f}  "
            f"relative change {np.linalg.norm(b - a) / np.linalg.norm(a):.3f}"
        )


if __name__ == "__main__":
    main()
