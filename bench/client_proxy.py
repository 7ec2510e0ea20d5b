"""A minimal FastAPI proxy using one upstream HTTP client, to compare clients in isolation.

Clients: httpx, aiohttp, and the gateway's own (gateway/upstream/http1.py).
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from bench.loopback import serve

CLIENTS = ("httpx", "aiohttp", "gateway")


def build(client_name: str, upstream: str) -> FastAPI:
    state: dict[str, object] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if client_name == "httpx":
            import httpx

            state["client"] = httpx.AsyncClient(
                base_url=upstream, limits=httpx.Limits(max_connections=1000)
            )
        elif client_name == "aiohttp":
            import aiohttp

            state["client"] = aiohttp.ClientSession(
                upstream, connector=aiohttp.TCPConnector(limit=0)
            )
        else:
            from gateway.upstream.http1 import Client

            state["client"] = Client()
        yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def proxy(request: Request) -> Response:
        body = await request.body()
        client = state["client"]
        headers = {"content-type": "application/json"}
        if client_name == "httpx":
            r = await client.post("/v1/chat/completions", content=body, headers=headers)  # type: ignore[attr-defined]
            return Response(r.content, r.status_code, media_type="application/json")
        if client_name == "gateway":
            answer = await client.request("POST", upstream, "/v1/chat/completions", headers, body)  # type: ignore[attr-defined]
            return Response(await answer.read(), answer.status, media_type="application/json")
        async with client.post("/v1/chat/completions", data=body, headers=headers) as r:  # type: ignore[attr-defined]
            return Response(await r.read(), r.status, media_type="application/json")

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--client", choices=CLIENTS, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(build(args.client, args.upstream), args.port)


if __name__ == "__main__":
    main()
