"""Shared state: what the replicas of one gateway share through Redis, and the fallback without it.

With REDIS_URL set, each replica registers itself on a heartbeat, holds its slots and shadow
budgets as leases that lapse when it dies (`gateway/fleet/leases.py`), shares token buckets
(`gateway/fleet/ratelimit.py`), and hears the other replicas' notices (a new policy version, an
ejected backend, a freed slot) on one pub/sub channel.

When a Redis call fails, the replica logs it once, reports it in /readyz and metrics, and serves
from local state: a conservative share of every capacity (divided by the replicas it last saw),
so that replicas cut off together still never overfill a pool. The heartbeat keeps trying;
once Redis answers, the replica registers its leases again (Redis may have restarted empty) and
goes back to shared state. Redis errors never leave this module: they become
SharedStateUnavailable.

Keys, under the prefix (GATEWAY_REDIS_PREFIX):

    PREFIX:replicas          sorted set: replica id -> lease expiry (Redis time, ms)
    PREFIX:boot              a token that changes when Redis has lost its data
    PREFIX:lease:NAME        sorted set: lease id -> expiry; a slot or shadow-budget place
    PREFIX:waiting:POOL      set while some replica has requests waiting for POOL
    PREFIX:ejected:URL       set while the backend at URL is ejected; expires with the ejection
    PREFIX:bucket:NAME       hash: tokens, updated (a token bucket)
    PREFIX:events            the pub/sub channel
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from gateway.errors import SharedStateUnavailable
from gateway.metrics import GatewayMetrics
from gateway.periodic import Periodic, Tasks

log = logging.getLogger(__name__)

# Connections to Redis per replica: calls beyond wait for one (scripts are pipelined anyway).
MAX_CONNECTIONS = 32
MAX_REPLICAS = 1024  # more replicas of one gateway than any fleet runs

T = TypeVar("T")
Handler = Callable[[dict[str, Any]], None]
# A script to run, its keys and arguments, and the future its caller awaits.
Call = tuple[AsyncScript, Sequence[Any], Sequence[Any], "asyncio.Future[Any]"]

# Register this replica until its lease lapses; set the boot token if Redis has none (it was
# just started, or lost its data); return the token and how many replicas are alive.
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local boot = redis.call('GET', KEYS[2])
if not boot then
  boot = ARGV[3]
  redis.call('SET', KEYS[2], boot)
end
return {boot, redis.call('ZCARD', KEYS[1])}
"""


def replica_id() -> str:
    """Return an id for this process that no other replica, past or present, has."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def redis_address(url: str) -> str:
    """Return host:port/db of a Redis URL, without the password a URL may carry."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}{parts.path or ''}"


