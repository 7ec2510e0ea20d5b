"""Progressive rollout: a promoted candidate takes a route's traffic step by step, guarded.

An operator starts a rollout (`gateway promote apply ROUTE CANDIDATE`); the candidate becomes the
route's canary at the first weight of `promotion.rollout_steps`. After each `step_minutes` the
guards are checked on what the canary served in that step: its error rate (errors among its
requests, plus its answers that failed in the reverse shadow sample: null, empty, cut short,
gateway/compare/failures.py), its SLO attainment, and its agreement in meaning with the former
primary on a reverse shadow sample (the former primary answers copies of the canary's requests;
gateway/promotion/departures.py). Passing
guards move to the next weight; at the last, the candidate becomes the route's first pool. A
breach goes back to the previous weight at once, stops the rollout and records why. Every change
is a new policy version, so the policy history is the audit trail; the `rollouts` table keeps
each rollout's steps.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
import yaml

from gateway.db.schema import request_records, rollouts
from gateway.errors import Conflict
from gateway.periodic import Periodic
from gateway.policy import validation, versions
from gateway.policy.apply import apply, overridden, refusal, uncleared
from gateway.policy.definition import Policy
from gateway.policy.load import PolicyLoader, to_yaml
from gateway.promotion.departures import Tolerance, departs
from gateway.promotion.evidence import latest, read_minutes
from gateway.promotion.tally import FAILED, Tally, representative
from gateway.records.slo import record_meets_slo
from gateway.shadow.kinds import CANDIDATE

ROLLING, COMPLETE, ROLLED_BACK = "rolling", "complete", "rolled_back"
# The reverse shadow sample's share of the canary's requests.
REVERSE_SHADOW_RATE = 0.1


@dataclass(frozen=True, slots=True)
class Guards:
    """What the canary did during the current step."""

    requests: int
    errors: int
    slo_met: int
    compared: int
    agreed: int
    copies: int = 0  # reverse shadow copies of the canary's requests
    failed: int = 0  # of them, those whose canary answer failed where the former's did not

    @property
    def error_rate(self) -> float:
        """The share of the canary's requests that failed: errors among all it served, plus the
        failed answers in its reverse shadow sample, over the requests they were drawn from."""
        errors = self.errors / self.requests if self.requests else 0.0
        return errors + (self.failed / self.copies if self.copies else 0.0)

    @property
    def slo_attainment(self) -> float:
        return self.slo_met / self.requests if self.requests else 1.0

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.compared if self.compared else None


def next_move(guards: Guards, policy: Policy, elapsed_s: float) -> tuple[str, str]:
    """Decide 'advance', 'rollback' or 'wait' for a step that has run elapsed_s."""
    p = policy.promotion
    if guards.requests and guards.error_rate > p.max_error_rate:
        return "rollback", f"error rate {guards.error_rate:.3f} > {p.max_error_rate}"
    if guards.requests >= p.guard_min_requests and guards.slo_attainment < (
        p.guard_min_slo_attainment
    ):
        return "rollback", (
            f"SLO attainment {guards.slo_attainment:.3f} < {p.guard_min_slo_attainment}"
        )
    agreement = guards.agreement
    if agreement is not None and guards.compared >= 10 and agreement < p.guard_min_agreement:
        return "rollback", f"agreement {agreement:.3f} < {p.guard_min_agreement}"
    if elapsed_s < p.step_minutes * 60:
        return "wait", "the step has not run its time"
    if guards.requests < p.guard_min_requests:
        return "wait", f"{guards.requests} canary requests, {p.guard_min_requests} needed"
    return "advance", "guards pass"


def with_canary(doc: dict[str, Any], route: str, pool: str, weight: float) -> dict[str, Any]:
    """Return the policy document with `pool` as the route's canary at `weight` (0 removes it)."""
    for r in doc["routes"]:
        if r["name"] != route:
            continue
        if weight <= 0:
            r.pop("canary", None)
            # Without a canary the reverse sample would copy the primary to itself.
            r["shadow"] = [s for s in r.get("shadow", []) if s["pool"] != r["pools"][0]]
            return doc
        r["canary"] = {"pool": pool, "weight": weight}
        former = r["pools"][0]
        shadows = r.setdefault("shadow", [])
        if not any(s["pool"] == former for s in shadows):
            # The reverse sample: the former primary answers copies of the canary's requests.
            shadows.append({"pool": former, "sample_rate": REVERSE_SHADOW_RATE})
        return doc
    raise Conflict(f"the active policy has no route {route!r}", param="route")


