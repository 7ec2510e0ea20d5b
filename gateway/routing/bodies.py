"""What /v1 accepts of a request body: one typed description per endpoint, checked and published.

The ingress checks every body by these (`check`) before it classifies, translates or routes it,
and /openapi.json describes each endpoint's body by their JSON Schema (`json_schemas`), so the
description and the check are one thing (tests/ops/test_openapi.py fuzzes the live gateway
from the description with every check schemathesis has).

They name what the gateway itself reads, typed strictly (`"1"` is no integer, `1.0` is),
and nothing more: every other field (OpenAI's sampling parameters, tools, vendor extensions)
passes to the backend unread, and the backend's refusal is relayed as it wrote it. What a
schema cannot say is checked where it is known: that a prompt and what it asks to generate fit
a context (routing), that `best_of` is at least `n` and `min_tokens` at most `max_tokens`
(classify), and which models the policy serves now (the description lists them).

They are TypedDicts: a body is checked in place, its value never copied into objects, which
costs the request path about half what models would.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, Literal, NotRequired

from annotated_types import Ge, Le
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails, PydanticCustomError
from typing_extensions import TypedDict

from gateway.errors import InvalidRequest, shown

MAX_MODEL_CHARS = 128  # the width of the records' model column
MAX_SEQUENCES = 128  # answers one request may ask for (n, best_of)
MAX_TOKENS = 2**31 - 1  # any count of tokens: what every database and engine holds exactly

# Unknown fields are the backend's: passed on, never read here.
_OPEN = ConfigDict(extra="ignore", strict=True)


def _integral(value: Any) -> Any:
    """Read a JSON number with no fraction (`64.0`) as the integer it is, as JSON Schema does."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Last in an integer's annotations, after its bounds, so that its JSON Schema keeps them.
INTEGRAL = BeforeValidator(_integral)


def _boolean(value: Any) -> Any:
    """Refuse what is no JSON boolean, which a literal `false` would take (0 == False)."""
    if not isinstance(value, bool):
        raise PydanticCustomError("bool_type", "Input should be a valid boolean")
    return value


Tokens = Annotated[int, Ge(1), Le(MAX_TOKENS), INTEGRAL]
TokenId = Annotated[int, Ge(0), Le(MAX_TOKENS), INTEGRAL]
Sequences = Annotated[int, Ge(1), Le(MAX_SEQUENCES), INTEGRAL]
Model = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_MODEL_CHARS,
        description="A model this gateway serves (404 for another).",
    ),
]
PromptCacheKey = Annotated[
    str | None,
    Field(
        description="Names the conversation or agent run: its requests go back to the backend "
        "that holds its prompt cache (docs/routing.md, Routing on the prefix cache). Wins over "
        "a session header."
    ),
]


class _Body(TypedDict):
    """A JSON object of a body: its fields typed strictly; fields it does not name pass."""

    __pydantic_config__ = _OPEN  # type: ignore[misc]


class ContentPart(_Body):
    """A part of a message's content: text, or a part of another kind (an image, audio)."""

    type: str
    text: NotRequired[str | None]


class ChatMessage(_Body):
    """One message of a conversation."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: NotRequired[str | list[ContentPart] | None]


class Generation(_Body):
    """What chat and text completions share."""

    model: Model
    stream: NotRequired[bool]
    max_tokens: NotRequired[Annotated[Tokens | None, Field(description="Most tokens to generate.")]]
    n: NotRequired[Annotated[Sequences | None, Field(description="Answers to generate.")]]
    min_tokens: NotRequired[
        Annotated[
            Annotated[int, Ge(0), Le(MAX_TOKENS), INTEGRAL] | None,
            Field(description="Fewest tokens to generate; at most max_tokens."),
        ]
    ]
    ignore_eos: NotRequired[bool | None]
    prompt_cache_key: NotRequired[PromptCacheKey]


class ChatCompletionRequest(Generation):
    """A conversation to answer."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: NotRequired[
        Annotated[Tokens | None, Field(description="Most tokens to generate, before max_tokens.")]
    ]


class CompletionRequest(Generation):
    """A prompt to complete: text or token ids, or several of either."""

    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    best_of: NotRequired[
        Annotated[
            Sequences | None,
            Field(description="Answers to generate, the best of them returned; at least n."),
        ]
    ]


class EmbeddingRequest(_Body):
    """Texts or token ids to embed."""

    model: Model
    input: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    encoding_format: NotRequired[Literal["float", "base64"] | None]
    stream: NotRequired[
        Annotated[
            Literal[False], Field(description="Embeddings never stream."), BeforeValidator(_boolean)
        ]
    ]
    prompt_cache_key: NotRequired[PromptCacheKey]


def _part_type(part: Any) -> str | None:
    """Return which kind of part a Responses API message part is: text or an image."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    return "text" if kind in ("input_text", "output_text") else "image" if kind else None


class InputText(_Body):
    """Text in a Responses API message."""

    type: Literal["input_text", "output_text"]
    text: str


class InputImage(_Body):
    """An image in a Responses API message, by URL."""

    type: Literal["input_image"]
    image_url: str


InputPart = Annotated[
    Annotated[InputText, Tag("text")] | Annotated[InputImage, Tag("image")],
    Discriminator(
        _part_type,
        custom_error_type="input_part",
        custom_error_message="the gateway translates input_text, output_text and input_image parts",
    ),
]


class InputMessage(_Body):
    """A message of the Responses API's input."""

    type: NotRequired[Literal["message"]]
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[InputPart]


class FunctionCall(_Body):
    """A call of a function tool the model made earlier in the conversation."""

    type: Literal["function_call"]
    call_id: NotRequired[str]
    name: str
    arguments: NotRequired[str]


