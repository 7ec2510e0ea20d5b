"""Write a report's numbers as report.html (self-contained), report.md and report.json."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from gateway.compare.measures import SHOWN
from gateway.report.wording import LATENCY_TITLES

TEMPLATES = Path(__file__).resolve().parent / "templates"
FILES = ("report.html", "report.md", "report.json")


def chart_id(kind: str, route: str, candidate: str) -> str:
    """Return a chart's element id: stable, and safe in HTML and SVG ids."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{kind}-{route}-{candidate}".lower()).strip("-")


def draw(report: Mapping[str, Any]) -> dict[str, str]:
    """Draw every chart of the report; return SVG text by chart id, in page order."""
    # matplotlib loads only to draw: a serving gateway that never writes a report never has it.
    from gateway.report import charts

    svgs = {"fleet": charts.fleet_chart(report["fleet"]["pools"], "fleet")}
    for c in report["candidates"]:
        latency = chart_id("latency", c["route"], c["candidate"])
        trend = chart_id("accuracy", c["route"], c["candidate"])
        svgs[latency] = charts.latency_cdf_chart(c["latency"], latency)
        svgs[trend] = charts.accuracy_trend_chart(c["accuracy"]["daily"], trend)
    return svgs


def write(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """Draw the charts and write the three files into `out`; return their paths."""
    svgs = draw(report)
    report["charts"] = list(svgs)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in FILES}
    paths["report.json"].write_text(json.dumps(finite(report), indent=2, allow_nan=False) + "\n")
    paths["report.md"].write_text(markdown(report))
    paths["report.html"].write_text(html(report, svgs))
    return paths


def finite(value: Any) -> Any:
    """Return the value with infinities and NaNs as None: JSON has no words for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


# Formatting ---------------------------------------------------------------------------------


def number(value: float | None, digits: int = 3) -> str:
    """Format a number for people: grouped thousands, `digits` significant digits below."""
    if value is None:
        return "–"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1):
        return f"{int(value):,}"
    if math.isinf(value):
        return "∞"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def percent(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def usd(value: float | None) -> str:
    if value is None:
        return "–"
    if abs(value) >= 0.01:
        return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.4f}"
    return f"${value:.3g}"


def signed(value: float | None, kind: str = "number") -> str:
    """Format a change with its sign, or – when either side was not measured."""
    if value is None:
        return "–"
    if kind == "percent":
        return f"{value * 100:+.1f} pts"
    if kind == "usd":
        return ("+" if value >= 0 else "−") + usd(abs(value))
    if kind in UNITS:
        return ("+" if value >= 0 else "−") + UNITS[kind](abs(value))
    return ("+" if value >= 0 else "−") + number(abs(value))


def per_k(value: float | None) -> str:
    """Format a rate per word as per 1,000 words."""
    return "–" if value is None else f"{value * 1000:.3g}"


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"


def joules(value: float | None) -> str:
    if value is None:
        return "–"
    if abs(value) >= 10_000:
        return f"{value / 1000:,.2f} kJ"
    return f"{value:,.0f} J" if abs(value) >= 100 else f"{value:.3g} J"


def energy(value: float | None) -> str:
    """Format a fleet's energy: in kWh from a tenth of one, in joules below."""
    if value is None or abs(value) < 360_000:
        return joules(value)
    return f"{value / 3.6e6:,.1f} kWh" if abs(value) >= 3.6e7 else f"{value / 3.6e6:.3g} kWh"


def grams(value: float | None) -> str:
    """Format carbon in grams of CO2, in kilograms from one."""
    if value is None:
        return "–"
    return f"{value / 1000:,.3g} kg CO₂" if abs(value) >= 1000 else f"{value:.3g} g CO₂"


def hours(value: float | None) -> str:
    return "–" if value is None else f"{number(value)} h"


