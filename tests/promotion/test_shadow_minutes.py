"""Shadow minutes: the judge's evidence read from them equals the evidence computed from every
shadow record (counts exactly, tolerances and departures within a bucket), and the writer
folds each copy it records, with its energy and its primary's, into the minutes it writes."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from rows import request_record, shadow_record

from gateway.compare.failures import ERROR, UPSTREAM
from gateway.db.connection import connect
from gateway.db.schema import ShadowRecord, request_records, shadow_minutes
from gateway.metrics import GatewayMetrics
from gateway.policy.definition import SloClass
from gateway.promotion.departures import at_risk, departs, judged, tolerance
from gateway.promotion.evidence import (
    criteria,
    from_minutes,
    load_evidence,
    paraphrases,
    shadow_rows,
    slo_targets,
    window,
)
from gateway.promotion.judge import Evidence
from gateway.promotion.shadow_minutes import (
    DAY_S,
    HOUR_S,
    MINUTE_S,
    ShadowMinutes,
    compact,
    summarize,
    summarize_alike,
)
from gateway.promotion.tally import BUCKETS, FAILED, Tally, met, pair_class, representative
from gateway.shadow.records import CopyEnergy, ShadowWriter
from policies import fleet_policy

T0 = 1_790_006_400.0  # 16:00 UTC
DAY0 = T0 - T0 % 86400  # that day's start
INTERACTIVE = SloClass(ttft_ms=500, tpot_ms=50)
BATCH = SloClass(e2e_ms=1500)
SIDES = ("primary", "candidate")
MEANS = ("energy_j", "cost_usd")


def targets(name: str | None) -> SloClass | None:
    return {None: INTERACTIVE, "interactive": INTERACTIVE, "batch": BATCH}.get(name)


def paraphrase(route: str) -> float | None:
    return 0.9 if route == "semantic" else None


def varied(rng: random.Random, n: int, kind: str, route: str, sampled: bool) -> dict[str, Any]:
    """A copy's row, with its request's SLO class."""
    record = varied_record(rng, n, kind, route, sampled)
    return {**record.row(), "slo_class": rng.choice((None, "interactive", "batch"))}


def varied_record(rng: random.Random, n: int, kind: str, route: str, sampled: bool) -> ShadowRecord:
    """A copy with every kind of value the judge reads: failures on either side, upstream
    errors, structured, embedding, semantic and word pairs, near ties, unknown lengths."""
    text = route != "embeddings"
    exact = rng.random() < 0.3
    error = rng.random() < 0.04
    record = shadow_record(
        n,
        decision_id=f"{n:032x}",
        ts=T0 + rng.random() * 4 * 3600,
        route=route,
        kind=kind,
        sampled=sampled,
        stream=rng.random() < 0.5,
        endpoint="chat" if text else "embeddings",
        primary_pool="gpu",
        candidate_pool="gpu" if kind == "noise" else rng.choice(("cim", "asic")),
        candidate_status=None if error else 200,
        candidate_error=rng.choice(("timeout", "http_502", "broken_stream")) if error else None,
        failure=rng.choice((None, None, "empty", "truncated")) if rng.random() < 0.1 else None,
        primary_failure="empty" if rng.random() < 0.03 else None,
        primary_ttft_ms=rng.lognormvariate(5, 0.5),
        candidate_ttft_ms=rng.lognormvariate(5.2, 0.6),
        primary_tpot_ms=rng.uniform(5, 60),
        candidate_tpot_ms=rng.uniform(5, 80),
        primary_e2e_ms=rng.lognormvariate(7, 0.4),
        candidate_e2e_ms=rng.lognormvariate(7.1, 0.5),
        primary_completion_tokens=rng.choice((None, 40, 120)),
        candidate_completion_tokens=rng.choice((None, 40, 130)),
        primary_prompt_tokens=rng.choice((None, 300)),
        candidate_prompt_tokens=300,
        exact_match=exact if text else None,
        normalized_match=exact or rng.random() < 0.2 if text else None,
        similarity=1.0 if exact else rng.random() ** 0.2 if text else None,
        near_tie=rng.random() < 0.3 if text and not exact else None,
        kl_divergence=rng.expovariate(5) if text else None,
        json_diff=(
            {"changed": ["a"] if rng.random() < 0.5 else []}
            if text and rng.random() < 0.1
            else None
        ),
        embedding_cosine=None if text else 1 - rng.random() ** 3 * 0.05,
        semantic_similarity=(
            1 - rng.random() ** 2 * 0.2 if route == "semantic" and text and not exact else None
        ),
        first_divergence=None if exact else rng.randrange(0, 60),
        reference_words=None if rng.random() < 0.05 else rng.randrange(20, 200),
        primary_energy_j=rng.choice((None, rng.uniform(1, 5))),
        candidate_energy_j=rng.choice((None, rng.uniform(0.5, 4))),
        primary_cost_usd=rng.choice((None, rng.uniform(1e-5, 1e-4))),
        candidate_cost_usd=rng.choice((None, rng.uniform(1e-5, 1e-4))),
    )
    return record


def week(seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows, n = [], 0
    for route in ("chat", "semantic", "embeddings"):
        for sampled in (False, True):
            for kind, count in (("candidate", 2500), ("noise", 2500)):
                for _ in range(count):
                    rows.append(varied(rng, n, kind, route, sampled))
                    n += 1
    return rows


def failure_of(r: dict[str, Any]) -> str | None:
    if r["failure"]:
        return str(r["failure"])
    return None if r["candidate_error"] is None else UPSTREAM.get(r["candidate_error"], ERROR)


def from_rows(
    rows: Sequence[dict[str, Any]],
    paraphrase_of: Callable[[str], float | None],
) -> tuple[dict[tuple[str, str], Evidence], dict[tuple[str, bool], Any]]:
    """The evidence computed from every record, each pair judged on its exact similarities."""
    evidence: dict[tuple[str, str], Evidence] = {}
    floors: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    pairs: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    paired: dict[tuple[str, str], list[tuple[float, ...]]] = {}
    for r in rows:
        if r["kind"] == "noise":
            if judged(r):
                floors.setdefault((r["route"], r["sampled"]), []).append(r)
            continue
        key = (r["route"], r["candidate_pool"])
        e = evidence.setdefault(key, Evidence(*key))
        e.sent += 1
        e.first_ts = r["ts"] if e.first_ts is None else min(e.first_ts, r["ts"])
        e.last_ts = r["ts"] if e.last_ts is None else max(e.last_ts, r["ts"])
        e.failures.add(r["primary_failure"], failure_of(r))
        e.slo.add(*(met(r, side, targets(r["slo_class"])) for side in ("primary", "candidate")))
        if judged(r):
            pairs.setdefault((*key, r["sampled"]), []).append(r)
        if r["candidate_error"] is not None:
            e.errors += 1
            continue
        if r["primary_cost_usd"] is not None and r["candidate_cost_usd"] is not None:
            e.priced += 1
            e.cheaper += r["candidate_cost_usd"] < r["primary_cost_usd"]
        for name in ("primary_ttft_ms", "candidate_ttft_ms", "primary_e2e_ms", "candidate_e2e_ms"):
            getattr(e, name).add(r[name])
        paired.setdefault(key, []).append(
            tuple(
                r[f"{side}_{m}"]
                for m in ("energy_j", "cost_usd")
                for side in ("primary", "candidate")
            )
        )
    tolerances = {k: tolerance(floor, paraphrase_of(k[0])) for k, floor in floors.items()}
    for (route, candidate), e in evidence.items():
        for sampled, a in ((False, e.greedy), (True, e.sampled)):
            held_to = tolerances[route, sampled]
            own = [
                (r, w)
                for r in pairs.get((route, candidate, sampled), [])
                if (w := at_risk(r)) is not None
            ]
            floor = [(r, w) for r in floors[route, sampled] if (w := at_risk(r)) is not None]
            a.compared, a.noise_compared = len(own), len(floor)
            a.departed = sum(departs(r, held_to) for r, _ in own)
            a.noise_departed = sum(departs(r, held_to) for r, _ in floor)
            a.words, a.noise_words = sum(w for _, w in own), sum(w for _, w in floor)
            a.exact = sum(bool(r["exact_match"]) for r, _ in own)
            a.noise_exact = sum(bool(r["exact_match"]) for r, _ in floor)
            a.unmeasured = (
                len(pairs.get((route, candidate, sampled), [])) + len(floors[route, sampled])
                - len(own) - len(floor)
            )  # fmt: skip
        for i, name in enumerate(("energy_j", "cost_usd")):
            both = [
                p[2 * i : 2 * i + 2]
                for p in paired[route, candidate]
                if None not in p[2 * i : 2 * i + 2]
            ]
            setattr(e, f"primary_{name}", math.fsum(p for p, _ in both) / len(both))
            setattr(e, f"candidate_{name}", math.fsum(c for _, c in both) / len(both))
    return evidence, tolerances


def near(r: dict[str, Any], held_to: Any) -> bool:
    """Say whether a pair's deciding similarity is within a bucket of the tolerance."""
    return any(
        r[name] is not None and abs(r[name] - limit) <= 1 / BUCKETS
        for name, limit in (
            ("semantic_similarity", held_to.meaning),
            ("embedding_cosine", held_to.vectors),
            ("similarity", held_to.words),
        )
    )


