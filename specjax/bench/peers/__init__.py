"""specjax next to its peers on the same weights and inputs: Hugging Face transformers and CTranslate2.

- ``specjax.bench.peers.hf``: transformers' assisted generation (``compare_with_transformers``,
  ``batch_scaling``) on the pair exported with ``save_checkpoint(format="hf")``; its docstring gives the
  conventions that differ and how they are handled.
- ``specjax.bench.peers.ct2``: CTranslate2 (``compare_with_ctranslate2``), the target converted from that export
  by CTranslate2's own converter, greedy at float32 and int8 beside specjax's loops. CTranslate2 has no
  speculative decoding; it is what a CPU user would pick for fast T5.

PyTorch, transformers and ctranslate2 are imported only inside the package's functions (an optional extra:
``pip install 'specjax[bench]'``). This package is the modules' public face.
"""

from __future__ import annotations

from specjax.bench.peers.ct2 import (
    _id_token,  # noqa: F401  (benchmarks/bulk.py reads it here)
    compare_with_ctranslate2,
    ctranslate2_generate,
    format_ctranslate2,
    to_ctranslate2,
)
from specjax.bench.peers.hf import (
    batch_scaling,
    compare_with_transformers,
    format_comparison,
    format_scaling,
    hf_generate,
    to_transformers,
)

__all__ = [
    "to_transformers",
    "hf_generate",
    "compare_with_transformers",
    "batch_scaling",
    "format_comparison",
    "format_scaling",
    "to_ctranslate2",
    "ctranslate2_generate",
    "compare_with_ctranslate2",
    "format_ctranslate2",
]
