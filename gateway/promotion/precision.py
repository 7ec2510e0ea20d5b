"""Precision checks: a fixed prompt suite replayed on a candidate pool and a reference, judged.

Shadow evidence takes days to gather; a precision check answers in minutes whether a part's
numerics change what it says, before it serves anyone. Every body of a suite (JSON lines of
OpenAI chat requests) is sent at temperature 0 with logprobs to one backend of the candidate
pool and twice to one backend of the reference pool. The reference's second answer is the noise
floor: a bf16 GPU is nondeterministic too, so the candidate is held to how far the reference
strays from itself, not to exact agreement.

Each pair of answers is measured as shadow copies are (gateway/compare/measures.py, with the
semantic similarity of their windows on the fleet's embedding model, gateway/compare/meaning.py)
and a pair *departs* by the judge's rule (gateway/promotion/departures.py). The figures:

| figure | meaning |
| --- | --- |
| `top1_agreement` | share of compared prompts whose answers are identical |
| `mean_kl` | mean KL(reference ‖ candidate) per token up to the first difference (top-5) |
| `near_tie_share` | of the prompts that differ, the share whose first difference is a near tie |
| `harmful_share` | share of compared prompts whose answers depart in meaning |
| `noise_*` | the same between the reference's two answers |
| `ci` | 95% intervals (gateway/promotion/judge.py `bernoulli_interval`) |

The verdict is `pass` when the upper end of `harmful_share`'s interval exceeds the noise floor's
share by at most `max_harmful_share`, and at most `max_error_share` of the candidate's requests
failed. Every check is stored in `precision_checks`; a shadow-only pool goes live only when its
newest check passed (gateway/policy/apply.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from gateway import stats
from gateway.compare.answers import Answer, read_body
from gateway.compare.meaning import similarity, windows
from gateway.compare.measures import DEFAULT_COMPARATORS, compare
from gateway.db.schema import precision_checks
from gateway.errors import InvalidRequest
from gateway.policy.credentials import Access
from gateway.policy.model import Backend, Policy
from gateway.promotion.departures import compared, departs, tolerance
from gateway.promotion.judge import bernoulli_interval

PASS, FAIL = "pass", "fail"
ALPHA = 0.05  # the intervals are 95%
MAX_HARMFUL_SHARE = 0.03
MAX_ERROR_SHARE = 0.0
TOP_LOGPROBS = 5
# A suite line's labels (suites/facts.jsonl): what kind of question it is and its right answer.
# They describe the prompt and are never sent upstream.
LABELS = ("kind", "expected")
DEFAULT_MAX_TOKENS = 256
# What a check keeps of each pair in its result: the measures, never the answers' texts.
KEPT = ("exact_match", "similarity", "semantic_similarity", "near_tie", "kl_divergence")

Row = dict[str, Any]


# The suite ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Suite:
    """A prompt suite: chat request bodies, each with the line of the file it came from."""

    name: str
    bodies: tuple[tuple[int, dict[str, Any]], ...]

    @property
    def models(self) -> list[str]:
        """Return the models the suite's bodies name, in first-seen order."""
        return list(dict.fromkeys(body["model"] for _, body in self.bodies))


def read_suite(path: str | Path) -> Suite:
    """Read a suite file (JSON lines of chat bodies); raise InvalidRequest naming a bad line."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InvalidRequest(f"cannot read the suite {path}: {exc.strerror}") from exc
    bodies = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{path}:{number}: not a JSON line ({exc.msg})") from exc
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise InvalidRequest(f"{path}:{number}: a suite line is a chat body naming its model")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest(f"{path}:{number}: 'messages' must be a non-empty array")
        bodies.append((number, body))
    if not bodies:
        raise InvalidRequest(f"the suite {path} holds no prompts")
    return Suite(str(path), tuple(bodies))


def greedy(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return the body as a check sends it: temperature 0, top-5 logprobs, one whole answer,
    without the suite's labels."""
    dropped = ("stream", "stream_options", "n", *LABELS)
    sent = {k: v for k, v in body.items() if k not in dropped}
    sent.update(temperature=0, logprobs=True, top_logprobs=TOP_LOGPROBS)
    if "max_tokens" not in sent and "max_completion_tokens" not in sent:
        sent["max_tokens"] = DEFAULT_MAX_TOKENS
    return sent


