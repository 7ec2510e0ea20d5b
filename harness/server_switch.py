"""A parking hook that stops a server process, or starts it again: the real fleet's llama-server
switched off and on, or a simulator released and provisioned again.

    python harness/server_switch.py park|wake URL STATE_DIR

STATE_DIR holds, per backend port, `PORT.json` (the server's command line) and, while it runs,
`PORT.pid`. `wake` starts the server in a session of its own and returns at once: the gateway
sends it requests once its /health answers. `park` stops it (SIGTERM) and returns once its
port refuses connections. Either is harmless when the server already is as asked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def main(action: str, url: str, state: Path) -> int:
    port = urlsplit(url).port
    assert port is not None, f"no port in {url}"
    pid_file = state / f"{port}.pid"
    if action == "wake":
        if listening(port):
            return 0
        argv = json.loads((state / f"{port}.json").read_text())
        with open(state / f"{port}.log", "ab") as log:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        pid_file.write_text(str(process.pid))
        return 0
    if action == "park":
        if pid_file.exists():
            pid = int(pid_file.read_text())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while listening(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            if listening(port):
                os.kill(pid, signal.SIGKILL)
            pid_file.unlink()
        return 0
    print(f"unknown action {action!r}: park or wake", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
