"""Cache-aware routing through a running gateway: a conversation's next turn goes to the backend
that holds its prefix, and explain says how much of it each choice holds."""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

from openai import OpenAI
from waiting import wait_for

from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy, to_yaml
from harness.gateways import free_port, run_gateway
from harness.simulators import start_simulator
from policies import MODEL, fleet_policy

TOKEN = "prefix-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
SYSTEM = "You answer questions about the routing gateway's fleet, briefly and exactly. " * 30
ROUTES = [{"name": "chat", "match": {"models": [MODEL]}, "pools": ["gpu"], "fallback": "gpu"}]


def turns(system: str, *said: str) -> list[dict]:
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(said):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


def test_a_conversations_next_turn_goes_where_its_prefix_is(sims, tmp_path: Path) -> None:
    # One pool of two backends, both idle when the second turn comes: without its prefix the
    # router takes the first, gpu-0.
    policy = fleet_policy([sims.urls("gpu")[0], sims.urls("asic")[0]], routes=ROUTES)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        client = gw.client()
        first = gw.gateway.serving.fleet.pools["gpu"].backends[0]
        first.in_flight = 1  # busy when the conversation starts: its first turn goes to gpu-1
        opened = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=turns(SYSTEM, "What is a slot?"), max_tokens=8
        )
        first.in_flight = 0
        again = turns(SYSTEM, "What is a slot?", opened.parse().choices[0].message.content or "")
        again.append({"role": "user", "content": "And a pool?"})
        explained = http.post(
            "/admin/explain", json={"body": {"model": MODEL, "messages": again}}, headers=AUTH
        ).json()
        second = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=again, max_tokens=8
        )
        other = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=turns("Another assistant. " * 100, "Hello?"), max_tokens=8
        )
    assert opened.headers["x-gateway-backend"] == "gpu-1"
    assert second.headers["x-gateway-backend"] == "gpu-1"
    # A conversation that shares nothing goes to the first idle backend, as before.
    assert other.headers["x-gateway-backend"] == "gpu-0"
    said = " ".join(explained["trace"])
    held = re.search(r"chosen: gpu-1 .* holds (\d+) of the prompt's (\d+) prefix blocks", said)
    # Every whole block of the second turn was in the first: the system prompt (~2,300
    # characters, 9 blocks of 256) and no whole block of the new turns.
    assert held is not None and held.group(1) == held.group(2) == "9", said
    # Each backend's expected hit, the one not chosen included.
    expected = {
        b["backend"]: (b["prefix_blocks_held"], b["cached_tokens_expected"])
        for b in explained["pools"]["gpu"]["backends"]
    }
    assert expected["gpu-0"] == (0, 0)
    assert expected["gpu-1"][0] == 9 and expected["gpu-1"][1] > 500


def test_a_prompt_too_short_for_a_block_is_routed_as_before(sims, tmp_path: Path) -> None:
    policy = fleet_policy([sims.urls("gpu")[0], sims.urls("asic")[0]], routes=ROUTES)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw:
        client = gw.client()
        served = {
            client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            ).headers["x-gateway-backend"]
            for _ in range(3)
        }
        assert gw.gateway.serving.fleet.prefixes.held("gpu-0") == 0
    assert served == {"gpu-0"}


def test_a_named_session_goes_back_to_its_backend_until_it_answers_outside_the_slo(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy([sims.urls("gpu")[0], sims.urls("asic")[0]], routes=ROUTES)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw:
        client = gw.client()
        fleet = gw.gateway.serving.fleet
        first = fleet.pools["gpu"].backends[0]
        asked = iter(range(100))

        def ask(**named: object) -> str:
            # Each prompt its own: no block in common with another, so only the session can
            # tell where the last one went (an agent whose prompts the index cannot match).
            text = f"Request {next(asked)}: " + "what does the fleet hold now? " * 12
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=4, **named
            )
            return raw.headers["x-gateway-backend"]

        first.in_flight = 1
        opened = ask(extra_headers={"x-session-id": "agent-7"})
        keyed = ask(extra_body={"prompt_cache_key": "thread-9"})
        first.in_flight = 0
        # Both idle now: an unnamed request takes gpu-0, the named ones go back to gpu-1.
        assert (opened, keyed, ask()) == ("gpu-1", "gpu-1", "gpu-0")
        assert ask(extra_headers={"x-session-id": "agent-7"}) == "gpu-1"
        assert ask(extra_headers={"x-litellm-session-id": "agent-7"}) == "gpu-1"
        assert ask(extra_body={"prompt_cache_key": "thread-9"}) == "gpu-1"
        # A hint priced as a cache hit of the whole prompt, one block here: the session's
        # backend running requests loses it to an idle one that must compute that block.
        fleet.pools["gpu"].backends[1].in_flight = 2
        assert ask(extra_headers={"x-session-id": "agent-7"}) == "gpu-0"
        fleet.pools["gpu"].backends[1].in_flight = 0
        assert ask(extra_headers={"x-session-id": "agent-7"}) == "gpu-0"  # it moved with it
        assert ask(extra_body={"prompt_cache_key": "thread-9"}) == "gpu-1"
        # gpu-1 slows down (2 s more a request, past the class's 500 ms to first token): the
        # session's next request still goes there, misses its SLO, and releases the session.
        sims.asic[0].set_faults(added_latency_ms=2000)
        assert ask(extra_body={"prompt_cache_key": "thread-9"}) == "gpu-1"
        # Judged once the request ends, just after the client has the answer.
        wait_for(
            lambda: fleet.sessions.backend("anonymous/thread-9") is None, message="still sticks"
        )
        sims.asic[0].reset_faults()
        assert ask(extra_body={"prompt_cache_key": "thread-9"}) == "gpu-0"


