"""The OpenAPI description at /openapi.json, and the live gateway fuzzed from it (schemathesis)."""

from __future__ import annotations

import copy
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.ops.admin import MAX_VERSION
from gateway.report.period import SINCE
from gateway.routing import bodies
from gateway.routing.classify import ENDPOINTS, MS_PATTERN
from harness.gateways import run_gateway
from policies import EMBED, MODEL, fleet_policy

HERE = Path(__file__).resolve().parent
TOKEN = "fuzz-admin-token"
# The embedding model served as one, so that each endpoint's description lists what it serves.
KINDS = {EMBED: {"params_b": 0.335, "kind": "embedding"}}
AUTH = {"authorization": f"Bearer {TOKEN}"}
# Examples per operation in the fuzzing phase, beside the coverage phase's boundary values and
# wrong methods: about 20 s for the whole API on the two-core machine. Fuzz deeper on demand with
# FUZZ_EXAMPLES=200 (a few minutes).
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
# A fixed seed by default, so that a failure in CI is the same failure on a laptop; `make fuzz`
# runs with FUZZ_SEED=random, and says the seed it drew for a failure to be replayed.
SEED = (
    random.randrange(2**32)
    if os.environ.get("FUZZ_SEED") == "random"
    else int(os.environ.get("FUZZ_SEED", "20261201"))
)
# Every check schemathesis has, on every operation. What the description admits but the
# gateway's state may refuse is a status of its own: a policy text that does not validate is
# a 422 (its rules are the policy's, not the schema's); what the gateway or the simulators
# refuse by a rule no schema states is not sent as valid data (fuzz_rules.py).
CONFIG = """
[[operations]]
include-path-regex = "^/admin/policy(/simulate|/rollback)?$"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx",
]
"""
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
# A value for each path parameter, to probe its path's methods with.
PATH_VALUES = {"{week}": "2026-W48", "{name}": "report.html"}


def assert_still_serving(http: httpx.Client) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    response = http.post("/v1/chat/completions", json=chat)
    assert response.status_code == 200, response.text


def test_the_description_covers_v1_ops_and_admin_with_the_served_models(tmp_path: Path) -> None:
    with run_gateway(fleet_policy(), tmp_path) as gw, gw.http() as http:
        doc = http.get("/openapi.json").json()
        assert http.get("/docs").status_code == 404  # its page would load a CDN's scripts
        assert http.get("/redoc").status_code == 404
    (tmp_path / "docs").mkdir()
    with run_gateway(fleet_policy(), tmp_path / "docs", docs=True) as gw, gw.http() as http:
        assert http.get("/docs").status_code == 200
    v1 = {*ENDPOINTS, "/v1/responses", "/v1/models"}
    assert v1 | {"/healthz", "/readyz", "/metrics", "/admin/policy"} <= set(doc["paths"])
    schemas = doc["components"]["schemas"]
    model = schemas["ChatCompletionRequest"]["properties"]["model"]
    assert model["enum"] == fleet_policy().served_models()
    # Each /v1 body is described by what checks it, and only the served models are added.
    names, checked = bodies.json_schemas("#/components/schemas/{model}")
    for endpoint, name in names.items():
        described = copy.deepcopy(schemas[name])
        described["properties"]["model"].pop("enum", None)
        assert described == checked[name], endpoint
    for name in {*checked} - {*names.values()}:
        assert schemas[name] == checked[name], name
    admin = doc["paths"]["/admin/policy"]["put"]
    assert admin["security"] == [{"adminToken": []}]
    assert {"400", "401", "403", "422", "503"} <= set(admin["responses"])
    assert "HTTPValidationError" not in str(doc), "FastAPI's 422 shape is not what is answered"