def stored_minutes(database: str, rows: list[dict[str, Any]]) -> list[Any]:
    """Store the rows' minutes and read them back, as the judge does."""
    db = connect(database)
    with db.begin() as conn:
        conn.execute(shadow_minutes.insert(), [m.row() for m in summarize(rows, targets)])
    with db.connect() as conn:
        return list(conn.execute(sa.select(shadow_minutes)).mappings())


def spread(rows: list[dict[str, Any]], days: int) -> list[dict[str, Any]]:
    """Spread the rows over `days` days, a copy in each in turn."""
    return [{**r, "ts": r["ts"] + (i % days) * DAY_S} for i, r in enumerate(rows)]


@pytest.mark.parametrize("compacted", [False, True], ids=["minutes", "days and hours"])
def test_evidence_from_minutes_equals_the_evidence_from_every_record(
    database: str, compacted: bool
) -> None:
    rows = spread(week(), 3)
    expected, tolerances = from_rows(rows, paraphrase)
    minutes = stored_minutes(database, rows)
    assert len(minutes) < len(rows) / 2  # a summary, not a copy
    if compacted:  # the first day into a row per key, the next two into hours
        db = connect(database)
        assert compact(db, T0 + 2 * DAY_S + 5 * 3600) == len(minutes)
        with db.connect() as conn:
            minutes = list(conn.execute(sa.select(shadow_minutes)).mappings())
        assert {m["span_s"] for m in minutes} == {DAY_S, HOUR_S}
    got = from_minutes(minutes, paraphrase)
    assert set(got) == set(expected)
    for key, want in expected.items():
        e = got[key]
        for name in ("sent", "errors", "cheaper", "priced", "first_ts", "last_ts"):
            assert getattr(e, name) == getattr(want, name), (key, name)
        assert e.failures == want.failures
        assert e.slo == want.slo
        for name in (
            "primary_energy_j",
            "candidate_energy_j",
            "primary_cost_usd",
            "candidate_cost_usd",
        ):
            assert getattr(e, name) == pytest.approx(getattr(want, name), rel=1e-9)
        for name in ("primary_ttft_ms", "candidate_ttft_ms", "primary_e2e_ms", "candidate_e2e_ms"):
            # Read from the minutes' sketches: within their 1 % and the judge's 2 % bins.
            assert getattr(e, name).n == getattr(want, name).n
            assert getattr(e, name).quantile(0.95) == pytest.approx(
                getattr(want, name).quantile(0.95), rel=0.03
            )
        route = key[0]
        for sampled, a, b in ((False, e.greedy, want.greedy), (True, e.sampled, want.sampled)):
            for name in (
                "compared",
                "words",
                "exact",
                "noise_compared",
                "noise_words",
                "noise_exact",
                "unmeasured",
            ):
                assert getattr(a, name) == getattr(b, name), (key, sampled, name)
            held_to = tolerances[route, sampled]
            own = [
                r
                for r in rows
                if r["kind"] == "candidate"
                and (r["route"], r["candidate_pool"], r["sampled"]) == (*key, sampled)
            ]
            floor = [
                r
                for r in rows
                if r["kind"] == "noise" and (r["route"], r["sampled"]) == (route, sampled)
            ]
            assert abs(a.departed - b.departed) <= sum(near(r, held_to) for r in own)
            assert abs(a.noise_departed - b.noise_departed) <= sum(near(r, held_to) for r in floor)
            assert b.departed > 0 and b.noise_departed > 0  # the week decides on similarities


