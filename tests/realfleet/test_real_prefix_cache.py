"""Cache-aware routing on real engines: llama.cpp keeps each conversation's prompt, and the
gateway sends the conversation's next turn to the engine that keeps it.

Four multi-turn conversations through a gateway whose chat route serves the GPU pool alone
(gpu-0 and gpu-1, f16), no session named: the gateway's prefix index alone decides.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import openai
import pytest

from bench.real_fleet_cache import Conversation, conversations, gpu_policy
from gateway.policy.load import parse_policy
from harness.gateways import GatewayServer, run_gateway
from realfleet import corpus, fleet


@pytest.fixture(scope="module")
def gpu_gateway(
    real_fleet: fleet.RealFleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    policy = parse_policy(gpu_policy(real_fleet), "policies/real.yaml")
    with run_gateway(policy, tmp_path_factory.mktemp("gpu-gateway")) as server:
        yield server


@dataclass(frozen=True, slots=True)
class Answered:
    """One turn as the client saw it: who served it, and the answer's usage."""

    backend: str
    decision: str
    prompt_tokens: int
    cached_tokens: int


class Chat:
    """A conversation being had: its messages so far and its answered turns."""

    def __init__(self, conversation: Conversation, stream: bool):
        self.messages = [{"role": "system", "content": conversation.system}]
        self.questions = list(conversation.questions)
        self.stream = stream
        self.answered: list[Answered] = []

    def ask(self, server: GatewayServer) -> None:
        """Ask the next question with every turn before it, as a chat client does."""
        self.messages.append({"role": "user", "content": self.questions.pop(0)})
        raw = server.client().chat.completions.with_raw_response.create(
            model=corpus.MODEL,
            messages=self.messages,
            max_tokens=24,
            temperature=0,
            stream=self.stream,
            stream_options={"include_usage": True} if self.stream else openai.omit,
        )
        if self.stream:
            chunks = list(raw.parse())
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            (usage,) = [c.usage for c in chunks if c.usage is not None]
        else:
            answer = raw.parse()
            text, usage = answer.choices[0].message.content or "", answer.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        self.messages.append({"role": "assistant", "content": text})
        self.answered.append(
            Answered(
                raw.headers["x-gateway-backend"],
                raw.headers["x-gateway-decision-id"],
                usage.prompt_tokens,
                usage.prompt_tokens_details.cached_tokens or 0,
            )
        )


def test_later_turns_go_to_the_engine_that_caches_their_conversation(
    gpu_gateway: GatewayServer,
) -> None:
    # Two conversations stream, two take whole answers: llama.cpp reports its cached tokens in
    # both.
    streams = [True, False, True, False]
    chats = [Chat(c, s) for c, s in zip(conversations(4, 5, seed=1), streams, strict=True)]
    together = threading.Barrier(len(chats))

    def begin(chat: Chat) -> None:
        together.wait()
        chat.ask(gpu_gateway)

    # The first turns arrive together, so the gateway spreads them over both engines by load.
    with ThreadPoolExecutor(len(chats)) as users:
        list(users.map(begin, chats))
    assert {chat.answered[0].backend for chat in chats} == {"gpu-0", "gpu-1"}
    # The later turns come one at a time, the engines idle: a gateway blind to the cache would
    # send each to the first engine, as it breaks a tie.
    for _ in range(4):
        for chat in chats:
            chat.ask(gpu_gateway)

    # Each conversation stays on the engine of its first turn, and the engine finds all but the
    # latest turn in its prompt cache (a system prompt of about 900 tokens, turns of a few
    # dozen); a first turn has only the chat template's opening in common with others.
    placed = [[t.backend for t in chat.answered] for chat in chats]
    assert all(len(set(backends)) == 1 for backends in placed), placed
    later = [t for chat in chats for t in chat.answered[1:]]
    shares = [round(t.cached_tokens / t.prompt_tokens, 3) for t in later]
    assert all(share > 0.9 for share in shares), shares
    assert all(chat.answered[0].cached_tokens < 20 for chat in chats)

    # The gateway read what the engine reported into its records.
    every = [t for chat in chats for t in chat.answered]
    rows = {r["decision_id"]: r for r in gpu_gateway.records(len(every))}
    assert [rows[t.decision]["cached_tokens"] for t in every] == [t.cached_tokens for t in every]
