"""The operator console in a real headless browser (Debian's chromium, driven by Playwright):
sign-in, the fleet, a refused and then an applied policy edit with its diff and what-if, and a
rollback, with nothing loaded from another origin."""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from shadowworld import serve, shadow_policy

from gateway.compare.measures import SHOWN
from gateway.db.schema import BackendEnergy, backend_energy
from harness.gateways import GatewayServer, run_gateway

TOKEN = "s3cret-admin-token"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# In CI the browser tests run; on a laptop without chromium or Playwright they skip, saying why.
REQUIRED = os.environ.get("GATEWAY_TEST_REQUIRE_SERVICES") == "1"

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # pragma: no cover - make test installs it
    if REQUIRED:
        raise
    pytest.skip("Playwright is not installed (pip install playwright)", allow_module_level=True)
if CHROMIUM is None:
    if REQUIRED:
        raise RuntimeError("no chromium binary for the console's browser tests")
    pytest.skip("no chromium binary (Debian: apt-get install chromium)", allow_module_level=True)
# Assertions on the page wait for their condition as long as actions do (set_default_timeout
# below): Playwright's own 5 s is shorter than the what-if's process takes to start on a busy
# machine.
expect.set_options(timeout=60_000)


@pytest.fixture
def gateway(sims, tmp_path: Path) -> Iterator[GatewayServer]:
    """A gateway with shadow copies to the CIM part, after a few requests."""
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"), noise=0.0)
    with run_gateway(policy, tmp_path, admin_token=TOKEN) as gw:
        serve(gw, 4)
        yield gw


@pytest.fixture
def page(gateway: GatewayServer) -> Iterator[Page]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context()
        tab = context.new_page()
        tab.requested = []  # type: ignore[attr-defined]
        tab.on("request", lambda r: tab.requested.append(r.url))  # type: ignore[attr-defined]
        tab.problems = []  # type: ignore[attr-defined]
        tab.on("pageerror", lambda e: tab.problems.append(str(e)))  # type: ignore[attr-defined]
        tab.on(  # a CSP refusal is a console error
            "console",
            lambda m: m.type == "error" and tab.problems.append(m.text),  # type: ignore[attr-defined]
        )
        tab.set_default_timeout(60_000)
        yield tab
        browser.close()


def sign_in(page: Page, base: str, token: str) -> None:
    page.goto(base + "/console/")
    page.fill("#token", token)
    page.click("#sign-in-form button")


def test_a_wrong_token_is_refused_and_shows_nothing(gateway: GatewayServer, page: Page) -> None:
    sign_in(page, gateway.url, "not-the-token")
    expect(page.locator("#sign-in-error")).to_have_text("The admin token was refused.")
    expect(page.locator("#tabs")).to_be_hidden()
    expect(page.locator("#view")).to_be_hidden()
    # The token lives in the tab's session storage while signed in, and is gone after a refusal.
    assert page.evaluate("sessionStorage.getItem('gatewayAdminToken')") is None