# Which pools and backends ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """What a check compares: the candidate, the reference and the embedding model's pool."""

    pool: str
    reference: str
    embedding_model: str | None
    embedding_pool: str | None


def plan(
    policy: Policy,
    suite: Suite,
    pool: str,
    reference: str | None = None,
    embedding_model: str | None = None,
) -> Plan:
    """Choose the reference and the embedding model; raise InvalidRequest saying what is wrong.

    The reference defaults to the first live GPU pool that serves the suite's models; the
    embedding model to the first embedding model (`models:` of kind embedding) a live pool
    serves, embedded by the first live pool that serves it, as shadow comparisons are.
    """
    names = ", ".join(policy.pools)
    models = suite.models
    if pool not in policy.pools:
        raise InvalidRequest(f"the policy has no pool {pool!r} (pools: {names})", param="pool")
    missing = [m for m in models if m not in policy.pools[pool].models]
    if missing:
        raise InvalidRequest(
            f"pool {pool!r} does not serve {', '.join(missing)}, which {suite.name} asks for",
            param="pool",
        )
    if reference is None:
        reference = next(
            (
                name
                for name, spec in policy.pools.items()
                if spec.kind == "gpu" and spec.live and name != pool
                if all(m in spec.models for m in models)
            ),
            None,
        )
        if reference is None:
            raise InvalidRequest(
                f"no live gpu pool serves {', '.join(models)}: name the reference with "
                f"--reference (pools: {names})",
                param="reference",
            )
    elif reference not in policy.pools:
        raise InvalidRequest(
            f"the policy has no pool {reference!r} (pools: {names})", param="reference"
        )
    elif reference == pool:
        raise InvalidRequest(
            f"pool {pool!r} cannot be its own reference: its second answers are the noise floor",
            param="reference",
        )
    elif missing := [m for m in models if m not in policy.pools[reference].models]:
        raise InvalidRequest(
            f"reference pool {reference!r} does not serve {', '.join(missing)}",
            param="reference",
        )
    embedding_kinds = [m for m, spec in policy.models.items() if spec.kind == "embedding"]
    if embedding_model is None:
        embedding_model = next(
            (m for m in embedding_kinds if _embedding_pool(policy, m) is not None), None
        )
    embedding_pool = None if embedding_model is None else _embedding_pool(policy, embedding_model)
    if embedding_model is not None and embedding_pool is None:
        raise InvalidRequest(
            f"no live pool serves the embedding model {embedding_model!r}",
            param="embedding_model",
        )
    return Plan(pool, reference, embedding_model, embedding_pool)


def _embedding_pool(policy: Policy, model: str) -> str | None:
    return next((n for n, s in policy.pools.items() if s.live and model in s.models), None)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One backend a check sends to: its pool, its URL and the headers it takes."""

    pool: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)


def checked_access(policy: Policy, access: Access, pools: Iterable[str]) -> None:
    """Raise InvalidRequest when this shell may not reach a backend of `pools` with its key."""
    used = set(pools)
    found = [m for path, m in access.findings(policy, "in this shell") if path[1] in used]
    if found:
        raise InvalidRequest("cannot reach the pools to check:\n  " + "\n  ".join(found))


async def healthy_backend(
    client: httpx.AsyncClient, pool: str, backends: Sequence[Backend], access: Access
) -> Endpoint:
    """Return the first backend whose /health answers 200, as the gateway's probes ask it."""
    for backend in backends:
        headers = access.authorization(backend)
        try:
            response = await client.get(backend.url + "/health", headers=headers, timeout=5.0)
        except httpx.HTTPError:
            continue
        if response.status_code == 200:
            return Endpoint(pool, backend.url, headers)
    urls = ", ".join(b.url for b in backends)
    raise InvalidRequest(f"no backend of pool {pool!r} answers /health ({urls})", param="pool")


# Asking ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """A backend's answer to one request, or why there is none."""

    answer: Answer | None
    error: str | None = None


@dataclass(slots=True)
class Outcome:
    """What one prompt of the suite gave: the candidate's pair and the noise floor's pair."""

    line: int
    candidate: Row | None = None  # None: the reference did not answer, the prompt is left out
    noise: Row | None = None  # None: the reference's second answer failed
    reference_error: str | None = None
    embedding_failed: int = 0


