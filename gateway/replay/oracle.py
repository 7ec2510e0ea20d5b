"""The oracle: a lower bound, each request on its cheapest SLO-feasible pool, knowing the truth.

It reads what no router may read: the simulator's true figures (the bundled profiles) and each
request's true output length. Capacity is relaxed: a request never waits for a slot, and runs
at whatever batch size is cheapest for it. Nothing is simulated. For a request of p prompt and o
output tokens on a pool whose device runs n requests at once, with the profile's timing and
power curve P(n) (docs/simulator.md):

    prefill = prefill_fixed + (prefill_per_token + host_transfer_per_token) · p
    step(n) = decode_fixed + decode_per_seq · (n − 1)
    rate(n) = (P(n) − P(0)) / n · usd_per_kwh / 3.6e6  +  usd_per_hour / 3600 / slots

`rate` is what one of n requests pays per second of its slot: its share of the device's power
above idle and the slot's share of the device's price. The replay charges the routed strategies
the same way (`gateway.replay.summary`), and no schedule can charge a request less than

    cost   = prefill · min rate(n)  +  (o − 1) · min step(n) · rate(n)
    energy = prefill · min (P(n) − P(0)) / n  +  (o − 1) · min step(n) · (P(n) − P(0)) / n

with each minimum over n = 1 … slots, since every second of prefill and every decode step of
the request happens at some batch size n. The oracle puts each request on the pool with the
least such cost among those that may serve it (live, serve the model, prompt plus output
within the context, on the request's route) and whose true TTFT (the prefill) and fastest TPOT
(step(1)) meet its SLO; its energy is the energy bound on that pool.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import GatewayError
from gateway.policy.model import Policy, Pool
from gateway.replay.engine import MODEL, request_profile
from gateway.replay.summary import latency_percentile
from gateway.replay.trace import TraceRequest
from gateway.replay.world import model_spec, profile_for
from gateway.routing.classify import RequestProfile
from gateway.routing.router import match_route
from simulator.power import PowerCurve


@dataclass(frozen=True, slots=True)
class TruePhysics:
    """A pool's true timing and power, its prices, and the least a request can pay there."""

    pool: Pool
    backends: int
    slots: int
    prefill_fixed_s: float
    prefill_per_token_s: float
    step_fixed_s: float
    step_per_seq_s: float
    power: PowerCurve

    def prefill_s(self, prompt: int) -> float:
        return self.prefill_fixed_s + self.prefill_per_token_s * prompt

    def step_s(self, n: int) -> float:
        return self.step_fixed_s + self.step_per_seq_s * (n - 1)

    def watts_share(self, n: int) -> float:
        """Return one of n requests' share of the draw above idle."""
        return (self.power.watts(n) - self.power.idle_w) / n

    def rate(self, n: int) -> float:
        """Return the dollars per second one of n requests pays for its slot."""
        price = self.pool.price
        return (
            self.watts_share(n) * price.usd_per_kwh / 3.6e6 + price.usd_per_hour / 3600 / self.slots
        )

    def floors(self) -> tuple[float, float, float, float]:
        """Return the least (prefill rate, step cost, prefill watts, step energy) over batches."""
        batches = range(1, self.slots + 1)
        return (
            min(self.rate(n) for n in batches),
            min(self.step_s(n) * self.rate(n) for n in batches),
            min(self.watts_share(n) for n in batches),
            min(self.step_s(n) * self.watts_share(n) for n in batches),
        )


def true_physics(policy: Policy, name: str, model: str = MODEL) -> TruePhysics:
    """Read a pool's true figures from the simulator profile of its kind."""
    pool = policy.pools[name]
    profile = profile_for(pool.kind)
    scale = model_spec(profile, model).cost_scale
    t = profile.timing
    return TruePhysics(
        pool=pool,
        backends=len(pool.backends),
        slots=profile.slots,
        prefill_fixed_s=scale * t.prefill_fixed_ms / 1e3,
        prefill_per_token_s=scale * (t.prefill_per_token_us + t.host_transfer_per_token_us) / 1e6,
        step_fixed_s=scale * t.decode_fixed_ms / 1e3,
        step_per_seq_s=scale * t.decode_per_seq_ms / 1e3,
        power=PowerCurve(profile.power),
    )


def eligible_pools(policy: Policy, profile: RequestProfile, output: int) -> list[str]:
    """Return the pools that may serve the request, in its route's order."""
    try:
        route = match_route(profile, policy)
    except GatewayError:
        return []
    names = [*route.pools, *([route.fallback] if route.fallback else [])]
    return [
        name
        for name in dict.fromkeys(names)
        if policy.pools[name].live
        and profile.model in policy.pools[name].models
        and profile.prompt_tokens + output <= policy.pools[name].max_context
    ]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the oracle puts one request, and the least it costs and draws there."""

    pool: str
    cost_usd: float
    energy_j: float
    ttft_s: float


def place(
    profile: RequestProfile,
    request: TraceRequest,
    physics: dict[str, TruePhysics],
    floors: dict[str, tuple[float, float, float, float]],
    pools: Sequence[str],
) -> Placement | None:
    """Return the cheapest SLO-feasible placement of a request, or None if no pool meets it."""
    best: Placement | None = None
    decode = max(request.output_tokens - 1, 0)
    for name in pools:
        phys = physics.get(name)
        if phys is None:
            continue
        prefill = phys.prefill_s(request.prompt_tokens)
        if profile.ttft_ms is not None and prefill * 1e3 > profile.ttft_ms:
            continue
        if profile.tpot_ms is not None and decode and phys.step_s(1) * 1e3 > profile.tpot_ms:
            continue
        rate, step_cost, watts, step_energy = floors[name]
        cost = prefill * rate + decode * step_cost
        if best is None or cost < best.cost_usd:
            best = Placement(name, cost, prefill * watts + decode * step_energy, prefill)
    return best


def oracle(
    policy: Policy,
    requests: Sequence[TraceRequest],
    *,
    duration_s: float,
    model: str = MODEL,
) -> dict[str, Any]:
    """Return the oracle's figures for a trace, in the shape of a routed strategy's summary."""
    physics = {
        name: true_physics(policy, name, model)
        for name, pool in policy.pools.items()
        if pool.live and model in pool.models
    }
    floors = {name: phys.floors() for name, phys in physics.items()}
    placements = []
    for request in requests:
        profile = request_profile(policy, request, model)
        pools = eligible_pools(policy, profile, request.output_tokens)
        placements.append(place(profile, request, physics, floors, pools))
    served = [(p, r) for p, r in zip(placements, requests, strict=True) if p is not None]
    total = max(len(requests), 1)
    tokens_k = max(sum(r.output_tokens for _, r in served), 1) / 1000
    above_idle = sum(p.energy_j for p, _ in served)
    idle_w = sum(p.power.idle_w * p.backends for p in physics.values())
    ttft = [p.ttft_s * 1e3 for p, _ in served] or [0.0]
    shares = Counter(p.pool for p, _ in served)
    return {
        "requests": len(requests),
        "served": len(served),
        "energy_j_per_request": round(above_idle / total, 3),
        "energy_above_idle_j": round(above_idle, 1),
        "fleet_energy_j": round(above_idle + idle_w * duration_s, 1),
        "cost_usd_per_1k_tokens": round(sum(p.cost_usd for p, _ in served) / tokens_k, 9),
        "slo_attainment": round(len(served) / total, 5),
        "ttft_p50_ms": latency_percentile(ttft, 50),
        "ttft_p99_ms": latency_percentile(ttft, 99),
        "pool_shares": {name: round(shares[name] / total, 4) for name in physics},
    }
