"""The HTTP protocol's limits: a head too large, too many connections, a client not reading."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import orjson
import sqlalchemy as sa

from gateway.db.schema import request_records
from harness.gateways import GatewayServer, run_gateway
from harness.simulators import start_simulator
from policies import MODEL, fleet_policy

OFFLINE = fleet_policy()  # every backend unreachable: these limits come before any routing


def connect(server: GatewayServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=20)


def answer(raw: socket.socket) -> tuple[bytes, dict]:
    """Read until the gateway closes the connection; return the status line and error."""
    data = b""
    while chunk := raw.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], orjson.loads(body)["error"]


def test_a_head_over_the_limit_is_refused_with_431_before_it_ends(tmp_path: Path) -> None:
    with run_gateway(OFFLINE, tmp_path, max_header_bytes=4096) as gw, connect(gw) as raw:
        # An endless header line: it never ends, so only counting its bytes can stop it.
        raw.sendall(b"GET /healthz HTTP/1.1\r\nhost: gw\r\nx-filler: ")
        for _ in range(8):
            raw.sendall(b"a" * 1024)
        status, error = answer(raw)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert error["code"] == "request_header_fields_too_large" and "4096" in error["message"]


def test_a_refused_client_still_sending_gets_its_answer_and_no_reset(tmp_path: Path) -> None:
    with run_gateway(OFFLINE, tmp_path, max_header_bytes=4096) as gw, connect(gw) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nhost: gw\r\nx-filler: " + b"a" * 5000)
        data = b""
        while b"}}" not in data:  # the whole 431 answer, before the connection ends
            data += raw.recv(65536)
        assert data.startswith(b"HTTP/1.1 431")
        # The client goes on sending what it had: the gateway reads and drops it (a close
        # with those bytes unread would answer them with a reset), then ends the connection.
        for _ in range(4):
            raw.sendall(b"a" * 65536)
        raw.shutdown(socket.SHUT_WR)
        assert raw.recv(65536) == b""


def test_a_whole_head_over_the_limit_in_one_read_is_refused_with_431(tmp_path: Path) -> None:
    # Head and end in one write: the parser has the whole head before any byte count is looked
    # at, so its size is what decides; the route never sees the request.
    with run_gateway(OFFLINE, tmp_path, max_header_bytes=4096) as gw, connect(gw) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nhost: gw\r\nx-filler: " + b"a" * 5000 + b"\r\n\r\n")
        status, error = answer(raw)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert error["code"] == "request_header_fields_too_large"
    with run_gateway(OFFLINE, tmp_path, max_header_bytes=4096) as gw, connect(gw) as raw:
        many = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 40) for i in range(100))  # 100 small ones
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n" + many + b"\r\n")
        status, _ = answer(raw)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"


def test_a_head_within_the_limit_is_served(tmp_path: Path) -> None:
    with run_gateway(OFFLINE, tmp_path, max_header_bytes=4096) as gw, gw.http() as http:
        assert http.get("/healthz", headers={"x-filler": "a" * 3000}).status_code == 200


def health(raw: socket.socket) -> bytes:
    """Ask /healthz on a kept-alive connection; return the status line of the whole answer."""
    raw.sendall(b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += raw.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:  # the body may come in a read of its own
        body += raw.recv(65536)
    return head.split(b"\r\n")[0]


def test_a_connection_past_the_limit_gets_503_and_the_others_are_served(tmp_path: Path) -> None:
    with run_gateway(OFFLINE, tmp_path, max_connections=2) as gw:
        held = [connect(gw) for _ in range(2)]
        try:
            for raw in held:  # each answered once: the gateway counts both
                assert health(raw) == b"HTTP/1.1 200 OK"
            with connect(gw) as extra:
                status, error = answer(extra)
            assert status == b"HTTP/1.1 503 Service Unavailable"
            assert error["code"] == "too_many_connections"
            assert health(held[0]) == b"HTTP/1.1 200 OK"
        finally:
            for raw in held:
                raw.close()


def test_a_client_that_stops_reading_a_stream_is_cut_and_its_slot_comes_back(
    tmp_path: Path,
) -> None:
    with start_simulator("gpu", speed=1000) as gpu:
        policy = fleet_policy([gpu.url], [gpu.url], routes=[
            {"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"], "fallback": "gpu"}
        ])  # fmt: skip
        with run_gateway(policy, tmp_path, client_write_timeout_s=1.0) as gw:
            body = orjson.dumps(
                {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "go on"}],
                    "max_tokens": 60_000,
                    "ignore_eos": True,
                    "stream": True,
                }
            )
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client reading nothing
            host, port = gw.url.removeprefix("http://").split(":")
            raw.connect((host, int(port)))
            raw.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            backend = gw.gateway.fleet.pools["gpu"].backends[0]
            deadline = time.monotonic() + 120
            while backend.in_flight == 0:  # the stream has started
                assert time.monotonic() < deadline
                time.sleep(0.01)
            while backend.in_flight:  # the gateway gives up on the client and the slot back
                assert time.monotonic() < deadline, "the slot stayed held"
                time.sleep(0.05)
            raw.close()
            records = gw.records(1)
    assert len(records) == 1 and records[0]["status"] == 499, records
    db = sa.create_engine(f"sqlite:///{tmp_path / 'gateway.db'}")
    with db.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(request_records)).scalar() == 1
