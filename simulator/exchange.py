"""One HTTP exchange over raw ASGI: read the request, answer it, or cut the connection.

Raw ASGI keeps the per-token cost of a stream to one `send` call. Cutting a connection
without a (complete) response is what faults need and what ASGI cannot express, so the
server hands each request its transport under the `TRANSPORT_EXTENSION` scope extension,
with the callbacks to run the moment the connection is lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import orjson

from simulator.errors import ApiError, InvalidRequest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = Iterable[tuple[bytes, bytes]]

TRANSPORT_EXTENSION = "simulator.transport"
JSON = b"application/json"


class Exchange:
    """A request on its way to a response; remembers the status it was answered with."""

    def __init__(self, scope: Scope, receive: Receive, send: Send):
        self.scope = scope
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.status: int | None = None
        self._receive = receive
        self._send = send
        self._body: bytes | None = None
        self._disconnected = False
        self._on_end: Callable[[], None] | None = None

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, when the exchange ends: answered, or its client gone."""
        self._on_end = callback

    def end(self) -> None:
        """End the exchange (once, however often called)."""
        callback, self._on_end = self._on_end, None
        if callback is not None:
            callback()

    async def body(self) -> bytes:
        """Return the whole request body."""
        if self._body is None:
            chunks: list[bytes] = []
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    self._disconnected = True
                    break
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            self._body = b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        """Return the request body parsed as JSON."""
        try:
            return orjson.loads(await self.body())
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"the request body is not valid JSON: {exc}") from exc

    async def respond(
        self, status: int, body: bytes, content_type: bytes, headers: Headers = ()
    ) -> None:
        """Send a complete response."""
        self.status = status
        await self._send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    *headers,
                ],
            }
        )
        await self._send({"type": "http.response.body", "body": body})

    async def respond_json(self, status: int, payload: Any, headers: Headers = ()) -> None:
        """Send a JSON response."""
        await self.respond(status, orjson.dumps(payload), JSON, headers)

    async def respond_error(self, error: ApiError) -> None:
        """Send an error in OpenAI's shape."""
        await self.respond_json(error.status, error.body())

    async def start_stream(self, headers: Headers = ()) -> None:
        """Send the headers of a server-sent-events response."""
        self.status = 200
        await self._send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    *headers,
                ],
            }
        )

    async def write(self, data: bytes) -> None:
        """Send part of a streaming body."""
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end_stream(self, data: bytes = b"") -> None:
        """Send the last part of a streaming body."""
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def wait_disconnect(self) -> None:
        """Wait until the client goes away (or the response is complete)."""
        while not self._disconnected:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._disconnected = True

    def on_disconnect(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` as soon as the connection is lost; return what stops watching.

        It runs in the server's own `connection_lost`, before any request that arrived in
        the same loop turn is handled: a client that went away never overlaps its successor.
        """
        lost: list[Callable[[], None]] = self._extension()["lost"]
        lost.append(callback)

        def stop() -> None:
            if callback in lost:
                lost.remove(callback)

        return stop

    def _extension(self) -> dict[str, Any]:
        extension: dict[str, Any] | None = self.scope.get("extensions", {}).get(TRANSPORT_EXTENSION)
        if extension is None:
            raise RuntimeError(
                "the server did not expose its transport; run the simulator with simulator.server"
            )
        return extension

    async def sever(self) -> None:
        """Close the connection now, without a response or in the middle of one."""
        self._extension()["transport"].close()
        # Returning before the server notices would make it log a missing response.
        await self.wait_disconnect()
