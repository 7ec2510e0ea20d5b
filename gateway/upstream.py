"""The upstream client: one pooled aiohttp session to every backend, errors mapped to ours.

aiohttp's compiled HTTP parser keeps the proxy path cheap (see docs/performance.md for the
measurement against httpx); nothing outside this module sees an aiohttp exception.

Redirects are never followed: the gateway connects only to the backends of its policy, and a
backend's key must never go where a backend points. A backend that redirects, or refuses the
gateway's credential (401, 403), has failed, like one answering 5xx: the request is retried
elsewhere, and the client never mistakes the refusal for one of its own key.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping

import aiohttp

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.routing.fleet import BackendState

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
PROBE_TIMEOUT_S = 1.0
CREDENTIALS_REFUSED = frozenset({401, 403})


# What aiohttp and the socket layer raise; a TimeoutError is the backend being too slow.
CLIENT_ERRORS = (TimeoutError, aiohttp.ClientError, OSError)


def mapped(backend: BackendState, exc: BaseException) -> UpstreamError:
    """Return the UpstreamError (UpstreamTimeout) naming the backend for an aiohttp error.

    Callers catch CLIENT_ERRORS and raise what this returns `from exc`: a try block costs
    nothing until something fails, where a context manager costs a microsecond on every call.
    """
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"backend {backend.name} did not answer in time")
    return UpstreamError(f"backend {backend.name} failed: {type(exc).__name__}: {exc}".rstrip(": "))


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
            # The session serves every client: a cookie one backend answer sets must not ride
            # along with other clients' requests.
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
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
        try:
            response = await self.session.post(
                backend.url + path,
                data=body,
                headers=headers,
                timeout=self._timeout(read_timeout_s),
                allow_redirects=False,
            )
        except CLIENT_ERRORS as exc:
            raise mapped(backend, exc) from exc
        if response.status in CREDENTIALS_REFUSED or 300 <= response.status < 400:
            response.release()
            raise _unusable(backend, response.status, response.headers.get("location", ""))
        return response

    async def read(self, backend: BackendState, response: aiohttp.ClientResponse) -> bytes:
        """Read a whole response body."""
        try:
            return await response.read()
        except CLIENT_ERRORS as exc:
            raise mapped(backend, exc) from exc

    async def chunks(
        self, backend: BackendState, response: aiohttp.ClientResponse
    ) -> AsyncIterator[bytes]:
        """Yield a response body as it arrives, chunk by chunk."""
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        except CLIENT_ERRORS as exc:
            raise mapped(backend, exc) from exc

    async def probe(self, backend: BackendState) -> bool:
        """Return whether the backend's /health answers 200."""
        try:
            async with self.session.get(
                backend.url + "/health",
                headers=backend.auth,
                timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
                allow_redirects=False,
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False


def _unusable(backend: BackendState, status: int, location: str) -> UpstreamError:
    """Log, for the operator, why a backend's answer cannot be used; return the client's error."""
    if status < 400:
        log.warning(
            "backend %s answered %d redirecting to %r; redirects are not followed: give the "
            "policy the address that serves",
            backend.name,
            status,
            location[:200],
        )
        return UpstreamError(f"backend {backend.name} answered {status}, a redirect, not followed")
    if backend.api_key_env is None:
        log.warning(
            "backend %s answered %d: it wants a key, and its policy entry names no api_key_env",
            backend.name,
            status,
        )
    else:
        log.warning(
            "backend %s refused the key from %s (%d)", backend.name, backend.api_key_env, status
        )
    # The upstream's own text is left out: it may quote the key it was given.
    return UpstreamError(f"backend {backend.name} refused the gateway's credentials ({status})")
