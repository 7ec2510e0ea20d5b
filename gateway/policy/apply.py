"""Apply a policy: the one way a policy text becomes the active version, whoever asks.

The admin API (`PUT /admin/policy`), the CLI (`gateway policy apply`), the file watcher
(`gateway serve --watch`) and rollout steps all call `apply`, and a rollback (`rollback`) is an
apply of an earlier version's text: the text is validated (an invalid one is refused with every
problem located, and nothing changes), a text that is already active is not stored again, and
any other is stored as the new active version, in one transaction. Serving it is then the
caller's: a running gateway syncs at once and tells the other replicas, the CLI tells them
through Redis, and every replica polls the store in any case.

**The precision gate.** A shadow-only pool (one any stored version, or the new text, marks
`live: false`) starts serving clients, by `live: true` or as a route's canary, only when its
newest precision check passed (`gateway precision check`, stored in `precision_checks`;
docs/precision.md). An operator may override the gate; the override is written into the stored
version's message, so `gateway policy history` shows who let which pool through without one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any, Literal

import sqlalchemy as sa
import yaml

from gateway.db.schema import precision_checks
from gateway.errors import PolicyError, PolicyStoreUnavailable, Problem
from gateway.policy import suites, versions
from gateway.policy.credentials import Access
from gateway.policy.definition import GoLive, Policy
from gateway.policy.load import PolicyLoader, content_hash, locator, parse_policy
from gateway.policy.validation import validate
from gateway.policy.versions import PolicyVersion

# How an apply treats a shadow-only pool going live: refuse it without a passing precision
# check ("check"), let it through and record that in the version's message ("override"), or
# leave it to the caller, which checked already (a rollout, gated when it started: "checked").
PrecisionGate = Literal["check", "override", "checked"]


@dataclass(frozen=True, slots=True)
class Applied:
    """The outcome of an apply: the active version, whether it is new, and the warnings."""

    version: PolicyVersion
    changed: bool
    warnings: list[Problem] = field(default_factory=list)


def apply(
    db: sa.Engine,
    text: str,
    source: str,
    *,
    author: str,
    message: str,
    access: Access | None = None,
    serving: bool = True,
    precision_gate: PrecisionGate = "check",
    restores: int | None = None,
) -> Applied:
    """Validate a policy text and make it the active version; raise PolicyError if invalid.

    `access` and `serving` say whose upstream keys and rules the policy is checked against
    (gateway/policy/validation.py): a serving gateway's refuses a policy breaking them. A pool the
    active version keeps shadow-only may go live only past the precision gate (above).
    """
    checked = validate(text, source, access, serving=serving)
    policy = checked.accepted()
    active = versions.active(db)
    if active is not None and active.hash == content_hash(text):
        return Applied(active, False, checked.warnings)
    if precision_gate != "checked":
        # Without an active version, no pool served before: the first one is gated too.
        ungated = uncleared(db, policy, going_live(db, active.content if active else "", policy))
        if ungated and precision_gate == "check":
            at = locator(text, source)
            problems = [
                at(
                    _serving_at(policy, pool),
                    refusal(pool, why, policy.pools[pool].go_live, _how(policy, pool)),
                )
                for pool, why in ungated.items()
            ]
            listed = "\n  ".join(map(str, problems))
            raise PolicyError(f"policy refused by the precision gate:\n  {listed}", problems)
        if ungated:
            message += overridden(ungated, author)
    return Applied(
        versions.record(db, text, author, message, restores=restores), True, checked.warnings
    )


def rollback(
    db: sa.Engine,
    *,
    author: str,
    version: int | None = None,
    message: str = "",
    access: Access | None = None,
    serving: bool = True,
    precision_gate: PrecisionGate = "check",
) -> Applied:
    """Apply an earlier version's text again, as a new version (default: the one before the
    active version). It is validated and gated like any apply."""
    target = versions.rollback_target(db, version)
    return apply(
        db,
        target.content,
        f"version {target.version}",
        author=author,
        message=message or f"roll back to version {target.version}",
        access=access,
        serving=serving,
        precision_gate=precision_gate,
        restores=target.version,
    )


def serving_pools(policy: Policy) -> set[str]:
    """Return the pools that serve clients: the live ones and every route's canary."""
    live = {name for name, spec in policy.pools.items() if spec.live}
    return live | {r.canary.pool for r in policy.routes if r.canary and r.canary.weight > 0}


@functools.lru_cache(maxsize=1024)
def shadow_only(content: str) -> frozenset[str]:
    """Return the pools a stored policy text marks `live: false`."""
    try:
        doc: Any = yaml.load(content, Loader=PolicyLoader)
        return frozenset(n for n, spec in doc["pools"].items() if spec.get("live", True) is False)
    except (yaml.YAMLError, KeyError, TypeError, AttributeError):
        return (
            frozenset()
        )  # a stored version is valid where it was applied; nothing to compare if not


def going_live(db: sa.Engine, active_content: str, policy: Policy) -> list[str]:
    """Return the shadow-only pools that `policy` has serve clients and the active text does not.

    Shadow-only is what any stored version, or `policy` itself, says: a pool taken out and put
    back live is the same hardware. What the active text serves is read from its pools and
    canaries as stored.
    """
    try:
        active = serving_pools(parse_policy(active_content, "<active>"))
    except PolicyError:
        active = set()
    marked = {n for n, spec in policy.pools.items() if not spec.live}
    for content in versions.contents(db):
        marked |= shadow_only(content)
    return sorted((serving_pools(policy) - active) & marked)


