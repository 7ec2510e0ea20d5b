"""OpenAI request bodies, checked the way real servers check them and reduced to what we need.

Every problem becomes an `ApiError` naming the bad field, so the client gets OpenAI's
error shape with the right status: 404 for a model not served here, 400 for everything
else (including a prompt longer than the device's context).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from simulator.answers import Question
from simulator.errors import InvalidRequest, ModelNotFound
from simulator.prefix_cache import prompt_blocks
from simulator.profile import ModelSpec, PrefixCacheFigures, Profile
from simulator.tokenizer import count_tokens, split_tokens, token_id

# Chat templates wrap every message in a few tokens and prime the reply with a few more
# (OpenAI documents 3 and 3 for its chat models; Llama 3's header is 3 tokens around the role).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3
# OpenAI's default for the legacy completions endpoint.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True)
class GenerationRequest:
    """A chat or text completion request, validated."""

    endpoint: Literal["chat", "completions"]
    model: ModelSpec
    prompt_tokens: int
    question: Question
    stream: bool
    include_usage: bool
    # The prompt's prefix blocks in the device's prefix cache (none when it has no cache), and
    # its token ids, which the cache's events name (simulator/kv_events.py).
    blocks: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class EmbeddingRequest:
    """An embeddings request, validated."""

    model: ModelSpec
    inputs: tuple[str, ...]
    prompt_tokens: int
    encoding_format: Literal["float", "base64"]


def parse_chat(body: Any, profile: Profile) -> GenerationRequest:
    """Validate a `/v1/chat/completions` body against what this device serves."""
    body = _object(body)
    model = _model(body, profile, kind="chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    prompt_tokens = TOKENS_PER_REPLY + sum(
        _message_tokens(message, index) for index, message in enumerate(messages)
    )
    if tools:
        prompt_tokens += count_tokens(orjson.dumps(tools).decode())
    prompt_key = orjson.dumps({"messages": messages, "tools": tools}, option=orjson.OPT_SORT_KEYS)
    max_tokens = _max_tokens(body, default=None)
    limit = _limit(model, profile, prompt_tokens, max_tokens, param="messages")
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format, Mapping):
        raise InvalidRequest("'response_format' must be an object", param="response_format")
    return GenerationRequest(
        endpoint="chat",
        model=model,
        prompt_tokens=prompt_tokens,
        question=_question(
            body,
            model,
            prompt_key.decode(),
            limit,
            response_format=response_format,
            tools=tools,
            tool_choice=tool_choice,
            top_logprobs=_chat_logprobs(body),
        ),
        stream=_stream(body),
        include_usage=_include_usage(body),
        **_cached(chat_tokens(messages, tools), profile.prefix_cache),
    )


def parse_completion(body: Any, profile: Profile) -> GenerationRequest:
    """Validate a `/v1/completions` body against what this device serves."""
    body = _object(body)
    model = _model(body, profile, kind="chat")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt_key, prompt_tokens = prompt, count_tokens(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompt_key, prompt_tokens = " ".join(map(str, prompt)), len(prompt)
    else:
        raise InvalidRequest(
            "'prompt' must be a string, an array of token ids, or an array holding one of"
            " those (batched prompts are not supported)",
            param="prompt",
        )
    max_tokens = _max_tokens(body, default=COMPLETIONS_DEFAULT_MAX_TOKENS)
    limit = _limit(model, profile, prompt_tokens, max_tokens, param="prompt")
    return GenerationRequest(
        endpoint="completions",
        model=model,
        prompt_tokens=prompt_tokens,
        question=_question(body, model, prompt_key, limit, top_logprobs=_completion_logprobs(body)),
        stream=_stream(body),
        include_usage=_include_usage(body),
        **_cached(completion_tokens(prompt), profile.prefix_cache),
    )


def parse_embedding(body: Any, profile: Profile) -> EmbeddingRequest:
    """Validate a `/v1/embeddings` body against what this device serves."""
    body = _object(body)
    model = _model(body, profile, kind="embedding")
    raw = body.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'input' must be a string or a non-empty array", param="input")
    inputs: list[str] = []
    counts: list[int] = []
    for item in raw:
        if isinstance(item, str) and item:
            inputs.append(item)
            counts.append(count_tokens(item))
        elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
            inputs.append(" ".join(map(str, item)))
            counts.append(len(item))
        else:
            raise InvalidRequest(
                "each 'input' must be a non-empty string or array of token ids", param="input"
            )
    context = _context(model, profile)
    longest = max(counts)
    if longest > context:
        raise InvalidRequest(
            f"This model's maximum context length is {context} tokens, however you requested"
            f" {longest} tokens in the input. Please reduce the length of the input.",
            param="input",
            code="context_length_exceeded",
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != model.dimensions:
        raise InvalidRequest(
            f"model `{model.name}` produces {model.dimensions}-dimensional embeddings and cannot"
            f" change it (asked for dimensions={dimensions!r})",
            param="dimensions",
        )
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise InvalidRequest(
            f"'encoding_format' must be 'float' or 'base64', not {encoding!r}",
            param="encoding_format",
        )
    return EmbeddingRequest(
        model=model,
        inputs=tuple(inputs),
        prompt_tokens=sum(counts),
        encoding_format="base64" if encoding == "base64" else "float",
    )


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def _model(body: Mapping[str, Any], profile: Profile, *, kind: str) -> ModelSpec:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("'model' must be a non-empty string", param="model")
    model = profile.model(name)
    if model is None:
        raise ModelNotFound(name)
    if model.kind != kind:
        endpoint = "embeddings" if model.kind == "chat" else "completions"
        raise InvalidRequest(
            f"model `{name}` is a {model.kind} model and does not support {endpoint}",
            param="model",
            code="model_not_supported",
        )
    return model


def _context(model: ModelSpec, profile: Profile) -> int:
    if model.max_context is None:
        return profile.max_context
    return min(model.max_context, profile.max_context)


def _limit(
    model: ModelSpec, profile: Profile, prompt_tokens: int, max_tokens: int | None, *, param: str
) -> int:
    """Return the most tokens the answer may have, or refuse a prompt that does not fit."""
    context = _context(model, profile)
    requested = prompt_tokens + (max_tokens or 0)
    if requested > context or prompt_tokens >= context:
        where = "messages" if param == "messages" else "prompt"
        detail = (
            f" ({prompt_tokens} in the {where}, {max_tokens} in the completion)"
            if max_tokens
            else f" in the {where}"
        )
        raise InvalidRequest(
            f"This model's maximum context length is {context} tokens. However, you requested"
            f" {requested if max_tokens else prompt_tokens} tokens{detail}. Please reduce the"
            f" length of the {where} or completion.",
            param=param,
            code="context_length_exceeded",
        )
    return max_tokens if max_tokens is not None else context - prompt_tokens


def _max_tokens(body: Mapping[str, Any], *, default: int | None) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequest(f"'{name}' must be an integer >= 1, not {value!r}", param=name)
        return value
    return default


def _question(
    body: Mapping[str, Any],
    model: ModelSpec,
    prompt_key: str,
    limit: int,
    **structure: Any,
) -> Question:
    temperature = body.get("temperature")
    if temperature is None:
        temperature = 1.0  # OpenAI's default: unset means sampled, not greedy
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise InvalidRequest(
            f"'temperature' must be a number, not {temperature!r}", param="temperature"
        )
    if not 0 <= temperature <= 2:
        raise InvalidRequest(
            f"'temperature' must be between 0 and 2, not {temperature}", param="temperature"
        )
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidRequest(f"'seed' must be an integer, not {seed!r}", param="seed")
    n = body.get("n")
    if n not in (None, 1):
        raise InvalidRequest(f"only n=1 is supported, not n={n!r}", param="n")
    min_tokens = body.get("min_tokens") or 0
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise InvalidRequest(
            f"'min_tokens' must be an integer >= 0, not {min_tokens!r}", param="min_tokens"
        )
    return Question(
        model=model.name,
        prompt_key=prompt_key,
        limit=limit,
        min_tokens=min_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        temperature=float(temperature),
        seed=seed,
        **structure,
    )


def _chat_logprobs(body: Mapping[str, Any]) -> int | None:
    """Return how many alternatives each token lists, or None when no logprobs are asked."""
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise InvalidRequest(f"'logprobs' must be a boolean, not {wanted!r}", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(
                f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}, not {top!r}",
                param="top_logprobs",
            )
        if not wanted:
            raise InvalidRequest(
                "'top_logprobs' needs 'logprobs' set to true", param="top_logprobs"
            )
    return (top or 0) if wanted else None


def _completion_logprobs(body: Mapping[str, Any]) -> int | None:
    wanted = body.get("logprobs")
    if wanted is None:
        return None
    if isinstance(wanted, bool) or not isinstance(wanted, int) or not 0 <= wanted <= 5:
        raise InvalidRequest(
            f"'logprobs' must be an integer from 0 to 5, not {wanted!r}", param="logprobs"
        )
    return wanted


def _stream(body: Mapping[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"'stream' must be a boolean, not {stream!r}", param="stream")
    return stream


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and bool(options.get("include_usage"))


def _message_tokens(message: Any, index: int) -> int:
    if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
        raise InvalidRequest(
            f"messages[{index}] must be an object with a 'role' among {', '.join(sorted(_ROLES))}",
            param=f"messages.[{index}]",
        )
    return TOKENS_PER_MESSAGE + sum(map(count_tokens, _message_texts(message, index)))


def _message_texts(message: Mapping[str, Any], index: int) -> list[str]:
    """Return the texts of a message that its tokens count: content, name, tool calls."""
    texts = [_content_text(message.get("content"), index)]
    if isinstance(message.get("name"), str):
        texts.append(message["name"])
    for call in message.get("tool_calls") or ():
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        texts += [str(function.get("name", "")), str(function.get("arguments", ""))]
    return texts


def chat_tokens(messages: list[Any], tools: list[Mapping[str, Any]] | None) -> list[str]:
    """Return a chat prompt's tokens in the order a chat template renders them: the tools in
    the system turn, then each message after its header."""
    tokens = split_tokens(orjson.dumps(tools).decode()) if tools else []
    for index, message in enumerate(messages):
        tokens += ("<|start_header_id|>", message["role"], "<|end_header_id|>")
        for text in _message_texts(message, index):
            tokens += split_tokens(text)
    return tokens


def completion_tokens(prompt: str | list[int]) -> list[str]:
    """Return a text or token-id prompt's tokens."""
    return split_tokens(prompt) if isinstance(prompt, str) else [str(t) for t in prompt]


