"""Decisions on seeded random fleets are the ones recorded: work taken off the decision's path
for speed (bench/decision_time.py) changes no choice, trace or prediction.

Each case builds a fleet of one of a few policies in a random state (slots, KV memory and queues
taken, backends ejected, parked or full by their engine's word, prefixes held, a named session)
and a random request, then records what `decide` and `pick_backend` make of it with a learned
cost model: the backend or queue, the trace, every prediction to the last bit, or the error.
A change meant to alter decisions re-records them:

    PYTHONPATH=tests .venv/bin/python tests/routing/test_seeded_fleets.py
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from pathlib import Path
from typing import Any, cast

import yaml

from gateway.costmodel.predict import FEATURES, TARGETS, CostModel, Learned, OutputLengths, Residual
from gateway.costmodel.predict import Span as SeenSpan
from gateway.errors import GatewayError
from gateway.fleet.state import Fleet, Waiter
from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy
from gateway.policy.tariffs import Rate
from gateway.routing.classify import RequestProfile
from gateway.routing.ranking import CostRanker
from gateway.routing.router import decide, match_route, pick_backend

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).with_name("seeded-fleets.json")
CASES = 400
MODELS = ("llama-3.1-8b-instruct", "llama-3.1-70b-instruct", "bge-large-en-v1.5")


def policies() -> list[Policy]:
    """Return the default policy and variants of it: the CIM pool live, other objectives, a
    route that explores a large share, a canary."""
    base = yaml.safe_load((ROOT / "policies/default.yaml").read_text())
    for route in base["routes"]:  # the decision reads none of the shadows
        route.pop("shadow", None)
        route.pop("noise_floor", None)
    variants = [copy.deepcopy(base) for _ in range(4)]
    variants[1]["pools"]["cim"]["live"] = True
    variants[1]["routes"][0].update(pools=["asic", "gpu", "cim"], explore=0.3)
    variants[1]["routes"][1].update(pools=["asic"], objective="min_energy")
    variants[2]["pools"]["cim"]["live"] = True
    variants[2]["routes"][0].update(pools=["cim", "asic", "gpu"], objective="min_energy")
    variants[2]["routes"][1].update(pools=["gpu", "asic"], objective="min_latency")
    variants[2]["routes"][3].update(objective="min_carbon")
    variants[3]["routes"][0].update(objective="preference", canary={"pool": "cim", "weight": 0.3})
    variants[3]["routes"][1].update(pools=["gpu", "asic"], objective="min_cost", explore=0.5)
    return [parse_policy(yaml.safe_dump(doc)) for doc in variants]


def learned(rng: random.Random, policy: Policy) -> dict[tuple[str, str], Learned]:
    span = SeenSpan((2.0, 7.0), (1.0, 6.0), (0.0, 2.5))
    return {
        (pool, model): Learned(
            {
                target: Residual(tuple(rng.uniform(-0.05, 0.05) for _ in FEATURES), rng.random())
                for target in TARGETS
            },
            span if rng.random() < 0.5 else SeenSpan(),
        )
        for pool, spec in policy.pools.items()
        for model in spec.models
        if rng.random() < 0.8
    }


def random_fleet(rng: random.Random, policy: Policy, prompt: list[int]) -> Fleet:
    """Return the policy's fleet with every backend in a random state, some holding a prefix of
    the prompt's blocks and some other prompts'."""
    fleet = Fleet(policy)
    for backend in fleet.backends():
        backend.in_flight = backend.slots if rng.random() < 0.15 else rng.randint(0, backend.slots)
        backend.elsewhere = rng.choice([0, 0, 1, 3])
        backend.external = rng.choice([0, 0, 0, 2])
        backend.kv_reserved = backend.kv_capacity * rng.choice([0.0, 0.0, rng.random(), 0.999])
        backend.kv_elsewhere = rng.choice([0.0, 1e8])
        backend.engine_full = "KV cache 97% used" if rng.random() < 0.1 else ""
        backend.ejected = rng.random() < 0.1
        backend.parking = rng.choice(["", "", "", "", "", "", "", "parked"])
        if rng.random() < 0.6:
            fleet.prefixes.sent(backend.name, prompt[: rng.randint(1, len(prompt))])
        fleet.prefixes.sent(backend.name, [rng.getrandbits(60) for _ in range(4)])
        if rng.random() < 0.2:
            fleet.sessions.served("session-a", backend.name)
    for pool in fleet.pools.values():
        for _ in range(rng.choice([0, 0, 0, 1, pool.spec.queue_depth])):
            pool.waiters.append(Waiter(cast(Any, None)))
    return fleet


def random_profile(rng: random.Random, prompt: list[int]) -> RequestProfile:
    model = rng.choice(MODELS)
    embedding = model == "bge-large-en-v1.5"
    slo_class = rng.choice(["interactive", "interactive", "batch"])
    prompt_tokens = int(10 ** rng.uniform(0.5, 4.5))
    blocks = tuple(prompt[: rng.randint(0, len(prompt))]) if rng.random() < 0.6 else ()
    return RequestProfile(
        endpoint="embeddings" if embedding else rng.choice(["chat", "chat", "completions"]),
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=rng.choice([None, 1, 16, 256, 4000]),
        slo_class=slo_class,
        ttft_ms=rng.choice([None, 200.0, 500.0, 3000.0]) if slo_class == "interactive" else None,
        tpot_ms=rng.choice([None, 10.0, 50.0]) if slo_class == "interactive" else None,
        e2e_ms=rng.choice([None, 2000.0, 120000.0]) if slo_class == "batch" else None,
        tenant="anonymous",
        stream=rng.random() < 0.5,
        sequences=rng.choice([1, 1, 1, 2]),
        blocks=blocks,
        block_tokens=prompt_tokens / max(1, len(prompt)) if blocks else 0.0,
        session=rng.choice([None, None, "session-a"]),
    )


def outcome(case: int, variants: list[Policy]) -> dict[str, Any]:
    """Return what the router makes of one seeded case."""
    rng = random.Random(case)
    policy = variants[case % len(variants)]
    model = CostModel(policy, version=1, trained=learned(rng, policy))
    outputs = OutputLengths()
    for _ in range(rng.choice([0, 3])):
        outputs.observe(rng.choice(["chat-8b-short", "chat-8b"]), rng.randint(1, 600))
    price = Rate(rng.uniform(0.05, 0.4), rng.uniform(50, 600))
    ranker = CostRanker(
        lambda: model, outputs, (lambda pool: price) if rng.random() < 0.3 else None
    )
    prompt = [rng.getrandbits(60) for _ in range(rng.randint(1, 40))]
    fleet = random_fleet(rng, policy, prompt)
    profile = random_profile(rng, prompt)
    draw = rng.random()
    try:
        decision = decide(profile, policy, fleet, ranker, draw)
    except GatewayError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    retried = pick_backend(
        profile,
        match_route(profile, policy),
        policy,
        fleet,
        frozenset(rng.sample([b.name for b in fleet.backends()], 1)),
    )
    return {
        "route": decision.route.name,
        "backend": decision.backend.name if decision.backend is not None else None,
        "queue": decision.queue_pool.name if decision.queue_pool is not None else None,
        "queue_budget_s": decision.queue_budget_s,
        "slo_unmeetable": decision.slo_unmeetable,
        "kv_bytes": decision.kv_bytes,
        "trace": [list(line) for line in decision.trace],
        "predictions": {
            pool: [
                [p.rate.usd_per_kwh, p.rate.g_co2_per_kwh] if name == "rate" else getattr(p, name)
                for name in p.__slots__
            ]
            for pool, p in decision.predictions.items()
        },
        "retry": retried.name if retried is not None else None,
    }


def recorded_form(found: dict[str, Any]) -> dict[str, Any]:
    """Return an outcome as the file keeps it: the choice in words, the rest (trace and
    predictions to the last bit) as a digest."""
    choice = found.get("error") or f"{found['backend'] or 'queue'} {found['queue'] or ''}".strip()
    whole = json.dumps(found, sort_keys=True).encode()
    return {"choice": choice, "digest": hashlib.sha256(whole).hexdigest()[:16]}


def outcomes() -> list[dict[str, Any]]:
    variants = policies()
    return [outcome(case, variants) for case in range(CASES)]


def test_decisions_on_seeded_random_fleets_are_the_recorded_ones() -> None:
    recorded = json.loads(RECORDED.read_text())
    now = outcomes()
    assert len(recorded) == len(now) == CASES
    # Every kind of outcome and the paths through the router are among the cases.
    assert sum("error" in o for o in now) > 10
    assert sum(o.get("queue") is not None for o in now) > 10
    assert sum(o.get("slo_unmeetable", False) for o in now) > 10
    assert sum(len(o.get("predictions", ())) >= 3 for o in now) > 20
    traced = " ".join(said for o in now for _, said in o.get("trace", ()))
    for path in ("explored", "canary", "fallback", "full, but cheapest", "miss the SLO"):
        assert path in traced
    for case, (was, found) in enumerate(zip(recorded, now, strict=True)):
        assert recorded_form(found) == was, f"case {case}: {found}"


if __name__ == "__main__":
    lines = ",\n".join(json.dumps(recorded_form(o)) for o in outcomes())
    RECORDED.write_text(f"[\n{lines}\n]\n")
