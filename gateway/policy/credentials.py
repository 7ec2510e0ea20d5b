"""Upstream credentials: the key each backend takes, read from the variable its policy entry names.

The policy holds only the variable's name (`api_key_env`), never the key, so a policy can be
stored as a version, diffed, shown by the admin API and logged without revealing anything. The
gateway reads the key when it builds its fleet and sends it to that backend alone, as
`Authorization: Bearer KEY`, on requests, shadow copies and health probes, and on power scrapes
when the metrics endpoint is on the backend's own origin (a separate exporter is another server,
which must not receive the backend's key).

A gateway that is to serve a policy naming a variable it does not have refuses the policy (at
startup, on apply, on reload) rather than send requests that can only be refused upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from gateway.errors import PolicyError, Problem
from gateway.policy.model import Backend, Policy
from gateway.policy.rules import Finding

GATEWAY_ENVIRONMENT = "in this gateway's environment"


def unset(
    policy: Policy, environ: Mapping[str, str], where: str = GATEWAY_ENVIRONMENT
) -> list[Finding]:
    """Find the backends whose key variable is unset or empty in `environ` (`where` says whose)."""
    found: list[Finding] = []
    for name, pool in policy.pools.items():
        for i, backend in enumerate(pool.backends):
            variable = backend.api_key_env
            if variable is not None and not environ.get(variable):
                found.append(
                    (
                        ("pools", name, "backends", i, "api_key_env"),
                        f"backend {backend.name!r} of pool {name!r} takes its key from "
                        f"{variable}, which is not set {where}",
                    )
                )
    return found


def require(policy: Policy, environ: Mapping[str, str], source: str = "<policy>") -> None:
    """Raise PolicyError naming every backend whose key variable is unset."""
    problems = [Problem(source, ".".join(map(str, p)), m) for p, m in unset(policy, environ)]
    if problems:
        raise PolicyError(
            "policy needs upstream keys:\n  " + "\n  ".join(map(str, problems)), problems
        )


def authorization(backend: Backend, environ: Mapping[str, str] | None) -> dict[str, str]:
    """Return the Authorization header a backend takes, or {} when it takes none."""
    if environ is None or backend.api_key_env is None:
        return {}
    key = environ.get(backend.api_key_env)
    return {"authorization": f"Bearer {key}"} if key else {}


def same_origin(url: str, other: str) -> bool:
    """Return whether two URLs share scheme, host and port, so one server answers both."""
    a, b = urlsplit(url), urlsplit(other)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)
