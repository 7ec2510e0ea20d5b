"""OpenAI response bodies and server-sent-event chunks, built from a device's answer."""

from __future__ import annotations

import base64
import time
import uuid
from array import array
from collections.abc import Sequence
from typing import Any

import orjson

from simulator.answers import Answer
from simulator.precision import TokenLogprob
from simulator.profile import ModelSpec

DONE = b"data: [DONE]\n\n"


def new_id(prefix: str) -> str:
    """Return a fresh response id such as `chatcmpl-…`."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """Return OpenAI's `usage` object, with the prompt tokens the prefix cache held."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def chat_completion(
    model: str, answer: Answer, prompt_tokens: int, cached_tokens: int
) -> dict[str, Any]:
    """Return a `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.text, "refusal": None}
    if answer.tool_call is not None:
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": answer.tool_call.id,
                "type": "function",
                "function": {"name": answer.tool_call.name, "arguments": answer.text},
            }
        ]
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": chat_logprobs(answer.logprobs),
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": usage(prompt_tokens, answer.completion_tokens, cached_tokens),
    }


def text_completion(
    model: str, answer: Answer, prompt_tokens: int, cached_tokens: int
) -> dict[str, Any]:
    """Return a `text_completion` object."""
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": answer.text,
                "logprobs": text_logprobs(answer.logprobs),
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": usage(prompt_tokens, answer.completion_tokens, cached_tokens),
    }


def chat_logprobs(entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
    """Return a chat choice's `logprobs` object (None when they were not asked for)."""
    if entries is None:
        return None
    return {"content": [_chat_entry(entry) for entry in entries], "refusal": None}


def _chat_entry(entry: TokenLogprob) -> dict[str, Any]:
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.token.encode()),
        "top_logprobs": [
            {"token": token, "logprob": logprob, "bytes": list(token.encode())}
            for token, logprob in entry.top
        ],
    }


def text_logprobs(entries: Sequence[TokenLogprob] | None, offset: int = 0) -> dict[str, Any] | None:
    """Return a legacy completion's `logprobs` object, text offsets counted from `offset`."""
    if entries is None:
        return None
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [dict(entry.top) for entry in entries],
        "text_offset": offsets,
    }


def embedding_list(
    model: str,
    vectors: Sequence[list[float]],
    prompt_tokens: int,
    *,
    encoding_format: str,
) -> dict[str, Any]:
    """Return an embeddings `list` object, vectors as floats or base64 little-endian float32."""
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": _base64(vector) if encoding_format == "base64" else vector,
        }
        for index, vector in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def model_entry(model: ModelSpec, created: int) -> dict[str, Any]:
    """Return a `model` object."""
    return {"id": model.name, "object": "model", "created": created, "owned_by": "simulator"}


def _base64(vector: list[float]) -> str:
    packed = array("f", vector)
    if packed.itemsize != 4:  # pragma: no cover - every supported platform has 32-bit floats
        raise RuntimeError("float32 arrays are not 4 bytes on this platform")
    return base64.b64encode(packed.tobytes()).decode()


class ChunkEncoder:
    """Encode a streaming answer as OpenAI SSE chunks, one per decoded token.

    The first chunk carries the role (or opens the tool call) with the first token, so the
    first body byte a client sees is the first token.
    """

    def __init__(self, endpoint: str, model: str, answer: Answer, *, include_usage: bool):
        self.answer = answer
        self.include_usage = include_usage
        self.chat = endpoint == "chat"
        self.envelope: dict[str, Any] = {
            "id": new_id("chatcmpl" if self.chat else "cmpl"),
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        head = orjson.dumps(self.envelope)[:-1]
        tail = b',"logprobs":null,"finish_reason":null}]'
        tail += b',"usage":null}\n\n' if include_usage else b"}\n\n"
        if self.chat and answer.tool_call is not None:
            self._prefix = (
                b"data: " + head + b',"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
                b'"function":{"arguments":'
            )
            self._suffix = b"}}]}" + tail
        elif self.chat:
            self._prefix = b"data: " + head + b',"choices":[{"index":0,"delta":{"content":'
            self._suffix = b"}" + tail
        else:
            self._prefix = b"data: " + head + b',"choices":[{"index":0,"text":'
            self._suffix = tail

    def tokens(self, start: int, stop: int) -> bytes:
        """Return the chunks for the answer's tokens `start` to `stop` (exclusive)."""
        pieces = self.answer.pieces
        out: list[bytes] = []
        if start == 0 and stop > 0:
            out.append(self._opening())
            start = 1
        if self.answer.logprobs is not None:
            out.extend(self._with_logprobs(index) for index in range(start, stop))
            return b"".join(out)
        prefix, suffix = self._prefix, self._suffix
        for index in range(start, stop):
            out.append(prefix + orjson.dumps(pieces[index]) + suffix)
        return b"".join(out)

    def closing(self, prompt_tokens: int, cached_tokens: int) -> bytes:
        """Return the final chunk (finish reason), the usage chunk if asked for, and `[DONE]`."""
        reason = self.answer.finish_reason
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {},
                "logprobs": None,
                "finish_reason": reason,
            }
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
        out = [self._event({"choices": [choice]})]
        if self.include_usage:
            totals = usage(prompt_tokens, self.answer.completion_tokens, cached_tokens)
            out.append(self._event({"choices": [], "usage": totals}, with_null_usage=False))
        out.append(DONE)
        return b"".join(out)

    def _opening(self) -> bytes:
        answer = self.answer
        first = answer.pieces[0]
        if not self.chat:
            choice: dict[str, Any] = {"index": 0, "text": first}
        elif answer.tool_call is not None:
            call = {
                "index": 0,
                "id": answer.tool_call.id,
                "type": "function",
                "function": {"name": answer.tool_call.name, "arguments": first},
            }
            choice = {
                "index": 0,
                "delta": {"role": "assistant", "content": None, "tool_calls": [call]},
            }
        else:
            choice = {"index": 0, "delta": {"role": "assistant", "content": first}}
        choice["logprobs"] = self._logprobs(0)
        choice["finish_reason"] = None
        return self._event({"choices": [choice]})

    def _with_logprobs(self, index: int) -> bytes:
        piece = self.answer.pieces[index]
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}}
        else:
            choice = {"index": 0, "text": piece}
        choice["logprobs"] = self._logprobs(index)
        choice["finish_reason"] = None
        return self._event({"choices": [choice]})

    def _logprobs(self, index: int) -> dict[str, Any] | None:
        entries = self.answer.logprobs
        if entries is None:
            return None
        if self.chat:
            return chat_logprobs(entries[index : index + 1])
        offset = sum(len(piece) for piece in self.answer.pieces[:index])
        return text_logprobs(entries[index : index + 1], offset)

    def _event(self, fields: dict[str, Any], *, with_null_usage: bool = True) -> bytes:
        payload = {**self.envelope, **fields}
        if self.include_usage and with_null_usage:
            payload["usage"] = None
        return b"data: " + orjson.dumps(payload) + b"\n\n"
