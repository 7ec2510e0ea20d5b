"""The gateway in front of real engines: llama.cpp serving the project's model and MiniLM.

Chat, streams, completions and embeddings through the gateway with the official client; the
engines' own load series read on the metering scrape; a prompt the ASIC's engine cannot hold
retried on the GPU before the first byte; energy from the power exporter in the records.
"""

from __future__ import annotations

import math
import random

import httpx
from waiting import wait_for

from gateway.promotion.precision.labels import states
from harness.gateways import GatewayServer
from realfleet import corpus, fleet

ADMIN = {"authorization": "Bearer admin-token"}


def test_chat_answers_a_labelled_question_through_the_gateway(real_gateway: GatewayServer) -> None:
    country = corpus.countries()[0]
    raw = real_gateway.client().chat.completions.with_raw_response.create(
        model=corpus.MODEL,
        messages=[{"role": "user", "content": corpus.capital(country).question}],
        max_tokens=24,
        temperature=0,
    )
    answer = raw.parse()
    assert raw.headers["x-gateway-pool"] in ("asic", "gpu")
    assert states(answer.choices[0].message.content or "", country.capital)
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert answer.choices[0].finish_reason == "stop"


def test_a_stream_is_relayed_chunk_by_chunk(real_gateway: GatewayServer) -> None:
    prompt = corpus.story(random.Random(1))
    stream = real_gateway.client().chat.completions.create(
        model=corpus.MODEL,
        messages=[{"role": "user", "content": prompt.question}],
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3
    assert text.startswith("Once there was a") and usage and usage[-1].completion_tokens > 3


def test_completions_continue_a_prompt(real_gateway: GatewayServer) -> None:
    country = corpus.countries()[1]
    prompt = f"{corpus.START}user\n{corpus.capital(country).question}{corpus.END}\n"
    prompt += f"{corpus.START}assistant\n"
    answer = real_gateway.client().completions.create(
        model=corpus.MODEL, prompt=prompt, max_tokens=24, temperature=0
    )
    assert states(answer.choices[0].text, country.capital)


def test_embeddings_come_from_the_real_embedding_model(real_gateway: GatewayServer) -> None:
    raw = real_gateway.client().embeddings.with_raw_response.create(
        model=fleet.EMBEDDING_MODEL,
        input=["The cat sat on the mat.", "A cat was sitting on a rug.", "Stock prices fell."],
    )
    vectors = [e.embedding for e in raw.parse().data]
    assert raw.headers["x-gateway-pool"] == "embed"
    assert [len(v) for v in vectors] == [384, 384, 384]

    def cosine(a: list[float], b: list[float]) -> float:
        dot = sum(x * y for x, y in zip(a, b, strict=True))
        return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.2


def test_a_prompt_past_the_asic_slot_is_retried_on_the_gpu(
    asic_first_gateway: GatewayServer,
) -> None:
    # Digits are one token each for this model, about four characters each for the gateway's
    # estimate: 1,500 digits look like some 400 tokens (within the ASIC's 512 a slot), and the
    # ASIC's engine refuses them; the GPU's 2,048-token slots hold them.
    digits = "".join(str(i % 10) for i in range(1500))
    raw = asic_first_gateway.client().chat.completions.with_raw_response.create(
        model=corpus.MODEL,
        messages=[{"role": "user", "content": f"What is {digits} plus 1?"}],
        max_tokens=8,
        temperature=0,
    )
    assert raw.headers["x-gateway-pool"] == "gpu"
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens > 1500
    decision = raw.headers["x-gateway-decision-id"]

    def record() -> list[dict]:
        return [r for r in asic_first_gateway.records(1) if r["decision_id"] == decision]

    # Tried on the ASIC first (its estimate fitted), refused there, served by the GPU.
    (row,) = wait_for(record, message="no record of the retried request")
    assert (row["attempts"], row["fallback"], row["pool"]) == (2, True, "gpu")


def test_power_is_read_from_the_exporter_and_split_among_requests(
    real_gateway: GatewayServer,
) -> None:
    client = real_gateway.client()
    served = set()
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=corpus.MODEL,
            messages=[{"role": "user", "content": "What day comes after Monday?"}],
            max_tokens=12,
        )
        served.add(raw.headers["x-gateway-pool"])
    with httpx.Client(base_url=real_gateway.url, headers=ADMIN, timeout=30) as http:

        def unmetered() -> list[str]:
            pools = http.get("/admin/fleet").json()
            return [b["name"] for p in pools for b in p["backends"] if b["power_w"] is None]

        # Every engine's draw comes from the exporter, not from the nominal estimate.
        wait_for(lambda: not unmetered(), message=lambda: f"no measured power: {unmetered()}")

    def measured() -> list[dict]:
        rows = real_gateway.records(1)
        return [r for r in rows if r["pool"] in served and r["energy_estimated"] is False]

    # A request's energy is the exporter's counter, split among the requests that ran together.
    wait_for(lambda: any(r["energy_j"] > 0 for r in measured()), message=measured)
