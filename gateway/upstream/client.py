"""The upstream client: requests to backends over gateway/upstream/http1.py, errors mapped to ours.

Nothing outside this module sees the client's errors: a refused or broken connection is an
UpstreamError naming the backend, a backend too slow an UpstreamTimeout.

Redirects are never followed: the gateway connects only to the backends of its policy, and a
backend's key must never go where a backend points. A backend that redirects, or refuses the
gateway's credential (401, 403), has failed, like one answering 5xx: the request is retried
elsewhere, and the client never mistakes the refusal for one of its own key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.fleet.state import BackendState
from gateway.routing.classify import ENDPOINTS
from gateway.upstream.http1 import Client, Response

log = logging.getLogger(__name__)

# Where each endpoint is on an OpenAI-compatible backend: the same path clients call here.
PATHS = {endpoint: path for path, endpoint in ENDPOINTS.items()}
PROBE_TIMEOUT_S = 1.0
CREDENTIALS_REFUSED = frozenset({401, 403})

# What the client and the socket layer raise; a TimeoutError is the backend being too slow.
CLIENT_ERRORS = (TimeoutError, OSError, ValueError)


def mapped(backend: BackendState, exc: BaseException) -> UpstreamError:
    """Return the UpstreamError (UpstreamTimeout) naming the backend for a client error.

    Callers catch CLIENT_ERRORS and raise what this returns `from exc`: a try block costs
    nothing until something fails, where a context manager costs a microsecond on every call.
    """
    if isinstance(exc, TimeoutError):
        # The client says which bound it was: no byte for the read timeout, or the whole
        # answer past its deadline.
        why = f": {exc}" if str(exc) else ""
        return UpstreamTimeout(f"backend {backend.name} did not answer in time{why}")
    return UpstreamError(f"backend {backend.name} failed: {type(exc).__name__}: {exc}".rstrip(": "))


class Upstream:
    """Send requests to backends over pooled keep-alive connections."""

    def __init__(self, max_answer_bytes: int = 64 * 1024 * 1024) -> None:
        self._client: Client | None = None
        self.max_answer_bytes = max_answer_bytes

    async def start(self) -> None:
        self._client = Client()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("the upstream client is not started")
        return self._client

    async def send(
        self,
        backend: BackendState,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        read_timeout_s: float,
        deadline_s: float,
    ) -> Response:
        """POST body to the backend and return once its status line and headers arrived.

        The answer may be silent `read_timeout_s` at a time and take `deadline_s` in all.
        """
        try:
            response = await self.client.request(
                "POST",
                backend.url,
                path,
                headers,
                body,
                read_timeout_s,
                deadline_s,
                self.max_answer_bytes,
            )
        except CLIENT_ERRORS as exc:
            raise mapped(backend, exc) from exc
        if response.status in CREDENTIALS_REFUSED or 300 <= response.status < 400:
            response.release()
            raise _unusable(backend, response.status, response.headers.get("location", ""))
        return response

    async def read(self, backend: BackendState, response: Response) -> bytes:
        """Read a whole response body."""
        try:
            return await response.read()
        except CLIENT_ERRORS as exc:
            raise mapped(backend, exc) from exc

    async def chunks(self, backend: BackendState, response: Response) -> AsyncIterator[bytes]:
        """Yield a response body as it arrives, chunk by chunk."""
        try:
            async for chunk in response.chunks():
                yield chunk
        except CLIENT_ERRORS as exc:
            raise mapped(backend, exc) from exc

    async def get(
        self, url: str, headers: Mapping[str, str], timeout_s: float
    ) -> tuple[int, bytes] | None:
        """GET a whole URL within timeout_s; return (status, body), or None if it failed."""
        response: Response | None = None
        try:
            async with asyncio.timeout(timeout_s):
                response = await self.client.request(
                    "GET", url, "", headers, b"", timeout_s, timeout_s, self.max_answer_bytes
                )
                return response.status, await response.read()
        except CLIENT_ERRORS:
            return None
        finally:
            if response is not None:
                response.release()

    async def probe(self, backend: BackendState) -> bool:
        """Return whether the backend's /health answers 200."""
        answer = await self.get(backend.url + "/health", backend.auth, PROBE_TIMEOUT_S)
        return answer is not None and answer[0] == 200


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
