"""The OpenAPI description at /openapi.json, and the live gateway fuzzed from it (schemathesis)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from harness.gateways import run_gateway
from policies import MODEL, fleet_policy

TOKEN = "fuzz-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
# No 5xx, and every answer is one the description lists, with its media type and its schema:
# the OpenAI error shape for every 4xx.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Examples per operation and mode: about 10 s for the whole API on the two-core machine. Fuzz
# deeper on demand with FUZZ_EXAMPLES=200 (a few minutes).
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
# A fixed seed by default, so that a failure in CI is the same failure on a laptop; `make fuzz`
# runs with FUZZ_SEED=random, and says the seed it drew for a failure to be replayed.
SEED = (
    random.randrange(2**32)
    if os.environ.get("FUZZ_SEED") == "random"
    else int(os.environ.get("FUZZ_SEED", "20261201"))
)
# Headers that frame the body belong to HTTP, not to the API the description describes: the
# HTTP parser refuses bad ones before any route (tests/test_hostile_requests.py, NOT_HTTP).
FRAMING = {"transfer-encoding", "content-length"}


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
    v1 = {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/models",
    }
    assert v1 | {"/healthz", "/readyz", "/metrics", "/admin/policy"} <= set(doc["paths"])
    model = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]
    assert model["enum"] == fleet_policy().served_models()
    admin = doc["paths"]["/admin/policy"]["put"]
    assert admin["security"] == [{"adminToken": []}]
    assert {"400", "401", "403", "422", "503"} <= set(admin["responses"])
    assert "HTTPValidationError" not in str(doc), "FastAPI's 422 shape is not what is answered"


def test_every_endpoint_fuzzed_from_the_description_answers_as_it_says(
    sims, tmp_path: Path
) -> None:
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with (
        run_gateway(policy, tmp_path, admin_token=TOKEN, max_body_bytes=256 * 1024) as gw,
        gw.http() as http,
    ):
        print(f"fuzzing with FUZZ_SEED={SEED} FUZZ_EXAMPLES={EXAMPLES}")
        schema = schemathesis.openapi.from_url(gw.url + "/openapi.json")
        failures: list[str] = []
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @seed(SEED)
                @given(case=operation.as_strategy(generation_mode=mode))
                @settings(
                    max_examples=EXAMPLES,
                    deadline=None,
                    database=None,
                    phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
                def fuzz(case: schemathesis.Case) -> None:
                    for name in [n for n in case.headers or {} if n.lower() in FRAMING]:
                        del case.headers[name]
                    response = case.call(base_url=gw.url, headers=AUTH, timeout=30)
                    case.validate_response(response, checks=CHECKS)

                try:
                    fuzz()
                except Unsatisfiable:
                    continue  # an operation without inputs has no invalid ones to send
                except (Exception, BaseExceptionGroup) as exc:  # each failure is a finding
                    failures.append(f"{operation.label} ({mode.value}): {exc}")
            assert_still_serving(http)
    assert not failures, f"FUZZ_SEED={SEED} FUZZ_EXAMPLES={EXAMPLES}\n\n" + "\n\n".join(failures)
