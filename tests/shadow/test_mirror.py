"""Mirror: which requests are copied, the budgets that drop copies, and copies end to end."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa
from llamacpp import llama_server
from shadowworld import PROMPT, drop_counts, settle, shadow_policy, shadow_rows
from threadserver import serving
from waiting import wait_for

from gateway.compare.answers import Answer
from gateway.compare.measures import COMPARATORS, comparator, compare, tokens
from gateway.db.connection import connect, upgrade
from gateway.exchange import Exchange
from gateway.fleet.state import Fleet
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import SemanticSimilarity
from gateway.policy.load import parse_policy, to_yaml
from gateway.promotion.departures import at_risk
from gateway.routing.classify import RequestProfile
from gateway.routing.router import RouteDecision
from gateway.shadow.mirror import Mirror, copy_body
from gateway.shadow.records import ShadowWriter
from gateway.shadow.sample import ShadowPlan, sample, stable_fraction
from gateway.shadow.semantic import Embedder
from harness.gateways import run_gateway
from harness.metrics import metric_value, parse_metrics
from harness.simulators import start_simulator
from policies import EMBED, MODEL


def profile(prompt_tokens: int = 100, tenant: str = "anonymous", **kw: object) -> RequestProfile:
    fields: dict = {
        "endpoint": "chat",
        "model": MODEL,
        "prompt_tokens": prompt_tokens,
        "max_tokens": 64,
        "slo_class": "interactive",
        "ttft_ms": None,
        "tpot_ms": None,
        "e2e_ms": None,
        "tenant": tenant,
        "stream": False,
    }
    fields.update(kw)
    return RequestProfile(**fields)


# Budgets without a network ----------------------------------------------------------------


def served_exchange(policy, fleet: Fleet) -> Exchange:
    backend = fleet.pools["gpu"].backends[0]
    ex = Exchange(uuid.uuid4().hex, "chat", 0.0, 0.0, model=MODEL)
    ex.profile = profile()
    ex.decision = RouteDecision(policy.routes[0], backend)
    ex.backend, ex.status, ex.captured = backend, 200, [b'{"choices": []}']
    return ex


def planned(ex: Exchange, policy) -> tuple[ShadowPlan, ...]:
    assert ex.profile is not None
    return sample(ex.profile, policy.routes[0], policy, ex.decision_id)


def test_a_full_queue_drops_and_counts_instead_of_growing(tmp_path: Path) -> None:
    policy = shadow_policy(["http://g:1"], ["http://a:2"], ["http://c:3"])
    fleet, metrics = Fleet(policy), GatewayMetrics()
    db = connect(f"sqlite:///{tmp_path / 'x.db'}")
    writer = ShadowWriter(db, metrics)
    # Not started: nothing takes copies off the queue, as with every worker stuck.
    mirror = Mirror(None, None, metrics, writer, lambda: fleet, None, max_pending=3)  # type: ignore[arg-type]
    for _ in range(10):
        ex = served_exchange(policy, fleet)
        mirror.submit(ex, b"{}", policy, planned(ex, policy))
    dropped = metrics.registry.get_sample_value(
        "gateway_shadow_dropped_total",
        {"route": "chat", "candidate": "cim", "kind": "candidate", "reason": "queue_full"},
    )
    assert (mirror.pending, dropped) == (3, 7)


def test_the_queue_also_holds_at_most_its_byte_budget(tmp_path: Path) -> None:
    policy = shadow_policy(["http://g:1"], ["http://a:2"], ["http://c:3"])
    fleet, metrics = Fleet(policy), GatewayMetrics()
    writer = ShadowWriter(connect(f"sqlite:///{tmp_path / 'x.db'}"), metrics)
    mirror = Mirror(None, None, metrics, writer, lambda: fleet, None, max_pending_bytes=10_000)  # type: ignore[arg-type]
    for _ in range(10):
        ex = served_exchange(policy, fleet)
        mirror.submit(ex, b"x" * 3000, policy, planned(ex, policy))
    assert mirror.pending == 3


def test_a_copy_the_primary_counted_too_long_for_the_candidate_is_dropped(tmp_path: Path) -> None:
    # Sampling saw the estimate (3,900 + 64 output tokens, within CIM's 4,096); the primary's
    # backend then counted 4,100 prompt tokens, which no copy to CIM could hold.
    policy = shadow_policy(["http://g:1"], ["http://a:2"], ["http://c:3"])
    fleet, metrics = Fleet(policy), GatewayMetrics()
    writer = ShadowWriter(connect(f"sqlite:///{tmp_path / 'x.db'}"), metrics)
    mirror = Mirror(None, None, metrics, writer, lambda: fleet, None)  # type: ignore[arg-type]
    for counted, queued in ((4_100, 0), (3_000, 1), (None, 2)):
        ex = served_exchange(policy, fleet)
        ex.profile = profile(prompt_tokens=3_900)
        plans = planned(ex, policy)
        assert plans, "the estimate fits: the copy is planned"
        ex.prompt_tokens = counted
        mirror.submit(ex, b"{}", policy, plans)
        assert mirror.pending == queued
    dropped = metrics.registry.get_sample_value(
        "gateway_shadow_dropped_total",
        {"route": "chat", "candidate": "cim", "kind": "candidate", "reason": "context"},
    )
    assert dropped == 1


def test_drops_are_written_as_counts_per_minute(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    upgrade(url)
    db, metrics = connect(url), GatewayMetrics()
    writer = ShadowWriter(db, metrics, wall=lambda: 120.5)
    for _ in range(5):
        writer.count_drop("chat", "cim", "candidate", "rate")
    asyncio.run(writer.flush())
    with db.connect() as conn:
        rows = conn.execute(sa.text("select ts, reason, count from shadow_drops")).all()
    assert [tuple(r) for r in rows] == [(120.0, "rate", 5)]


def test_a_copy_asks_for_logprobs_only_where_the_client_asked_none() -> None:
    chat = orjson.dumps({"model": MODEL, "messages": [], "temperature": 0})
    assert orjson.loads(copy_body("chat", chat, 5)) == {
        **orjson.loads(chat),
        "logprobs": True,
        "top_logprobs": 5,
    }
    asked = orjson.dumps({"model": MODEL, "messages": [], "logprobs": True, "top_logprobs": 2})
    assert copy_body("chat", asked, 5) == asked
    legacy = orjson.dumps({"model": MODEL, "prompt": "x"})
    assert orjson.loads(copy_body("completions", legacy, 8))["logprobs"] == 5
    embeddings = orjson.dumps({"model": EMBED, "input": "x"})
    assert copy_body("embeddings", embeddings, 5) == embeddings
    assert copy_body("chat", chat, 0) == chat
    assert copy_body("chat", b"not json", 5) == b"not json"


def test_embeddings_for_meaning_keep_to_their_budget() -> None:
    policy = shadow_policy(["http://g:1"], ["http://a:2"], ["http://c:3"])
    fleet, metrics = Fleet(policy), GatewayMetrics()
    now = [0.0]
    embedder = Embedder(None, None, metrics, lambda: fleet, clock=lambda: now[0])  # type: ignore[arg-type]
    unknown = SemanticSimilarity(model="no-such-model", max_per_second=1)
    # Within budget, but no live pool serves the model: nothing is sent, the pair keeps none.
    assert asyncio.run(embedder.similarity(unknown, "a", "b")) is None
    # The budget's one token is spent: the next pair in the same second is not embedded.
    assert asyncio.run(embedder.similarity(unknown, "a", "b")) is None
    outcomes = {
        outcome: metrics.registry.get_sample_value(
            "gateway_shadow_embeddings_total", {"model": "no-such-model", "outcome": outcome}
        )
        for outcome in ("no_backend", "over_budget", "measured")
    }
    assert outcomes == {"no_backend": 1.0, "over_budget": 1.0, "measured": None}


# End to end, with simulators --------------------------------------------------------------


@pytest.fixture(scope="module")
def deviant_cim() -> Iterator:
    """A CIM part that gets a fact wrong in every answer: each departs from the reference."""
    with start_simulator("cim", seed=11, extra_args=["--harmful-rate", "1"]) as sim:
        yield sim


def test_candidate_and_noise_records_carry_correct_diffs(sims, deviant_cim, tmp_path) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), [deviant_cim.url], noise=1.0)
    with run_gateway(policy, tmp_path) as gw:
        client = gw.client()
        answers = {}
        for i in range(4):
            prompt = [{"role": "user", "content": f"Question {i} about analog arrays."}]
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=prompt, max_tokens=40, temperature=0
            )
            answers[raw.headers["x-gateway-decision-id"]] = raw.parse().choices[0].message.content
        rows = shadow_rows(gw, 8)
        requests = gw.records(4)
        samples = parse_metrics(gw.http().get("/metrics").text)
    candidates = [r for r in rows if r["kind"] == "candidate"]
    noise = [r for r in rows if r["kind"] == "noise"]
    assert len(candidates) == len(noise) == 4
    # A candidate that never matched shows a match rate of 0, not a gap in the graph.
    matches = {
        labels["kind"]: value
        for name, labels, value in samples
        if name == "gateway_shadow_exact_matches_total"
    }
    assert matches == {"candidate": 0.0, "noise": 4.0}
    # Shadows stay out of the client's accounting: one request record per client request.
    assert len(requests) == 4
    for row in rows:
        assert row["primary_text"] == answers[row["decision_id"]]
        assert row["primary_status"] == row["candidate_status"] == 200
        assert row["temperature"] == 0 and row["sampled"] is False
        expected = compare(Answer(text=row["primary_text"]), Answer(text=row["candidate_text"]))
        assert (
            row["exact_match"],
            row["similarity"],
            row["first_divergence"],
            row["reference_words"],
        ) == (
            expected.exact_match,
            expected.similarity,
            expected.first_divergence,
            len(tokens(row["primary_text"])),
        )
        assert row["candidate_e2e_ms"] > 0 and row["primary_e2e_ms"] > 0
    for row in candidates:
        assert (row["candidate_pool"], row["candidate_backend"]) == ("cim", "cim-0")
        assert row["exact_match"] is False and row["similarity"] < 1
        primary, candidate = tokens(row["primary_text"]), tokens(row["candidate_text"])
        at = row["first_divergence"]
        assert primary[:at] == candidate[:at] and primary[at] != candidate[at]
        # The judge counts the words up to and including the first that differs as at risk.
        assert at_risk(row) == at + 1
    for row in noise:
        # A/A on the GPU pool: another backend than the primary's, same answer at temperature 0.
        assert row["candidate_pool"] == row["primary_pool"] == "gpu"
        assert row["candidate_backend"] != row["primary_backend"]
        assert row["exact_match"] is True and row["similarity"] == 1.0
        assert at_risk(row) == len(tokens(row["primary_text"])) > 0  # every word was at risk


def test_copies_ask_for_logprobs_and_differing_pairs_are_embedded_for_meaning(
    sims, deviant_cim, tmp_path
) -> None:
    # A budget no burst reaches: on a busy machine the comparisons can finish together, and
    # the default (2 at once) would leave some unmeasured; the budget has tests of its own.
    roomy = {"model": EMBED, "max_per_second": 1000, "max_concurrent": 64}
    compare = {"store_text": True, "semantic_similarity": roomy}
    policy = shadow_policy(
        sims.urls("gpu"), sims.urls("asic"), [deviant_cim.url], compare=compare, noise=1.0
    )
    with run_gateway(policy, tmp_path) as gw:
        client = gw.client()
        for i in range(4):
            answer = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Facts {i} about analog arrays."}],
                max_tokens=60,
                temperature=0,
            )
            assert answer.choices[0].logprobs is None  # the client asked none, and got none
        rows = shadow_rows(gw, 8)
        samples = parse_metrics(gw.http().get("/metrics").text)
    candidates = [r for r in rows if r["kind"] == "candidate"]
    noise = [r for r in rows if r["kind"] == "noise"]
    assert len(candidates) == len(noise) == 4
    for row in candidates:
        # Every CIM answer here has a wrong fact: the copy's logprobs place its first
        # difference, and the embeddings see the meaning change.
        assert row["exact_match"] is False and row["token_divergence"] is not None
        assert row["near_tie"] is not None
        assert row["semantic_similarity"] is not None and row["semantic_similarity"] < 0.98
    for row in noise:
        # Two GPU answers: exact, or near-tie flips that mean the same.
        if row["exact_match"]:
            assert row["semantic_similarity"] is None and row["token_divergence"] is None
        else:
            assert row["near_tie"] is True and row["semantic_similarity"] > 0.99
    measured = sum(
        value
        for name, labels, value in samples
        if name == "gateway_shadow_embeddings_total" and labels["outcome"] == "measured"
    )
    assert measured == 4 + sum(not r["exact_match"] for r in noise)


def test_streamed_primary_is_captured_as_it_is_relayed(sims, tmp_path: Path) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), noise=1.0)
    with run_gateway(policy, tmp_path) as gw:
        stream = gw.client().chat.completions.create(
            model=MODEL, messages=PROMPT, max_tokens=60, temperature=0.7, seed=3, stream=True
        )
        relayed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        rows = shadow_rows(gw, 2)
    assert len(rows) == 2
    for row in rows:
        assert row["stream"] is True and row["primary_text"] == relayed
        assert row["candidate_ttft_ms"] > 0 and row["primary_ttft_ms"] > 0
        assert row["candidate_completion_tokens"] > 0
        assert (row["temperature"], row["seeded"], row["sampled"]) == (0.7, True, True)
    noise = next(r for r in rows if r["kind"] == "noise")
    # Same seed, same pool: the sampled answers agree, which the noise floor should show.
    assert noise["exact_match"] is True


def test_exactly_the_requests_the_hash_picks_are_copied(sims, tmp_path: Path) -> None:
    rate = 0.3
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), rate=rate)
    with run_gateway(policy, tmp_path) as gw:
        client = gw.client()
        ids = [
            client.chat.completions.with_raw_response.create(
                model=MODEL, messages=PROMPT, max_tokens=4, temperature=0
            ).headers["x-gateway-decision-id"]
            for _ in range(40)
        ]
        chosen = {i for i in ids if stable_fraction(i, "cim") < rate}
        settle(gw)
        rows = shadow_rows(gw, len(chosen))
        drops = drop_counts(gw)
    # Decision ids are random: none of 40 picked at 30% has a chance of 0.7**40 = 6.4e-7.
    assert chosen and len(chosen) < len(ids) and drops == {}
    assert {r["decision_id"] for r in rows} == chosen


@pytest.mark.parametrize(
    ("budget", "held", "reason"),
    [
        ({"max_concurrent": 2, "max_slot_share": 1.0}, 2, "concurrency"),
        ({"max_concurrent": 4, "max_slot_share": 0.25}, 1, "no_slot"),  # 1 of the 4 CIM slots
    ],
)
def test_hanging_candidate_never_holds_up_the_client_and_extra_copies_drop(
    sims, tmp_path: Path, budget: dict, held: int, reason: str
) -> None:
    sims.cim[0].set_faults(hang=True)
    policy = shadow_policy(
        sims.urls("gpu"),
        sims.urls("asic"),
        sims.urls("cim"),
        budget={"max_per_second": 1000, **budget},
        # The six answers come long before the copies' timeout, however busy the machine.
        timeout_s=5,
    )
    with run_gateway(policy, tmp_path) as gw:
        client = gw.client()
        answers = [
            client.chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=20, temperature=0
            )
            .choices[0]
            .message.content
            for _ in range(6)
        ]
        # Every client has its answer while the copies still hang: nobody waited for them.
        cim = gw.gateway.fleet.pools["cim"].backends[0]

        def hanging() -> tuple[int, int]:
            return gw.gateway.mirror.in_flight, cim.in_flight

        # The last copies may still be on their way out: wait for them, not for the timeout.
        wait_for(lambda: hanging() == (held, held), message=lambda: f"in flight: {hanging()}")
        assert drop_counts(gw, 6 - held) == {reason: 6 - held}
        settle(gw)
        rows = shadow_rows(gw, held)
        # The timeout cut the copies and gave their slots back.
        wait_for(lambda: cim.in_flight == 0, message=lambda: f"{cim.in_flight} slots still held")
        metrics = gw.http().get("/metrics").text
    assert len(set(answers)) == 1 and answers[0]
    assert [r["candidate_error"] for r in rows] == ["upstream_timeout"] * held
    assert all(r["candidate_status"] is None for r in rows)
    assert metric_value(metrics, "gateway_shadow_sent_total", candidate="cim") == held
    assert metric_value(metrics, "gateway_shadow_failed_total", code="upstream_timeout") == held
    assert metric_value(metrics, "gateway_shadow_dropped_total", reason=reason) == 6 - held


class RecordingUpstream(BaseHTTPRequestHandler):
    """A minimal OpenAI-style backend that remembers every request and can fail on purpose."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the gateway's pooled client expects

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.seen.append((dict(self.headers.items()), body))  # type: ignore[attr-defined]
        status = self.server.status  # type: ignore[attr-defined]
        answer = orjson.dumps(
            {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            }
            if status == 200
            else {"error": {"message": "broken", "type": "api_error"}}
        )
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def recording_upstream(status: int) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingUpstream)
    server.seen, server.status = [], status  # type: ignore[attr-defined]
    with serving(server):
        yield server


