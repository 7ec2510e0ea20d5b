"""The ops app's guard: the admin token before the body, and every body within its limits."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson

from harness.gateways import GatewayServer, run_gateway
from policies import fleet_policy

TOKEN = "guard-admin-token"


def exchange(server: GatewayServer, head: bytes, body: bytes = b"") -> tuple[bytes, dict]:
    """Send a raw request head (and maybe part of a body); return the status line and error."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as raw:
        raw.sendall(head + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            chunk = raw.recv(65536)
            assert chunk, data
            data += chunk
    status = data.partition(b"\r\n")[0]
    return status, orjson.loads(data.partition(b"\r\n\r\n")[2])["error"]


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            return int(value)
    return 1 << 30


def test_an_admin_request_without_the_token_is_refused_before_its_body_is_read(
    tmp_path: Path,
) -> None:
    # A declared gigabyte, none of it sent: only the headers can decide.
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw:
        status, error = exchange(
            gw, b"PUT /admin/policy HTTP/1.1\r\nhost: gw\r\ncontent-length: 1000000000\r\n"
        )
    assert status == b"HTTP/1.1 401 Unauthorized"
    assert error["code"] == "invalid_admin_token"


def test_an_admin_body_over_the_limit_is_413_even_with_the_token(tmp_path: Path) -> None:
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN, max_body_bytes=1000) as gw:
        status, error = exchange(
            gw,
            b"PUT /admin/policy HTTP/1.1\r\nhost: gw\r\ncontent-length: 5000\r\n"
            b"authorization: Bearer " + TOKEN.encode() + b"\r\n",
        )
        # Undeclared (chunked): counted as it arrives.
        chunked, error2 = exchange(
            gw,
            b"POST /admin/policy/validate HTTP/1.1\r\nhost: gw\r\n"
            b"transfer-encoding: chunked\r\nauthorization: Bearer " + TOKEN.encode() + b"\r\n",
            b"%x\r\n%s\r\n" % (2000, b"x" * 2000),
        )
    assert status == chunked == b"HTTP/1.1 413 Request Entity Too Large"
    assert error["code"] == error2["code"] == "request_too_large"


def test_an_admin_body_that_stops_arriving_is_cut_with_408(tmp_path: Path) -> None:
    settings = {"admin_token": TOKEN, "body_read_timeout_s": 0.5}
    with run_gateway(fleet_policy(), tmp_path, **settings) as gw:
        status, error = exchange(
            gw,
            b"PUT /admin/policy HTTP/1.1\r\nhost: gw\r\ncontent-length: 100\r\n"
            b"authorization: Bearer " + TOKEN.encode() + b"\r\n",
            b'{"yaml": "',
        )
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert error["code"] == "request_timeout"


def test_a_content_length_of_digits_that_are_not_ascii_is_400(tmp_path: Path) -> None:
    # "²" is a digit to Python's str.isdigit, but no number to int().
    with run_gateway(fleet_policy(), tmp_path) as gw:
        status, error = exchange(
            gw, b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: \xb2\r\n"
        )
    assert status == b"HTTP/1.1 400 Bad Request"
    assert "Content-Length" in error["message"]
