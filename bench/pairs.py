"""Pairs of answers for the judge's calibration, measured as the mirror measures shadow copies.

Each kind of traffic (temperature 0, or sampled) gives a `Measured`: the candidate's pairs with
the primary's answer, the noise floor's pairs (the primary asked again), and the labelled
questions each side got right. Two sources:

- `simulated`: the simulator's precision model (simulator/answers.py) composes the answers of a
  bf16 GPU, of the GPU again and of a candidate profile, with and without a harmful error;
  semantic similarity is taken over the simulator's concept embeddings.
- `real`: the real fleet (realfleet/fleet.py) answers the labelled suite and the stories:
  llama.cpp engines serving the same trained model in f16 (the reference and its replica, the
  noise floor), Q8_0, and with analog read noise at two strengths; semantic similarity is
  all-MiniLM-L6-v2's, on the fleet's embedding engine. Every candidate answer to a labelled
  question is marked right or wrong against the question's label.
- `held_out`: the same fleet on what no threshold was fitted on: an everyday suite and its
  questions answered by a number (bench/everyday.py) and parts the fit never saw
  (`HELD_OUT_PARTS`: a Q6_K quantization, analog noise at seeds of their own, and the replica
  behind realfleet/shim.py failing a share of prompts: empty, cut in half, an error, no answer
  before the copy's timeout, or a digit changed; and one that rewords every answer, a benign
  paraphrasing part).

Either way each pair is read and compared by gateway/compare and held to its noise floor's
tolerance by gateway/promotion/departures.py, exactly as the judge's live evidence is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

import httpx

from bench import everyday
from bench.near_tie import analog_parts, quantized_parts
from gateway.compare.answers import Answer, TokenChoice
from gateway.compare.failures import failure
from gateway.compare.meaning import similarity, windows
from gateway.compare.measures import MEASURES, compare
from gateway.policy.load import load_policy
from gateway.promotion.departures import Tolerance, at_risk, departs, tolerance
from gateway.promotion.precision.check import Endpoint, Reply, ask, measure_pair
from gateway.promotion.precision.labels import states
from realfleet import corpus, engine, fleet
from realfleet.shim import Shim
from simulator.answers import Answer as SimulatedAnswer
from simulator.answers import Question, compose
from simulator.embeddings import embed
from simulator.profile import load_profile

Row = dict[str, Any]
TOP_LOGPROBS = 5  # what the mirror asks a copy for (compare.logprobs)
SAMPLED_TEMPERATURE = 0.7
# What the simulator's precision model is fit to (bench/precision_fit.py).
PRECISION_FIT = Path(__file__).resolve().parent.parent / "docs/results/precision-fit.json"


def real_lengths() -> list[int]:
    """Return the real fleet's reference answers' lengths in tokens, the suite's in order."""
    return [int(n) for n in json.loads(PRECISION_FIT.read_text())["lengths"]]


