"""A standard-library HTTP server on loopback, run on a thread of its own while a block runs."""

from __future__ import annotations

import contextlib
import socketserver
import threading
from collections.abc import Iterator
from typing import TypeVar

S = TypeVar("S", bound=socketserver.BaseServer)


@contextlib.contextmanager
def serving(server: S) -> Iterator[S]:
    """Serve `server` on a thread while the block runs; shut it down and close it after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
