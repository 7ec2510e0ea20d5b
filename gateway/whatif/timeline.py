"""The discrete-event replay: a trace's requests, routed by one strategy, on simulated devices.

Time is virtual. The replay jumps from event to event: an arrival (routed by the real `decide()`),
a queue deadline (the router's budget ran out: fall back, or reject), an energy-meter reading,
and the devices' own events (prefills, decode steps, completions), which the hardware model
processes (`gateway.whatif.hardware`), each request's prefix blocks looked up in its device's
prefix cache as it is admitted. Events at the same instant run in this order: devices
first, so a slot freed at t is free for a request arriving at t, then the meter, deadlines and
arrivals.

Admission follows the live gateway (`gateway/upstream/forward.py`, `gateway/fleet/admission.py`): a
decision with a backend takes one of its slots at once; a decision to queue waits in the pool's
queue, oldest first, for a slot, within the budget; when the budget runs out `pick_backend` may
still find a free slot on the route (the fallback), and otherwise the request is refused.

The prefix cache is reached as the live gateway reaches it (`gateway/upstream/forward.py`): a
request's profile carries its prompt's whole prefix blocks in the trace's block size, the fleet's
index is told what each backend was sent, and corrected by the tokens the device found cached,
once its answer is in. The cache-blind baselines' profiles carry no blocks, and a session is
named only to the strategy that keys on it (`Strategy.sessions`); the replay's clients
name none to the gateway's session table.

A strategy that parks (the benchmark's `learned-parked`) plans every `PLAN_INTERVAL_S` with its
`gateway.parking.plan.Parking`: a backend to park stops taking requests and is switched off
once its last one is done (asleep, or released where its pool's parking says `mode: release`);
one to wake takes requests again at once if it was draining, else once its device's wake-up
time has passed. Its meter is not read while it is off.

The learned strategy meters energy as the live gateway does: each device's energy counter is read
every `meter_interval_s` and fed, with the request spans, to a
`gateway.energy.ledger.BackendLedger`; a request's observation (its TTFT, TPOT and end-to-end time
from the device's timestamps, and its attributed energy) reaches the learner when its energy is
settled.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from gateway.costmodel.train import Observation
from gateway.errors import GatewayError
from gateway.fleet.prefixes import BLOCK_TOKENS
from gateway.fleet.state import DRAINING, IN_SERVICE, PARKED, WAKING, Fleet, PoolState
from gateway.parking.plan import Move
from gateway.policy.definition import Policy, Route
from gateway.records.requests import ms
from gateway.records.slo import meets_slo, tpot_s
from gateway.routing.classify import RequestProfile
from gateway.routing.router import decide, pick_backend
from gateway.whatif.conditions import STEADY, Conditions, ReplayRates
from gateway.whatif.hardware import Hardware, Job, load_hardware
from gateway.whatif.strategy import Strategy
from gateway.whatif.trace import TraceRequest, conversation
from gateway.whatif.world import SimulatedBackend, build_world

MODEL = "llama-3.1-8b-instruct"
# Traffic starts this long after the meter's first reading, as the live meter takes a baseline
# of the idle fleet before serving.
START_S = 1.0
PLAN_INTERVAL_S = 1.0  # how often a parking strategy plans, as the live gateway's loop would


def request_profile(
    policy: Policy,
    request: TraceRequest,
    model: str = MODEL,
    *,
    prefixes: bool = True,
    session: bool = False,
) -> RequestProfile:
    """Return what the router would know of a trace request.

    What the request does not say is a streamed chat to `model` in the policy's default class
    from an anonymous tenant (an Azure trace says none of it; request records say all of it; a
    class the policy no longer has is its default). `max_tokens` is the trace's generated
    length, as a client that knows it would send (and as benchmarks make the simulator generate
    exactly that many tokens with `ignore_eos`).

    With `prefixes`, the profile carries the prompt's whole prefix blocks, as the live classifier
    hashes only whole ones (an engine caches only those); with `session`, the conversation the
    request continues, as a client naming its session would.
    """
    name = request.slo_class if request.slo_class in policy.slo_classes else None
    name = name or policy.default_slo_class
    slo = policy.slo_classes[name]
    embedding = request.endpoint == "embeddings"
    return RequestProfile(
        endpoint=request.endpoint,
        model=request.model or model,
        prompt_tokens=request.prompt_tokens,
        max_tokens=None if embedding else request.output_tokens,
        slo_class=name,
        ttft_ms=slo.ttft_ms,
        tpot_ms=slo.tpot_ms,
        e2e_ms=slo.e2e_ms,
        tenant=request.tenant or "anonymous",
        stream=request.stream and not embedding,
        blocks=request.blocks[: request.prompt_tokens // request.block_tokens]
        if prefixes and request.block_tokens
        else (),
        block_tokens=float(request.block_tokens),
        session=conversation(request) if session else None,
    )


@dataclass(eq=False, slots=True)
class Passage:
    """One request's way through the replay: routed, perhaps queued, then served or refused."""

    key: str
    arrival_s: float
    request: TraceRequest
    profile: RequestProfile
    route: Route | None = None
    backend: SimulatedBackend | None = None
    job: Job | None = None
    queued_in: str | None = None
    admitted_s: float | None = None
    concurrent: int = 0
    context_tokens: int = 0  # KV-cache tokens its backend held at admission, its own in
    expected_blocks: int = 0  # of its prefix blocks, those the index said its backend held
    prefill_tokens: int = 0  # of its prompt, those its backend was expected to compute
    fell_back: bool = False
    refused: str | None = None

    @property
    def pool(self) -> str | None:
        return None if self.backend is None else self.backend.state.pool

    @property
    def served(self) -> bool:
        return self.job is not None and self.job.done

    @property
    def ttft_s(self) -> float | None:
        """Return the time from arrival to the first token, queueing included."""
        if self.job is None or self.job.first_token_at is None:
            return None
        return self.job.first_token_at - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Return the mean time per output token after the first, or None for one token."""
        job = self.job
        if job is None:
            return None
        return tpot_s(job.first_token_at, job.finished_at, self.request.output_tokens)

    @property
    def e2e_s(self) -> float | None:
        """Return the time from arrival to the last token, queueing included."""
        if self.job is None or self.job.finished_at is None:
            return None
        return self.job.finished_at - self.arrival_s

    def meets_slo(self) -> bool:
        """Say whether the request was served within its SLO targets, by the live rule."""
        return meets_slo(
            self.profile,
            200 if self.served else 0,
            ms(self.ttft_s),
            ms(self.tpot_s),
            ms(self.e2e_s),
            endpoint=self.profile.endpoint,
            stream=self.profile.stream,
            completion_tokens=self.request.output_tokens,
        )


@dataclass(frozen=True, slots=True)
class FleetReading:
    """Every backend's counters at one mark of a replay (trace seconds): its energy above idle
    so far, and that energy priced in dollars and carbon."""

    at_s: float
    energy_above_idle_j: dict[str, float]
    energy_usd: dict[str, float]
    carbon_g: dict[str, float]


class Replay:
    """Replay a trace through one strategy's router against a fresh fleet of `hardware`'s
    devices (the simulator's by default)."""

    def __init__(
        self,
        strategy: Strategy,
        requests: Sequence[TraceRequest],
        *,
        meter_interval_s: float = 1.0,
        meter_phase_s: float = 0.0,
        model: str = MODEL,
        conditions: Conditions = STEADY,
        rates: ReplayRates | None = None,
        draw: Callable[[], float] | None = None,
        hardware: Hardware | None = None,
        marks: Sequence[float] = (),
    ):
        self.strategy = strategy
        # What the live gateway draws per request (a canary's share, exploring), seeded here.
        self._draw = draw or random.Random(0).random
        self.policy = strategy.policy
        self.conditions = conditions
        # The rates the router reads, moved to each instant; the replay's own when it has none.
        self.rates = rates or ReplayRates(self.policy, conditions)
        # Where the conditions change a device or a price, on the virtual clock.
        self._boundaries = deque(START_S + t for t in conditions.boundaries())
        self._charged_at = 0.0
        self.model = model
        self.models = sorted({r.model or model for r in requests} or {model})
        # The index counts blocks of the trace's size (Mooncake's 512 tokens), the live
        # gateway's where the trace has none.
        block_tokens = next((r.block_tokens for r in requests if r.blocks), BLOCK_TOKENS)
        self.fleet = Fleet(self.policy, block_tokens=block_tokens)
        self.world = build_world(self.policy, self.fleet, self.models, hardware or load_hardware())
        self.passages = [
            Passage(
                str(i),
                START_S + r.arrival_s,
                r,
                request_profile(
                    self.policy,
                    r,
                    model,
                    prefixes=strategy.prefixes,
                    session=strategy.sessions,
                ),
            )
            for i, r in enumerate(requests)
        ]
        self.metered = strategy.learner is not None
        self._meter_interval_s = meter_interval_s
        self._next_reading = meter_phase_s % meter_interval_s if self.metered else math.inf
        self._waiting: dict[str, deque[Passage]] = {}
        for pool in self.fleet.pools.values():
            queue: deque[Passage] = deque()
            self._waiting[pool.name] = queue
            # The router and ranker only read the queue's length; sharing the deque keeps it true.
            pool.waiters = cast(Any, queue)
        self._deadlines: list[tuple[float, int, Passage]] = []
        self._order = itertools.count()
        self._finished: list[Passage] = []
        self._unsettled: dict[str, Passage] = {}
        self._prefilling: list[Passage] = []  # admitted, no first token yet
        self._in_service = 0
        self.parking = strategy.parking
        self._next_plan = START_S if self.parking is not None else math.inf
        self._ready: list[tuple[float, int, SimulatedBackend]] = []  # waking devices
        # (at, backend, what, why): the plan's "park" and "wake", and "off" once drained.
        self.moves: list[tuple[float, str, str, str]] = []
        self.late_wake_ups = 0  # wake-ups called with requests already waiting in the pool
        # Each parked device's instant and energy counter when it was switched off, and the
        # time and energy of the parked spans that ended; of them, each device's released time.
        self._off_since: dict[str, tuple[float, float]] = {}
        self._parked_s = self._parked_j = 0.0
        self._released_s: dict[str, float] = {}
        if strategy.oracle is not None:
            strategy.oracle.world = self.world  # the oracle reads the truth the others measure
        # Instants (trace seconds) at which the fleet's counters are read, in order: a sampled
        # window's energy is what its devices drew between its marks.
        self._marks = deque(sorted(START_S + t for t in marks))
        self.readings: list[FleetReading] = []
        self._condition(0.0)

    def run(self) -> Replay:
        """Replay every request to its end; return self for chaining."""
        arrivals = 0
        total = len(self.passages)
        while True:
            arrival = self.passages[arrivals].arrival_s if arrivals < total else math.inf
            deadline = self._deadlines[0][0] if self._deadlines else math.inf
            ready = self._ready[0][0] if self._ready else math.inf
            if not self._busy(arrivals < total):
                self._next_reading = math.inf
                if not any(self._waiting.values()):
                    self._next_plan = math.inf  # a request still waiting may need a wake-up
                    # Nor does a wake-up under way serve anyone now: waiting for its end (a
                    # released device's takes minutes) would run this fleet past the window.
                    ready = math.inf
            boundary = self._boundaries[0] if self._boundaries else math.inf
            mark = self._marks[0] if self._marks else math.inf
            if not self._in_service and not self._unsettled:
                self._skip_quiet_readings(min(arrival, deadline, self._next_plan, ready, boundary))
            pending = min(arrival, deadline, self._next_reading, self._next_plan, ready)
            if pending == math.inf and self._next_device_event() == math.inf:
                break  # all served: the conditions' later boundaries are finish()'s
            external = min(pending, boundary, mark)
            if pending == math.inf or any(self._waiting.values()):
                # Someone waits for a slot (or only the devices are left): step device events
                # one at a time, so a freed slot goes to the oldest waiter at its true instant,
                # and the last request's end is not carried past it to a boundary of the
                # conditions' that only finish() may reach: every strategy's fleet is measured
                # over the same window.
                step = self._next_device_event()
                if step < external:
                    self._advance(step)
                    continue
                if external == math.inf:
                    break
            self._advance(external)
            if external == mark:
                self._marks.popleft()
                self._read_fleet(external)
            elif external == boundary:
                self._boundaries.popleft()
                self._condition(external)
            elif external == self._next_reading:
                self._read_meters(external)
                self._next_reading += self._meter_interval_s
            elif external == ready:
                self._serve_again(external)
            elif external == self._next_plan:
                self._plan(external)
                self._next_plan += PLAN_INTERVAL_S
            elif external == deadline:
                self._expire(external)
            else:
                self._arrive(self.passages[arrivals])
                arrivals += 1
        return self

    def _skip_quiet_readings(self, until: float) -> None:
        """With nothing running or left to settle, the meter's readings before `until` find
        only idle draw: read next at the last of its instants before then, so a sparse trace
        (a sample spread over a week) is not stepped through second by second. The ledger
        learns idle draw per second, so the one long reading teaches what the many would."""
        interval = self._meter_interval_s
        if until != math.inf and until - self._next_reading > interval:
            self._next_reading += math.floor((until - self._next_reading) / interval) * interval

    def finish(self, until_s: float) -> None:
        """Let the idle fleet run on to `until_s`, so replays are compared over one window."""
        while (self._boundaries and self._boundaries[0] <= until_s) or (
            self._marks and self._marks[0] <= until_s
        ):
            if self._marks and (not self._boundaries or self._marks[0] < self._boundaries[0]):
                at = self._marks.popleft()
                for sim in self.world.values():
                    sim.device.advance(max(at, sim.device.time))
                self._read_fleet(at)
                continue
            at = self._boundaries.popleft()
            for sim in self.world.values():
                sim.device.advance(max(at, sim.device.time))
            self._condition(at)
        for sim in self.world.values():
            sim.device.advance(max(until_s, sim.device.time))
        self._charge()

    def _read_fleet(self, now: float) -> None:
        """Read every device's counters at a mark, its energy priced up to it."""
        self._charge()
        self.readings.append(
            FleetReading(
                now - START_S,
                {name: sim.energy_above_idle_j for name, sim in self.world.items()},
                {name: sim.energy_usd for name, sim in self.world.items()},
                {name: sim.carbon_g for name, sim in self.world.items()},
            )
        )

    def _condition(self, now: float) -> None:
        """Price the energy drawn so far, then apply the conditions in force from `now`."""
        self._charge()
        self._charged_at = now
        trace_s = max(now - START_S, 0.0)
        for sim in self.world.values():
            slow, power = self.conditions.factors(sim.state.pool, sim.state.name, trace_s)
            sim.device.set_condition(slow, power, now)

    def _charge(self) -> None:
        """Price every device's energy since the last boundary at the rate in force over it."""
        trace_s = max(self._charged_at - START_S, 0.0)
        for sim in self.world.values():
            sim.charge(self.conditions.rate(self.policy, sim.state.pool, trace_s))

    def _busy(self, arrivals_left: bool) -> bool:
        return arrivals_left or self._in_service > 0 or bool(self._unsettled)

    def _next_device_event(self) -> float:
        events = [sim.device.next_event_at() for sim in self.world.values()]
        return min((e for e in events if e is not None), default=math.inf)

    def _advance(self, now: float) -> None:
        self.rates.now = max(now - START_S, 0.0)
        for sim in self.world.values():
            sim.device.advance(now)
        if self._prefilling:
            self._prefilled()
        if self._finished:
            finished = sorted(self._finished, key=lambda p: cast(Job, p.job).finished_at or 0.0)
            self._finished.clear()
            for passage in finished:
                self._complete(passage)

    def _prefilled(self) -> None:
        """Record the blocks of every prompt whose prefill has ended: its backend holds them."""
        still = []
        for passage in self._prefilling:
            job, sim = passage.job, passage.backend
            assert job is not None and sim is not None
            if job.first_token_at is not None:
                sim.state.prefilling -= passage.prefill_tokens
                if passage.profile.blocks:
                    self.fleet.prefixes.sent(sim.state.name, passage.profile.blocks)
            elif not job.done:
                still.append(passage)
        self._prefilling = still

    def _arrive(self, passage: Passage) -> None:
        now = passage.arrival_s
        if self.strategy.oracle is not None:
            self.strategy.oracle.request = passage.request  # it knows the prompt's prefix blocks
        try:
            decision = decide(
                passage.profile, self.policy, self.fleet, self.strategy.rank, self._draw()
            )
        except GatewayError as exc:
            passage.refused = type(exc).__name__
            return
        passage.route = decision.route
        if decision.backend is not None:
            if self.parking is not None:
                self._arrived(decision.backend.pool, passage, now)
            self._admit(passage, self.world[decision.backend.name], now)
            return
        pool = decision.queue_pool
        assert pool is not None
        if self.parking is not None:
            self._arrived(pool.name, passage, now)
        passage.queued_in = pool.name
        self._waiting[pool.name].append(passage)
        deadline = now + decision.queue_budget_s
        heapq.heappush(self._deadlines, (deadline, next(self._order), passage))

    def _arrived(self, pool: str, passage: Passage, now: float) -> None:
        """Tell the parking plan of a request routed to `pool`, as admission tells it live."""
        assert self.parking is not None
        profile = passage.profile
        prefill_s = self.parking.prefill_s(pool, profile.prompt_tokens, profile.model)
        self.parking.arrived(pool, now, prefill_s)

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, passage = heapq.heappop(self._deadlines)
            if passage.admitted_s is not None:
                continue
            assert passage.queued_in is not None and passage.route is not None
            self._waiting[passage.queued_in].remove(passage)
            backend = pick_backend(passage.profile, passage.route, self.policy, self.fleet)
            if backend is None:
                passage.refused = "NoCapacity"
                continue
            passage.fell_back = True
            self._admit(passage, self.world[backend.name], now)

    def _admit(self, passage: Passage, sim: SimulatedBackend, now: float) -> None:
        request, model = passage.request, passage.profile.model
        per_token = self.policy.kv_bytes_per_token(model)
        # The KV cache a slot reserves, as the live admission books it: prompt and output.
        sim.state.in_flight += 1
        sim.state.kv_reserved += (request.prompt_tokens + request.output_tokens) * per_token
        self._in_service += 1
        passage.backend = sim
        passage.admitted_s = now
        passage.concurrent = sim.state.in_flight
        passage.context_tokens = sim.state.kv_tokens(per_token)
        blocks = passage.profile.blocks
        if blocks:
            # As the forwarder does: what the index expects as the request is sent; the blocks
            # are recorded once its first token says its prefill is done (`_advance`).
            passage.expected_blocks = self.fleet.prefixes.cached(sim.state.name, blocks)
        # The tokens it has to compute before its first token, as the forwarder counts them.
        cached = passage.profile.cached_tokens(passage.expected_blocks) if blocks else 0
        passage.prefill_tokens = max(0, passage.profile.prompt_tokens - cached)
        sim.state.prefilling += passage.prefill_tokens
        self._prefilling.append(passage)
        if self.metered:
            sim.ledger.open(passage.key, now)
        passage.job = sim.device.submit(
            model,
            request.prompt_tokens,
            request.output_tokens,
            now,
            on_done=lambda: self._finished.append(passage),
            blocks=request.blocks,
            block_tokens=request.block_tokens,
        )

    def _complete(self, passage: Passage) -> None:
        sim, job = passage.backend, passage.job
        assert sim is not None and job is not None
        assert job.finished_at is not None and job.admitted_at is not None
        request = passage.request
        per_token = self.policy.kv_bytes_per_token(passage.profile.model)
        sim.state.in_flight -= 1
        sim.state.kv_reserved -= (request.prompt_tokens + request.output_tokens) * per_token
        self._in_service -= 1
        sim.slot_s += job.finished_at - job.admitted_at
        profile = passage.profile
        if profile.blocks:
            # The answer's usage says what the engine found cached: the index is corrected.
            found = profile.blocks_found(job.cached_tokens)
            self.fleet.prefixes.reported(sim.state.name, passage.expected_blocks, found)
        if self.metered:
            sim.ledger.close(
                passage.key,
                job.finished_at,
                passage.request.prompt_tokens,
                passage.request.output_tokens,
                job.first_token_at,
            )
            self._unsettled[passage.key] = passage
        if self.strategy.outputs is not None and passage.route is not None:
            self.strategy.outputs.observe(passage.route.name, passage.request.output_tokens)
        if self.parking is not None:
            self.parking.finished(sim.state.pool, job.finished_at - job.admitted_at)
            if sim.state.parking == DRAINING and sim.state.in_flight == 0:
                # The devices have been advanced to now, maybe past the request's end.
                self._switch_off(sim, max(job.finished_at, sim.device.time))
        self._dispatch(self.fleet.pools[sim.state.pool], job.finished_at)

    def _dispatch(self, pool: PoolState, now: float) -> None:
        """Give free slots of the pool to its oldest waiters, as the live admission does."""
        queue = self._waiting[pool.name]
        while queue:
            backend = pool.most_free()
            if backend is None:
                return
            self._admit(queue.popleft(), self.world[backend.name], now)

    def _plan(self, now: float) -> None:
        """Take the parking plan's moves at `now`."""
        assert self.parking is not None
        for move in self.parking.plan(self.fleet, now):
            if move.backend.name in self.world:  # a pool serving none of the trace's models
                self._move(move, now)

    def _move(self, move: Move, now: float) -> None:
        sim = self.world[move.backend.name]
        state = sim.state
        self.moves.append((now, state.name, move.action, move.reason))
        if move.action == "park":
            state.parking = DRAINING
            if state.in_flight == 0:
                self._switch_off(sim, now)
        elif state.parking == DRAINING:
            state.parking = IN_SERVICE
            self._dispatch(self.fleet.pools[state.pool], now)
        elif state.parking == PARKED:
            if self._waiting[state.pool]:
                self.late_wake_ups += 1
            state.parking = WAKING
            ready = sim.device.wake(now)
            since, counter = self._off_since.pop(state.name)
            self._parked_s += now - since
            self._parked_j += sim.device.energy_j - counter
            if self.parking is not None and state.pool in self.parking.releases:
                self._released_s[state.name] = self._released_s.get(state.name, 0.0) + now - since
            heapq.heappush(self._ready, (ready, next(self._order), sim))

    def _switch_off(self, sim: SimulatedBackend, now: float) -> None:
        self.moves.append((now, sim.state.name, "off", "drained"))
        if self.metered:
            # A last reading settles what its requests drew; the meter rests while it is off.
            self._read_meter(sim, now)
            sim.ledger.restart()
        assert self.parking is not None
        sim.device.park(now, release=sim.state.pool in self.parking.releases)
        self._off_since[sim.state.name] = (now, sim.device.energy_j)
        sim.state.parking = PARKED
        self.fleet.prefixes.forget(sim.state.name)

    @property
    def parked_s(self) -> float:
        """Return the backend-seconds devices spent switched off, up to where each was advanced."""
        still = sum(self.world[n].device.time - at for n, (at, _) in self._off_since.items())
        return self._parked_s + still

    @property
    def parked_energy_j(self) -> float:
        """Return what the devices drew while switched off, up to where each was advanced."""
        still = sum(self.world[n].device.energy_j - c for n, (_, c) in self._off_since.items())
        return self._parked_j + still

    def released_s(self, backend: str) -> float:
        """Return the seconds a backend's device spent released (its hours not paid), up to
        where it was advanced."""
        released = self._released_s.get(backend, 0.0)
        off = self._off_since.get(backend)
        if off is not None and self.parking is not None:
            sim = self.world[backend]
            if sim.state.pool in self.parking.releases:
                released += sim.device.time - off[0]
        return released

    def _serve_again(self, now: float) -> None:
        """Put every device whose wake-up is over back in service."""
        while self._ready and self._ready[0][0] <= now:
            _, _, sim = heapq.heappop(self._ready)
            sim.state.parking = IN_SERVICE
            if self.metered:
                self._read_meter(sim, now)  # the meter's first reading since it rested
            self._dispatch(self.fleet.pools[sim.state.pool], now)

    def _read_meters(self, now: float) -> None:
        for sim in self.world.values():
            if sim.state.parking in (PARKED, WAKING):
                continue  # switched off: its draw is no request's, nor its idle draw
            self._read_meter(sim, now)

    def _read_meter(self, sim: SimulatedBackend, now: float) -> None:
        """Read one device's energy counter; give the learner the requests it settles."""
        learner = self.strategy.learner
        sim.ledger.reading(now, sim.device.energy_j)
        for span in sim.ledger.settle():
            passage = self._unsettled.pop(span.key, None)
            if passage is not None and learner is not None:
                learner.observe(observation(passage, span.energy_j), now)


def observation(passage: Passage, energy_j: float) -> Observation:
    """Turn a settled request into what the live gateway would have recorded of it."""
    job, sim = passage.job, passage.backend
    assert job is not None and sim is not None and passage.admitted_s is not None
    assert job.first_token_at is not None and job.finished_at is not None
    return Observation(
        pool=sim.state.pool,
        model=passage.profile.model,
        # Prefill computed what the device did not find cached, as the live records say
        # (gateway/costmodel/train.py) and the ranking asks.
        prompt_tokens=max(passage.request.prompt_tokens - job.cached_tokens, 0),
        completion_tokens=passage.request.output_tokens,
        concurrent=passage.concurrent,
        ttft_s=job.first_token_at - passage.admitted_s,
        tpot_s=passage.tpot_s,
        e2e_s=job.finished_at - passage.admitted_s,
        energy_j=energy_j,
        context_tokens=passage.context_tokens,
    )
