"""A short soak (bench/soak.py): steady load, 10% shadowing and backend faults, then the counts.

30 s at 15 requests a second with two faults inside: streams dropped mid-answer by the ASIC,
then the ASIC answering 5xx. The checks are the five-minute run's; only the memory bound is
generous, since a short run's RSS still moves with warm-up and the machine may be busy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import soak

pytestmark = pytest.mark.alone  # minutes of load on both cores

SHORT: dict[str, Any] = {
    "seconds": 30.0,
    "warmup_s": 3.0,
    "first_fault_s": 4.0,
    "fault_every_s": 12.0,
    "fault_s": 6.0,
    "rss_every_s": 2.0,
    "max_rss_growth_pct": 50.0,
}


def assert_soak_holds(result: dict[str, Any]) -> None:
    checks = {c["name"]: c for c in result["checks"]}
    assert [f["kind"] for f in result["faults"]] == ["drop", "5xx"]
    assert soak.failed(result) == [], [c for c in result["checks"] if not c["ok"]]
    # Every promise was checked, not skipped.
    for name in (
        "no unexpected client-visible error",
        "RSS flat, replica 0",
        "no slot held once the load stops",
        "one request record per request",
        "records fail where clients saw a failure",
        "one shadow record per shadow copy sent",
    ):
        assert checks[name]["ok"], checks[name]


def test_one_replica_serves_a_faulted_soak_with_no_leak(tmp_path: Path) -> None:
    result = soak.run(soak.Soak(**SHORT), tmp_path)
    assert_soak_holds(result)


@pytest.mark.redis
@pytest.mark.postgres
def test_two_replicas_on_redis_and_postgresql_serve_a_faulted_soak_with_no_leak(
    tmp_path: Path, redis_url: str, postgres_server: str
) -> None:
    config = soak.Soak(**SHORT, replicas=2, redis_url=redis_url, database_url=postgres_server)
    result = soak.run(config, tmp_path)
    assert_soak_holds(result)
    assert result["slots"]["redis_leases"] == 0
    assert "RSS flat, replica 1" in {c["name"] for c in result["checks"]}


def outcome(backend: str, sent_s: float, ended_s: float) -> soak.Outcome:
    cut = soak.Outcome(0, 0, soak.SMALL, True, sent_s, ended_s, status=200, backend=backend)
    cut.error_event = {"message": "backend asic-0 failed", "code": "upstream_error"}
    return cut


def test_only_a_stream_cut_under_a_drop_fault_on_its_backend_is_expected() -> None:
    faults = [
        soak.FaultWindow("drop", "asic-0", on_s=10.0, off_s=20.0),
        soak.FaultWindow("5xx", "gpu-0", on_s=30.0, off_s=40.0),
    ]
    verdicts = []
    for cut in (
        outcome("asic-0", 15.0, 16.0),  # cut while its backend dropped streams
        outcome("gpu-0", 15.0, 16.0),  # another backend: no fault explains it
        outcome("asic-0", 25.0, 26.0),  # after the drop fault ended
        outcome("gpu-0", 35.0, 36.0),  # a 5xx fault is retried before the first byte
    ):
        soak.judge(cut, faults)
        verdicts.append(cut.verdict)
    assert verdicts == [soak.EXPECTED, soak.UNEXPECTED, soak.UNEXPECTED, soak.UNEXPECTED]
    whole = soak.Outcome(1, 0, soak.SMALL, False, 0.0, 1.0, status=200, done=True)
    refused = soak.Outcome(2, 0, soak.SMALL, False, 0.0, 1.0, status=502, problem="status 502")
    for answered in (whole, refused):
        soak.judge(answered, faults)
    assert (whole.verdict, refused.verdict) == (soak.OK, soak.UNEXPECTED)
