"""The live state of the fleet: slots and KV memory in use and health of every backend, waiters.

The ingress, forwarder and health checker mutate it; the router only reads it. Everything here
runs on the event loop, so reads and writes between two awaits are consistent.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from gateway.fleet.prefixes import BLOCK_TOKENS, PrefixIndex, capacity_blocks
from gateway.fleet.sessions import Sessions
from gateway.policy import credentials
from gateway.policy.credentials import Access
from gateway.policy.definition import Backend, Policy, Pool

REQUEST_HEADERS = {"content-type": "application/json"}
SHADOW_HEADER = {"x-gateway-shadow": "1"}


# Parking's states of a backend (gateway/parking/plan.py): in service, or taken out of it.
IN_SERVICE, DRAINING, PARKED, WAKING = "", "draining", "parked", "waking"


@dataclass(eq=False, slots=True)
class BackendState:
    """One upstream server: its slots and KV-cache memory in use, and its outlier state.

    `in_flight` and `kv_reserved` are this replica's; `elsewhere` and `kv_elsewhere` what the
    other replicas hold, as last seen through shared state (always 0 for a single process);
    `external` the requests of other clients its serving engine reported beyond all of those,
    and `engine_full` why the engine takes nothing more now ('' when it has room or reports
    nothing); `engine_cached_share` and `engine_tokens_per_s` the prompt cache's share and the
    generation speed the engine last reported (None when it reports none: the share comes from
    vLLM and llama.cpp, the speed from llama.cpp).

    It also carries the headers every call to it sends (its credential among them), built once
    with the fleet, so the request path only picks the right set. They stay out of repr, so a
    backend in a log line or a traceback never shows its key.
    """

    name: str
    url: str
    pool: str
    slots: int
    kv_capacity: float = float("inf")
    metrics_url: str = ""
    engine_url: str = ""
    api_key_env: str | None = None
    auth: dict[str, str] = field(default_factory=dict, repr=False)
    headers: dict[str, str] = field(default_factory=lambda: dict(REQUEST_HEADERS), repr=False)
    shadow_headers: dict[str, str] = field(
        default_factory=lambda: REQUEST_HEADERS | SHADOW_HEADER, repr=False
    )
    metrics_auth: dict[str, str] = field(default_factory=dict, repr=False)
    engine_auth: dict[str, str] = field(default_factory=dict, repr=False)
    in_flight: int = 0
    kv_reserved: float = 0.0
    # Prompt tokens this replica sent it that it has still to compute: each request's prompt less
    # what the index expected cached, until its first token (a whole answer: until it arrives).
    prefilling: int = 0
    elsewhere: int = 0
    kv_elsewhere: float = 0.0
    external: int = 0
    external_seen: int = 0  # what the last scrape alone made of the others' requests
    engine_full: str = ""
    engine_cached_share: float | None = None
    engine_tokens_per_s: float | None = None
    ejected: bool = False
    ejected_until: float = 0.0
    # Parking's state (gateway/parking/plan.py): '' in service, else draining, parked, waking;
    # why the plan moved it there, and since when (Unix seconds).
    parking: str = ""
    parking_reason: str = ""
    parking_since: float = 0.0
    consecutive_failures: int = 0
    ejections: int = 0  # the doublings of the next ejection interval
    returned_at: float = 0.0  # when it last came back from an ejection (the detector's clock)
    # Outcomes in the detector's current window, for its failure-share rule.
    window_started: float = 0.0
    window_requests: int = 0
    window_failures: int = 0

    @property
    def free_slots(self) -> int:
        if self.engine_full:
            return min(0, self.slots - self.load)
        return self.slots - self.load

    @property
    def load(self) -> int:
        """Requests the backend serves now: every replica's, and other clients' it reported."""
        return self.in_flight + self.elsewhere + self.external

    @property
    def gateway_load(self) -> int:
        """Requests every replica of the gateway has on the backend now."""
        return self.in_flight + self.elsewhere

    def kv_tokens(self, bytes_per_token: float) -> int:
        """Return the KV-cache tokens every replica has reserved on the backend now."""
        return round((self.kv_reserved + self.kv_elsewhere) / bytes_per_token)

    def fits(self, kv_bytes: float) -> bool:
        """Return whether a request needing kv_bytes of KV cache fits in the free memory."""
        return self.kv_reserved + self.kv_elsewhere + kv_bytes <= self.kv_capacity

    def takes(self, kv_bytes: float) -> bool:
        """Return whether the backend can take a request needing kv_bytes now: in service, a
        free slot (none while its engine says it is full), room in its KV memory."""
        # `free_slots > 0` and `fits` inline: a decision asks this of every backend it
        # considers, and the calls were a tenth of its time (bench/decision_time.py).
        return (
            not self.ejected
            and not self.parking
            and not self.engine_full
            and self.in_flight + self.elsewhere + self.external < self.slots
            and self.kv_reserved + self.kv_elsewhere + kv_bytes <= self.kv_capacity
        )

    def overcommitted(self) -> bool:
        """Return whether more slots or KV memory are held than the backend has."""
        return self.free_slots < 0 or not self.fits(0.0)

    def configure(self, fresh: BackendState) -> None:
        """Take a new policy version's name, pool, capacity and credentials; keep live state."""
        for name in CONFIGURED:
            setattr(self, name, getattr(fresh, name))


