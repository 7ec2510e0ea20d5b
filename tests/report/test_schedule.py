"""The weekly schedule: due once a week after its slot, kept on disk, listed and served."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.db.connection import connect, upgrade
from gateway.report.schedule import ReportScheduler, due, parse_schedule
from harness.gateways import run_gateway
from policies import fleet_policy

MONDAY_7AM = datetime(2026, 11, 30, 7, 0, tzinfo=UTC).timestamp()  # ISO week 2026-W49
MONDAY_5AM = datetime(2026, 11, 30, 5, 0, tzinfo=UTC).timestamp()


def test_schedule_is_read_and_bad_values_are_named() -> None:
    assert parse_schedule("mon 06:00") == (0, 6, 0)
    assert parse_schedule(" Sun 23:59 ") == (6, 23, 59)
    with pytest.raises(ValueError, match="'monday 6am'"):
        parse_schedule("monday 6am")


def test_last_week_is_due_after_the_slot_and_only_once(tmp_path: Path) -> None:
    schedule = parse_schedule("mon 06:00")
    assert due(MONDAY_5AM, schedule, tmp_path) is None
    assert due(MONDAY_7AM, schedule, tmp_path) == "2026-W48"
    (tmp_path / "2026-W48").mkdir()
    (tmp_path / "2026-W48" / "report.html").write_text("<html></html>")
    assert due(MONDAY_7AM, schedule, tmp_path) is None


def test_the_scheduler_writes_the_report_and_the_admin_api_serves_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    upgrade(url)
    reports = tmp_path / "reports"
    policy = fleet_policy()
    scheduler = ReportScheduler(
        parse_schedule("mon 06:00"),
        reports,
        connect(url),
        lambda: policy,
        lambda: None,  # type: ignore[arg-type,return-value]
    )
    assert asyncio.run(scheduler.check(MONDAY_7AM)) == "2026-W48"
    assert asyncio.run(scheduler.check(MONDAY_7AM)) is None  # kept: not written twice
    assert {p.name for p in (reports / "2026-W48").iterdir()} >= {
        "report.html",
        "report.md",
        "report.json",
    }
    auth = {"authorization": "Bearer t"}
    with run_gateway(policy, tmp_path, admin_token="t", reports_dir=reports) as gw, gw.http() as h:
        listed = h.get("/admin/reports", headers=auth).json()
        page = h.get(listed[0]["files"]["report.html"], headers=auth)
        missing = h.get("/admin/reports/2026-W01/report.html", headers=auth)
        sneaky = h.get("/admin/reports/..%2F..%2Fetc/passwd", headers=auth)
    assert [r["week"] for r in listed] == ["2026-W48"]
    assert (page.status_code == 200 and "<svg" in page.text) or "<html" in page.text
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "report_not_found"
    assert sneaky.status_code == 404