def test_tolerances_read_from_minutes_are_within_a_bucket_of_the_exact_ones() -> None:
    rows = week(11)
    _, exact = from_rows(rows, paraphrase)
    floors: dict[tuple[str, bool], Tally] = {}
    for r in rows:
        if r["kind"] == "noise":
            floors.setdefault((r["route"], r["sampled"]), Tally()).copy(r, None)
    measured = 0
    for key, want in exact.items():
        have = tolerance(floors[key].floor_pairs(), paraphrase(key[0]))
        # Read from the floor's counts, without a row per pair, it is the same.
        assert floors[key].floor_tolerance(paraphrase(key[0])) == have
        assert floors[key].floor_tolerance() == tolerance(floors[key].floor_pairs())
        assert have.noise_pairs == want.noise_pairs >= 2000  # percentiles trusted
        for name in ("meaning", "words", "vectors"):
            assert 0 <= getattr(want, name) - getattr(have, name) < 1 / BUCKETS, (key, name)
            measured += getattr(want, name) not in (0.98, 0.95, 0.9)
    assert measured  # some tolerance came from a floor's percentile, not a start


def test_a_floors_counts_give_the_tolerance_its_pairs_give_few_odd_or_many_differing() -> None:
    """The rule read from a floor's counts is the rule on its pairs: a handful of odd pairs
    among 2,500 matching ones loosens nothing, a sampled floor's many differing pairs loosen
    the word and meaning tolerances to its 1st percentile over all its pairs."""
    exact = {"exact_match": True}

    def odd(x: float) -> dict[str, Any]:
        return {"exact_match": False, "near_tie": False, "similarity": x, "semantic_similarity": x}

    floors = {
        "one odd": [(odd(0.45), 1), (exact, 2499)],
        "a handful": [(odd(0.45), 5), (exact, 2495)],
        "sampled": [(odd(0.3 + 0.001 * i), 1) for i in range(400)] + [(exact, 2100)],
    }
    for name, floor in floors.items():
        tally, rows = Tally(), []
        for n, (measures, k) in enumerate(floor):
            r = shadow_record(n, kind="noise", candidate_pool="gpu", **measures).row()
            tally.copy(r, None, k)
            rows += [r] * k
        for paraphrase in (None, 0.83):
            have = tally.floor_tolerance(paraphrase)
            assert have == tolerance(rows, paraphrase), (name, paraphrase)
            loose = name == "sampled"
            assert (have.words < 0.95) == loose and (have.meaning < 0.83) == (
                loose and not paraphrase
            )


