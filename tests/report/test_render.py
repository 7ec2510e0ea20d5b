"""The written report: charts inline, one self-contained page that Chromium renders cleanly."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reportworld import ROOT, STORED_TEXT, WEEK, build

from gateway.compare.measures import SHOWN
from gateway.db.connection import connect, upgrade
from gateway.report import generate
from gateway.report.period import week

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One week written once for the module: rendering is what these tests look at."""
    base = tmp_path_factory.mktemp("report")
    url = f"sqlite:///{base / 'gateway.db'}"
    upgrade(url)
    db = connect(url)
    world = build(db)
    report = generate(db, world.policy, world.period, base / "out", now=world.period.until)
    db.dispose()
    return report, base / "out"


def test_writes_html_markdown_and_json(written: tuple[dict, Path]) -> None:
    report, out = written
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    assert json.loads((out / "report.json").read_text())["charts"] == report["charts"]


def test_the_accuracy_table_has_a_row_for_each_measure_shown_over_pairs(
    written: tuple[dict, Path],
) -> None:
    page = (written[1] / "report.html").read_text()
    table = page[page.index("<h3>Accuracy</h3>") :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr><td>([^<]+)</td>", table)
    assert rows == ["answered copies", *(shown.label for _, shown in SHOWN)]


def test_no_stored_answer_text_is_written(written: tuple[dict, Path]) -> None:
    # Reports are kept for ever; texts only as long as their route's text_retention_h.
    for path in written[1].iterdir():
        assert STORED_TEXT not in path.read_text(), path.name


def test_every_chart_is_an_inline_svg_in_its_figure(written: tuple[dict, Path]) -> None:
    report, out = written
    page = (out / "report.html").read_text()
    # The fleet chart, then a latency CDF and an accuracy trend per route and candidate.
    assert len(report["charts"]) == 1 + 2 * len(report["candidates"]) == 3
    for chart in report["charts"]:
        figure = re.search(rf'<figure id="chart-{chart}">(.*?)</figure>', page, re.S)
        assert figure is not None, f"chart {chart} is missing from the page"
        assert figure.group(1).lstrip().startswith("<svg"), chart
        assert "<path" in figure.group(1)


def test_page_fetches_nothing(written: tuple[dict, Path]) -> None:
    page = (written[1] / "report.html").read_text()
    for fetching in ("<script", "<link", " src=", "@import", "@font-face", "url(http"):
        assert fetching not in page, fetching
    # The only addresses are SVG's XML namespaces, which name the markup and are never loaded.
    addresses = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert addresses <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, addresses


def test_page_has_a_print_stylesheet(written: tuple[dict, Path]) -> None:
    page = (written[1] / "report.html").read_text()
    assert "@media print" in page and "break-inside: avoid" in page


def test_markdown_leads_with_the_decisions(written: tuple[dict, Path]) -> None:
    report, out = written
    text = (out / "report.md").read_text()
    (c,) = report["candidates"]
    decisions = text.index("## Decisions")
    assert decisions < text.index("## Fleet") < text.index("## chat-8b → cim")
    assert c["verdict"]["summary"] in text


def test_the_fleet_section_leads_with_fleet_energy_cost_and_carbon(
    written: tuple[dict, Path],
) -> None:
    """Fleet energy (idle included), cost (device-hours and energy) and carbon, each beside the
    week before, come before what was attributed to requests."""
    _, out = written
    page = (out / "report.html").read_text()
    fleet = page[page.index('<section id="fleet">') :]
    headline = re.search(r'<table id="fleet-headline">(.*?)</table>', fleet, re.S)
    assert headline is not None
    assert fleet.index('id="fleet-headline"') < fleet.index("Attributed to requests")
    cells = [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td>(.*?)</td>", headline.group(1), re.S)
    ]
    rows = {cells[i]: cells[i + 1 : i + 4] for i in range(0, len(cells), 4)}
    # 7 h of the GPU at 150 W, the ASIC parked at 5 W and the CIM part at 8 W: 4,107,600 J.
    assert rows["Fleet energy, idle included"] == ["1.14 kWh", "270.00 kJ", "+1.07 kWh"]
    assert rows["Energy per request"][0] == "68.46 kJ"
    assert rows["Fleet cost, device-hours and energy"][:2] == ["$23.24", "$1.26"]
    assert rows["Fleet carbon"][0] == "445 g CO₂"
    assert rows["Device-hours, on and parked"] == ["21 h", "0.5 h", "+20.5 h"]
    text = (out / "report.md").read_text()
    section = text[text.index("## Fleet") :]
    assert section.index("| fleet energy, idle included | 1.14 kWh |") < section.index(
        "Attributed to requests"
    )


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium)"
)
def test_chromium_renders_the_page_without_console_messages(
    written: tuple[dict, Path], tmp_path: Path
) -> None:
    report, out = written
    result = subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            (out / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # The page has no scripts, so anything on the console is an error (a failed load included).
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    dom = result.stdout
    for chart in report["charts"]:
        assert f'id="chart-{chart}"' in dom
    assert dom.count("<svg") >= len(report["charts"])


def test_a_week_without_traffic_still_makes_a_report(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    db = connect(url)
    from gateway.policy.load import load_policy

    policy = load_policy(ROOT / "policies/default.yaml")
    report = generate(db, policy, week(WEEK), tmp_path / "out", now=0.0)
    db.dispose()
    assert report["candidates"] == [] and report["fleet"]["requests"] == 0
    assert "No shadow evidence" in (tmp_path / "out/report.md").read_text()
    assert 'id="chart-fleet"' in (tmp_path / "out/report.html").read_text()


def test_cli_writes_a_named_week_and_refuses_a_malformed_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    db = connect(url)
    build(db)
    db.dispose()
    env = {**os.environ, "DATABASE_URL": url}
    command = [sys.executable, "-m", "gateway", "report", "weekly"]
    done = subprocess.run(
        [*command, "--week", WEEK, "--out", str(tmp_path / "out")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "chat-8b → cim" in done.stdout
    assert json.loads((tmp_path / "out/report.json").read_text())["period"]["label"] == WEEK
    wrong = subprocess.run(
        [*command, "--week", "2026-48", "--out", str(tmp_path / "x")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 2 and "2026-W48" in wrong.stderr


def test_unbounded_intervals_are_null_in_json() -> None:
    from gateway.report.render import finite

    assert finite({"interval": (0.5, math.inf), "n": [math.nan, 1]}) == {
        "interval": [0.5, None],
        "n": [None, 1],
    }


def test_the_report_shows_each_pools_newest_precision_check(tmp_path: Path) -> None:
    from gateway.policy.load import load_policy
    from gateway.promotion.precision.comparison import Plan, Suite
    from gateway.promotion.precision.figures import Outcome, judge_check
    from gateway.promotion.precision.results import store

    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    upgrade(url)
    db = connect(url)
    policy, period = load_policy(ROOT / "policies/default.yaml"), week(WEEK)
    generate(db, policy, period, tmp_path / "none", now=period.until)
    assert "No precision check had been run" in (tmp_path / "none/report.html").read_text()

    def checked(pool: str, departing: int, ts: float) -> dict:
        same = {
            "exact_match": True,
            "similarity": 1.0,
            "kl_divergence": 0.0,
            "reference_words": 100,
        }
        wrong = {
            "exact_match": False,
            "similarity": 0.9,
            "semantic_similarity": 0.7,
            "reference_words": 100,
            "first_divergence": 9,
        }
        body = {"model": "llama-3.1-8b-instruct", "messages": [{"role": "user", "content": "q"}]}
        suite = Suite("suites/chat.jsonl", tuple((n, body) for n in range(240)))
        # Labelled: the answers that depart are wrong facts, the reference's all right.
        outcomes = [
            Outcome(
                n,
                {**(wrong if n < departing else same), "candidate_error": None},
                {**same, "candidate_error": None},
                reference_right=True,
                candidate_right=n >= departing,
                noise_right=True,
            )
            for n in range(240)
        ]
        plan = Plan(pool, "gpu", "bge-large-en-v1.5", "gpu")
        return {**judge_check(plan, suite, outcomes), "ts": ts}

    store(db, checked("cim", 12, period.since + 3600))
    store(db, checked("asic", 0, period.since + 7200))
    store(db, checked("asic", 30, period.until + 60))  # after the week: not shown
    report = generate(db, policy, period, tmp_path / "out", now=period.until)
    db.dispose()
    shown = [(c["pool"], c["verdict"], c["harmful_share"]) for c in report["precision_checks"]]
    assert shown == [("asic", "pass", 0.0), ("cim", "fail", 0.05)]
    page = (tmp_path / "out/report.html").read_text()
    assert "<h2>Precision checks</h2>" in page
    assert "12 of 240 answers (5.0%) depart in meaning" in page
    # 12 departures over the words at risk: 12 pairs to their 10th word, 228 of 100 words.
    assert "0.524 per 1,000 words (floor 0)" in page
    assert "0.524 per 1,000 words above the floor (0.248 to 0.915)" in page
    stored = json.loads((tmp_path / "out/report.json").read_text())["precision_checks"]
    assert stored[1]["reasons"] == report["precision_checks"][1]["reasons"]
    assert stored[1]["labelled"]["turned_wrong"] == 12
    assert "Of 240 labelled questions the candidate answered 228 right" in page
    text = (tmp_path / "out/report.md").read_text()
    assert "| asic | gpu | suites/chat.jsonl | 240 | 100.0% | 0 (floor 0) | 0 | pass |" in text
    assert "| cim | gpu | suites/chat.jsonl | 240 | 95.0% | 0.524 (floor 0) |" in text
    assert "- cim: 12 of 240 answers" in text
    assert "No precision check was run" in (tmp_path / "none/report.md").read_text()
