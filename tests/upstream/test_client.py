"""The upstream client against a real server on loopback."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.fleet.state import BackendState
from gateway.upstream.client import Upstream


def test_a_cookie_one_answer_sets_is_not_sent_with_later_requests() -> None:
    async def scenario() -> list[str | None]:
        cookies: list[str | None] = []

        async def chat(request: web.Request) -> web.Response:
            cookies.append(request.headers.get("cookie"))
            answer = web.json_response({"object": "chat.completion"})
            answer.set_cookie("session", "one-client")
            return answer

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "localhost", 0)
        await site.start()
        port = runner.addresses[0][1]
        upstream = Upstream()
        await upstream.start()
        backend = BackendState("gpu-0", f"http://localhost:{port}", "gpu", 4)
        try:
            for _ in range(3):
                response = await upstream.send(
                    backend, "/v1/chat/completions", b"{}", backend.headers, 5.0, 60.0
                )
                await upstream.read(backend, response)
                response.release()
        finally:
            await upstream.close()
            await runner.cleanup()
        return cookies

    assert asyncio.run(scenario()) == [None, None, None]
