"""Errors on the ops app (health, metrics, /admin): every one answered in OpenAI's shape, here.

FastAPI refuses some requests by itself: a body that is not JSON or a field of the wrong type
(RequestValidationError), an unknown path or method (HTTPException). Each becomes the gateway's
own error, and every GatewayError becomes its response in `answer`, so /admin answers as /v1
does; a 405's `Allow` names every method the app takes at that path. A policy refused
(PolicyError, from an apply or a rollback) is a 422 listing each problem where it is. A request
its model accepted that the gateway's state refuses (a rollout already running, none to take
back, no earlier version to roll back to) is a 409 `Conflict`, raised by the core. A failure of the
gateway's own is a 500 in the same shape; its traceback is logged.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from gateway.errors import (
    GatewayError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PolicyError,
    Problem,
)


def answer(exc: GatewayError) -> Response:
    """Return the OpenAI-shaped response of an error."""
    headers = {name.decode(): value.decode() for name, value in exc.headers()}
    return Response(exc.body(), exc.status, headers, media_type="application/json")


def problem(found: Problem) -> dict[str, Any]:
    """Return one error or warning of a policy as the admin API lists it."""
    return {"path": found.path, "message": found.message, "location": found.location}


def refused_policy(exc: PolicyError) -> Response:
    """Return the 422 of a refused policy: every problem, where it is."""
    return JSONResponse({"errors": [problem(p) for p in exc.problems]}, 422)


def _validation(exc: RequestValidationError) -> InvalidRequest:
    """Name what FastAPI could not validate (a query, a body, a field) as /v1 would: a 400."""
    errors = exc.errors()
    if errors[0]["type"] == "json_invalid":
        reason = errors[0].get("ctx", {}).get("error", "")
        return InvalidRequest(f"the request body is not valid JSON: {reason}".rstrip(": "))
    where = [".".join(str(p) for p in e["loc"]) for e in errors]
    problems = "; ".join(f"{w}: {e['msg']}" for w, e in list(zip(where, errors, strict=True))[:5])
    return InvalidRequest(f"the request is not valid: {problems}", param=where[0] or None)


# The methods a 405's Allow may name, in the order it names them.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """Return every method the app takes at the request's path, as its router would route it.

    Starlette's 405 names the methods of the first route at the path only: `GET /admin/policy`'s,
    not `PUT /admin/policy`'s too.
    """
    routes = request.app.router.routes
    return [
        method
        for method in METHODS
        if any(r.matches({**request.scope, "method": method})[0] is Match.FULL for r in routes)
    ]


def _refusal(request: Request, exc: HTTPException) -> GatewayError:
    """Return the gateway's error for a request the framework refused by itself."""
    detail = str(exc.detail)
    if exc.status_code == 404:
        return NotFound(detail)
    if exc.status_code == 405:
        methods = allowed_methods(request)
        path, method = request.url.path, request.method
        return MethodNotAllowed(
            f"{path} takes {' or '.join(methods)}, not {method}", allow=", ".join(methods)
        )
    return InvalidRequest(detail) if exc.status_code < 500 else InternalError(detail)


async def _handle(request: Request, exc: Exception) -> Response:
    if isinstance(exc, GatewayError):
        return answer(exc)
    if isinstance(exc, PolicyError):
        return refused_policy(exc)
    if isinstance(exc, RequestValidationError):
        return answer(_validation(exc))
    if isinstance(exc, HTTPException):
        return answer(_refusal(request, exc))
    return answer(InternalError())


def install(app: FastAPI) -> None:
    """Answer every error of the app in the OpenAI shape."""
    for kind in (GatewayError, PolicyError, RequestValidationError, HTTPException, Exception):
        app.add_exception_handler(kind, _handle)
