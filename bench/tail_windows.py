"""The gateway's tail over consecutive windows of one process, beside the bare relay.

    python -m bench.tail_windows --windows 10 --connections 1 --layout split

Runs the instant upstream, bench/relay.py and the gateway with the shipped policy's routes
(bench.hot_path's gateway-default) and loads each in turn with wrk, window after window, so a
tail that builds up as the process runs (a growing heap, accumulating observations) shows in
the later windows. Each gateway window prints what its loop-lag probe and collector timing saw.

Layouts: `bench` as bench.hot_path (servers on core 0, wrk and the upstream on core 1);
`split` as a user might run them (the upstream on core 0, the servers on core 1, wrk on
either).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

from bench import hot_path


def window(base: str, connections: int, seconds: int, script: str, cores: str) -> dict[str, Any]:
    """One wrk window on `base`, with what the gateway's probes saw during it."""
    before = hot_path.stall_counts(base)
    point = hot_path.wrk(base + hot_path.CHAT, connections, seconds, script, cores)
    point["loop_stalls"] = hot_path.stalls(before, hot_path.stall_counts(base))
    return point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--layout", choices=("bench", "split"), default="split")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    layout = (hot_path.SERVER_CORE, hot_path.LOAD_CORE)
    if args.layout == "split":
        hot_path.SERVER_CORE, hot_path.LOAD_CORE = 1, 0
    try:
        found = measure(args, "0,1" if args.layout == "split" else str(hot_path.LOAD_CORE))
    finally:
        hot_path.SERVER_CORE, hot_path.LOAD_CORE = layout
    if args.out:
        args.out.write_text(json.dumps({"layout": args.layout, "windows": found}, indent=1))
    return 0


def measure(args: argparse.Namespace, cores: str) -> list[dict[str, Any]]:
    """Every window of the gateway and the relay, wrk pinned to `cores`."""
    work = Path(tempfile.mkdtemp(prefix="tail-windows-"))
    script = work / "chat.lua"
    script.write_text(hot_path.wrk_script(False))
    found: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        _, upstream = stack.enter_context(hot_path.instant_upstream())
        _, relay = stack.enter_context(hot_path.relay(upstream))
        _, gateway = stack.enter_context(hot_path.gateway(upstream, None))
        for base in (relay, gateway):
            hot_path.wrk(base + hot_path.CHAT, 8, 2, str(script), cores)  # warm-up
        for n in range(args.windows):
            g = window(gateway, args.connections, args.seconds, str(script), cores)
            r = hot_path.wrk(
                relay + hot_path.CHAT, args.connections, args.seconds, str(script), cores
            )
            found.append({"gateway-default": g, "relay": r})
            stalls = g["loop_stalls"]
            print(
                f"{n:2d}  gateway p50 {g['p50_ms']:.3f} p99 {g['p99_ms']:.2f} "
                f"p99.9 {g['p999_ms']:.2f} ms ({g['rps']:.0f}/s)  relay p99 {r['p99_ms']:.2f} "
                f"ms  rounds >10 ms late {stalls.get('over_10ms', 0):.0f}, "
                f">20 ms {stalls.get('over_20ms', 0):.0f}  full collections "
                f"{stalls.get('gc2_collections', 0):.0f} "
                f"({stalls.get('gc2_paused_s', 0) * 1e3:.1f} ms)",
                flush=True,
            )
    return found


if __name__ == "__main__":
    raise SystemExit(main())
