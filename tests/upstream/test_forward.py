"""Forwarding under failure: retry before the first byte, honest errors after it, queues."""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import orjson
import pytest

from gateway.app import GatewayApp
from gateway.db.engine import upgrade
from gateway.fleet.state import BackendState
from gateway.runtime import Gateway
from gateway.settings import Settings
from gateway.upstream.forward import error_detail
from harness.gateways import run_gateway
from policies import BIG, MODEL, fleet_policy

PROMPT = [{"role": "user", "content": "Tell me about analog noise in memory arrays."}]


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_asic_failing_before_first_byte_falls_back_to_gpu(sims, tmp_path: Path) -> None:
    sims.asic[0].set_faults(error_rate=1.0)
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path) as gw:
        raw = gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=PROMPT, max_tokens=8
        )
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-gateway-pool"] == "gpu"
        (record,) = gw.records(1)
        metrics = gw.http().get("/metrics").text
    assert (record["attempts"], record["fallback"], record["pool"]) == (2, True, "gpu")
    assert 'gateway_upstream_retries_total{pool="asic"} 1.0' in metrics
    assert 'from_pool="asic"' in metrics and 'reason="upstream_failure"' in metrics


def test_refused_connection_falls_back(sims, tmp_path: Path) -> None:
    policy = fleet_policy(sims.urls("gpu"), [closed_port_url()], sims.urls("cim"))
    with run_gateway(policy, tmp_path) as gw:
        stream = gw.client().chat.completions.create(
            model=MODEL, messages=PROMPT, max_tokens=8, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text


def test_hung_backend_is_cut_by_the_slo_timeout_and_falls_back(sims, tmp_path: Path) -> None:
    sims.asic[0].set_faults(hang=True)
    policy = fleet_policy(
        sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), interactive={"timeout_s": 0.5}
    )
    with run_gateway(policy, tmp_path) as gw:
        raw = gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=PROMPT, max_tokens=4
        )
    assert raw.headers["x-gateway-pool"] == "gpu"


def test_stream_broken_mid_way_ends_with_an_error_not_a_short_answer(sims, tmp_path: Path) -> None:
    for sim in sims.gpu:
        sim.set_faults(drop_after_tokens=5)
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path) as gw:
        stream = gw.client().chat.completions.create(
            model=BIG, messages=PROMPT, max_tokens=200, stream=True, temperature=0
        )
        received = []
        with pytest.raises(openai.APIError):
            for chunk in stream:
                if chunk.choices:
                    received.append(chunk.choices[0].delta.content or "")
        (record,) = gw.records(1)
    assert received  # the stream had started: no retry is possible any more
    assert (record["status"], record["error"]) == (502, "stream_broken")


def test_a_backend_that_cuts_its_streams_mid_answer_is_ejected(sims, tmp_path: Path) -> None:
    # Each stream reaches its first byte, then breaks: only a [DONE] may count as a success.
    sims.gpu[0].set_faults(drop_after_tokens=3)
    policy = fleet_policy(sims.urls("gpu")[:1], sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, health_check_interval_s=60) as gw:
        client = gw.client()
        for _ in range(3):
            stream = client.chat.completions.create(
                model=BIG, messages=PROMPT, max_tokens=200, stream=True, temperature=0
            )
            with pytest.raises(openai.APIError):
                for _chunk in stream:
                    pass
        assert gw.gateway.fleet.pools["gpu"].backends[0].ejected
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model=BIG, messages=PROMPT, max_tokens=4)
    assert info.value.status_code == 503


def test_every_backend_failing_is_502_then_503_once_ejected(sims, tmp_path: Path) -> None:
    for sim in sims.gpu:
        sim.set_faults(error_rate=1.0)
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, health_check_interval_s=60) as gw:
        client = gw.client()
        statuses = []
        for _ in range(4):
            with pytest.raises(openai.APIStatusError) as info:
                client.chat.completions.create(model=BIG, messages=PROMPT, max_tokens=4)
            statuses.append(info.value.status_code)
    assert statuses[:3] == [502, 502, 502]
    assert statuses[3] == 503


def one_slot_policy(sims, **interactive: object):
    routes = [{"name": "gpu-only", "match": {}, "pools": ["gpu"]}]
    return fleet_policy(
        sims.urls("gpu")[:1],
        sims.urls("asic"),
        sims.urls("cim"),
        routes=routes,
        gpu_extra={"slots_per_backend": 1},
        interactive=interactive,
    )


def test_requests_beyond_slots_wait_in_the_pool_queue(sims, tmp_path: Path) -> None:
    policy = one_slot_policy(sims, max_queue_ms=20_000, ttft_ms=20_000)
    with run_gateway(policy, tmp_path) as gw:
        client = gw.client()

        def ask(_: int) -> str:
            return (
                client.chat.completions.create(model=BIG, messages=PROMPT, max_tokens=30)
                .choices[0]
                .message.content
                or ""
            )

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(ask, range(4)))
        rows = gw.records(4)
        assert gw.gateway.fleet.pools["gpu"].backends[0].in_flight == 0
    assert all(answers)
    assert max(r["queue_ms"] for r in rows) > 0
    assert sum(r["queue_ms"] > 0 for r in rows) >= 2