def when(ts: float | None) -> str:
    """Format Unix seconds as a UTC time to the minute."""
    if ts is None:
        return "–"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def engine(pool: Mapping[str, Any]) -> str:
    """Format a pool's serving engine with its version ('vllm 0.6.3')."""
    named = " ".join(v for v in (pool["engine"], pool["engine_version"]) if v)
    return named or "–"


# The units a change may be written in, beside number, percent and usd.
UNITS = {"energy": energy, "joules": joules, "grams": grams, "hours": hours}
FORMATS = {"usd": usd, **UNITS}


def fmt(value: float | None, unit: str) -> str:
    """Format a value in a unit named in FORMATS."""
    return FORMATS[unit](value)


FILTERS = {
    "fmt": fmt,
    "when": when,
    "energy": energy,
    "grams": grams,
    "hours": hours,
    "number": number,
    "percent": percent,
    "per_k": per_k,
    "usd": usd,
    "signed": signed,
    "ms": ms,
    "joules": joules,
    "engine": engine,
}


# HTML ---------------------------------------------------------------------------------------


def html(report: Mapping[str, Any], svgs: Mapping[str, str]) -> str:
    """Render the page: one file, styles and charts inline, no scripts or fonts to fetch."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    env.globals["chart_id"] = chart_id
    env.globals["headline"] = HEADLINE
    env.globals["shown"] = [
        (shown.key(name), shown.label, "percent" if shown.rate else "number")
        for name, shown in SHOWN
    ]
    return env.get_template("report.html.j2").render(
        report=report, svgs={k: jinja2.filters.Markup(v) for k, v in svgs.items()}
    )


# Markdown -----------------------------------------------------------------------------------


def _row(*cells: str) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def markdown(report: Mapping[str, Any]) -> str:
    """Render the report as Markdown for a ticket or a chat: the decisions first."""
    period, fleet = report["period"], report["fleet"]
    lines = [
        f"# Shadow-comparison report {period['label']}",
        "",
        f"{period['since']} to {period['until']} (UTC), generated {report['generated_at']}.",
        "",
        "## Decisions",
        "",
    ]
    if not report["candidates"]:
        lines.append("No shadow evidence in this period.")
    for c in report["candidates"]:
        v = c["verdict"]
        said = v["summary"] if v else "no evidence in the judge's window"
        saved = c["projected_savings"]["cost_usd_saved"]
        lines.append(
            f"- **{c['route']} → {c['candidate']}**: {said} Projected weekly saving if promoted: "
            f"{usd(saved)}."
        )
    lines += ["", "## Fleet", "", *_headline_markdown(fleet["headline"])]
    lines += [
        "",
        "Attributed to requests (a diagnostic: each request's share of its backend's draw while "
        f"it ran, its slot time at the hourly price): {number(fleet['requests'])} requests "
        f"({signed(fleet['change']['requests']['change'])} on the previous period), "
        f"{number(fleet['errors'])} errors, {joules(fleet['energy_j'])}, "
        f"{usd(fleet['cost_usd'])}.",
        "",
        _row("pool", "requests", "errors", "energy", "J / 1k tokens", "cost", "USD / 1k tokens"),
        _row(*["---"] * 7),
    ]
    for p in fleet["pools"]:
        lines.append(
            _row(
                p["pool"],
                number(p["requests"]),
                number(p["errors"]),
                joules(p["energy_j"]),
                number(p["energy_j_per_1k_tokens"]),
                usd(p["cost_usd"]),
                usd(p["cost_usd_per_1k_tokens"]),
            )
        )
    lines += [
        "",
        _row("pool", "kind", "backends", "precision", "memory", "engine", "driver", "firmware"),
        _row(*["---"] * 8),
    ]
    for h in fleet["hardware"]:
        lines.append(
            _row(
                h["pool"] + ("" if h["live"] else " (shadow-only)"),
                h["kind"],
                number(h["backends"]),
                h["precision"],
                f"{number(h['memory_gb'])} GB",
                engine(h),
                *(h[k] or "–" for k in ("driver", "firmware")),
            )
        )
    lines += ["", _row("SLO class", "requests", "met", "attainment"), _row(*["---"] * 4)]
    for s in fleet["slo"]:
        lines.append(
            _row(s["slo_class"], number(s["requests"]), number(s["met"]), percent(s["attainment"]))
        )
    model = fleet["cost_model"]
    lines += [
        "",
        f"Cost model version {model['version'] or 'prior'}; error on this period's requests "
        "(mean absolute percentage error):",
        "",
    ]
    lines += [
        f"- {o['pool']} {o['target']}: {percent(o['mape'])} on {number(o['requests'])} requests"
        for o in model["observed"]
    ]
    lines += _parking_markdown(report.get("parking") or {})
    lines += ["", *_precision_markdown(report.get("precision_checks") or [])]
    for c in report["candidates"]:
        lines += ["", *_candidate_markdown(c)]
    return "\n".join(lines) + "\n"


# The headline's figures: title, key, and the unit its value and change are written in.
HEADLINE = (
    ("fleet energy, idle included", "energy_j", "energy"),
    ("energy per request", "energy_j_per_request", "joules"),
    ("fleet cost, device-hours and energy", "cost_usd", "usd"),
    ("cost per request", "cost_usd_per_request", "usd"),
    ("fleet carbon", "carbon_g", "grams"),
    ("device-hours, on and parked", "device_hours", "hours"),
)


def _headline_markdown(headline: Mapping[str, Any]) -> list[str]:
    """The fleet's energy, cost and carbon against the previous period, then per pool."""
    lines = [
        _row("fleet", "this period", "previous", "change"),
        _row(*["---"] * 4),
    ]
    for title, key, unit in HEADLINE:
        moved = headline["change"][key]
        lines.append(
            _row(
                title,
                FORMATS[unit](headline[key]),
                FORMATS[unit](moved["previous"]),
                signed(moved["change"], unit),
            )
        )
    lines += [
        "",
        f"Energy estimated from nominal figures: {energy(headline['estimated_j'])}; "
        f"{hours(headline['on_hours'])} on, {hours(headline['parked_hours'])} parked; "
        f"draw recorded in {percent(headline['recorded_share'])} of the period.",
        "",
        _row("pool", "backends", "energy", "estimated", "on", "parked", "cost", "carbon"),
        _row(*["---"] * 8),
    ]
    for p in headline["pools"]:
        lines.append(
            _row(
                p["pool"],
                number(p["backends"]),
                energy(p["energy_j"]),
                energy(p["estimated_j"]),
                hours(p["on_hours"]),
                hours(p["parked_hours"]),
                usd(p["cost_usd"]),
                grams(p["carbon_g"]),
            )
        )
    return lines


