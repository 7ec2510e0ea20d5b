"""Hostile requests against the running gateway: a named 4xx each, never a 5xx, service goes on."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from rawhttp import NOT_HTTP, UPGRADE, not_http_error

from harness.gateways import GatewayServer, run_gateway
from policies import MODEL, fleet_policy

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
LIMIT = 256 * 1024


def chat(**fields: object) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": HELLO, "max_tokens": 4, **fields})


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# name, body, expected status, a phrase the error message must contain (the problem, named)
CATALOGUE: list[tuple[str, bytes, int, str]] = [
    ("empty body", b"", 400, "not valid JSON"),
    ("invalid JSON", b'{"model": "x", "messages": [', 400, "not valid JSON"),
    ("trailing garbage", chat() + b"}}", 400, "not valid JSON"),
    ("NaN literal", b'{"model": "m", "temperature": NaN}', 400, "not valid JSON"),
    ("invalid UTF-8", b'{"model": "\xff\xfe", "messages": []}', 400, "not valid JSON"),
    ("lone surrogate escape", b'{"model": "\\ud800", "messages": []}', 400, "not valid JSON"),
    ("body is an array", b"[1, 2, 3]", 400, "JSON object"),
    ("body is null", b"null", 400, "JSON object"),
    ("model is a number", chat(model=123), 400, "'model'"),
    ("model is empty", chat(model=""), 400, "'model'"),
    ("messages is a string", chat(messages="hi"), 400, "'messages'"),
    ("messages is empty", chat(messages=[]), 400, "'messages'"),
    ("message is not an object", chat(messages=["hi"]), 400, "messages[0]"),
    ("role is a number", chat(messages=[{"role": 1, "content": "x"}]), 400, "messages[0]"),
    ("stream is a string", chat(stream="yes"), 400, "'stream'"),
    ("max_tokens is a string", chat(max_tokens="ten"), 400, "'max_tokens'"),
    ("max_tokens is negative", chat(max_tokens=-5), 400, "'max_tokens'"),
    ("max_tokens is zero", chat(max_tokens=0), 400, "'max_tokens'"),
    ("max_tokens is a float", chat(max_tokens=1.5), 400, "'max_tokens'"),
    ("max_tokens is huge", chat(max_tokens=10**15), 400, "2147483647"),
    (
        "max_tokens is past 64 bits",
        chat()[:-1] + b', "max_tokens": 123456789012345678901234567890}',
        400,
        "'max_tokens'",
    ),
    ("deep nesting", nested(100_000), 400, "not valid JSON"),
    (
        "deep nesting in a message",
        b'{"model": "m", "messages": [{"role": "user", "content": ' + nested(5_000) + b"}]}",
        400,
        "not valid JSON",
    ),
    ("unknown model", chat(model="gpt-nope"), 404, "gpt-nope"),
    ("huge model name", chat(model="m" * 200_000), 400, "at most 128 characters"),
    ("huge string for stream", chat(stream="y" * 200_000), 400, "'stream'"),
    (
        "huge prompt over every context",
        chat(messages=[{"role": "user", "content": "w" * (LIMIT - 1000)}], max_tokens=200_000),
        400,
        "context",
    ),
    ("oversized body", chat(messages=[{"role": "user", "content": "x" * LIMIT}]), 413, "exceeds"),
    (
        "thousands of messages over the limit",
        chat(messages=[{"role": "user", "content": "hi there"}] * 20_000),
        413,
        "exceeds",
    ),
    ("bad SLO header value", chat(), 400, "x-slo-ttft-ms"),
    ("huge SLO header value", chat(), 400, "x-slo-ttft-ms"),
    ("unknown SLO class", chat(), 400, "x-slo-class"),
]

HEADERS = {
    "bad SLO header value": {"x-slo-ttft-ms": "soon"},
    "huge SLO header value": {"x-slo-ttft-ms": "9" * 6_000},
    "unknown SLO class": {"x-slo-class": "z" * 6_000},
}


def assert_still_serving(http: httpx.Client) -> None:
    response = http.post(CHAT, content=chat(), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


def test_every_hostile_request_gets_an_openai_shaped_4xx_naming_the_problem(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    wrong = []
    with run_gateway(policy, tmp_path, max_body_bytes=LIMIT) as gw, gw.http() as http:
        for name, body, status, phrase in CATALOGUE:
            headers = {"content-type": "application/json", **HEADERS.get(name, {})}
            response = http.post(CHAT, content=body, headers=headers)
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                wrong.append(f"{name}: {response.status_code} {response.text[:200]!r}")
                continue
            if (
                response.status_code != status
                or set(error) != {"message", "type", "param", "code"}
                or phrase not in error["message"]
                or len(error["message"]) > 1000
            ):
                wrong.append(f"{name}: {response.status_code} {str(error)[:300]}")
            assert_still_serving(http)
        metrics = http.get("/metrics").text
    assert not wrong, "\n".join(wrong)
    assert 'status="500"' not in metrics


@pytest.fixture
def gw_small(sims, tmp_path: Path) -> Iterator[GatewayServer]:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, max_body_bytes=LIMIT) as server:
        yield server


def test_unknown_fields_are_passed_to_the_backend_not_refused(gw_small: GatewayServer) -> None:
    with gw_small.http() as http:
        response = http.post(
            CHAT,
            content=chat(frobnicate={"deep": [1, 2, 3]}, user="u"),
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 200, response.text


def test_thousands_of_small_messages_within_the_limit_are_served(gw_small: GatewayServer) -> None:
    messages = [{"role": "user", "content": "hi"}] * 3_000
    with gw_small.http() as http:
        response = http.post(
            CHAT, content=chat(messages=messages), headers={"content-type": "application/json"}
        )
    assert response.status_code == 200, response.text


def test_a_body_that_never_finishes_is_cut_with_408_while_others_are_served(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, body_read_timeout_s=0.5) as gw, gw.http() as http:
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=20) as slow:
            slow.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
                b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n" + chat()[:20]
            )
            assert_still_serving(http)
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                data = slow.recv(65536)
                if not data:
                    break
                answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        error = orjson.loads(body)["error"]
        assert error["code"] == "request_timeout" and "did not arrive" in error["message"]
        assert_still_serving(http)


def test_bytes_that_are_not_http_get_an_openai_shaped_400_and_the_connection_closes(
    gw_small: GatewayServer,
) -> None:
    with gw_small.http() as http:
        for request in NOT_HTTP:
            error = not_http_error(gw_small.url, request)
            assert error["type"] == "invalid_request_error", error
            assert error["code"] == "invalid_http_request" and "HTTP/1.1" in error["message"]
            assert_still_serving(http)


def test_an_upgrade_header_is_ignored_and_the_request_served_as_http(
    gw_small: GatewayServer,
) -> None:
    with gw_small.http() as http:
        response = http.get("/v1/models", headers=UPGRADE)
    assert response.status_code == 200, response.text
    assert response.json()["object"] == "list"


ADMIN_TOKEN = "hostile-admin-token"
# Found by fuzzing the admin API from its OpenAPI description (tests/test_openapi.py): each was
# a 500 or an answer in FastAPI's own shape. method, path, body, expected status, phrase.
ADMIN_CATALOGUE: list[tuple[str, str, bytes, int, str]] = [
    ("PUT", "/admin/policy", b"\x13~qa%\xff", 400, "parsing the body"),
    ("PUT", "/admin/policy", b'{"yaml": ', 400, "not valid JSON"),
    ("PUT", "/admin/policy", b'{"message": "no yaml"}', 400, "body.yaml"),
    ("POST", "/admin/policy/validate", b'{"yaml": 5}', 400, "body.yaml"),
    ("GET", "/admin/policy/versions?limit=44933367872658375442432", b"", 400, "query.limit"),
    ("GET", "/admin/policy/versions?limit=-1", b"", 400, "query.limit"),
    ("POST", "/admin/policy/rollback", b'{"version": -1162628957580915900416}', 400, "version"),
    ("POST", "/admin/policy/rollback", b'{"version": 99999999999999999999}', 400, "version"),
    ("GET", "/admin/promotions?evaluate=maybe", b"", 400, "query.evaluate"),
    ("GET", "/admin/nothing-here", b"", 404, "Not Found"),
]


def test_malformed_admin_requests_get_an_openai_shaped_4xx_never_a_500(tmp_path: Path) -> None:
    wrong = []
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}
    with run_gateway(fleet_policy(), tmp_path, admin_token=ADMIN_TOKEN) as gw, gw.http() as http:
        for method, path, body, status, phrase in ADMIN_CATALOGUE:
            response = http.request(method, path, content=body, headers=auth)
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                wrong.append(f"{method} {path}: {response.status_code} {response.text[:200]!r}")
                continue
            if (
                response.status_code != status
                or set(error) != {"message", "type", "param", "code"}
                or phrase not in error["message"]
            ):
                wrong.append(f"{method} {path}: {response.status_code} {str(error)[:300]}")
        assert http.get("/admin/policy", headers=auth).status_code == 200
    assert not wrong, "\n".join(wrong)


def test_a_vanishing_temperature_is_served_not_failed_upstream(gw_small: GatewayServer) -> None:
    # Once a 502: the simulated backends divided by zero at temperature 1e-54.
    with gw_small.http() as http:
        response = http.post(
            CHAT, content=chat(temperature=1.86e-54), headers={"content-type": "application/json"}
        )
    assert response.status_code == 200, response.text
