"""The embedded default draft/target pair: English→German T5 1.1 models trained here on Multi30k.

The checkpoints ship inside the package (``specjax/assets/default_pair``) as Hugging Face safetensors
directories in bfloat16, with their SentencePiece vocabulary, so a new user needs no download.
How they were made: ``specjax/assets/default_pair/TRAINING.md``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ASSETS", "DEFAULT_PAIR", "load_default_pair", "demo_sentences"]

ASSETS = Path(__file__).parent / "assets"
DEFAULT_PAIR = ASSETS / "default_pair"
DRAFTS = ("distilled", "reference")


def load_default_pair(draft: str = "distilled", dtype: str = "float32"):
    """Loads the shipped English→German pair.

    Args:
      draft: "distilled" (DistillSpec draft, trained on the target's outputs and distributions; the
        default) or "reference" (the same draft architecture trained on references only).
      dtype: compute and parameter dtype to cast to ("float32" is fastest on CPU; the files are bfloat16).
    Returns:
      (target ``T5Model``, draft ``T5Model``, ``Tokenizer``). Both models read raw English sentences
      (no task prefix); the vocabulary is the shipped ``spiece.model`` (8000 pieces, pad 0, eos 1, unk 2).
    Raises:
      ValueError: unknown draft name. FileNotFoundError: the package was installed without its assets.
    """
    from specjax.checkpoints import load_checkpoint
    from specjax.tokenizer import Tokenizer

    if draft not in DRAFTS:
        raise ValueError(f"draft must be one of {DRAFTS}, got {draft!r}.")
    target_dir, draft_dir = DEFAULT_PAIR / "target", DEFAULT_PAIR / f"draft_{draft}"
    for path in (target_dir, draft_dir, DEFAULT_PAIR / "spiece.model"):
        if not path.exists():
            raise FileNotFoundError(
                f"The default pair is missing {path}. Reinstall specjax (`pip install -e .` from a full "
                "checkout) or pass --target/--draft checkpoints explicitly.")
    target = load_checkpoint(target_dir, dtype=dtype)
    draft_model = load_checkpoint(draft_dir, dtype=dtype)
    tokenizer = Tokenizer(str(DEFAULT_PAIR / "spiece.model"), extra_ids=0)
    return target, draft_model, tokenizer


def demo_sentences(limit: int | None = None) -> tuple[list[str], str]:
    """English input lines for the demo: Multi30k test 2016 (``../shared/data/train/multi30k/
    test_2016_flickr.en`` relative to the working directory) when present, else sentences shipped with
    the package. Returns (lines, where they came from)."""
    shared = Path("../shared/data/train/multi30k/test_2016_flickr.en")
    path = shared if shared.exists() else ASSETS / "demo_sentences.en"
    lines = [l.strip() for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    return (lines[:limit] if limit else lines), str(path)
