"""Upstream credentials: the key each backend takes, and where a gateway lets a policy send it.

The policy holds only a key's variable name (`api_key_env`), never the key, so a policy can be
stored as a version, diffed, shown by the admin API and logged without revealing anything. The
gateway reads the key when it builds its fleet and sends it to that backend alone, as
`Authorization: Bearer KEY`, on requests, shadow copies and health probes, and on power scrapes
when the metrics endpoint is on the backend's own origin (a separate exporter is another server,
which must not receive the backend's key).

A policy is data anyone with the admin token can change, so what it may do with secrets is
bounded here, by the operator's settings, not by the policy:

- it may name only variables that start with GATEWAY_UPSTREAM_KEY_ (the policy model refuses
  others), never DATABASE_URL, the admin token or another program's key;
- every key is bound to the hosts it may be sent to (GATEWAY_UPSTREAM_KEY_HOSTS; `*` for any):
  a policy that gives it to a backend elsewhere, or names a key bound to no host, is refused;
- with GATEWAY_UPSTREAM_HOSTS set, every backend and metrics URL must be on one of its hosts.

A gateway that is to serve a policy naming a variable it does not have, or breaking one of these
rules, refuses the policy (at startup, on apply, on reload) before anything changes.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.errors import PolicyError, Problem
from gateway.policy.consistency import Finding
from gateway.policy.definition import Backend, Policy

GATEWAY_ENVIRONMENT = "in this gateway's environment"


def host_matches(url: str, patterns: Sequence[str]) -> bool:
    """Return whether a URL's host (and port) matches a pattern: `host`, `host:port`, `*.domain`."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    port = str(parts.port or (443 if parts.scheme == "https" else 80))
    for pattern in patterns:
        name, sep, wanted = pattern.lower().partition(":")
        if fnmatch.fnmatchcase(host, name) and (not sep or wanted == port):
            return True
    return False


@dataclass(frozen=True)
class Access:
    """The upstream keys a gateway holds, where each may be sent, and where backends may be.

    `environ` holds the keys; `key_hosts` binds each key variable to the host patterns it may
    be sent to (a key bound to none is sent nowhere; `*` is any host); `hosts`, when not empty,
    is every host a backend or metrics URL may be on.
    """

    environ: Mapping[str, str]
    key_hosts: Mapping[str, Sequence[str]] = field(default_factory=dict)
    hosts: Sequence[str] = ()

    def findings(self, policy: Policy, where: str = GATEWAY_ENVIRONMENT) -> list[Finding]:
        """Find the backends this gateway cannot serve: an unset key, a key or URL off bounds."""
        found: list[Finding] = []
        for name, pool in policy.pools.items():
            for i, backend in enumerate(pool.backends):
                at: tuple[str | int, ...] = ("pools", name, "backends", i)
                urls = {
                    "url": backend.url,
                    "metrics_url": backend.metrics_url,
                    "engine_metrics_url": backend.engine_metrics_url,
                }
                for key, url in urls.items():
                    if url and self.hosts and not host_matches(url, self.hosts):
                        found.append(
                            (
                                (*at, key),
                                f"backend {backend.name!r} of pool {name!r} is at {url}, on no "
                                f"host GATEWAY_UPSTREAM_HOSTS allows ({', '.join(self.hosts)})",
                            )
                        )
                variable = backend.api_key_env
                if variable is None:
                    continue
                if not self.environ.get(variable):
                    found.append(
                        (
                            (*at, "api_key_env"),
                            f"backend {backend.name!r} of pool {name!r} takes its key from "
                            f"{variable}, which is not set {where}",
                        )
                    )
                    continue
                bound = self.key_hosts.get(variable)
                if bound is None:
                    host = urlsplit(backend.url).hostname or backend.url
                    found.append(
                        (
                            (*at, "api_key_env"),
                            f"backend {backend.name!r} of pool {name!r} takes its key from "
                            f"{variable}, which GATEWAY_UPSTREAM_KEY_HOSTS binds to no host: "
                            "bind it to the hosts it may be sent to, e.g. "
                            f'{{"{variable}": ["{host}"]}}',
                        )
                    )
                elif not host_matches(backend.url, bound):
                    found.append(
                        (
                            (*at, "api_key_env"),
                            f"backend {backend.name!r} of pool {name!r} is at {backend.url}, "
                            f"but {variable} may be sent only to {', '.join(bound)} "
                            "(GATEWAY_UPSTREAM_KEY_HOSTS)",
                        )
                    )
        return found

    def require(self, policy: Policy, source: str = "<policy>") -> None:
        """Raise PolicyError naming every backend this gateway cannot serve."""
        problems = [Problem(source, ".".join(map(str, p)), m) for p, m in self.findings(policy)]
        if problems:
            listed = "\n  ".join(map(str, problems))
            raise PolicyError(f"policy breaks this gateway's upstream rules:\n  {listed}", problems)

    def authorization(self, backend: Backend) -> dict[str, str]:
        """Return the Authorization header a backend takes, or {} when it takes none."""
        if backend.api_key_env is None:
            return {}
        key = self.environ.get(backend.api_key_env)
        return {"authorization": f"Bearer {key}"} if key else {}


def same_origin(url: str, other: str) -> bool:
    """Return whether two URLs share scheme, host and port, so one server answers both."""
    a, b = urlsplit(url), urlsplit(other)
    return (a.scheme, a.hostname, a.port) == (b.scheme, b.hostname, b.port)
