"""What the commands that change a fleet share: who made the change, and telling the gateways.

A policy apply, a rollback or a rollout step is a new active version in the database; running
gateways poll for it, and with Redis (REDIS_URL) they are told at once.
"""

from __future__ import annotations

import getpass

from gateway.settings import Settings


def operator() -> str:
    """Return who is running the command: the OS user."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def announce(settings: Settings, version: int | None = None) -> str:
    """Tell running gateways a new version is active; return how soon they will serve it."""
    from gateway.fleet.sharedstate import tell_replicas

    fields = {} if version is None else {"version": version}
    if settings.redis_url and tell_replicas(
        settings.redis_url, settings.redis_prefix, "policy", **fields
    ):
        return "a second"
    return f"{settings.policy_poll_interval_s:g} s"
