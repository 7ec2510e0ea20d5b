"""Raw HTTP for the server's own parser: requests that are not HTTP, and a WebSocket upgrade."""

from __future__ import annotations

import socket

import orjson

# Bytes the HTTP parser refuses before any route sees them: framing a request cannot be read by.
NOT_HTTP = [
    b"GET /admin/policy HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: z\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: zz\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\n"
    b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n",
    b"NOT AN HTTP REQUEST\r\n\r\n",
]


def not_http_error(url: str, request: bytes) -> dict:
    """Send raw bytes to the gateway at url; return the error of its 400, read until it closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as raw:
        raw.sendall(request)
        answer = b""
        while data := raw.recv(65536):  # the gateway closes the connection after it
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), (request, answer)
    assert b"content-type: application/json" in head.lower(), answer
    error: dict = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


# A WebSocket handshake: the gateway serves no WebSockets, so it answers as plain HTTP.
UPGRADE = {
    "connection": "Upgrade",
    "upgrade": "websocket",
    "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    "sec-websocket-version": "13",
}