def test_failing_candidate_gets_each_copy_once_marked_and_unchanged(sims, tmp_path: Path) -> None:
    with recording_upstream(500) as upstream:
        url = f"http://127.0.0.1:{upstream.server_address[1]}"
        policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), [url])
        body = orjson.dumps(
            {"model": MODEL, "messages": PROMPT, "max_tokens": 5, "temperature": 0.9, "top_p": 0.5}
        )
        with run_gateway(policy, tmp_path) as gw, gw.http() as http:
            responses = [
                http.post(
                    "/v1/chat/completions",
                    content=body,
                    headers={"content-type": "application/json"},
                )
                for _ in range(3)
            ]
            rows = shadow_rows(gw, 3)
            backend = gw.gateway.fleet.pools["cim"].backends[0]
            ejected = backend.ejected
    assert [r.status_code for r in responses] == [200] * 3
    assert {r.headers["x-gateway-pool"] for r in responses} == {"gpu"}
    # Never retried, never sent elsewhere: one attempt per copy, to the candidate only.
    assert len(upstream.seen) == 3
    for headers, received in upstream.seen:
        assert headers["x-gateway-shadow"] == "1"
        # Sampling parameters and all, plus the logprobs every copy asks for.
        assert orjson.loads(received) == {
            **orjson.loads(body),
            "logprobs": True,
            "top_logprobs": 5,
        }
    assert [(r["candidate_status"], r["candidate_error"]) for r in rows] == [
        (500, "upstream_error")
    ] * 3
    assert all((r["temperature"], r["top_p"], r["sampled"]) == (0.9, 0.5, True) for r in rows)
    assert not ejected  # a candidate's failures never touch the live fleet's health