def _parking_markdown(parking: Mapping[str, Any]) -> list[str]:
    """Parking's pools (backends on and parked, day by day) and its wake-ups."""
    if not parking.get("pools"):
        return []
    lines = [
        "",
        "## Parking",
        "",
        _row(
            "pool",
            "backends",
            "parked (mean)",
            "parks",
            "wake-ups",
            "hook failures",
            "energy saved",
            "wake-up p50",
        ),
        _row(*["---"] * 8),
    ]
    for p in parking["pools"]:
        lines.append(
            _row(
                p["pool"],
                number(p["backends"]),
                number(p["parked_mean"]),
                number(p["parks"]),
                number(p["wakeups"]),
                number(p["failures"]),
                joules(p["saved_j"]),
                "–" if p["wakeup_s_p50"] is None else f"{number(p['wakeup_s_p50'])} s",
            )
        )
    for p in parking["pools"]:
        lines += ["", f"{p['pool']}, backends on / parked (mean of each day, UTC):", ""]
        lines += [
            f"- {d['day']}: {number(d['active'])} on, {number(d['parked'])} parked"
            for d in p["daily"]
        ]
    if parking["wakeups"]:
        lines += ["", f"Wake-ups ({number(parking['wakeups_total'])}; the last shown):", ""]
        lines += [
            f"- {w['at']} {w['pool']}/{w['backend']}: {w['reason']}" for w in parking["wakeups"]
        ]
    return lines


