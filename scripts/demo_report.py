"""`make report`: a demo week of traffic through the real gateway, rendered as the weekly report.

Starts the default fleet's simulators (in real time, as the policy describes them) and the
gateway on free ports with a fresh SQLite database under reports/demo/, sends a minute of mixed
chat traffic with the official openai client (shadow copies, noise floor and energy metering
all live), runs the precision checks of the ASIC and the CIM part, stops everything cleanly,
then stretches the recorded timestamps over the last complete week, so the minute reads as a
week, and writes reports/demo/report.html, report.md and report.json.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import openai
import sqlalchemy as sa
import yaml

from gateway.report.period import last_complete_week

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "demo"
SECONDS = float(os.environ.get("DEMO_SECONDS", "60"))
# Real time: the policy's hardware figures are what the gateway's cost model starts from, so a
# faster simulated clock would make every measurement a fraction of every prediction, and the
# report's cost-model error would measure the demo, not the model.
SPEED = "1"
# Requests in flight at once: at real time an answer takes about a second.
SENDERS = 24
BIG = "llama-3.1-70b-instruct"
WORDS = [
    "energy",
    "memory",
    "array",
    "token",
    "decode",
    "prefill",
    "batch",
    "tensor",
    "cache",
    "silicon",
    "analog",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def traffic(base_url: str, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    client = openai.OpenAI(base_url=base_url, api_key="demo", max_retries=0)
    while not stop.is_set():
        words = rng.randint(2500, 3500) if rng.random() < 0.3 else rng.randint(10, 400)
        prompt = " ".join(rng.choice(WORDS) for _ in range(words))
        # A refused request is part of the week too.
        with contextlib.suppress(openai.APIError):
            client.chat.completions.create(
                model=BIG if rng.random() < 0.1 else "llama-3.1-8b-instruct",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=rng.randint(30, 120),
                temperature=0 if rng.random() < 0.9 else 0.7,
            )


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    database = OUT / "demo.db"
    for stale in OUT.glob("demo.db*"):
        stale.unlink()
    url = f"sqlite:///{database}"
    python = sys.executable
    # One simulator per backend of the default policy: pool, profile, models it serves, seed
    # (as scripts/run-local.sh gives them), port.
    sims = [
        ("gpu", "gpu", "", 1, free_port()),
        ("gpu", "gpu", "", 2, free_port()),
        ("gpu-70b", "gpu", BIG, 5, free_port()),
        ("asic", "asic", "", 3, free_port()),
        ("cim", "cim", "", 4, free_port()),
    ]
    doc = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    for name, pool in doc["pools"].items():
        pool["backends"] = [
            {"url": f"http://127.0.0.1:{port}"} for p, *_, port in sims if p == name
        ]
    policy = OUT / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "GATEWAY_POLICY": str(policy),
        "GATEWAY_LOG_LEVEL": "warning",
    }
    subprocess.run(
        [python, "-m", "gateway", "db", "upgrade"], env=env, check=True, capture_output=True
    )
    processes = []
    try:
        for _, profile, models, seed, port in sims:
            processes.append(
                subprocess.Popen(
                    [
                        python,
                        "-m",
                        "simulator",
                        "--profile",
                        profile,
                        *(["--models", models] if models else []),
                        "--port",
                        str(port),
                        "--speed",
                        SPEED,
                        "--seed",
                        str(seed),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for *_, port in sims:
            wait_for(f"http://127.0.0.1:{port}/metrics")
        gateway_port = free_port()
        gateway = subprocess.Popen(
            [python, "-m", "gateway", "serve", "--port", str(gateway_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        processes.append(gateway)
        wait_for(f"http://127.0.0.1:{gateway_port}/readyz")
        print(f"sending {SECONDS:.0f} s of traffic through the gateway on :{gateway_port}")
        stop = threading.Event()
        senders = [
            threading.Thread(
                target=traffic, args=(f"http://127.0.0.1:{gateway_port}/v1", stop, seed)
            )
            for seed in range(SENDERS)
        ]
        for sender in senders:
            sender.start()
        time.sleep(SECONDS)
        stop.set()
        for sender in senders:
            sender.join()
        # Precision checks of the ASIC and of the CIM part, stored for the report's section.
        for pool in ("asic", "cim"):
            checked = subprocess.run(
                [python, "-m", "gateway", "precision", "check", "--pool", pool, "--suite",
                 "suites/chat.jsonl", "--out", str(OUT / f"precision-{pool}.json"),
                 "--concurrency", "32"],
                cwd=ROOT,  # the report names the suite as given
                env=env,
                capture_output=True,
                text=True,
            )  # fmt: skip
            if checked.returncode not in (0, 1):
                raise SystemExit(f"precision check of {pool} failed to run: {checked.stderr}")
            verdict = "passes" if checked.returncode == 0 else "fails"
            print(f"precision check: {pool} {verdict}")
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=10)
    week = last_complete_week(time.time())
    db = sa.create_engine(url)
    with db.begin() as conn:
        t0, t1 = conn.execute(sa.text("select min(ts), max(ts) from request_records")).one()
        scale = (week.until - week.since - 60) / max(t1 - t0, 1e-9)
        for table in ("request_records", "shadow_records", "shadow_drops"):
            conn.execute(
                sa.text(f"update {table} set ts = :start + (ts - :t0) * :scale"),
                {"start": week.since, "t0": t0, "scale": scale},
            )
        # The precision checks ran after the traffic: at the end of the week.
        conn.execute(sa.text("update precision_checks set ts = :end"), {"end": week.until - 60})
        # The cost model versions trained during the minute were trained during the week.
        conn.execute(
            sa.text("update cost_models set created = :start + (created - :t0) * :scale"),
            {"start": week.since, "t0": t0, "scale": scale},
        )
    db.dispose()
    subprocess.run(
        [python, "-m", "gateway", "report", "weekly", "--week", week.label, "--out", str(OUT)],
        env=env,
        check=True,
    )
    print(f"open {OUT / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
