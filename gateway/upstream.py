"""The upstream client: one pooled aiohttp session to every backend, errors mapped to ours.

aiohttp's compiled HTTP parser keeps the proxy path cheap (see docs/performance.md for the
measurement against httpx); nothing outside this module sees an aiohttp exception.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager

import aiohttp

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.routing.fleet import BackendState

CONNECT_TIMEOUT_S = 2.0
PROBE_TIMEOUT_S = 1.0


@contextmanager
def map_exceptions(backend: BackendState) -> Iterator[None]:
    """Turn aiohttp and socket errors into UpstreamError / UpstreamTimeout naming the backend."""
    try:
        yield
    except TimeoutError as exc:
        raise UpstreamTimeout(f"backend {backend.name} did not answer in time") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamError(
            f"backend {backend.name} failed: {type(exc).__name__}: {exc}".rstrip(": ")
        ) from exc


class Upstream:
    """Send requests to backends over pooled keep-alive connections."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream client is not started")
        return self._session

    def _timeout(self, read_s: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(read_s)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=read_s)
            self._timeouts[read_s] = timeout
        return timeout

    async def send(
        self,
        backend: BackendState,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        read_timeout_s: float,
    ) -> aiohttp.ClientResponse:
        """POST body to the backend and return once its status line and headers arrived."""
        with map_exceptions(backend):
            return await self.session.post(
                backend.url + path,
                data=body,
                headers=headers,
                timeout=self._timeout(read_timeout_s),
            )

    async def read(self, backend: BackendState, response: aiohttp.ClientResponse) -> bytes:
        """Read a whole response body."""
        with map_exceptions(backend):
            return await response.read()

    async def chunks(
        self, backend: BackendState, response: aiohttp.ClientResponse
    ) -> AsyncIterator[bytes]:
        """Yield a response body as it arrives, chunk by chunk."""
        with map_exceptions(backend):
            async for chunk in response.content.iter_any():
                yield chunk

    async def probe(self, backend: BackendState) -> bool:
        """Return whether the backend's /health answers 200."""
        try:
            async with self.session.get(
                backend.url + "/health", timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False