def _precision_markdown(checks: list[Mapping[str, Any]]) -> list[str]:
    lines = ["## Precision checks", ""]
    if not checks:
        return [*lines, "No precision check was run by the end of this period."]
    lines += [
        _row(
            "pool",
            "reference",
            "suite (sha256)",
            "prompts",
            "top-1 agreement",
            "departs per 1,000 words",
            "mean KL",
            "verdict",
        ),
        _row(*["---"] * 8),
    ]
    for check in checks:
        digest = check.get("suite_sha256")
        lines.append(
            _row(
                check["pool"],
                check["reference"],
                f"{check['suite']} ({digest[:12]})" if digest else check["suite"],
                number(check["prompts"]),
                percent(check["top1_agreement"]),
                f"{per_k(check.get('departure_rate'))} (floor"
                f" {per_k(check.get('noise_departure_rate'))})",
                number(check["mean_kl"]),
                check["verdict"],
            )
        )
    for check in checks:
        lines += [f"- {check['pool']}: {reason}" for reason in check["reasons"] or ()]
    return lines


def _candidate_markdown(c: Mapping[str, Any]) -> list[str]:
    vol, greedy, lat = c["volume"], c["accuracy"]["greedy"], c["latency"]
    lines = [
        f"## {c['route']} → {c['candidate']}",
        "",
        f"{number(vol['requests'])} requests on the route, {number(vol['shadow_samples'])} shadow "
        f"samples ({number(vol['answered'])} answered), {number(vol['dropped'])} dropped, "
        f"{number(vol['noise_samples'])} noise-floor samples.",
        "",
    ]
    v = c["verdict"]
    if v:
        lines += [f"**{v['summary']}**", ""]
        lines += [f"- {check['plain']}" for check in v["checks"]]
        lines.append("")
    lines += [_row("latency", "primary p50 / p95 / p99", "candidate p50 / p95 / p99")]
    lines.append(_row(*["---"] * 3))
    for key, title in LATENCY_TITLES.items():
        p, q = lat[key]["primary"], lat[key]["candidate"]
        lines.append(
            _row(
                title,
                " / ".join(ms(p[f"p{n}"]) for n in (50, 95, 99)),
                " / ".join(ms(q[f"p{n}"]) for n in (50, 95, 99)),
            )
        )
    saved = c["projected_savings"]
    lines += [
        "",
        f"Accuracy (temperature 0): exact match {percent(greedy['exact_match_rate'])}, normalized "
        f"{percent(greedy['normalized_match_rate'])}, similarity "
        f"{number(greedy['mean_similarity'])}; noise floor exact match "
        f"{percent(greedy['noise_exact_match_rate'])}.",
        f"Errors: {number(c['errors']['count'])} ({percent(c['errors']['rate'], 2)}).",
        f"Energy per request: primary {joules(c['energy']['primary']['j_per_request'])}, "
        f"candidate {joules(c['energy']['candidate']['j_per_request'])}. Cost per 1k tokens: "
        f"primary {usd(c['cost']['primary']['usd_per_1k_tokens'])}, candidate "
        f"{usd(c['cost']['candidate']['usd_per_1k_tokens'])}.",
        f"Projected if promoted (cost model, {number(saved['requests'])} requests): "
        f"{usd(saved['cost_usd_saved'])} and {joules(saved['energy_j_saved'])} saved.",
    ]
    moved = c["change"]["measures"]
    lines.append(
        f"Against the previous period: exact match "
        f"{signed(moved['exact_match_rate']['change'], 'percent')}, candidate p95 end to end "
        f"{signed(moved['candidate_e2e_p95_ms']['change'])} ms, error rate "
        f"{signed(moved['error_rate']['change'], 'percent')}; previous verdict "
        f"{c['change']['previous_outcome'] or 'none'}."
    )
    return lines