def test_a_pairs_class_departs_as_the_pair_does_away_from_the_tolerance() -> None:
    """What decides a departure is in a pair's class: a rule that reads more of a pair than
    departures.decided and departures.deciding say fails here."""
    rng = random.Random(3)
    for held_to in (tolerance(()), tolerance((), 0.9)):
        for n in range(3000):
            route = rng.choice(("chat", "semantic", "embeddings"))
            r = varied(rng, n, "candidate", route, False)
            if not judged(r) or near(r, held_to):
                continue
            name, value, _ = pair_class(r)
            if name is None or name == FAILED:
                assert value == departs(r, held_to), r
            else:
                assert departs(representative(name, value), held_to) == departs(r, held_to), r


def test_the_writer_folds_every_copy_it_records_into_the_minutes_it_writes(database: str) -> None:
    """Copies, their energy after them and their primaries' energy fold into minutes written
    once settled; the evidence they give is the evidence of the records stored."""
    db, now = connect(database), [T0]
    policy = fleet_policy()
    rng = random.Random(5)
    records = [
        varied_record(rng, i, ("noise", "candidate")[i % 3 > 0], "chat", i % 4 == 0)
        for i in range(120)
    ]
    for i, record in enumerate(records):
        record.ts = T0 + 7 * i  # 8 or 9 a minute
    requests = []

    async def scenario() -> None:
        writer = ShadowWriter(
            db, GatewayMetrics(), wall=lambda: now[0], summaries=ShadowMinutes(targets)
        )
        for i, record in enumerate(records):
            now[0] = record.ts + 1
            energy, cost = record.primary_energy_j, record.primary_cost_usd
            record.primary_energy_j = record.primary_cost_usd = None  # known only later
            slo_class = (None, "interactive", "batch")[i % 3]
            requests.append(
                dataclasses.replace(
                    request_record(i, record.decision_id),
                    ts=record.ts,
                    slo_class=slo_class,
                    energy_j=energy,
                    cost_usd=cost,
                ).row()
            )
            candidate = (record.candidate_energy_j, record.candidate_cost_usd)
            record.candidate_energy_j = record.candidate_cost_usd = None
            writer.add(record, slo_class)
            writer.primary_energy(record.decision_id, energy, cost)
            writer.add_energy(
                CopyEnergy(
                    record.decision_id,
                    record.ts,
                    record.kind,
                    record.candidate_backend or "",
                    *candidate,
                )
            )
            if i % 10 == 0:
                await writer.flush()
        now[0] += 5 * MINUTE_S
        await writer.flush()
        with db.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(shadow_minutes)).scalar()
        await writer.stop()

    asyncio.run(scenario())
    with db.begin() as conn:
        conn.execute(request_records.insert(), requests)
    with db.connect() as conn:
        minutes = list(conn.execute(sa.select(shadow_minutes)).mappings())
    assert sum(m["sent"] for m in minutes) == len(records)
    expected = from_minutes(
        [m.row() for m in summarize(shadow_rows(db, 0), targets)], lambda _: None
    )
    assert figures(from_minutes(minutes, lambda _: None)) == figures(expected)
    assert all(e.primary_energy_j and e.candidate_cost_usd for e in expected.values())
    # And the judge reads them, not the records: without the minutes it finds nothing.
    judged_later = T0 + 30 * 86400
    assert figures(load_evidence(db, policy, T0, now=judged_later)) == figures(expected)
    with db.begin() as conn:
        conn.execute(shadow_minutes.delete())
    assert load_evidence(db, policy, T0, now=judged_later) == {}


