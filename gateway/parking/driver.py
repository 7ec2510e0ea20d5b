"""Parking in the serving gateway: the plan run every second beside serving, and the hooks that
switch a backend off and on (docs/routing.md#in-the-gateway).

Admission tells the plan (gateway/parking/plan.py) of every request routed to a pool and of
every slot's hold; every `ROUND_S` the plan says which backends each pool with a `parking`
block needs. A backend to park is drained first: it takes no new request ('draining'), and
once every replica's requests on it have ended, and `DRAIN_GRACE_S` has passed so that every
replica has heard, its pool's hook switches it off ('parked'). A backend to wake is 'waking'
from the hook's call until the hook says it serves (vLLM: /is_sleeping is false; a command:
/health answers 200), then in service, and its pool's queue is dispatched to it. A draining
backend the plan needs again simply takes requests again.

A hook that fails to park leaves the backend in service; one that fails to wake it is called
again, `RETRY_S` later at first, then twice as long each time up to `MAX_RETRY_S`. Each
failure is logged, counted (gateway_parking_hook_failures_total) and recorded
(`parking_events`), and no request is lost: a draining backend finishes what it holds, and the
requests waiting for a woken one wait in its pool's queue, within their budget, as for a
full pool. The fleet's last GPU backend in service is never parked: it is the fallback.

A pool whose parking says `mode: release` has its parked backends given back (a node powered
down, an instance released): its hook is the operator's command, its wake-up a start from cold,
which the plan counts (it also parks no sooner than a wake-up lasts), and its meter's last
reading is not taken for what a released backend draws: nothing.

Replicas. With Redis, one replica plans: the one holding the planner lease
(PREFIX:parking:planner, renewed every round, lapsing GATEWAY_SLOT_LEASE_S after its holder
stops). It runs the hooks, writes each backend's state to PREFIX:parking:state (url -> JSON)
and announces each change; the others apply it, on the notice and every round from the hash,
so none routes to a backend being parked, and send the planner the requests they route (a
`parking-traffic` notice a round). While Redis is unreachable, no replica parks anything; each
may still wake what its own traffic needs, as waking twice does no harm. Without Redis the
replica plans alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import orjson
import sqlalchemy as sa

from gateway.db.schema import ParkingEvent, parking_events
from gateway.errors import ParkingHookFailed, SharedStateUnavailable, UpstreamError
from gateway.fleet.admission import Admission
from gateway.fleet.sharedstate import SharedState
from gateway.fleet.state import DRAINING, IN_SERVICE, PARKED, WAKING, BackendState, Fleet, PoolState
from gateway.metrics import GatewayMetrics
from gateway.parking.plan import Move, Parking
from gateway.periodic import Periodic, Tasks
from gateway.policy.definition import Policy, PoolParking
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

ROUND_S = 1.0
DRAIN_GRACE_S = 2.0  # a drained backend is parked no sooner: every replica has heard by then
READY_POLL_S = 0.1
RETRY_S = 1.0
MAX_RETRY_S = 30.0
MAX_TOLD = 100_000  # arrivals a notice may add at once: bounded like anything read from Redis

# KEYS[1] the planner lease; ARGV: this replica, lease ms. Take it if free or ours; say if ours.
CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
"""

# KEYS[1] the planner lease; ARGV[1] this replica. Give it up if ours.
RESIGN = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


class Hook(Protocol):
    """How a pool's backends are switched off and on, and how one is known to serve again."""

    async def park(self, backend: BackendState) -> None: ...

    async def wake(self, backend: BackendState) -> None: ...

    async def ready(self, backend: BackendState) -> bool: ...