@dataclass
class Measured:
    """One candidate's pairs of one kind of traffic, and the noise floor's. A pair of a labelled
    question carries `primary_right` and `candidate_right`: whether each answer states it."""

    candidate: list[Row] = field(default_factory=list)
    noise: list[Row] = field(default_factory=list)

    def rates(self, paraphrase: float | None = None) -> Rates:
        """Return the shares the judge's evidence is drawn at, and what the labels say of them,
        held to the tolerance of the embedding model's `paraphrase` similarity where declared."""
        held_to = tolerance(self.noise, paraphrase)

        def share(rows: Sequence[Row], test: Callable[[Row], bool]) -> float:
            return sum(map(test, rows)) / len(rows) if rows else 0.0

        def words(rows: Sequence[Row], departing: bool) -> float:
            """The mean words at risk of the pairs that depart (or do not)."""
            found = [at_risk(r) or 0 for r in rows if departs(r, held_to) == departing]
            return sum(found) / len(found) if found else 0.0

        labelled = [r for r in self.candidate if r.get("candidate_right") is not None]
        with_digit = [r["primary_digit"] for r in self.candidate if "primary_digit" in r]
        turned_wrong = [r for r in labelled if r["primary_right"] and not r["candidate_right"]]
        return Rates(
            candidate=share(self.candidate, lambda r: departs(r, held_to)),
            noise=share(self.noise, lambda r: departs(r, held_to)),
            candidate_exact=share(self.candidate, lambda r: bool(r["exact_match"])),
            noise_exact=share(self.noise, lambda r: bool(r["exact_match"])),
            candidate_words_departed=words(self.candidate, True),
            candidate_words_kept=words(self.candidate, False),
            noise_words_departed=words(self.noise, True),
            noise_words_kept=words(self.noise, False),
            tolerance=held_to,
            pairs=len(self.candidate),
            noise_pairs=len(self.noise),
            labelled=len(labelled),
            candidate_right=sum(bool(r["candidate_right"]) for r in labelled),
            primary_right=sum(bool(r["primary_right"]) for r in labelled),
            turned_wrong=len(turned_wrong),
            turned_wrong_departed=sum(departs(r, held_to) for r in turned_wrong),
            turned_wrong_departed_by_words=sum(
                departs(words_only(r), held_to) for r in turned_wrong
            ),
            departed_by_words=share(self.candidate, lambda r: departs(words_only(r), held_to)),
            turned_wrong_similarity=max(
                (
                    r["semantic_similarity"]
                    for r in turned_wrong
                    if r["semantic_similarity"] is not None
                ),
                default=None,
            ),
            departing_kinds=dict(
                Counter(r.get("prompt_kind", "") for r in self.candidate if departs(r, held_to))
            ),
            primary_with_digit=sum(with_digit) / len(with_digit) if with_digit else None,
            failed_kinds=dict(Counter(r["failure"] for r in self.candidate if r.get("failure"))),
        )

    def of_kinds(self, kinds: Sequence[str]) -> Measured:
        """Return the pairs of the prompts of `kinds` alone (every pair where none is named)."""
        if not kinds:
            return self

        def kept(rows: list[Row]) -> list[Row]:
            return [r for r in rows if r.get("prompt_kind") in kinds]

        return Measured(kept(self.candidate), kept(self.noise))


@dataclass(frozen=True)
class Rates:
    """Measured chances, for one kind of traffic, that a pair departs (and matches exactly), and
    the words at risk of a pair that departs and of one that does not."""

    candidate: float
    noise: float
    candidate_exact: float
    noise_exact: float
    candidate_words_departed: float
    candidate_words_kept: float
    noise_words_departed: float
    noise_words_kept: float
    tolerance: Tolerance
    pairs: int = 0
    noise_pairs: int = 0
    labelled: int = 0
    candidate_right: int = 0
    primary_right: int = 0
    # Labelled answers the primary got right and the candidate wrong, and how many departed:
    # a departure share bounds the accuracy lost only if every answer turned wrong departs.
    turned_wrong: int = 0
    turned_wrong_departed: int = 0
    turned_wrong_similarity: float | None = None  # the highest, against the meaning tolerance
    # The same judged as a pool without an embedding model is: on words and near ties alone.
    turned_wrong_departed_by_words: int = 0
    departed_by_words: float = 0.0
    departing_kinds: dict[str, int] = field(default_factory=dict)  # real: by prompt kind
    primary_with_digit: float | None = None  # real: the share of the primary's answers with one
    failed_kinds: dict[str, int] = field(default_factory=dict)  # the copies that failed, by kind

    @property
    def candidate_words(self) -> float:
        """The mean words at risk of a candidate's pair."""
        return _mean_words(self.candidate, self.candidate_words_departed, self.candidate_words_kept)

    @property
    def noise_words(self) -> float:
        """The mean words at risk of a noise floor's pair."""
        return _mean_words(self.noise, self.noise_words_departed, self.noise_words_kept)

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "noise_floor": self.noise,
            "candidate_per_1000_words": _per_1000(self.candidate, self.candidate_words),
            "noise_floor_per_1000_words": _per_1000(self.noise, self.noise_words),
            "candidate_words_at_risk_per_pair": self.candidate_words,
            "noise_words_at_risk_per_pair": self.noise_words,
            "candidate_exact_match": self.candidate_exact,
            "noise_exact_match": self.noise_exact,
            "tolerance": self.tolerance.describe(),
            "meaning_tolerance": self.tolerance.meaning,
            "pairs": self.pairs,
            "noise_pairs": self.noise_pairs,
            "labelled": self.labelled,
            "candidate_accuracy": self.candidate_right / self.labelled if self.labelled else None,
            "primary_accuracy": self.primary_right / self.labelled if self.labelled else None,
            "turned_wrong": self.turned_wrong,
            "turned_wrong_departed": self.turned_wrong_departed,
            "turned_wrong_similarity": self.turned_wrong_similarity,
            "turned_wrong_departed_by_words": self.turned_wrong_departed_by_words,
            "departed_by_words": self.departed_by_words,
            "departing_kinds": self.departing_kinds,
            "primary_answers_with_a_digit": self.primary_with_digit,
            "failed_kinds": self.failed_kinds,
        }


