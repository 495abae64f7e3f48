"""The decode loops: ``temperature_sample`` (the target alone) and ``speculative_sample`` (draft + target).

Modules, each owning one thing (data flows down this list):
  inputs.py    validation, truncation, keys, ``DecodeConfig`` (the static part), batching for callers
  model.py     ``DecodingModel``: the model as the loops see it (no model imported here)
  drafts.py    draft sources: a draft model (``ModelDraft``, optionally confidence-stopped), prompt lookup
               (``PromptLookupDraft``)
  verify.py    verifiers: token (Leviathan et al. 2023, Algorithm 1)
  block.py     block verification (Sun et al. 2025, Algorithm 2)
  branches.py  multi-draft: k branches per row, recursive rejection sampling at the branch point
  loop.py      the speculative while loop: draft → verify → accept → commit
  baseline.py  ``temperature_sample``
  result.py    ``DecodeResult`` (a pytree), the paper's α, tokens per call, per-position counts
  slots.py     bulk decoding's programs: insert inputs into free decode slots, run the loop over the slots
               (``specjax.bulk.BulkDecoder`` drives them)
"""

from specjax.decoding.baseline import lower_temperature_sample, temperature_sample
from specjax.decoding.drafts import DraftSource, ModelDraft, PromptLookupDraft
from specjax.decoding.inputs import DecodeConfig
from specjax.decoding.loop import lower_speculative_sample, speculative_sample
from specjax.decoding.model import BranchDecodingModel, DecodingModel, as_decoding_model
from specjax.decoding.result import DecodeResult
from specjax.decoding.verify import Proposal, TokenVerifier, Verdict

__all__ = [
    "BranchDecodingModel",
    "DecodeConfig",
    "DecodeResult",
    "DecodingModel",
    "DraftSource",
    "ModelDraft",
    "PromptLookupDraft",
    "Proposal",
    "TokenVerifier",
    "Verdict",
    "as_decoding_model",
    "lower_speculative_sample",
    "lower_temperature_sample",
    "speculative_sample",
    "temperature_sample",
]
