"""The simplest parking hook on a real engine: its process stopped, then started and woken."""

from __future__ import annotations

import pytest
from realworld import require_engine

from bench.real_fleet_wake import wake_once
from realfleet import engine
from realfleet.fleet import BACKENDS, models, spec


def test_a_restarted_engine_answers_and_is_stopped_again(monkeypatch: pytest.MonkeyPatch) -> None:
    require_engine()
    asic = next(b for b in BACKENDS if b.part == "q8_0")
    server_spec = spec(asic, models(engine.cache_dir()))
    launched: list[engine.Server] = []
    launch = engine.launch

    def recorded(*args: object, **kwargs: object) -> engine.Server:
        launched.append(launch(*args, **kwargs))  # type: ignore[arg-type]
        return launched[-1]

    monkeypatch.setattr(engine, "launch", recorded)
    healthy, answered = wake_once(server_spec)
    assert 0 < healthy < answered
    assert len(launched) == 1 and launched[0].process.poll() is not None  # parked: no process
