"""The shipped draft/target pairs: English→German T5 1.1 models trained with ``specjax train`` on Multi30k.

Two sizes, each a target with two drafts, sharing one 8000-piece SentencePiece vocabulary:

- "mini" (``specjax/assets/mini_pair``): target 13.5M parameters (d_model 256, 4+4 layers), drafts
  1.45M. Its float32 decoder (28 MB) fits this CPU class's L3 cache, so speculation wins little on a CPU;
  the tests use it because it is fast.
- "small" (``specjax/assets/small_pair``): target 46.0M parameters (d_model 512, 8 heads, MLP
  1024, 6+6 layers: T5 1.1 small's shape with an 8k vocabulary; 99.6 MiB float32 decoder), a distilled draft
  of 4.28M (d_model 128, 6+2 layers, 1/14.2 of the target's per-token multiply-adds) and a reference draft of
  4.94M (6+4 layers, 1/10.4). The paper's regime on a laptop; the default (``default_size``).

Each pair is a Hugging Face safetensors directory per model, in bfloat16, with the vocabulary, and is its own Python
distribution (``specjax-mini-pair``, ``specjax-small-pair``, built from ``specjax/assets/<size>_pair/pyproject.toml``,
so that no wheel exceeds PyPI's 100 MB file limit). ``pair_dir`` finds a pair: the installed distribution first
(``importlib.metadata``), then the source checkout's ``specjax/assets/<size>_pair`` (editable installs). How they
were made: docs/training.md.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

from specjax.checkpoints import load_checkpoint
from specjax.hardware import resolve_dtypes
from specjax.tokenizer import Tokenizer

__all__ = [
    "ASSETS",
    "PAIR_DISTRIBUTIONS",
    "DEMO_DTYPES",
    "DEMO_GAMMA",
    "PAIRS",
    "PAIR_ALPHA",
    "default_size",
    "pair_dir",
    "pair_dtypes",
    "load_default_pair",
    "demo_sentences",
    "DecodeDefaults",
    "DECODE_DEFAULTS",
]

ASSETS = Path(__file__).parent / "assets"
DRAFTS = ("distilled", "reference")
PAIR_DISTRIBUTIONS = {
    "mini": ("specjax-mini-pair", "specjax_mini_pair"),
    "small": ("specjax-small-pair", "specjax_small_pair"),
}
"""size -> (distribution name, the importable data package it installs: ``target/``, ``draft_distilled/``,
``draft_reference/``, ``spiece.model``)."""


def _complete(pair: Path) -> bool:
    return all((pair / name).exists() for name in ("target", *(f"draft_{d}" for d in DRAFTS), "spiece.model"))


def pair_dir(size: str) -> Path:
    """The directory of a shipped pair (``target/``, ``draft_distilled/``, ``draft_reference/``, ``spiece.model``).

    Looked up in this order: the installed distribution ``specjax-<size>-pair`` (``importlib.metadata``:
    ``distribution(name).locate_file("specjax_<size>_pair")``), then the source checkout's
    ``specjax/assets/<size>_pair`` (editable installs and checkouts need nothing more).

    Raises:
      ValueError: ``size`` is not "mini" or "small".
      FileNotFoundError: neither holds the pair; the message names the install line.
    """
    if size not in PAIR_DISTRIBUTIONS:
        raise ValueError(f"size must be one of {tuple(PAIR_DISTRIBUTIONS)}, got {size!r}.")
    dist_name, package = PAIR_DISTRIBUTIONS[size]
    try:
        installed = Path(str(importlib.metadata.distribution(dist_name).locate_file(package)))
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is not None and _complete(installed):
        return installed
    checkout = ASSETS / f"{size}_pair"
    if _complete(checkout):
        return checkout
    raise FileNotFoundError(
        f"The {size!r} pair is not installed: run `pip install {dist_name}` (or, from a checkout, "
        f"`pip install ./specjax/assets/{size}_pair`), or `pip install 'specjax[pairs]'` for both."
    )


class _Pairs(Mapping):
    """size -> the pair's directory, found by ``pair_dir`` when read (so importing specjax never needs a pair)."""

    def __getitem__(self, size: str) -> Path:
        if size not in PAIR_DISTRIBUTIONS:
            raise KeyError(size)
        return pair_dir(size)

    def __iter__(self) -> Iterator[str]:
        return iter(PAIR_DISTRIBUTIONS)

    def __len__(self) -> int:
        return len(PAIR_DISTRIBUTIONS)


