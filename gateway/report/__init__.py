"""The weekly shadow-comparison report: one page an operator decides promotions from.

- `period`: which week (or date range) a report covers, and the one before it.
- `records`: the period's records read from the database (the one edge that reads).
- `verdicts`: the judge run on those rows at the end of the period and of the one before.
- `numbers`: the rows folded into plain numbers (pure).
- `wording`: the measures' titles and the verdicts in sentences (pure).
- `charts`: matplotlib figures rendered to SVG text.
- `render`: report.html (self-contained), report.md and report.json written to a directory.
- `schedule`: the report written on a schedule by a running gateway.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gateway.costmodel.predict import CostModel
from gateway.policy.definition import Policy
from gateway.report import records, render
from gateway.report.period import Period


def generate(
    db: sa.Engine,
    policy: Policy,
    period: Period,
    out: Path,
    *,
    model: CostModel | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Read the period's records and write report.html, report.md and report.json into `out`."""
    report = records.collect(
        db, policy, period, now=time.time() if now is None else now, model=model
    )
    render.write(report, out)
    return report
