"""What every request to the ops app meets before any of it is read: the token, the body's limits.

FastAPI reads and parses a route's body before it runs the route's dependencies, so a token
checked there comes after the work: a 2 GB `PUT /admin/policy` without a token would be read
into memory first. Here, around the app, an /admin request without the admin token is refused
from its headers alone, and every body on every route is cut at GATEWAY_MAX_BODY_BYTES (413)
and GATEWAY_BODY_READ_TIMEOUT_S (408), as on /v1.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable, MutableMapping
from typing import Any

from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import (
    AdminDisabled,
    BodyTooLarge,
    GatewayError,
    InvalidRequest,
    RequestTimeout,
    Unauthorized,
)
from gateway.ops.error_handlers import answer


def check_admin_token(token: SecretStr | None, authorization: str) -> None:
    """Raise unless `authorization` carries the admin token (AdminDisabled without one)."""
    if token is None or not token.get_secret_value():
        raise AdminDisabled("the admin API is disabled: set GATEWAY_ADMIN_TOKEN to enable it")
    scheme, _, given = authorization.partition(" ")
    expected = token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        raise Unauthorized(
            "the admin API needs Authorization: Bearer <GATEWAY_ADMIN_TOKEN>",
            code="invalid_admin_token",
        )


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return ""


class Guard:
    """Wrap the ops app: refuse /admin without the token, and bound every request body."""

    def __init__(
        self,
        app: ASGIApp,
        admin_token: Callable[[], SecretStr | None],
        max_body_bytes: int,
        body_timeout_s: float,
    ):
        self.app = app
        self._admin_token = admin_token
        self._limit = max_body_bytes
        self._timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # the lifespan
            return
        try:
            if scope["path"] == "/admin" or scope["path"].startswith("/admin/"):
                check_admin_token(self._admin_token(), _header(scope, b"authorization"))
            declared = _header(scope, b"content-length")
            if declared:
                if not (declared.isascii() and declared.isdigit()):
                    raise InvalidRequest("the Content-Length header is not a number")
                if int(declared) > self._limit:
                    raise BodyTooLarge(
                        f"the request body of {declared} bytes exceeds {self._limit} bytes"
                    )
            body = await self._read(receive)
        except GatewayError as exc:
            await answer(exc)(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes:
        """Read the whole body within the limit and the deadline, or raise the error to answer.

        Read here, not by the app: FastAPI turns any failure while it reads into a 400.
        """
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        break  # the client went away; the app hears it too
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self._limit:
                        raise BodyTooLarge(f"the request body exceeds {self._limit} bytes")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise RequestTimeout(
                f"the request body did not arrive within {self._timeout_s:g} s"
            ) from None
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """Return a `receive` that gives the body read already, then waits for the client to go."""
    given = False

    async def replay() -> MutableMapping[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