def test_a_copy_is_bounded_by_the_answer_byte_limit_and_the_deadline(sims, tmp_path: Path) -> None:
    """A copy asks for logprobs, so its answer is many times the client's: past the byte limit
    it fails alone; a candidate streaming steadily past the deadline is cut there."""
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), deadline_s=1.0)
    chat = {
        "model": MODEL,
        "messages": PROMPT,
        "max_tokens": 200,
        "extra_body": {"ignore_eos": True},
    }
    for world in ("bytes", "deadline"):
        (tmp_path / world).mkdir()
    with run_gateway(policy, tmp_path / "bytes", max_answer_bytes=16384) as gw:
        answer = gw.client().chat.completions.create(**chat)
        assert answer.choices[0].message.content
        (too_big,) = shadow_rows(gw, 1)
    sims.cim[0].set_faults(slow_factor=500)  # a token every ~15 ms, for ~3 s in all
    with run_gateway(policy, tmp_path / "deadline") as gw:
        streamed = gw.client().chat.completions.create(**chat, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        (cut,) = shadow_rows(gw, 1)
    assert (too_big["candidate_status"], too_big["candidate_error"]) == (200, "upstream_error")
    assert (cut["candidate_status"], cut["candidate_error"]) == (200, "upstream_timeout")


def test_a_single_backend_pool_is_asked_again_for_its_noise_floor(sims, tmp_path: Path) -> None:
    (asic,) = sims.asic
    policy = shadow_policy(
        sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), pools=("asic",), noise=1.0
    )
    answered = asic.metric("sim_requests_total", status="200")
    with run_gateway(policy, tmp_path) as gw:
        client = gw.client()
        served = [
            client.chat.completions.with_raw_response.create(
                model=MODEL, messages=PROMPT, max_tokens=8, temperature=temperature
            ).headers["x-gateway-pool"]
            for temperature in (0, 0.8)
        ]
        rows = shadow_rows(gw, 4)
        settle(gw)
        drops = drop_counts(gw)
    assert served == ["asic", "asic"] and drops == {}
    noise = [r for r in rows if r["kind"] == "noise"]
    assert sorted(r["sampled"] for r in noise) == [False, True]
    for row in noise:
        # The ASIC has one backend: the one that served the primary answers the copy too.
        assert (row["primary_pool"], row["primary_backend"]) == ("asic", "asic-0")
        assert (row["candidate_pool"], row["candidate_backend"]) == ("asic", "asic-0")
        assert (row["candidate_status"], row["candidate_error"]) == (200, None)
        assert row["exact_match"] is not None
    # Two primaries and their two noise copies; the candidate copies went to the CIM part.
    wait_for(
        lambda: asic.metric("sim_requests_total", status="200") - answered == 4,
        message=lambda: f"{asic.metric('sim_requests_total', status='200') - answered} answers",
    )


