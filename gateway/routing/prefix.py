"""A prompt's prefix blocks: the chained hashes engines key their KV cache by, as the gateway
can compute them.

An engine caches a prompt's KV in fixed blocks of tokens and keys each block by a hash of its
tokens chained to the block before it (vLLM's automatic prefix caching, SGLang's radix tree,
llama.cpp's per-slot prompt cache match the same way: a prefix), so two prompts share cached
blocks exactly as far as they share a prefix. The gateway does not tokenize as each engine
does; it hashes the prompt's text as the backend will render it (each message's role and
content in order, tool definitions first, as chat templates put them in the system turn) in
blocks of `BLOCK_CHARS` characters, `BLOCK_TOKENS` tokens of English. The same prefix gives the
same blocks in every replica (blake2b of the text, not Python's per-process salted `hash`), and a
request's k-th block matches only where everything before it does. A block counts only when
it is whole, as an engine caches only whole blocks; a prompt's first `MAX_BLOCKS` are hashed
(131,072 tokens), so a body at the size limit costs no more than a long prompt. How many
tokens a block holds is the prompt's own: its estimated tokens over its characters
(`block_tokens`).

Pure: text in, hashes out. The index of which backend holds which block is
gateway/fleet/prefixes.py.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from gateway.fleet.prefixes import BLOCK_TOKENS

# BLOCK_TOKENS at English's 4 characters a token (gateway/routing/classify.py).
BLOCK_CHARS = BLOCK_TOKENS * 4
MAX_BLOCKS = 2048  # hashing a block costs about 2 µs
_SEPARATOR = "\x1e"  # between messages: no text a client sends renders the same across it


def rendered(endpoint: str, payload: dict[str, Any]) -> str:
    """Return the prompt's text in the order the backend renders it, or '' where it has none
    to cache (embeddings, token-id prompts)."""
    if endpoint == "chat":
        parts = []
        for field in ("tools", "functions"):
            if isinstance(payload.get(field), list) and payload[field]:
                parts.append(orjson.dumps(payload[field]).decode())
        for message in payload.get("messages") or ():
            if isinstance(message, dict):
                parts.append(f"{message.get('role')}:{_content(message)}")
        return _SEPARATOR.join(parts)
    if endpoint == "completions" and isinstance(payload.get("prompt"), str):
        return payload["prompt"]
    return ""


def blocks(text: str) -> tuple[int, ...]:
    """Return the chained hashes of the whole blocks of `text` (each names its whole prefix)."""
    size = BLOCK_CHARS
    whole = min(len(text) // size, MAX_BLOCKS)
    if not whole:
        return ()
    running = hashlib.blake2b(digest_size=8)
    found = []
    for i in range(whole):
        running.update(text[i * size : (i + 1) * size].encode())
        # The running digest covers every block so far: the chain. 63 bits, so it is a
        # non-negative int in every store (Redis, SQLite) the index may reach.
        found.append(int.from_bytes(running.copy().digest(), "big") >> 1)
    return tuple(found)


def block_tokens(prompt_tokens: int, text: str) -> float:
    """Return the tokens one block of a prompt holds: its estimate spread over its text."""
    return prompt_tokens * BLOCK_CHARS / len(text) if text else 0.0


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    calls = message.get("tool_calls")
    if calls:
        return f"{content or ''}{orjson.dumps(calls).decode()}"
    return content if isinstance(content, str) else ""
