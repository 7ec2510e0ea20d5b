"""The simulator's HTTP surface: an OpenAI-compatible backend, its metrics and its fault switch.

    GET  /health                  {"status": "ok"}
    GET  /metrics                 Prometheus text (DCGM power and energy, sim_* counters)
    GET  /v1/models[/{id}]        the models this device serves
    POST /v1/chat/completions     plain and streaming
    POST /v1/completions          plain and streaming
    POST /v1/embeddings
    GET  /admin/faults            the faults now injected
    POST /admin/faults            change them (partial update; {"reset": true} clears)
    GET  /admin/external-load     the requests other clients keep in flight
    POST /admin/external-load     change them (partial update: requests, prompt_tokens, ...)
    POST /sleep?level=1           vLLM's sleep mode: park the devices (their parked draw)
    POST /wake_up                 wake them; answers once they serve (the profile's wake_s)
    GET  /is_sleeping             {"is_sleeping": bool}, true until awake
    POST /reset_prefix_cache      vLLM's: every device forgets its cached prefixes
    POST /admin/kv-events         {"lose": N}: the next N event batches miss the PUB socket

With `--kv-events-config`, each device's prefix cache publishes its changes on vLLM's wire
(simulator/kv_events.py).

Asleep, the devices answer generation and embedding requests 503 (code `sleeping`); /health
answers 200, as vLLM's does, and /is_sleeping says whether they serve.

Faults apply to `/v1/*` and `/health`, never to `/admin/*` or `/metrics`. With an API key, every
endpoint but `/admin/*` wants `Authorization: Bearer KEY` and answers 401 without it: stricter
than vLLM (which guards /v1 only), so a client's tests prove it sends its key on every call.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable
from functools import partial
from random import Random

from simulator.answers import Answer, compose
from simulator.device import Job, JobState
from simulator.embeddings import embed
from simulator.errors import (
    ApiError,
    Asleep,
    InvalidApiKey,
    InvalidRequest,
    MethodNotAllowed,
    ModelNotFound,
    ServerFault,
    UnknownUrl,
)
from simulator.exchange import Exchange, Receive, Scope, Send
from simulator.external import ExternalLoad, apply_external_load, update_external_load
from simulator.faults import Faults, update_faults
from simulator.fleet import Fleet
from simulator.kv_events import Publisher
from simulator.metrics import CONTENT_TYPE, SimulatorMetrics
from simulator.profile import Profile
from simulator.responses import (
    ChunkEncoder,
    chat_completion,
    embedding_list,
    model_entry,
    text_completion,
)
from simulator.schema import GenerationRequest, parse_chat, parse_completion, parse_embedding

Handler = Callable[[Exchange], Awaitable[None]]
DEVICE_HEADER = b"x-sim-device"


class SimulatorApp:
    """The ASGI application of one simulator process (one or a few devices behind one port)."""

    def __init__(
        self,
        profile: Profile,
        fleet: Fleet,
        *,
        seed: int = 0,
        faults: Faults | None = None,
        instance: str = "0",
        api_key: str | None = None,
        engine: str | None = None,
        kv_events: Publisher | None = None,
    ):
        self.profile = profile
        self.kv_events = kv_events
        if kv_events is not None:
            for device in fleet.devices:
                device.prefix_cache.events = partial(kv_events.publish, rank=device.index)
        self._expected = None if not api_key else f"Bearer {api_key}".encode()
        self.fleet = fleet
        self.metrics = SimulatorMetrics(profile, fleet, instance=instance, engine=engine)
        self.external = ExternalLoad()
        self.faults = Faults()
        # Separate streams, so injecting faults does not change the answers.
        self.rng = Random(seed)
        self.fault_rng = Random(seed + 1)
        self.embedding_rng = Random(seed + 2)
        self.started = int(time.time())
        self.set_faults(faults or Faults())
        # path -> (handler per method, whether faults apply)
        self._routes: dict[str, tuple[dict[str, Handler], bool]] = {
            "/health": ({"GET": self._health}, True),
            "/metrics": ({"GET": self._metrics}, False),
            "/admin/faults": ({"GET": self._get_faults, "POST": self._post_faults}, False),
            "/admin/external-load": (
                {"GET": self._get_external, "POST": self._post_external},
                False,
            ),
            "/sleep": ({"POST": self._sleep}, False),
            "/wake_up": ({"POST": self._wake_up}, False),
            "/is_sleeping": ({"GET": self._is_sleeping}, False),
            "/reset_prefix_cache": ({"POST": self._reset_prefix_cache}, False),
            "/admin/kv-events": ({"POST": self._post_kv_events}, False),
            "/v1/models": ({"GET": self._models}, True),
            "/v1/chat/completions": ({"POST": self._chat}, True),
            "/v1/completions": ({"POST": self._completions}, True),
            "/v1/embeddings": ({"POST": self._embeddings}, True),
        }
        self._model_route: tuple[dict[str, Handler], bool] = ({"GET": self._model}, True)

    def set_faults(self, faults: Faults) -> None:
        """Inject `faults` from now on."""
        self.faults = faults
        self.fleet.set_slow_factor(faults.slow_factor)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        exchange = Exchange(scope, receive, send)
        path = exchange.path
        counted = path.startswith("/v1/")
        if counted:
            self.metrics.request_started()
            exchange.on_end(lambda: self.metrics.request_ended(str(exchange.status or "none")))
        try:
            await self._dispatch(exchange)
        except ApiError as error:
            if exchange.status is not None:
                raise  # a response has started: the server must abort the connection
            await exchange.respond_error(error)
        finally:
            exchange.end()

    async def _dispatch(self, exchange: Exchange) -> None:
        path, method = exchange.path, exchange.method
        if self._expected is not None and not path.startswith("/admin/"):
            self._authorize(exchange)
        route = self._routes.get(path)
        if route is None and path.startswith("/v1/models/"):
            route = self._model_route
        if route is None:
            raise UnknownUrl(method, path)
        handlers, faultable = route
        handler = handlers.get(method)
        if handler is None:
            raise MethodNotAllowed(method, path)
        if faultable and not await self._survives_faults(exchange):
            return
        await handler(exchange)

    def _authorize(self, exchange: Exchange) -> None:
        """Refuse a request whose Authorization is not the expected bearer key."""
        assert self._expected is not None
        given = next((v for k, v in exchange.scope["headers"] if k == b"authorization"), None)
        if given is None or not hmac.compare_digest(given, self._expected):
            known = exchange.path if exchange.path in self._routes else "other"
            self.metrics.unauthorized[known] += 1
            raise InvalidApiKey(given is not None)

    async def _survives_faults(self, exchange: Exchange) -> bool:
        """Inject the faults that hit before handling; say whether the request goes on."""
        faults = self.faults
        if faults.refuse:
            self.metrics.faults["refuse"] += 1
            await exchange.body()
            await exchange.sever()
            return False
        if faults.hang:
            self.metrics.faults["hang"] += 1
            await exchange.wait_disconnect()
            return False
        if faults.error_rate > 0 and self.fault_rng.random() < faults.error_rate:
            self.metrics.faults["error"] += 1
            raise ServerFault(503 if self.fault_rng.random() < 0.5 else 500)
        if faults.added_latency_ms > 0:
            self.metrics.faults["latency"] += 1
            # The loop's timers may fire up to a millisecond early (uvloop keeps time in
            # milliseconds): sleep until the wall clock says the latency has passed.
            deadline = time.monotonic() + faults.added_latency_ms / 1000.0
            while (left := deadline - time.monotonic()) > 0:
                await asyncio.sleep(left)
        if faults.slow_factor != 1.0:
            self.metrics.faults["slow"] += 1  # the devices slow it down; counted as it arrives
        return True

    async def _health(self, exchange: Exchange) -> None:
        await exchange.respond_json(200, {"status": "ok"})

    async def _metrics(self, exchange: Exchange) -> None:
        await exchange.respond(200, self.metrics.render(), CONTENT_TYPE.encode())

    async def _models(self, exchange: Exchange) -> None:
        data = [model_entry(model, self.started) for model in self.profile.models]
        await exchange.respond_json(200, {"object": "list", "data": data})

    async def _model(self, exchange: Exchange) -> None:
        name = exchange.path.removeprefix("/v1/models/")
        model = self.profile.model(name)
        if model is None:
            raise ModelNotFound(name)
        await exchange.respond_json(200, model_entry(model, self.started))

    async def _get_faults(self, exchange: Exchange) -> None:
        await exchange.respond_json(200, self.faults.model_dump())

    async def _post_faults(self, exchange: Exchange) -> None:
        self.set_faults(update_faults(self.faults, await exchange.json()))
        await exchange.respond_json(200, self.faults.model_dump())

    def set_external_load(self, load: ExternalLoad) -> None:
        """Keep `load` of other clients on the devices from now on."""
        self.external = load
        apply_external_load(self.fleet, self.metrics, load)

    async def _get_external(self, exchange: Exchange) -> None:
        await exchange.respond_json(200, self.external.model_dump())

    async def _post_external(self, exchange: Exchange) -> None:
        self.set_external_load(update_external_load(self.external, await exchange.json()))
        await exchange.respond_json(200, self.external.model_dump())

    async def _sleep(self, exchange: Exchange) -> None:
        if not self.fleet.sleep():
            raise InvalidRequest("requests are running: drain the engine before it sleeps")
        await exchange.respond(200, b"", b"text/plain")

    async def _wake_up(self, exchange: Exchange) -> None:
        await self.fleet.wake_up()
        await exchange.respond(200, b"", b"text/plain")

    async def _is_sleeping(self, exchange: Exchange) -> None:
        await exchange.respond_json(200, {"is_sleeping": self.fleet.sleeping})

    async def _reset_prefix_cache(self, exchange: Exchange) -> None:
        for device in self.fleet.devices:
            device.prefix_cache.clear()
        await exchange.respond(200, b"", b"text/plain")

    async def _post_kv_events(self, exchange: Exchange) -> None:
        if self.kv_events is None:
            raise InvalidRequest("this simulator publishes no KV events (--kv-events-config)")
        body = await exchange.json()
        lose = body.get("lose") if isinstance(body, dict) else None
        if type(lose) is not int or lose < 0:
            raise InvalidRequest(f"'lose' must be a whole number of batches, got {lose!r}")
        self.kv_events.lose(lose)
        await exchange.respond_json(200, {"lose": lose})

    async def _chat(self, exchange: Exchange) -> None:
        await self._generate(exchange, parse_chat(await exchange.json(), self.profile))

    async def _completions(self, exchange: Exchange) -> None:
        await self._generate(exchange, parse_completion(await exchange.json(), self.profile))

    async def _generate(self, exchange: Exchange, request: GenerationRequest) -> None:
        """Answer a chat or text completion: decode it on a device, then reply or stream."""
        if self.fleet.sleeping:
            raise Asleep()
        precision = self.profile.precision
        answer = compose(
            request.question,
            noise=precision.logit_noise,
            drift=precision.drift,
            harmful_rate=precision.harmful_rate,
            rng=self.rng,
        )
        drop_after = self.faults.drop_after_tokens
        job = Job(
            request.model,
            request.prompt_tokens,
            answer.completion_tokens,
            blocks=request.blocks,
            token_ids=request.token_ids,
        )
        run = _Run(self.fleet, exchange, job)
        try:
            if request.stream:
                await self._stream(exchange, request, answer, run, drop_after)
            elif await run.finished():
                run.stop_watching()
                build = chat_completion if request.endpoint == "chat" else text_completion
                self._count(request, answer, job.cached_tokens)
                body = build(request.model.name, answer, request.prompt_tokens, job.cached_tokens)
                await exchange.respond_json(200, body, run.headers)
        finally:
            run.close()

    async def _stream(
        self,
        exchange: Exchange,
        request: GenerationRequest,
        answer: Answer,
        run: _Run,
        drop_after: int | None,
    ) -> None:
        """Send each token as the device decodes it (several per write if several are due)."""
        job = run.job
        encoder = ChunkEncoder(
            request.endpoint, request.model.name, answer, include_usage=request.include_usage
        )
        cut = drop_after if drop_after is not None and drop_after < job.output_tokens else None
        await exchange.start_stream(run.headers)
        sent = 0
        while True:
            ready = job.tokens_emitted if cut is None else min(job.tokens_emitted, cut)
            if ready > sent:
                await exchange.write(encoder.tokens(sent, ready))
                sent = ready
            if sent == cut:
                self.metrics.faults["drop"] += 1
                run.close()
                await exchange.sever()
                return
            if job.finished:
                break
            await run.progressed()
        if job.state is JobState.DONE:
            self._count(request, answer, job.cached_tokens)
            await exchange.end_stream(encoder.closing(request.prompt_tokens, job.cached_tokens))

    async def _embeddings(self, exchange: Exchange) -> None:
        request = parse_embedding(await exchange.json(), self.profile)
        if self.fleet.sleeping:
            raise Asleep()
        run = _Run(self.fleet, exchange, Job(request.model, request.prompt_tokens, 0))
        try:
            if not await run.finished():
                return
            run.stop_watching()
            dimensions = request.model.dimensions or 0
            noise = self.profile.precision.embedding_noise
            vectors = [
                embed(request.model.name, text, dimensions, noise=noise, rng=self.embedding_rng)
                for text in request.inputs
            ]
            self.metrics.prompt_tokens += request.prompt_tokens
            body = embedding_list(
                request.model.name,
                vectors,
                request.prompt_tokens,
                encoding_format=request.encoding_format,
            )
            await exchange.respond_json(200, body, run.headers)
        finally:
            run.close()

    def _count(self, request: GenerationRequest, answer: Answer, cached_tokens: int) -> None:
        self.metrics.prompt_tokens += request.prompt_tokens
        if self.profile.prefix_cache.enabled:
            self.metrics.prefix_queries[request.model.name] += request.prompt_tokens
            self.metrics.prefix_hits[request.model.name] += cached_tokens
        self.metrics.completion_tokens += answer.completion_tokens
        self.metrics.answers[answer.precision] += 1
        self.metrics.flipped_tokens += answer.flips


class _Run:
    """A job placed on a device and followed until it finishes or its client goes away.

    A client that disconnects cancels the job, freeing its slot, as real servers abort
    requests whose client is gone.
    """

    def __init__(self, fleet: Fleet, exchange: Exchange, job: Job):
        self.job = job
        self._fleet = fleet
        self._progress = asyncio.Event()
        job.on_progress = self._progress.set
        device = fleet.place()
        fleet.submit(device, job)
        self.headers = [(DEVICE_HEADER, str(device.index).encode())]
        self._stop_watching = exchange.on_disconnect(lambda: self._gone(exchange))

    def _gone(self, exchange: Exchange) -> None:
        # The client left: the request stops counting at once, before any later arrival.
        self._fleet.cancel(self.job)
        exchange.end()

    async def progressed(self) -> None:
        """Wait until the device has decoded more of the job (or dropped it)."""
        await self._progress.wait()
        self._progress.clear()

    async def finished(self) -> bool:
        """Wait until the job leaves the device; say whether it was served in full."""
        while not self.job.finished:
            await self.progressed()
        return self.job.state is JobState.DONE

    def stop_watching(self) -> None:
        """Stop watching for the client going away (the response is about to complete)."""
        self._stop_watching()

    def close(self) -> None:
        """Stop watching and withdraw the job if it is still on its device."""
        self._stop_watching()
        self._fleet.cancel(self.job)