async def ask(
    client: httpx.AsyncClient, endpoint: Endpoint, path: str, body: Mapping[str, Any]
) -> Reply:
    """Send one request; return its answer, or an error in a few words."""
    try:
        response = await client.post(endpoint.url + path, json=body, headers=endpoint.headers)
    except httpx.TimeoutException:
        return Reply(None, "timeout")
    except httpx.HTTPError as exc:
        return Reply(None, f"connection failed ({type(exc).__name__})")
    if response.status_code != 200:
        return Reply(None, f"HTTP {response.status_code}")
    answer = read_body(response.content)
    if answer.text is None and not answer.tool_calls and not answer.embeddings:
        return Reply(None, "no answer in the response")
    return Reply(answer)


async def _semantic(
    client: httpx.AsyncClient,
    embedder: Endpoint | None,
    model: str | None,
    first: Answer,
    second: Answer,
) -> tuple[float | None, bool]:
    """Return the answers' semantic similarity (None if not measured) and whether it failed."""
    if embedder is None or model is None or first.text is None or second.text is None:
        return None, False
    a, b = windows(first.text), windows(second.text)
    reply = await ask(client, embedder, "/v1/embeddings", {"model": model, "input": a + b})
    vectors = reply.answer.embeddings if reply.answer is not None else ()
    if len(vectors) != len(a) + len(b):
        return None, True
    return similarity(vectors[: len(a)], vectors[len(a) :]), False


async def _pair(
    client: httpx.AsyncClient,
    embedder: Endpoint | None,
    model: str | None,
    reference: Answer,
    other: Reply,
) -> tuple[Row, bool]:
    """Measure one answer against the reference's; return its row and whether embedding failed."""
    if other.answer is None:
        return {**dict.fromkeys(KEPT), "json_diff": None, "candidate_error": other.error}, False
    diff = compare(reference, other.answer, DEFAULT_COMPARATORS)
    semantic, failed = (None, False)
    if not diff.exact_match:
        semantic, failed = await _semantic(client, embedder, model, reference, other.answer)
    row = {
        "exact_match": diff.exact_match,
        "similarity": diff.similarity,
        "near_tie": diff.near_tie,
        "json_diff": diff.json_diff,
        "embedding_cosine": diff.embedding_cosine,
        "semantic_similarity": semantic,
        "kl_divergence": diff.kl_divergence,
        "candidate_error": None,
    }
    return row, failed


async def replay(
    suite: Suite,
    candidate: Endpoint,
    reference: Endpoint,
    embedder: Endpoint | None = None,
    embedding_model: str | None = None,
    *,
    client: httpx.AsyncClient,
    concurrency: int = 8,
) -> list[Outcome]:
    """Ask the candidate once and the reference twice per prompt; measure both pairs."""
    gate = asyncio.Semaphore(concurrency)

    async def one(line: int, body: dict[str, Any]) -> Outcome:
        async with gate:
            sent = greedy(body)
            path = "/v1/chat/completions"
            first, second, other = await asyncio.gather(
                ask(client, reference, path, sent),
                ask(client, reference, path, sent),
                ask(client, candidate, path, sent),
            )
            outcome = Outcome(line)
            if first.answer is None:
                outcome.reference_error = first.error
                return outcome
            outcome.candidate, failed = await _pair(
                client, embedder, embedding_model, first.answer, other
            )
            outcome.embedding_failed += failed
            if second.answer is not None:
                outcome.noise, failed = await _pair(
                    client, embedder, embedding_model, first.answer, second
                )
                outcome.embedding_failed += failed
            return outcome

    return list(await asyncio.gather(*(one(line, body) for line, body in suite.bodies)))


# Judging: pure -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """What a check allows: departures beyond the noise floor's, and failed requests."""

    max_harmful_share: float = MAX_HARMFUL_SHARE
    max_error_share: float = MAX_ERROR_SHARE
    alpha: float = ALPHA