PAIRS: Mapping[str, Path] = _Pairs()
"""{"mini": ..., "small": ...}: each pair's directory, looked up by ``pair_dir`` on access."""


@dataclasses.dataclass(frozen=True)
class DecodeDefaults:
    """The decoding defaults every ``specjax`` command shares (``DECODE_DEFAULTS``; listed in docs/cli.md).

    Attributes:
      gamma: draft tokens per target call: "auto" (``specjax.Decoder`` picks γ, or the target alone, from measured
        costs and the running α) for ``demo``, ``translate`` and ``generate``. Where one fixed γ must be compiled
        (``generate --mesh`` / ``--data-parallel``, ``aot``) ``fixed_gamma`` stands in for it.
      fixed_gamma: the γ used where "auto" cannot run: 5, the best measured fixed γ of the small pair at batch 1
        on a CPU (4 and 5 tie; benchmarks/results/small_pair/2026-12-06_dtype_loops_*.txt).
      aot_gamma: ``specjax aot``'s γ: 7, the paper's T5-XXL / T5-small EnDe row (Table 2), which the compiled
        programs are checked against.
      max_decode_length: output tokens per line at most, per task: "translation" (``demo``, ``translate``, and
        ``generate`` with the shipped pair: a Multi30k sentence's German translation is 12-40 pieces of the shipped
        8000-piece vocabulary; 64 leaves room) and "text" (``generate`` with ``--target`` / ``--draft`` checkpoints,
        any task: 128, the paper's output length for its T5-XXL rows).
      temperature: 0, greedy (the target's own greedy output, exactly).
      seed: 0.
    """

    gamma: str = "auto"
    fixed_gamma: int = 5
    aot_gamma: int = 7
    max_decode_length: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: MappingProxyType({"translation": 64, "text": 128})
    )
    temperature: float = 0.0
    seed: int = 0


DECODE_DEFAULTS = DecodeDefaults()
"""The one set of decoding defaults of the command line (``DecodeDefaults``)."""


# The draft tokens per target call that ``specjax demo`` uses for each pair: the γ with the best measured speedup
# at batch 1, temperature 0 on a 2-core CPU (docs/benchmarks.md). The small pair in its demo dtypes: γ 4 and 5
# tie (2.12-2.16x the float32 target alone), 6 and 7 are 1-2 % behind
# (benchmarks/results/small_pair/2026-12-06_dtype_loops_*.txt).
DEMO_GAMMA = {"mini": 3, "small": 5}
# The (target, draft) compute dtypes ``specjax demo`` loads each pair in: the fastest speculative pairing
# measured on a 2-core CPU. The mini target fits the CPU's cache and runs fastest in float32; the small
# target's verification windows run on YNNPACK's bfloat16 kernels, its draft's one-row steps in float32
# (``load_default_pair``'s ``dtype`` / ``draft_dtype``; benchmarks/decoding.py dtypes).
DEMO_DTYPES = {"mini": ("float32", "float32"), "small": ("bfloat16", "float32")}
# The recorded α (temperature 0, temperature 1) of each shipped (size, draft) pair on Multi30k test lines
# (docs/training.md): the prior of ``specjax.Decoder``'s running α (``gamma="auto"``). The small reference draft has no
# recorded α (the Decoder's default prior, 0.6, serves it).
PAIR_ALPHA = {
    ("mini", "distilled"): (0.670, 0.592),
    ("mini", "reference"): (0.552, 0.531),
    ("small", "distilled"): (0.770, 0.748),
}


def pair_dtypes(size: str, dtype: str = "auto", draft_dtype: str | None = None) -> tuple[str, str, str]:
    """(target dtype, draft dtype, reason) a shipped pair loads in: "auto" resolves to ``DEMO_DTYPES[size]`` on a
    CPU with native bfloat16 dots (avx512_bf16 / amx_bf16) or an accelerator's bfloat16, else float32 for both
    (``specjax.hardware.resolve_dtypes``); explicit dtypes win. Raises ValueError for an unknown size or dtype."""
    if size not in PAIRS:
        raise ValueError(f"size must be one of {tuple(PAIRS)}, got {size!r}.")
    return resolve_dtypes(dtype, draft_dtype, DEMO_DTYPES[size])


