"""Kept for existing imports: the peer comparisons live in ``specjax.bench.peers`` (Hugging Face transformers
and CTranslate2 side by side with specjax)."""

from specjax.bench.peers import *  # noqa: F401,F403
from specjax.bench.peers import __all__  # noqa: F401
