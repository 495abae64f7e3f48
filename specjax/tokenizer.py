"""T5's SentencePiece tokenizer, compatible with ``seqio.SentencePieceVocabulary`` (without TensorFlow), and
ByT5's byte vocabulary (``Tokenizer.byt5``). mT5, umT5 and MADLAD-400 ship SentencePiece files of their own
(``checkpoint_tokenizer`` finds them beside a checkpoint).

As seqio (``seqio/vocabularies.py``, ``_load_model_internal``): ``extra_ids`` sentinel pieces
``▁<extra_id_{i}>`` are appended to the model as USER_DEFINED pieces in reverse order, so
``<extra_id_0>`` is the last id (32099 for T5's 32000-piece model with 100 extra ids) and the text
``<extra_id_0>`` encodes to it. pad 0, eos 1, unk 2 come from the SentencePiece model (T5's reserves
them so). ``encode`` appends EOS, as seqio's ``append_eos`` feature converters do.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from specjax.checkpoints.t5x import _exists, read_gcs_bytes

__all__ = [
    "Tokenizer",
    "ByteTokenizer",
    "as_tokenizer",
    "checkpoint_tokenizer",
    "resolve_tokenizer",
    "madlad_language_prefix",
]


class Tokenizer:
    """T5 SentencePiece vocabulary: text <-> token ids.

    Args:
      path: a SentencePiece model file (e.g. T5's ``spiece.model``), or a directory holding ``spiece.model``;
        or a ``gs://bucket/.../spiece.model`` object (read through TensorStore's gcs driver, as T5X checkpoints).
      extra_ids: sentinel ids appended after the pieces (100 for T5).

    Attributes:
      vocab_size: SentencePiece pieces + ``extra_ids`` (32100 for T5; the models' embeddings have 32128 rows,
        padded for TPU layout).
      pad_id, eos_id, unk_id: 0, 1, 2 for T5.

    Raises:
      FileNotFoundError: no model file at ``path``.
      ValueError: the file is not a SentencePiece model; for gs://, a missing bucket or refused credentials
        (``specjax.checkpoints.CheckpointError``, one line).
    """

    @classmethod
    def byt5(cls, extra_ids: int = 125) -> "ByteTokenizer":
        """ByT5's byte vocabulary (Xue et al. 2022, section 3.1; seqio ``ByteVocabulary``): no file; UTF-8
        bytes offset by 3 (pad 0, eos 1, unk 2), ``extra_ids`` sentinel ids after the 259 (125: the 384 rows
        of the released ByT5 models). The same ids and decoded text as transformers' ``ByT5Tokenizer``."""
        return ByteTokenizer(extra_ids)

    def __init__(self, path: str | os.PathLike, extra_ids: int = 100):
        path = os.fspath(path)
        if extra_ids < 0:
            raise ValueError(f"extra_ids must be >= 0, got {extra_ids}.")
        if path.startswith("gs://"):  # Cloud Storage, through TensorStore's gcs driver (as T5X checkpoints)
            data = read_gcs_bytes(path)
        else:
            if os.path.isdir(path):
                path = os.path.join(path, "spiece.model")
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"No SentencePiece model at {path!r}; T5's is 'spiece.model' (e.g. from "
                    "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model or a Hugging Face repo)."
                )
            with open(path, "rb") as f:
                data = f.read()
        try:
            from sentencepiece import sentencepiece_model_pb2

            model = sentencepiece_model_pb2.ModelProto.FromString(data)
            for i in reversed(range(extra_ids)):
                model.pieces.add(
                    piece=f"▁<extra_id_{i}>",
                    score=0.0,
                    type=sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED,
                )
            serialized = model.SerializeToString()
        except Exception as e:
            raise ValueError(f"{path!r} is not a SentencePiece model ({type(e).__name__}: {e}).") from e
        self._load(serialized, path, extra_ids)

    def _load(self, serialized: bytes, path: str, extra_ids: int) -> None:
        """Loads a serialized SentencePiece ModelProto whose extra-id pieces are already appended."""
        self._sp = spm.SentencePieceProcessor()
        self._sp.LoadFromSerializedProto(serialized)
        self.path = path
        self.extra_ids = extra_ids
        self.vocab_size: int = self._sp.GetPieceSize()
        self.pad_id: int = max(self._sp.pad_id(), 0)
        self.eos_id: int = self._sp.eos_id()
        self.unk_id: int = self._sp.unk_id()

    @classmethod
    def from_seqio(cls, vocabulary) -> "Tokenizer":
        """The ``Tokenizer`` of a ``seqio.SentencePieceVocabulary``: the same ids for every text and piece.

        Reads the vocabulary's own serialized model (``vocabulary.sp_model``: the SentencePiece model with
        seqio's extra-id pieces and any ``normalizer_spec_overrides`` already applied, in seqio's order,
        ``reverse_extra_ids`` included), so nothing is re-derived. Loading it reads
        ``sentencepiece_model_file`` through TensorFlow's file system (gs:// works), as seqio does; seqio is
        not imported here.

        Args:
          vocabulary: a ``seqio.SentencePieceVocabulary`` (or an object with its ``sp_model`` bytes,
            ``sentencepiece_model_file`` and ``extra_ids``).
        Returns:
          a ``Tokenizer`` with ``vocab_size == vocabulary.vocab_size``; ``encode`` appends EOS as seqio's
          ``append_eos`` preprocessor does (seqio's own ``encode`` does not).
        Raises:
          ValueError: ``vocabulary`` is not a SentencePiece vocabulary (e.g. ``seqio.ByteVocabulary``: use
            ``Tokenizer.byt5()`` for ByT5), or its model cannot be read.
        Source: seqio ``vocabularies.py`` (``SentencePieceVocabulary.sp_model``, ``_load_model``).
        """
        if isinstance(vocabulary, Tokenizer):
            return vocabulary
        missing = [a for a in ("sp_model", "sentencepiece_model_file", "extra_ids") if not hasattr(vocabulary, a)]
        if missing:
            raise ValueError(
                f"{type(vocabulary).__name__} is not a seqio.SentencePieceVocabulary (no "
                f"{', '.join(missing)}); specjax decodes T5 SentencePiece vocabularies only."
            )
        try:
            serialized = vocabulary.sp_model
        except Exception as e:
            raise ValueError(
                f"Cannot read the SentencePiece model of {vocabulary!r} "
                f"({vocabulary.sentencepiece_model_file!r}): {type(e).__name__}: {e}"
            ) from e
        if not serialized:
            raise ValueError(
                f"{vocabulary!r} has no SentencePiece model; specjax decodes T5 SentencePiece vocabularies only."
            )
        tok = cls.__new__(cls)
        tok._load(serialized, str(vocabulary.sentencepiece_model_file), int(vocabulary.extra_ids))
        return tok

    def same_vocabulary(self, other: "Tokenizer") -> bool:
        """True when ``other`` maps every id to the same piece (and has the same size and pad/eos/unk ids):
        token ids from one mean the same text under the other."""
        if not isinstance(other, Tokenizer):
            other = as_tokenizer(other)
        if isinstance(other, ByteTokenizer):
            return False
        if (self.vocab_size, self.pad_id, self.eos_id, self.unk_id) != (
            other.vocab_size,
            other.pad_id,
            other.eos_id,
            other.unk_id,
        ):
            return False
        return all(self._sp.IdToPiece(i) == other._sp.IdToPiece(i) for i in range(self.vocab_size))

    def __repr__(self) -> str:
        return f"Tokenizer({self.path!r}, extra_ids={self.extra_ids})"

    def piece_id(self, piece: str) -> int | None:
        """The id of SentencePiece piece ``piece`` (e.g. MADLAD's ``"<2de>"``), or None when it is not one."""
        i = self._sp.PieceToId(piece)
        return None if i == self._sp.unk_id() and piece != self._sp.IdToPiece(i) else int(i)

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        """Token ids of ``text``, with EOS appended (unless ``add_eos=False``).

        Raises TypeError for a non-str, ValueError for text that is not valid Unicode (lone surrogates: bytes that
        were not UTF-8, decoded with ``surrogateescape``, as a command-line argument can be)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"the text is not valid UTF-8 (byte {e.start} of {text[:40]!r}); convert it first, e.g. "
                "`iconv -f latin1 -t utf-8`."
            ) from None
        ids = list(self._sp.EncodeAsIds(text))
        return ids + [self.eos_id] if add_eos else ids

    def _ids_before_eos(self, ids: Iterable[int], out_of_range: str) -> list[int]:
        """``ids`` (1-D) checked, with ids >= ``vocab_size`` mapped to ``unk_id`` when ``out_of_range="unk"``,
        cut before the first EOS: what ``decode`` turns into text."""
        ids = np.asarray(ids).reshape(-1).tolist() if not isinstance(ids, list) else ids
        if out_of_range == "unk":
            ids = [self.unk_id if int(i) >= self.vocab_size else int(i) for i in ids]
        elif out_of_range != "raise":
            raise ValueError(f"out_of_range must be 'raise' or 'unk', got {out_of_range!r}.")
        ids = self._check_ids(ids)
        return ids[: ids.index(self.eos_id)] if self.eos_id in ids else ids

    def _check_ids(self, ids: Sequence[int], where: str = "") -> list[int]:
        out = [int(i) for i in ids]
        bad = [i for i in out if i < 0 or i >= self.vocab_size]
        if bad:
            raise ValueError(
                f"Token ids outside the vocabulary [0, {self.vocab_size}){where}: {bad[:5]}. The model's "
                f"embedding may have more rows than the tokenizer (pass out_of_range='unk' to decode them as "
                f"unk, as seqio does), or the ids come from a model with another vocabulary."
            )
        return out

    def decode(self, ids: Iterable[int], out_of_range: str = "raise") -> str:
        """Text of ``ids`` up to (not including) the first EOS; pad ids are dropped.

        Args:
          ids: int token ids, 1-D.
          out_of_range: "raise" (default), or "unk" to map ids >= ``vocab_size`` to ``unk_id`` as seqio
            does (a 32128-row model can emit ids 32100..32127, which have no piece).
        Raises:
          ValueError: an id is negative, or >= ``vocab_size`` with ``out_of_range="raise"``.
        """
        ids = self._ids_before_eos(ids, out_of_range)
        return self._sp.DecodeIds([i for i in ids if i != self.pad_id])

    def encode_batch(self, texts: Sequence[str], length: int | None = None, truncate: bool = False) -> np.ndarray:
        """Encodes texts (with EOS) into a right-padded int32[b, L] array (pad 0).

        Args:
          texts: b strings.
          length: L; None for the longest encoding.
          truncate: when True, longer encodings keep their first L-1 tokens and EOS; when False they raise.
        Raises:
          ValueError: an encoding is longer than ``length`` and ``truncate`` is False (the message names the
            line), or ``length`` < 1.
        """
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a sequence of strings; use encode for one string.")
        encoded = [self.encode(t) for t in texts]
        if length is None:
            length = max((len(e) for e in encoded), default=1)
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}.")
        out = np.full((len(encoded), length), self.pad_id, np.int32)
        for row, ids in enumerate(encoded):
            if len(ids) > length:
                if not truncate:
                    snippet = texts[row][:60] + ("…" if len(texts[row]) > 60 else "")
                    raise ValueError(
                        f"Line {row} ({snippet!r}) encodes to {len(ids)} tokens (with EOS), more than "
                        f"length={length}. Pass truncate=True or a larger length."
                    )
                ids = ids[: length - 1] + [self.eos_id]
            out[row, : len(ids)] = ids
        return out

    def decode_batch(self, ids) -> list[str]:
        """``decode`` for each row of an int[b, L] array (or list of lists).

        Raises:
          ValueError: an id outside the vocabulary (the message names the row).
        """
        rows = ids.tolist() if isinstance(ids, np.ndarray) else [np.asarray(r).tolist() for r in ids]
        out = []
        for r, row in enumerate(rows):
            self._check_ids(row, f" in row {r}")
            out.append(self.decode(row))
        return out


class ByteTokenizer(Tokenizer):
    """ByT5's vocabulary: token id = UTF-8 byte + 3; 0 pad, 1 eos, 2 unk; then ``extra_ids`` sentinels.

    Source: ByT5 (Xue et al. 2022, "ByT5: Towards a token-free future with pre-trained byte-to-byte models",
    section 3.1), seqio ``ByteVocabulary``, transformers ``ByT5Tokenizer`` (whose ids and decoded text this
    reproduces: ``decode`` drops special and sentinel ids and invalid UTF-8, as its ``skip_special_tokens``
    decode with ``errors="ignore"`` does). Sentinel text such as ``<extra_id_0>`` in an input is encoded as
    its bytes (seqio's behaviour), not as a sentinel id.

    Attributes:
      vocab_size: 259 + ``extra_ids`` (384 for the released models).
      pad_id, eos_id, unk_id: 0, 1, 2.

    Raises:
      ValueError: ``extra_ids`` < 0.
    """

    OFFSET = 3

    def __init__(self, extra_ids: int = 125):
        if extra_ids < 0:
            raise ValueError(f"extra_ids must be >= 0, got {extra_ids}.")
        self._sp = None
        self.path = "<bytes>"
        self.extra_ids = int(extra_ids)
        self.vocab_size = 256 + self.OFFSET + self.extra_ids
        self.pad_id, self.eos_id, self.unk_id = 0, 1, 2

    def __repr__(self) -> str:
        return f"Tokenizer.byt5(extra_ids={self.extra_ids})"

    def same_vocabulary(self, other: "Tokenizer") -> bool:
        """True for another byte vocabulary of the same size."""
        return isinstance(other, ByteTokenizer) and other.vocab_size == self.vocab_size

    def encode(self, text: str, add_eos: bool = True) -> list[int]:
        """UTF-8 bytes of ``text`` + 3, with EOS appended (unless ``add_eos=False``)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}.")
        ids = [b + self.OFFSET for b in text.encode("utf-8")]
        return ids + [self.eos_id] if add_eos else ids

    def decode(self, ids: Iterable[int], out_of_range: str = "raise") -> str:
        """Text of ``ids`` up to (not including) the first EOS; pad, unk and sentinel ids are dropped, and
        bytes that do not form UTF-8 are skipped.

        Raises:
          ValueError: an id is negative, or >= ``vocab_size`` with ``out_of_range="raise"``.
        """
        ids = self._ids_before_eos(ids, out_of_range)
        data = bytes(i - self.OFFSET for i in ids if self.OFFSET <= i < 256 + self.OFFSET)
        return data.decode("utf-8", errors="ignore")

    def piece_id(self, piece: str) -> int | None:
        """None: a byte vocabulary has no multi-byte pieces (``madlad_language_prefix``)."""
        return None


