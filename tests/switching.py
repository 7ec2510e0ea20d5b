"""Servers a test starts and stops through the parking hook harness/server_switch.py: backends
whose processes a `command` hook releases and provisions again."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
from waiting import wait_for

from realfleet.engine import free_port

# The hook's argv, before its action, URL and state directory.
HOOK = [sys.executable, str(Path(__file__).resolve().parents[1] / "harness" / "server_switch.py")]


def switch(action: str, url: str, state: Path) -> None:
    subprocess.run([*HOOK, action, url, str(state)], check=True)


def up(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/health", timeout=2).status_code == 200
    return False


@contextlib.contextmanager
def switched(
    commands: Sequence[Callable[[int], list[str]]], state: Path, timeout_s: float
) -> Iterator[list[str]]:
    """Start a server per command line (given its port) through the hook, yield their URLs
    once each serves, and stop them through the hook after."""
    state.mkdir()
    urls = []
    for command in commands:
        port = free_port()
        (state / f"{port}.json").write_text(json.dumps(command(port)))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for url in urls:
            switch("wake", url, state)
        for url in urls:
            wait_for(lambda u=url: up(u), timeout=timeout_s, message=f"{url} never served")
        yield urls
    finally:
        for url in urls:
            switch("park", url, state)