class FunctionCallOutput(_Body):
    """What a function call returned."""

    type: Literal["function_call_output"]
    call_id: NotRequired[str]
    output: Any


def _item_type(item: Any) -> str | None:
    """Return an input item's type; a message may leave it out."""
    return item.get("type", "message") if isinstance(item, Mapping) else None


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCall, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")],
    Discriminator(
        _item_type,
        custom_error_type="input_item",
        custom_error_message="an input item is a message, function_call or function_call_output",
    ),
]


class FunctionTool(_Body):
    """A function the model may call."""

    type: Annotated[
        Literal["function"],
        Field(
            description="Function tools only: built-in tools (web search, file search, computer "
            "use) need OpenAI's servers."
        ),
    ]
    name: Annotated[str, Field(min_length=1)]
    description: NotRequired[str]
    parameters: NotRequired[dict[str, Any]]
    strict: NotRequired[bool | None]


class TextFormat(_Body):
    """The form of the answer's text: plain, a JSON object, or JSON that a schema describes."""

    type: Literal["text", "json_object", "json_schema"]
    name: NotRequired[str]
    schema: NotRequired[dict[str, Any]]
    strict: NotRequired[bool | None]


class TextOptions(_Body):
    """Options of the answer's text."""

    format: NotRequired[TextFormat]


class ResponseRequest(_Body):
    """OpenAI's Responses API, served through chat completions."""

    model: Model
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: NotRequired[str | None]
    max_output_tokens: NotRequired[
        Annotated[Tokens | None, Field(description="Most tokens to generate.")]
    ]
    stream: NotRequired[bool]
    tools: NotRequired[list[FunctionTool]]
    text: NotRequired[TextOptions]
    previous_response_id: NotRequired[
        Annotated[
            None,
            Field(description="The gateway keeps no responses: send the conversation in `input`."),
        ]
    ]
    prompt_cache_key: NotRequired[PromptCacheKey]


# Each endpoint's body, by the name the ingress and classify give the endpoint.
BODIES: dict[str, type[Any]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
    "embeddings": EmbeddingRequest,
    "responses": ResponseRequest,
}
_ADAPTERS = {endpoint: TypeAdapter(body) for endpoint, body in BODIES.items()}
# Their validators alone, called without TypeAdapter's wrapping on the request path.
_CHECKS = {endpoint: adapter.validator for endpoint, adapter in _ADAPTERS.items()}


@cache
def json_schemas(
    ref_template: str = "#/$defs/{model}",
) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Return the name of each endpoint's body schema, and every schema by name (the bodies'
    and those they refer to, at `ref_template`)."""
    by_key, shared = TypeAdapter.json_schemas(
        [(endpoint, "validation", adapter) for endpoint, adapter in _ADAPTERS.items()],
        ref_template=ref_template,
    )
    names = {
        endpoint: str(by_key[(endpoint, "validation")]["$ref"]).rsplit("/", 1)[1]
        for endpoint in BODIES
    }
    return names, dict(shared["$defs"])


def check(endpoint: str, payload: Any) -> None:
    """Raise InvalidRequest naming what in a parsed body its endpoint does not take."""
    try:
        _CHECKS[endpoint].validate_python(payload)
    except ValidationError as exc:
        raise _invalid(endpoint, exc.errors()) from None


def _invalid(endpoint: str, errors: list[ErrorDetails]) -> InvalidRequest:
    """Return the 400 of a body that failed its check: where, what was expected, what came."""
    # Of a union's failures, the one that reached deepest says the most, and a bound broken
    # more than a type mismatched.
    error = max(errors, key=lambda e: (len(_fields(e["loc"])), not e["type"].endswith("_type")))
    where = _fields(error["loc"])
    if not where:
        return InvalidRequest("the request body must be a JSON object")
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where).lstrip(".")
    if error["type"] == "missing":
        text = f"'{param}' is required"
    else:
        message = error["msg"][0].lower() + error["msg"][1:]
        text = f"'{param}' is not valid: {message}, got {shown(error['input'])}"
    # A value refused (not mistyped, not missing): what the field says may explain why.
    refused = error["type"] != "missing" and not error["type"].endswith("_type")
    described = _described(endpoint, where) if refused else None
    return InvalidRequest(f"{text} ({described})" if described else text, param=param)


def _fields(loc: tuple[int | str, ...]) -> list[int | str]:
    """Return the fields and indexes of an error's location, without a union's branch names."""
    return [part for part in loc if isinstance(part, int) or part in _FIELD_NAMES]


def _described(endpoint: str, where: list[int | str]) -> str | None:
    """Return the description the schema gives the field at `where` in an endpoint's body."""
    names, schemas = json_schemas()
    found: list[dict[str, Any]] = [schemas[names[endpoint]]]
    for part in where:
        key = "items" if isinstance(part, int) else "properties"
        inner = []
        for schema in found:
            for alternative in _alternatives(schema, schemas):
                child = alternative.get(key)
                if isinstance(part, str):
                    child = (child or {}).get(part)
                if isinstance(child, dict):
                    inner.append(child)
        found = inner
    descriptions = [s["description"] for s in found if isinstance(s.get("description"), str)]
    return descriptions[0] if descriptions else None


def _alternatives(schema: dict[str, Any], schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """Return a schema with its references followed and its alternatives (anyOf, oneOf) apart."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _alternatives(schemas[ref.rsplit("/", 1)[1]], schemas)
    branches = [*schema.get("anyOf", []), *schema.get("oneOf", [])]
    return [schema] + [a for b in branches for a in _alternatives(b, schemas)]


# Every field any body has, to tell them apart from a union's branch names in an error.
_FIELD_NAMES = frozenset(
    name for schema in json_schemas()[1].values() for name in schema.get("properties", {})
)