def _hf_json(directory: str, name: str) -> dict:
    import json

    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def checkpoint_tokenizer(checkpoint: str | os.PathLike) -> tuple[Tokenizer, str] | None:
    """The vocabulary a checkpoint directory brings, and where it came from (for the CLI's stderr note).

    In order: ``spiece.model`` in the checkpoint's folder or the one above (``specjax convert`` and Hugging
    Face exports put it there; its ``extra_ids`` from ``tokenizer_config.json``, else 100 when they fit in the
    embedding's rows as T5's do, else 0 as mT5 / umT5 / MADLAD-400, whose files hold their sentinels); else
    ByT5's byte vocabulary when ``tokenizer_config.json`` or ``config.json`` names ``ByT5Tokenizer`` or
    ``config.json`` has ``vocab_size`` 384 (ByT5's, ``Tokenizer.byt5``). None when the folder brings none.
    """
    path = os.fspath(checkpoint)
    if path.startswith("gs://"):  # a T5X checkpoint in Cloud Storage: spiece.model beside it or one level up
        base = path.rstrip("/")
        for folder in (base, base.rpartition("/")[0]):
            model_file = f"{folder}/spiece.model"
            if _exists(model_file):
                return Tokenizer(model_file), f"the target checkpoint's own vocabulary, {model_file}"
        return None
    base = path if os.path.isdir(path) else os.path.dirname(path)
    for folder in (base, os.path.dirname(os.path.abspath(base))):
        model_file = os.path.join(folder, "spiece.model")
        if os.path.isfile(model_file):
            tok_cfg, cfg = _hf_json(folder, "tokenizer_config.json"), _hf_json(base, "config.json")
            extra = tok_cfg.get("extra_ids")
            if extra is None:
                sp = spm.SentencePieceProcessor()
                sp.Load(model_file)
                rows = cfg.get("vocab_size")
                extra = 100 if rows is None or sp.GetPieceSize() + 100 <= int(rows) else 0
            return Tokenizer(model_file, extra_ids=int(extra)), f"the target checkpoint's own vocabulary, {model_file}"
    tok_cfg, cfg = _hf_json(base, "tokenizer_config.json"), _hf_json(base, "config.json")
    named = {tok_cfg.get("tokenizer_class"), cfg.get("tokenizer_class")}
    if "ByT5Tokenizer" in named or cfg.get("vocab_size") == 384:
        extra = int(tok_cfg.get("extra_ids", 125))
        return Tokenizer.byt5(extra), "ByT5's byte vocabulary (the checkpoint is a ByT5 model)"
    return None


