"""The model's tokenizer: byte-level BPE, as GPT-2's, in the form llama.cpp reads from a GGUF.

Text is split by GPT-2's pre-tokenizer pattern (llama.cpp's `gpt-2` pre-tokenizer), each piece
is written in GPT-2's byte-to-character alphabet, and merges learned from the corpus join
letters into longer tokens. Digits are never merged, so a number is read digit by digit, which
is what lets a small model add. The ChatML markers are control tokens of their own.

tests/realfleet/test_model.py checks that llama-server's /tokenize gives the same ids as
`encode` on the suite, so what the model was trained on is what the engine feeds it.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from realfleet.corpus import SPECIAL

# GPT-2's pattern, for the ASCII text of the corpus (\p{L} and \p{N} as ASCII classes).
PIECES = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""
)
SPLIT_SPECIAL = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL) + ")")
PRE_TOKENIZER = "gpt-2"


@cache
def byte_alphabet() -> tuple[str, ...]:
    """Return GPT-2's printable character for each byte value, 0 to 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))


WORD = re.compile(byte_alphabet()[ord(" ")] + "?[A-Za-z]+")


def _symbols(piece: str) -> list[str]:
    alphabet = byte_alphabet()
    return [alphabet[b] for b in piece.encode("utf-8")]


def _mergeable(a: str, b: str) -> bool:
    # Letters, with at most a leading space: digits and punctuation stay single bytes.
    return WORD.fullmatch(a + b) is not None


@dataclass(frozen=True, eq=False)  # hashed by identity: its encodings are cached
class Tokenizer:
    """A vocabulary (bytes, merged tokens, control tokens) and the merges in rank order."""

    tokens: tuple[str, ...]
    merges: tuple[tuple[str, str], ...]

    @property
    def ids(self) -> dict[str, int]:
        return _index(self.tokens)

    @property
    def special_ids(self) -> dict[str, int]:
        ids = self.ids
        return {s: ids[s] for s in SPECIAL}

    def encode(self, text: str) -> list[int]:
        """Return the ids of `text`, control markers included, as llama.cpp tokenizes it."""
        ids, out = self.ids, []
        for part in SPLIT_SPECIAL.split(text):
            if part in SPECIAL:
                out.append(ids[part])
                continue
            for piece in PIECES.findall(part):
                out += _piece_ids(self, piece)
        return out

    def hugging_face(self) -> dict[str, Any]:
        """Return this tokenizer as a Hugging Face `tokenizer.json`, for clients that count tokens
        with `transformers` (load generators such as aiperf): byte-level BPE with GPT-2's
        pre-tokenizer, the merges in rank order and the control markers as special tokens."""
        ids = self.ids
        byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        marker = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
        markers = [{"id": ids[s], "content": s, **marker, "special": True} for s in SPECIAL]
        bpe = {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
               "continuing_subword_prefix": None, "end_of_word_suffix": None,
               "byte_fallback": False, "ignore_merges": False}  # fmt: skip
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": markers,
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", **byte_level},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", **byte_level},
            "model": {
                **bpe,
                "vocab": {t: i for t, i in ids.items() if t not in SPECIAL},
                "merges": [[a, b] for a, b in self.merges],
            },
        }

    def decode(self, ids: Iterable[int]) -> str:
        """Return the text of `ids` (control markers as their text)."""
        back = {c: b for b, c in enumerate(byte_alphabet())}
        data = bytearray()
        for i in ids:
            token = self.tokens[i]
            data += token.encode() if token in SPECIAL else bytes(back[c] for c in token)
        return data.decode("utf-8", errors="replace")


@cache
def _index(tokens: tuple[str, ...]) -> dict[str, int]:
    return {t: i for i, t in enumerate(tokens)}


@cache
def _piece_ids(tok: Tokenizer, piece: str) -> list[int]:
    ids = tok.ids
    return [ids[s] for s in _bpe(tok.merges, piece)]


def _bpe(merges: tuple[tuple[str, str], ...], piece: str) -> list[str]:
    ranks = _ranks(merges)
    symbols = _symbols(piece)
    while len(symbols) > 1:
        ranked = [
            (ranks[pair], i) for i, pair in enumerate(itertools.pairwise(symbols)) if pair in ranks
        ]
        if not ranked:
            break
        _, i = min(ranked)
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    return symbols


@cache
def _ranks(merges: tuple[tuple[str, str], ...]) -> dict[tuple[str, str], int]:
    return {pair: rank for rank, pair in enumerate(merges)}


def train(texts: Iterable[str], merges: int = 400) -> Tokenizer:
    """Learn `merges` merges from `texts` (most frequent pair first, ties by the pair)."""
    words: Counter[tuple[str, ...]] = Counter()
    for text in texts:
        for part in SPLIT_SPECIAL.split(text):
            if part not in SPECIAL:
                words.update(tuple(_symbols(p)) for p in PIECES.findall(part))
    learned: list[tuple[str, str]] = []
    for _ in range(merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in itertools.pairwise(word):
                if _mergeable(a, b):
                    pairs[a, b] += count
        if not pairs:
            break
        top = max(pairs.values())
        pair = min(p for p, c in pairs.items() if c == top)
        learned.append(pair)
        words = Counter({_join(word, pair): count for word, count in words.items()})
    merged = dict.fromkeys(a + b for a, b in learned)  # one token however it was reached
    tokens = (*byte_alphabet(), *merged, *SPECIAL)
    return Tokenizer(tokens, tuple(learned))


def _join(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)
