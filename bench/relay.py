"""A bare relay: the floor for a Python proxy built on what the gateway is built on.

A raw ASGI app on uvicorn (httptools, uvloop) that reads each request body and relays it to
one upstream through the gateway's own client (gateway/upstream/http1.py), then the answer back,
whole or as it streams: no routing, metrics, records or shadowing. `bench.hot_path --paths relay`
measures it beside the gateway, so the difference is the gateway's own work.

    python -m bench.relay --upstream http://127.0.0.1:9000 --port 9001
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.loopback import serve
from gateway.upstream.http1 import Client

HEALTH = "/healthz"


def build(upstream: str) -> Any:
    client: Client | None = None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal client
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    client = Client()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    if client is not None:
                        await client.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == HEALTH:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        assert client is not None
        headers = {"content-type": "application/json"}
        response = await client.request(
            "POST", upstream, scope["path"], headers, b"".join(parts), 30.0
        )
        try:
            kind = response.headers.get("content-type", "application/json")
            start = {"type": "http.response.start", "status": response.status}
            if kind.startswith("text/event-stream"):
                await send({**start, "headers": [(b"content-type", kind.encode())]})
                async for chunk in response.chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            else:
                body = await response.read()
                length = str(len(body)).encode()
                headers = [(b"content-type", kind.encode()), (b"content-length", length)]
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body})
        finally:
            response.release()

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(build(args.upstream), args.port)


if __name__ == "__main__":
    main()
