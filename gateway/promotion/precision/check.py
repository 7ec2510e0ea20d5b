"""Running a precision check: its suite read, a healthy backend of each pool, the suite replayed.

`run` is the edge: it plans the check (gateway/promotion/precision/comparison.py), asks the
candidate once and the reference twice for every prompt, measures both pairs and hands the
outcomes to gateway/promotion/precision/figures.py. The result is returned, not stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from gateway.compare.answers import Answer, read_body
from gateway.compare.failures import CUT_SHORT, ERROR, TIMEOUT, failure
from gateway.compare.meaning import similarity, windows
from gateway.compare.measures import DEFAULT_COMPARATORS, MEASURES, compare
from gateway.errors import InvalidRequest
from gateway.policy.credentials import Access
from gateway.policy.definition import Backend, Policy
from gateway.promotion.departures import benign
from gateway.promotion.precision.comparison import DEFAULT_MAX_TOKENS, Suite, plan
from gateway.promotion.precision.figures import Outcome, Row, judge_check
from gateway.promotion.precision.labels import LABELS, states
from gateway.promotion.precision.limits import DEFAULT_LIMITS, Limits
from gateway.promotion.precision.retries import kept, pooled

TOP_LOGPROBS = 5


# The suite ---------------------------------------------------------------------------------


def read_suite(path: str | Path) -> Suite:
    """Read a suite file (JSON lines of chat bodies); raise InvalidRequest naming a bad line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"cannot read the suite {path}: {exc.strerror}") from exc
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the suite {path} is not UTF-8 text") from exc
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
    return Suite(str(path), tuple(bodies), hashlib.sha256(data).hexdigest())


def greedy(body: Mapping[str, Any]) -> dict[str, Any]:
    """Return the body as a check sends it: temperature 0, top-5 logprobs, one whole answer,
    without the suite's labels."""
    dropped = ("stream", "stream_options", "n", *LABELS)
    sent = {k: v for k, v in body.items() if k not in dropped}
    sent.update(temperature=0, logprobs=True, top_logprobs=TOP_LOGPROBS)
    if "max_tokens" not in sent and "max_completion_tokens" not in sent:
        sent["max_tokens"] = DEFAULT_MAX_TOKENS
    return sent


# Which backends ----------------------------------------------------------------------------


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


async def ask(
    client: httpx.AsyncClient, endpoint: Endpoint, path: str, body: Mapping[str, Any]
) -> Reply:
    """Send one request; return its answer, or an error in a few words."""
    try:
        response = await client.post(endpoint.url + path, json=body, headers=endpoint.headers)
    except httpx.TimeoutException:
        return Reply(None, TIMEOUT)
    except httpx.HTTPError as exc:
        return Reply(None, f"connection failed ({type(exc).__name__})")
    if response.status_code != 200:
        return Reply(None, f"HTTP {response.status_code}")
    answer = read_body(response.content)
    if not answer.readable:
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


async def measure_pair(
    client: httpx.AsyncClient,
    embedder: Endpoint | None,
    model: str | None,
    reference: Answer,
    other: Reply,
) -> tuple[Row, bool]:
    """Measure one answer against the reference's; return its row and whether embedding failed."""
    # An answer the client could not use (null, empty, cut short) fails as an error would, and
    # departs wherever pairs are counted (gateway/promotion/departures.py); one that never came
    # is a timeout, as the mirror records a copy that outlived its timeout.
    if other.answer is None:
        lost = TIMEOUT if other.error == TIMEOUT else ERROR
        return {**dict.fromkeys(MEASURES), "candidate_error": other.error, "failure": lost}, False
    kind = failure(None, other.answer, reference)
    diff = None
    if kind == CUT_SHORT:
        # A part that broke a near tie the other way, reading the model as the reference does,
        # writes its own answer from there: longer than max_tokens allows, or shorter than half
        # the reference's (Q6_K's one failure on a held-out suite: a question back where the
        # reference gave a recipe). Its length cannot say it was cut, so it departs
        # (`cut_after_tie`), counted against the departure rate and its limit, and does not
        # fail the request (docs/promotion.md, "Cut short after a benign flip").
        diff = compare(reference, other.answer, DEFAULT_COMPARATORS)
        if benign({"near_tie": diff.near_tie, "kl_divergence": diff.kl_divergence}):
            kind = None
    if kind is not None:
        row = {**dict.fromkeys(MEASURES), "candidate_error": f"{kind} answer", "failure": kind}
        return row, False
    cut_after_tie = diff is not None
    if diff is None:
        diff = compare(reference, other.answer, DEFAULT_COMPARATORS)
    failed = False
    if not diff.exact_match:
        diff.semantic_similarity, failed = await _semantic(
            client, embedder, model, reference, other.answer
        )
    row = {**{name: getattr(diff, name) for name in MEASURES}, "candidate_error": None}
    if cut_after_tie:
        row["cut_after_tie"] = True
    mine, theirs = reference.tokens, other.answer.tokens
    row["without_logprobs"] = not mine or not theirs
    # The same text split into other tokens: the two pools' tokenizers differ.
    row["tokens_differ"] = (
        bool(mine and theirs)
        and reference.text == other.answer.text
        and [t.token for t in mine] != [t.token for t in theirs]
    )
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
            if first.answer is None or first.answer.text is None:
                # Nothing to hold the candidate to: the prompt is left out.
                outcome.reference_error = first.error or "no answer in the response"
                return outcome
            outcome.candidate, failed = await measure_pair(
                client, embedder, embedding_model, first.answer, other
            )
            outcome.embedding_failed += failed
            expected = body.get("expected")
            if isinstance(expected, str):
                outcome.reference_right = states(first.answer.text or "", expected)
                outcome.candidate_right = other.answer is not None and states(
                    other.answer.text or "", expected
                )
            if isinstance(expected, str) and second.answer is not None:
                outcome.noise_right = states(second.answer.text or "", expected)
            if second.answer is not None:
                outcome.noise, failed = await measure_pair(
                    client, embedder, embedding_model, first.answer, second
                )
                outcome.embedding_failed += failed
            return outcome

    return list(await asyncio.gather(*(one(line, body) for line, body in suite.bodies)))


# The whole check ---------------------------------------------------------------------------


async def run(
    policy: Policy,
    access: Access,
    suite: Suite,
    pool: str,
    reference: str | None = None,
    *,
    embedding_model: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    concurrency: int = 8,
    timeout_s: float = 60.0,
    now: float | None = None,
    earlier: Sequence[Sequence[Outcome]] = (),
) -> dict[str, Any]:
    """Check `pool` against its reference on `suite`; return the result (not stored).

    `earlier` are the outcomes of the failed checks of the pool on this suite and reference
    since its last pass: the verdict is the pooled runs' (gateway/promotion/precision/retries.py).
    """
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
    judged = pooled([*earlier, outcomes]) if earlier else outcomes
    result = judge_check(chosen, suite, judged, limits)
    result["runs"] = len(earlier) + 1
    result["outcomes"] = kept(outcomes)
    result["ts"] = started
    result["checked_at"] = _iso(started)
    result["backends"] = {
        "candidate": ends[chosen.pool].url,
        "reference": ends[chosen.reference].url,
    }
    return result


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
