"""HTTP/1.1 to the backends: pooled keep-alive connections, answers parsed by httptools.

A proxy needs little of a general HTTP client: one request at a time per connection, bodies
as bytes, no cookies, redirects or content decoding. A connection is an asyncio protocol fed
to httptools' compiled parser (llhttp) on the event loop, and a request is one write, one
timer and a future: half the CPU of a whole aiohttp relay on the same server
(docs/performance.md, "Upstream client").

Errors are ConnectionError (refused, reset, closed before the answer ended, a malformed
answer, an answer over `max_bytes`) and TimeoutError (no byte for `read_s`, the whole answer
not in `total_s`, or no connection in `CONNECT_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT_S = 2.0
KEEPALIVE_S = 30.0  # an idle connection older than this is closed rather than reused
MAX_HEADER_BYTES = 64 * 1024
# A stream the client reads slower than the backend writes stops being read from the
# backend past this many buffered bytes, and is read again once the client took them.
HIGH_WATER = 256 * 1024
MAX_HEADS = 1024  # base URLs and request heads kept parsed and built


class Origin:
    """Where a base URL's requests go: scheme, host and port, and the path prefix."""

    __slots__ = ("host", "host_header", "key", "port", "prefix", "tls")

    def __init__(self, base_url: str):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.key = (self.tls, self.host, self.port)
        # A metrics URL may carry a query; a base URL that requests extend should not.
        target = parts.path.rstrip("/") + (f"?{parts.query}" if parts.query else "")
        self.prefix = target.encode()
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = (host if self.port == default else f"{host}:{self.port}").encode()


