"""Every console view over HTTP, from a gateway serving a stored week.

    python -m bench.records --requests 10000000 --shadows 2000000 --database URL
    python -m bench.console_views --database URL --at 2026-12-07T00:00:30 --runs 3 --out R.json

Starts `python -m gateway serve` on the database at URL with the admin API on, retention off
(nothing of the week is deleted) and its wall clock (`time.time`, which the gateway reads for
"now") set back to `--at`, by default 30 s after the stored week ends, so "the last hour" and "the
last day" are its last, whole. (libfaketime would set the clock too, but it slows the threads'
hand-over of the interpreter lock: a view computed in a worker thread took 2 to 20 times as
long under it. A clock inside the week would put the rest of the week in the future, which no
gateway sees: what reads "from the last settled minute on" would read it all.) Then calls each
admin route the console calls when its views open (gateway/ops/console/console.js), one after
another, `--runs` times, and reports each call's time as the console waits for it (request to
last byte, on loopback): the median and range, and the first call's apart (a view opened first
after the gateway started).

The backends of the policy are not started: the fleet view shows them unhealthy, which reads
the same rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.hot_path import server
from bench.upstream_client import free_port

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-console-views"
# What the console asks for, in the order its views open them (console.js).
GETS = (
    "/admin/fleet",
    "/admin/fleet/energy?window=day",
    "/admin/parking?window=day",
    "/admin/traffic?window=hour",
    "/admin/traffic?window=day",
    "/admin/promotions?evaluate=1",
    "/admin/shadow/summary",
    "/admin/rollouts",
    "/admin/policy",
    "/admin/policy/versions?limit=20",
    "/admin/reports",
)
TARGET_S = 1.0
# `python -m gateway ARGS` with the wall clock `offset` seconds back, set before the gateway's
# modules are imported (no module binds time.time itself: it calls it each time).
BACK_IN_TIME = """
import sys, time
offset, wall = float(sys.argv[1]), time.time
time.time = lambda: wall() - offset
from gateway.cli import main
sys.argv = ["gateway", *sys.argv[2:]]
sys.exit(main())
"""


def call(base: str, path: str, body: dict[str, Any] | None = None) -> tuple[float, Any]:
    """Call an admin route as the console does; return its seconds and its JSON."""
    request = urllib.request.Request(
        base + path,
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        payload = response.read()
    return time.perf_counter() - started, json.loads(payload)


def figures(seconds: list[float]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(seconds), 3),
        "range_s": [round(min(seconds), 3), round(max(seconds), 3)],
        "runs_s": [round(s, 3) for s in seconds],
    }


def run(url: str, at: str, runs: int, policy: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="console-views-"))
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "GATEWAY_POLICY": str(policy),
        "GATEWAY_ADMIN_TOKEN": TOKEN,
        "GATEWAY_RETENTION_INTERVAL_S": "0",
        "GATEWAY_REPORTS_DIR": str(work / "reports"),
        "GATEWAY_LOG_LEVEL": "warning",
    }
    env.pop("REDIS_URL", None)
    subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "apply", str(policy), "-m", "bench"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    offset = time.time() - datetime.fromisoformat(at).replace(tzinfo=UTC).timestamp()
    command = [sys.executable, "-c", BACK_IN_TIME, repr(offset), "serve", "--port", str(port)]
    views: dict[str, list[float]] = {path: [] for path in GETS}
    answers: dict[str, Any] = {}
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, work, True)
        cleanup.enter_context(server(command, 0, base + "/healthz", env))
        for _ in range(runs):
            for path in GETS:
                seconds, answer = call(base, path)
                views[path].append(seconds)
                answers[path] = answer
        summary = answers["/admin/shadow/summary"]
        pairs_path = None
        if summary:
            first = summary[0]
            pairs_path = (
                f"/admin/shadow/pairs?route={first['route']}&candidate={first['candidate']}"
                "&limit=10"
            )
            views[pairs_path] = [call(base, pairs_path)[0] for _ in range(runs)]
        yaml_text = answers["/admin/policy"]["yaml"]
        validate = "POST /admin/policy/validate"
        views[validate] = [
            call(base, "/admin/policy/validate", {"yaml": yaml_text})[0] for _ in range(runs)
        ]
    result: dict[str, Any] = {
        "database": url.split("://")[0],
        "at": at,
        "runs": runs,
        "views": {path: {**figures(s), "first_s": round(s[0], 3)} for path, s in views.items()},
        "rows_answered": {
            path: len(answer) if isinstance(answer, list) else None
            for path, answer in answers.items()
        },
    }
    slowest = max(result["views"].items(), key=lambda kv: kv[1]["median_s"])
    result["slowest"] = {"view": slowest[0], **slowest[1]}
    result["every_view_within_target"] = all(
        v["median_s"] <= TARGET_S for v in result["views"].values()
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console_views", description=__doc__)
    parser.add_argument("--database", required=True, help="database URL holding the week")
    parser.add_argument(
        "--at",
        default=None,
        help="the gateway's wall clock, UTC (default: 30 s after the last complete week ends)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--policy", default=str(ROOT / "policies" / "default.yaml"))
    parser.add_argument("--out", help="write the result as JSON here too")
    args = parser.parse_args(argv)
    at = args.at
    if at is None:
        from gateway.report.period import last_complete_week

        end = last_complete_week(time.time()).until + 30
        at = datetime.fromtimestamp(end, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    result = run(args.database, at, args.runs, Path(args.policy))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
