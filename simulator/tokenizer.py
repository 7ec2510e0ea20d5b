"""The simulator's tokenizer: deterministic, fast, and close to BPE counts for English.

A token is a run of up to six letters or digits, or a single other non-space character;
whitespace belongs to the token that follows it. "Hello, world" is three tokens
("Hello", ",", " world"); "internationally" is three ("intern", "ationa", "lly"). English
prose comes out near 1.3 tokens per word, as with Llama's tokenizer. Prompt counts and
generated text use the same rule, so `usage` is exact for this tokenizer.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\w{1,6}|[^\w\s]")
_PIECE = re.compile(r"\s*(?:\w{1,6}|[^\w\s])")


def count_tokens(text: str) -> int:
    """Return the number of tokens in `text`."""
    return len(_TOKEN.findall(text))


def split_tokens(text: str) -> list[str]:
    """Split `text` into token pieces whose concatenation is `text` again."""
    pieces = _PIECE.findall(text)
    consumed = sum(map(len, pieces))
    if consumed < len(text):
        # Only trailing whitespace is left over; it rides on the last token.
        tail = text[consumed:]
        if pieces:
            pieces[-1] += tail
        else:
            pieces.append(tail)
    return pieces
