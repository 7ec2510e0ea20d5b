"""The admin API under /admin: what operators read and do, behind the admin bearer token.

Every route here needs `Authorization: Bearer <GATEWAY_ADMIN_TOKEN>`, checked before the request
is read (gateway/ops/guard.py). Without a configured token the API is off (403
`admin_disabled`) rather than open; a missing or wrong token is 401.
Errors have OpenAI's shape, as on /v1, the framework's own included
(gateway/ops/error_handlers.py): a body that is not JSON or a field of the wrong type is a 400
naming the field, an unknown path a 404, another method on a known path a 405 with `Allow`.

The request models below are what each route validates with and what FastAPI describes it by
(gateway/ops/openapi.py), so the two cannot part: bodies are typed strictly (`"yes"` is not a
boolean, `"1"` not an integer; a query's values are text, read as their type: `evaluate=1` is
true), and every form and bound checked is in the model, `since`'s pattern included. What the
models accept, the gateway's state may still refuse (a rollout already running, none to take
back, no earlier version, no promote verdict): those are 409 (`Conflict`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query, Response
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import (
    ReportNotFound,
)
from gateway.ops import views
from gateway.ops.error_handlers import problem
from gateway.ops.openapi import ADMIN_ERRORS, ErrorBody
from gateway.ops.parts import OpsParts
from gateway.periodic import helper_process
from gateway.policy import validation, versions
from gateway.policy.apply import apply, rollback
from gateway.policy.load import content_hash
from gateway.policy.tariffs import DAY_S
from gateway.promotion import evidence, rollout
from gateway.promotion.shadow_summary import summarize
from gateway.report.period import ISO_WEEK, SINCE, parse_since
from gateway.report.schedule import FILES, listing
from gateway.routing.bodies import INTEGRAL
from gateway.routing.explanation import explain
from gateway.whatif.simulate import simulate_sample
from gateway.whatif.windows import DEFAULT_SAMPLE, sample_windows

MAX_LISTED = 1000  # policy versions one listing returns; a bigger limit is a 400, not a crash
# The widest integer a JSON reader holds exactly (the description's bounds are doubles), which
# every database stores.
MAX_VERSION = 2**53 - 1
MAX_PAIRS = 200  # shadow pairs one listing returns


def admin_router(gateway: OpsParts) -> APIRouter:
    """Build the /admin routes for a gateway."""

    # The token is checked before the app reads anything (gateway/ops/guard.py).
    router = APIRouter(prefix="/admin", responses=ADMIN_ERRORS)

    @router.get("/shadow/summary")
    async def shadow_summary(
        route: str | None = None,
        candidate: str | None = None,
        since: Annotated[
            str | None,
            Query(
                pattern=SINCE,
                description="Only evidence from then on: Unix seconds, an ISO 8601 time (UTC "
                "unless it says) or an age such as 24h or 7d.",
            ),
        ] = None,
    ) -> list[dict[str, Any]]:
        """Summarise shadow evidence per route and candidate pool."""
        start = parse_since(since, time.time())
        return await asyncio.to_thread(
            summarize, gateway.db, route or None, candidate or None, start
        )

    @router.get("/shadow/pairs")
    async def shadow_pairs(
        route: str,
        candidate: str,
        limit: Annotated[int, Query(ge=1, le=MAX_PAIRS)] = 20,
    ) -> list[dict[str, Any]]:
        """The newest sampled pairs of a route and candidate with both answers (while their
        texts are kept) and where they first part."""
        return await asyncio.to_thread(views.shadow_pairs, gateway.db, route, candidate, limit)

    @router.get("/fleet")
    async def fleet() -> list[dict[str, Any]]:
        """Every pool and backend now: health, slots, queue, power, energy today, model error."""
        return await asyncio.to_thread(views.fleet, gateway, time.time())

    @router.get("/fleet/energy")
    async def fleet_energy(window: Literal["hour", "day"] = "day") -> dict[str, Any]:
        """The fleet's energy (idle included), cost (device-hours and energy) and carbon over
        the last hour or day, per pool, against the window before."""
        policy, span = gateway.serving.policy, views.WINDOWS[window]
        return await asyncio.to_thread(views.fleet_energy, gateway.db, policy, time.time(), span)

    @router.get("/parking")
    async def parking(window: Literal["hour", "day"] = "day") -> dict[str, Any]:
        """Parking over the last hour or day: per pool, backends on and parked over time,
        parks, wake-ups, hook failures and energy saved; and each wake-up, with why."""
        policy, span = gateway.serving.policy, views.WINDOWS[window]
        return await asyncio.to_thread(views.parking_history, gateway.db, policy, time.time(), span)

    @router.get("/traffic")
    async def traffic(window: Literal["hour", "day"] = "hour") -> list[dict[str, Any]]:
        """Per route over the last hour or day: pool shares, SLO attainment, TTFT, energy, cost."""
        policy, span = gateway.serving.policy, views.WINDOWS[window]
        return await asyncio.to_thread(views.traffic, gateway.db, policy, time.time(), span)

    @router.get("/promotions")
    async def promotions(evaluate: bool = False) -> list[dict[str, Any]]:
        """Return the newest verdict per route and candidate; judge afresh with ?evaluate=1."""
        if evaluate:
            await asyncio.to_thread(evidence.evaluate, gateway.db, gateway.serving.policy)
        return await asyncio.to_thread(evidence.latest, gateway.db)

    @router.get("/reports")
    async def reports() -> list[dict[str, Any]]:
        """List the kept weekly reports, newest first."""
        return listing(gateway.settings.reports_dir)

    @router.get("/reports/{week}/{name}", responses={404: {"model": ErrorBody}})
    async def report_file(week: str, name: str) -> Response:
        """Download one file of a kept report."""
        if not ISO_WEEK.match(week) or name not in FILES:
            raise ReportNotFound(f"no report file {week}/{name} (files: {', '.join(FILES)})")
        path = gateway.settings.reports_dir / week / name
        if not path.is_file():
            raise ReportNotFound(f"no report for week {week}")
        return FileResponse(path)

    @router.get("/rollouts")
    async def rollouts() -> list[dict[str, Any]]:
        """Return every rollout with its steps."""
        return await asyncio.to_thread(rollout.status, gateway.db)

    @router.post("/promotions/apply", responses=conflict(ROLLOUT_START_CONFLICTS))
    async def promotion_apply(request: RolloutStart) -> dict[str, Any]:
        """Start rolling a candidate out on a route; served at once by this replica."""
        started = await asyncio.to_thread(
            rollout.start,
            gateway.db,
            gateway.serving.policy,
            request.route,
            request.candidate,
            author="admin-api",
            force=request.force,
            override_precision_gate=request.override_precision_gate,
        )
        await gateway.policy_watcher.sync()
        return started

    @router.post("/promotions/advance", responses=conflict(NO_ACTIVE_VERSION))
    async def promotion_advance() -> list[dict[str, Any]]:
        """Check every running rollout now: step, finish or roll back those whose step is due
        and whose guards say so (as the rollout driver does each round); return what moved."""
        moved = await asyncio.to_thread(
            rollout.advance, gateway.db, gateway.serving.policy, author="admin-api"
        )
        await gateway.policy_watcher.sync()
        return moved

    @router.post(
        "/promotions/rollback", responses=conflict("The route has no rollout in progress.")
    )
    async def promotion_rollback(request: RolloutStop) -> dict[str, Any]:
        """Take a route's rollout all the way back."""
        stopped = await asyncio.to_thread(
            rollout.stop, gateway.db, request.route, author="admin-api"
        )
        await gateway.policy_watcher.sync()
        return stopped

    @router.post("/explain")
    async def explain_request(request: ExplainRequest) -> dict[str, Any]:
        """Route a request as the gateway would now, without sending it; return the reasons."""
        serving = gateway.serving  # the policy and the fleet it configured: one version
        return explain(
            request.endpoint,
            request.body,
            request.headers,
            serving.policy,
            serving.fleet,
            gateway.ranker,
            gateway.estimator,
        )

    @router.get("/policy")
    async def active_policy() -> dict[str, Any]:
        """Return the policy serving on this replica: its version, hash and YAML."""
        version, text = gateway.serving.version, gateway.serving.text
        return {"version": version, "hash": content_hash(text), "yaml": text}

    @router.put("/policy", responses={422: {"model": PolicyErrors}, **STORE_ERRORS})
    async def apply_policy(change: PolicyChange) -> Response:
        """Store a valid policy as the new active version and serve it; reject an invalid one.

        A text that is already the active version is not stored again (`changed` is false).
        """
        applied = await asyncio.to_thread(
            apply,
            gateway.db,
            change.yaml,
            "<request>",
            author=change.author,
            message=change.message,
            access=gateway.access,
            precision_gate="override" if change.override_precision_gate else "check",
        )
        await gateway.policy_watcher.sync()
        return JSONResponse(
            {
                "version": applied.version.version,
                "changed": applied.changed,
                "warnings": [problem(p) for p in applied.warnings],
            }
        )

    @router.post("/policy/validate")
    async def validate_policy(candidate: PolicyCandidate) -> dict[str, Any]:
        """Check a policy without applying it: its errors and warnings."""
        # Off the event loop: validating a large policy takes the CPU for a while.
        checked = await asyncio.to_thread(
            validation.validate, candidate.yaml, "<request>", gateway.access
        )
        return {
            "valid": checked.valid,
            "errors": [problem(p) for p in checked.errors],
            "warnings": [problem(p) for p in checked.warnings],
        }

    @router.post("/policy/simulate", responses={422: {"model": PolicyErrors}})
    async def simulate_policy(request: SimulateRequest) -> dict[str, Any]:
        """Replay the recorded requests of the last days under the active and a proposed policy:
        which pools serve them, and the energy, cost and SLO before and after."""
        checked = await asyncio.to_thread(
            validation.validate, request.yaml, "<request>", gateway.access
        )
        proposed = checked.accepted()
        since = time.time() - request.days * DAY_S
        sample = await asyncio.to_thread(sample_windows, gateway.db, since, size=request.sample)
        if not sample.requests:
            return {"requests": 0, "change": {}, "runs": {}, "sample": None}
        # The replay is seconds of pure Python: in a process of its own, not beside serving,
        # ended off the event loop (shutting it down waits for the process to exit).
        replay = helper_process()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                replay, simulate_sample, gateway.serving.policy, proposed, sample
            )
        finally:
            await asyncio.to_thread(replay.shutdown)

    @router.get("/policy/versions", responses=STORE_ERRORS)
    async def policy_versions(
        limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 50,
    ) -> dict[str, Any]:
        """List stored policy versions, newest first, without their content."""
        stored = await asyncio.to_thread(versions.history, gateway.db, limit)
        active = await asyncio.to_thread(versions.active_version, gateway.db)
        return {"active": active, "versions": [v.summary() for v in stored]}

    @router.post(
        "/policy/rollback",
        responses={
            404: {"model": ErrorBody, "description": "No such version was ever stored."},
            422: {"model": PolicyErrors},
            **conflict("No version is active yet, or the active one is the first."),
            **STORE_ERRORS,
        },
    )
    async def rollback_policy(request: RollbackRequest) -> dict[str, Any]:
        """Serve a previous version's content again, stored as a new version."""
        applied = await asyncio.to_thread(
            rollback,
            gateway.db,
            author=request.author,
            version=request.version,
            message=request.message,
            access=gateway.access,
            precision_gate="override" if request.override_precision_gate else "check",
        )
        await gateway.policy_watcher.sync()
        stored = applied.version
        return {"version": stored.version, "restores": stored.restores, "changed": applied.changed}

    return router


