"""The embedded default draft/target pairs: English→German T5 1.1 models trained here on Multi30k.

Two sizes, each a target with two drafts, sharing one 8000-piece SentencePiece vocabulary:

- "mini" (``specjax/assets/default_pair``): target 13.5M parameters (d_model 256, 4+4 layers), drafts
  1.45M. Its float32 decoder (28 MB) fits this CPU class's L3 cache, so speculation wins little on a CPU;
  the tests use it because it is fast.
- "small" (``specjax/assets/small_pair``, issue 12): target 46.0M parameters (d_model 512, 8 heads, MLP
  1024, 6+6 layers: T5 1.1 small's shape with an 8k vocabulary; 99.6 MiB float32 decoder), a distilled draft
  of 4.28M (d_model 128, 6+2 layers, 1/14.2 of the target's per-token multiply-adds) and a reference draft of
  4.94M (6+4 layers, 1/10.4). The paper's regime on a laptop; the default (``default_size``).

The checkpoints ship inside the package as Hugging Face safetensors directories in bfloat16, with their
vocabulary, so a new user needs no download. How they were made: ``TRAINING.md`` beside each.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ASSETS",
    "DEFAULT_PAIR",
    "DEMO_DTYPES",
    "DEMO_GAMMA",
    "PAIRS",
    "default_size",
    "load_default_pair",
    "demo_sentences",
]

ASSETS = Path(__file__).parent / "assets"
PAIRS = {"mini": ASSETS / "default_pair", "small": ASSETS / "small_pair"}
DEFAULT_PAIR = PAIRS["mini"]
"""The mini pair's directory: its name is from before the small pair shipped, kept for code that reads its
files (both pairs share one vocabulary). The default pair is ``PAIRS[default_size()]``, the small one."""
DRAFTS = ("distilled", "reference")


def _shipped(size: str) -> bool:
    pair = PAIRS[size]
    return all((pair / name).exists() for name in ("target", *(f"draft_{d}" for d in DRAFTS), "spiece.model"))


# The draft tokens per target call that ``specjax demo`` uses for each pair: the γ with the best measured speedup
# at batch 1, temperature 0 on a 2-core CPU (README, "The embedded pairs"; benchmarks/results). The small
# pair in its demo dtypes: γ 4 and 5 tie (2.12-2.16x the float32 target alone), 6 and 7 are 1-2 % behind
# (benchmarks/results/small_pair/session24/dtype_loops*.txt; with the attention and the draft of the
# twenty-third session γ 7 and 8 were best, session18).
DEMO_GAMMA = {"mini": 3, "small": 5}
# The (target, draft) compute dtypes ``specjax demo`` loads each pair in: the fastest speculative pairing
# measured on a 2-core CPU. The mini target fits the CPU's cache and runs fastest in float32; the small
# target's verification windows run on YNNPACK's bfloat16 kernels, its draft's one-row steps in float32
# (``load_default_pair``'s ``dtype`` / ``draft_dtype``; benchmarks/dtype_loops.py).
DEMO_DTYPES = {"mini": ("float32", "float32"), "small": ("bfloat16", "float32")}


def default_size() -> str:
    """The pair ``specjax demo``, ``translate`` and ``generate`` use without ``--size``: "small".

    Issue 12 makes "small" the default once it meets all its goals, which it does since the twenty-fourth session
    (``small_pair/TRAINING.md``): its target's greedy BLEU on Multi30k test 2016 is 31.63 (goal 30; the mini
    target: 25.6), its distilled draft's α 0.770 / 0.748 at temperature 0 / 1 on test lines (goal 0.7 / 0.6),
    greedy speculative output equals the target's on 96 test lines, and speculative sampling (bfloat16 target,
    float32 draft, batch 1, temperature 0, 24 Multi30k test lines) runs 2.1-2.2x the float32 target alone (the
    fastest target alone on a CPU; goal 2x) at the best γ, since the decode loops keep a bfloat16 model's
    attention memory in float32 and move the queries heads-first (before: 1.81-2.19x over thirteen runs of the
    twenty-second and twenty-third sessions). ``--size mini`` / ``size="mini"`` picks the 13.5M pair, faster per
    token but with little speedup on a CPU (its float32 decoder fits the L3 cache)."""
    return "small"


def load_default_pair(
    draft: str = "distilled", dtype: str = "float32", size: str | None = None, draft_dtype: str | None = None
):
    """Loads a shipped English→German pair.

    Args:
      draft: "distilled" (DistillSpec draft, trained on the target's outputs and distributions; the
        default) or "reference" (the same draft architecture trained on references only).
      dtype: compute and parameter dtype of the target ("float32" or "bfloat16"; the files are bfloat16).
        On CPU the target alone is fastest in float32, speculative sampling with the small pair in
        bfloat16 (its verification windows run on YNNPACK's bfloat16 kernels: ``decoding/xla_cpu.py``);
        greedy speculative output equals the target's bit for bit in float32, and up to bfloat16 rounding
        (a window and a step round differently: a near-tie may go the other way) in bfloat16.
      size: "mini" (target 13.5M parameters, drafts 1.45M) or "small" (target 46.0M, distilled draft 4.28M,
        reference draft 4.94M); None: ``default_size()``.
      draft_dtype: the draft's dtype; None: ``dtype``. A float32 draft beside a bfloat16 target was the
        fastest speculative pairing on CPU (one-row float32 dots beat bfloat16's there); the draft's dtype
        never changes what the output's distribution is, only how often its proposals are accepted.
    Returns:
      (target ``T5Model``, draft ``T5Model``, ``Tokenizer``). Both models read raw English sentences
      (no task prefix); the vocabulary is the shipped ``spiece.model`` (8000 pieces, pad 0, eos 1, unk 2).
    Raises:
      ValueError: unknown draft or size name. FileNotFoundError: the package was installed without its
        assets, or the "small" pair is not in this version (its training spans sessions; see
        ``specjax/assets/small_pair/TRAINING.md``).
    """
    from specjax.checkpoints import load_checkpoint
    from specjax.tokenizer import Tokenizer

    if draft not in DRAFTS:
        raise ValueError(f"draft must be one of {DRAFTS}, got {draft!r}.")
    size = default_size() if size is None else size
    if size not in PAIRS:
        raise ValueError(f"size must be one of {tuple(PAIRS)}, got {size!r}.")
    pair = PAIRS[size]
    if size == "small" and not _shipped("small"):
        raise FileNotFoundError(
            f"The 'small' pair is not shipped in this version of specjax ({pair} is missing or incomplete: its "
            "training spans several sessions; specjax/assets/small_pair/TRAINING.md says where it stands). "
            "Use size='mini' (--size mini)."
        )
    target_dir, draft_dir = pair / "target", pair / f"draft_{draft}"
    for path in (target_dir, draft_dir, pair / "spiece.model"):
        if not path.exists():
            raise FileNotFoundError(
                f"The {size!r} pair is missing {path}. Reinstall specjax (`pip install -e .` from a full "
                "checkout) or pass --target/--draft checkpoints explicitly."
            )
    target = load_checkpoint(target_dir, dtype=dtype)
    draft_model = load_checkpoint(draft_dir, dtype=dtype if draft_dtype is None else draft_dtype)
    tokenizer = Tokenizer(str(pair / "spiece.model"), extra_ids=0)
    return target, draft_model, tokenizer


def demo_sentences(limit: int | None = None) -> tuple[list[str], str]:
    """English input lines for the demo: Multi30k test 2016 (``../shared/data/train/multi30k/
    test_2016_flickr.en`` relative to the working directory) when present, else sentences shipped with
    the package. Returns (lines, where they came from)."""
    shared = Path("../shared/data/train/multi30k/test_2016_flickr.en")
    path = shared if shared.exists() else ASSETS / "demo_sentences.en"
    lines = [l.strip() for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    return (lines[:limit] if limit else lines), str(path)