def test_a_prefix_another_client_cached_is_found_from_the_engines_events(tmp_path: Path) -> None:
    # Two GPU engines publishing their KV caches' changes; the prompt's prefix is cached on
    # gpu-1 by a client the gateway never saw, so only the engine's events can say so.
    ports = [(free_port(), free_port()) for _ in range(2)]
    with ExitStack() as stack:
        sims = [
            stack.enter_context(
                start_simulator("gpu", speed=100, extra_args=_publishing(pub, replay))
            )
            for pub, replay in ports
        ]
        policy = _with_events(fleet_policy([s.url for s in sims], routes=ROUTES), ports)
        with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
            client = gw.client()
            prefixes = gw.gateway.serving.fleet.prefixes
            # Until each subscription has heard a batch, the estimate answers: warm both.
            for i, sim in enumerate(sims):
                direct = OpenAI(base_url=sim.base_url, api_key="none")
                for attempt in range(50):
                    direct.chat.completions.create(
                        model=MODEL, messages=turns(f"Warm-up {i}.{attempt}. " * 40), max_tokens=2
                    )
                    try:  # a PUB socket drops what it sends before the subscription is up
                        wait_for(lambda i=i: prefixes.exact(f"gpu-{i}"), timeout=0.3)
                        break
                    except AssertionError:
                        continue
            messages = turns(SYSTEM, "What is a slot?")
            OpenAI(base_url=sims[1].base_url, api_key="none").chat.completions.create(
                model=MODEL, messages=messages, max_tokens=2
            )
            explained = wait_for(
                lambda: _explained_holding(http, messages), message="gpu-1 seen holding the prefix"
            )
            served = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=8
            )
    backends = {b["backend"]: b for b in explained["pools"]["gpu"]["backends"]}
    assert backends["gpu-1"]["prefix_index"] == "engine events"
    assert backends["gpu-0"]["prefix_blocks_held"] == 0
    assert served.headers["x-gateway-backend"] == "gpu-1"
    assert served.parse().usage.prompt_tokens_details.cached_tokens > 500


def _publishing(pub: int, replay: int) -> list[str]:
    config = {
        "enable_kv_cache_events": True,
        "endpoint": f"tcp://127.0.0.1:{pub}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay}",
    }
    return ["--kv-events-config", json.dumps(config)]


def _with_events(policy: Policy, ports: list[tuple[int, int]]) -> Policy:
    doc = policy.model_dump(mode="json", exclude_defaults=True)
    for entry, (pub, replay) in zip(doc["pools"]["gpu"]["backends"], ports, strict=True):
        entry["kv_events"] = f"tcp://127.0.0.1:{pub}"
        entry["kv_events_replay"] = f"tcp://127.0.0.1:{replay}"
    doc["pools"]["gpu"]["models"] = [MODEL]
    doc["routes"] = ROUTES
    doc["models"] = {MODEL: {"params_b": 8, "tokenizer": "simulator.schema:EngineTokenizer"}}
    return parse_policy(to_yaml(doc), "events.yaml")


def _explained_holding(http, messages: list[dict]) -> dict | None:  # type: ignore[no-untyped-def]
    body = {"body": {"model": MODEL, "messages": messages}}
    explained = http.post("/admin/explain", json=body, headers=AUTH).json()
    held = {b["backend"]: b["prefix_blocks_held"] for b in explained["pools"]["gpu"]["backends"]}
    return explained if held["gpu-1"] > 0 else None