def test_full_pool_past_its_queue_budget_is_429(sims, tmp_path: Path) -> None:
    policy = one_slot_policy(sims, max_queue_ms=50)
    with run_gateway(policy, tmp_path) as gw:
        client = gw.client()
        # The pool's one slot is held by a long stream until the test has its answer.
        holder = client.chat.completions.create(
            model=BIG,
            messages=PROMPT,
            max_tokens=60000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        with holder:
            next(iter(holder))
            assert gw.gateway.fleet.pools["gpu"].backends[0].in_flight == 1
            with pytest.raises(openai.RateLimitError) as info:
                client.chat.completions.create(model=BIG, messages=PROMPT, max_tokens=4)
        assert info.value.code == "no_capacity"


def test_a_backend_error_quoted_to_the_client_never_carries_the_backends_key() -> None:
    backend = BackendState("asic-0", "http://asic", "asic", 4)
    backend.headers = {**backend.headers, "authorization": "Bearer sk-upstream-secret"}
    echoed = error_detail(b'{"error": "bad key sk-upstream-secret"}', backend)
    assert echoed == '{"error": "bad key [redacted]"}'
    # A key across the clip: blanking it after clipping would leave its first characters.
    straddling = error_detail(b"x" * 195 + b"sk-upstream-secret", backend)
    assert "sk-" not in straddling and len(straddling) == 200


@pytest.mark.parametrize("stream", [False, True])
def test_the_slot_comes_back_once_the_backend_has_answered_though_the_client_reads_nothing(
    sims, tmp_path: Path, stream: bool
) -> None:
    # The client's `send` blocks until the test lets it read: the backend has long finished by
    # then, and its slot must not wait for a client that may take its write timeout to fail.
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    body = orjson.dumps({"model": MODEL, "messages": PROMPT, "max_tokens": 40, "stream": stream})
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
    }

    async def scenario() -> tuple[bool, bytes]:
        gateway = Gateway(Settings(database_url=url, spill_dir=tmp_path / "spill"), policy)
        await gateway.start()
        backends = [b for pool in gateway.fleet.pools.values() for b in pool.backends]
        reading, started = asyncio.Event(), asyncio.Event()
        answer: list[bytes] = []
        arrived = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def receive() -> dict:
            message = next(arrived, None)
            if message is None:
                await asyncio.Event().wait()  # the client stays connected
            return message  # type: ignore[return-value]

        async def send(message: dict) -> None:
            started.set()
            await reading.wait()
            answer.append(message.get("body", b""))

        try:
            serving = asyncio.create_task(GatewayApp(gateway)(scope, receive, send))
            await asyncio.wait_for(started.wait(), 30)
            async with asyncio.timeout(30):
                while any(b.in_flight for b in backends):
                    await asyncio.sleep(0.01)
            freed_while_unread = not serving.done() and not answer
            reading.set()
            await serving
            # Given back once: the end of the relay does not give it back a second time.
            assert [b.in_flight for b in backends] == [0] * len(backends)
            return freed_while_unread, b"".join(answer)
        finally:
            await gateway.stop()

    freed_while_unread, answer = asyncio.run(scenario())
    assert freed_while_unread
    assert (b"data: [DONE]" in answer) if stream else orjson.loads(answer)["usage"]


def test_a_stream_that_outlasts_its_deadline_is_cut_though_its_chunks_keep_coming(
    sims, tmp_path: Path
) -> None:
    for sim in sims.gpu:
        sim.set_faults(slow_factor=20)  # a token every ~12 ms: far inside timeout_s
    slo = {"timeout_s": 5, "deadline_s": 1.0}
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), interactive=slo)
    with run_gateway(policy, tmp_path) as gw:
        stream = gw.client().chat.completions.create(
            model=BIG,
            messages=PROMPT,
            max_tokens=4000,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        received = 0
        with pytest.raises(openai.APIError) as cut:
            for chunk in stream:
                received += bool(chunk.choices)
        (record,) = gw.records(1)
    assert received > 10, "the stream flowed until its deadline"
    assert "1 s in all" in str(cut.value)
    assert (record["status"], record["error"]) == (504, "stream_broken")


def test_an_answer_over_the_byte_limit_is_a_failure_of_its_backend(sims, tmp_path: Path) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, max_answer_bytes=16384) as gw:
        client = gw.client()
        assert client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=8)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(
                model=MODEL, messages=PROMPT, max_tokens=6000, extra_body={"ignore_eos": True}
            )
        records = gw.records(2)
    assert refused.value.status_code == 502
    assert "over 16384 bytes" in str(refused.value)
    assert sorted(r["status"] for r in records) == [200, 502]
