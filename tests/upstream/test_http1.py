"""The backends' HTTP/1.1 client against raw servers on loopback that misbehave on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from waiting import until

from gateway.upstream import http1
from gateway.upstream.http1 import Client

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """Read one request; return its head and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


async def post(client: Client, url: str, body: bytes = b"", read_s: float = 30.0) -> bytes:
    """POST body to the root of url and return the whole answer."""
    response = await client.request("POST", url, "/", {}, body, read_s=read_s)
    return await response.read()


class Backend:
    """A raw TCP server: `handler(reader, writer, n)` serves its n-th connection."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None):
        self.handler = handler
        self.connections = 0
        self._tls = tls
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Backend:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._tls)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        if self._tls is not None:
            return f"https://localhost:{port}"  # the name the certificate is for
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def keep_answering(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
) -> None:
    """Answer every request on the connection with its head and body echoed back."""
    while True:
        head, body = await read_request(reader)
        writer.write(ok(head + body))
        await writer.drain()


def test_one_keep_alive_connection_serves_one_request_after_another() -> None:
    async def scenario() -> tuple[list[bytes], int]:
        async with Backend(keep_answering) as backend:
            client = Client()
            answers = []
            for i in range(3):
                response = await client.request(
                    "POST",
                    backend.url + "/base",
                    "/v1/chat",
                    {"authorization": "Bearer k"},
                    b"%d" % i,
                )
                answers.append(await response.read())
                response.release()
            await client.close()
            return answers, backend.connections

    answers, connections = asyncio.run(scenario())
    assert connections == 1
    for i, answer in enumerate(answers):
        lines = answer.split(b"\r\n")
        assert lines[0] == b"POST /base/v1/chat HTTP/1.1"
        assert any(line.startswith(b"host: 127.0.0.1:") for line in lines)
        assert b"authorization: Bearer k" in lines
        assert answer.endswith(b"\r\n\r\n%d" % i)


def test_a_chunked_answer_arrives_chunk_by_chunk() -> None:
    first_read = asyncio.Event()

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await first_read.wait()  # the client has the first chunk before the second is written
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def scenario() -> list[bytes]:
        async with Backend(stream) as backend:
            client = Client()
            response = await client.request("POST", backend.url, "/v1/chat", {}, b"{}", 30.0)
            chunks = []
            async for chunk in response.chunks():
                chunks.append(chunk)
                first_read.set()
            response.release()
            await client.close()
            return chunks

    assert asyncio.run(scenario()) == [b"first", b"second"]


def test_an_answer_that_ends_with_its_connection_is_read_whole() -> None:
    async def close_delimited(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npart one, ")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"part two")
        await writer.drain()

    async def scenario() -> bytes:
        async with Backend(close_delimited) as backend:
            client = Client()
            body = await post(client, backend.url)
            await client.close()
            return body

    assert asyncio.run(scenario()) == b"part one, part two"


def test_a_request_the_backend_drops_on_a_reused_connection_is_sent_once_more() -> None:
    """The backend's idle timeout and the next request cross: it closes as the request goes."""

    async def answer_once(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        if n == 1:
            await read_request(reader)
            writer.write(ok(b"first"))
            await writer.drain()
            await read_request(reader)  # and close without answering
            return
        await keep_answering(reader, writer, n)

    async def scenario() -> tuple[bytes, int]:
        async with Backend(answer_once) as backend:
            client = Client()
            for body in (b"1", b"2"):
                answer = await post(client, backend.url, body)
            await client.close()
            return answer, backend.connections

    answer, connections = asyncio.run(scenario())
    assert answer.endswith(b"2") and connections == 2


def test_a_new_connection_closed_before_the_answer_fails_without_a_second_try() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async def scenario() -> int:
        async with Backend(hang_up) as backend:
            client = Client()
            with pytest.raises(ConnectionError, match="before answering"):
                await client.request("POST", backend.url, "/", {}, b"{}")
            await client.close()
            return backend.connections

    assert asyncio.run(scenario()) == 1


# A byte every GAP_S keeps a read of READ_S alive, with room (20 gaps) for a busy machine's
# pauses; the whole steady stream lasts longer than READ_S, so only the gaps can be what is timed.
READ_S = 1.0
GAP_S = 0.05
BYTES = 25


def test_silence_past_the_read_timeout_is_a_timeout_and_a_slow_steady_stream_is_not() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            _, body = await read_request(reader)
            if body == b"silent":
                await asyncio.Event().wait()  # never a byte
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(BYTES):
                await asyncio.sleep(GAP_S)
                writer.write(b"1\r\n.\r\n")
                await writer.drain()
            if body == b"stalls":
                await asyncio.Event().wait()  # never the end
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def scenario() -> tuple[float, str, bytes, float, bytes, str, float]:
        async with Backend(slow) as backend, asyncio.timeout(60):  # a hang fails, not the CI job
            client = Client()
            started = time.monotonic()
            with pytest.raises(TimeoutError) as silent:
                await client.request("POST", backend.url, "/", {}, b"silent", read_s=READ_S)
            silent_s = time.monotonic() - started
            started = time.monotonic()
            response = await client.request("POST", backend.url, "/", {}, b"steady", read_s=READ_S)
            steady = await response.read()
            steady_s = time.monotonic() - started
            started = time.monotonic()
            response = await client.request("POST", backend.url, "/", {}, b"stalls", read_s=READ_S)
            before_stall = b""
            with pytest.raises(TimeoutError) as stalled:
                async for chunk in response.chunks():
                    before_stall += chunk
            stalled_s = time.monotonic() - started
            await client.close()
            return (
                silent_s,
                str(silent.value),
                steady,
                steady_s,
                before_stall,
                str(stalled.value),
                stalled_s,
            )

    silent_s, silent, steady, steady_s, before_stall, stalled, stalled_s = asyncio.run(scenario())
    cut = f"no byte from the backend in {READ_S:g} s"
    assert silent == cut and silent_s >= READ_S
    assert steady == b"." * BYTES and steady_s > READ_S  # outlived the timeout, a byte at a time
    # Every byte came, then the silence after them was cut: at least the bytes' time and READ_S.
    assert before_stall == b"." * BYTES and stalled == cut
    assert stalled_s >= BYTES * GAP_S + READ_S


def test_a_malformed_answer_is_a_connection_error_and_the_next_request_gets_a_new_connection() -> (
    None
):
    async def garbage_first(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        if n == 1:
            await read_request(reader)
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            await writer.drain()
            await reader.read()
            return
        await keep_answering(reader, writer, n)

    async def scenario() -> tuple[int, int]:
        async with Backend(garbage_first) as backend:
            client = Client()
            with pytest.raises(ConnectionError, match="malformed"):
                await client.request("POST", backend.url, "/", {}, b"{}")
            response = await client.request("POST", backend.url, "/", {}, b"{}")
            await response.read()
            await client.close()
            return response.status, backend.connections

    assert asyncio.run(scenario()) == (200, 2)


def test_a_cancelled_request_never_hands_its_late_answer_to_the_next() -> None:
    async def late_first(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        while True:
            _, body = await read_request(reader)
            if body == b"late":
                await asyncio.sleep(0.2)
            writer.write(ok(b"answer to " + body))
            await writer.drain()

    async def scenario() -> bytes:
        async with Backend(late_first) as backend:
            client = Client()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await client.request("POST", backend.url, "/", {}, b"late")
            body = await post(client, backend.url, b"next")
            await client.close()
            return body

    assert asyncio.run(scenario()) == b"answer to next"


def test_an_answer_released_unread_closes_its_connection() -> None:
    async def in_two_parts(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        while True:
            _, body = await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (2 * len(body)))
            writer.write(body)
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(body)
            await writer.drain()

    async def scenario() -> tuple[bytes, int]:
        async with Backend(in_two_parts) as backend:
            client = Client()
            response = await client.request("POST", backend.url, "/", {}, b"first")
            response.release()  # half of it came
            body = await post(client, backend.url, b"second")
            await client.close()
            return body, backend.connections

    assert asyncio.run(scenario()) == (b"secondsecond", 2)


def test_a_stream_read_slower_than_it_arrives_stops_being_read_from_the_backend() -> None:
    total = 8 * 1024 * 1024
    piece = b"x" * 65536

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        for _ in range(total // len(piece)):
            writer.write(piece)
            await writer.drain()
        await reader.read()

    async def scenario() -> tuple[int, int]:
        async with Backend(flood) as backend:
            client = Client()
            response = await client.request("POST", backend.url, "/", {}, b"", read_s=0.5)
            chunks = response.chunks()
            received = len(await anext(chunks))
            await until(  # the client holds what the backend sent, up to where it stops reading
                lambda: response.buffered > http1.HIGH_WATER,
                message=lambda: f"only {response.buffered} bytes ever arrived",
            )
            # A slow client, not a silent backend: no timeout. A slower machine only makes the
            # client slower still.
            await asyncio.sleep(1.0)
            held = response.buffered
            async for chunk in chunks:
                received += len(chunk)
            await client.close()
            return held, received

    held, received = asyncio.run(scenario())
    assert held <= 2 * http1.HIGH_WATER
    assert received == total


def test_an_interim_answer_is_passed_over() -> None:
    async def interim(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"final"))
        await writer.drain()
        await reader.read()

    async def scenario() -> tuple[int, bytes]:
        async with Backend(interim) as backend:
            client = Client()
            response = await client.request("POST", backend.url, "/", {}, b"")
            body = await response.read()
            await client.close()
            return response.status, body

    assert asyncio.run(scenario()) == (200, b"final")


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async def scenario() -> int:
        async with Backend(keep_answering) as backend:
            client = Client()
            with pytest.raises(ValueError, match="line break"):
                await client.request("POST", backend.url, "/", {"x-key": "k\r\nx-evil: 1"}, b"")
            await client.close()
            return backend.connections

    assert asyncio.run(scenario()) == 0


def test_an_idle_connection_past_its_keepalive_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1, "KEEPALIVE_S", 0.05)

    async def scenario() -> int:
        async with Backend(keep_answering) as backend:
            client = Client()
            for _ in range(2):
                await post(client, backend.url)
                await asyncio.sleep(0.1)  # idle past the keep-alive: a slower machine idles longer
            await client.close()
            return backend.connections

    assert asyncio.run(scenario()) == 2


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_an_https_backend_with_a_private_ca_named_in_ssl_cert_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def scenario() -> bytes:
        async with Backend(keep_answering, tls=server_tls) as backend:
            client = Client()
            try:
                response = await client.request("POST", backend.url, "/v1", {}, b"secret")
                return await response.read()
            finally:
                await client.close()

    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(scenario())
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert asyncio.run(scenario()).endswith(b"secret")


def test_an_answer_that_ended_while_its_reading_was_paused_leaves_its_connection_reading() -> None:
    """The read that pauses the connection also ends the answer: it goes back un-paused.

    The backend writes up to the high-water mark, waits until the client holds those bytes
    unread, then writes a short tail: one read crosses the mark and ends the answer, however
    the kernel split what came before.
    """
    head_and_mark = ok(b"x" * (http1.HIGH_WATER + 100))[:-100]
    tail = b"x" * 100
    tail_written = asyncio.Event()
    may_end = asyncio.Event()

    async def mark_then_tail(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await read_request(reader)
        writer.write(head_and_mark)
        await writer.drain()
        await may_end.wait()
        writer.write(tail)
        await writer.drain()
        tail_written.set()
        await read_request(reader)
        writer.write(ok(b"second"))
        await writer.drain()
        await reader.read()

    async def scenario() -> tuple[int, bytes, int]:
        async with Backend(mark_then_tail) as backend:
            client = Client()
            response = await client.request("POST", backend.url, "/", {}, b"")
            ended = asyncio.Event()
            response.on_end(ended.set)
            await until(
                lambda: response.buffered == http1.HIGH_WATER,
                message=lambda: f"{response.buffered} of {http1.HIGH_WATER} bytes held",
            )
            may_end.set()
            # A slow reader: the rest of the answer arrives before it reads any.
            await asyncio.wait_for(ended.wait(), 60)
            first = len(await response.read())
            async with asyncio.timeout(60):  # a connection left paused would never answer
                second = await post(client, backend.url)
            await client.close()
            assert tail_written.is_set()
            return first, second, backend.connections

    assert asyncio.run(scenario()) == (http1.HIGH_WATER + 100, b"second", 1)


def test_an_answer_no_request_asked_for_never_reaches_the_next_request() -> None:
    closed = {1: asyncio.Event(), 2: asyncio.Event()}

    async def answers_twice(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        if n == 1:
            await read_request(reader)
            writer.write(ok(b"one") + ok(b"STALE"))  # two answers to one request
            await writer.drain()
            await reader.read()
            closed[n].set()
            return
        if n == 2:
            await read_request(reader)
            writer.write(ok(b"two"))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(ok(b"STALE, while idle"))
            await writer.drain()
            await reader.read()
            closed[n].set()
            return
        await keep_answering(reader, writer, n)

    async def scenario() -> tuple[list[bytes], int]:
        async with Backend(answers_twice) as backend:
            client = Client()
            bodies = []
            for n, body in enumerate((b"1", b"2", b"3"), start=1):
                response = await client.request("POST", backend.url, "/", {}, body)
                bodies.append(await response.read())
                if n in closed:  # the client hangs up on the answer no request asked for
                    await asyncio.wait_for(closed[n].wait(), 60)
            await client.close()
            return bodies, backend.connections

    bodies, connections = asyncio.run(scenario())
    assert bodies[:2] == [b"one", b"two"]
    assert bodies[2].endswith(b"3") and connections == 3


def test_a_408_on_a_reused_connection_is_the_backends_idle_timeout_and_is_sent_again() -> None:
    async def times_out_idle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        if n == 1:
            await read_request(reader)
            writer.write(ok(b"first"))
            await writer.drain()
            await read_request(reader)
            writer.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            return
        await keep_answering(reader, writer, n)

    async def scenario() -> tuple[int, bytes, int]:
        async with Backend(times_out_idle) as backend:
            client = Client()
            for body in (b"1", b"2"):
                response = await client.request("POST", backend.url, "/", {}, body)
                answer = await response.read()
            await client.close()
            return response.status, answer, backend.connections

    status, answer, connections = asyncio.run(scenario())
    assert status == 200 and answer.endswith(b"2") and connections == 2


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n10\r\npart",
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npart",
    ],
    ids=["chunked, any case", "content-length"],
)
def test_a_body_cut_short_is_an_error_not_a_short_answer(answer: bytes) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()

    async def scenario() -> None:
        async with Backend(cut) as backend:
            client = Client()
            response = await client.request("POST", backend.url, "/", {}, b"")
            with pytest.raises(ConnectionError, match="mid-answer"):
                await response.read()
            await client.close()

    asyncio.run(scenario())


def test_a_body_that_ends_with_its_connection_reset_is_an_error() -> None:
    headed = asyncio.Event()

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\npartial")
        await writer.drain()
        await asyncio.wait_for(headed.wait(), 60)  # reset mid-body, once the head has arrived
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    async def scenario() -> None:
        async with Backend(reset) as backend:
            client = Client()
            response = await client.request("POST", backend.url, "/", {}, b"")
            headed.set()
            with pytest.raises(ConnectionError, match="reset"):
                await response.read()
            await client.close()

    asyncio.run(scenario())


def test_an_answer_head_past_its_limit_is_refused_without_waiting_for_its_end() -> None:
    async def endless_header(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nx-big: ")
        for _ in range(64):
            writer.write(b"y" * 65536)
            await writer.drain()
        await reader.read()

    async def scenario() -> None:
        async with Backend(endless_header) as backend:
            client = Client()
            with pytest.raises(ConnectionError, match="head over"):
                await client.request("POST", backend.url, "/", {}, b"")
            await client.close()

    asyncio.run(scenario())


def test_closing_the_client_fails_requests_in_flight_without_sending_them_again() -> None:
    second = asyncio.Event()
    probed = asyncio.Event()

    async def slow_second(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int
    ) -> None:
        _, body = await read_request(reader)
        if body == b"probe":
            probed.set()
            return
        writer.write(ok(b"first"))
        await writer.drain()
        await read_request(reader)
        second.set()
        await asyncio.Event().wait()  # never answered

    async def scenario() -> int:
        async with Backend(slow_second) as backend:
            client = Client()
            response = await client.request("POST", backend.url, "/", {}, b"")
            await response.read()
            pending = asyncio.ensure_future(client.request("POST", backend.url, "/", {}, b""))
            await asyncio.wait_for(second.wait(), 60)  # the request is with the backend
            await client.close()
            with pytest.raises(ConnectionError):
                await pending
            # Connections are accepted in the order they were made: once one made now is
            # served, a resent request's would have been counted too.
            probe = Client()
            with contextlib.suppress(ConnectionError):
                await probe.request("POST", backend.url, "/", {}, b"probe")
            await asyncio.wait_for(probed.wait(), 60)
            await probe.close()
            return backend.connections - 1

    assert asyncio.run(scenario()) == 1


def test_an_answer_that_never_ends_is_cut_at_its_total_time_though_bytes_keep_coming() -> None:
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        while True:  # a byte well within the idle timeout, for ever
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)

    async def scenario() -> str:
        async with Backend(trickle) as backend:
            client = Client()
            try:
                response = await client.request(
                    "POST", backend.url, "/", {}, b"", read_s=5.0, total_s=0.5
                )
                with pytest.raises(TimeoutError) as cut:
                    await response.read()
                return str(cut.value)
            finally:
                await client.close()

    assert "more than 0.5 s in all" in asyncio.run(scenario())


def test_an_answer_over_its_byte_limit_is_cut() -> None:
    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(ok(b"x" * 1_000_000))
        await writer.drain()

    async def scenario() -> str:
        async with Backend(flood) as backend:
            client = Client()
            try:
                response = await client.request(
                    "POST", backend.url, "/", {}, b"", max_bytes=100_000
                )
                with pytest.raises(ConnectionError) as cut:
                    await response.read()
                return str(cut.value)
            finally:
                await client.close()

    assert "over 100000 bytes" in asyncio.run(scenario())