def prompt_ids(tokens: list[str]) -> tuple[int, ...]:
    """Return the ids of a prompt's tokens (a token-id prompt's own ids)."""
    return tuple(int(t) if t.isascii() and t.isdigit() else token_id(t) for t in tokens)


def _cached(tokens: list[str], cache: PrefixCacheFigures) -> dict[str, tuple[int, ...]]:
    """Return a prompt's prefix blocks and token ids, or nothing where the device caches none."""
    if not cache.enabled:
        return {}
    return {"blocks": prompt_blocks(tokens, cache.block_tokens), "token_ids": prompt_ids(tokens)}


def _content_text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    raise InvalidRequest(
        f"messages[{index}].content must be a string or an array of parts",
        param=f"messages.[{index}].content",
    )


def _tools(tools: Any) -> list[Mapping[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidRequest(
                f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                param=f"tools.[{index}]",
            )
    return tools or None


def _tool_choice(choice: Any, tools: Sequence[Mapping[str, Any]] | None) -> Any:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    name = None
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        name = choice["function"].get("name")
    names = [tool["function"]["name"] for tool in tools or ()]
    if name not in names:
        raise InvalidRequest(
            f"'tool_choice' names function {name!r}, which is not among the tools"
            f" ({', '.join(names) or 'none given'})",
            param="tool_choice",
        )
    return choice


class EngineTokenizer:
    """The simulator's rendering and tokenizer as a plug-in of the gateway's (entry point group
    `shadow_gateway.tokenizers`, name `simulator`): a prompt's token ids as a device caches and
    publishes them, so the gateway keys the prompt's prefix blocks as the events name them."""

    def prompt_ids(self, endpoint: str, payload: dict[str, Any]) -> tuple[int, ...] | None:
        """Return the prompt's token ids, or None where the simulator would cache none."""
        try:
            if endpoint == "chat":
                messages = payload["messages"]
                return prompt_ids(chat_tokens(messages, _tools(payload.get("tools"))))
            if endpoint == "completions":
                prompt = payload["prompt"]
                if isinstance(prompt, list) and len(prompt) == 1:
                    prompt = prompt[0]
                if isinstance(prompt, str) or (
                    isinstance(prompt, list) and all(type(t) is int for t in prompt)
                ):
                    return prompt_ids(completion_tokens(prompt))
        except (InvalidRequest, KeyError, TypeError, AttributeError):
            pass  # a request the simulator would refuse caches nothing
        return None
