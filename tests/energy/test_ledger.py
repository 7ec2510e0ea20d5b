from __future__ import annotations

import pytest

from gateway.energy.ledger import SETTLE_WITHIN_S, STEP, BackendLedger


def ledger_with_idle(idle_w: float = 100.0) -> BackendLedger:
    ledger = BackendLedger(idle_w=idle_w)
    ledger.reading(0.0, 0.0)
    return ledger


def test_dynamic_energy_follows_work_and_idle_follows_time() -> None:
    ledger = ledger_with_idle(100.0)
    ledger.open("light", 0.0)
    ledger.open("heavy", 0.0)
    ledger.close("light", 1.0, prompt_tokens=0, completion_tokens=10)
    ledger.close("heavy", 1.0, prompt_tokens=0, completion_tokens=30)
    ledger.reading(1.0, 500.0)  # 100 J idle + 400 J dynamic
    spans = {s.key: s for s in ledger.settle()}
    assert spans["light"].energy_j == pytest.approx(50 + 100)
    assert spans["heavy"].energy_j == pytest.approx(50 + 300)
    assert spans["light"].device_s == pytest.approx(0.5)


def test_energy_is_conserved_across_overlapping_requests() -> None:
    ledger = ledger_with_idle(50.0)
    ledger.open("a", 0.2)
    ledger.reading(1.0, 300.0)
    ledger.open("b", 1.5)
    ledger.close("a", 2.5, prompt_tokens=400, completion_tokens=40, first_token=0.4)
    ledger.reading(2.0, 700.0)
    ledger.close("b", 2.8, prompt_tokens=100, completion_tokens=5)
    ledger.reading(3.0, 1000.0)
    spans = ledger.settle()
    # Everything measured while a request ran is attributed; only the idle draw of the quiet
    # stretches [0, 0.2] and [2.8, 3] is the fleet's.
    assert sum(s.energy_j for s in spans) == pytest.approx(1000.0 - 0.2 * 50.0 - 0.2 * 50.0)


def test_interval_waits_until_every_overlapping_request_has_ended() -> None:
    ledger = ledger_with_idle()
    ledger.open("short", 0.0)
    ledger.open("long", 0.0)
    ledger.close("short", 0.5, 0, 5)
    ledger.reading(1.0, 200.0)
    assert ledger.settle() == []  # "long" still runs: its share of [0, 1] is not known yet
    ledger.close("long", 1.5, 0, 15)
    ledger.reading(2.0, 350.0)
    keys = sorted(s.key for s in ledger.settle())
    assert keys == ["long", "short"]


def test_span_is_final_only_once_readings_cover_its_end() -> None:
    ledger = ledger_with_idle()
    ledger.open("a", 0.1)
    ledger.close("a", 1.5, 10, 10)
    ledger.reading(1.0, 100.0)
    assert ledger.settle() == []
    ledger.reading(2.0, 180.0)
    (span,) = ledger.settle()
    assert span.energy_j > 0


def test_prefill_tokens_weigh_less_than_decoded_tokens() -> None:
    ledger = ledger_with_idle(0.0)
    ledger.open("prompt-heavy", 0.0)
    ledger.open("output-heavy", 0.0)
    ledger.close("prompt-heavy", 1.0, prompt_tokens=1000, completion_tokens=10)
    ledger.close("output-heavy", 1.0, prompt_tokens=10, completion_tokens=100)
    ledger.reading(1.0, 1000.0)
    spans = {s.key: s.energy_j for s in ledger.settle()}
    assert spans["output-heavy"] > spans["prompt-heavy"]


def test_idle_power_is_learned_from_quiet_intervals() -> None:
    ledger = BackendLedger(idle_w=300.0)  # the nominal figure is wrong
    ledger.reading(0.0, 0.0)
    ledger.reading(1.0, 120.0)
    assert ledger.idle_w == pytest.approx(120.0)
    ledger.reading(2.0, 400.0)  # someone else's load: idle creeps up, it does not jump
    assert ledger.idle_w < 125.0


def test_idle_draw_rises_as_fast_however_often_the_counter_is_read() -> None:
    often, seldom = BackendLedger(idle_w=100.0), BackendLedger(idle_w=100.0)
    for ledger in (often, seldom):  # seen idle at 100 W, then quiet at 110 W for 10 s
        ledger.reading(0.0, 0.0)
        ledger.reading(1.0, 100.0)
    for t in range(2, 12):
        often.reading(float(t), 100.0 + 110.0 * (t - 1))
    seldom.reading(11.0, 100.0 + 110.0 * 10)
    assert 100.0 < seldom.idle_w < 101.0  # 1 % a second: about 0.96 W in 10 s
    assert seldom.idle_w == pytest.approx(often.idle_w)