# What a policy version sets on a backend; the rest is live state that survives a reload.
CONFIGURED = (
    "name",
    "pool",
    "slots",
    "kv_capacity",
    "metrics_url",
    "engine_url",
    "api_key_env",
    "auth",
    "headers",
    "shadow_headers",
    "metrics_auth",
    "engine_auth",
)


def backend_state(
    backend: Backend, pool_name: str, pool: Pool, access: Access | None
) -> BackendState:
    """Build the state of one backend of a policy, with its credential from `access`."""
    auth = access.authorization(backend) if access is not None else {}
    metrics_url = backend.metrics_url or backend.url + "/metrics"
    engine_url = backend.engine_metrics_url or backend.url + "/metrics"
    return BackendState(
        backend.name,
        backend.url,
        pool_name,
        pool.slots_per_backend,
        pool.kv_capacity_bytes(),
        metrics_url=metrics_url,
        engine_url=engine_url,
        api_key_env=backend.api_key_env,
        auth=auth,
        headers=REQUEST_HEADERS | auth,
        shadow_headers=REQUEST_HEADERS | SHADOW_HEADER | auth,
        metrics_auth=auth if credentials.same_origin(backend.url, metrics_url) else {},
        engine_auth=auth if credentials.same_origin(backend.url, engine_url) else {},
    )


@dataclass(eq=False, slots=True)
class Slot:
    """One request's hold on a backend: a slot, the KV memory it reserved, and its lease."""

    backend: BackendState
    kv_bytes: float = 0.0
    lease: str | None = None
    held: bool = True
    taken_at: float = 0.0  # on the admission's clock


@dataclass(eq=False, slots=True)
class Waiter:
    """A request waiting in a pool's queue, and the KV memory the slot it gets must have."""

    future: asyncio.Future[Slot]
    kv_bytes: float = 0.0


@dataclass(eq=False, slots=True)
class PoolState:
    """A pool's backends, the requests waiting, in arrival order, for one of its slots, and the
    fleet's index of the prompt prefixes its backends hold and table of named sessions."""

    name: str
    spec: Pool
    backends: list[BackendState]
    waiters: deque[Waiter] = field(default_factory=deque)
    prefixes: PrefixIndex = field(default_factory=PrefixIndex)
    sessions: Sessions = field(default_factory=Sessions)

    def healthy(self) -> list[BackendState]:
        """Return the backends in service: not ejected, not parked (nor draining or waking)."""
        return [b for b in self.backends if not b.ejected and not b.parking]

    def most_free(
        self,
        exclude: frozenset[str] = frozenset(),
        kv_bytes: float = 0.0,
        blocks: tuple[int, ...] = (),
        session: str | None = None,
        block_tokens: float = 0.0,
    ) -> BackendState | None:
        """Return the healthy backend with room for kv_bytes that serves the request soonest,
        or None.

        Without prefix blocks, the one with the most free slots. With them, the one whose
        prefill costs least: the tokens it must compute (the blocks it does not hold, plus one
        for the request itself, of `block_tokens` each) times the requests it runs, which its
        chunks hold up (LMetric's uncached prefill tokens times batch size, arXiv 2603.15202),
        plus the prompt tokens it has still to compute ahead of them (`prefilling`), which the
        request waits for as engines schedule prefill in chunks; then the most free slots. The
        backend that served the request's named session last counts as holding the whole
        prompt: the session is a hint priced as a cache hit, so it never outweighs a much
        lighter load.
        """
        if len(self.backends) == 1:  # none to weigh it against
            (backend,) = self.backends
            return backend if backend.name not in exclude and backend.takes(kv_bytes) else None
        holder = self.sessions.backend(session) if session is not None and blocks else None
        best, best_key = None, (0.0, 0)
        for backend in self.backends:
            if backend.name in exclude or not backend.takes(kv_bytes):
                continue
            load = backend.load  # its free slots are slots - load, as it takes a request
            key: tuple[float, int]
            if not blocks:
                key = (0.0, load - backend.slots)
            else:
                name = backend.name
                held = len(blocks) if name == holder else self.prefixes.cached(name, blocks)
                own = (len(blocks) - held + 1) * (block_tokens or 1.0)
                ahead = backend.prefilling if block_tokens else 0
                key = (own * (load + 1) + ahead, load - backend.slots)
            if best is None or key < best_key:
                best, best_key = backend, key
        return best


