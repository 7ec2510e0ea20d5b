"""The simulator's tokenizer: deterministic, fast, and close to Llama 3's counts by script.

A token is a run of up to six letters or digits, or a single other non-space character;
whitespace belongs to the token that follows it. "Hello, world" is three tokens
("Hello", ",", " world"); "internationally" is three ("intern", "ationa", "lly"). English
prose comes out near 4 characters per token, as with Llama 3's tokenizer (3.94).

Chinese, Japanese and Korean characters are not letters of a run: each is a token of its own,
or of two where the first character's code is a multiple of four, which gives 1.25 characters
per token, as Llama 3 measures 1.26 on modern Chinese. Prompt counts and generated text use the
same rule, so `usage` is exact for this tokenizer. Other alphabets (Cyrillic, Greek, Arabic...)
are runs of letters like Latin; no checked figure says what Llama 3 makes of them.

A token's id (`token_id`) is a stable 31-bit hash of its text: the vocabulary is every piece
the rule makes, and what an engine publishes of its KV cache (simulator/kv_events.py) names
tokens by id.
"""

from __future__ import annotations

import hashlib
import re

# Kana, CJK ideographs (and extension A, compatibility), Hangul syllables, fullwidth forms: the
# gateway's estimator (gateway/routing/classify.py) reads the same ranges.
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
_TOKEN = re.compile(rf"[^\W{CJK}]{{1,6}}|[{CJK}]+|[^\w\s]")
_PIECE = re.compile(rf"\s*(?:[^\W{CJK}]{{1,6}}|[{CJK}]+|[^\w\s])")
_CJK_RUN = re.compile(rf"[{CJK}]")


def _cjk_pieces(run: str) -> list[str]:
    """Split a run of CJK characters into tokens of one character, or two (see above)."""
    pieces, i = [], 0
    while i < len(run):
        size = 2 if ord(run[i]) % 4 == 0 and i + 1 < len(run) else 1
        pieces.append(run[i : i + size])
        i += size
    return pieces


def count_tokens(text: str) -> int:
    """Return the number of tokens in `text`."""
    if text.isascii():
        return len(_TOKEN.findall(text))
    return sum(
        len(_cjk_pieces(match)) if _CJK_RUN.match(match) else 1 for match in _TOKEN.findall(text)
    )


def split_tokens(text: str) -> list[str]:
    """Split `text` into token pieces whose concatenation is `text` again."""
    pieces = _PIECE.findall(text)
    if not text.isascii():
        pieces = [part for piece in pieces for part in _split_cjk(piece)]
    consumed = sum(map(len, pieces))
    if consumed < len(text):
        # Only trailing whitespace is left over; it rides on the last token.
        tail = text[consumed:]
        if pieces:
            pieces[-1] += tail
        else:
            pieces.append(tail)
    return pieces


def _split_cjk(piece: str) -> list[str]:
    bare = piece.lstrip()
    if not bare or not _CJK_RUN.match(bare):
        return [piece]
    parts = _cjk_pieces(bare)
    parts[0] = piece[: len(piece) - len(bare)] + parts[0]
    return parts


def token_id(token: str) -> int:
    """Return a token's id: a stable 31-bit hash of its text."""
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=4).digest(), "big") >> 1