def default_size() -> str:
    """The pair ``specjax demo``, ``translate`` and ``generate`` use without ``--size``: "small".

    The small pair is the paper's regime on a CPU (docs/training.md): its target's greedy BLEU on Multi30k test
    2016 is 31.63 (the mini target: 25.6), its distilled draft's α 0.770 / 0.748 at temperature 0 / 1 on test
    lines, greedy speculative output equals the target's on 96 test lines, and speculative sampling (bfloat16
    target, float32 draft, batch 1, temperature 0, 24 Multi30k test lines) runs 2.1-2.2x the float32 target alone
    (the fastest target alone on a CPU) at the best γ on a 2-core AMD EPYC (Zen 4, AVX512_BF16). ``--size mini`` /
    ``size="mini"`` picks the 13.5M pair, faster per token but with little speedup on a CPU (its float32 decoder
    fits the L3 cache)."""
    return "small"


def load_default_pair(
    draft: str = "distilled", dtype: str = "auto", size: str | None = None, draft_dtype: str | None = None
):
    """Loads a shipped English→German pair.

    Args:
      draft: "distilled" (DistillSpec draft, trained on the target's outputs and distributions; the
        default) or "reference" (the same draft architecture trained on references only).
      dtype: compute and parameter dtype of the target: "auto" (the default: ``pair_dtypes``, the fastest path for
        this machine: the files' bfloat16 where the CPU has native bfloat16 dots or on TPU/GPU, else float32,
        upcast once at load), "float32", "bfloat16" (the files are bfloat16) or "int8" (weight-only int8 with Qwix,
        computed in the dtype "auto" picks: ``load_checkpoint``, ``specjax.quantize``; an int8 target is another
        target: speculative output equals the int8 target's own).
        On CPU the target alone is fastest in float32, speculative sampling with the small pair in
        bfloat16 (its verification windows run on YNNPACK's bfloat16 kernels: ``decoding/xla_cpu.py``);
        greedy speculative output equals the target alone's token for token on every dtype path (a window and a
        step give the same logits bit for bit: ``decoding/baseline.py``, ``STEP_WINDOW``).
      size: "mini" (target 13.5M parameters, drafts 1.45M) or "small" (target 46.0M, distilled draft 4.28M,
        reference draft 4.94M); None: ``default_size()``.
      draft_dtype: the draft's dtype; None: ``dtype`` (with "auto": the pair's auto draft dtype). A float32
        draft beside a bfloat16 target was the fastest speculative pairing on CPU (one-row float32 dots beat
        bfloat16's there); the draft's dtype never changes what the output's distribution is, only how often
        its proposals are accepted. "int8": the draft's dense kernels in int8 (Qwix), computed in the draft's "auto"
        dtype; exact as any draft (Algorithm 1), α within 1 % of the float32 draft's
        (benchmarks/results/int8/).
    Returns:
      (target ``T5Model``, draft ``T5Model``, ``Tokenizer``). Both models read raw English sentences
      (no task prefix); the vocabulary is the shipped ``spiece.model`` (8000 pieces, pad 0, eos 1, unk 2).
    Raises:
      ValueError: unknown draft or size name. FileNotFoundError: the pair is not installed (the message names
        the ``pip install`` line; ``pair_dir``).
    """
    if draft not in DRAFTS:
        raise ValueError(f"draft must be one of {DRAFTS}, got {draft!r}.")
    size = default_size() if size is None else size
    pair = pair_dir(size)
    target_dir, draft_dir = pair / "target", pair / f"draft_{draft}"
    dtype, draft_dtype, _ = pair_dtypes(size, dtype, draft_dtype)
    auto_target, auto_draft, _ = pair_dtypes(size, "auto")
    # int8 (weight-only, Qwix): computed in the dtype "auto" picks for the model's role on this machine.
    target = load_checkpoint(target_dir, dtype=dtype, **({"compute_dtype": auto_target} if dtype == "int8" else {}))
    draft_model = load_checkpoint(
        draft_dir, dtype=draft_dtype, **({"compute_dtype": auto_draft} if draft_dtype == "int8" else {})
    )
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
