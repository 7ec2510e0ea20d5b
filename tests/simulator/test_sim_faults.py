"""Fault injection, by flags and at run time, as a gateway's upstream would misbehave."""

import statistics
import time

import httpx
import openai
import orjson
import pytest
from waiting import wait_for

from harness.simulators import start_simulator

CHAT = "llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def sick():
    with start_simulator("gpu", speed=50, extra_args=["--slots", "2"]) as sim:
        yield sim


@pytest.fixture(autouse=True)
def healthy(sick):
    sick.reset_faults()
    yield
    sick.reset_faults()


def _chat_body(tokens: int = 8, **fields) -> dict:
    return {
        "model": CHAT,
        "messages": [{"role": "user", "content": "Are you well?"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        **fields,
    }


def _stream_lines(url: str, body: dict) -> tuple[list[str], Exception | None]:
    lines: list[str] = []
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=10) as reply:
            for line in reply.iter_lines():
                if line:
                    lines.append(line)
    except httpx.TransportError as exc:
        return lines, exc
    return lines, None


def _elapsed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def test_error_rate_one_fails_every_request_in_openai_error_shape(sick):
    sick.set_faults(error_rate=1.0)
    for _ in range(10):
        reply = httpx.post(f"{sick.base_url}/chat/completions", json=_chat_body())
        assert reply.status_code in (500, 503)
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "server_error"
    assert httpx.get(f"{sick.url}/health").status_code in (500, 503)


def test_error_rate_fails_about_that_fraction_of_requests(sick):
    sick.set_faults(error_rate=0.5)
    with httpx.Client(base_url=sick.url) as client:
        failed = sum(client.get("/health").status_code >= 500 for _ in range(200))
    assert 60 <= failed <= 140


def test_added_latency_delays_every_answer(sick):
    with httpx.Client(base_url=sick.url) as client:
        client.get("/health")  # open the connection outside the measurement
        baseline = [_elapsed(lambda: client.get("/health")) for _ in range(5)]
        sick.set_faults(added_latency_ms=60)
        delayed = [_elapsed(lambda: client.get("/health")) for _ in range(5)]
    # Every answer waited at least the latency added (a busy machine only adds to it), and the
    # latency, not the machine, is what set them apart.
    assert min(delayed) >= 0.060
    assert statistics.median(delayed) > statistics.median(baseline)


def test_hang_accepts_requests_and_never_answers(sick):
    sick.set_faults(hang=True)
    timeout = httpx.Timeout(5.0, read=0.3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sick.base_url}/chat/completions", json=_chat_body(), timeout=timeout)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{sick.url}/health", timeout=timeout)


def test_refuse_closes_the_connection_before_any_response(sick):
    sick.set_faults(refuse=True)
    with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
        httpx.get(f"{sick.url}/health")
    with (
        openai.OpenAI(base_url=sick.base_url, api_key="unused", max_retries=0) as client,
        pytest.raises(openai.APIConnectionError),
    ):
        client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": "hi"}])


def test_faults_never_touch_admin_or_metrics(sick):
    sick.set_faults(refuse=True, hang=True, error_rate=1.0)
    assert sick.faults()["refuse"] is True
    assert "DCGM_FI_DEV_POWER_USAGE" in sick.metrics()


def test_drop_after_tokens_cuts_a_stream_without_done(sick):
    sick.set_faults(drop_after_tokens=3)
    lines, error = _stream_lines(sick.url, _chat_body(20, stream=True))
    assert isinstance(error, httpx.RemoteProtocolError)
    assert len(lines) == 3
    assert "data: [DONE]" not in lines
    assert all(orjson.loads(line[6:])["choices"][0]["finish_reason"] is None for line in lines)


def test_drop_after_tokens_spares_shorter_streams_and_plain_answers(sick):
    sick.set_faults(drop_after_tokens=10)
    lines, error = _stream_lines(sick.url, _chat_body(4, stream=True))
    assert error is None
    assert lines[-1] == "data: [DONE]"
    plain = httpx.post(f"{sick.base_url}/chat/completions", json=_chat_body(40))
    assert plain.json()["usage"]["completion_tokens"] == 40


def test_slow_factor_makes_the_device_slower(sick):
    with httpx.Client(base_url=sick.url, timeout=30) as client:
        client.get("/health")

        def answer():  # ~60 ms of decoding: many times the HTTP round trip
            client.post("/v1/chat/completions", json=_chat_body(450)).raise_for_status()

        # Medians of three: one pause of a busy machine's does not decide.
        normal = statistics.median(_elapsed(answer) for _ in range(3))
        before = sick.metric("sim_faults_injected_total", kind="slow")
        sick.set_faults(slow_factor=4.0)
        slow = statistics.median(_elapsed(answer) for _ in range(3))
    assert slow > 2 * normal
    assert sick.metric("sim_faults_injected_total", kind="slow") == before + 3  # one an answer


def test_get_faults_shows_what_is_set_and_reset_clears_it(sick):
    sick.set_faults(error_rate=0.25, drop_after_tokens=5)
    sick.set_faults(slow_factor=3.0)  # partial update: the others stay
    assert sick.faults() == {
        "error_rate": 0.25,
        "added_latency_ms": 0.0,
        "hang": False,
        "refuse": False,
        "drop_after_tokens": 5,
        "slow_factor": 3.0,
    }
    cleared = sick.reset_faults()
    assert cleared["error_rate"] == 0.0 and cleared["drop_after_tokens"] is None


def test_an_invalid_fault_gets_400_naming_the_field(sick):
    reply = httpx.post(f"{sick.url}/admin/faults", json={"error_rate": 2})
    assert reply.status_code == 400
    assert "error_rate" in reply.json()["error"]["message"]
    unknown = httpx.post(f"{sick.url}/admin/faults", json={"explode": True})
    assert unknown.status_code == 400
    assert "explode" in unknown.json()["error"]["message"]


def test_a_client_that_goes_away_frees_its_slot(sick):
    body = _chat_body(100_000, stream=True)
    with httpx.stream("POST", f"{sick.url}/v1/chat/completions", json=body) as reply:
        lines = reply.iter_lines()  # held open: dropping the iterator closes the connection
        assert next(lines).startswith("data: ")
        assert sick.metric("sim_active_requests") == 1
    wait_for(lambda: sick.metric("sim_active_requests") == 0, message="the slot stayed taken")


def test_fault_flags_apply_from_startup():
    flags = [
        "--refuse",
        "--error-rate",
        "0.5",
        "--added-latency-ms",
        "5",
        "--drop-after-tokens",
        "3",
        "--slow-factor",
        "2",
    ]
    with start_simulator("asic", extra_args=flags) as sim:
        assert sim.faults() == {
            "error_rate": 0.5,
            "added_latency_ms": 5.0,
            "hang": False,
            "refuse": True,
            "drop_after_tokens": 3,
            "slow_factor": 2.0,
        }
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"{sim.url}/health")
