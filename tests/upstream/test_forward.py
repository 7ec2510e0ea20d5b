"""Forwarding under failure: retry before the first byte, honest errors after it, queues."""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import orjson
import pytest
from llamacpp import captured, llama_policy, llama_server
from waiting import wait_for

from gateway.app import GatewayApp
from gateway.db.connection import upgrade
from gateway.fleet.state import BackendState
from gateway.runtime import Gateway
from gateway.settings import Settings
from gateway.upstream.forward import error_detail, too_long
from harness.gateways import run_gateway
from harness.metrics import metric_value
from harness.simulators import start_simulator
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


def test_llamacpps_refusal_of_a_prompt_past_a_slots_context_is_a_context_refusal() -> None:
    refusal = captured("exceed-context.json")
    assert too_long(400, refusal)
    assert not too_long(
        400, b'{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}'
    )


LONG = [{"role": "user", "content": "ab " * 1000}]  # 3,000 bytes: past the slot's 2,048


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_llamacpp_refuses_before_the_first_byte_is_served_by_a_larger_pool(
    sims, tmp_path: Path, stream: bool
) -> None:
    # The pool claims 4,096 tokens (-c 12288 / -np 3), but the model caps a slot at 2,048.
    with llama_server() as server:
        policy = llama_policy(server.url, sims.urls("gpu"), max_context=4096)
        with run_gateway(policy, tmp_path) as gw, gw.http() as http:
            body = {"model": MODEL, "messages": LONG, "max_tokens": 8, "stream": stream}
            answer = http.post("/v1/chat/completions", json=body)
            text = gw.http().get("/metrics").text
    assert answer.status_code == 200
    assert answer.headers["x-gateway-pool"] == "gpu"
    assert ("data: [DONE]" in answer.text) is stream
    assert len(server.seen) == 1  # refused once, never retried there
    fallbacks = metric_value(
        text, "gateway_fallbacks_total", from_pool="llama", to_pool="gpu", reason="context_overflow"
    )
    assert fallbacks == 1


def test_llamacpps_refusal_reaches_the_client_as_it_was_when_no_pool_is_larger(
    tmp_path: Path,
) -> None:
    with (
        llama_server() as server,
        run_gateway(llama_policy(server.url), tmp_path) as gw,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        gw.client().chat.completions.create(model=MODEL, messages=LONG, max_tokens=8)
    assert refused.value.response.content == captured("exceed-context.json")
    assert refused.value.body["type"] == "exceed_context_size_error"  # type: ignore[index]


@pytest.mark.parametrize(("stream", "name"), [(False, "chat.json"), (True, "chat-stream.txt")])
def test_a_llamacpp_answer_reaches_the_client_byte_for_byte(
    tmp_path: Path, stream: bool, name: str
) -> None:
    # U+FFFD where its bytes are no character, `timings` and the cached prompt tokens included.
    body: dict = {"model": MODEL, "messages": PROMPT, "max_tokens": 12, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    with (
        llama_server() as server,
        run_gateway(llama_policy(server.url), tmp_path) as gw,
        gw.http() as http,
    ):
        answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200
    assert answer.content == captured(name)
    assert "\ufffd" in answer.text and '"timings":{' in answer.text
    assert '"prompt_tokens_details":{"cached_tokens":31}' in answer.text


def test_the_openai_client_reads_llamacpps_cached_tokens_and_timings(tmp_path: Path) -> None:
    with llama_server() as server, run_gateway(llama_policy(server.url), tmp_path) as gw:
        answer = gw.client().chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=12)
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens == 31
    assert (answer.model_extra or {})["timings"]["predicted_n"] == 12
    assert "\ufffd" in (answer.choices[0].message.content or "")


def test_a_backend_counts_the_prompt_it_has_to_compute_until_the_first_byte(tmp_path: Path) -> None:
    # A slow simulated GPU: a 20,000-token prompt takes it seconds of wall time to prefill.
    with start_simulator("gpu", speed=1, extra_args=["--no-prefix-cache"]) as sim:
        policy = fleet_policy([sim.url])
        with run_gateway(policy, tmp_path) as gw:
            backend = gw.gateway.fleet.pools["gpu"].backends[0]
            prompt = [{"role": "user", "content": "word " * 20_000}]
            # The client is held here: a client collected mid-stream closes its connection.
            client = gw.client()
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(
                    lambda: client.chat.completions.create(
                        model=MODEL, messages=prompt, max_tokens=4, stream=True
                    ).response.read()
                )
                computing = wait_for(lambda: backend.prefilling, message="never counted")
                answer.result()
            assert backend.prefilling == 0
    assert computing >= 20_000