def test_a_noise_copy_asks_the_same_backend_while_the_others_are_ejected(
    sims, tmp_path: Path
) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), noise=1.0)
    with run_gateway(policy, tmp_path) as gw:
        gpu = gw.gateway.fleet.pools["gpu"].backends
        gw.gateway.outliers.eject(gpu[1], 3600)  # out for the whole test
        for _ in range(2):
            gw.client().chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=4, temperature=0
            )
        rows = shadow_rows(gw, 4)
        drops = drop_counts(gw)
    noise = [r for r in rows if r["kind"] == "noise"]
    assert drops == {} and len(noise) == 2
    assert {(r["primary_backend"], r["candidate_backend"]) for r in noise} == {("gpu-0", "gpu-0")}


def test_a_failed_primary_is_not_copied(sims, tmp_path: Path) -> None:
    for sim in sims.gpu:
        sim.set_faults(error_rate=1.0)
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path) as gw, gw.http() as http:
        response = http.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": PROMPT, "max_tokens": 4}
        )
        drops = drop_counts(gw, 1)
        rows = shadow_rows(gw, 0)
    assert response.status_code == 502
    assert drops == {"primary_failed": 1} and rows == []


def test_answers_are_compared_off_the_event_loop(sims, tmp_path: Path) -> None:
    seen: list[bool] = []

    def on_a_loop() -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    @comparator("loop_probe")
    def probe(primary: Answer, candidate: Answer) -> dict:
        seen.append(on_a_loop())
        return {"probed": True}

    try:
        compare_with = {"comparators": ["exact", "loop_probe"]}
        policy = shadow_policy(
            sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), compare=compare_with
        )
        with run_gateway(policy, tmp_path) as gw:
            gw.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            (row,) = shadow_rows(gw, 1)
    finally:
        del COMPARATORS["loop_probe"]
    assert seen == [False]  # compared in a worker thread, not the event loop's
    assert orjson.loads(row["measures"]) == {"probed": True}