def prefix_capacity(policy: Policy, pool: Pool, block_tokens: int) -> int:
    """Return the prefix blocks one backend of a pool keeps: what the pool declares its engines
    keep cached, else what its KV memory holds."""
    if pool.prefix_cache_tokens is not None:
        return pool.prefix_cache_tokens // block_tokens
    per_token = max(policy.kv_bytes_per_token(m) for m in pool.models)
    return capacity_blocks(pool.kv_capacity_bytes(), per_token, block_tokens)


class Fleet:
    """Every pool of the active policy with its live backend state.

    `access` holds the upstream keys and the rules on where they and backends may be: a
    serving gateway passes its own and is refused (PolicyError) a policy breaking them; without
    it (routing simulations, tests) backends carry no credentials.
    """

    def __init__(
        self,
        policy: Policy,
        access: Access | None = None,
        prefixes: PrefixIndex | None = None,
        block_tokens: int = BLOCK_TOKENS,
        sessions: Sessions | None = None,
    ):
        if access is not None:
            access.require(policy)
        self.access = access
        # Which backend holds which prompt prefix, in blocks of `block_tokens` (a replayed
        # trace's may be other than the live gateway's); kept across policy versions.
        self.prefixes = prefixes if prefixes is not None else PrefixIndex()
        self.block_tokens = block_tokens
        # The backend each named session sticks to; kept across versions for the backends kept.
        self.sessions = sessions if sessions is not None else Sessions()
        self.pools: dict[str, PoolState] = {
            name: PoolState(
                name,
                spec,
                [backend_state(b, name, spec, access) for b in spec.backends],
                prefixes=self.prefixes,
                sessions=self.sessions,
            )
            for name, spec in policy.pools.items()
        }
        self.prefixes.configure(
            {
                backend.name: prefix_capacity(policy, pool.spec, block_tokens)
                for pool in self.pools.values()
                for backend in pool.backends
            }
        )
        self.sessions.forget_backends({b.name for b in self.backends()})

    def backends(self) -> list[BackendState]:
        return [b for p in self.pools.values() for b in p.backends]

    def reconfigure(self, policy: Policy) -> Fleet:
        """Return the fleet of a new policy that keeps this one's live state.

        A backend whose URL is unchanged keeps its BackendState object (slots and KV memory
        held, outlier state), updated to its new name, pool, capacity and credentials, so the
        requests in flight give their slots back to the state the new fleet uses. A pool that
        keeps its name keeps its queue of waiters. A policy this fleet's environment cannot
        serve raises PolicyError before anything changes.
        """
        known = {b.url: b for b in self.backends()}
        fleet = Fleet(policy, self.access, self.prefixes, self.block_tokens, self.sessions)
        for name, pool in fleet.pools.items():
            for i, fresh in enumerate(pool.backends):
                kept = known.pop(fresh.url, None)
                if kept is not None:
                    kept.configure(fresh)
                    pool.backends[i] = kept
            previous = self.pools.get(name)
            if previous is not None:
                pool.waiters = previous.waiters
        return fleet


@dataclass(frozen=True, slots=True)
class Serving:
    """What requests are served by: one policy version and the fleet it configured, replaced
    whole on a reload, so a request that reads it sees one version throughout."""

    policy: Policy
    fleet: Fleet
    version: int
    text: str  # the version's YAML, as stored
