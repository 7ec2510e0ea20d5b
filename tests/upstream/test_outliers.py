"""Outlier detection: a backend that keeps failing is ejected, and its doubling forgiven."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.fleet.state import BackendState
from gateway.metrics import GatewayMetrics
from gateway.upstream.outliers import OutlierDetector
from harness.gateways import run_gateway
from policies import MODEL, fleet_policy

PROMPT = [{"role": "user", "content": "Tell me about analog noise in memory arrays."}]


def test_ejection_doubling_is_forgiven_while_a_returned_backend_serves() -> None:
    # Envoy's rule: one doubling off per 10 s served after returning, so a backend with a fault
    # now and then is not ejected for ever longer spans.
    now = [0.0]
    outliers = OutlierDetector(GatewayMetrics(), threshold=1, clock=lambda: now[0])
    backend = BackendState("asic-0", "http://asic", "asic", 4)

    def fail_after(serving_s: float) -> float:
        """Serve for serving_s, fail, and return the ejection's interval; then come back."""
        now[0] += serving_s
        outliers.failure(backend)
        interval = backend.ejected_until - now[0]
        now[0] = backend.ejected_until
        assert outliers.restore(backend)
        return interval

    assert [fail_after(0.0) for _ in range(3)] == [2.0, 4.0, 8.0]  # failing again at once
    assert fail_after(9.0) == 16.0  # less than 10 s served: nothing forgiven
    assert fail_after(10.0) == 16.0  # one doubling forgiven, one added
    assert fail_after(45.0) == 2.0  # four forgiven: back to the base interval
    assert fail_after(25.0) == 2.0


def test_a_backend_failing_every_other_request_is_ejected_by_its_failure_share() -> None:
    # Never three failures in a row, as behind a round-robin balancer with one broken replica.
    now = [0.0]
    outliers = OutlierDetector(GatewayMetrics(), clock=lambda: now[0])
    backend = BackendState("asic-0", "http://asic", "asic", 4)
    outcomes = 0
    while not backend.ejected and outcomes < 100:
        now[0] += 0.1
        if outcomes % 2:
            outliers.success(backend)
        else:
            outliers.failure(backend)
        outcomes += 1
    assert backend.ejected
    assert outcomes == 11  # the first failure once 10 requests are in the window
    assert backend.ejected_until == pytest.approx(now[0] + 2.0)


def test_failures_spread_thin_or_across_windows_eject_nothing() -> None:
    now = [0.0]
    outliers = OutlierDetector(GatewayMetrics(), clock=lambda: now[0])
    backend = BackendState("asic-0", "http://asic", "asic", 4)
    for n in range(300):  # one failure in three: under half
        now[0] += 0.1
        (outliers.failure if n % 3 == 0 else outliers.success)(backend)
    for n in range(300):  # every other one, but only 8 requests in each 10 s window
        now[0] += 1.25
        (outliers.failure if n % 2 == 0 else outliers.success)(backend)
    assert not backend.ejected


def test_a_backend_failing_most_requests_is_ejected_by_its_failure_share_alone(
    sims, tmp_path: Path
) -> None:
    sims.asic[0].set_faults(error_rate=0.8)
    policy = fleet_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    with run_gateway(policy, tmp_path, health_check_interval_s=60) as gw:
        gw.gateway.outliers.threshold = 1000  # only the failure share can eject here
        client = gw.client()
        asic = gw.gateway.fleet.pools["asic"].backends[0]
        # Failing 80% of requests on the shared simulator's unseeded history: ejection needs
        # failures at half the requests from the tenth on, and 30 leave it unseen 1.3e-5.
        for _ in range(30):
            # Every failure before the first byte is retried on the fallback: each succeeds.
            assert client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=2)
            if asic.ejected:
                break
        assert asic.ejected
