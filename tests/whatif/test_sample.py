"""The what-if's sample: whole windows of the period, bounded whatever the period's size, every
stratum of time in it, and its estimate of the period within its stated interval."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa

from bench.records import generate
from gateway.db.connection import connect
from gateway.db.schema import request_records
from gateway.policy.load import load_policy
from gateway.report.period import date_range, week
from gateway.whatif.estimate import Cluster, ratio_estimate, t_975
from gateway.whatif.simulate import recorded_requests, replay, replay_sample, simulate_sample
from gateway.whatif.windows import MINUTE_S, PER_STRATUM, draw_windows, sample_windows

ROOT = Path(__file__).resolve().parents[2]
WEEK = week("2026-W48")
# An afternoon hour of a fleet busy enough that its 70B pool holds most of its slots.
HOUR = date_range("2026-11-25T14:00", "2026-11-25T15:00")
FIGURES = ("slo_attainment", "energy_j_per_request", "cost_usd_per_1k_tokens")


def test_windows_are_drawn_on_minutes_two_in_every_stratum_of_equal_length() -> None:
    since, until = 1_000_000 * MINUTE_S + 17, 1_000_000 * MINUTE_S + 7 * 86400
    windows, cells = draw_windows(since, until, 12, seed=3, window_s=120, warm_up_s=300)
    assert len(cells) == 12 and sum(cells) == 7 * 86400 / 120
    assert max(cells) - min(cells) <= 1
    assert [w.stratum for w in windows] == [h for h in range(12) for _ in range(PER_STRATUM)]
    assert [w.start for w in windows] == sorted(w.start for w in windows)
    assert len({w.start for w in windows}) == len(windows)
    for w in windows:
        assert w.start == since or w.start % MINUTE_S == 0
        assert w.end - w.start <= 120 and w.start - w.warm_up >= 300 - 17
    # Another seed, other windows; the same seed, the same ones.
    assert draw_windows(since, until, 12, seed=4)[0] != draw_windows(since, until, 12, seed=3)[0]
    assert draw_windows(since, until, 12, seed=3)[0] == draw_windows(since, until, 12, seed=3)[0]


def test_the_ratio_estimate_is_exact_when_every_window_is_drawn_and_widens_with_spread() -> None:
    everything = [Cluster(h, y, 10) for h, y in ((0, 4), (0, 6), (1, 9), (1, 9))]
    exact = ratio_estimate(everything, [2, 2])
    assert exact is not None and exact.estimate == 0.7 and exact.low == exact.high == 0.7
    # Two of four windows per stratum: the first stratum's spread makes the interval.
    drawn = [Cluster(0, 4, 10), Cluster(0, 6, 10), Cluster(1, 9, 10), Cluster(1, 9, 10)]
    half = ratio_estimate(drawn, [4, 4], bounds=(0, 1))
    assert half is not None and half.estimate == pytest.approx(0.7)
    # Stratum 0: d = y - 0.7 x = -3, -1, their variance 2: 4² (1 - 2/4) 2 / 2 = 8 over the
    # estimated total of x, 80; stratum 1 has no spread.
    assert half.standard_error == pytest.approx(8**0.5 / 80)
    assert half.high - half.estimate == pytest.approx(t_975(2) * 8**0.5 / 80)
    assert ratio_estimate([Cluster(0, 0, 0), Cluster(0, 0, 0)], [3]) is None
    assert t_975(1) == 12.706 and t_975(120) == pytest.approx(1.98, abs=0.001)


def test_the_sample_is_bounded_whatever_the_weeks_size_and_holds_whole_windows(
    database: str, tmp_path: Path
) -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    small = f"sqlite:///{tmp_path / 'small.db'}"
    generate(small, 2000, 0, WEEK, policy, seed=1)
    generate(database, 40_000, 0, WEEK, policy, seed=2)
    db = connect(small)
    whole = sample_windows(db, WEEK.since, WEEK.until, size=3000)
    db.dispose()
    # The small week is replayed entire.
    assert whole.whole and len(whole.requests) == whole.measured_requests == whole.period_requests
    assert 1900 < whole.period_requests <= 2000
    db = connect(database)
    sample = sample_windows(db, WEEK.since, WEEK.until, size=3000, seed=5)
    assert not sample.whole and 39_000 < sample.period_requests <= 40_000
    assert len(sample.requests) <= 3000
    strata = len(sample.cells)
    assert strata >= 3 and [w.stratum for w in sample.windows] == sorted(
        h for h in range(strata) for _ in range(PER_STRATUM)
    )
    # Every request of a window is in the sample, and of its warm-up: no thinning.
    with db.connect() as conn:
        for i, w in enumerate(sample.windows):
            held = sum(1 for at in sample.window_of if at == i)
            where = (request_records.c.ts >= w.start, request_records.c.ts < w.end)
            count = sa.select(sa.func.count()).where(request_records.c.status == 200, *where)
            assert held == conn.execute(count).scalar()
    db.dispose()
    arrivals = [r.arrival_s for r in sample.requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0
    assert sample.measured_requests < len(sample.requests)  # warm-ups replayed, not measured


def thinned(requests: list, size: int, seed: int) -> list:
    """The sample the what-if drew before windows: requests picked at random across the period,
    replayed at their own arrivals (thinner than the period's load)."""
    picked = sorted(random.Random(seed).sample(range(len(requests)), size))
    first = requests[picked[0]].arrival_s
    return [replace(requests[i], arrival_s=requests[i].arrival_s - first) for i in picked]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_full_replay_lies_within_the_sampled_windows_interval(
    seed: int, tmp_path: Path
) -> None:
    # An hour a test can replay whole, busy enough that thinning it changes what it measures.
    policy = load_policy(ROOT / "policies" / "default.yaml")
    url = f"sqlite:///{tmp_path / 'hour.db'}"
    generate(url, 4000, 0, HOUR, policy, seed=seed)
    db = connect(url)
    everything = recorded_requests(db, HOUR.since)
    sample = sample_windows(db, HOUR.since, HOUR.until, size=2400, seed=seed)
    db.dispose()
    assert not sample.whole and len(sample.requests) <= 2400
    full, _ = replay(policy, everything)
    figures = replay_sample(policy, sample)
    for figure in FIGURES:
        interval = figures["intervals"][figure]
        assert interval["low"] <= full[figure] <= interval["high"], (figure, full[figure], interval)
    # Thinned to as many requests, the same hour draws more energy per request than it did
    # (its batches are smaller): outside the windows' interval, as the old sample read it.
    thin, _ = replay(policy, thinned(everything, len(sample.requests), seed))
    assert thin["energy_j_per_request"] > figures["intervals"]["energy_j_per_request"]["high"]


def test_the_same_windows_are_replayed_under_both_policies(tmp_path: Path) -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    url = f"sqlite:///{tmp_path / 'hour.db'}"
    generate(url, 1500, 0, HOUR, policy, seed=4)
    db = connect(url)
    sample = sample_windows(db, HOUR.since, HOUR.until, size=900)
    db.dispose()
    result = simulate_sample(policy, policy, sample)
    drawn = result["sample"]
    assert drawn["requests"] == len(sample.requests) < drawn["period_requests"]
    assert drawn["windows"] == PER_STRATUM * drawn["strata"] >= 2
    # The same policy on the same windows gives the same figures.
    assert result["runs"]["active"] == result["runs"]["proposed"]
    interval = result["runs"]["active"]["intervals"]["slo_attainment"]
    assert interval["low"] <= interval["estimate"] <= interval["high"]


def test_a_period_within_the_sample_is_replayed_whole_and_reads_as_its_full_replay(
    tmp_path: Path,
) -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    url = f"sqlite:///{tmp_path / 'hour.db'}"
    generate(url, 600, 0, HOUR, policy, seed=6)
    db = connect(url)
    everything = recorded_requests(db, HOUR.since)
    sample = sample_windows(db, HOUR.since, HOUR.until, size=1000)
    db.dispose()
    assert sample.whole and len(sample.requests) == len(everything)
    full, _ = replay(policy, everything)
    figures = replay_sample(policy, sample)
    for figure in (*FIGURES, "goodput", "carbon_g_per_request"):
        interval = figures["intervals"][figure]
        assert interval["low"] == interval["estimate"] == interval["high"] == full[figure]
