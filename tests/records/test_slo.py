"""SLO attainment: one request against the targets its endpoint is held to."""

from __future__ import annotations

from functools import partial

from gateway.policy.definition import SloClass
from gateway.records.slo import Budget, budget, judged_on, meets_slo, record_meets_slo

INTERACTIVE = SloClass(ttft_ms=500, tpot_ms=50)
BATCH = SloClass(e2e_ms=60_000)
BOTH = SloClass(ttft_ms=500, tpot_ms=50, e2e_ms=2_000)

streamed = partial(meets_slo, endpoint="chat", stream=True, completion_tokens=20)
whole = partial(meets_slo, endpoint="chat", stream=False, ttft_ms=None, tpot_ms=None)
embedding = partial(
    meets_slo,
    endpoint="embeddings",
    stream=False,
    ttft_ms=None,
    tpot_ms=None,
    completion_tokens=None,
)


def test_a_stream_within_every_target_meets_its_slo() -> None:
    assert streamed(INTERACTIVE, 200, ttft_ms=120, tpot_ms=20, e2e_ms=900)
    assert streamed(INTERACTIVE, 200, ttft_ms=500, tpot_ms=50, e2e_ms=900)  # at the target


def test_a_stream_missing_any_one_target_misses() -> None:
    assert not streamed(INTERACTIVE, 200, ttft_ms=501, tpot_ms=20, e2e_ms=900)
    assert not streamed(INTERACTIVE, 200, ttft_ms=120, tpot_ms=51, e2e_ms=900)
    assert not streamed(BATCH, 200, ttft_ms=None, tpot_ms=None, e2e_ms=60_001)
    assert not streamed(BOTH, 200, ttft_ms=100, tpot_ms=20, e2e_ms=2_001)


def test_a_failed_request_misses_whatever_its_timings() -> None:
    assert not streamed(INTERACTIVE, 502, ttft_ms=1, tpot_ms=1, e2e_ms=1)
    assert not streamed(None, 429, ttft_ms=None, tpot_ms=None, e2e_ms=None)
    assert not embedding(INTERACTIVE, 503, e2e_ms=1)


def test_a_target_without_a_measure_does_not_count_against_it() -> None:
    # A stream that ended before its first token has no time to first token or per token.
    assert streamed(INTERACTIVE, 200, ttft_ms=None, tpot_ms=None, e2e_ms=30_000)
    assert streamed(None, 200, ttft_ms=9_999, tpot_ms=None, e2e_ms=None)


def test_an_answer_not_streamed_is_judged_on_when_a_stream_meeting_the_class_would_end() -> None:
    # 20 tokens: 500 ms to the first, 50 ms for each of the other 19: 1450 ms in all.
    assert budget(INTERACTIVE, "chat", False, 20) == Budget(e2e_ms=1_450)
    assert whole(INTERACTIVE, 200, e2e_ms=1_450, completion_tokens=20)
    assert not whole(INTERACTIVE, 200, e2e_ms=1_451, completion_tokens=20)
    assert whole(INTERACTIVE, 200, e2e_ms=1_451, completion_tokens=21)
    # Completions are judged the same way.
    assert not meets_slo(
        INTERACTIVE, 200, None, None, 1_451, endpoint="completions", stream=False,
        completion_tokens=20,
    )  # fmt: skip


def test_an_answer_not_streamed_takes_the_smaller_of_its_class_s_end_to_end_targets() -> None:
    assert budget(BOTH, "chat", False, 100) == Budget(e2e_ms=2_000)  # not 5450
    assert budget(BOTH, "chat", False, 2) == Budget(e2e_ms=550)
    assert budget(BATCH, "chat", False, 100) == Budget(e2e_ms=60_000)
    assert budget(SloClass(ttft_ms=300), "completions", False, 100) == Budget(e2e_ms=300)


def test_without_a_token_count_only_an_end_to_end_target_holds_an_unstreamed_answer() -> None:
    assert budget(INTERACTIVE, "chat", False, None) == Budget()
    assert whole(INTERACTIVE, 200, e2e_ms=30_000, completion_tokens=None)
    assert budget(BOTH, "chat", False, None) == Budget(e2e_ms=2_000)


def test_an_embedding_is_judged_on_its_whole_answer_against_the_ttft_target() -> None:
    assert budget(INTERACTIVE, "embeddings", False, None) == Budget(e2e_ms=500)
    assert embedding(INTERACTIVE, 200, e2e_ms=30)
    assert not embedding(INTERACTIVE, 200, e2e_ms=501)
    assert budget(BATCH, "embeddings", False, None) == Budget(e2e_ms=60_000)
    assert budget(SloClass(ttft_ms=900, e2e_ms=400), "embeddings", False, None) == Budget(
        e2e_ms=400
    )
    assert budget(SloClass(tpot_ms=50), "embeddings", False, None) == Budget()


def test_a_stream_is_judged_on_its_first_token_and_everything_else_on_its_whole_answer() -> None:
    assert judged_on("chat", True) == judged_on("completions", True) == "ttft"
    assert judged_on("chat", False) == judged_on("completions", False) == "e2e"
    assert judged_on("embeddings", False) == "e2e"
    assert budget(BOTH, "chat", True, 20) == Budget(500, 50, 2_000)


def test_a_stored_record_is_judged_by_its_own_endpoint_and_streaming() -> None:
    # A whole answer of 20 tokens may take 500 + 19 x 50 = 1,450 ms; a stream of it is judged
    # on its first token, which this record does not have.
    record = {"status": 200, "ttft_ms": None, "tpot_ms": None, "e2e_ms": 1_400.0,
              "endpoint": "chat", "stream": False, "completion_tokens": 20}  # fmt: skip
    assert record_meets_slo(INTERACTIVE, record)
    assert not record_meets_slo(INTERACTIVE, record | {"e2e_ms": 1_500.0})
    assert not record_meets_slo(INTERACTIVE, record | {"endpoint": "embeddings"})
    assert record_meets_slo(INTERACTIVE, record | {"stream": True})
