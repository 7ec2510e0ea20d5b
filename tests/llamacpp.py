"""A loopback llama-server that answers with what the real one wrote (tests/captured/llamacpp/).

The gateway's `engine: llamacpp` support is tested against those bytes on a real socket: the
same statuses, headers and bodies, a stream sent in chunked transfer one event a chunk as
llama-server sends it. Which answer a request gets follows the real server's rules: a prompt
longer than a slot's context is refused with its 400 before anything is streamed (the captured
model's tokens are its bytes but for five merges, so a prompt is measured in bytes), `n` 2 gets
the answer of two choices, anything else the answer of one, whole or streamed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
from threadserver import serving

from gateway.policy.definition import Policy
from gateway.policy.load import parse_policy, to_yaml
from policies import MODEL, pool

CAPTURED = Path(__file__).resolve().parent / "captured" / "llamacpp"
SLOT_CONTEXT = 2048  # what the captured server's slots had (README.md)


def captured(name: str) -> bytes:
    """Return the bytes of one captured answer."""
    return (CAPTURED / name).read_bytes()


def events(name: str) -> list[bytes]:
    """Return a captured stream's events, each with its blank line."""
    return [event + b"\n\n" for event in captured(name).split(b"\n\n") if event.strip()]


def prompt_bytes(body: dict[str, Any]) -> int:
    """Return the length of a chat or completion request's prompt, in bytes."""
    if "messages" in body:
        text = "".join(str(m.get("content") or "") for m in body["messages"])
    else:
        text = str(body.get("prompt", ""))
    return len(text.encode())


def answer(body: dict[str, Any], path: str, context: int) -> tuple[int, list[tuple[str, str]], Any]:
    """Return (status, headers, whole body or list of events) the captured server gave."""
    json = [("Content-Type", "application/json; charset=utf-8")]
    if prompt_bytes(body) >= context:
        return 400, [*json, ("Connection", "close")], captured("exceed-context.json")
    if path == "/v1/completions":
        return 200, json, captured("completions-n2-logprobs.json")
    two = body.get("n") == 2
    if body.get("stream"):
        stream = [("Content-Type", "text/event-stream"), ("X-Accel-Buffering", "no")]
        return 200, stream, events("chat-n2-logprobs-stream.txt" if two else "chat-stream.txt")
    return 200, json, captured("chat-n2-logprobs.json" if two else "chat.json")


class LlamaServerReplay(BaseHTTPRequestHandler):
    """Answer as the captured llama-server did; remember every request body."""

    protocol_version = "HTTP/1.1"
    server: ReplayServer

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["content-length"]))
        body = orjson.loads(raw)
        self.server.seen.append(body)
        status, headers, content = answer(body, self.path, self.server.context)
        self.send_response(status)
        self.send_header("Server", "llama.cpp")
        for name, value in headers:
            self.send_header(name, value)
        if isinstance(content, bytes):
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in content:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        if self.path == "/metrics":
            content = self.server.metrics.encode()
            kind = "text/plain; version=0.0.4"
        elif self.path == "/health":
            content, kind = b'{"status":"ok"}', "application/json; charset=utf-8"
        elif self.path == "/slots":
            content, kind = self.server.slots.encode(), "application/json; charset=utf-8"
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Server", "llama.cpp")
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args: object) -> None:
        pass


class ReplayServer(ThreadingHTTPServer):
    """The replaying server: its URL, the bodies it was sent, the metrics text it serves."""

    daemon_threads = True

    def __init__(self, context: int, metrics: str):
        super().__init__(("127.0.0.1", 0), LlamaServerReplay)
        self.context = context
        self.metrics = metrics
        self.slots = captured("slots.json").decode()
        self.seen: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def llama_policy(
    url: str, gpu: Sequence[str] = (), *, max_context: int = SLOT_CONTEXT, **extra: object
) -> Policy:
    """Return a policy whose one route serves MODEL on a llamacpp pool (`llama`, a CPU process
    with three slots and no power series), falling back to a GPU pool when given one."""
    llama = pool("cpu", [url], [MODEL], engine="llamacpp", max_context=max_context)
    llama |= {"slots_per_backend": 3, "power_metrics": None, **extra}
    route: dict[str, Any] = {"name": "chat", "match": {"models": [MODEL]}, "pools": ["llama"]}
    pools = {"llama": llama}
    if gpu:
        pools["gpu"] = pool("gpu", gpu, [MODEL])
        route["fallback"] = "gpu"
    doc = {
        "default_slo_class": "interactive",
        "slo_classes": {"interactive": {"ttft_ms": 5000, "max_queue_ms": 5000, "timeout_s": 30}},
        "pools": pools,
        "routes": [route],
    }
    return parse_policy(to_yaml(doc), "llamacpp.yaml")


@contextlib.contextmanager
def llama_server(
    context: int = SLOT_CONTEXT, metrics: str = "metrics-after.txt"
) -> Iterator[ReplayServer]:
    """Serve the captured llama-server on loopback while the block runs."""
    with serving(ReplayServer(context, captured(metrics).decode())) as server:
        yield server
