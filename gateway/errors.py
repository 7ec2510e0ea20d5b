"""The gateway's exceptions, and their OpenAI-shaped HTTP form.

GatewayError                  anything the gateway refuses or fails to do for a request
├── InvalidRequest            400: the body or a header is malformed or out of range
│   ├── ContextTooLong        400: prompt plus max tokens exceed every pool's context
│   ├── ExceedsRateLimit      400: the request alone may use more than its tenant's minute
│   └── InvalidHttp           400: the bytes are not a valid HTTP/1.1 request
├── Unauthorized              401: a required tenant key or the admin token is missing or wrong
├── RouteDenied               403: no route of the policy admits this request
├── SloNotAllowed             403: the tenant may not ask for this SLO class or these targets
├── AdminDisabled             403: no admin token is configured, so /admin is off
├── NotFound                  404: no such path
│   ├── ModelNotFound         404: no pool serves the requested model
│   ├── PolicyVersionNotFound 404: the admin asked for a policy version that was never stored
│   └── ReportNotFound        404: the admin asked for a report file that was never written
├── MethodNotAllowed          405: the path exists, not with this method
├── RequestTimeout            408: the client did not send the whole body in time
├── BodyTooLarge              413: the request body is over the configured limit
├── HeadersTooLarge           431: the request line and headers are over the configured limit
├── NoCapacity                429: every eligible pool is full and its queue budget ran out
├── RateLimited               429: the tenant is over its requests or tokens a minute
├── NoHealthyBackend          503: every eligible backend is ejected or unhealthy
├── PolicyStoreUnavailable    503: the policy versions in the database cannot be read or written
├── TooManyConnections        503: the gateway has as many client connections open as it allows
├── InternalError             500: the gateway itself failed (a bug; the traceback is logged)
└── UpstreamError             502: the backend failed (connection, 5xx, broken answer)
    └── UpstreamTimeout       504: the backend did not answer within the SLO's timeout

PolicyError                   the policy file is invalid (raised at load, never per request)
DatabaseUnavailable           records cannot be written now (kept and retried, never per request)
SharedStateUnavailable        Redis cannot be reached now (the replica serves from local state)
ParkingHookFailed             a parking hook did not switch a backend off or on (never per request)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

import orjson


class GatewayError(Exception):
    """A request the gateway cannot serve; carries its HTTP status and OpenAI error fields."""

    status = 500
    type = "api_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def document(self) -> dict[str, dict[str, str | None]]:
        """Return the OpenAI error document for this error."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        """Return the OpenAI error document for this error, serialised."""
        return orjson.dumps(self.document())

    @property
    def reason(self) -> str:
        """Return the HTTP reason phrase of the status."""
        return HTTPStatus(self.status).phrase

    def headers(self) -> list[tuple[bytes, bytes]]:
        """Return the response headers this error adds (e.g. Retry-After)."""
        return []


class InvalidRequest(GatewayError):
    """The body or a header is malformed or out of range."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Conflict(GatewayError):
    """A well-formed request that the gateway's state refuses now (a rollout already running,
    none to take back, no earlier policy version); another state may take it."""

    status = 409
    type = "conflict_error"
    code = "conflict"


class ContextTooLong(InvalidRequest):
    """Prompt plus requested output exceed the context of every pool that serves the model."""

    code = "context_length_exceeded"


class ExceedsRateLimit(InvalidRequest):
    """The request alone may use more tokens than its tenant may in a minute: no wait helps."""

    code = "exceeds_rate_limit"


class InvalidHttp(InvalidRequest):
    """The HTTP parser refused the bytes: a broken request line or framing header."""

    code = "invalid_http_request"


class Unauthorized(GatewayError):
    """A tenant key is required and the request has none, or an unknown one."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"www-authenticate", b"Bearer")]


class SloNotAllowed(GatewayError):
    """The tenant's key does not allow the SLO class or per-request targets it asked for."""

    status = 403
    type = "permission_error"
    code = "slo_not_allowed"


class RouteDenied(GatewayError):
    """No route of the active policy admits this request."""

    status = 403
    type = "permission_error"
    code = "no_matching_route"


class AdminDisabled(GatewayError):
    """The admin API is off because GATEWAY_ADMIN_TOKEN is not set."""

    status = 403
    type = "permission_error"
    code = "admin_disabled"


class NotFound(GatewayError):
    """No such path."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    """No pool of the active policy serves the requested model."""

    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    """The path exists, but not with this method; the answer says which ones it takes."""

    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, message: str, *, allow: str):
        super().__init__(message)
        self.allow = allow

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"allow", self.allow.encode())]


class RequestTimeout(GatewayError):
    """The client did not send the whole request body within the body-read timeout."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class BodyTooLarge(GatewayError):
    """The request body is over the configured limit."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class HeadersTooLarge(GatewayError):
    """The request line and headers are over the configured limit."""

    status = 431
    type = "invalid_request_error"
    code = "request_header_fields_too_large"


class NoCapacity(GatewayError):
    """Every eligible pool is full and waiting for a slot would break the SLO budget."""

    status = 429
    type = "rate_limit_error"
    code = "no_capacity"


class RateLimited(GatewayError):
    """The tenant has spent its requests or tokens a minute; the answer says when to retry."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(max(1, math.ceil(self.retry_after_s))).encode())]


class NoHealthyBackend(GatewayError):
    """Every backend that could serve the request is ejected or failing its health check."""

    status = 503
    type = "api_error"
    code = "no_healthy_backend"


class PolicyVersionNotFound(NotFound):
    """The admin asked for a policy version that was never stored."""

    code = "policy_version_not_found"


class ReportNotFound(NotFound):
    """The admin asked for a report file that was never written."""

    code = "report_not_found"


class PolicyStoreUnavailable(GatewayError):
    """The policy versions in the database cannot be read or written."""

    status = 503
    code = "policy_store_unavailable"


class InternalError(GatewayError):
    """The gateway itself failed to serve the request: a bug, whose traceback is logged."""

    code = "internal_error"

    def __init__(self, message: str = "the gateway failed to serve this request"):
        super().__init__(message)


class TooManyConnections(GatewayError):
    """The gateway has as many client connections open as GATEWAY_MAX_CONNECTIONS allows."""

    status = 503
    code = "too_many_connections"


class UpstreamError(GatewayError):
    """The backend failed: refused or dropped the connection, answered 5xx, or broke the stream."""

    status = 502
    type = "api_error"
    code = "upstream_error"


class UpstreamTimeout(UpstreamError):
    """The backend did not answer within the timeout of the request's SLO class."""

    status = 504
    code = "upstream_timeout"


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong or doubtful in a policy: where it is, its field path, and what."""

    location: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.path}: {self.message}"


class PolicyError(Exception):
    """The policy is invalid; the message names the file, the field path and the bad value."""

    def __init__(self, message: str, problems: Sequence[Problem] = ()):
        super().__init__(message)
        self.problems = list(problems)


class DatabaseUnavailable(Exception):
    """The database cannot take records now (unreachable, locked, not migrated); retry later."""


class SharedStateUnavailable(Exception):
    """Redis cannot be reached or has lost its data; the replica serves from local state."""


class ParkingHookFailed(Exception):
    """A parking hook failed: the backend stays in service, or its wake-up is tried again."""


def shown(value: object, limit: int = 60) -> str:
    """Return a client-supplied value for an error message: its repr, cut short if long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"
