"""The report schedule: `gateway serve` writes last week's report by itself, once a week.

Off unless GATEWAY_REPORT_SCHEDULE names a weekday and a UTC time, e.g. "mon 06:00". Each report
goes into GATEWAY_REPORTS_DIR/<week>/ (report.html, report.md, report.json) and is kept; the
admin API lists them and serves the files.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gateway.costmodel.predict import CostModel
from gateway.periodic import Periodic
from gateway.policy.definition import Policy
from gateway.report import generate
from gateway.report.period import ISO_WEEK, last_complete_week

log = logging.getLogger(__name__)

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
SCHEDULE = re.compile(r"^(mon|tue|wed|thu|fri|sat|sun)\s+([01]\d|2[0-3]):([0-5]\d)$")
FILES = ("report.html", "report.md", "report.json")


def parse_schedule(text: str) -> tuple[int, int, int]:
    """Read 'mon 06:00' as (weekday, hour, minute); raise ValueError naming the value."""
    found = SCHEDULE.match(text.strip().lower())
    if found is None:
        raise ValueError(
            f"GATEWAY_REPORT_SCHEDULE is a weekday and a UTC time like 'mon 06:00', got {text!r}"
        )
    return DAYS.index(found.group(1)), int(found.group(2)), int(found.group(3))


def slot(now: float, schedule: tuple[int, int, int]) -> float:
    """Return this week's scheduled moment (it may be later than now)."""
    weekday, hour, minute = schedule
    today = datetime.fromtimestamp(now, UTC)
    monday = (today - timedelta(days=today.weekday())).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    return (monday + timedelta(days=weekday, hours=hour, minutes=minute)).timestamp()


def due(now: float, schedule: tuple[int, int, int], reports: Path) -> str | None:
    """Return the week to write now, or None: last week's, once this week's slot has passed."""
    if now < slot(now, schedule):
        return None
    label = last_complete_week(now).label
    return None if (reports / label / "report.html").exists() else label


def listing(reports: Path) -> list[dict[str, Any]]:
    """Return the kept reports, newest week first."""
    if not reports.is_dir():
        return []
    found = []
    for folder in reports.iterdir():
        if folder.is_dir() and ISO_WEEK.match(folder.name) and (folder / FILES[0]).exists():
            found.append(
                {
                    "week": folder.name,
                    "created": (folder / FILES[0]).stat().st_mtime,
                    "files": {name: f"/admin/reports/{folder.name}/{name}" for name in FILES},
                }
            )
    return sorted(found, key=lambda r: r["week"], reverse=True)


class ReportScheduler:
    """Check once a minute whether last week's report is due, and write it in a thread."""

    def __init__(
        self,
        schedule: tuple[int, int, int],
        reports: Path,
        db: sa.Engine,
        policy: Callable[[], Policy],
        model: Callable[[], CostModel],
        interval_s: float = 60.0,
    ):
        self._schedule = schedule
        self._reports = reports
        self._db = db
        self._policy = policy
        self._model = model
        self.periodic = Periodic("report-scheduler", interval_s, self.check, first_at_start=True)

    async def check(self, now: float | None = None) -> str | None:
        """Write the report that is due, if any; return its week."""
        now = time.time() if now is None else now
        label = due(now, self._schedule, self._reports)
        if label is None:
            return None
        span = last_complete_week(now)
        await asyncio.to_thread(
            generate,
            self._db,
            self._policy(),
            span,
            self._reports / label,
            model=self._model(),
            now=now,
        )
        log.info("weekly report %s written to %s", label, self._reports / label)
        return label

    def start(self) -> None:
        self.periodic.start()

    async def stop(self) -> None:
        await self.periodic.stop()
