"""The verifiers by name: "token" (Leviathan et al. 2023, Algorithm 1; ``verify.py``) and "block" (Sun et al. 2025,
Algorithm 2; ``block.py``).

The one module that imports both, so that ``block.py`` builds on ``verify.py`` and nothing imports back up.
"""

from __future__ import annotations

from specjax.decoding.block import BlockVerifier
from specjax.decoding.verify import TokenVerifier, Verifier

__all__ = ["get_verifier", "VERIFIERS"]

VERIFIERS = ("token", "block")


def get_verifier(name: str) -> Verifier:
    """The verifier named ``name``: "token" -> ``TokenVerifier()``, "block" -> ``BlockVerifier()``.

    Raises:
      ValueError: any other name (the message lists the two).
    """
    if name == "token":
        return TokenVerifier()
    if name == "block":
        return BlockVerifier()
    raise ValueError(f"unknown verification {name!r}; use 'token' or 'block'.")