def promoted(doc: dict[str, Any], route: str, pool: str) -> dict[str, Any]:
    """Return the document with `pool` first among the route's pools, live, canary done."""
    doc["pools"][pool]["live"] = True
    for r in doc["routes"]:
        if r["name"] == route:
            r.pop("canary", None)
            r["pools"] = [pool, *(p for p in r["pools"] if p != pool)]
            r["shadow"] = [s for s in r.get("shadow", []) if s["pool"] != pool]
            if r.get("noise_floor") and not r["shadow"]:
                r.pop("noise_floor")
    return doc


def _store(db: sa.Engine, content: str, author: str, message: str) -> int:
    """Apply a rollout's policy text; return the version it became.

    The precision gate was passed (or overridden, and recorded) when the rollout started, so
    the step that makes the candidate live at the end is not refused for it.
    """
    applied = apply(
        db, content, "rollout", author=author, message=message, precision_gate="checked"
    )
    return applied.version.version


def _active_doc(db: sa.Engine) -> dict[str, Any]:
    active = versions.active(db)
    if active is None:
        raise Conflict("no policy version is active yet: start the gateway or apply one")
    loaded: dict[str, Any] = yaml.load(active.content, Loader=PolicyLoader)
    return loaded


def start(
    db: sa.Engine,
    policy: Policy,
    route: str,
    candidate: str,
    *,
    author: str,
    force: bool = False,
    override_precision_gate: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """Begin rolling `candidate` out on `route` at the first step's weight.

    A shadow-only candidate (`live: false`) needs a passing newest precision check, unless the
    gate is overridden; the override is written into the rollout's first policy version.
    """
    now = time.time() if now is None else now
    if not force:
        verdicts = {(v["route"], v["candidate"]): v["outcome"] for v in latest(db)}
        outcome = verdicts.get((route, candidate))
        if outcome != "promote":
            raise Conflict(
                f"the judge's newest verdict for {candidate!r} on {route!r} is {outcome!r}, not "
                "'promote' (run `gateway promote evaluate`, or pass --force)"
            )
    with db.connect() as conn:
        running = conn.execute(
            sa.select(rollouts.c.id).where(rollouts.c.route == route, rollouts.c.state == ROLLING)
        ).first()
    if running is not None:
        raise Conflict(f"route {route!r} already has a rollout in progress")
    doc = _active_doc(db)
    route_doc = next((r for r in doc["routes"] if r["name"] == route), None)
    if route_doc is None:
        raise Conflict(f"the active policy has no route {route!r}", param="route")
    former = route_doc["pools"][0]
    if candidate == former:
        raise Conflict(f"{candidate!r} already serves route {route!r} first")
    weight = policy.promotion.rollout_steps[0]
    message = f"rollout of {candidate} on {route}: {weight:.0%}"
    message += _precision_gate(db, doc, route, candidate, author, override_precision_gate)
    version = _store(db, to_yaml(with_canary(doc, route, candidate, weight)), author, message)
    history = [{"ts": now, "event": "started", "weight": weight, "policy_version": version}]
    with db.begin() as conn:
        conn.execute(
            rollouts.insert().values(
                route=route,
                candidate=candidate,
                former_primary=former,
                state=ROLLING,
                step=0,
                weight=weight,
                started=now,
                step_started=now,
                history=json.dumps(history),
            )
        )
    return status(db)[-1]


def _precision_gate(
    db: sa.Engine,
    doc: dict[str, Any],
    route: str,
    candidate: str,
    author: str,
    override: bool,
) -> str:
    """Refuse a shadow-only candidate without a passing precision check; return what to record.

    The text returned is appended to the rollout's first policy version's message: empty when
    the gate had nothing to say, the override and its author when it was overridden.
    """
    active = Policy.model_validate(doc)
    spec = active.pools.get(candidate)
    if spec is None or spec.live:
        return ""
    ungated = uncleared(db, active, [candidate])
    if not ungated:
        return ""
    if not override:
        change = f"take a share of route {route!r}'s live traffic as its canary"
        rule = spec.go_live
        raise Conflict(refusal(candidate, ungated[candidate], rule, change=change))
    return overridden(ungated, author)


def guards(
    db: sa.Engine,
    policy: Policy,
    route: str,
    candidate: str,
    since: float,
    *,
    now: float | None = None,
) -> Guards:
    """Measure the canary's requests and reverse shadow sample since the step began.

    The reverse sample is read as the judge reads its evidence, from the shadow minutes
    (gateway/promotion/evidence.py `read_minutes`): the copies whose primary was the canary,
    from the row the step began in (a step's first minutes are compacted into an hour that
    began before it once the hour settles, and are the step's evidence still).
    """
    r = request_records.c
    with db.connect() as conn:
        # Requests the canary was given: a fallback that saved the client is still its failure.
        served = conn.execute(
            sa.select(
                r.status,
                r.slo_class,
                r.endpoint,
                r.stream,
                r.completion_tokens,
                r.ttft_ms,
                r.tpot_ms,
                r.e2e_ms,
                r.fallback,
            ).where(r.route == route, r.first_pool == candidate, r.ts >= since)
        ).all()
    met = errors = 0
    for row in served:
        cls = policy.slo_classes.get(row.slo_class or policy.default_slo_class)
        ok = row.status == 200 and not row.fallback
        errors += not ok
        met += ok and record_meets_slo(cls, row._mapping)
    copies = Tally()
    for minute in read_minutes(
        db,
        policy,
        since,
        route=route,
        primary_pool=candidate,
        kind=CANDIDATE,
        overlapping=True,
        now=now,
    ):
        copies.add(minute, ())
    compared = agreed = 0
    for (name, value, _), n, _, _ in copies.classes():
        if name == FAILED:  # the former primary's answer failed: not the canary's doing
            continue
        compared += n
        # Held to the default tolerance: the step is too short to measure a noise floor of its
        # own.
        if name is None:
            agreed += n * (not value)
        else:
            agreed += n * (not departs(representative(name, value), Tolerance()))
    return Guards(
        requests=len(served),
        errors=errors,
        slo_met=met,
        compared=compared,
        agreed=agreed,
        # The canary is the primary of its reverse copies: an answer of its that failed where
        # the former primary's did not (gateway/compare/failures.py) is a request it failed.
        copies=int(copies["answered"]),
        failed=int(copies["only_primary_failed"]),
    )


def advance(
    db: sa.Engine, policy: Policy, *, author: str = "rollout", now: float | None = None
) -> list[dict[str, Any]]:
    """Check every running rollout's step; move, finish or roll back those that are due."""
    now = time.time() if now is None else now
    steps = policy.promotion.rollout_steps
    with db.connect() as conn:
        running = conn.execute(sa.select(rollouts).where(rollouts.c.state == ROLLING)).all()
    moved = []
    for row in running:
        g = guards(db, policy, row.route, row.candidate, row.step_started, now=now)
        move, reason = next_move(g, policy, now - row.step_started)
        if move == "wait":
            continue
        if move == "rollback":
            step = row.step - 1
            state = ROLLED_BACK
        elif row.step + 1 < len(steps):
            step, state = row.step + 1, ROLLING
        else:
            step, state = row.step, COMPLETE
        weight = steps[step] if step >= 0 else 0.0
        doc = _active_doc(db)
        if state == COMPLETE:
            message = f"rollout of {row.candidate} on {row.route}: promoted"
            content = to_yaml(promoted(doc, row.route, row.candidate))
        else:
            verb = "rolled back" if state == ROLLED_BACK else "stepped"
            message = f"rollout of {row.candidate} on {row.route}: {verb} to {weight:.0%}"
            content = to_yaml(with_canary(doc, row.route, row.candidate, weight))
        validation.validate(content, "rollout").accepted()
        # Claim the transition, so two replicas never both step one rollout; the new policy
        # was checked above, so storing it cannot fail on its content.
        with db.begin() as conn:
            claimed = conn.execute(
                rollouts.update()
                .where(
                    rollouts.c.id == row.id,
                    rollouts.c.step == row.step,
                    rollouts.c.state == ROLLING,
                )
                .values(step=step, state=state, weight=weight, step_started=now)
            ).rowcount
        if not claimed:
            continue
        version = _store(db, content, author, f"{message} ({reason})")
        history = json.loads(row.history)
        history.append(
            {
                "ts": now,
                "event": move if state != COMPLETE else "promoted",
                "weight": weight,
                "reason": reason,
                "policy_version": version,
                "requests": g.requests,
                "error_rate": g.error_rate,
                "slo_attainment": g.slo_attainment,
                "agreement": g.agreement,
            }
        )
        with db.begin() as conn:
            conn.execute(
                rollouts.update().where(rollouts.c.id == row.id).values(history=json.dumps(history))
            )
        moved.append(
            {
                "route": row.route,
                "candidate": row.candidate,
                "state": state,
                "weight": weight,
                "reason": reason,
            }
        )
    return moved


def stop(db: sa.Engine, route: str, *, author: str, now: float | None = None) -> dict[str, Any]:
    """Roll a route's running rollout all the way back: the candidate serves nothing live."""
    now = time.time() if now is None else now
    with db.connect() as conn:
        row = conn.execute(
            sa.select(rollouts).where(rollouts.c.route == route, rollouts.c.state == ROLLING)
        ).first()
    if row is None:
        raise Conflict(f"route {route!r} has no rollout in progress", param="route")
    version = _store(
        db,
        to_yaml(with_canary(_active_doc(db), route, row.candidate, 0.0)),
        author,
        f"rollout of {row.candidate} on {route}: rolled back by {author}",
    )
    history = [
        *json.loads(row.history),
        {"ts": now, "event": "stopped", "weight": 0.0, "policy_version": version},
    ]
    with db.begin() as conn:
        conn.execute(
            rollouts.update()
            .where(rollouts.c.id == row.id)
            .values(state=ROLLED_BACK, step=-1, weight=0.0, history=json.dumps(history))
        )
    return status(db)[-1]


def status(db: sa.Engine) -> list[dict[str, Any]]:
    """Return every rollout, oldest first, with its history."""
    with db.connect() as conn:
        rows = conn.execute(sa.select(rollouts).order_by(rollouts.c.id)).all()
    return [
        {
            "id": row.id,
            "route": row.route,
            "candidate": row.candidate,
            "former_primary": row.former_primary,
            "state": row.state,
            "weight": row.weight,
            "started": row.started,
            "history": json.loads(row.history),
        }
        for row in rows
    ]


class RolloutDriver:
    """Check running rollouts on an interval in `gateway serve`, and apply what they change."""

    def __init__(
        self,
        db: sa.Engine,
        policy: Callable[[], Policy],
        synced: Callable[[], Awaitable[int]],
        interval_s: float,
    ):
        self._db = db
        self._policy = policy
        self._synced = synced
        self.periodic = Periodic("rollout-driver", interval_s, self.check)

    def start(self) -> None:
        self.periodic.start()

    async def stop(self) -> None:
        await self.periodic.stop()

    async def check(self) -> list[dict[str, Any]]:
        """Advance what is due now; serve the resulting policy version at once."""
        moved = await asyncio.to_thread(advance, self._db, self._policy())
        if moved:
            await self._synced()
        return moved
