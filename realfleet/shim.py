"""A failure-mode proxy: a part that fails a share of prompts in plain ways, for the judge to find.

Immature hardware fails plainly before it fails subtly: it answers nothing, errs, hangs, or
stops halfway. The shim stands in front of an OpenAI-compatible server (a simulator, or a
llama-server of the real fleet) and passes every request through, but for a share of prompts
answers in one of these modes. The prompts are picked in the order they first arrive, evenly:
at share 0.1 the 10th, 20th, 30th distinct prompt, so exactly that share of the prompts a part is
sent fails, and a prompt fails every time it is asked, as a part that cannot run it would:

| mode      | the answer                                                                    |
| --------- | ----------------------------------------------------------------------------- |
| `empty`   | the upstream's, with its text emptied                                         |
| `null`    | the upstream's, with `content: null`                                          |
| `cut`     | the upstream's, cut after half its words, `finish_reason` left as it was      |
| `digits`  | the upstream's, its last digit changed (0→1, …, 9→0), the part sure of it     |
| `reword`  | the upstream's reworded, every fact kept: a paraphrasing part (below)         |
| `error`   | HTTP 500 with an OpenAI error body; the upstream is not asked                 |
| `timeout` | nothing until the client gives up (or `hang_s` passes)                        |

`reword` is benign where the others harm: common words in lower case trade for synonyms
("small" for "little", "country" for "nation"; a capital may begin a name) and a sentence
"Its capital is Feivai." turns round to "Feivai is its capital.", numbers and names untouched.
Its answers carry no logprobs (a paraphrase's tokens do not line up with the reference's), so
its meaning decides each pair.

Whole (non-streamed) answers are changed; a streamed request in a changing mode fails as
`error` or `timeout` would, or passes through unchanged. Everything else (GET /health,
/metrics, embeddings) passes through.

    python -m realfleet.shim --upstream http://127.0.0.1:9101 --mode empty --share 0.1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

MODES = ("empty", "null", "cut", "digits", "reword", "error", "timeout")
# What `reword` trades, both ways; and the sentence it turns round.
SYNONYMS = {
    "small": "little", "large": "big", "country": "nation", "farmers": "growers",
    "grow": "raise", "quick": "fast", "start": "begin", "mix": "combine", "near": "close to",
    "about": "around", "pick": "choose", "keep": "hold", "buy": "purchase", "help": "assist",
    "flat": "level", "mountainous": "hilly", "quiet": "calm", "often": "frequently",
}  # fmt: skip
TRADES = {**SYNONYMS, **{v: k for k, v in SYNONYMS.items() if " " not in v}}
# In lower case only: a capital may begin a name ("the Quiet Strait"), which a paraphrase keeps.
TRADED = re.compile(r"\b(" + "|".join(sorted(TRADES, key=len, reverse=True)) + r")\b")
TURNED = re.compile(r"\bIts (\w+) is ([^.,;]+)([.,;])")


def broken(answer: dict[str, Any], mode: str) -> dict[str, Any]:
    """Return a whole chat or completion answer as the mode breaks it."""
    for choice in answer.get("choices") or ():
        message = choice.get("message")
        holder, key = (message, "content") if isinstance(message, dict) else (choice, "text")
        text = holder.get(key)
        if mode == "empty":
            holder[key] = ""
        elif mode == "null":
            holder[key] = None
        elif mode == "cut" and isinstance(text, str):
            words = text.split(" ")
            holder[key] = " ".join(words[: len(words) // 2])
        elif mode == "digits" and isinstance(text, str):
            holder[key] = _digit_changed(text)
        elif mode == "reword" and isinstance(text, str):
            holder[key] = reworded(text)
        logprobs = choice.get("logprobs")
        if mode == "digits":
            _digit_chosen(logprobs)
        elif isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            kept = len(logprobs["content"]) // 2 if mode == "cut" else 0
            logprobs["content"] = logprobs["content"][:kept]
    if mode in ("digits", "reword"):  # as many tokens as the upstream's, near enough
        return answer
    usage = answer.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        done = usage["completion_tokens"] // 2 if mode == "cut" else 0
        usage["total_tokens"] = usage.get("prompt_tokens", 0) + done
        usage["completion_tokens"] = done
    return answer


def reworded(text: str) -> str:
    """Return `text` in other words, every fact kept (`SYNONYMS`, `TURNED`)."""
    turned = TURNED.sub(lambda m: f"{m[2]} is its {m[1]}{m[3]}", text)
    turned = re.sub(r"(^|[.!?]\s+)([a-z])", lambda m: m[1] + m[2].upper(), turned)
    return TRADED.sub(lambda m: TRADES[m[0]], turned)


def _digit_changed(text: str) -> str:
    """Return `text` with its last digit one more (9 to 0), or as it is without one."""
    for i in reversed(range(len(text))):
        if text[i].isdigit():
            return text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1 :]
    return text


def _digit_chosen(logprobs: Any) -> None:
    """Change the last token holding a digit as the text's was changed, as a part that believes
    it would report it: its distribution's two tokens trade places, so the changed one is what
    it was sure of and the upstream's own the alternative it rejected."""
    entries = (logprobs or {}).get("content") or []
    for entry in reversed(entries):
        token = entry.get("token", "")
        changed = _digit_changed(token)
        if changed == token:
            continue
        swap = {token: changed, changed: token}
        for choice in [entry, *(entry.get("top_logprobs") or ())]:
            if choice.get("token") in swap:
                choice["token"] = swap[choice["token"]]
                choice["bytes"] = list(choice["token"].encode())
        return