def judge_check(
    plan: Plan, suite: Suite, outcomes: Sequence[Outcome], limits: Limits = Limits()
) -> dict[str, Any]:
    """Fold a suite's outcomes into the check's figures, verdict and reasons."""
    answered = [(o.line, o.candidate) for o in outcomes if o.candidate is not None]
    failed = [(line, r["candidate_error"]) for line, r in answered if r.get("candidate_error")]
    pairs = [(line, r) for line, r in answered if compared(r)]
    noise = [o.noise for o in outcomes if o.noise is not None and compared(o.noise)]
    tol = tolerance(noise)
    departing = [(line, r) for line, r in pairs if departs(r, tol)]
    noise_departing = sum(departs(r, tol) for r in noise)
    n, k = len(pairs), len(departing)
    exact = sum(bool(r.get("exact_match")) for _, r in pairs)
    harmful_ci = bernoulli_interval(k, n, limits.alpha)
    noise_harmful = noise_departing / len(noise) if noise else 0.0
    error_share = len(failed) / len(answered) if answered else 0.0
    departs_ok = n > 0 and harmful_ci[1] - noise_harmful <= limits.max_harmful_share + 1e-12
    errors_ok = error_share <= limits.max_error_share + 1e-12
    result: dict[str, Any] = {
        "pool": plan.pool,
        "reference": plan.reference,
        "suite": suite.name,
        "models": suite.models,
        "prompts": len(suite.bodies),
        "compared": n,
        "candidate_errors": len(failed),
        "reference_errors": len(outcomes) - len(answered),
        "top1_agreement": exact / n if n else None,
        "mean_kl": stats.mean([r for _, r in pairs], "kl_divergence"),
        # Of the answers that differ, the share whose first difference is a near tie.
        "near_tie_share": stats.share(
            [r for _, r in pairs if r.get("exact_match") is False], "near_tie"
        ),
        "harmful_share": k / n if n else None,
        "noise_pairs": len(noise),
        "noise_top1_agreement": (
            sum(bool(r.get("exact_match")) for r in noise) / len(noise) if noise else None
        ),
        "noise_mean_kl": stats.mean(noise, "kl_divergence"),
        "noise_harmful_share": noise_departing / len(noise) if noise else None,
        "ci": {
            "level": 1 - limits.alpha,
            "top1_agreement": list(bernoulli_interval(exact, n, limits.alpha)),
            "harmful_share": list(harmful_ci),
        },
        "tolerance": {"meaning": tol.meaning, "words": tol.words, "noise_pairs": tol.noise_pairs},
        "limits": {
            "max_harmful_share": limits.max_harmful_share,
            "max_error_share": limits.max_error_share,
        },
        "embedding_model": plan.embedding_model,
        "embeddings_failed": sum(o.embedding_failed for o in outcomes),
        "verdict": PASS if departs_ok and errors_ok else FAIL,
        "reasons": [],
        "departures": [{"line": line, **_kept(r)} for line, r in departing],
        "errors": [{"line": line, "error": error} for line, error in failed],
    }
    result["reasons"] = reasons(result, departs_ok, errors_ok, limits.alpha)
    return result


def reasons(
    result: Mapping[str, Any], departs_ok: bool, errors_ok: bool, alpha: float = ALPHA
) -> list[str]:
    """Say in sentences why a check passed or failed, with its numbers."""
    said = []
    n, limit = result["compared"], result["limits"]["max_harmful_share"]
    if n == 0:
        said.append(
            "No answer of the candidate could be compared with the reference's, so nothing "
            "shows that it answers alike."
        )
    else:
        k = len(result["departures"])
        low, high = result["ci"]["harmful_share"]
        floor = result["noise_harmful_share"] or 0.0
        noise_k = round(floor * result["noise_pairs"])
        said.append(
            f"{k} of {n} answers ({_pct(k / n)}, {1 - alpha:.0%} interval {_pct(low)} to "
            f"{_pct(high)}) depart in meaning from the reference's, and {noise_k} of "
            f"{result['noise_pairs']} ({_pct(floor)}) of the reference's own second answers do: "
            f"the interval's upper end is {_points(high - floor)} above the reference's share, "
            f"at most {_points(limit)} allowed."
        )
        reach = bernoulli_interval(0, n, alpha)[1]
        if not departs_ok and reach - floor > limit:
            said.append(
                f"No pool can pass on {n} compared prompts: even with no departure the interval "
                f"reaches {_pct(reach)}; a suite needs at least "
                f"{prompts_needed(limit + floor, alpha)} prompts to show at most "
                f"{_points(limit)} more."
            )
    if not errors_ok or result["candidate_errors"]:
        asked = result["prompts"] - result["reference_errors"]
        kinds = Counter(e["error"] for e in result["errors"])
        listed = ", ".join(f"{error} ×{count}" for error, count in kinds.most_common())
        allowed = f"{result['limits']['max_error_share']:.1%}"
        said.append(
            f"{result['candidate_errors']} of {asked} requests to the candidate failed "
            f"({listed}); at most {allowed} allowed."
        )
    if result["reference_errors"]:
        said.append(
            f"The reference failed {result['reference_errors']} of {result['prompts']} prompts; "
            "they were left out."
        )
    if result["embedding_model"] is None:
        said.append(
            "No live pool serves an embedding model, so answers were judged on their words: a "
            "wrong fact after a near-tie flip goes unseen (name one with --embedding-model)."
        )
    elif result["embeddings_failed"]:
        said.append(
            f"{result['embeddings_failed']} pairs could not be embedded with "
            f"{result['embedding_model']} and were judged on their words."
        )
    return said


