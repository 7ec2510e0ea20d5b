"""`gateway bench`: the benchmarks installed beside the gateway, one command each.

The gateway never imports a benchmark: each registers the function that adds its command to this
group under the entry point group `shadow_gateway.bench`, as the routing benchmark does
(`lab/command.py`, registered in pyproject.toml). A benchmark registered but not shipped (the
container image carries the gateway and the simulator alone) keeps its name and says so when it
is run; every other command works as before.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from importlib.metadata import EntryPoint, entry_points

from gateway.settings import Settings

GROUP = "shadow_gateway.bench"


def _not_installed(
    entry: EntryPoint, error: ImportError, args: argparse.Namespace, settings: Settings
) -> int:
    print(
        f"error: the {entry.name} benchmark is registered ({entry.value}) but cannot be "
        f"imported: {error}; install the project from its source tree (pip install .)",
        file=sys.stderr,
    )
    return 2


def add(commands: argparse._SubParsersAction) -> None:
    """Add this group's commands to the `gateway` command."""
    found = sorted(entry_points(group=GROUP), key=lambda entry: entry.name)
    bench = commands.add_parser(
        "bench", help=f"benchmarks ({', '.join(e.name for e in found) or 'none installed'})"
    ).add_subparsers(dest="bench_command", required=True)
    for entry in found:
        try:
            add_command = entry.load()
        except ImportError as exc:
            # Every argument is taken as given, so that running it reaches the explanation.
            missing = bench.add_parser(
                entry.name, help="not installed", add_help=False, prefix_chars="\0"
            )
            missing.add_argument("given", nargs=argparse.REMAINDER)
            missing.set_defaults(run=partial(_not_installed, entry, exc))
            continue
        add_command(bench)
