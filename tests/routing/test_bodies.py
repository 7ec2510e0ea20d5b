"""What /v1 takes of a body: checked as described, refused with the field and the value named."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRequest
from gateway.routing import bodies
from policies import MODEL

HELLO = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> dict[str, object]:
    return {"model": MODEL, "messages": HELLO, **fields}


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        (chat(max_tokens="64"), "max_tokens", "valid integer, got '64'"),
        (chat(max_tokens=True), "max_tokens", "valid integer"),
        (chat(max_tokens=64.5), "max_tokens", "valid integer"),
        (chat(max_tokens=2**31), "max_tokens", "2147483647"),
        (chat(messages=[{"role": "robot"}]), "messages[0].role", "got 'robot'"),
        (chat(messages=[{"role": "user", "content": [{"type": "text", "text": {}}]}]),
         "messages[0].content[0].text", "valid string"),
        (chat(n=0), "n", "greater than or equal to 1"),
        ({"messages": HELLO}, "model", "'model' is required"),
    ],
)  # fmt: skip
def test_a_body_it_refuses_names_the_field_and_the_value(body: object, param: str, said: str):
    with pytest.raises(InvalidRequest) as refused:
        bodies.check("chat", body)
    assert refused.value.param == param
    assert said in refused.value.message


def test_a_whole_number_written_with_a_fraction_is_the_integer_it_is() -> None:
    bodies.check("chat", chat(max_tokens=64.0, n=1.0))
    bodies.check("completions", {"model": MODEL, "prompt": [1.0, 2]})


def test_what_a_field_says_explains_its_refusal() -> None:
    with pytest.raises(InvalidRequest) as refused:
        bodies.check("responses", {"model": MODEL, "input": "hi", "previous_response_id": "r"})
    assert "keeps no responses" in refused.value.message
    for stream in (True, 0, "no"):
        with pytest.raises(InvalidRequest) as refused:
            bodies.check("embeddings", {"model": MODEL, "input": "x", "stream": stream})
        assert refused.value.param == "stream"
    bodies.check("embeddings", {"model": MODEL, "input": "x", "stream": False})


def test_a_body_that_is_no_object_is_said_to_be_none() -> None:
    for body in ([1], None, "chat"):
        with pytest.raises(InvalidRequest, match="must be a JSON object"):
            bodies.check("chat", body)
