"""The fleet's draw per backend and minute: every joule a meter read counts, idle gaps included;
time on and parked; estimates only where no reading covers a span, and none for a parked one."""

from __future__ import annotations

import pytest

from gateway.energy.draw import FleetDraw, Minute, Seen

T0 = 1_790_000_080.0  # 40 s into a minute
IDLE_W = 100.0


def seen(parked: bool = False, until: float | None = None, backend: str = "gpu-0") -> Seen:
    return Seen("gpu", backend, parked, IDLE_W, until)


def by_minute(rows: list[Minute]) -> dict[float, Minute]:
    assert len({(m.ts, m.backend) for m in rows}) == len(rows)
    return {m.ts: m for m in rows}


def test_a_meter_sequence_with_idle_gaps_counts_every_joule_and_second() -> None:
    """Readings every 10 s over 100 s across two minute boundaries: busy at 250 W, idle at 100 W
    between requests, busy again."""
    draw = FleetDraw()
    drawn = [2500.0, 1000.0, 1000.0, 1000.0, 2500.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0]
    draw.round(T0, [seen(until=T0)])  # the first round only starts the count
    for n, energy_j in enumerate(drawn):
        t0, t1 = T0 + 10 * n, T0 + 10 * (n + 1)
        draw.measured("gpu", "gpu-0", t0, t1, energy_j)
        draw.round(t1, [seen(until=t1)])
    minutes = by_minute(draw.take())
    # 40-60 s of the first minute, all of the second, 0-20 s of the third.
    assert sorted(minutes) == [T0 - 40, T0 + 20, T0 + 80]
    first, second, third = (minutes[t] for t in sorted(minutes))
    assert [m.energy_j for m in (first, second, third)] == pytest.approx([3500.0, 7500.0, 2000.0])
    assert sum(m.energy_j for m in minutes.values()) == pytest.approx(sum(drawn))
    assert [m.on_s for m in (first, second, third)] == pytest.approx([20.0, 60.0, 20.0])
    assert all(m.parked_s == 0 and m.estimated_j == 0 for m in minutes.values())


def test_an_interval_across_a_minute_boundary_is_split_by_time() -> None:
    draw = FleetDraw()
    draw.round(T0, [seen(until=T0)])
    draw.measured("gpu", "gpu-0", T0, T0 + 40, 4000.0)  # 20 s in each minute
    draw.round(T0 + 40, [seen(until=T0 + 40)])
    minutes = by_minute(draw.take())
    assert minutes[T0 - 40].energy_j == pytest.approx(2000.0)
    assert minutes[T0 + 20].energy_j == pytest.approx(2000.0)
    assert minutes[T0 - 40].on_s == pytest.approx(20.0)
    assert minutes[T0 + 20].on_s == pytest.approx(20.0)


def test_a_parked_backend_costs_only_what_its_meter_read() -> None:
    draw = FleetDraw()
    draw.round(T0, [seen(parked=True, until=T0)])
    draw.measured("gpu", "gpu-0", T0, T0 + 20, 20 * 30.0)  # asleep at 30 W
    draw.round(T0 + 20, [seen(parked=True, until=T0 + 20)])
    (minute,) = draw.take()
    assert minute.energy_j == pytest.approx(600.0)
    assert minute.estimated_j == 0
    assert (minute.on_s, minute.parked_s) == pytest.approx((0.0, 20.0))


def test_a_parked_backend_no_meter_reads_draws_nothing() -> None:
    """A process stopped answers no scrape: nothing is estimated for it while parked."""
    draw = FleetDraw()
    draw.round(T0, [seen(parked=True)])
    draw.round(T0 + 15, [seen(parked=True)])
    (minute,) = draw.take()
    assert (minute.energy_j, minute.estimated_j) == (0.0, 0.0)
    assert minute.parked_s == pytest.approx(15.0)


def test_a_backend_without_readings_is_estimated_at_idle_and_flagged() -> None:
    draw = FleetDraw()
    draw.round(T0, [seen()])
    draw.round(T0 + 10, [seen()])
    draw.estimated("gpu", "gpu-0", T0 + 5, 250.0)  # a request's draw above idle
    (minute,) = draw.take()
    assert minute.energy_j == pytest.approx(10 * IDLE_W + 250.0)
    assert minute.estimated_j == minute.energy_j
    assert minute.on_s == pytest.approx(10.0)


def test_a_span_no_reading_will_cover_is_estimated_up_to_the_next_reading() -> None:
    """A counter reset (or a meter's first reading) leaves a gap a reading never closes."""
    draw = FleetDraw()
    draw.round(T0, [seen(until=T0)])
    draw.round(T0 + 5, [seen(until=T0 + 4)])  # the new baseline, 4 s in
    draw.measured("gpu", "gpu-0", T0 + 4, T0 + 10, 900.0)
    draw.round(T0 + 10, [seen(until=T0 + 10)])
    (minute,) = draw.take()
    assert minute.estimated_j == pytest.approx(4 * IDLE_W)
    assert minute.energy_j == pytest.approx(4 * IDLE_W + 900.0)


def test_a_metered_backend_waits_for_its_next_reading_instead_of_estimating() -> None:
    draw = FleetDraw()
    draw.round(T0, [seen(until=T0)])
    draw.round(T0 + 1, [seen(until=T0)])  # a scrape failed: the next reading covers it
    draw.round(T0 + 2, [seen(until=T0)])
    draw.measured("gpu", "gpu-0", T0, T0 + 3, 300.0)
    draw.round(T0 + 3, [seen(until=T0 + 3)])
    (minute,) = draw.take()
    assert (minute.energy_j, minute.estimated_j, minute.on_s) == pytest.approx((300.0, 0.0, 3.0))


def test_minutes_are_handed_over_once_they_end_and_late_readings_make_another_row() -> None:
    draw = FleetDraw()
    draw.round(T0, [seen(until=T0)])
    draw.round(T0 + 30, [seen(until=T0)])
    (ended,) = draw.take(T0 + 30)
    assert ended.ts == T0 - 40 and ended.energy_j == 0
    draw.measured("gpu", "gpu-0", T0, T0 + 30, 3000.0)  # the reading arrives late
    rows = draw.take()
    assert sum(m.energy_j for m in rows) == pytest.approx(3000.0)
    assert {m.ts for m in rows} == {T0 - 40, T0 + 20}
