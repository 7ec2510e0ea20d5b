"""Errors the simulator raises, and how they look on the wire.

SimulatorError
├── ProfileError           a profile file or override is not valid
└── ApiError               a request cannot be served; rendered in OpenAI's error shape
    ├── InvalidRequest     400: the body is malformed or asks for more than the device can do
    ├── InvalidApiKey      401: a key is required (--api-key) and the request's is missing or wrong
    ├── ModelNotFound      404: the model is not served here
    ├── UnknownUrl         404: no such endpoint
    ├── MethodNotAllowed   405: the endpoint exists but not for this method
    ├── ServerFault        500/503: an injected fault
    └── Asleep             503: the engine sleeps (vLLM's sleep mode) or is still waking up
"""

from __future__ import annotations

from typing import Any


class SimulatorError(Exception):
    """Base of every error the simulator raises on purpose."""


class ProfileError(SimulatorError):
    """A profile file or override is not valid."""


class ApiError(SimulatorError):
    """A request cannot be served; carries the HTTP status and OpenAI's error fields."""

    status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """Return the error in OpenAI's shape."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(ApiError):
    """The body is malformed or asks for more than the device can do."""


class InvalidApiKey(ApiError):
    """The simulator requires a key and the request carries none, or another one."""

    status = 401

    def __init__(self, given: bool):
        super().__init__(
            "Incorrect API key provided." if given else "You didn't provide an API key.",
            code="invalid_api_key",
        )


class ModelNotFound(ApiError):
    """The model is not served by this backend."""

    status = 404

    def __init__(self, model: str):
        super().__init__(
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )


class UnknownUrl(ApiError):
    """No endpoint answers this path."""

    status = 404

    def __init__(self, method: str, path: str):
        super().__init__(f"Unknown request URL: {method} {path}.", code="unknown_url")


class MethodNotAllowed(ApiError):
    """The endpoint exists but does not accept this method."""

    status = 405

    def __init__(self, method: str, path: str):
        super().__init__(f"Method {method} is not allowed on {path}.", code="method_not_allowed")


class ServerFault(ApiError):
    """An injected server error, as a sick device would return."""

    error_type = "server_error"

    def __init__(self, status: int):
        message = (
            "The server is overloaded or not ready yet."
            if status == 503
            else "The server had an error while processing your request. Sorry about that!"
        )
        super().__init__(message)
        self.status = status


class Asleep(ApiError):
    """A request to an engine put to sleep (POST /sleep) and not yet awake again."""

    status = 503
    error_type = "server_error"

    def __init__(self) -> None:
        super().__init__(
            "The engine is sleeping: POST /wake_up and wait for it to answer.", code="sleeping"
        )
