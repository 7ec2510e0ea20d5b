"""The what-if's sample: bounded whatever the period's size, every route and hour in it, and its
estimate of the period within its stated error."""

from __future__ import annotations

from pathlib import Path

from bench.records import generate
from gateway.db.connection import connect
from gateway.policy.load import load_policy
from gateway.report.period import date_range, week
from gateway.whatif.sample import sample_requests, stratum_cap
from gateway.whatif.simulate import recorded_requests, simulate, simulate_sample

ROOT = Path(__file__).resolve().parents[2]
WEEK = week("2026-W48")
SIX_HOURS = date_range("2026-11-23T00:00", "2026-11-23T06:00")


def test_the_cap_keeps_the_sample_within_its_size_and_small_strata_whole() -> None:
    sizes = {("a", 0): 5, ("a", 1): 100, ("b", 0): 1000, ("b", 1): 2}
    cap = stratum_cap(sizes, 300)
    assert sum(min(n, cap) for n in sizes.values()) <= 300
    assert sum(min(n, cap + 1) for n in sizes.values()) > 300  # the largest that fits
    assert stratum_cap(sizes, 10_000) == 1000  # room for all: every stratum whole


def test_the_sample_is_bounded_whatever_the_weeks_size_and_has_every_stratum(
    database: str, tmp_path: Path
) -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    small = f"sqlite:///{tmp_path / 'small.db'}"
    generate(small, 2000, 0, WEEK, policy, seed=1)
    generate(database, 16000, 0, WEEK, policy, seed=2)
    taken = []
    for url in (small, database):
        db = connect(url)
        sample = sample_requests(db, WEEK.since, WEEK.until, size=3000)
        db.dispose()
        assert len(sample.requests) <= 3000
        assert set(sample.strata) == set(sample.sizes)  # every route and hour represented
        counts = sample.taken()
        assert all(counts[s] == min(n, max(counts.values())) for s, n in sample.sizes.items())
        assert {route for route, _ in sample.sizes} == {r.name for r in policy.routes}
        arrivals = [r.arrival_s for r in sample.requests]
        assert arrivals == sorted(arrivals) and arrivals[0] == 0
        taken.append((len(sample.requests), sample.period_requests))
    (small_n, small_period), (large_n, large_period) = taken
    # The small week is read whole; the one four times its size gives no more than was asked.
    assert small_n == small_period > 1900
    assert large_period > 15_000 and large_n <= 3000


def test_the_sampled_what_if_agrees_with_the_full_replay_within_its_error(
    tmp_path: Path,
) -> None:
    # Six hours (18 strata of route and hour) rather than a week: the same sample and replay,
    # and a full replay a test can wait for. The interval is the sampling error's alone: the
    # sample is replayed at its own arrivals, so a fleet near its capacity waits less in the
    # sample than it did (docs/policy.md says so); at this load it does not show.
    policy = load_policy(ROOT / "policies" / "default.yaml")
    url = f"sqlite:///{tmp_path / 'period.db'}"
    generate(url, 800, 0, SIX_HOURS, policy, seed=3)
    db = connect(url)
    everything = recorded_requests(db, SIX_HOURS.since)
    sample = sample_requests(db, SIX_HOURS.since, SIX_HOURS.until, size=300)
    db.dispose()
    full = simulate(policy, policy, everything)
    sampled = simulate_sample(policy, policy, sample)
    drawn = sampled["sample"]
    assert drawn["requests"] == len(sample.requests) < len(everything) == drawn["period_requests"]
    assert drawn["strata_sampled"] == drawn["strata"]
    truth = full["change"]["slo_attainment"]["active"]
    share = drawn["slo_attainment"]["active"]
    assert share["low"] <= truth <= share["high"], (truth, share)
    assert share["high"] - share["low"] < 0.2  # an interval that says something
    # The same sample under both policies: the same policy gives the same figures.
    assert sampled["runs"]["active"] == sampled["runs"]["proposed"]