STORE_ERRORS: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorBody, "description": "The policy versions cannot be read or written."}
}
NO_ACTIVE_VERSION = "No policy version is active yet, or the active one lacks the route."
ROLLOUT_START_CONFLICTS = (
    "The route has a rollout in progress or is not in the active policy, the candidate serves "
    "it first already, the judge's newest verdict is not promote (without force), or a "
    "shadow-only candidate has no passing precision check (without the override)."
)


def conflict(description: str) -> dict[int | str, dict[str, Any]]:
    """Describe a route's 409: what state of the gateway refuses a request its model accepts."""
    return {409: {"model": ErrorBody, "description": description}}


class AdminRequest(BaseModel):
    """A JSON body of the admin API, typed strictly: `"yes"` is no boolean, `"1"` no integer
    (and `1.0` is one, as JSON Schema says: `INTEGRAL`)."""

    model_config = ConfigDict(strict=True)


class PolicyProblem(BaseModel):
    """One error or warning in a policy: its field path, what is wrong, and where."""

    path: str
    message: str
    location: str


class PolicyErrors(BaseModel):
    """Why a policy was not applied."""

    errors: list[PolicyProblem]


class PolicyCandidate(AdminRequest):
    """A policy to check: its YAML text."""

    yaml: str = Field(
        min_length=1,
        description="The policy as YAML: a mapping of pools, slo_classes and routes "
        "(docs/policy.md).",
    )


