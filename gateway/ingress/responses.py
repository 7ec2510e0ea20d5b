"""The Responses API (`POST /v1/responses`), served through chat completions.

Serving engines speak chat completions; clients of 2026 also speak the Responses API. A
Responses request is translated into the chat completions request it means, which is then
classified, routed, mirrored, recorded and forwarded like any other chat request (records say
`chat`); only the answer going back to the client is translated, so shadow copies and their
comparisons see chat completions on both sides.

- `input` (a string, or items: messages with text or image parts, `function_call` and
  `function_call_output` items) and `instructions` become messages; `max_output_tokens`,
  `temperature`, `top_p`, `tools` (function tools), `tool_choice` and `text.format` become
  their chat counterparts. What the gateway takes of a request is its description
  (gateway/routing/bodies.py): server-side state (`previous_response_id`) and built-in tools
  are refused with a 400 that says so.
- A whole answer becomes a `response` object; a stream becomes the typed events
  (`response.created` ... `response.output_text.delta` ... `response.completed`), each with
  its `sequence_number`. Errors keep OpenAI's error shape, as they are.
- `usage.prompt_tokens_details.cached_tokens` becomes `usage.input_tokens_details.cached_tokens`
  (0 when the engine does not say), and llama.cpp's `timings` go where its own Responses API
  puts them: beside the `response` of the `response.completed` event, and, in a whole answer,
  in the `response` object itself.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.compare.events import EventReader
from gateway.routing import bodies
from gateway.upstream.asgi import Message, Send
from gateway.upstream.usage import cached


def to_chat(payload: Any) -> dict[str, Any]:
    """Return the chat completions request a Responses request means; raise InvalidRequest
    for one its description (gateway/routing/bodies.py) refuses."""
    bodies.check("responses", payload)
    chat: dict[str, Any] = {"model": payload["model"]}
    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages += _messages(payload["input"])
    chat["messages"] = messages
    if payload.get("max_output_tokens") is not None:
        chat["max_tokens"] = int(payload["max_output_tokens"])  # checked: whole, maybe 64.0
    for name in ("temperature", "top_p", "seed", "user", "parallel_tool_calls", "prompt_cache_key"):
        if payload.get(name) is not None:
            chat[name] = payload[name]
    if payload.get("tools"):
        chat["tools"] = [_tool(tool) for tool in payload["tools"]]
    if payload.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(payload["tool_choice"])
    response_format = _format(payload.get("text", {}).get("format"))
    if response_format is not None:
        chat["response_format"] = response_format
    if payload.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _messages(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages: list[dict[str, Any]] = []
    for item in value:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _content(item["content"])})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id", ""),
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments", "")},
            }
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:  # function_call_output
            output = item["output"]
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": output if isinstance(output, str) else orjson.dumps(output).decode(),
                }
            )
    return messages


def _content(content: str | list[dict[str, Any]]) -> Any:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": part["text"]}
        if part["type"] != "input_image"
        else {"type": "image_url", "image_url": {"url": part["image_url"]}}
        for part in content
    ]


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    keys = ("name", "description", "parameters", "strict")
    return {"type": "function", "function": {k: tool[k] for k in keys if k in tool}}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(form: dict[str, Any] | None) -> dict[str, Any] | None:
    if form is None or form["type"] == "text":
        return None
    if form["type"] == "json_schema":
        schema = {key: form[key] for key in ("name", "schema", "strict") if key in form}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": "json_object"}


class ResponsesRelay:
    """An ASGI `send` that turns a chat completions answer into the Responses API's."""

    def __init__(self, send: Send, decision_id: str, request: dict[str, Any], stream: bool):
        self._send = send
        self._id = f"resp_{decision_id}"
        self._item = f"msg_{decision_id}"
        self._request = request
        self._stream = stream
        self._translate = True
        self._whole: list[bytes] = []
        self._events = EventReader()
        self._sequence = 0
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self._timings: Any = None
        self._finish: str | None = None
        self._model = str(request.get("model", ""))
        self._started = False
        self._start: dict[str, Any] = {}

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._translate = message["status"] == 200
            if not self._translate or self._stream:
                await self._send(message)
            else:
                self._start = message
            return
        if not self._translate:
            await self._send(message)
            return
        body, more = message.get("body", b""), message.get("more_body", False)
        if not self._stream:
            self._whole.append(body)
            if not more:
                await self._whole_answer()
            return
        out = b"".join(self._event(data.strip()) for data in self._events.feed(body))
        if out or not more:
            await self._send({"type": "http.response.body", "body": out, "more_body": more})

    async def _whole_answer(self) -> None:
        try:
            chat = orjson.loads(b"".join(self._whole))
        except orjson.JSONDecodeError:
            chat = {}
        choice = (chat.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        self._model = chat.get("model", self._model)
        self._usage = chat.get("usage")
        self._finish = choice.get("finish_reason")
        self._timings = chat.get("timings")
        if isinstance(message.get("content"), str):
            self._text.append(message["content"])
        for i, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            self._calls[i] = {
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": function.get("arguments", ""),
            }
        response = self._response("completed")
        if self._timings is not None:
            response["timings"] = self._timings
        body = orjson.dumps(response)
        headers = [
            (name, value)
            for name, value in self._start.get("headers", [])
            if name.lower() != b"content-length"
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    def _event(self, data: bytes) -> bytes:
        """Return the Responses events one chat completions event means."""
        if not data:
            return b""
        if data == b"[DONE]":
            return self._finished()
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        if "error" in chunk:
            return (
                self._emit("error", **chunk["error"]) if isinstance(chunk["error"], dict) else b""
            )
        out = [] if self._started else self._opening()
        self._started = True
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        if chunk.get("timings") is not None:
            self._timings = chunk["timings"]
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
            text = delta.get("content")
            if isinstance(text, str) and text:
                self._text.append(text)
                out.append(
                    self._emit(
                        "response.output_text.delta",
                        item_id=self._item,
                        output_index=0,
                        content_index=0,
                        delta=text,
                    )
                )
            for call in delta.get("tool_calls") or ():
                out.append(self._call_delta(call))
        return b"".join(out)

    def _opening(self) -> list[bytes]:
        pending = self._response("in_progress", output=[])
        return [
            self._emit("response.created", response=pending),
            self._emit("response.in_progress", response=pending),
            self._emit(
                "response.output_item.added",
                output_index=0,
                item={**self._message("in_progress"), "content": []},
            ),
            self._emit(
                "response.content_part.added",
                item_id=self._item,
                output_index=0,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            ),
        ]

    def _call_delta(self, call: dict[str, Any]) -> bytes:
        index = int(call.get("index") or 0)
        function = call.get("function") or {}
        out = []
        if index not in self._calls:
            self._calls[index] = {
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": "",
            }
            out.append(
                self._emit(
                    "response.output_item.added",
                    output_index=index + 1,
                    item={**self._function_call(index, "in_progress"), "arguments": ""},
                )
            )
        piece = function.get("arguments") or ""
        if piece:
            self._calls[index]["arguments"] += piece
            out.append(
                self._emit(
                    "response.function_call_arguments.delta",
                    item_id=f"fc_{index}_{self._id}",
                    output_index=index + 1,
                    delta=piece,
                )
            )
        return b"".join(out)

    def _finished(self) -> bytes:
        text = "".join(self._text)
        part = {"type": "output_text", "text": text, "annotations": []}
        out = [] if self._started else self._opening()
        out += [
            self._emit(
                "response.output_text.done",
                item_id=self._item,
                output_index=0,
                content_index=0,
                text=text,
            ),
            self._emit(
                "response.content_part.done",
                item_id=self._item,
                output_index=0,
                content_index=0,
                part=part,
            ),
            self._emit(
                "response.output_item.done", output_index=0, item=self._message("completed")
            ),
        ]
        for index, call in self._calls.items():
            out += [
                self._emit(
                    "response.function_call_arguments.done",
                    item_id=f"fc_{index}_{self._id}",
                    output_index=index + 1,
                    arguments=call["arguments"],
                ),
                self._emit(
                    "response.output_item.done",
                    output_index=index + 1,
                    item=self._function_call(index, "completed"),
                ),
            ]
        completed = {"response": self._response("completed")}
        if self._timings is not None:
            completed["timings"] = self._timings
        out.append(self._emit("response.completed", **completed))
        return b"".join(out)

    def _message(self, status: str) -> dict[str, Any]:
        return {
            "id": self._item,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": "".join(self._text), "annotations": []}],
        }

    def _function_call(self, index: int, status: str) -> dict[str, Any]:
        call = self._calls[index]
        return {
            "id": f"fc_{index}_{self._id}",
            "type": "function_call",
            "status": status,
            "call_id": call["id"],
            "name": call["name"],
            "arguments": call["arguments"],
        }

    def _response(self, status: str, output: list[Any] | None = None) -> dict[str, Any]:
        if output is None:
            output = [self._message("completed")] if self._text or not self._calls else []
            output += [self._function_call(i, "completed") for i in self._calls]
        incomplete = status == "completed" and self._finish == "length"
        request = self._request
        usage = self._usage or {}
        return {
            "id": self._id,
            "object": "response",
            "created_at": int(time.time()),
            "status": "incomplete" if incomplete else status,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "model": self._model,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "temperature": request.get("temperature"),
            "top_p": request.get("top_p"),
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "tool_choice": request.get("tool_choice", "auto"),
            "tools": request.get("tools", []),
            "text": request.get("text", {"format": {"type": "text"}}),
            "metadata": request.get("metadata") or {},
            "output": output,
            "usage": {
                "input_tokens": usage.get("prompt_tokens", 0),
                "input_tokens_details": {"cached_tokens": cached(usage) or 0},
                "output_tokens": usage.get("completion_tokens", 0),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": usage.get("total_tokens", 0),
            }
            if usage
            else None,
        }

    def _emit(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
