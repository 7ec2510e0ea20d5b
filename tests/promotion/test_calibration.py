"""Calibration: the judge's error rates on simulated shadow streams meet their targets."""

from __future__ import annotations

from gateway.promotion.calibration import calibrate


def test_calibration_meets_its_targets() -> None:
    result = calibrate(runs=25, seed=3)
    assert result["false_promotion_rate"] <= 0.05
    assert result["power_reject_worse"] >= 0.95
    assert result["power_promote_good"] >= 0.90
    assert result["scenarios"]["aa"]["outcomes"].get("promote", 0) == 0
