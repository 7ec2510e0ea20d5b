"""A day's retention while the gateway serves: the serving p99 and throughput during the round
against before and after it.

    python -m bench.records --requests 10000000 --shadows 2000000 --database URL
    python -m bench.retention_serving --database URL --runs 3 --out R.json

`python -m gateway serve` runs on the database at URL holding a week (bench.records), pinned to
core 0 as in bench.hot_path, every backend on the instant upstream (bench/instant_upstream.py,
with wrk on core 1), its retention window set so that the week's next day is all that lies past
it, and its retention interval so that the round starts a few seconds after the loads before it:

1. before: wrk, `--settled-loads` loads of `--connections` connections of non-streaming chat
   for `--seconds` each;
2. during: wrk again, load after load, until the round has deleted the day (its rows gone from
   every table retention looks after, polled once a second);
3. after: `--settled-loads` loads more, the round done.

The round is the gateway's own (`Pruner` in `gateway serve`): on PostgreSQL it drops the day's
partitions and deletes the day of the tables kept unpartitioned (request and shadow minutes,
backend energy, drops) in batches; on SQLite it deletes all of them in batches. Each run takes
the next day of the week, so `--runs 3` takes its first three. A run's figures are the median
during-load p99 and throughput over the median of the loads before and after (one load alone
moves too much to be the reference), and the worst during-load p99 over the worst of those; the
result is their median and range. With `--control-loads N`, the window covers the whole week
(the round runs and finds nothing to delete) and "during" is N loads: how far the same figures
move without retention.
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
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from bench.hot_path import CHAT, SERVER_CORE, bench_policy, instant_upstream, pin, wrk, wrk_script
from bench.upstream_client import free_port
from gateway.db.connection import connect
from gateway.db.retention import DAY_S, Windows
from gateway.report.period import last_complete_week, week

ROOT = Path(__file__).resolve().parent.parent
WARMUP_S = 3
SLACK_S = 5.0  # the round starts this long into the during-loads


def left(db: sa.Engine, cutoff: float) -> list[str]:
    """Name the tables retention looks after that still have rows before `cutoff`."""
    with db.connect() as conn:
        return [
            table.name
            for table in Windows().days()
            if conn.execute(sa.select(table.c.ts).where(table.c.ts < cutoff).limit(1)).first()
        ]


def count(db: sa.Engine, since: float, until: float) -> dict[str, int]:
    with db.connect() as conn:
        return {
            table.name: int(
                conn.execute(
                    sa.select(sa.func.count()).where(table.c.ts >= since, table.c.ts < until)
                ).scalar()
                or 0
            )
            for table in Windows().days()
        }


@contextlib.contextmanager
def gateway(url: str, upstream: str, days: float, interval_s: float) -> Iterator[str]:
    """Serve on `url` with retention `days` and its first round `interval_s` after start."""
    work = Path(tempfile.mkdtemp(prefix="retention-serving-"))
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump(bench_policy(upstream, 0.0)))
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "GATEWAY_POLICY": str(policy),
        "GATEWAY_LOG_LEVEL": "info",
        "GATEWAY_RETENTION_DAYS": repr(days),
        "GATEWAY_SHADOW_RETENTION_DAYS": repr(days),
        "GATEWAY_RETENTION_INTERVAL_S": repr(interval_s),
    }
    for name in ("REDIS_URL", "GATEWAY_ADMIN_TOKEN"):
        env.pop(name, None)
    # The gateway serves the database's active version: the bench's policy becomes it.
    subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "apply", str(policy), "-m", "bench",
         "--override-precision-gate"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (work / "gateway.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin(SERVER_CORE),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not answers(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((work / "gateway.log").read_text()[-2000:])
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        print((work / "gateway.log").read_text()[-1500:], file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)


def answers(base: str) -> bool:
    """Say whether the gateway at `base` answers its health check."""
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=2):
            return True
    except OSError:
        return False


def one_round(
    url: str,
    upstream: str,
    day: float,
    seconds: int,
    connections: int,
    script: str,
    settled_loads: int,
    control_loads: int = 0,
) -> dict[str, Any]:
    """Serve while retention deletes the day starting at `day` (with `control_loads`, for that
    many loads while a round runs that finds nothing past its window), `settled_loads` loads
    before the round and as many after it; return the loads' figures."""
    db = connect(url)
    cutoff = day + DAY_S
    rows = count(db, day, cutoff)
    interval_s = WARMUP_S + settled_loads * seconds + SLACK_S + 2.0
    # The window ends at the day's end when the round runs (interval_s after start).
    days = (time.time() + interval_s - cutoff) / DAY_S
    if control_loads:
        days, cutoff = 365.0, 0.0
    result: dict[str, Any] = {"day": day, "rows": rows}

    def loads(n: int) -> list[dict[str, Any]]:
        return [wrk(base + CHAT, connections, seconds, script) for _ in range(n)]

    with gateway(url, upstream, days, interval_s) as base:
        started = time.monotonic()
        wrk(base + CHAT, connections, WARMUP_S, script)
        result["before"] = loads(settled_loads)
        done = threading.Event()
        round_s: dict[str, float] = {}

        def watch() -> None:
            while left(db, cutoff):
                time.sleep(1.0)
            round_s["done_after_start_s"] = time.monotonic() - started
            done.set()

        threading.Thread(target=watch, daemon=True).start()
        result["during"] = []
        while not done.is_set() or len(result["during"]) < max(1, control_loads):
            result["during"].extend(loads(1))
            if len(result["during"]) > 200:
                raise RuntimeError("the retention round did not end")
        result["after"] = loads(settled_loads)
        result["round_started_after_s"] = interval_s
        result["round_ended_after_s"] = round(round_s["done_after_start_s"], 1)
    result["rows_left"] = count(db, day, cutoff)
    db.dispose()
    settled, during = result["before"] + result["after"], result["during"]
    for figure, name in (("p99_ms", "p99_ratio"), ("rps", "throughput_ratio")):
        ratio = median_of(during, figure) / median_of(settled, figure)
        result[name] = round(ratio, 3)
    result["worst_p99_ratio"] = round(
        max(load["p99_ms"] for load in during) / max(load["p99_ms"] for load in settled), 3
    )
    return result