def figures(evidence: dict[tuple[str, str], Evidence]) -> dict[tuple[str, str], Any]:
    """What the judge decides on, means rounded to the digits sums in another order keep."""
    return {
        key: (
            e.sent, e.errors, e.failures, e.slo, e.greedy, e.sampled, e.priced, e.cheaper,
            e.first_ts, e.last_ts,
            *(round(getattr(e, f"{side}_{m}"), 12) for side in SIDES for m in MEANS),
            *(getattr(e, f"{side}_{m}_ms").counts for side in SIDES for m in ("ttft", "e2e")),
        )
        for key, e in evidence.items()
    }  # fmt: skip


def test_primaries_beyond_the_cap_forget_the_oldest_energy_only() -> None:
    shadows = ShadowMinutes(targets, max_primaries=2)
    now = 1_700_000_040.0
    for n in range(3):
        shadows.primary_energy(f"{n:032x}", 2.0 + n, 1e-4)
    for n in range(3):  # each copy's own energy is in its record; its primary's is held
        row = shadow_record(n, ts=now, candidate_energy_j=1.0, candidate_cost_usd=5e-5).row()
        shadows.copy(row, None, now)

    (minute,) = shadows.take(math.inf)
    # The first primary's energy was dropped for the two after it: its copy has no pair.
    assert (minute.energy_pairs, minute.priced, minute.primary_energy_j) == (2, 2, 7.0)


def test_a_record_standing_for_copies_alike_folds_as_the_record_repeated() -> None:
    rng = random.Random(5)
    alike = [(r, rng.randint(1, 9)) for r in week(5)[::5]]
    repeated = [r for r, n in alike for _ in range(n)]
    folded = [m.row() for m in summarize_alike(alike, targets)]
    expected = [m.row() for m in summarize(repeated, targets)]
    assert figures(from_minutes(folded, paraphrase)) == figures(from_minutes(expected, paraphrase))
    counted = ("sent", "failures", "errors", "latency", "pairs", "floor", "worst")
    assert [[r[c] for c in counted] for r in folded] == [[r[c] for c in counted] for r in expected]


def test_settled_hours_compact_into_an_hour_row_per_key_that_judges_the_same(
    database: str,
) -> None:
    rows = week(13)
    minutes = stored_minutes(database, rows)
    db = connect(database)
    later = T0 + 86400
    assert compact(db, later) == len(minutes)
    assert compact(db, later) == 0  # each minute is folded once
    with db.connect() as conn:
        hours = list(conn.execute(sa.select(shadow_minutes)).mappings())
    assert {h["span_s"] for h in hours} == {3600.0} and len(hours) < len(minutes) / 20
    assert figures(from_minutes(hours, paraphrase)) == figures(from_minutes(minutes, paraphrase))


def test_settled_days_compact_into_a_day_row_per_key_a_day_after_they_end(database: str) -> None:
    rows = spread(week(17), 4)
    minutes = stored_minutes(database, rows)
    db = connect(database)
    # Two hours into the fourth day: the first two days are a day behind, the third and the
    # fourth's first hour are hours, the rest of the fourth is minutes.
    now = T0 + 3 * DAY_S + 2 * 3600 + 300
    assert compact(db, now) < len(minutes)
    assert compact(db, now) == 0  # each row is folded once
    with db.connect() as conn:
        rows_now = list(conn.execute(sa.select(shadow_minutes)).mappings())
    days = [r for r in rows_now if r["span_s"] == DAY_S]
    hours = [r for r in rows_now if r["span_s"] == HOUR_S]
    assert {r["ts"] for r in days} == {DAY0, DAY0 + DAY_S}
    assert {r["ts"] - r["ts"] % DAY_S for r in hours} == {DAY0 + 2 * DAY_S, DAY0 + 3 * DAY_S}
    assert all(r["ts"] >= T0 + 3 * DAY_S + 3600 for r in rows_now if r["span_s"] == MINUTE_S)
    assert len(days) == 2 * 18  # a row per day and key: 3 routes, 3 pools, sampled or not
    assert figures(from_minutes(rows_now, paraphrase)) == figures(from_minutes(minutes, paraphrase))
    # A day later the third day is a row per key too; the judge reads the same.
    compact(db, now + DAY_S)
    with db.connect() as conn:
        later = list(conn.execute(sa.select(shadow_minutes)).mappings())
    assert {r["ts"] for r in later if r["span_s"] == DAY_S} == {DAY0 + d * DAY_S for d in range(3)}
    assert figures(from_minutes(later, paraphrase)) == figures(from_minutes(minutes, paraphrase))


def test_the_promotion_window_is_read_in_whole_days_from_every_copy_in_them(
    database: str,
) -> None:
    """The judge's window starts at a day's start, so its compacted days are read whole: the
    evidence `evaluate` reads equals the one computed from the records of those days."""
    policy = fleet_policy()
    rules = criteria(policy)
    rows = spread(week(19), 4)
    db = connect(database)
    with db.begin() as conn:
        conn.execute(
            shadow_minutes.insert(), [m.row() for m in summarize(rows, slo_targets(policy))]
        )
    now = T0 + 2 * rules.min_window_s + DAY_S + 5 * 3600  # the window starts on the second day
    compact(db, now)
    since = window(rules, now)
    assert since == DAY0 + DAY_S
    inside = [r for r in rows if r["ts"] >= since]
    assert 0 < len(inside) < len(rows)
    expected = from_minutes(
        [m.row() for m in summarize(inside, slo_targets(policy))], paraphrases(policy)
    )
    got = load_evidence(db, policy, since, now=now)
    assert figures(got) == figures(expected)