def _how(policy: Policy, pool: str) -> str:
    return "go live" if policy.pools[pool].live else "serve clients as a canary"


def _serving_at(policy: Policy, pool: str) -> tuple[str | int, ...]:
    """Return where `policy` has the pool serve: its `live`, or the canary naming it."""
    if policy.pools[pool].live:
        return ("pools", pool, "live")
    i = next(i for i, r in enumerate(policy.routes) if r.canary and r.canary.pool == pool)
    return ("routes", i, "canary", "pool")


def checks_of(db: sa.Engine, pool: str, newest: int = 50) -> list[dict[str, Any]]:
    """Return a pool's stored precision checks, newest first (at most `newest` of them)."""
    c = precision_checks.c
    query = (
        sa.select(c.ts, c.reference, c.suite, c.verdict, c.result)
        .where(c.pool == pool)
        .order_by(c.id.desc())
        .limit(newest)
    )
    try:
        with db.connect() as conn:
            rows = conn.execute(query).all()
    except sa.exc.SQLAlchemyError as exc:
        raise PolicyStoreUnavailable(
            f"the precision checks cannot be read ({type(exc).__name__}); run `gateway db "
            "upgrade` if the table is missing"
        ) from exc
    return [{**dict(row._mapping), "result": json.loads(row.result)} for row in rows]


def why_not_counted(check: dict[str, Any], rule: GoLive, policy: Policy) -> str | None:
    """Say why a stored check cannot open the gate under `rule`, or None if it can."""
    result = check["result"]
    ran = result.get("suite_file", PurePath(check["suite"]).name)
    if ran != rule.suite:
        return f"it replayed {ran}, and the pool's go_live names {rule.suite}"
    changed = suites.unpinned(ran, str(result.get("suite_sha256")), rule)
    if changed is not None:
        return changed
    reference = check["reference"]
    if rule.reference is not None and reference != rule.reference:
        return f"it compared against {reference!r}, and go_live names {rule.reference!r}"
    spec = policy.pools.get(reference)
    if rule.reference is None and (spec is None or spec.kind != "gpu" or not spec.live):
        return f"its reference {reference!r} is not a live gpu pool of this policy"
    if "gate" not in result:
        return "it ran before suites were held to the gate's minimums; run it again"
    # The minimums alone: whether an unlabelled suite counts is the rule in force's to say
    # (below), not the one the check ran under.
    if result["gate"]["lacks"]:
        return f"its suite falls short: {'; '.join(result['gate']['lacks'])}"
    if "labelled" not in result["gate"]:
        return "it ran before go-live suites needed a labelled part; run it again"
    labelled, needed = result["gate"]["labelled"], result["gate"]["labelled_needed"]
    if labelled < needed and rule.unlabelled is None:
        return (
            f"its suite holds {labelled} labelled questions, and a go-live suite needs"
            f" {needed} (or go_live.unlabelled saying why the pool's models have none)"
        )
    return None


def uncleared(db: sa.Engine, policy: Policy, pools: Iterable[str]) -> dict[str, str]:
    """Return, for each pool without a passing precision check that counts, why in words.

    A check counts when it replayed the suite the pool's `go_live` names (and pins), against
    its reference (by default any live gpu pool), on a suite that opens the gate
    (gateway/promotion/precision/figures.py `gate`). The newest that counts decides.
    """
    found = {}
    for pool in pools:
        rule = policy.pools[pool].go_live
        checks = checks_of(db, pool)
        counted = next((c for c in checks if why_not_counted(c, rule, policy) is None), None)
        if not checks:
            found[pool] = "it has no precision check"
        elif counted is None:
            newest = checks[0]
            found[pool] = (
                f"no precision check of it counts: the newest ({_described(newest)}) does not, "
                f"because {why_not_counted(newest, rule, policy)}"
            )
        elif counted["verdict"] != "pass":
            found[pool] = (
                f"its newest precision check that counts ({_described(counted)}) is "
                f"{counted['verdict']!r}"
            )
    return found


def _described(check: dict[str, Any]) -> str:
    ran = datetime.fromtimestamp(check["ts"], UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"{ran}, {check['suite']} against {check['reference']!r}"


def refusal(pool: str, why: str, rule: GoLive, change: str = "serve clients") -> str:
    """Say why a shadow-only pool may not serve clients, and what the operator can do."""
    reference = f" --reference {rule.reference}" if rule.reference else ""
    return (
        f"pool {pool!r} is shadow-only (live: false) and would {change}, but {why}: run `gateway "
        f"precision check --pool {pool} --suite suites/{rule.suite}{reference}` until it passes, "
        "or override the gate (--override-precision-gate, or override_precision_gate in the "
        "admin API), which the policy history records"
    )


def overridden(pools: Iterable[str], author: str) -> str:
    """Return what a version's message says of a precision gate overridden for `pools`."""
    return f" [precision gate overridden for {', '.join(sorted(pools))} by {author}]"
