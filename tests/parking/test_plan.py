"""Parking's plan: the backends each pool's forecast needs, woken at once, parked one at a time."""

from __future__ import annotations

import itertools

from gateway.fleet.state import DRAINING, PARKED, Fleet
from gateway.parking.plan import (
    HOLD_S,
    PACK,
    PREFILL_SHARE,
    PROMPT_PEAK_S,
    SHORT_S,
    WINDOW_S,
    Parking,
)
from policies import BIG, MODEL, fleet_policy


def fleet(gpus: int = 4, asics: int = 2) -> Fleet:
    return Fleet(
        fleet_policy(
            gpu=[f"http://127.0.0.1:{10 + i}" for i in range(gpus)],
            asic=[f"http://127.0.0.1:{20 + i}" for i in range(asics)],
        )
    )


def parks(moves: list) -> list[str]:
    return [m.backend.name for m in moves if m.action == "park"]


def wakes(moves: list) -> list[str]:
    return [m.backend.name for m in moves if m.action == "wake"]


def test_an_idle_pool_parks_one_backend_per_hold_down_to_one() -> None:
    f, parking = fleet(), Parking()
    gpu = f.pools["gpu"]
    parked = []
    now = 0.0
    while now < 10 * HOLD_S:
        for name in parks(parking.plan(f, now)):
            backend = next(b for b in gpu.backends + f.pools["asic"].backends if b.name == name)
            backend.parking = PARKED
            parked.append((now, name))
        now += 1.0
    gpu_parks = [t for t, name in parked if name.startswith("gpu")]
    # Three of four GPUs, HOLD_S apart; the pool's last stays on, as does the ASIC pool's.
    assert len(gpu_parks) == 3
    assert [b - a for a, b in itertools.pairwise(gpu_parks)] == [HOLD_S, HOLD_S]
    assert gpu_parks[0] == HOLD_S
    assert sum(b.parking == "" for b in gpu.backends) == 1
    assert sum(b.parking == "" for b in f.pools["asic"].backends) == 1


def test_load_wakes_what_it_needs_at_once_draining_ones_first() -> None:
    f, parking = fleet(), Parking()
    gpu = f.pools["gpu"]
    one, two, three, four = gpu.backends
    two.parking, three.parking, four.parking = DRAINING, PARKED, PARKED
    # The one GPU on holds more than PACK of its slots: two backends' worth of load.
    one.in_flight = int(one.slots * PACK) + 1
    moves = parking.plan(f, 0.0)
    assert wakes(moves) == [two.name]
    assert "forecast" in moves[0].reason


def test_arrivals_forecast_load_before_it_is_in_flight() -> None:
    f, parking = fleet(), Parking()
    gpu = f.pools["gpu"]
    for b in gpu.backends[1:]:
        b.parking = PARKED
    slots = gpu.spec.slots_per_backend
    # A request holds its slot 5 s; arrivals at a rate that keeps 2.5 backends' PACK busy.
    for _ in range(50):
        parking.finished("gpu", 5.0)
    rate = 2.5 * slots * PACK / 5.0
    for i in range(int(rate * WINDOW_S)):
        parking.arrived("gpu", i / rate)
    assert len(wakes(parking.plan(f, WINDOW_S))) == 2


def test_a_pools_last_backend_is_never_parked_even_where_it_allows_none() -> None:
    f, parking = fleet(gpus=2, asics=1), Parking(min_active={"gpu": 0})
    gpu = f.pools["gpu"]
    moved = []
    for t in range(0, int(5 * HOLD_S)):
        for m in parking.plan(f, float(t)):
            if m.action == "park":
                m.backend.parking = PARKED
                moved.append(m.backend.name)
    assert moved == [gpu.backends[0].name] or moved == [gpu.backends[1].name]
    assert sum(b.parking == "" for b in gpu.backends) == 1


def test_an_ejected_backend_counts_as_off_so_another_is_woken_in_its_place() -> None:
    f, parking = fleet(gpus=2, asics=1), Parking()
    first, second = f.pools["gpu"].backends
    first.ejected, second.parking = True, PARKED
    assert wakes(parking.plan(f, 0.0)) == [second.name]
    # Nor is the only backend serving parked while the other is ejected.
    second.parking = ""
    assert parks([m for t in range(int(3 * HOLD_S)) for m in parking.plan(f, float(t))]) == []


def test_a_parked_backend_takes_no_request_and_leaves_the_pools_capacity() -> None:
    f = fleet(gpus=2, asics=1)
    gpu = f.pools["gpu"]
    first, second = gpu.backends
    first.parking = DRAINING
    assert not first.takes(0.0) and second.takes(0.0)
    assert gpu.healthy() == [second]
    assert gpu.most_free() is second


def test_a_pool_slow_to_wake_wakes_ahead_of_rising_arrivals() -> None:
    slots = fleet().pools["gpu"].spec.slots_per_backend

    def woken(wake_s: float) -> int:
        f, parking = fleet(), Parking(wake_s={"gpu": wake_s})
        for b in f.pools["gpu"].backends[1:]:
            b.parking = PARKED
        for _ in range(50):
            parking.finished("gpu", 5.0)
        # Quiet for most of the window, then arrivals that fill 90% of one backend's PACK.
        rate = 0.9 * slots * PACK / 5.0
        for i in range(int(rate * SHORT_S)):
            parking.arrived("gpu", WINDOW_S - SHORT_S + i / rate)
        moves = parking.plan(f, WINDOW_S)
        assert wake_s == 0 or all("wake-up" in m.reason for m in moves)
        return len(wakes(moves))

    # Without a wake-up time the rate now is what the pool needs; a slow wake-up sees it rise.
    assert woken(0.0) == 0 < woken(60.0)


