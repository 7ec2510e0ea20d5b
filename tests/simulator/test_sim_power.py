"""The power curve passes through the profile's figures and rises sub-linearly."""

import pytest

from simulator.power import PowerCurve
from simulator.profile import PowerFigures, load_profile

GPU = PowerFigures(idle_w=120, batch1_w=270, max_w=680, max_at_batch=128)


def test_curve_passes_through_idle_batch1_and_max():
    curve = PowerCurve(GPU)
    assert curve.watts(0) == pytest.approx(120)
    assert curve.watts(1) == pytest.approx(270)
    assert curve.watts(128) == pytest.approx(680)


def test_dynamic_power_grows_sub_linearly():
    curve = PowerCurve(GPU)
    for n in (1, 2, 4, 8, 16, 32):
        assert curve.watts(n + 1) > curve.watts(n)
        assert curve.watts(2 * n) - 120 < 2 * (curve.watts(n) - 120)


def test_power_per_sequence_falls_as_the_batch_grows():
    curve = PowerCurve(GPU)
    per_sequence = [curve.watts(n) / n for n in (1, 2, 4, 8, 16, 32)]
    assert per_sequence == sorted(per_sequence, reverse=True)


def test_power_is_capped_at_max():
    curve = PowerCurve(PowerFigures(idle_w=8, batch1_w=20, max_w=45, max_at_batch=4))
    assert curve.watts(4) == pytest.approx(45)
    assert curve.watts(40) == pytest.approx(45)


@pytest.mark.parametrize("name", ["gpu", "asic", "cim"])
def test_every_bundled_profile_has_a_sub_linear_curve(name):
    assert 0 < PowerCurve(load_profile(name).power).alpha < 1
