"""ASGI's types as the gateway uses them: the downstream connection's scope and its callables.

The ingress (gateway/ingress) is called with them; the forwarder (gateway/upstream/forward.py)
relays the answer through `send` and watches `receive` for the client going away. They live
here, in the lowest layer that uses them, so both reach one definition (pyproject.toml's layers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
