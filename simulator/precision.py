"""Precision: how a device's numerics move its answer away from the reference, token by token.

The reference answer (simulator/answers.py) is what a noiseless model decodes greedily. At every
position of it the reference model also has a runner-up, and a margin between the two logits:

- a content word's runner-up is its synonym (simulator/words.py), at a margin drawn from an
  exponential distribution (mean `MEAN_MARGIN` logits), so a few positions are near ties;
- function words, punctuation and every token of a structured answer (JSON, tool calls) are
  `FIRM`: the model is sure of them, as schema-constrained decoding is.

A device adds Gaussian noise of its `logit_noise` (in logits) to the runner-up's logit, as
accumulated rounding in bf16, int8 or analog arithmetic does. Where the noise exceeds the margin
the argmax flips to the synonym, and from there the answer goes its own way, as a real model's
does once its context differs: the rest of the sentence is other words (each later content word
one of another concept), and where the flip was the sentence's last content word, the next
sentence. A real Q8_0 story that flips keeps about three quarters of its words and little of its
meaning (docs/simulator.md, "Divergence after a flip"). Per content token the chance of a flip is
`flip_chance(logit_noise)`, about 0.2 x logit_noise, so answers of the same device depart more
often the longer they are: per word at risk, the rate is the part's own. Sampling (temperature >
0) draws each content token from the noisy logits over the word, its synonym and a few other
words, times `SAMPLING_SURENESS` over the temperature: as sure of its words as the real fleet's
model, whose sampled answers match each other on 86% of its prompts.

A device's numerics also move its whole distribution, not only the order of a near tie: read
noise on the many logits below the top two (the vocabulary's tail, which the simulator lumps
into one logit) lifts their mass, so at every position the device gives a share of its
probability to tokens the reference holds unlikely, and its logprobs say it is less sure. That
is what KL(reference || device) per token measures, and what the judge's benign rule reads
(gateway/promotion/departures.py: a near tie at a KL of at most 0.008 is forgiven): the real
Q8_0's flips come at a KL of 10⁻⁶ to 0.003, the real analog part's at 0.03 to 2.6. The
simulator's margins are too dense near a tie to carry both figures with one noise (the noise
that flips as often as the analog part moves a distribution by 0.001), so the lift is a figure
of its own, the profile's `drift`: the KL per token, in nats, that it adds at the median
answer. Each answer draws its own, log-normal about `drift` with spread `DRIFT_SPREAD`, as the
real part's KL varies by prompt; every position of the answer lowers each listed logprob by it
(the share `1 - exp(-drift)` moved to the rest of the vocabulary). It changes no token, at any
temperature: the order of the listed tokens is the same.

Harmful errors (a changed fact or field) are not near ties; simulator/answers.py makes them.
Each profile's noise and drift are fit to the real fleet's part it stands for
(bench/precision_fit.py, docs/simulator.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from random import Random

from simulator.words import CONTENT_WORDS, WORDS, concept, restyle, synonym

MEAN_MARGIN = 2.0
FIRM = 12.0
# Other words sit this far below the runner-up, one logit apart; the rest of the vocabulary is
# lumped into one logit of its own (what a top-k list leaves out).
OTHER_GAP = 4.0
OTHERS = 4  # words beyond the top two that sampling may pick
REST = -10.0
# How much surer of its words the model is, away from ties, than the margins say: sampling draws
# from the logits times this. Temperature 0 sees only the margins within the noise of a tie, whose
# density the noise is fit against; sampling reaches every margin, and the real fleet's sampled
# answers match each other far more often than an exponential of mean MEAN_MARGIN lets them
# (bench/precision_fit.py, `sureness_for`).
SAMPLING_SURENESS = 21.0
# How much the KL a device adds varies from answer to answer: the sigma of its logarithm. The
# real analog part's benign flips' KL has deciles 0.063 and 0.43 about a median of 0.21, a
# log-normal of sigma 0.75 (docs/results/precision-fit.json).
DRIFT_SPREAD = 0.75
_STRIDE = 7919  # prime: alternatives of one position are spread over the vocabulary


def flip_chance(noise: float) -> float:
    """Return the chance that `noise` flips a content token: P(N(0, noise) > margin) for an
    exponential margin of mean `MEAN_MARGIN`."""
    if noise <= 0:
        return 0.0
    rate = 1.0 / MEAN_MARGIN
    below = 0.5 * math.erfc(rate * noise / math.sqrt(2))  # Phi(-rate * noise)
    return 0.5 - math.exp((rate * noise) ** 2 / 2) * below


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A decoded token's log probability and the most likely tokens at its position."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class Decoded:
    """A device's tokens, how many of them flipped from the reference, their logprobs, and the
    KL per token its distribution moved by (`lift`, module doc)."""

    pieces: tuple[str, ...]
    flips: int
    logprobs: tuple[TokenLogprob, ...] | None
    lift: float = 0.0


def decode(
    reference: Sequence[str],
    margins: Random,
    *,
    structured: bool,
    noise: float,
    noise_rng: Random,
    sampler: Random | None,
    temperature: float,
    top: int | None,
    drift: float = 0.0,
) -> Decoded:
    """Decode `reference` on a device.

    `margins` is the reference model's stream for this prompt (the same on every device);
    `noise_rng` the device's own; `sampler` draws sampled tokens; `top` is how many
    alternatives each token's logprobs list (None: logprobs were not asked for); `drift` the
    device's median KL per token (module doc).
    """
    lift = drift * math.exp(DRIFT_SPREAD * noise_rng.gauss(0.0, 1.0)) if drift > 0 else 0.0
    pieces: list[str] = []
    logprobs: list[TokenLogprob] | None = None if top is None else []
    flips = 0
    # Once a token differs from the reference's the answer goes its own way (module doc):
    # `stray` draws where, from the position and the token it left the reference by, so two
    # answers that leave it alike go on alike.
    stray: Random | None = None
    redrawn = False
    for piece in reference:
        margin = margins.expovariate(1.0 / MEAN_MARGIN)
        alt = margins.getrandbits(32)
        word = piece.strip()
        runner = None if structured or not word else synonym(word)
        if stray is not None and runner is not None:
            chosen = restyle(piece, _elsewhere(word, stray))
            redrawn = True
            pieces.append(chosen)
            if logprobs is not None:
                logprobs.append(entry(chosen, alt, top or 0, lift))
            continue
        if runner is None:
            if piece == "." and redrawn:
                stray, redrawn = None, False
            pieces.append(piece)
            if logprobs is not None:
                logprobs.append(_entry(piece, None, FIRM, alt, piece, 0.0, top or 0, lift))
            continue
        runner_up = restyle(piece, runner)
        gap = margin - (noise_rng.gauss(0.0, noise) if noise > 0 else 0.0)
        if sampler is not None:
            chosen, logit = _sample(piece, runner_up, gap, alt, sampler, temperature)
        elif gap < 0:
            chosen, logit = runner_up, -gap
            flips += 1
        else:
            chosen, logit = piece, 0.0
        if chosen != piece:
            stray = Random(f"{alt} {chosen}")
        pieces.append(chosen)
        if logprobs is not None:
            logprobs.append(_entry(piece, runner_up, gap, alt, chosen, logit, top or 0, lift))
    return Decoded(tuple(pieces), flips, None if logprobs is None else tuple(logprobs), lift)


def _elsewhere(word: str, rng: Random) -> str:
    """Return a content word of another concept than `word`'s: where a strayed answer goes."""
    old = concept(word)
    while True:
        other = CONTENT_WORDS[int(rng.random() * len(CONTENT_WORDS))]
        if concept(other) != old:
            return other


