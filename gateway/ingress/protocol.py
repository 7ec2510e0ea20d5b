"""The HTTP/1.1 server protocol the gateway runs under: uvicorn's httptools protocol, with an
OpenAI-shaped answer to bytes that are not a valid HTTP request.

A malformed request (an unknown transfer coding, a non-numeric Content-Length, a broken request
line) is refused by the parser before any route sees it. uvicorn answers it in plain text; a
client of an OpenAI-compatible API reads error bodies as JSON, so the gateway answers in the
same shape as every other 400. This overrides uvicorn's `send_400_response`, which its
httptools protocol calls for exactly that case (uvicorn 0.30 to 0.54 at least);
tests/ingress/test_hostile_requests.py fails if a uvicorn release stops calling it.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import InvalidHttp

_NOT_HTTP = InvalidHttp(
    "The request is not valid HTTP/1.1 (its request line or a framing header such as "
    "Transfer-Encoding or Content-Length is malformed)."
).body()


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; a request the parser refuses gets the OpenAI error shape."""

    def send_400_response(self, msg: str) -> None:
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(
            b"content-type: application/json\r\n"
            b"content-length: %d\r\n"
            b"connection: close\r\n\r\n" % len(_NOT_HTTP)
        )
        self.transport.write(b"".join(head) + _NOT_HTTP)
        # The parser's state after an error is unknown, so the connection cannot carry another.
        self.transport.close()