@pytest.mark.parametrize(("stream", "counted"), [(False, 22 + 10), (True, 22 + 15)])
def test_a_llamacpp_candidates_answer_of_two_choices_is_counted_for_both(
    sims, tmp_path: Path, stream: bool, counted: int
) -> None:
    # Its usage counts one choice: 22 tokens in a whole answer, one event a choice in a stream.
    # The primary is one too (the simulators answer one choice only).
    with llama_server() as primary, llama_server() as server:
        doc = shadow_policy([primary.url], sims.urls("asic"), [server.url]).model_dump(
            mode="json", exclude_defaults=True
        )
        for name in ("gpu", "cim"):
            doc["pools"][name] |= {"engine": "llamacpp", "power_metrics": None}
        with run_gateway(parse_policy(to_yaml(doc), "llama-shadow.yaml"), tmp_path) as gw:
            extra = {"stream_options": {"include_usage": True}} if stream else {}
            answer = gw.client().chat.completions.create(
                model=MODEL, messages=PROMPT, n=2, max_tokens=24, stream=stream, **extra
            )
            if stream:
                list(answer)  # type: ignore[arg-type]
            (row,) = shadow_rows(gw, 1)
    assert (row["candidate_status"], row["candidate_error"]) == (200, None)
    assert (row["candidate_prompt_tokens"], row["candidate_completion_tokens"]) == (32, counted)