def resolve_tokenizer(
    checkpoint: str | os.PathLike, explicit: str | os.PathLike | None = None, fallback: str | None = None
) -> tuple[Tokenizer, str]:
    """The vocabulary to use with a checkpoint, and a note of where it came from (the CLI prints it on stderr).

    ``explicit`` (a ``--tokenizer`` path, or "byt5" for ``Tokenizer.byt5()``) first; else what the checkpoint
    brings (``checkpoint_tokenizer``: its ``spiece.model``, or ByT5's bytes); else ``fallback`` (a
    SentencePiece file, e.g. T5's 32k model) when it exists.

    Raises:
      FileNotFoundError: none of them (the message says to pass ``--tokenizer``).
    """
    if explicit:
        if str(explicit).lower() == "byt5":
            return Tokenizer.byt5(), "--tokenizer byt5 (ByT5's byte vocabulary)"
        return Tokenizer(explicit), f"--tokenizer {os.fspath(explicit)}"
    found = checkpoint_tokenizer(checkpoint)
    if found is not None:
        return found
    if fallback and os.path.isfile(fallback):
        return Tokenizer(fallback), f"{fallback}: T5's 32k vocabulary; the checkpoint ships no spiece.model"
    raise FileNotFoundError(
        f"No spiece.model beside {os.fspath(checkpoint)!r}, it is not a ByT5 checkpoint, and no fallback "
        f"vocabulary at {fallback!r}; pass --tokenizer SPIECE_MODEL (the vocabulary the checkpoint was "
        "trained with) or --tokenizer byt5."
    )


