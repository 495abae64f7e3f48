"""Input and output lines of the subcommands that decode files (``generate``, its mesh path, ``bench``)."""

from __future__ import annotations

__all__ = ["encode_lines", "output_text"]


def encode_lines(tokenizer, lines, prefix: str, max_input_length: int, truncate: bool, first: int = 0) -> list:
    """Token id lists of ``prefix + line`` for every line; a line over ``max_input_length`` tokens is cut (ending in
    EOS) with ``truncate``, else ValueError naming its line number (``first`` is the index of ``lines[0]``)."""
    eos, rows = tokenizer.eos_id, []
    for i, line in enumerate(lines, first):
        ids = tokenizer.encode(prefix + line)
        if len(ids) > max_input_length:
            if not truncate:
                raise ValueError(
                    f"Input line {i + 1} encodes to {len(ids)} tokens, more than --max-input-length "
                    f"{max_input_length}; pass --truncate to cut it."
                )
            ids = ids[: max_input_length - 1] + [eos]
        rows.append(ids)
    return rows


def output_text(tokenizer, tokens, dropped: list) -> str:
    """One output line: the tokens' text with newlines replaced (ids beyond the vocabulary counted in ``dropped``)."""
    kept = [int(t) for t in tokens if t < tokenizer.vocab_size]
    dropped[0] += len(tokens) - len(kept)
    return tokenizer.decode(kept).replace("\n", " ").replace("\r", " ")
