"""The ASGI app: /v1 to the plain-ASGI ingress (the hot path), everything else to the ops app.

The ops app (/healthz, /readyz, /metrics, /admin, /openapi.json) is FastAPI, and runs the
lifespan that starts and stops the gateway's parts.
"""

from __future__ import annotations

import logging
from typing import Any

import yaml

from gateway.ingress.api import Ingress
from gateway.ops.guard import Guard
from gateway.ops.routes import ops_app
from gateway.policy.consistency import retired
from gateway.policy.definition import Policy
from gateway.policy.load import PolicyLoader, parse_policy, read_text
from gateway.runtime import Gateway
from gateway.settings import Settings

log = logging.getLogger(__name__)


class GatewayApp:
    """The ASGI app: /v1 to the ingress, the rest to the FastAPI app."""

    def __init__(self, gateway: Gateway):
        self.gateway = gateway
        self.ingress = Ingress(gateway)
        settings = gateway.settings
        self.ops = Guard(
            ops_app(gateway),
            lambda: settings.admin_token,
            settings.max_body_bytes,
            settings.body_read_timeout_s,
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            await self.ingress(scope, receive, send)
        else:
            await self.ops(scope, receive, send)


def create_app(settings: Settings | None = None, policy: Policy | None = None) -> GatewayApp:
    """Build the gateway app from settings (default: the environment) and their policy file."""
    settings = settings if settings is not None else Settings()
    if policy is not None:
        return GatewayApp(Gateway(settings, policy))
    text = read_text(settings.policy_path)
    policy = parse_policy(text, str(settings.policy_path))
    for path, message in retired(yaml.load(text, Loader=PolicyLoader)):
        # Served as read, so an upgrade never stops a gateway; applying it would be refused.
        where = ".".join(map(str, path))
        log.warning("%s: %s: %s; served as read", settings.policy_path, where, message)
    return GatewayApp(Gateway(settings, policy, policy_text=text))