def _mean_words(departing: float, departed: float, kept: float) -> float:
    return departing * departed + (1 - departing) * kept


def _per_1000(departing: float, words: float) -> float | None:
    return 1000 * departing / words if words else None


def words_only(row: Row) -> Row:
    """Return a pair as it reads where no pool serves an embedding model."""
    return {**row, "semantic_similarity": None, "embedding_cosine": None}


# The simulated fleet -----------------------------------------------------------------------

SIMULATED_MODEL = "llama-3.1-8b-instruct"
SIMULATED_EMBEDDING = ("bge-large-en-v1.5", 1024)


def simulated(
    candidate: str,
    temperature: float,
    pairs: int,
    seed: int,
    harmful: float,
    lengths: Sequence[int] = (),
) -> Measured:
    """Answer `pairs` prompts on the simulated GPU, again (the floor) and on `candidate` (a
    simulator profile) with `harmful` of its answers carrying a harmful error. Answers have
    their natural lengths, or `lengths` in turn (the real fleet's, to compare with it)."""

    def read(answer: SimulatedAnswer) -> Answer:
        tokens = tuple(
            TokenChoice(entry.token, entry.logprob, entry.top) for entry in answer.logprobs or ()
        )
        return Answer(text=answer.text, tokens=tokens)

    def embedded(text: str) -> list[list[float]]:
        model, dimensions = SIMULATED_EMBEDDING
        return [embed(model, w, dimensions, noise=0.0, rng=Random(0)) for w in windows(text)]

    def pair(primary: SimulatedAnswer, other: SimulatedAnswer) -> Row:
        diff = compare(read(primary), read(other))
        diff.semantic_similarity = similarity(embedded(primary.text), embedded(other.text))
        return {
            **{name: getattr(diff, name) for name in MEASURES},
            "candidate_error": None,
            "reference_tokens": primary.completion_tokens,
        }

    rng = Random(seed)
    gpu = load_profile("gpu").precision
    part = load_profile(candidate).precision
    measured = Measured()
    for i in range(pairs):
        question = Question(
            SIMULATED_MODEL,
            f"calibration {seed} {i}",
            limit=lengths[i % len(lengths)] if lengths else 1000,
            ignore_eos=bool(lengths),
            temperature=temperature,
            top_logprobs=TOP_LOGPROBS,
        )
        primary = compose(
            question, noise=gpu.logit_noise, drift=gpu.drift, harmful_rate=0.0, rng=rng
        )
        again = compose(question, noise=gpu.logit_noise, drift=gpu.drift, harmful_rate=0.0, rng=rng)
        other = compose(
            question, noise=part.logit_noise, drift=part.drift, harmful_rate=harmful, rng=rng
        )
        measured.noise.append(pair(primary, again))
        measured.candidate.append(pair(primary, other))
    return measured


# The real fleet ----------------------------------------------------------------------------

# The candidates of the real fleet, by the part they serve, and the backend that serves it.
REAL_PARTS = {"f16": "gpu-1", "q8_0": "asic-0", "analog": "cim-0", "subtle": "subtle-0"}
REFERENCE, REPLICA, EMBEDDER = "gpu-0", "gpu-1", "embed-0"


