"""Classify a request: turn its body and headers into the profile that routing decides on.

A body is checked by its endpoint's description first (gateway/routing/bodies.py); what is read
here is then of the type described, and what a description cannot say is checked here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest, SloNotAllowed, Unauthorized, shown
from gateway.fleet.prefixes import BLOCK_TOKENS
from gateway.fleet.sessions import MAX_KEY_CHARS, SESSION_HEADERS
from gateway.policy.definition import Policy, Tenant
from gateway.routing import bodies, prefix
from gateway.routing.tokens import Tokenizer, token_blocks

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
# The Responses API, served through chat completions (gateway/ingress/responses.py).
RESPONSES_PATH = "/v1/responses"

# Characters per token of Llama 3's tokenizer by script (docs/operations.md): English 3.94
# (arXiv:2407.21783), Chinese 1.26 (measured on 429k characters of modern Chinese). Other
# scripts have no checked figure here: 2, on the high side, since a prompt estimated too short
# can be sent to a pool whose context it overflows.
LATIN_CHARS_PER_TOKEN = 4.0
CJK_CHARS_PER_TOKEN = 1.26
OTHER_CHARS_PER_TOKEN = 2.0
# Kana, CJK ideographs (and extension A, compatibility), Hangul syllables, fullwidth forms.
_CJK = re.compile(
    "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)
# A part that is not text (an image, audio, a file) on a vision or audio model: a high-detail
# image is 765 tokens on OpenAI's models; counted at about that.
NON_TEXT_PART_TOKENS = 1000
MESSAGE_OVERHEAD_TOKENS = 4
# What one answer's usage may move a model's ratio: its observed ratio is first bounded to
# between half and twice the current one, so one odd request cannot swing every tenant's.
MAX_RATIO_STEP = 2.0
# A per-request target in milliseconds (x-slo-ttft-ms, x-slo-tpot-ms): a positive decimal under
# a billion (11 days), without sign, exponent or spaces. The OpenAPI description states this
# pattern for both headers (gateway/ops/openapi.py), so what it says and what is checked agree.
MS_PATTERN = r"^(?:[1-9][0-9]{0,8}(?:\.[0-9]+)?|0\.[0-9]*[1-9][0-9]*)$"
_MS = re.compile(MS_PATTERN)


@dataclass(slots=True)
class RequestProfile:
    """What the router needs to know about one request."""

    endpoint: str
    model: str
    prompt_tokens: int
    max_tokens: int | None
    slo_class: str
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    tenant: str
    stream: bool
    # Answers generated for the request: `n` (or `best_of`, which generates that many).
    sequences: int = 1
    # The estimator's ratio for the model when prompt_tokens was estimated (TokenEstimator.observe).
    token_ratio: float = 1.0
    # The prompt's prefix blocks, as engines key their KV cache (gateway/routing/prefix.py), and
    # the tokens one holds: what a backend holding the first k has cached is k * block_tokens.
    blocks: tuple[int, ...] = ()
    block_tokens: float = 0.0
    # The session the client named (gateway/fleet/sessions.py), or None.
    session: str | None = None

    def cached_tokens(self, blocks_held: int) -> int:
        """Return the prompt tokens a backend holding its first `blocks_held` blocks has cached."""
        return min(self.prompt_tokens, round(blocks_held * self.block_tokens))

    def blocks_found(self, cached_tokens: int, prompt_tokens: int | None = None) -> int:
        """Return the whole blocks an engine that found `cached_tokens` of the prompt's
        `prompt_tokens` (its own count; the estimate's when None) had cached: its count is
        scaled to the estimate the blocks were sized by."""
        if not self.block_tokens:
            return 0
        scale = self.prompt_tokens / prompt_tokens if prompt_tokens else 1.0
        return int(cached_tokens * scale / self.block_tokens)


def text_tokens(text: str) -> float:
    """Estimate the tokens of a text from its characters, script by script."""
    if text.isascii():
        return len(text) / LATIN_CHARS_PER_TOKEN
    rest = _CJK.sub("", text)
    latin = len(rest.encode("ascii", "ignore"))
    return (
        latin / LATIN_CHARS_PER_TOKEN
        + (len(text) - len(rest)) / CJK_CHARS_PER_TOKEN
        + (len(rest) - latin) / OTHER_CHARS_PER_TOKEN
    )


class TokenEstimator:
    """Estimate prompt tokens from characters, corrected per model by the usage backends report.

    Counting characters by script costs nothing and needs no tokenizer; the per-model ratio
    learned from the `usage` that backends report corrects it for each model's real tokenizer.
    """

    def __init__(
        self,
        smoothing: float = 0.05,
        tokenizers: Callable[[str], Tokenizer | None] = lambda path: None,
    ):
        self._smoothing = smoothing
        self._ratio: dict[str, float] = {}
        # A model's tokenizer by its import path (gateway/routing/tokenizers.py loads them);
        # by default none: every prompt is keyed by its text.
        self.tokenizer = tokenizers

    def estimate(self, model: str, raw: float) -> int:
        """Return the prompt tokens of a request whose parts count `raw` tokens by script."""
        return math.ceil(raw * self._ratio.get(model, 1.0))

    def observe(self, model: str, estimated: int, actual: int, ratio: float) -> None:
        """Move the model's ratio toward what the backend counted for an estimated prompt.

        `ratio` is the one the estimate was made with. With many requests in flight
        the ratio moves between a request's estimate and its usage; judging the estimate by
        the moved ratio fed each error back into the ratio, which diverged from about 40
        requests in flight.
        """
        if estimated <= 0 or actual <= 0 or ratio <= 0:
            return
        current = self._ratio.get(model, 1.0)
        observed = actual / (estimated / ratio)
        observed = min(max(observed, current / MAX_RATIO_STEP), current * MAX_RATIO_STEP)
        self._ratio[model] = current + self._smoothing * (observed - current)

    def ratio(self, model: str) -> float:
        """Return the current correction of a model's estimates (1.0 until observed)."""
        return self._ratio.get(model, 1.0)


def _content_tokens(content: Any) -> float:
    """Estimate a message content: a string, a list of text and other parts, or none."""
    if isinstance(content, str):
        return text_tokens(content)
    total = 0.0
    for part in content or ():
        text = part.get("text")
        total += text_tokens(text) if isinstance(text, str) else NON_TEXT_PART_TOKENS
    return total


def _message_tokens(message: dict[str, Any]) -> float:
    """Estimate everything of a chat message that its template renders: content, name, calls."""
    tokens = MESSAGE_OVERHEAD_TOKENS + _content_tokens(message.get("content"))
    name = message.get("name")
    if isinstance(name, str):
        tokens += text_tokens(name)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                for key in ("name", "arguments"):
                    value = function.get(key)
                    if isinstance(value, str):
                        tokens += text_tokens(value)
    return tokens


def _prompt_tokens(endpoint: str, payload: dict[str, Any]) -> float:
    """Return a checked body's prompt tokens as estimated by script, every part the backend
    will tokenize counted (messages, names, tool calls, tool definitions)."""
    if endpoint == "chat":
        tokens = sum(_message_tokens(message) for message in payload["messages"])
        for field in ("tools", "functions"):
            # Chat templates render tool definitions into the prompt, as JSON or close to it.
            if isinstance(payload.get(field), list) and payload[field]:
                tokens += text_tokens(orjson.dumps(payload[field]).decode())
        return tokens
    value = payload["prompt" if endpoint == "completions" else "input"]
    if isinstance(value, str):
        return text_tokens(value)
    if isinstance(value[0], str):
        return sum(text_tokens(v) for v in value)
    if isinstance(value[0], list):
        return float(sum(len(v) for v in value))
    return float(len(value))  # token ids


def _max_tokens(payload: dict[str, Any]) -> int | None:
    for field in ("max_completion_tokens", "max_tokens"):
        value = payload.get(field)
        if value is not None:
            return int(value)  # checked: a whole number, maybe written 64.0
    return None


def _sequences(payload: dict[str, Any], max_tokens: int | None) -> int:
    """Return how many answers the request generates, checking what bounds their length.

    `n` answers, or `best_of` generated to return the best: each is charged and reserved.
    """
    n = int(payload.get("n") or 1)
    best_of = payload.get("best_of")
    if best_of is not None and best_of < n:
        raise InvalidRequest(f"'best_of' ({best_of}) must be at least 'n' ({n})", param="best_of")
    min_tokens = payload.get("min_tokens")
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest(
            f"'min_tokens' ({min_tokens}) is more than 'max_tokens' ({max_tokens})",
            param="min_tokens",
        )
    return max(n, int(best_of or 1))


def _header_ms(headers: dict[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    if _MS.fullmatch(raw) is None:
        raise InvalidRequest(
            f"header {name} must be a positive number of milliseconds such as 250 or 12.5, "
            f"got {shown(raw)}",
            param=name,
        )
    return float(raw)


def tenant_of(policy: Policy, headers: dict[str, str]) -> Tenant | None:
    """Return the tenant of the request's API key, or None (anonymous) when keys are optional."""
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    tenant = policy.tenant_for_key(key) if key and policy.tenants else None
    if tenant is None and policy.require_tenant_key:
        raise Unauthorized("a valid tenant API key is required (Authorization: Bearer KEY)")
    return tenant


def classify(
    endpoint: str,
    payload: Any,
    headers: dict[str, str],
    tenant: Tenant | None,
    policy: Policy,
    estimator: TokenEstimator,
) -> RequestProfile:
    """Check a parsed request body and its headers, from a tenant (`tenant_of`), and return
    its profile."""
    bodies.check(endpoint, payload)
    model = payload["model"]
    stream = bool(payload.get("stream", False))
    raw_tokens = _prompt_tokens(endpoint, payload)
    default_class = (tenant and tenant.default_slo_class) or policy.default_slo_class
    slo_name = headers.get("x-slo-class", default_class)
    if tenant is not None and tenant.slo_classes and slo_name not in tenant.slo_classes:
        raise SloNotAllowed(
            f"tenant {tenant.name!r} may not use SLO class {shown(slo_name)} "
            f"(allowed: {', '.join(tenant.slo_classes)})",
            param="x-slo-class",
        )
    slo = policy.slo_classes.get(slo_name)
    if slo is None:
        raise InvalidRequest(
            f"x-slo-class names {shown(slo_name)}, which is not a class of the policy "
            f"(classes: {', '.join(policy.slo_classes)})",
            param="x-slo-class",
        )
    ttft = _header_ms(headers, "x-slo-ttft-ms")
    tpot = _header_ms(headers, "x-slo-tpot-ms")
    if tenant is not None and not tenant.slo_overrides and (ttft is not None or tpot is not None):
        raise SloNotAllowed(
            f"tenant {tenant.name!r} may not set x-slo-ttft-ms or x-slo-tpot-ms; "
            "its class's targets apply",
            param="x-slo-ttft-ms" if ttft is not None else "x-slo-tpot-ms",
        )
    max_tokens = None if endpoint == "embeddings" else _max_tokens(payload)
    prompt_tokens = estimator.estimate(model, raw_tokens)
    spec = policy.models.get(model)
    tokenizer = estimator.tokenizer(spec.tokenizer) if spec and spec.tokenizer else None
    ids = tokenizer.prompt_ids(endpoint, payload) if tokenizer is not None else None
    if ids is not None:
        # The engine's own count and keys: exact, and as its KV-cache events name blocks.
        prompt_tokens, blocks, per_block = len(ids), token_blocks(ids), float(BLOCK_TOKENS)
    else:
        text = prefix.rendered(endpoint, payload)
        blocks, per_block = prefix.blocks(text), prefix.block_tokens(prompt_tokens, text)
    return RequestProfile(
        endpoint=endpoint,
        model=model,
        prompt_tokens=prompt_tokens,
        token_ratio=estimator.ratio(model),
        max_tokens=max_tokens,
        sequences=1 if endpoint == "embeddings" else _sequences(payload, max_tokens),
        slo_class=slo_name,
        ttft_ms=ttft if ttft is not None else slo.ttft_ms,
        tpot_ms=tpot if tpot is not None else slo.tpot_ms,
        e2e_ms=slo.e2e_ms,
        tenant=tenant.name if tenant is not None else "anonymous",
        stream=stream,
        blocks=blocks,
        block_tokens=per_block,
        session=_session(payload, headers, tenant.name if tenant is not None else "anonymous"),
    )


def _session(payload: dict[str, Any], headers: dict[str, str], tenant: str) -> str | None:
    """Return the session a request names (its `prompt_cache_key`, else a session header),
    within its tenant: two tenants' sessions of one name are two sessions."""
    key = payload.get("prompt_cache_key")
    if not key:
        key = next((headers[h] for h in SESSION_HEADERS if headers.get(h)), None)
    return f"{tenant}/{key[:MAX_KEY_CHARS]}" if key else None
