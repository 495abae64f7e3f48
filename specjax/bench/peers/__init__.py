"""specjax next to its peers on the same weights and inputs: Hugging Face transformers and CTranslate2.

Hugging Face transformers: assisted generation on the same weights and the same inputs.

The pair is exported with ``save_checkpoint(format="hf")`` and loaded by
``transformers.T5ForConditionalGeneration`` in float32 on the CPU. transformers' assisted generation
(``model.generate(..., assistant_model=draft)``; Leviathan et al. 2023's algorithm at ``do_sample=True``,
greedy verification otherwise) is run at batch 1 with ``num_assistant_tokens = γ`` on a constant schedule
and the confidence-based early stop switched off, so both libraries run the same algorithm. Plain
``generate`` (no assistant) is the transformers baseline.

Conventions that differ (and are handled here): transformers starts decoding from
``decoder_start_token_id`` (0, T5's pad) and returns it as the first output token, which is dropped before
comparing; ``max_new_tokens`` = specjax ``max_decode_length``; eos 1, pad 0. transformers refuses an
assistant at batch > 1, so batch scaling compares plain ``generate`` there.

CTranslate2 (``compare_with_ctranslate2``): the target converted with CTranslate2's own converter
(``ctranslate2.converters.TransformersConverter``) from the Hugging Face export, run greedy at float32 and
int8 with 1 and 2 threads beside specjax's temperature_sample and speculative_sample on the same inputs.
CTranslate2 has no speculative decoding; it is what a CPU user would pick for fast T5.

PyTorch, transformers and ctranslate2 are imported only inside the package's functions (an optional extra:
``pip install 'specjax[bench]'``).

Modules by concern: ``specjax.bench.peers.hf`` (transformers) and ``specjax.bench.peers.ct2`` (CTranslate2, which
converts through the transformers export); this package is their public face.
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
