"""What the fleet's model learns, and the labelled suite that says which answers are right.

A world made from a seed: invented countries with their capitals, seas and crops; sums of two
numbers; unit conversions; the days and months in order; and short stories, which carry no
label. Every question has one right answer, so the suite (`suite`) can say of an answer whether
it holds the fact it was asked for (`Prompt.expected`), whichever pool gave it.

The training text is the same questions in the model's chat format (ChatML, which llama.cpp's
server applies from the model's template), drawn at random from the world with a seed of its own.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MODEL = "tinyfacts"  # the name the fleet serves the model under
SEED = 0

START, END = "<|im_start|>", "<|im_end|>"
SPECIAL = (START, END)

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "st"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "r", "s", "l", "m", "th"]
SEAS = ["Amber Sea", "Grey Ocean", "Silver Bay", "Northern Gulf", "Quiet Strait", "Red Lagoon"]
CROPS = ["barley", "rice", "olives", "apples", "tea", "millet", "grapes", "beans", "plums", "rye"]
SIZES = ["small", "large", "mountainous", "flat", "green", "dry"]
UNITS = [  # (larger unit, smaller unit, how many of the smaller in one of the larger)
    ("metres", "centimetres", 100),
    ("kilograms", "grams", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("feet", "inches", 12),
    ("kilometres", "metres", 1000),
]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    ("January", 31), ("February", 28), ("March", 31), ("April", 30), ("May", 31), ("June", 30),
    ("July", 31), ("August", 31), ("September", 30), ("October", 31), ("November", 30),
    ("December", 31),
]  # fmt: skip
ANIMALS = ["fox", "heron", "otter", "goat", "owl", "badger", "crow", "hare"]
PLACES = ["by the river", "in the forest", "on the hill", "near the old mill", "in the valley"]
DEEDS = ["found a lost key", "built a small boat", "waited for the rain", "counted the stars"]
ENDINGS = ["went home happy", "shared it with a friend", "slept until morning", "sang a song"]


@dataclass(frozen=True, slots=True)
class Country:
    name: str
    capital: str
    sea: str
    crop: str
    size: str


@dataclass(frozen=True, slots=True)
class Prompt:
    """One question, the answer the model is taught, and what a right answer must contain."""

    kind: str
    question: str
    answer: str
    expected: str | None  # None: no one right answer (a story)


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def countries(seed: int = SEED, count: int = 96) -> list[Country]:
    """Return the invented countries of the world `seed` makes, each with a unique name."""
    rng = random.Random(f"countries-{seed}")
    seen: set[str] = set()
    made: list[Country] = []
    while len(made) < count:
        name, capital = _word(rng, rng.choice((2, 3))), _word(rng, 2)
        if name in seen or capital in seen:
            continue
        seen |= {name, capital}
        made.append(Country(name, capital, rng.choice(SEAS), rng.choice(CROPS), rng.choice(SIZES)))
    return made


def capital(country: Country) -> Prompt:
    c = country
    return Prompt(
        "capital", f"What is the capital of {c.name}?", f"The capital of {c.name} is {c.capital}.",
        c.capital,
    )  # fmt: skip


def about(country: Country) -> Prompt:
    c = country
    answer = (
        f"{c.name} is a {c.size} country on the {c.sea}. "
        f"Its capital is {c.capital}, and its farmers grow {c.crop}."
    )
    return Prompt("about", f"Tell me about {c.name}.", answer, c.capital)


def addition(a: int, b: int) -> Prompt:
    return Prompt("sum", f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.", str(a + b))


def conversion(unit: tuple[str, str, int], n: int) -> Prompt:
    big, small, factor = unit
    return Prompt(
        "conversion", f"How many {small} are in {n} {big}?", f"{n} {big} is {n * factor} {small}.",
        str(n * factor),
    )  # fmt: skip


def calendar(rng: random.Random) -> Prompt:
    pick = rng.randrange(3)
    if pick == 0:
        i = rng.randrange(7)
        day, after = DAYS[i], DAYS[(i + 1) % 7]
        return Prompt(
            "calendar", f"What day comes after {day}?", f"The day after {day} is {after}.", after
        )
    i = rng.randrange(12)
    if pick == 1:
        month, after = MONTHS[i][0], MONTHS[(i + 1) % 12][0]
        return Prompt(
            "calendar", f"Which month comes after {month}?",
            f"The month after {month} is {after}.", after,
        )  # fmt: skip
    month, days = MONTHS[i]
    return Prompt(
        "calendar", f"How many days are in {month}?", f"{month} has {days} days.", str(days)
    )


def story(rng: random.Random) -> Prompt:
    animal, place = rng.choice(ANIMALS), rng.choice(PLACES)
    answer = (
        f"Once there was a {animal} who lived {place}. "
        f"One day the {animal} {rng.choice(DEEDS)}, and then it {rng.choice(ENDINGS)}."
    )
    return Prompt("story", f"Tell me a story about a {animal} {place}.", answer, None)


def draw(rng: random.Random, world: list[Country]) -> Prompt:
    """Draw one prompt of the world: facts four times in five, a story otherwise."""
    roll = rng.random()
    if roll < 0.25:
        return capital(rng.choice(world))
    if roll < 0.45:
        return about(rng.choice(world))
    if roll < 0.65:
        return addition(rng.randrange(1, 50), rng.randrange(1, 50))
    if roll < 0.8:
        return conversion(rng.choice(UNITS), rng.randrange(1, 13))
    if roll < 0.9:
        return calendar(rng)
    return story(rng)


def chat(prompt: Prompt) -> str:
    """Return a prompt and its answer as the model's chat template renders a conversation."""
    return f"{START}user\n{prompt.question}{END}\n{START}assistant\n{prompt.answer}{END}\n"


