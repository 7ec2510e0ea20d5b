from __future__ import annotations

import pytest

from gateway.energy.ledger import BackendLedger


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