RELEASE = {
    "hook": "command",
    "mode": "release",
    "park_command": ["/usr/local/bin/fleetctl", "release", "{name}"],
    "wake_command": ["/usr/local/bin/fleetctl", "provision", "{name}"],
    "wake_s": 180,
    "hook_timeout_s": 600,
}


def first_wake(parking: Parking, slope: float) -> float:
    """Return when the plan first wakes a parked GPU as arrivals ramp up, `slope` more each
    second every second, from nothing."""
    f = fleet()
    for b in f.pools["gpu"].backends[1:]:
        b.parking = PARKED
    for _ in range(50):
        parking.finished("gpu", 5.0)
    arrived = 0
    for now in itertools.count(1):
        # Arrivals so far: the integral of slope * t, each at its own instant.
        while (arrived + 1) <= slope * now**2 / 2:
            arrived += 1
            parking.arrived("gpu", (2 * arrived / slope) ** 0.5)
        if wakes(parking.plan(f, float(now))):
            return float(now)
    raise AssertionError("unreachable")


def test_a_pool_slow_to_wake_wakes_ahead_of_a_ramp_by_at_least_its_wake_up() -> None:
    released = fleet_policy(gpu_extra={"parking": RELEASE})
    parking = Parking.of(released)
    assert parking.releases == {"gpu"} and parking.wake_s == {"gpu": 180}
    # The same ramp, planned without a wake-up time, wakes when the rate now needs a backend.
    at_once = first_wake(Parking(), slope=0.01)
    ahead = first_wake(parking, slope=0.01)
    assert at_once - ahead >= 180


def test_a_released_pool_parks_no_sooner_than_its_wake_up_lasts() -> None:
    def first_park(parking: Parking) -> float:
        f = fleet()
        gpus = {b.name for b in f.pools["gpu"].backends}
        return next(t for t in range(1000) if gpus & set(parks(parking.plan(f, float(t)))))

    slow = Parking.of(fleet_policy(gpu_extra={"parking": RELEASE | {"wake_s": 300}}))
    assert first_park(Parking()) == HOLD_S
    # Switched off sooner than a wake-up lasts, a backend needed again would cost more to
    # bring back (its idle draw and hours over the wake-up) than it saved.
    assert first_park(slow) == 300


def serving(f: Fleet, pool: str) -> int:
    return sum(b.parking == "" for b in f.pools[pool].backends)


def planned(f: Fleet, parking: Parking, now: float) -> None:
    """Plan at `now` and take the moves at once (a parked backend wakes at once)."""
    for move in parking.plan(f, now):
        move.backend.parking = PARKED if move.action == "park" else ""


def test_a_pool_keeps_the_backends_its_prompts_prefill_needs_however_few_slots_they_hold() -> None:
    policy = fleet_policy(gpu=[f"http://127.0.0.1:{10 + i}" for i in range(4)])
    f, parking = Fleet(policy), Parking.of(policy)
    for _ in range(50):
        parking.finished("gpu", 0.5)  # short answers: one request a second holds half a slot
    # One long prompt a second, each taking 2.5 backends' PREFILL_SHARE of a second to compute.
    tokens = round(2.5 * PREFILL_SHARE / parking.prefill_s("gpu", 1, MODEL))
    for second in range(int(10 * HOLD_S)):
        parking.arrived("gpu", float(second), parking.prefill_s("gpu", tokens, MODEL))
        planned(f, parking, float(second))
    # By slots one backend would hold them all at PACK; their prefill takes three.
    assert serving(f, "gpu") == 3
    assert "prefill" in parking.needed(f.pools["gpu"], 10 * HOLD_S)[1]


def test_a_burst_of_prompts_keeps_its_backends_on_for_the_prompt_peak() -> None:
    policy = fleet_policy(gpu=[f"http://127.0.0.1:{10 + i}" for i in range(4)])
    f, parking = Fleet(policy), Parking.of(policy)
    # In one second, prompts taking three backends' PREFILL_SHARE over SHORT_S; then quiet.
    burst = 3 * PREFILL_SHARE * SHORT_S
    parking.arrived("gpu", 0.0, burst)
    on: list[int] = []
    for second in range(int(PROMPT_PEAK_S + 4 * HOLD_S)):
        planned(f, parking, float(second))
        on.append(serving(f, "gpu"))
    # Quiet for minutes, the pool still holds the burst's three (the fourth is parked after a
    # hold); once the peak has aged out it parks down to one, a hold apart.
    assert on[int(HOLD_S) - 1] == 4 and on[int(HOLD_S)] == 3
    assert set(on[int(HOLD_S) : int(PROMPT_PEAK_S)]) == {3}
    assert on[-1] == 1


def test_a_prompt_is_priced_at_its_models_prefill_on_the_pool() -> None:
    sizes = {MODEL: {"params_b": 8}, BIG: {"params_b": 16}}
    parking = Parking.of(fleet_policy(asic_extra={"compute_tflops": 400}, models=sizes))
    eight, sixteen = parking.prefill_s("gpu", 1000, MODEL), parking.prefill_s("gpu", 1000, BIG)
    assert 0 < eight < sixteen
    # A model the pool does not list is priced as its largest; a pool not known, as nothing.
    assert parking.prefill_s("gpu", 1000, "unknown-model") == sixteen
    assert parking.prefill_s("asic", 1000, MODEL) > eight  # less compute than the GPU
    assert Parking().prefill_s("gpu", 1000, MODEL) == 0.0