def prompts_needed(limit: float, alpha: float = ALPHA) -> int:
    """Return the fewest prompts whose interval, with no departure, ends at or below `limit`."""
    if limit >= 1:
        return 1
    low, high = 1, 1
    while bernoulli_interval(0, high, alpha)[1] > limit:
        low, high = high, high * 2
    while low < high:
        mid = (low + high) // 2
        if bernoulli_interval(0, mid, alpha)[1] > limit:
            low = mid + 1
        else:
            high = mid
    return high


def _kept(row: Mapping[str, Any]) -> dict[str, Any]:
    kept = {name: row.get(name) for name in KEPT}
    kept["json_diff"] = row.get("json_diff")
    return kept


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _points(value: float) -> str:
    return f"{value * 100:.3g} points"


# The whole check ---------------------------------------------------------------------------


async def run(
    policy: Policy,
    access: Access,
    suite: Suite,
    pool: str,
    reference: str | None = None,
    *,
    embedding_model: str | None = None,
    limits: Limits = Limits(),
    concurrency: int = 8,
    timeout_s: float = 60.0,
    now: float | None = None,
) -> dict[str, Any]:
    """Check `pool` against its reference on `suite`; return the result (not stored)."""
    chosen = plan(policy, suite, pool, reference, embedding_model)
    used = [
        chosen.pool,
        chosen.reference,
        *([chosen.embedding_pool] if chosen.embedding_pool else []),
    ]
    checked_access(policy, access, used)
    started = time.time() if now is None else now
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        ends = {
            name: await healthy_backend(client, name, policy.pools[name].backends, access)
            for name in dict.fromkeys(used)
        }
        outcomes = await replay(
            suite,
            ends[chosen.pool],
            ends[chosen.reference],
            ends.get(chosen.embedding_pool or ""),
            chosen.embedding_model,
            client=client,
            concurrency=concurrency,
        )
    result = judge_check(chosen, suite, outcomes, limits)
    result["ts"] = started
    result["checked_at"] = _iso(started)
    result["backends"] = {
        "candidate": ends[chosen.pool].url,
        "reference": ends[chosen.reference].url,
    }
    return result


# Stored checks -----------------------------------------------------------------------------


def store(engine: sa.Engine, result: Mapping[str, Any]) -> int:
    """Keep a check's result in `precision_checks`; return its id."""
    with engine.begin() as conn:
        inserted = conn.execute(
            precision_checks.insert().values(
                ts=result["ts"],
                pool=result["pool"],
                reference=result["reference"],
                suite=result["suite"],
                verdict=result["verdict"],
                result=json.dumps(result, allow_nan=False),
            )
        )
    key = inserted.inserted_primary_key
    return int(key[0]) if key else 0


def newest(engine: sa.Engine, until: float | None = None) -> list[dict[str, Any]]:
    """Return each pool's newest stored check (before `until`), by pool name."""
    c = precision_checks.c
    last = sa.select(c.pool, sa.func.max(c.id).label("id")).group_by(c.pool)
    if until is not None:
        last = last.where(c.ts < until)
    latest = last.subquery()
    query = sa.select(c.result).join(latest, c.id == latest.c.id).order_by(c.pool)
    with engine.connect() as conn:
        return [json.loads(row.result) for row in conn.execute(query)]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
