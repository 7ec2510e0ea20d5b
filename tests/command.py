"""Run the `gateway` command as an operator does: a process, from the repository's root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `gateway ARGS` to its end; a hang is the test timeout's to catch, since a busy
    machine may take any time to finish a precision check or a report."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )
