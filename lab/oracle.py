"""The oracle: a router that knows the truth, on the same timeline, slots and queues as the others.

It reads what no router may: every device's own figures for one more request as it is now
(`Device.marginal` of `gateway.whatif.hardware`: the requests it runs and their contexts, the
part of this request's prompt its prefix cache holds, the scenario's slowdown and power factor
on it), each request's true output length and prefix blocks, and the rates in force. For each
request it prices every backend with a free slot by the request's true marginal cost there, the
batch it creates included, under the accounting the replay charges every strategy
(`gateway.whatif.scorecard`):

    own     = prefill(p) + o · step(n + 1)                the request's slot time
    others  = n · (o · (step(n + 1) − step(n)) + work(p))  the slot time it adds to the n others
    energy  = prefill(p) · (P(n + 1) − P(n)) + o · (step(n + 1) · (P(n + 1) − P(0))
                                                  − step(n) · (P(n) − P(0)))
    cost    = energy · rate  +  (own + others) · usd_per_hour / 3600 / slots

with prefill(p) the wait for its first token: the prompts the device still has to compute ahead
of it, then its p prompt tokens less what the device's prefix cache holds of them (a cached
token costs nothing, or its transfer from host memory), in chunks that share each step with the
sequences decoding (chunked prefill); work(p) the compute those chunks add to the steps every
decoding sequence waits through; step(n) the device's
decode step for n sequences reading their contexts (the request's own, half way through its
answer, added when it joins), P(n) the board power with n requests,
both under the scenario's factors, and o its output tokens. Backends whose true prefill or step
would miss the request's SLO come after the others; a pool's price is its cheapest backend's,
and it names its backends to `decide()` cheapest first (`Ranking.backends`), so the request goes
where it was priced. It routes through `decide()`, so it cannot put more on a backend than its
slots: it waits and falls back as the others do. It is a reference to measure routing against,
not a bound no router can pass: it knows each request only as it arrives, not what comes after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.fleet.state import BackendState, PoolState
from gateway.policy.definition import Policy, Route
from gateway.policy.tariffs import Rates
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import Ranking
from gateway.whatif.trace import TraceRequest
from gateway.whatif.world import SimulatedBackend


@dataclass(frozen=True, slots=True)
class Placement:
    """What one request would cost on one backend, and whether the truth meets its SLO."""

    cost_usd: float
    energy_j: float
    meets_slo: bool


def marginal(
    sim: SimulatedBackend,
    model: str,
    prompt: int,
    output: int,
    usd_per_j: float,
    usd_per_slot_s: float,
    ttft_ms: float | None,
    tpot_ms: float | None,
    request: TraceRequest | None = None,
) -> Placement:
    """Return the true marginal cost of a request on a backend as it is now (module docstring),
    its prompt's prefix blocks those of the trace `request`, if given."""
    blocks, block_tokens = (request.blocks, request.block_tokens) if request else ((), 0)
    # Mid-decode figures: the request's context half way through its answer, the others'.
    figures = sim.device.marginal(model, prompt, prompt + output // 2, blocks, block_tokens)
    prefill, decoding = figures.prefill_s, figures.decoding
    before, after = figures.step_s, figures.joined_step_s
    power, joined = figures.above_idle_w, figures.joined_above_idle_w
    decode = max(output - 1, 0)
    energy = prefill * (joined - power) + decode * (
        after * joined - (before * power if decoding else 0.0)
    )
    slot_s = (
        prefill + decode * after + decoding * (decode * (after - before) + figures.prefill_work_s)
    )
    meets = (ttft_ms is None or prefill * 1e3 <= ttft_ms) and (
        tpot_ms is None or not decode or after * 1e3 <= tpot_ms
    )
    return Placement(energy * usd_per_j + slot_s * usd_per_slot_s, energy, meets)


class OracleRanker:
    """Rank pools by the true marginal cost of the request on their cheapest free backend."""

    def __init__(self, policy: Policy, rates: Rates):
        self.policy = policy
        self.rates = rates
        self.world: dict[str, SimulatedBackend] = {}  # the replay's, given once it is built
        self.request: TraceRequest | None = None  # the one being routed, given as it arrives

    def placements(
        self, profile: RequestProfile, pool: PoolState
    ) -> list[tuple[Placement, BackendState]]:
        """Return the placements on the pool's backends with a free slot, the best first: those
        meeting the SLO before the others, each the cheapest first."""
        spec = self.policy.pools[pool.name]
        usd_per_j = self.rates(pool.name).usd_per_j
        usd_per_slot_s = spec.price.usd_per_hour / 3600 / spec.slots_per_backend
        output = profile.max_tokens or 1  # the replay's max_tokens is the true output length
        found: list[tuple[Placement, BackendState]] = []
        for backend in pool.backends:
            sim = self.world.get(backend.name)
            if sim is None or backend.ejected or backend.parking or backend.free_slots <= 0:
                continue
            placed = marginal(
                sim,
                profile.model,
                profile.prompt_tokens,
                output,
                usd_per_j,
                usd_per_slot_s,
                profile.ttft_ms,
                profile.tpot_ms,
                self.request,
            )
            found.append((placed, backend))
        found.sort(key=lambda pair: (not pair[0].meets_slo, pair[0].cost_usd))
        return found

    def __call__(
        self,
        profile: RequestProfile,
        route: Route,
        pools: Sequence[PoolState],
        trace: list[tuple[str, str]],
    ) -> Ranking:
        order = {name: i for i, name in enumerate(route.pools)}
        placements = {pool.name: self.placements(profile, pool) for pool in pools}

        def key(pool: PoolState) -> tuple[bool, bool, float, int]:
            found = placements[pool.name]
            if not found:  # full: queued in after every pool with room
                return (True, True, 0.0, order.get(pool.name, 0))
            best = found[0][0]
            return (False, not best.meets_slo, best.cost_usd, order.get(pool.name, 0))

        backends = {name: [b for _, b in found] for name, found in placements.items() if found}
        return Ranking(sorted(pools, key=key), backends=backends)