def median_of(loads: list[dict[str, Any]], figure: str) -> float:
    return float(statistics.median(load[figure] for load in loads))


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def run(
    url: str,
    week_label: str,
    runs: int,
    seconds: int,
    connections: int,
    settled_loads: int = 3,
    control_loads: int = 0,
    first_day: int = 0,
) -> dict[str, Any]:
    period = week(week_label)
    script_path = Path(tempfile.mkstemp(suffix=".lua")[1])
    script_path.write_text(wrk_script(stream=False))
    rounds = []
    with instant_upstream() as (_, upstream):
        for i in range(runs):
            day = period.since + (first_day + i) * DAY_S
            rounds.append(
                one_round(
                    url,
                    upstream,
                    day,
                    seconds,
                    connections,
                    str(script_path),
                    settled_loads,
                    control_loads,
                )
            )
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    return {
        "database": sa.make_url(url).get_backend_name(),
        "week": week_label,
        "settled_loads": settled_loads,
        "control_loads": control_loads,
        "connections": connections,
        "seconds": seconds,
        **{
            figure: spread([r[figure] for r in rounds])
            for figure in ("p99_ratio", "throughput_ratio", "worst_p99_ratio")
        },
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retention_serving", description=__doc__)
    parser.add_argument("--database", required=True, help="database URL holding the week")
    parser.add_argument("--week", help="the ISO week bench.records wrote (default: the last)")
    parser.add_argument("--runs", type=int, default=3, help="rounds, a day of the week each")
    parser.add_argument("--seconds", type=int, default=20, help="length of each wrk load")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument(
        "--settled-loads", type=int, default=3, help="loads before the round, and after it"
    )
    parser.add_argument(
        "--control-loads",
        type=int,
        default=0,
        help="instead, this many loads with nothing past the window: how far p99 moves",
    )
    parser.add_argument(
        "--first-day", type=int, default=0, help="the week's day the first run deletes (0: Monday)"
    )
    parser.add_argument("--out", help="write the result as JSON here too")
    args = parser.parse_args(argv)
    label = args.week or last_complete_week(time.time()).label
    result = run(
        args.database,
        label,
        args.runs,
        args.seconds,
        args.connections,
        args.settled_loads,
        args.control_loads,
        args.first_day,
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
