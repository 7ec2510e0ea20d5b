"""`gateway bench`: the benchmarks installed beside the gateway, one command each.

The gateway never imports a benchmark: each registers the function that adds its command to this
group under the entry point group `shadow_gateway.bench`, as the routing benchmark does
(`lab/command.py`, registered in pyproject.toml).
"""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points

GROUP = "shadow_gateway.bench"


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    found = sorted(entry_points(group=GROUP), key=lambda entry: entry.name)
    bench = commands.add_parser(
        "bench", help=f"benchmarks ({', '.join(e.name for e in found) or 'none installed'})"
    ).add_subparsers(dest="bench_command", required=True)
    for entry in found:
        entry.load()(bench)