class SleepMode:
    """vLLM's sleep mode on the backend itself: POST /sleep?level=1 (weights to host memory,
    KV cache dropped), POST /wake_up, GET /is_sleeping. vLLM serves them when started with
    VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode."""

    def __init__(self, upstream: Upstream, timeout_s: float):
        self.upstream = upstream
        self.timeout_s = timeout_s

    async def park(self, backend: BackendState) -> None:
        await self._post(backend, "/sleep?level=1")

    async def wake(self, backend: BackendState) -> None:
        await self._post(backend, "/wake_up")

    async def ready(self, backend: BackendState) -> bool:
        return await self.sleeping(backend) is False

    async def sleeping(self, backend: BackendState) -> bool | None:
        """Return what /is_sleeping says, or None when it says nothing usable."""
        answer = await self.upstream.get(backend.url + "/is_sleeping", backend.auth, self.timeout_s)
        if answer is None or answer[0] != 200:
            return None
        try:
            said = orjson.loads(answer[1])
        except orjson.JSONDecodeError:
            return None
        value = said.get("is_sleeping") if isinstance(said, dict) else None
        return value if isinstance(value, bool) else None

    async def _post(self, backend: BackendState, path: str) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self.upstream.send(
                    backend, path, b"", backend.headers, self.timeout_s, self.timeout_s
                )
                try:
                    body = await self.upstream.read(backend, response)
                finally:
                    response.release()
        except (UpstreamError, TimeoutError) as exc:
            raise ParkingHookFailed(f"POST {path} to backend {backend.name} failed: {exc}") from exc
        if response.status != 200:
            raise ParkingHookFailed(
                f"backend {backend.name} answered {response.status} to POST {path}: "
                f"{body[:200].decode(errors='replace')}"
            )


class OperatorCommand:
    """The operator's commands: argv run with the backend's name, url and pool put in, exit 0
    for success; the backend serves again once its /health answers 200.

    Only programs listed in GATEWAY_PARKING_COMMANDS run (a policy applied through the admin
    API must not run anything else on the gateway's host), with the gateway's environment less
    its own settings and upstream keys. A command may leave a process running (a server it
    started): the gateway waits for the command, never for what it left behind.
    """

    def __init__(
        self,
        spec: PoolParking,
        pool: str,
        upstream: Upstream,
        allowed: Collection[str],
        environ: Mapping[str, str],
    ):
        self.spec = spec
        self.pool = pool
        self.upstream = upstream
        self.allowed = allowed
        self.environ = dict(environ)

    async def park(self, backend: BackendState) -> None:
        await self._run("park", backend)

    async def wake(self, backend: BackendState) -> None:
        await self._run("wake", backend)

    async def ready(self, backend: BackendState) -> bool:
        return await self.upstream.probe(backend)

    async def _run(self, action: str, backend: BackendState) -> None:
        argv = self.spec.command(action, backend.name, backend.url, self.pool)
        if argv[0] not in self.allowed:
            raise ParkingHookFailed(
                f"the {action} command {argv[0]!r} of pool {self.pool!r} is not allowed: list it "
                "in GATEWAY_PARKING_COMMANDS"
            )
        # Its error output goes to a file, not a pipe: a server the command leaves running
        # would hold a pipe open, and reading it to its end would wait for that server.
        with tempfile.TemporaryFile() as errors:
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=errors,
                    env=self.environ,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ParkingHookFailed(
                    f"the {action} command for backend {backend.name} did not start: {exc}"
                ) from exc
            try:
                async with asyncio.timeout(self.spec.hook_timeout_s):
                    code = await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
                raise ParkingHookFailed(
                    f"the {action} command for backend {backend.name} ran past "
                    f"{self.spec.hook_timeout_s:g} s and was killed"
                ) from None
            if code != 0:
                errors.seek(0)
                said = errors.read()[-300:].decode(errors="replace").strip()
                raise ParkingHookFailed(
                    f"the {action} command for backend {backend.name} exited {code}: {said}"
                )


def command_environment(environ: Mapping[str, str], settings: Collection[str]) -> dict[str, str]:
    """Return the environment a parking command runs in: the gateway's, less its settings and
    upstream keys."""
    return {
        k: v
        for k, v in environ.items()
        if k not in settings and not k.startswith("GATEWAY_") and k not in ("DATABASE_URL",)
    }