class Response:
    """A backend's answer: status and headers once they arrived, the body as it arrives."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_done",
        "_error",
        "_on_end",
        "_wake",
        "headers",
        "status",
    )

    def __init__(self, conn: Connection, status: int, headers: dict[str, str]):
        self.status = status
        self.headers = headers  # names in lower case
        self._conn: Connection | None = conn
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._done = False
        self._error: BaseException | None = None
        self._wake: asyncio.Future[None] | None = None
        self._on_end: Callable[[], None] | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read."""
        return self._buffered

    async def read(self) -> bytes:
        """Return the whole body."""
        parts: list[bytes] = []
        while True:
            if self._chunks:
                parts.extend(self._chunks)
                self._take_all()
            if self._done:
                return b"".join(parts)
            await self._more()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Yield the body as it arrives: whatever came since the last chunk, joined."""
        while True:
            if self._chunks:
                chunk = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
                self._take_all()
                yield chunk
            elif self._done:
                return
            else:
                await self._more()

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the whole answer has arrived (at once if it has), whether or
        not it has been read: the backend has finished with the request."""
        if self._done:
            callback()
        elif self._error is None:
            self._on_end = callback

    def release(self) -> None:
        """Give the connection back; one whose answer was not read to its end is closed."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._done:
            conn.close()

    def _take_all(self) -> None:
        self._chunks.clear()
        self._buffered = 0
        if self._conn is not None:
            self._conn.drained()

    async def _more(self) -> None:
        if self._error is not None:
            raise self._error
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake
        finally:
            self._wake = None
        if self._error is not None and not self._chunks:
            raise self._error

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        self._notify()

    def _end(self, error: BaseException | None = None) -> None:
        if error is None:
            self._done = True
        else:
            self._error = error
        self._conn = None  # back in its pool, or closed
        self._notify()
        on_end, self._on_end = self._on_end, None
        if on_end is not None and error is None:
            on_end()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)


class Connection(asyncio.Protocol):
    """One keep-alive connection to an origin, with at most one request on it at a time."""

    def __init__(self, pool: ConnectionPool):
        self._pool = pool
        self._loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._head: asyncio.Future[Response] | None = None
        self._response: Response | None = None
        self._header_list: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0  # of the answer's head so far
        self.received = False  # any byte of the current answer
        self._timer: asyncio.TimerHandle | None = None
        self._read_s = 0.0
        self._deadline = 0.0
        self._total_s = 0.0
        self._end_by = 0.0  # the whole answer's deadline, which no pause moves
        self._max_bytes = 0
        self._body_bytes = 0
        self._paused = False
        self.idle_since = 0.0
        self.reused = False

    def send(
        self, data: bytes, read_s: float, total_s: float, max_bytes: int
    ) -> asyncio.Future[Response]:
        """Write one whole request; the future resolves once the answer's head arrived."""
        assert self.transport is not None
        self._head = self._loop.create_future()
        self._head_bytes = self._body_bytes = 0
        self.received = False
        now = self._loop.time()
        self._read_s, self._total_s, self._max_bytes = read_s, total_s, max_bytes
        self._deadline = now + read_s
        self._end_by = now + total_s
        self._timer = self._loop.call_at(min(self._deadline, self._end_by), self._check_deadline)
        self.transport.write(data)
        return self._head

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def drained(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self._deadline = self._loop.time() + self._read_s
            self.transport.resume_reading()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._head is None and self._response is None:
            # An answer no request asked for (a 408 while idle, a backend answering twice):
            # the connection cannot be trusted to pair the next answer with its request.
            self.close()
            return
        self.received = True
        self._deadline = self._loop.time() + self._read_s
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ConnectionError("the backend switched protocols"))
            return
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed answer: {exc.__context__ or exc}"))
            return
        if self._head is not None:  # the head is still arriving: httptools holds it meanwhile
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES:
                self._fail(ConnectionError(f"an answer's head over {MAX_HEADER_BYTES} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._pool.forget(self)
        self.transport = None
        if self._head is None and self._response is None:
            return
        response = self._response
        if response is not None and exc is None and self._delimited_by_close():
            self._finish()  # the backend closed the connection cleanly: the body has ended
            return
        reason = f": {exc}" if exc else ""
        error = ConnectionError(
            "the backend closed the connection before answering" + reason
            if response is None
            else "the backend closed the connection mid-answer" + reason
        )
        self._fail(error)

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_list.append((name, value))

    def on_headers_complete(self) -> None:
        headers = {n.decode("latin-1").lower(): v.decode("latin-1") for n, v in self._header_list}
        self._header_list = []
        if self._head is None:
            # More bytes after the answer, in the same read: a second answer to one request.
            raise httptools.HttpParserError("an answer no request asked for")
        status = self._parser.get_status_code()
        if status < 200:
            return  # an interim answer (100 Continue): the real one follows
        self._response = Response(self, status, headers)
        head, self._head = self._head, None
        if head is not None and not head.done():
            head.set_result(self._response)

    def on_body(self, body: bytes) -> None:
        response = self._response
        if response is None:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._max_bytes:
            self._fail(ConnectionError(f"an answer over {self._max_bytes} bytes"))
            return
        response._feed(body)
        if response.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._response is None:
            return  # the end of an interim answer
        keep = self._parser.should_keep_alive()
        self._finish()
        if keep and self.transport is not None and not self.transport.is_closing():
            if self._paused:  # paused for this answer's reader, which has its bytes now
                self._paused = False
                self.transport.resume_reading()
            self._pool.give_back(self)
        else:
            self.close()

    # internals

    def _delimited_by_close(self) -> bool:
        """Whether the answer's body is all the bytes until the connection closes."""
        response = self._response
        if response is None:
            return False
        headers = response.headers
        return (
            "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        )

    def _check_deadline(self) -> None:
        # The deadline moves with every byte received; the timer is moved only when it fires.
        self._timer = None
        if self._head is None and self._response is None:
            return
        now = self._loop.time()
        if now >= self._end_by:
            # However the answer's reader reads, the whole answer has its time.
            self._fail(TimeoutError(f"the answer took more than {self._total_s:g} s in all"))
            return
        if self._paused:
            # Not read because the client reads slowly: the backend is not the silent one.
            self._deadline = now + self._read_s
        if now < self._deadline:
            self._timer = self._loop.call_at(
                min(self._deadline, self._end_by), self._check_deadline
            )
            return
        self._fail(TimeoutError(f"no byte from the backend in {self._read_s:g} s"))

    def _finish(self) -> None:
        response, self._response = self._response, None
        self._stop_timer()
        if response is not None:
            response._end()

    def _fail(self, error: BaseException) -> None:
        head, self._head = self._head, None
        response, self._response = self._response, None
        self._stop_timer()
        if head is not None and not head.done():
            head.set_exception(error)
        if response is not None:
            response._end(error)
        self.close()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ConnectionPool:
    """Idle keep-alive connections to one origin, most recently used first."""

    def __init__(self, origin: Origin, loop: asyncio.AbstractEventLoop, tls: ssl.SSLContext | None):
        self.origin = origin
        self.loop = loop
        self._tls = tls
        self._idle: deque[Connection] = deque()
        self._open: set[Connection] = set()
        self.closed = False

    async def connection(self) -> Connection:
        """Return an idle connection, or a new one."""
        now = self.loop.time()
        while self._idle:
            conn = self._idle.pop()
            if conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > KEEPALIVE_S:
                conn.close()
                continue
            conn.reused = True
            return conn
        return await self.connect()

    async def connect(self) -> Connection:
        if self.closed:
            raise ConnectionError("the upstream client is closed")
        origin = self.origin
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            _, conn = await self.loop.create_connection(
                lambda: Connection(self),
                origin.host,
                origin.port,
                ssl=self._tls,
                server_hostname=origin.host if self._tls else None,
            )
        self._open.add(conn)
        return conn

    def give_back(self, conn: Connection) -> None:
        now = conn.idle_since = self.loop.time()
        self._idle.append(conn)
        while now - self._idle[0].idle_since > KEEPALIVE_S:  # the oldest, unused since
            self._idle.popleft().close()

    def forget(self, conn: Connection) -> None:
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        self.closed = True
        for conn in list(self._open):
            conn.close()
        self._idle.clear()


class Client:
    """Requests to any number of origins over keep-alive connections."""

    def __init__(self) -> None:
        self._pools: dict[tuple[bool, str, int], ConnectionPool] = {}
        self._origins: dict[str, Origin] = {}
        self._heads: dict[tuple[object, ...], bytes] = {}
        self._tls: ssl.SSLContext | None = None

    async def request(
        self,
        method: str,
        base_url: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes = b"",
        read_s: float = 30.0,
        total_s: float = 600.0,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> Response:
        """Send a request to base_url + path; return once the answer's status and headers came.

        The answer may be silent `read_s` at a time, take `total_s` in all and hold
        `max_bytes` of body: past any of them, it fails.

        A request on a reused connection that the backend closed, or answered 408, before any
        other byte of an answer is sent once more on a new connection: that is the backend's
        idle timeout crossing the request, which it then never read. (A backend that read it
        and died before answering gets it twice; the forwarder would retry it elsewhere.)
        """
        origin, pool = self._pool(base_url)
        head = self._head(method, base_url, path, headers, origin)
        data = b"%s%d\r\n\r\n%s" % (head, len(body), body)
        conn = await pool.connection()
        while True:
            answer = conn.send(data, read_s, total_s, max_bytes)
            try:
                response = await answer
            except ConnectionError:
                if not conn.reused or conn.received or pool.closed:
                    raise
                conn = await pool.connect()
                continue
            except BaseException:
                conn.close()  # cancelled mid-request: the late answer must not meet the next
                raise
            if response.status == 408 and conn.reused and not pool.closed:
                response.release()
                conn.close()
                conn = await pool.connect()
                continue
            return response

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        await asyncio.sleep(0)  # let the transports finish closing

    def _pool(self, base_url: str) -> tuple[Origin, ConnectionPool]:
        origin = self._origins.get(base_url)
        if origin is None:
            if len(self._origins) >= MAX_HEADS:
                self._origins.clear()
            origin = self._origins[base_url] = Origin(base_url)
        pool = self._pools.get(origin.key)
        if pool is None:
            tls = self._tls_context() if origin.tls else None
            pool = self._pools[origin.key] = ConnectionPool(origin, asyncio.get_running_loop(), tls)
        return origin, pool

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()  # honours SSL_CERT_FILE for private CAs
        return self._tls

    def _head(
        self, method: str, base_url: str, path: str, headers: Mapping[str, str], origin: Origin
    ) -> bytes:
        """The request line and headers up to the Content-Length value, built once per kind."""
        key = (method, base_url, path, *headers.items())
        head = self._heads.get(key)
        if head is None:
            lines = [f"{method} ".encode() + origin.prefix + path.encode() + b" HTTP/1.1"]
            lines.append(b"host: " + origin.host_header)
            for name, value in headers.items():
                if any(c in name + value for c in "\r\n\0") or not name:
                    raise ValueError(f"header {name!r} is empty or has a line break or NUL in it")
                lines.append(f"{name}: {value}".encode("latin-1"))
            lines.append(b"content-length: ")
            head = b"\r\n".join(lines)
            if len(self._heads) >= MAX_HEADS:
                self._heads.clear()  # backends and their headers changed many times over
            self._heads[key] = head
        return head