class PolicyChange(PolicyCandidate):
    """A policy to apply, with why and by whom."""

    message: str = Field(min_length=1)
    author: str = "admin-api"
    override_precision_gate: bool = Field(
        default=False,
        description="Let a shadow-only pool go live without a passing precision check; the "
        "version's message records it.",
    )


class SimulateRequest(PolicyCandidate):
    """A proposed policy to replay the recorded traffic under."""

    days: float = Field(default=7, gt=0, le=90, description="How far back the traffic goes.")
    sample: Annotated[int, Field(ge=1, le=100_000), INTEGRAL] = Field(
        default=DEFAULT_SAMPLE,
        description="Replay at most about this many requests: whole windows of the period at its"
        " full load, each after a warm-up, drawn at random within strata of time; the answer's"
        " `sample` gives its size, the period's and its design, and each run's `intervals` the"
        " period's figures with their 95 % intervals.",
    )


class RollbackRequest(AdminRequest):
    """Which version to serve again (default: the one before the active version), and why."""

    version: Annotated[int, Field(ge=1, le=MAX_VERSION), INTEGRAL] | None = None
    message: str = ""
    author: str = "admin-api"
    override_precision_gate: bool = Field(
        default=False,
        description="Let a shadow-only pool the version has serve clients do so without a "
        "passing precision check; the new version's message records it.",
    )


class RolloutStop(AdminRequest):
    """A route whose rollout to take back."""

    route: str = Field(min_length=1)


class RolloutStart(AdminRequest):
    """A rollout to start: the route and the candidate pool to roll out on it."""

    route: str = Field(min_length=1)
    candidate: str = Field(min_length=1)
    force: bool = Field(default=False, description="Start without the judge's promote verdict.")
    override_precision_gate: bool = Field(
        default=False,
        description="Start a shadow-only candidate without a passing precision check; the "
        "rollout's policy version records it.",
    )


class ExplainRequest(AdminRequest):
    """A request to explain: its endpoint, JSON body and headers."""

    endpoint: Literal["chat", "completions", "embeddings"] = "chat"
    body: Any
    headers: dict[str, str] = {}


def install(app: FastAPI, gateway: OpsParts) -> None:
    """Mount the admin API on the ops app."""
    app.include_router(admin_router(gateway))