class Parker:
    """Run the parking plan beside serving: drain, park and wake backends through their hooks.

    It is the admission's traffic (gateway/parking/plan.py's `Traffic`): told of every request
    routed and every slot given back.
    """

    def __init__(
        self,
        fleet: Callable[[], Fleet],
        policy: Callable[[], Policy],
        upstream: Upstream,
        admission: Admission,
        metrics: GatewayMetrics,
        *,
        shared: SharedState | None = None,
        db: sa.Engine | None = None,
        power_w: Callable[[BackendState], float | None] = lambda b: None,
        commands: Collection[str] = (),
        environ: Mapping[str, str] = os.environ,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        round_s: float = ROUND_S,
    ):
        self._fleet = fleet
        self._policy = policy
        self.upstream = upstream
        self.admission = admission
        self.metrics = metrics
        self.shared = shared
        self.db = db
        self._power_w = power_w
        self.commands = frozenset(commands)
        self.environ = dict(environ)
        self.clock = clock
        self.wall = wall
        self.planner = Parking()
        self.drain_grace_s = DRAIN_GRACE_S
        self.leading = shared is None
        self._hooks: dict[str, Hook] = {}
        self._specs: dict[str, PoolParking] = {}
        self._busy: dict[str, asyncio.Task[None]] = {}  # url -> the hook call under way
        self._draining_since: dict[str, float] = {}  # url -> clock
        self._parked: dict[str, tuple[float, list[float]]] = {}  # url -> clock, power read
        self._told: dict[str, list[float]] = {}  # pool -> arrivals, finished, slot s, prefill s
        self._adopted = False
        self._tasks = Tasks()
        self.periodic = Periodic("parking", round_s, self.round)
        admission.traffic = self
        if shared is not None:
            self._claim = shared.redis.register_script(CLAIM)
            self._resign = shared.redis.register_script(RESIGN)
            shared.on("parking", self._heard)
            shared.on("parking-traffic", self._heard_traffic)

    # What admission tells it.

    def arrived(self, pool: str, now: float, prompt_tokens: int = 0, model: str = "") -> None:
        prefill_s = self.planner.prefill_s(pool, prompt_tokens, model or None)
        self.planner.arrived(pool, now, prefill_s)
        tally = self._tally(pool)
        tally[0] += 1
        tally[3] += prefill_s

    def finished(self, pool: str, slot_s: float) -> None:
        self.planner.finished(pool, slot_s)
        tally = self._tally(pool)
        tally[1] += 1
        tally[2] += slot_s

    def _tally(self, pool: str) -> list[float]:
        tally = self._told.get(pool)
        if tally is None:
            tally = self._told[pool] = [0.0, 0.0, 0.0, 0.0]
        return tally

    # The round.

    def start(self) -> None:
        self.periodic.start()

    async def stop(self) -> None:
        await self.periodic.stop()
        await self._tasks.finish(timeout_s=2)  # the events being recorded
        for task in list(self._busy.values()):
            task.cancel()
        await asyncio.gather(*self._busy.values(), return_exceptions=True)
        shared = self.shared
        if shared is not None and self.leading and shared.up:
            with contextlib.suppress(SharedStateUnavailable):  # else it lapses
                await shared.run(self._resign, [shared.key("parking", "planner")], [shared.replica])

    async def round(self) -> None:
        """Plan once: follow or lead, then take the plan's moves."""
        policy, fleet = self._policy(), self._fleet()
        pools = self._configure(policy)
        if self.shared is not None:
            await self._share(fleet)
        # Redis out: nobody parks, anyone may wake (waking twice does no harm).
        cut_off = self.shared is not None and not self.shared.up
        if not self.leading and not cut_off:
            return
        if not self._adopted:
            self._adopted = True
            await self._find_asleep(fleet)
        now = self.clock()
        moves = self.planner.plan(fleet, now, pools) if pools else []
        for pool in fleet.pools.values():
            if pool.name not in pools:  # parking turned off: everything back in service
                off = (b for b in pool.backends if b.parking in (DRAINING, PARKED))
                moves += [Move(b, "wake", "parking is off for the pool") for b in off]
        if cut_off:
            moves = [m for m in moves if m.action == "wake"]
        for move in moves:
            self._take(move, fleet)
        self._watch_parked(fleet)
        self._finish_wakes(fleet)
        if not cut_off:
            self._finish_drains(fleet, now)

    def _configure(self, policy: Policy) -> list[str]:
        pools = self.planner.configure(policy)
        for name in pools:
            spec = policy.pools[name].parking
            assert spec is not None
            if self._specs.get(name) != spec:
                self._specs[name] = spec
                self._hooks[name] = self._hook(name, spec)
        return pools

    def _hook(self, pool: str, spec: PoolParking) -> Hook:
        if spec.hook == "vllm":
            return SleepMode(self.upstream, spec.hook_timeout_s)
        return OperatorCommand(spec, pool, self.upstream, self.commands, self.environ)

    async def _find_asleep(self, fleet: Fleet) -> None:
        """Count as parked the backends vLLM says sleep (a gateway restarted while they did)."""
        for pool in fleet.pools.values():
            hook = self._hooks.get(pool.name)
            if not isinstance(hook, SleepMode):
                continue
            for backend in pool.backends:
                if backend.parking == IN_SERVICE and await hook.sleeping(backend):
                    self._set(backend, PARKED, "found asleep when this replica began to plan")
                    self._parked[backend.url] = (self.clock(), [])

    def _take(self, move: Move, fleet: Fleet) -> None:
        backend = move.backend
        if backend.url in self._busy or backend.pool not in self._hooks:
            return  # a hook call under way decides first
        if move.action == "park":
            if backend.parking != IN_SERVICE or last_gpu(backend, fleet):
                return
            self._set(backend, DRAINING, move.reason)
            self._draining_since[backend.url] = self.clock()
            self._record(backend, "drain", move.reason)
        elif backend.parking == DRAINING:
            self._set(backend, IN_SERVICE, move.reason)
            self._draining_since.pop(backend.url, None)
            self._dispatch(backend, fleet)
        elif backend.parking in (PARKED, WAKING):
            self._wake(backend, move.reason, fleet)

    def _finish_wakes(self, fleet: Fleet) -> None:
        for backend in fleet.backends():
            if backend.parking == WAKING and backend.url not in self._busy:
                # Left waking by a planner that stopped: wake it from here.
                self._wake(backend, backend.parking_reason, fleet)

    def _finish_drains(self, fleet: Fleet, now: float) -> None:
        for backend in fleet.backends():
            if backend.parking != DRAINING or backend.url in self._busy:
                continue
            since = self._draining_since.setdefault(backend.url, now)
            if backend.gateway_load == 0 and now - since >= self.drain_grace_s:
                self._start(backend, self._park(backend, now - since, fleet))

    def _start(self, backend: BackendState, work: Any) -> None:
        task = asyncio.create_task(work, name=f"parking {backend.name}")
        self._busy[backend.url] = task
        task.add_done_callback(lambda _: self._busy.pop(backend.url, None))

    async def _park(self, backend: BackendState, drained_s: float, fleet: Fleet) -> None:
        hook = self._hooks[backend.pool]
        try:
            await hook.park(backend)
        except ParkingHookFailed as exc:
            self._failed(backend, "park", exc)
            self._set(backend, IN_SERVICE, f"parking failed, so it serves: {exc}")
            self._draining_since.pop(backend.url, None)
            self._dispatch(backend, fleet)
            return
        self._draining_since.pop(backend.url, None)
        self._set(backend, PARKED, backend.parking_reason)
        self._parked[backend.url] = (self.clock(), [])
        # Asleep or stopped, an engine keeps no KV cache: nor does the index of it.
        fleet.prefixes.forget(backend.name)
        self.metrics.child(self.metrics.parks, backend.pool).inc()
        self._record(backend, "parked", backend.parking_reason, seconds=drained_s)
        spec = self._specs.get(backend.pool)
        how = "released" if spec is not None and spec.mode == "release" else "parked"
        log.info(
            "backend %s of pool %s %s: %s", backend.name, backend.pool, how, self._why(backend)
        )

    def _wake(self, backend: BackendState, reason: str, fleet: Fleet) -> None:
        parked = self._parked.pop(backend.url, None)
        if backend.parking == PARKED:
            seconds = saved = None
            if parked is not None:
                seconds = self.clock() - parked[0]
                saved = self._saved_j(backend, seconds, parked[1])
            self.metrics.child(self.metrics.wakeups, backend.pool).inc()
            self._record(backend, "wake", reason, seconds=seconds, saved_j=saved)
        self._set(backend, WAKING, reason)
        self._start(backend, self._waking(backend, fleet))

    async def _waking(self, backend: BackendState, fleet: Fleet) -> None:
        started, delay = self.clock(), RETRY_S
        while True:
            hook = self._hooks.get(backend.pool)
            spec = self._specs.get(backend.pool)
            if hook is None or spec is None:  # the pool left the policy
                return
            try:
                await hook.wake(backend)
                if await self._until_ready(hook, backend, spec.hook_timeout_s):
                    break
                raise ParkingHookFailed(
                    f"backend {backend.name} did not serve within {spec.hook_timeout_s:g} s of "
                    "its wake-up call"
                )
            except ParkingHookFailed as exc:
                self._failed(backend, "wake", exc)
                await asyncio.sleep(delay)
                delay = min(2 * delay, MAX_RETRY_S)
        took = self.clock() - started
        self._set(backend, IN_SERVICE, backend.parking_reason)
        self._record(backend, "ready", backend.parking_reason, seconds=took)
        log.info(
            "backend %s of pool %s serves again, %.2f s after its wake-up",
            backend.name,
            backend.pool,
            took,
        )
        self._dispatch(backend, fleet)

    async def _until_ready(self, hook: Hook, backend: BackendState, timeout_s: float) -> bool:
        deadline = self.clock() + timeout_s
        while not await hook.ready(backend):
            if self.clock() > deadline:
                return False
            await asyncio.sleep(READY_POLL_S)
        return True

    def _watch_parked(self, fleet: Fleet) -> None:
        """Keep what the meter reads of each parked backend, for the energy parking saved."""
        for backend in fleet.backends():
            parked = self._parked.get(backend.url)
            spec = self._specs.get(backend.pool)
            if spec is not None and spec.mode == "release":
                continue  # given back, it draws nothing: a reading is its meter's last, stale
            if parked is not None and backend.parking == PARKED:
                watts = self._power_w(backend)
                if watts is not None:
                    parked[1].append(watts)

    def _saved_j(self, backend: BackendState, seconds: float, readings: list[float]) -> float:
        """Return the energy a backend parked `seconds` did not draw: its pool's idle draw less
        what its meter read while parked (nothing, if it read nothing or was released: a process
        stopped, a node powered down or given back)."""
        pool = self._policy().pools.get(backend.pool)
        if pool is None:
            return 0.0
        parked_w = sum(readings) / len(readings) if readings else 0.0
        return max(0.0, pool.power.idle_w - parked_w) * seconds

    def _failed(self, backend: BackendState, action: str, exc: ParkingHookFailed) -> None:
        self.metrics.child(self.metrics.parking_hook_failures, backend.pool, action).inc()
        log.warning("parking: %s", exc)
        self._record(backend, "failed", f"{action}: {exc}")

    def _dispatch(self, backend: BackendState, fleet: Fleet) -> None:
        pool = fleet.pools.get(backend.pool)
        if pool is not None and pool.waiters:
            self.admission.dispatch(pool)

    @staticmethod
    def _why(backend: BackendState) -> str:
        return backend.parking_reason or "no reason given"

    # State, shared.

    def _set(self, backend: BackendState, state: str, reason: str) -> None:
        backend.parking, backend.parking_reason = state, reason
        backend.parking_since = self.wall()
        shared = self.shared
        if shared is None or not shared.up:
            return
        entry = _entry(backend)
        notice = shared.notice("parking", url=backend.url, entry=entry.decode())
        key = shared.key("parking", "state")

        async def write(redis: Any) -> None:
            pipe = redis.pipeline(transaction=False)
            pipe.hset(key, backend.url, entry)
            pipe.publish(shared.channel, notice)
            await pipe.execute()

        shared.spawn(shared.call(write))

    async def _share(self, fleet: Fleet) -> None:
        """Claim or renew the planner lease; as a follower, apply the planner's states and send
        it what this replica routed."""
        shared = self.shared
        assert shared is not None
        if not shared.up:
            return  # `leading` stays what it was; the round parks nothing meanwhile
        try:
            ours = await shared.run(
                self._claim, [shared.key("parking", "planner")], [shared.replica, shared.lease_ms]
            )
        except SharedStateUnavailable:
            return
        if ours == 1 and not self.leading:
            log.info("this replica plans parking now")
        was_leading, self.leading = self.leading, ours == 1
        if not was_leading:
            # A follower, or a replica taking over (one restarted among them): the states the
            # planner wrote are the fleet's.
            try:
                states = await shared.call(lambda r: r.hgetall(shared.key("parking", "state")))
            except SharedStateUnavailable:
                return
            known = {_text(k): _text(v).encode() for k, v in states.items()}
            for backend in fleet.backends():
                self._follow(backend, known.get(backend.url), fleet)
        if self.leading:
            self._told.clear()  # its own traffic is already in its plan
            # Every state again, each round: a Redis restarted empty is whole a second later.
            items = [x for b in fleet.backends() for x in (b.url, _entry(b))]
            key = shared.key("parking", "state")
            with contextlib.suppress(SharedStateUnavailable):
                await shared.call(lambda r: r.hset(key, items=items))
            return
        told = {pool: t for pool, t in self._told.items() if t[0] or t[1]}
        self._told.clear()
        if told:
            shared.publish("parking-traffic", pools=told)

    def _heard(self, notice: dict[str, Any]) -> None:
        if self.leading:
            return
        fleet = self._fleet()
        entry = str(notice.get("entry", "")).encode()
        for backend in fleet.backends():
            if backend.url == notice.get("url"):
                self._follow(backend, entry, fleet)

    def _follow(self, backend: BackendState, entry: bytes | None, fleet: Fleet) -> None:
        if not entry:
            return  # the planner writes every backend: none is Redis having lost its data
        try:
            said = orjson.loads(entry)
        except orjson.JSONDecodeError:
            return
        state = said.get("state", IN_SERVICE) if isinstance(said, dict) else IN_SERVICE
        if state not in (IN_SERVICE, DRAINING, PARKED, WAKING) or state == backend.parking:
            return
        backend.parking = state
        backend.parking_reason = str(said.get("reason", ""))[:500]
        backend.parking_since = float(said.get("since", 0.0) or 0.0)
        if state == IN_SERVICE:
            self._dispatch(backend, fleet)

    def _heard_traffic(self, notice: dict[str, Any]) -> None:
        if not self.leading:
            return
        pools = notice.get("pools")
        if not isinstance(pools, dict):
            return
        now = self.clock()
        for pool, told in pools.items():
            try:
                arrivals, finished, slot_s, prefill_s = (float(x) for x in told)
            except (TypeError, ValueError):
                continue
            # Each arrival with the notice's mean prefill: the plan sums them over its windows.
            each = prefill_s / arrivals if arrivals >= 1 else 0.0
            for _ in range(min(int(arrivals), MAX_TOLD)):
                self.planner.arrived(str(pool), now, each)
            if finished >= 1:
                for _ in range(min(int(finished), MAX_TOLD)):
                    self.planner.finished(str(pool), slot_s / finished)

    # Records.

    def _record(
        self,
        backend: BackendState,
        event: str,
        reason: str,
        *,
        seconds: float | None = None,
        saved_j: float | None = None,
    ) -> None:
        if self.db is None:
            return
        row = ParkingEvent(
            self.wall(), backend.pool, backend.name, event, reason, seconds, saved_j
        ).row()
        self._tasks.spawn(asyncio.to_thread(self._insert, row))

    def _insert(self, row: dict[str, Any]) -> None:
        assert self.db is not None
        try:
            with self.db.begin() as conn:
                conn.execute(parking_events.insert(), [row])
        except sa.exc.SQLAlchemyError as exc:
            log.warning("a parking event was not recorded: %s", type(exc).__name__)


def last_gpu(backend: BackendState, fleet: Fleet) -> bool:
    """Return whether the backend is the fleet's last GPU backend in service (the fallback)."""
    if _kind(fleet.pools.get(backend.pool)) != "gpu":
        return False
    return not any(
        other is not backend and not other.ejected and not other.parking
        for pool in fleet.pools.values()
        if pool.spec.live and _kind(pool) == "gpu"
        for other in pool.backends
    )


def _kind(pool: PoolState | None) -> str | None:
    return pool.spec.kind if pool is not None else None


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _entry(backend: BackendState) -> bytes:
    """Return a backend's parking state as the planner writes it to Redis."""
    fields = {
        "state": backend.parking,
        "reason": backend.parking_reason,
        "since": backend.parking_since,
    }
    return orjson.dumps(fields)