def test_counter_reset_drops_one_interval_only() -> None:
    ledger = ledger_with_idle()
    ledger.open("a", 0.0)
    ledger.reading(1.0, 100.0)
    ledger.reading(2.0, 5.0)  # exporter restarted
    ledger.close("a", 2.5, 0, 3)
    ledger.reading(3.0, 105.0)
    (span,) = ledger.settle()
    assert span.energy_j == pytest.approx(100.0 + 50.0)  # [2, 3] is half idle


def test_replicas_sharing_a_backend_split_its_energy_once_between_them() -> None:
    # Two gateways each see one of two equal requests on the device: each takes its half.
    energy = []
    for replica in ("a", "b"):
        ledger = BackendLedger(idle_w=100.0)
        ledger.reading(0.0, 0.0, share=0.5)
        ledger.open(replica, 0.0)
        ledger.close(replica, 1.0, prompt_tokens=0, completion_tokens=10)
        ledger.reading(1.0, 500.0, share=0.5)  # 100 J idle + 400 J dynamic, for both
        energy += [s.energy_j for s in ledger.settle()]
    assert energy == pytest.approx([250.0, 250.0])
    assert sum(energy) == pytest.approx(500.0)


def test_a_request_that_runs_on_settles_its_neighbours_within_the_bound() -> None:
    """An hour-long stream holds nobody's energy: an interval it overlaps is split once
    SETTLE_WITHIN_S has passed, the stream going at the pace of the requests that ended."""
    ledger = ledger_with_idle(100.0)
    ledger.open("stream", 0.0)
    ledger.open("short", 0.0)
    ledger.close("short", 1.0, prompt_tokens=0, completion_tokens=10)
    ledger.reading(1.0, 500.0)  # 100 J idle + 400 J dynamic
    for t in range(2, 1 + int(SETTLE_WITHIN_S)):
        ledger.reading(float(t), 500.0 + 400.0 * (t - 1))
        assert ledger.settle() == []  # within the bound, it waits for the stream's work
    ledger.reading(1.0 + SETTLE_WITHIN_S, 500.0 + 400.0 * SETTLE_WITHIN_S)
    (short,) = ledger.settle()
    # Both ran the whole second; the stream, still running, went at the short one's pace.
    assert short.key == "short"
    assert short.energy_j == pytest.approx(200.0 + 50.0)
    assert short.device_s == pytest.approx(0.5)
    assert "stream" in ledger
    # The stream's later intervals, and what it was given of the first, settle when it ends.
    end = 1.0 + SETTLE_WITHIN_S
    ledger.close("stream", end, prompt_tokens=0, completion_tokens=60)
    ledger.reading(end + 1, 500.0 + 400.0 * SETTLE_WITHIN_S + 100.0)  # idle after it
    (stream,) = ledger.settle()
    assert stream.energy_j == pytest.approx(500.0 + 400.0 * SETTLE_WITHIN_S - 250.0)


def test_settling_pauses_every_few_requests_so_a_loop_can_serve_between() -> None:
    ledger = ledger_with_idle(10.0)
    for n in range(1000):
        ledger.open(str(n), n / 1000)
        ledger.close(str(n), n / 1000 + 0.0005, prompt_tokens=5, completion_tokens=1)
    ledger.reading(1.0, 100.0)
    gap = longest = 0
    spans = []
    for item in ledger.settling():
        if item is None:
            gap = 0
            continue
        spans.append(item)
        gap += 1
        longest = max(longest, gap)
    assert len(spans) == 1000
    assert sum(s.energy_j for s in spans) == pytest.approx(100.0 - 10.0 * 0.5)
    # Between two pauses: at most a step of splitting, or a step of finished spans.
    assert longest <= STEP


def test_requests_opened_out_of_order_count_the_time_anything_ran_once() -> None:
    ledger = ledger_with_idle(100.0)
    ledger.open("later", 0.5)
    ledger.open("earlier", 0.2)  # its start was read before the other's, told after
    ledger.close("later", 0.6, 0, 1)
    ledger.close("earlier", 0.4, 0, 1)
    ledger.reading(1.0, 100.0)  # idle only
    spans = ledger.settle()
    # Busy 0.3 s of the second: that share of the idle draw and of the device's time.
    assert sum(s.energy_j for s in spans) == pytest.approx(30.0)
    assert sum(s.device_s for s in spans) == pytest.approx(0.3)