def entry(piece: str, alt: int, top: int, lift: float = 0.0) -> TokenLogprob:
    """Return the logprobs of a token the device is sure of (a harmful error's), its
    distribution moved by `lift` nats (module doc)."""
    word = piece.strip()
    runner = synonym(word) if word else None
    runner_up = restyle(piece, runner) if runner else None
    return _entry(piece, runner_up, MEAN_MARGIN if runner_up else FIRM, alt, piece, 0.0, top, lift)


def _others(piece: str, runner_up: str | None, alt: int, count: int) -> list[str]:
    """The position's next most likely words after the top two, most likely first."""
    taken = {piece.strip().lower(), (runner_up or "").strip().lower()}
    found: list[str] = []
    j = 0
    while len(found) < count:
        word = WORDS[(alt + j * _STRIDE) % len(WORDS)]
        j += 1
        if word not in taken:
            taken.add(word)
            found.append(restyle(piece, word) if piece.strip() else word)
    return found


def _other_logit(gap: float, rank: int) -> float:
    """The logit of the rank-th other word (from 1), the reference's token being at 0."""
    return -(max(gap, 0.0) + OTHER_GAP + rank)


def _sample(
    piece: str, runner_up: str, gap: float, alt: int, sampler: Random, temperature: float
) -> tuple[str, float]:
    """Draw a token from the noisy logits at `temperature`; return it with its logit."""
    candidates = [(piece, 0.0), (runner_up, -gap)]
    candidates += [
        (word, _other_logit(gap, rank))
        for rank, word in enumerate(_others(piece, runner_up, alt, OTHERS), start=1)
    ]
    best = max(0.0, -gap)  # noise may put the runner-up first
    weights = [
        math.exp((logit - best) * SAMPLING_SURENESS / temperature) for _, logit in candidates
    ]
    draw = sampler.random() * sum(weights)
    for candidate, weight in zip(candidates, weights, strict=True):
        draw -= weight
        if draw < 0:
            return candidate
    return candidates[0]


def _entry(
    piece: str,
    runner_up: str | None,
    gap: float,
    alt: int,
    chosen: str,
    logit: float,
    top: int,
    lift: float = 0.0,
) -> TokenLogprob:
    """Logprobs at one position: the same whatever `top` is, as a real server's are. `lift`
    nats of the listed tokens' probability go to the rest of the vocabulary (module doc)."""
    ranked = [(piece, 0.0)]
    if runner_up is not None:
        ranked.append((runner_up, -gap))
    total = lift + math.log(
        sum(math.exp(value) for _, value in ranked)
        + math.exp(_other_logit(gap, 0)) * _OTHERS_WEIGHT
        + _REST_WEIGHT
    )
    if top > len(ranked):
        others = _others(piece, runner_up, alt, top - len(ranked))
        ranked += [(word, _other_logit(gap, rank)) for rank, word in enumerate(others, start=1)]
    if len(ranked) > 1 and ranked[1][1] > 0:
        ranked[0], ranked[1] = ranked[1], ranked[0]  # the noise put the runner-up first
    return TokenLogprob(
        chosen, logit - total, tuple((token, value - total) for token, value in ranked[:top])
    )


# Words beyond the top two are listed up to OpenAI's 20 alternatives; their weight in the
# normalisation is fixed, so a token's logprob does not depend on how many were asked for.
_OTHERS_WEIGHT = sum(math.exp(-rank) for rank in range(1, 20))
_REST_WEIGHT = math.exp(REST)