@contextlib.contextmanager
def real_fleet(logs: Path | None = None) -> Iterator[dict[str, str]]:
    """Start the real fleet and an engine of the subtle part; yield each backend's URL."""
    with fleet.running(logs=logs) as running:
        files = fleet.models(engine.cache_dir())
        spec = engine.ServerSpec(
            model=files["subtle"], alias=corpus.MODEL, context=2048, slots=2, seed=9
        )
        with engine.serving(spec, logs / "subtle-0.log" if logs else None) as subtle:
            urls = {name: running.url(name) for name in running.servers}
            yield {**urls, "subtle-0": subtle.url}


# Held out: the parts no threshold was fitted on, by the backend that serves each. Analog noise
# at seeds the fit never used (it used 7 to 9), one per calibration seed; the shims stand in
# front of the replica, so every answer they leave is the reference's own.
HELD_OUT_QUANT = "q6_k"
HELD_OUT_ANALOG_DB = (10.0, 8.0)
# The shims by part: (mode, share of prompts). The everyday answers (recipes, plans, letters)
# hold no digit, so the digit-changing part is judged on the questions answered by a number
# (bench/everyday.py, `numbers`), asked after them: it changes one of every twenty of those.
# The paraphrasing part rewords every answer and keeps its facts: the one benign shim.
HELD_OUT_SHIMS = {
    "empty": ("empty", 0.10),
    "cut": ("cut", 0.10),
    "errors": ("error", 0.02),
    "timeouts": ("timeout", 0.02),
    "digits": ("digits", 0.05),
    "paraphrase": ("reword", 1.0),
}
EVERYDAY_KINDS = tuple(sorted(everyday.KINDS))
NUMBER_KINDS = tuple(sorted(everyday.NUMBER_KINDS))
HELD_OUT_PARTS = {
    "f16": REPLICA,
    "q8_0": "asic-0",
    "q6_k": "q6_k-0",
    **{f"analog_{db:g}db": f"analog-{db:g}db-0" for db in HELD_OUT_ANALOG_DB},
    **{name: f"shim-{name}" for name in HELD_OUT_SHIMS},
}


def real_paraphrase() -> float | None:
    """Return the paraphrase similarity the real fleet's policy declares for its embedding model."""
    declared = load_policy(fleet.POLICY).models.get(fleet.EMBEDDING_MODEL)
    return None if declared is None else declared.paraphrase_similarity


def held_out_seed(seed: int) -> int:
    """Return the analog noise seed of a calibration seed: 11, 12, 13, ..., never the fit's."""
    return 11 + seed


@contextlib.contextmanager
def held_out_fleet(
    seed: int, logs: Path | None = None, parts: Collection[str] = tuple(HELD_OUT_PARTS)
) -> Iterator[dict[str, str]]:
    """Start the real fleet, an engine per held-out part of `parts` and their shims; yield
    each URL."""
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        running = stack.enter_context(fleet.running(logs=logs))
        files = {}
        if HELD_OUT_QUANT in parts:
            quantized = quantized_parts(folder, [HELD_OUT_QUANT])
            files["q6_k-0"] = quantized[HELD_OUT_QUANT.replace("_", "")]
        for db in HELD_OUT_ANALOG_DB:
            if f"analog_{db:g}db" in parts:
                (path,) = analog_parts(folder, [db], [held_out_seed(seed)]).values()
                files[f"analog-{db:g}db-0"] = path
        urls = {name: running.url(name) for name in running.servers}
        for name, path in files.items():
            spec = engine.ServerSpec(path, corpus.MODEL, context=2048, slots=2)
            log = logs / f"{name}.log" if logs else None
            urls[name] = stack.enter_context(engine.serving(spec, log)).url
        for name, (mode, share) in HELD_OUT_SHIMS.items():
            if name in parts:
                shim = stack.enter_context(Shim(urls[REPLICA], mode, share).running())
                urls[f"shim-{name}"] = shim.url
        yield urls


def held_out_prompts(seed: int) -> list[dict[str, Any]]:
    """Return the everyday suite of a calibration seed (bench/everyday.py's seeds in turn), then
    its questions answered by a number."""
    suite = everyday.SEEDS[seed % len(everyday.SEEDS)]
    return everyday.suite(suite) + everyday.numbers(suite)


