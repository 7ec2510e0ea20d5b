"""The HTTP/1.1 server protocol the gateway runs under: uvicorn's httptools protocol, with the
gateway's limits on what a connection may take before any route sees it.

- A malformed request (an unknown transfer coding, a non-numeric Content-Length, a broken
  request line) is refused by the parser. uvicorn answers it in plain text; a client of an
  OpenAI-compatible API reads error bodies as JSON, so the gateway answers in the same shape as
  every other 400. This overrides uvicorn's `send_400_response`, which its httptools protocol
  calls for exactly that case (uvicorn 0.30 to 0.54 at least);
  tests/ingress/test_hostile_requests.py fails if a uvicorn release stops calling it.
- A request head (request line and headers) larger than `max_head_bytes` is refused with 431:
  as soon as its bytes pass the limit while it is still arriving, before the parser holds more
  of it (an endless header line would otherwise grow in memory, joined again with every read),
  and, for a head that arrived whole in one read, once the parser has it, before any route
  sees the request.
- Past `max_connections` open connections, a new one is answered 503 and closed at once.
- A client that reads nothing of its answer for `write_timeout_s` (the connection's send buffer
  stays full) is disconnected: the request then ends as a client that went away, and its
  backend slot comes back.

A refusal closes the connection lingering, as nginx does: the answer goes out, then the write
side is shut and what the client is still sending is read and dropped for up to `LINGER_S`.
Closing at once would leave its bytes unread, and the kernel would answer them with a reset
that can discard the refusal before the client reads it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import GatewayError, HeadersTooLarge, InvalidHttp, TooManyConnections
from gateway.settings import Settings

log = logging.getLogger(__name__)
LINGER_S = 2.0
# The request line's bytes beside its target ("GET ", " HTTP/1.1\r\n") and the head's last CRLF;
# each header adds its name, its value and ": \r\n".
HEAD_OVERHEAD = 20
HEADER_OVERHEAD = 4

_NOT_HTTP = InvalidHttp(
    "The request is not valid HTTP/1.1 (its request line or a framing header such as "
    "Transfer-Encoding or Content-Length is malformed)."
)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may take: its share of connections, its head, its stalls."""

    max_connections: int = 4096
    max_head_bytes: int = 64 * 1024
    write_timeout_s: float = 30.0

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            settings.max_connections, settings.max_header_bytes, settings.client_write_timeout_s
        )


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering in the OpenAI error shape, within its limits."""

    limits = Limits()

    @classmethod
    def within(cls, limits: Limits) -> type[HttpProtocol]:
        """Return the protocol class to give uvicorn for these limits."""
        return type("HttpProtocol", (cls,), {"limits": limits})

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._in_head = True
        self._stalled: asyncio.TimerHandle | None = None
        self._refused = False
        self._too_large: HeadersTooLarge | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                TooManyConnections(
                    f"the gateway has its {self.limits.max_connections} connections open; "
                    "retry in a moment"
                )
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._unstall()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: read and dropped
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # Counted per read, checked once the parser has seen it: a read that ends the head
        # carries the start of the body too. The parser holds at most the limit and one read.
        over = self._in_head and self._head_bytes > self.limits.max_head_bytes
        if over and not self._refused and not self.transport.is_closing():
            self._refuse(self._oversized())

    def on_headers_complete(self) -> None:
        self._in_head = False
        size = HEAD_OVERHEAD + len(self.url)
        size += sum(len(name) + len(value) + HEADER_OVERHEAD for name, value in self.headers)
        if size > self.limits.max_head_bytes:
            # Raised in the parser's callback, it stops the parsing: uvicorn then answers the
            # request as malformed, through send_400_response, which answers this instead.
            self._too_large = self._oversized()
            raise self._too_large
        super().on_headers_complete()

    def _oversized(self) -> HeadersTooLarge:
        return HeadersTooLarge(
            f"the request line and headers exceed {self.limits.max_head_bytes} bytes"
        )

    def on_message_complete(self) -> None:
        # What arrives next is the next request's head.
        self._in_head, self._head_bytes = True, 0
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        self._refuse(self._too_large or _NOT_HTTP)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            loop = asyncio.get_running_loop()
            self._stalled = loop.call_later(self.limits.write_timeout_s, self._cut)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _cut(self) -> None:
        self._stalled = None
        log.warning("disconnected a client that read nothing for %g s", self.limits.write_timeout_s)
        # Closing would wait to flush what the client does not read: drop it instead.
        self.transport.abort()

    def _refuse(self, error: GatewayError) -> None:
        """Answer an error in the OpenAI shape and close the connection: it carries no more."""
        body = error.body()
        head = [b"HTTP/1.1 %d %s\r\n" % (error.status, error.reason.encode())]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(
            b"content-type: application/json\r\n"
            b"content-length: %d\r\n"
            b"connection: close\r\n\r\n" % len(body)
        )
        self.transport.write(b"".join(head) + body)
        self._refused = True
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)