def test_the_description_states_what_the_server_checks(tmp_path: Path) -> None:
    with run_gateway(fleet_policy(), tmp_path) as gw, gw.http() as http:
        doc = http.get("/openapi.json").json()
    headers = {
        p["name"]: p["schema"] for p in doc["paths"]["/v1/chat/completions"]["post"]["parameters"]
    }
    assert headers["x-slo-ttft-ms"]["pattern"] == headers["x-slo-tpot-ms"]["pattern"] == MS_PATTERN
    assert headers["x-slo-class"]["enum"] == ["interactive", "batch"]
    assert {"x-session-id", "x-litellm-session-id", "x-grok-conv-id"} <= set(headers)
    schemas = doc["components"]["schemas"]
    rollback = schemas["RollbackRequest"]["properties"]
    assert rollback["override_precision_gate"]["type"] == "boolean"
    # FastAPI's OpenAPI model holds bounds as floats: 2**63 - 1 is written as the float nearest.
    bounds = {"type": "integer", "minimum": 1, "maximum": float(MAX_VERSION)}
    assert bounds in rollback["version"]["anyOf"]
    assert schemas["PolicyChange"]["properties"]["yaml"]["minLength"] == 1
    (since,) = [
        p
        for p in doc["paths"]["/admin/shadow/summary"]["get"]["parameters"]
        if p["name"] == "since"
    ]
    assert {"type": "string", "pattern": SINCE} in since["schema"]["anyOf"]
    # A state the request cannot change by its form is described as what it is: a conflict.
    for path in ("/admin/promotions/apply", "/admin/promotions/rollback", "/admin/policy/rollback"):
        assert "409" in doc["paths"][path]["post"]["responses"], path


def test_every_path_answers_the_methods_it_does_not_take_with_405_and_allow(
    tmp_path: Path,
) -> None:
    with run_gateway(fleet_policy(), tmp_path, admin_token=TOKEN) as gw, gw.http() as http:
        doc = http.get("/openapi.json").json()
        wrong = []
        for path, operations in doc["paths"].items():
            documented = {method.upper() for method in operations}
            url = path
            for name, value in PATH_VALUES.items():
                url = url.replace(name, value)
            for method in sorted(set(METHODS) - documented):
                response = http.request(method, url, headers=AUTH)
                allow = {m.strip() for m in response.headers.get("allow", "").split(",")}
                if response.status_code != 405 or allow != documented:
                    wrong.append(f"{method} {url}: {response.status_code}, Allow {allow}")
                elif method != "HEAD":
                    assert response.json()["error"]["code"] == "method_not_allowed"
    assert not wrong, "\n".join(wrong)


@pytest.mark.timeout(900)  # schemathesis has 600 s; `make fuzz` may ask for deeper runs
def test_every_endpoint_fuzzed_from_the_description_answers_as_it_says(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), models=KINDS)
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    longest = max(pool.max_context for pool in policy.pools.values() if pool.live) // 2
    rules = {
        "SCHEMATHESIS_HOOKS": "fuzz_rules",
        "FUZZ_LONGEST_ANSWER": str(longest),
        "PYTHONPATH": os.pathsep.join((str(HERE), os.environ.get("PYTHONPATH", ""))),
    }
    with (
        run_gateway(policy, tmp_path, admin_token=TOKEN, max_body_bytes=256 * 1024) as gw,
        gw.http() as http,
    ):
        print(f"fuzzing with FUZZ_SEED={SEED} FUZZ_EXAMPLES={EXAMPLES}")
        run = subprocess.run(
            [
                *(sys.executable, "-m", "schemathesis.cli", "--config-file", str(config)),
                *("run", gw.url + "/openapi.json", "--seed", str(SEED), "--checks", "all"),
                *("--max-examples", str(EXAMPLES), "--workers", "1"),
                *("--phases", "examples,coverage,fuzzing", "--continue-on-failure"),
                *("--header", f"Authorization: Bearer {TOKEN}", "--request-timeout", "30"),
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, **rules},
        )
        assert_still_serving(http)
        operations = sum(
            len(methods) for methods in http.get("/openapi.json").json()["paths"].values()
        )
    found = f"FUZZ_SEED={SEED} FUZZ_EXAMPLES={EXAMPLES}\n\n{run.stdout}{run.stderr}"
    assert run.returncode == 0, found
    # Every operation was reached, none skipped for a schema schemathesis could not read.
    assert re.search(rf"Tested: {operations}\b", run.stdout), found
