"""How the benchmarks' own servers run: on loopback, with uvloop and httptools, quietly."""

from __future__ import annotations

from typing import Any

import uvicorn


def serve(app: Any, port: int) -> None:
    """Serve an ASGI app on 127.0.0.1:port until the process is stopped."""
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )
