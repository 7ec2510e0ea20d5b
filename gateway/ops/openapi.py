"""The gateway's OpenAPI description: /v1 written here, merged with what FastAPI generates.

The /v1 ingress is plain ASGI, for speed, so nothing generates its description; it is written here
from what the ingress checks (gateway/routing/classify.py) and answers, and merged with FastAPI's
description of the ops and admin routes into one document, served at /openapi.json (and browsable at
/docs with GATEWAY_DOCS). It is built from the policy serving when it is asked for, so `model` lists
the models this gateway serves now and the tenant key is marked required when the policy requires
it. The tests fuzz the gateway from this document (tests/ops/test_openapi.py), so it is kept honest.

Request bodies allow fields beyond those described: vendor extensions pass to the backend
unchanged. A 4xx a backend answers is relayed as the backend wrote it; the simulator and vLLM
write OpenAI's error shape.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from gateway.policy.model import Policy


class ErrorDetail(BaseModel):
    """What went wrong: a sentence naming the bad value, and OpenAI's type, param and code."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error the gateway answers, /v1 and /admin alike."""

    error: ErrorDetail


ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ERROR_REF}}}


ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "The admin token is missing or wrong."},
    403: {"model": ErrorBody, "description": "GATEWAY_ADMIN_TOKEN is not set: the API is off."},
}
INVALID = _error("The query or body is malformed; the message names the field.")

ROUTING_HEADERS = {
    "x-gateway-route": "The policy route that matched.",
    "x-gateway-pool": "The pool that served the request.",
    "x-gateway-backend": "The backend that served the request.",
    "x-gateway-decision-id": "The id of the routing decision, also on the request record.",
    "x-gateway-energy-j": "Estimated energy of the request, in joules.",
    "x-gateway-cost-usd": "Estimated cost of the request, in US dollars.",
    "x-gateway-carbon-g": "Estimated carbon of the request's energy, in grams of CO2.",
}
SLO_HEADERS = [
    ("x-slo-class", "The SLO class to serve the request under (default: the tenant's)."),
    ("x-slo-ttft-ms", "Time-to-first-token target in milliseconds, for this request."),
    ("x-slo-tpot-ms", "Time-per-output-token target in milliseconds, for this request."),
]
V1_ERRORS = {
    "400": _error("The body or a header is malformed, or the prompt does not fit any context."),
    "401": _error("The policy requires a tenant key, and this one is missing or unknown."),
    "403": _error("No route admits the request, or the tenant may not use these SLO headers."),
    "404": _error("No pool serves the model."),
    "408": _error("The body did not arrive in time."),
    "413": _error("The body is over the size limit."),
    "429": _error("Every eligible pool is full past its queue budget."),
    "502": _error("Every backend tried failed; on a stream, an error event ends it instead."),
    "503": _error("Every eligible backend is ejected."),
    "504": _error("The backend did not answer within the SLO class's timeout."),
}

TOKENS = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
USAGE = {
    "type": "object",
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
}


def _schemas(models: list[str]) -> dict[str, Any]:
    model: dict[str, Any] = {"type": "string", "description": "A model this gateway serves."}
    if models:
        model["enum"] = models
    common = {
        "model": model,
        "max_tokens": TOKENS | {"description": "Most tokens to generate."},
        "stream": {"type": "boolean", "description": "Answer as server-sent events."},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        "user": {"type": "string"},
    }
    choice_usage = {"usage": USAGE, "id": {"type": "string"}, "model": {"type": "string"}}
    return {
        "ChatMessage": {
            "type": "object",
            "required": ["role"],
            "properties": {
                "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
                "content": {
                    "anyOf": [
                        {"type": "string"},
                        {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["type", "text"],
                                "properties": {
                                    "type": {"const": "text"},
                                    "text": {"type": "string"},
                                },
                            },
                        },
                    ]
                },
            },
        },
        "ChatCompletionRequest": {
            "type": "object",
            "required": ["model", "messages"],
            "properties": {
                **common,
                "messages": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"$ref": "#/components/schemas/ChatMessage"},
                },
                "max_completion_tokens": TOKENS,
            },
        },
        "CompletionRequest": {
            "type": "object",
            "required": ["model", "prompt"],
            "properties": {
                **common,
                "prompt": {"anyOf": [{"type": "string"}, TOKEN_IDS]},
            },
        },
        "EmbeddingRequest": {
            "type": "object",
            "required": ["model", "input"],
            "properties": {
                "model": model,
                "input": {
                    "anyOf": [
                        {"type": "string", "minLength": 1},
                        {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "minLength": 1},
                        },
                        TOKEN_IDS,
                    ]
                },
                "encoding_format": {"enum": ["float", "base64"]},
                "user": {"type": "string"},
            },
        },
        "ChatCompletion": {
            "type": "object",
            "required": ["object", "choices"],
            "properties": {
                **choice_usage,
                "object": {"const": "chat.completion"},
                "choices": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["index", "message"],
                        "properties": {
                            "index": {"type": "integer"},
                            "message": {"type": "object", "required": ["role"]},
                            "finish_reason": {"type": ["string", "null"]},
                        },
                    },
                },
            },
        },
        "Completion": {
            "type": "object",
            "required": ["object", "choices"],
            "properties": {
                **choice_usage,
                "object": {"const": "text_completion"},
                "choices": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["index", "text"],
                        "properties": {"index": {"type": "integer"}, "text": {"type": "string"}},
                    },
                },
            },
        },
        "EmbeddingList": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {
                "object": {"const": "list"},
                "model": {"type": "string"},
                "usage": USAGE,
                "data": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["index", "embedding"],
                        "properties": {
                            "index": {"type": "integer"},
                            "embedding": {
                                "anyOf": [
                                    {"type": "array", "items": {"type": "number"}},
                                    {"type": "string", "description": "base64 float32"},
                                ]
                            },
                        },
                    },
                },
            },
        },
        "ResponseRequest": {
            "type": "object",
            "required": ["model", "input"],
            "description": "OpenAI's Responses API, served through chat completions.",
            "properties": {
                "model": model,
                "instructions": {"type": "string"},
                "input": {
                    "anyOf": [
                        {"type": "string", "minLength": 1},
                        {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["role", "content"],
                                "properties": {
                                    "role": {"enum": ["system", "developer", "user", "assistant"]},
                                    "content": {"type": "string"},
                                },
                            },
                        },
                    ]
                },
                "max_output_tokens": TOKENS,
                "stream": common["stream"],
                "temperature": common["temperature"],
                "top_p": common["top_p"],
            },
        },
        "Response": {
            "type": "object",
            "required": ["id", "object", "status", "output"],
            "properties": {
                "id": {"type": "string"},
                "object": {"const": "response"},
                "status": {"enum": ["completed", "incomplete"]},
                "model": {"type": "string"},
                "output": {"type": "array", "items": {"type": "object", "required": ["type"]}},
                "usage": {"type": ["object", "null"]},
            },
        },
        "ResponseEvent": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"type": "string", "description": "The event's type."},
                "data": {
                    "type": "string",
                    "description": "The event as JSON, with its type and sequence_number: "
                    "response.created first, response.completed last.",
                },
            },
        },
        "StreamEvent": {
            "type": "object",
            "required": ["data"],
            "properties": {
                "data": {
                    "type": "string",
                    "description": "A JSON chunk of the answer; [DONE] last. A stream broken "
                    "after its first byte ends with an OpenAI error object instead of [DONE].",
                }
            },
        },
        "ModelList": {
            "type": "object",
            "required": ["object", "data"],
            "properties": {
                "object": {"const": "list"},
                "data": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["id", "object", "owned_by"],
                        "properties": {
                            "id": {"type": "string"},
                            "object": {"const": "model"},
                            "created": {"type": "integer"},
                            "owned_by": {"type": "string", "description": "Pools serving it."},
                        },
                    },
                },
            },
        },
    }


def _served(schema: str, streams: bool) -> dict[str, Any]:
    content: dict[str, Any] = {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}
    }
    if streams:
        # Before OpenAPI 3.2, a stream's schema describes each of its events.
        event = "ResponseEvent" if schema == "Response" else "StreamEvent"
        content["text/event-stream"] = {"schema": {"$ref": f"#/components/schemas/{event}"}}
    headers = {
        name: {"description": text, "schema": {"type": "string"}}
        for name, text in ROUTING_HEADERS.items()
    }
    return {
        "description": "The answer, from the pool the policy chose.",
        "headers": headers,
        "content": content,
    }


def _generation(summary: str, request: str, answer: str, streams: bool, security: Any) -> Any:
    parameters = [
        {
            "name": name,
            "in": "header",
            "required": False,
            "description": text,
            "schema": {"type": "string"},
        }
        for name, text in SLO_HEADERS
    ]
    return {
        "post": {
            "tags": ["v1"],
            "summary": summary,
            "security": security,
            "parameters": parameters,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}
                },
            },
            "responses": {"200": _served(answer, streams), **V1_ERRORS},
        }
    }


def v1_paths(policy: Policy) -> dict[str, Any]:
    """Describe the /v1 endpoints as the policy serving now exposes them."""
    tenant_key: list[dict[str, list[str]]] = [{"tenantKey": []}]
    security = tenant_key if policy.require_tenant_key else [{}, *tenant_key]
    return {
        "/v1/chat/completions": _generation(
            "Answer a conversation", "ChatCompletionRequest", "ChatCompletion", True, security
        ),
        "/v1/completions": _generation(
            "Complete a prompt", "CompletionRequest", "Completion", True, security
        ),
        "/v1/embeddings": _generation(
            "Embed texts", "EmbeddingRequest", "EmbeddingList", False, security
        ),
        "/v1/responses": _generation(
            "Answer in the Responses API", "ResponseRequest", "Response", True, security
        ),
        "/v1/models": {
            "get": {
                "tags": ["v1"],
                "summary": "List the models the live pools serve",
                "responses": {
                    "200": {
                        "description": "The models, each with the pools that serve it.",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/ModelList"}
                            }
                        },
                    }
                },
            }
        },
    }


def _openai_validation_errors(paths: dict[str, Any]) -> None:
    """Describe FastAPI's request validation as it is answered: 400 in the OpenAI shape."""
    for operations in paths.values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            generated = responses.get("422", {}).get("content", {}).get("application/json", {})
            if generated.get("schema") == {"$ref": "#/components/schemas/HTTPValidationError"}:
                del responses["422"]
            if "requestBody" in operation or operation.get("parameters"):
                responses.setdefault("400", INVALID)


def document(generated: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """Merge FastAPI's description of the ops and admin routes with /v1 under `policy`."""
    generated = copy.deepcopy(generated)  # FastAPI keeps and serves its own copy again
    doc = {**generated, "paths": {**v1_paths(policy), **generated["paths"]}}
    _openai_validation_errors(doc["paths"])
    for path, operations in generated["paths"].items():
        if path.startswith("/admin"):
            for operation in operations.values():
                operation["security"] = [{"adminToken": []}]
    components = doc.setdefault("components", {})
    schemas = {**_schemas(policy.served_models()), **components.get("schemas", {})}
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    components["schemas"] = schemas
    components["securitySchemes"] = {
        "tenantKey": {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
        "adminToken": {"type": "http", "scheme": "bearer", "description": "GATEWAY_ADMIN_TOKEN"},
    }
    return doc