def copy_timeout_s() -> float:
    """Return the timeout a copy runs under on the real fleet: its default SLO class's, as the
    mirror runs a copy under its request's class's (gateway/shadow/mirror.py)."""
    policy = load_policy(fleet.POLICY)
    return policy.slo_classes[policy.default_slo_class].timeout_s


def primary_failed(primary: Answer, other: Reply) -> str | None:
    """Return how the primary's answer fails beside another's, as the mirror records it: a
    sampled answer may stop short of one the other side wrote on (gateway/compare/failures.py)."""
    return None if other.answer is None else failure(None, primary, other.answer)


def prompts() -> list[dict[str, Any]]:
    """Return every line of the real fleet's labelled suite and of its stories."""
    return [
        json.loads(line)
        for name in corpus.SUITES
        for line in Path(corpus.suite_file(name)).read_text().splitlines()
    ]


def body(line: Mapping[str, Any], temperature: float, seed: int) -> dict[str, Any]:
    """Return a suite line as a client sends it, with the logprobs a shadow copy asks for."""
    sent = {
        "model": corpus.MODEL,
        "messages": line["messages"],
        "max_tokens": line["max_tokens"],
        "temperature": temperature,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
    }
    if temperature > 0:
        sent["seed"] = seed
    return sent


async def real(
    urls: Mapping[str, str],
    temperature: float,
    samples: int,
    seed: int,
    concurrency: int = 4,
    *,
    parts: Mapping[str, str] = REAL_PARTS,
    lines: Sequence[Mapping[str, Any]] | None = None,
    copy_timeout: float | None = None,
) -> dict[str, Measured]:
    """Ask every prompt of the suite (`lines`, else the labelled suite and the stories)
    `samples` times of the reference, its replica and every candidate part (by the backend
    serving it); return each part's pairs with the reference and the noise floor's. A part
    that has not answered within `copy_timeout` (the fleet's, `copy_timeout_s`) timed out."""
    lines = prompts() if lines is None else lines
    gate = asyncio.Semaphore(concurrency)
    measured = {part: Measured() for part in parts}
    embedder = Endpoint("embed", urls[EMBEDDER])
    embedding_model = fleet.EMBEDDING_MODEL
    copy_timeout = copy_timeout_s() if copy_timeout is None else copy_timeout

    async with (
        httpx.AsyncClient(timeout=120) as client,
        httpx.AsyncClient(timeout=copy_timeout) as copies,
    ):

        async def one(index: int, line: Mapping[str, Any], sample: int) -> None:
            async with gate:
                # Independent draws on every side, as two unseeded requests are.
                base = (seed * 1000 + sample) * 10_000 + index * 10
                names = [REFERENCE, REPLICA, *parts.values()]
                replies: list[Reply] = await asyncio.gather(
                    *(
                        ask(
                            copies if k > 1 else client,
                            Endpoint(name, urls[name]),
                            "/v1/chat/completions",
                            body(line, temperature, base + k),
                        )
                        for k, name in enumerate(names)
                    )
                )
                primary, again, *answers = replies
                if primary.answer is None:
                    raise RuntimeError(f"the reference failed a prompt: {primary.error}")
                noise, _ = await measure_pair(
                    client, embedder, embedding_model, primary.answer, again
                )
                noise["primary_failure"] = primary_failed(primary.answer, again)
                noise["prompt_kind"] = line.get("kind", "")
                expected = line.get("expected")
                right = expected is not None and states(primary.answer.text or "", expected)
                with_digit = any(c.isdigit() for c in primary.answer.text or "")
                for part, reply in zip(parts, answers, strict=True):
                    pair, _ = await measure_pair(
                        client, embedder, embedding_model, primary.answer, reply
                    )
                    pair["primary_failure"] = primary_failed(primary.answer, reply)
                    pair["prompt_kind"] = line.get("kind", "")
                    pair["primary_digit"] = with_digit
                    if expected is not None:
                        text = reply.answer.text if reply.answer is not None else ""
                        pair["primary_right"] = right
                        pair["candidate_right"] = states(text or "", expected)
                    measured[part].candidate.append(pair)
                    measured[part].noise.append(noise)

        await asyncio.gather(
            *(
                one(index, line, sample)
                for sample in range(samples)
                for index, line in enumerate(lines)
            )
        )
    return measured