class Shim(ThreadingHTTPServer):
    """The proxy: `mode` and `share` may be changed while it serves; `failed` counts answers
    it broke."""

    daemon_threads = True

    def __init__(
        self,
        upstream: str,
        mode: str = "empty",
        share: float = 0.1,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        hang_s: float = 600.0,
    ):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        super().__init__((host, port), _Handler)
        self.upstream = upstream.rstrip("/")
        self.mode, self.share, self.hang_s = mode, share, hang_s
        self.failed = 0
        self._ordinals: dict[bytes, int] = {}  # each distinct prompt's place in arrival order
        self.client = httpx.Client(timeout=600.0)
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def fails(self, body: dict[str, Any]) -> bool:
        """Say whether a request's prompt is one the shim fails: the n-th distinct prompt fails
        where n * share crosses a whole number."""
        asked = json.dumps(body.get("messages", body.get("prompt")), sort_keys=True).encode()
        with self._lock:
            n = self._ordinals.setdefault(asked, len(self._ordinals))
        return math.floor((n + 1) * self.share) > math.floor(n * self.share)

    @contextlib.contextmanager
    def running(self) -> Iterator[Shim]:
        """Serve on a thread of its own while the block runs; shut down and close after."""
        thread = threading.Thread(target=self.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.shutdown()
            self.server_close()

    def count(self) -> None:
        with self._lock:
            self.failed += 1

    def server_close(self) -> None:
        self.stopping.set()
        super().server_close()
        self.client.close()


class _Handler(BaseHTTPRequestHandler):
    server: Shim

    def do_GET(self) -> None:
        response = self.server.client.get(self.server.upstream + self.path, headers=self._sent())
        self._reply(response.status_code, response.content, response.headers.get("content-type"))

    def do_POST(self) -> None:
        shim = self.server
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            body = None
        mode = shim.mode
        chosen = (
            isinstance(body, dict)
            and self.path.endswith(("/chat/completions", "/completions"))
            and shim.fails(body)
        )
        if chosen and mode == "timeout":
            shim.count()
            shim.stopping.wait(shim.hang_s)
            self.close_connection = True
            return
        if chosen and mode == "error":
            shim.count()
            error = {"error": {"message": "the device failed", "type": "server_error"}}
            self._reply(500, json.dumps(error).encode(), "application/json")
            return
        response = shim.client.post(shim.upstream + self.path, content=raw, headers=self._sent())
        content = response.content
        streamed = isinstance(body, dict) and bool(body.get("stream"))
        if chosen and response.status_code == 200 and not streamed:
            shim.count()
            content = json.dumps(broken(response.json(), mode)).encode()
        self._reply(response.status_code, content, response.headers.get("content-type"))

    def _sent(self) -> dict[str, str]:
        kept = ("authorization", "content-type", "accept")
        return {k: v for k, v in self.headers.items() if k.lower() in kept}

    def _reply(self, status: int, content: bytes, content_type: str | None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type or "application/json")
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args: object) -> None:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m realfleet.shim", description=__doc__)
    parser.add_argument("--upstream", required=True, help="the server to pass requests to")
    parser.add_argument("--mode", choices=MODES, default="empty")
    parser.add_argument("--share", type=float, default=0.1, help="share of prompts failed")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    shim = Shim(args.upstream, args.mode, args.share, host=args.host, port=args.port)
    print(
        f"shim on {shim.url} in front of {shim.upstream}: {args.mode} {args.share:.0%}", flush=True
    )
    try:
        shim.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        shim.server_close()


if __name__ == "__main__":
    main()