def test_an_operator_reads_the_fleet_edits_the_policy_and_rolls_back(
    gateway: GatewayServer, page: Page
) -> None:
    base = gateway.url
    # Half an hour of a GPU on at 200 W, well inside the day before the last: the gateway's own
    # draw, written a minute at a time while it serves, falls in the last day alone.
    until = math.floor(time.time() / 60) * 60
    with gateway.gateway.db.begin() as conn:
        conn.execute(
            backend_energy.insert(),
            [
                BackendEnergy(until - 93_600 + 60 * m, "gpu", "gpu-0", 60, 0, 12_000, 0).row()
                for m in range(30)
            ],
        )
    sign_in(page, base, TOKEN)
    assert "Bearer" not in page.url and TOKEN not in page.url

    # Fleet: led by the fleet's energy, idle included, cost and carbon over the last day.
    expect(page.locator("#view h2")).to_have_text("Fleet")
    expect(page.locator("#view table").first).to_have_attribute("id", "fleet-headline")
    headline = page.locator("#fleet-headline tbody tr")
    energy = headline.first.locator("td")
    expect(energy.first).to_have_text("fleet energy, idle included")
    expect(energy.nth(2)).to_have_text("0.100 kWh")
    expect(headline.nth(4).locator("td").first).to_have_text("fleet carbon")
    # Then every pool, its backends healthy, the CIM part shadow-only.
    fleet = page.locator("#view table")
    expect(fleet.locator("tr.pool td:first-child")).to_have_text(["gpu", "asic", "cim"])
    expect(fleet.locator("tr.pool").nth(2)).to_contain_text("cim (shadow-only)")
    expect(fleet.locator("tr.backend").first).to_contain_text("healthy")

    # Traffic: the route's requests and a chart of each figure.
    page.click("#tabs [data-view=traffic]")
    route = page.locator("section.route[data-route=chat]")
    expect(route.locator("table td").first).to_have_text("4")
    # Not streamed: the SLO is judged on the whole answer, which the view shows.
    expect(route.locator("table td").nth(3)).to_contain_text("end to end")
    expect(route.locator("svg")).to_have_count(5)

    # Shadow: the verdict in words, and the sampled pairs side by side.
    page.click("#tabs [data-view=shadow]")
    card = page.locator(".card[data-route=chat][data-candidate=cim]")
    expect(card.locator(".outcome")).to_have_text("HOLD")
    # A row for each measure shown over many pairs, as Diff declares them.
    for _, shown in SHOWN:
        expect(card.locator("table")).to_contain_text(f"{shown.label} (noise floor)")
    card.get_by_role("button", name="Sampled pairs").click()
    expect(card.locator(".pair")).to_have_count(4)
    expect(card.locator(".answer.candidate").first).to_contain_text("cim:")
    expect(card.locator(".pair .measures").first).to_contain_text("exact_match")

    # Policy: an invalid edit is refused with its error at its line and column.
    page.click("#tabs [data-view=policy]")
    editor = page.locator("#policy-text")
    text = editor.input_value()
    assert "ttft_ms: 500" in text
    editor.fill(text.replace("ttft_ms: 500", "ttft_ms: -500"))
    page.click("#validate")
    problems = page.locator("#policy-problems")
    expect(problems).to_contain_text("Not valid")
    expect(problems).to_contain_text("ttft_ms")
    expect(problems.locator("li.bad").first).to_contain_text("line ")
    page.fill("#policy-message", "a negative target")
    page.click("#apply")
    expect(page.locator("#policy-result")).to_contain_text("Not applied")
    assert gateway.gateway.policy.slo_classes["interactive"].ttft_ms == 500

    # A valid one: its diff, its what-if on the recorded traffic, then applied with a message.
    editor.fill(text.replace("ttft_ms: 500", "ttft_ms: 650"))
    page.click("#validate")
    expect(problems).to_contain_text("Valid.")
    expect(page.locator("#policy-diff .del")).to_contain_text("ttft_ms: 500")
    expect(page.locator("#policy-diff .add")).to_contain_text("ttft_ms: 650")
    page.click("#simulate")
    expect(page.locator("#policy-whatif")).to_contain_text("4 recorded requests replayed")
    page.fill("#policy-message", "a looser first-token target")
    page.click("#apply")
    expect(page.locator("#confirm")).to_contain_text("serves live traffic")
    page.click("#confirm-yes")
    expect(page.locator("#policy-result")).to_contain_text("Applied as version 2")
    assert gateway.gateway.policy.slo_classes["interactive"].ttft_ms == 650
    history = page.locator("#view table").last
    expect(history.locator("tbody tr").first).to_contain_text("a looser first-token target")

    # Roll back to version 1, confirmed: served again as version 3.
    history.locator("button.rollback[data-version='1']").click()
    expect(page.locator("#confirm")).to_contain_text("Roll back to version 1")
    page.click("#confirm-yes")
    expect(page.locator("#policy-result")).to_contain_text("version 3 restores version 1")
    assert gateway.gateway.policy.slo_classes["interactive"].ttft_ms == 500

    # Nothing came from another origin, and the page met its own CSP without a refusal.
    origin = urlsplit(base).netloc
    assert {urlsplit(u).netloc for u in page.requested if not u.startswith("blob:")} == {origin}  # type: ignore[attr-defined]
    assert page.problems == []  # type: ignore[attr-defined]


def test_the_console_is_served_with_a_strict_policy_only_when_admin_is_on(
    sims, tmp_path: Path
) -> None:
    policy = shadow_policy(sims.urls("gpu"), sims.urls("asic"), sims.urls("cim"))
    for name in ("on", "off"):
        (tmp_path / name).mkdir()
    with run_gateway(policy, tmp_path / "on", admin_token=TOKEN) as gw, gw.http() as http:
        page = http.get("/console/")
        script = http.get("/console/console.js")
        missing = http.get("/console/nothing.js")
    with run_gateway(policy, tmp_path / "off") as gw, gw.http() as http:
        off = http.get("/console/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert script.headers["content-type"].startswith("text/javascript")
    # Every asset is the package's own: no URL of another origin in the page or its script.
    assert "http" not in page.text
    assert re.findall(r"https?://[^\"' ]+", script.text) == ["http://www.w3.org/2000/svg"]
    assert missing.status_code == 404
    assert off.status_code == 403 and off.json()["error"]["code"] == "admin_disabled"
