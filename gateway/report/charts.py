"""The report's charts: matplotlib figures rendered to SVG text for inlining in the page.

Figures are built with the object API (no pyplot): no global figure state, so reports can be
made in a server's worker thread. Text stays text in the SVG (selectable, sharp in print), and
each chart salts its element ids with its own name so several SVGs can share one page.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure

from gateway.report.wording import LATENCY_TITLES

METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
PRIMARY, CANDIDATE, FLOOR = "#1f5fa8", "#d9730d", "#6b6b6b"
# Typed loosely: matplotlib types rc keys as a Literal of every known name.
STYLE: dict[Any, Any] = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "legend.frameon": False,
}


def to_svg(figure: Figure, name: str) -> str:
    """Render a figure to an <svg> element (no XML prolog), its ids salted with `name`."""
    buffer = io.StringIO()
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": name}):
        figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    # The RDF block only credits the library; the page says where its numbers come from.
    return METADATA.sub("", text[text.index("<svg") :], count=1)


def _figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(STYLE):
        return Figure(figsize=(width, height), layout="constrained")


def fleet_chart(pools: Sequence[Mapping[str, Any]], name: str = "fleet") -> str:
    """Draw requests, energy and cost per pool side by side."""
    with matplotlib.rc_context(STYLE):
        figure = _figure(7.5, 0.6 + 0.35 * max(len(pools), 1))
        names = [p["pool"] for p in pools]
        panels = (
            ("requests", "Requests", 1.0),
            ("energy_j", "Energy (kJ)", 1e-3),
            ("cost_usd", "Cost (USD)", 1.0),
        )
        axes = figure.subplots(1, 3, sharey=True)
        for ax, (key, title, scale) in zip(axes, panels, strict=True):
            values = [(p[key] or 0) * scale for p in pools]
            ax.barh(names, values, color=PRIMARY)
            ax.set_title(title)
            ax.invert_yaxis()
            ax.grid(axis="y", visible=False)
        return to_svg(figure, name)


def latency_cdf_chart(latency: Mapping[str, Any], name: str) -> str:
    """Draw the primary's and candidate's latency CDFs for TTFT, TPOT and end to end."""
    with matplotlib.rc_context(STYLE):
        figure = _figure(7.5, 2.4)
        axes = figure.subplots(1, 3)
        for ax, key in zip(axes, ("ttft", "tpot", "e2e"), strict=True):
            ax.set_title(LATENCY_TITLES[key])
            drawn = False
            for side, color in (("primary", PRIMARY), ("candidate", CANDIDATE)):
                points = latency[key][side]["cdf"]
                if not points:
                    continue
                n = len(points)
                ax.step(
                    points, [(i + 1) / n for i in range(n)], where="post", color=color, label=side
                )
                drawn = True
            if not drawn:
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            if _spread(latency[key]) > 20:
                ax.set_xscale("log")
            ax.set_xlabel("ms")
            ax.set_ylim(0, 1.02)
            ax.axhline(0.95, color=FLOOR, linewidth=0.6, linestyle=":")
        axes[0].set_ylabel("share of requests")
        handles, labels = axes[-1].get_legend_handles_labels()
        if not handles:
            for ax in axes:
                handles, labels = ax.get_legend_handles_labels()
                if handles:
                    break
        if handles:
            figure.legend(handles, labels, loc="outside lower center", ncols=2)
        return to_svg(figure, name)


def _spread(entry: Mapping[str, Any]) -> float:
    values = [v for side in ("primary", "candidate") for v in entry[side]["cdf"] if v > 0]
    return max(values) / min(values) if values else 1.0


def accuracy_trend_chart(daily: Sequence[Mapping[str, Any]], name: str) -> str:
    """Draw each day's exact match and similarity beside the noise floor's exact match."""
    with matplotlib.rc_context(STYLE):
        figure = _figure(7.5, 2.4)
        ax = figure.subplots()
        days = [d["date"][5:] for d in daily]
        x = list(range(len(days)))
        series = (
            ("exact_match_rate", "exact match (temperature 0)", CANDIDATE, "-"),
            ("normalized_match_rate", "normalized match", CANDIDATE, "--"),
            ("mean_similarity", "mean similarity", PRIMARY, "-"),
            ("noise_exact_match_rate", "noise floor exact match", FLOOR, ":"),
        )
        for key, label, color, style in series:
            values = [math.nan if d[key] is None else d[key] for d in daily]
            ax.plot(x, values, style, color=color, marker="o", markersize=3, label=label)
        ax.set_xticks(x, days)
        ax.set_ylabel("share / similarity")
        ax.set_ylim(_lower_limit(daily), 1.01)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        return to_svg(figure, name)


def _lower_limit(daily: Sequence[Mapping[str, Any]]) -> float:
    values = [
        d[k]
        for d in daily
        for k in ("exact_match_rate", "mean_similarity", "noise_exact_match_rate")
        if d[k] is not None
    ]
    low = min(values, default=0.0)
    return max(0.0, math.floor((low - 0.05) * 20) / 20)
