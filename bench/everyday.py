"""Everyday prompts the shipped suites do not hold: held-out suites for calibration.

    python -m bench.everyday --seed 1 --out everyday-1.jsonl

A precision check's thresholds are fitted on the shipped suites (suites/*.jsonl: facts, stories,
explanations, JSON extraction, tool calls); they are reported on suites of other kinds, written
here from a seed: recipes, travel plans, email drafts, short how-tos, packing and shopping
lists, notes for occasions, and household advice. Each suite is `PROMPTS` different prompts of
the real fleet's model, unlabelled (no one right answer), each allowing the 64 tokens a go-live
suite asks for. Nothing fitted reads this module or its output (bench/near_tie.py keeps them
apart).

Those answers hold no number, so a part that changes one is not seen on them. `numbers` writes,
from the same seed, everyday questions whose answer is a number: quantities in recipes, times,
distances, counts and conversions (`NUMBER_KINDS`), each labelled with it.

    python -m bench.everyday --seed 1 --numbers --out numbers-1.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from realfleet import corpus

PROMPTS = 240
NUMBER_PROMPTS = 60
SEEDS = (1, 2, 3)  # the three held-out suites

DISHES = ["lentil soup", "banana bread", "a vegetable curry", "pancakes", "a tomato sauce",
          "fried rice", "a potato salad", "oatmeal cookies", "a bean chili", "roast chicken",
          "a mushroom risotto", "a fruit crumble"]  # fmt: skip
CITIES = ["Lisbon", "Kyoto", "Vienna", "Montreal", "Edinburgh", "Seville", "Krakow", "Porto",
          "Oslo", "Valencia", "Bruges", "Tallinn"]  # fmt: skip
SPANS = ["a weekend", "three days", "a week", "one day", "ten days"]
PEOPLE = ["my landlord", "a colleague", "my manager", "a neighbour", "my child's teacher",
          "a customer", "the library", "a plumber"]  # fmt: skip
ERRANDS = ["asking to move a meeting to Thursday", "saying I will be late on Monday",
           "asking about a broken heater", "thanking them for their help",
           "asking for an invoice", "declining an invitation politely",
           "asking for a day off", "following up on an order"]  # fmt: skip
TASKS = ["unclog a sink", "hang a picture straight", "clean a cast iron pan",
         "change a bicycle tyre", "remove a coffee stain", "repot a houseplant",
         "fold a fitted sheet", "defrost a freezer", "sharpen a kitchen knife",
         "descale a kettle", "patch a small hole in a wall", "wash a wool jumper"]  # fmt: skip
TRIPS = ["a camping trip", "a beach holiday", "a business trip", "a ski weekend",
         "a long train journey", "a hiking day"]  # fmt: skip
OCCASIONS = ["a birthday", "a retirement", "a new baby", "a wedding", "a house move",
             "a graduation"]  # fmt: skip
ROOMS = ["a small kitchen", "a damp bathroom", "a dark hallway", "a cluttered garage",
         "a noisy bedroom"]  # fmt: skip
SIZES = ["two people", "four people", "a family of five", "one person"]
ASIDES = ["", " Keep it short.", " Use a friendly tone.", " Answer as a list.",
          " I am a beginner.", " I have little time."]  # fmt: skip

KINDS = {
    "recipe": [
        "Give me a simple recipe for {dish} for {size}.",
        "How do I make {dish} without an oven?",
        "What do I need to buy to cook {dish}?",
    ],
    "travel": [
        "Plan {span} in {city} for a first visit.",
        "What should I see in {city} if I only have {span}?",
        "How do I get around {city} cheaply?",
    ],
    "email": [
        "Draft a short email to {person} {errand}.",
        "Write a polite message to {person} {errand}.",
    ],
    "howto": [
        "How do I {task}?",
        "Explain in a few steps how to {task}.",
    ],
    "packing": [
        "What should I pack for {trip}?",
        "Make a checklist for {trip} for {size}.",
    ],
    "shopping": [
        "Write a shopping list for a week of meals for {size}.",
        "What should I buy to cook {dish} and {dish2} this week?",
    ],
    "note": [
        "Write a card message for {occasion}.",
        "Write a short note to a friend about {occasion}.",
    ],
    "home": [
        "How can I make {room} feel bigger?",
        "Give me three tips to keep {room} tidy.",
    ],
}


INGREDIENTS = ["eggs", "cups of flour", "onions", "spoons of sugar", "carrots", "cloves of garlic",
               "potatoes", "apples"]  # fmt: skip
THINGS = ["apples", "books", "plates", "chairs", "stamps", "shirts", "candles", "pencils"]
RIDES = ["bus", "train", "ferry", "tram"]
# Units: (larger, smaller, how many of the smaller in one of the larger).
Unit = tuple[str, str, int]
LENGTHS: list[Unit] = [("kilometres", "metres", 1000), ("metres", "centimetres", 100)]
WEIGHTS: list[Unit] = [("kilograms", "grams", 1000)]
VOLUMES: list[Unit] = [("litres", "millilitres", 1000)]
TIMES: list[Unit] = [("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24),
                     ("weeks", "days", 7)]  # fmt: skip
# What a template's answer is, of the two numbers drawn (2 to 19) and its unit's factor.
SUM: Callable[[int, int, int], int] = lambda a, b, f: a + b  # noqa: E731
PRODUCT: Callable[[int, int, int], int] = lambda a, b, f: a * b  # noqa: E731
CONVERTED: Callable[[int, int, int], int] = lambda a, b, f: a * f  # noqa: E731
# By kind: (template, the units it draws from, its answer).
NUMBER_KINDS: dict[str, list[tuple[str, list[Unit], Callable[[int, int, int], int]]]] = {
    "quantity": [
        ("A recipe needs {a} {item} for one batch. How many {item} do I need for {b} batches?",
         [], PRODUCT),
        ("I have {a} {item} and the soup needs {b} more. How many {item} is that in all?",
         [], SUM),
        ("The sauce takes {a} {big} of stock. How many {small} of stock is that?", VOLUMES,
         CONVERTED),
    ],
    "time": [
        ("The {ride} takes {a} minutes and the walk after it {b} minutes. How many minutes is "
         "the whole trip?", [], SUM),
        ("The bread bakes for {a} {big}. How many {small} is that?", TIMES[:2], CONVERTED),
    ],
    "distance": [
        ("My run is {a} {big} long. How many {small} do I run?", LENGTHS, CONVERTED),
        ("I walk {a} kilometres to work and {b} kilometres back. How far do I walk in a day, "
         "in kilometres?", [], SUM),
    ],
    "count": [
        ("I bought {a} {thing} and then {b} more. How many {thing} do I have?", [], SUM),
        ("There are {a} boxes with {b} {thing} in each. How many {thing} are there?", [],
         PRODUCT),
    ],
    "conversion": [
        ("My suitcase weighs {a} {big}. How many {small} is that?", WEIGHTS, CONVERTED),
        ("The holiday lasts {a} {big}. How many {small} is it?", TIMES[2:], CONVERTED),
    ],
}  # fmt: skip


def number_prompt(rng: random.Random) -> tuple[str, str, str]:
    """Draw one question whose answer is a number: its kind, its text and the answer."""
    kind = rng.choice(sorted(NUMBER_KINDS))
    template, units, answer = rng.choice(NUMBER_KINDS[kind])
    a, b = rng.randrange(2, 20), rng.randrange(2, 20)
    big, small, factor = rng.choice(units) if units else ("", "", 1)
    text = template.format(
        a=a,
        b=b,
        big=big,
        small=small,
        item=rng.choice(INGREDIENTS),
        thing=rng.choice(THINGS),
        ride=rng.choice(RIDES),
    )
    return kind, text + rng.choice(ASIDES), str(answer(a, b, factor))


def prompt(rng: random.Random) -> tuple[str, str]:
    """Draw one prompt: its kind and its text."""
    kind = rng.choice(sorted(KINDS))
    dish, dish2 = rng.sample(DISHES, 2)
    text = rng.choice(KINDS[kind]).format(
        dish=dish,
        dish2=dish2,
        size=rng.choice(SIZES),
        city=rng.choice(CITIES),
        span=rng.choice(SPANS),
        person=rng.choice(PEOPLE),
        errand=rng.choice(ERRANDS),
        task=rng.choice(TASKS),
        trip=rng.choice(TRIPS),
        occasion=rng.choice(OCCASIONS),
        room=rng.choice(ROOMS),
    )
    return kind, text + rng.choice(ASIDES)


def suite(seed: int, count: int = PROMPTS) -> list[dict[str, Any]]:
    """Return `count` different everyday prompts drawn from `seed`, as suite lines."""
    rng = random.Random(f"everyday-{seed}")
    seen: dict[str, str] = {}
    while len(seen) < count:
        kind, text = prompt(rng)
        seen.setdefault(text, kind)
    return [
        {
            "model": corpus.MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": corpus.SUITE_MAX_TOKENS,
            "kind": kind,
        }
        for text, kind in seen.items()
    ]


def numbers(seed: int, count: int = NUMBER_PROMPTS) -> list[dict[str, Any]]:
    """Return `count` different everyday questions with a number for an answer, drawn from
    `seed`, as suite lines labelled with it (`expected`)."""
    rng = random.Random(f"numbers-{seed}")
    seen: dict[str, tuple[str, str]] = {}
    while len(seen) < count:
        kind, text, answer = number_prompt(rng)
        seen.setdefault(text, (kind, answer))
    return [
        {
            "model": corpus.MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": corpus.SUITE_MAX_TOKENS,
            "kind": kind,
            "expected": answer,
        }
        for text, (kind, answer) in seen.items()
    ]


def write(path: Path, seed: int, count: int = PROMPTS, *, with_numbers: bool = False) -> Path:
    """Write a held-out suite (or its questions with a number for an answer) to `path`."""
    lines = numbers(seed, count) if with_numbers else suite(seed, count)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.everyday", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, help=f"{PROMPTS}, or {NUMBER_PROMPTS} of numbers")
    parser.add_argument("--numbers", action="store_true", help="questions answered by a number")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    count = args.count or (NUMBER_PROMPTS if args.numbers else PROMPTS)
    write(args.out, args.seed, count, with_numbers=args.numbers)


if __name__ == "__main__":
    main()