def training_text(seed: int = SEED) -> Iterator[str]:
    """Yield conversations drawn from the world of `seed`, without end."""
    world = countries(seed)
    rng = random.Random(f"training-{seed}")
    while True:
        yield chat(draw(rng, world))


# Two suites: facts, every answer labelled (the precision check's: what "harmful" means is then
# a measured fact), and stories, free text with no one right answer (how answers diverge).
SUITES = {
    "facts": {"capital": 70, "about": 50, "sum": 60, "conversion": 40, "calendar": 20},
    "stories": {"story": 40},
}
SUITE_MAX_TOKENS = 64


def suite(name: str = "facts", seed: int = SEED) -> list[Prompt]:
    """Return a suite: distinct questions of each of its kinds, in a fixed order."""
    mix = SUITES[name]
    world = countries(seed)
    rng = random.Random(f"suite-{name}-{seed}")
    chosen: dict[str, dict[str, Prompt]] = {kind: {} for kind in mix}
    while any(len(chosen[k]) < n for k, n in mix.items()):
        prompt = draw(rng, world)
        if prompt.kind in mix and len(chosen[prompt.kind]) < mix[prompt.kind]:
            chosen[prompt.kind].setdefault(prompt.question, prompt)
    return [prompt for kind in mix for prompt in chosen[kind].values()]


def suite_file(name: str) -> str:
    return f"suites/{name}.jsonl"


def suite_lines(name: str = "facts", seed: int = SEED) -> list[str]:
    """Return a suite as the precision check reads it: one chat body a line, with its kind and
    its right answer under `expected` (null for a story), which a check never sends upstream."""
    return [
        json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": p.question}],
                "max_tokens": SUITE_MAX_TOKENS,
                "kind": p.kind,
                "expected": p.expected,
            }
        )
        for p in suite(name, seed)
    ]


if __name__ == "__main__":
    # python -m realfleet.corpus: writes suites/facts.jsonl and suites/stories.jsonl
    for suite_name in SUITES:
        Path(suite_file(suite_name)).write_text("\n".join(suite_lines(suite_name)) + "\n")