def madlad_language_prefix(tokenizer: Tokenizer, language: str) -> str:
    """MADLAD-400's target-language token for ``language`` (e.g. "de" -> "<2de> "), to prepend to the input.

    MADLAD-400 (Kudugunta et al. 2023, section 4) marks the target language with a ``<2xx>`` piece of its
    SentencePiece vocabulary.

    Raises:
      ValueError: the vocabulary has no ``<2xx>`` piece (not a MADLAD-style vocabulary, or an unknown code).
    """
    code = language.strip()
    piece = code if code.startswith("<2") and code.endswith(">") else f"<2{code}>"
    if tokenizer.piece_id(piece) is None:
        raise ValueError(
            f"--to {language}: the vocabulary ({tokenizer.path}) has no {piece} piece; --to needs a MADLAD-400 "
            "style vocabulary with <2xx> target-language tokens (e.g. <2de>), or use --prefix for other models."
        )
    return piece + " "


def as_tokenizer(tokenizer) -> Tokenizer:
    """A ``Tokenizer`` from what an API or CLI place was given: a ``Tokenizer`` (returned as is), a
    ``seqio.SentencePieceVocabulary`` (``Tokenizer.from_seqio``), "byt5"
    (``Tokenizer.byt5()``), or a path to a SentencePiece model (``Tokenizer(path)``, T5's 100 extra ids).

    Raises:
      ValueError: another kind of object (the message names its type). FileNotFoundError: no model at a path.
    """
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, str) and tokenizer.lower() == "byt5":
        return Tokenizer.byt5()
    if isinstance(tokenizer, (str, os.PathLike)):
        return Tokenizer(tokenizer)
    if hasattr(tokenizer, "sp_model") or type(tokenizer).__module__.startswith("seqio"):
        return Tokenizer.from_seqio(tokenizer)
    raise ValueError(
        f"Expected a specjax.Tokenizer, a seqio.SentencePieceVocabulary or a SentencePiece model "
        f"path, got {type(tokenizer).__name__}."
    )