class SharedState:
    """The replicas' Redis: membership, outage fallback, notices; one per gateway process.

    Components call Redis only through `call`, which turns every failure into
    SharedStateUnavailable and switches the replica to local state; `on_reset` work runs each
    time the replica (re)joins, `on_beat` work on every heartbeat while shared.
    """

    def __init__(
        self,
        url: str,
        metrics: GatewayMetrics,
        *,
        prefix: str = "gateway",
        lease_s: float = 10.0,
        timeout_s: float = 0.5,
        replica: str | None = None,
    ):
        self.address = redis_address(url)
        # Calls wait (up to the timeout) for a free connection rather than fail at a limit,
        # which would pass a burst of traffic for a Redis outage.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # No retries inside the client: a failed call switches to local state at once.
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self.redis = aioredis.Redis(connection_pool=pool)
        self.metrics = metrics
        self.prefix = prefix
        self.lease_ms = int(lease_s * 1000)
        self.replica = replica if replica is not None else replica_id()
        self.up = False
        self.replicas = 1
        self.boot: bytes | None = None
        self._joining = False
        self._reported = False  # this outage is logged and counted
        self._handlers: dict[str, list[Handler]] = {}
        self._resets: list[Callable[[], Awaitable[None]]] = []
        self._beats: list[Callable[[], Awaitable[None]]] = []
        self._heartbeat = self.redis.register_script(HEARTBEAT)
        self.periodic = Periodic("shared-state", max(lease_s / 4, 0.05), self.beat)
        self._listener: asyncio.Task[None] | None = None
        self._background = Tasks()
        self._batch: list[Call] = []  # scripts waiting for the next pipeline
        self._sending = False

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @property
    def channel(self) -> str:
        return self.key("events")

    def share(self, capacity: float) -> float:
        """Return the part of a fleet-wide capacity this replica may use alone now."""
        return capacity if self.up else capacity / self.replicas

    def on(self, kind: str, handler: Handler) -> None:
        """Call handler with every notice of this kind that another replica publishes."""
        self._handlers.setdefault(kind, []).append(handler)

    def on_reset(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run work each time this replica joins shared state (at start, after an outage)."""
        self._resets.append(work)

    def on_beat(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run work on every heartbeat while in shared state."""
        self._beats.append(work)

    async def call(self, op: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """Run one Redis operation; on failure switch to local state and raise."""
        if not (self.up or self._joining):
            raise SharedStateUnavailable(f"Redis at {self.address} is unreachable")
        try:
            return await op(self.redis)
        except (RedisError, OSError) as exc:
            self.lost(exc)
            raise SharedStateUnavailable(
                f"Redis at {self.address} failed: {type(exc).__name__}"
            ) from exc

    async def run(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run a Lua script; the scripts called while a pipeline is out go in the next one.

        One pipeline at a time keeps the scripts in the order they were called (a give-back
        never overtakes its take), and under load many takes and give-backs share a round trip:
        a fraction of a call's cost each (docs/performance.md).
        """
        if not (self.up or self._joining):
            raise SharedStateUnavailable(f"Redis at {self.address} is unreachable")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._batch.append((script, keys, args, future))
        if not self._sending:
            self._sending = True
            self._background.spawn(self._send_batches())
        return await future

    async def _send_batches(self) -> None:
        try:
            while self._batch:
                batch, self._batch = self._batch, []
                await self._send(batch)
        finally:
            self._sending = False
            for *_, future in self._batch:  # cancelled on shutdown with calls still queued
                if not future.done():
                    future.set_exception(SharedStateUnavailable("the replica is stopping"))
            self._batch = []

    async def _send(self, batch: list[Call]) -> None:
        failure: Exception = SharedStateUnavailable("the replica stopped before Redis answered")
        try:
            results = await self._pipeline([(s, k, a) for s, k, a, _ in batch])
        except (RedisError, OSError) as exc:
            self.lost(exc)
            failure = SharedStateUnavailable(
                f"Redis at {self.address} failed: {type(exc).__name__}"
            )
        else:
            for (*_, future), result in zip(batch, results, strict=True):
                if future.done():
                    continue  # its caller was cancelled
                if isinstance(result, Exception):
                    log.error("Redis refused a script: %s", result)
                    future.set_exception(
                        SharedStateUnavailable(f"Redis refused a script: {result}")
                    )
                else:
                    future.set_result(result)
        finally:
            # Failed, or cancelled on shutdown: no caller may wait for an answer that never comes.
            for *_, future in batch:
                if not future.done():
                    future.set_exception(failure)

    async def _pipeline(
        self, calls: list[tuple[AsyncScript, Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """Run scripts in one pipeline; load those a restarted Redis forgot, and run them again."""
        results = await self._execute(calls)
        again = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if again:
            for script in {calls[i][0] for i in again}:
                await self.redis.script_load(script.script)
            for i, result in zip(
                again, await self._execute([calls[i] for i in again]), strict=True
            ):
                results[i] = result
        return results

    async def _execute(
        self, calls: list[tuple[AsyncScript, Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    def spawn(self, work: Awaitable[Any]) -> None:
        """Run a Redis write in the background (a release, a notice): never on the request path."""
        self._background.spawn(self._quietly(work))

    async def _quietly(self, work: Awaitable[Any]) -> None:
        # A failure is already logged and counted; leases lapse and state is rebuilt on rejoin.
        with contextlib.suppress(SharedStateUnavailable):
            await work

    def notice(self, kind: str, **fields: Any) -> bytes:
        """Return a notice from this replica, as it goes on the channel."""
        return orjson.dumps({"kind": kind, "from": self.replica, **fields})

    def publish(self, kind: str, **fields: Any) -> None:
        """Tell the other replicas something, in the background."""
        message = self.notice(kind, **fields)
        self.spawn(self.call(lambda r: r.publish(self.channel, message)))

    def lost(self, exc: BaseException | str) -> None:
        """Switch to local state after a failed call; log and count it once per outage."""
        self.up = False
        if self._reported:
            return
        self._reported = True
        self.metrics.shared_state_up.set(0)
        self.metrics.shared_state_outages.inc()
        log.warning(
            "Redis at %s is unreachable (%s); serving from local state with 1/%d of every "
            "pool's capacity until it answers",
            self.address,
            exc if isinstance(exc, str) else type(exc).__name__,
            self.replicas,
        )

    async def beat(self) -> None:
        """Renew this replica's registration; rejoin shared state after an outage or a reset."""
        token = secrets.token_hex(8)
        try:
            boot, replicas = await self._heartbeat(
                keys=[self.key("replicas"), self.key("boot")],
                args=[self.replica, self.lease_ms, token],
            )
        except (RedisError, OSError) as exc:
            self.lost(exc)
            return
        # Bounded like every figure read from Redis: a damaged count must not shrink this
        # replica's outage share to nothing.
        self.replicas = min(max(int(replicas), 1), MAX_REPLICAS)
        self.metrics.replicas.set(self.replicas)
        if (not self.up or boot != self.boot) and not await self._join(boot):
            return
        for work in self._beats:
            try:
                await work()
            except SharedStateUnavailable:
                return

    async def _join(self, boot: bytes) -> bool:
        """Register what this replica holds, then serve from shared state; say if it worked.

        Requests keep using local state until every reset has run, so none is admitted
        against a Redis that does not yet know what this replica holds.
        """
        outage, lost_data = self._reported, self.boot is not None and boot != self.boot
        self.up, self._joining = False, True
        if outage:
            # Connections pooled before the outage point at a server that is gone.
            await self.redis.connection_pool.disconnect()
        try:
            for work in self._resets:
                await work()
        except SharedStateUnavailable:
            return False  # lost again: the next beat tries anew
        finally:
            self._joining = False
        self.boot, self.up, self._reported = boot, True, False
        self.metrics.shared_state_up.set(1)
        if outage:
            log.info("Redis at %s answers: state is shared again", self.address)
        elif lost_data:
            log.warning(
                "Redis at %s had lost its data: registered this replica's again", self.address
            )
        self._listen()
        return True

    def _listen(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._receive(), name="shared-state-notices")

    async def _receive(self) -> None:
        """Hand every notice from another replica to its handlers, until the connection fails."""
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.channel)
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is not None:
                    self._dispatch(message["data"])
        except (RedisError, OSError) as exc:
            self.lost(exc)  # the heartbeat rejoins and listens again
        finally:
            await asyncio.shield(pubsub.aclose())

    def _dispatch(self, data: bytes) -> None:
        try:
            notice = orjson.loads(data)
        except orjson.JSONDecodeError:
            log.warning("ignoring a malformed notice on %s", self.channel)
            return
        if not isinstance(notice, dict) or notice.get("from") == self.replica:
            return
        for handler in self._handlers.get(str(notice.get("kind")), ()):
            try:
                handler(notice)
            except Exception:
                log.exception("handling a %s notice failed", notice.get("kind"))

    async def start(self) -> None:
        """Join shared state (or start in local state if Redis is unreachable now)."""
        self.metrics.shared_state_up.set(0)
        await self.beat()
        self.periodic.start()

    async def stop(self) -> None:
        """Leave: stop listening, finish background writes, deregister, close the connection."""
        await self.periodic.stop()
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        await self._background.finish(timeout_s=2)
        if self.up:
            with contextlib.suppress(SharedStateUnavailable):
                await self.call(lambda r: r.zrem(self.key("replicas"), self.replica))
        await self.redis.aclose()


def tell_replicas(url: str, prefix: str, kind: str, **fields: Any) -> bool:
    """Publish a notice from outside a gateway (the CLI); return whether Redis took it."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    message = orjson.dumps({"kind": kind, "from": f"cli@{socket.gethostname()}", **fields})
    try:
        client.publish(f"{prefix}:events", message)
    except (RedisError, OSError) as exc:
        log.warning("could not tell the replicas through Redis at %s: %s", redis_address(url), exc)
        return False
    finally:
        client.close()
    return True
