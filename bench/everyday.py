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
from the same seed, everyday questions whose answer is a number: quantities for recipes, times,
distances, counts and conversions (`NUMBER_KINDS`), each labelled with it: the model's own
questions after an everyday lead-in, none of them a question of the fitted suites.

    python -m bench.everyday --seed 1 --numbers --out numbers-1.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
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


# The fleet's model answers a number only to the questions it was taught ("What is 12 plus
# 30?", "How many grams are in 4 kilograms?"; realfleet/corpus.py): asked with words after them,
# or in words of its own, it mostly answers with a country or a story. So a question here is one
# of those after an everyday lead-in, which the model reads past, and its core is never a
# question of the fitted suites. How many of the reference's answers hold a digit is measured
# with every held-out run (bench/promotion.py, "numbers").
Unit = tuple[str, str, int]  # (larger, smaller, how many of the smaller in one of the larger)
WEIGHTS: list[Unit] = [("kilograms", "grams", 1000)]
LENGTHS: list[Unit] = [("kilometres", "metres", 1000), ("metres", "centimetres", 100),
                       ("feet", "inches", 12)]  # fmt: skip
TIMES: list[Unit] = [("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24),
                     ("weeks", "days", 7)]  # fmt: skip
SUM = "What is {a} plus {b}?"
CONVERSION = "How many {small} are in {n} {big}?"
# By kind: the lead-ins, the question and the units it draws from (none for a sum).
NUMBER_KINDS: dict[str, tuple[list[str], str, list[Unit]]] = {
    "quantity": (["For the recipe,", "For the bread,", "For the cake,", "At the market,"],
                 CONVERSION, WEIGHTS),
    "time": (["For the trip,", "For the roast,", "Before the train leaves,", "For my shift,"],
             CONVERSION, TIMES),
    "distance": (["For my run,", "On my walk,", "For the new shelf,", "For the garden fence,"],
                 CONVERSION, LENGTHS),
    "count": (["In the shop,", "At the party,", "For the school trip,", "In the library,"],
              SUM, []),
    "conversion": (["My child asks:", "For the homework,", "Quick question:", "For the plan,"],
                   CONVERSION, [*WEIGHTS, *LENGTHS, *TIMES]),
}  # fmt: skip


def number_prompt(rng: random.Random) -> tuple[str, str, str, str]:
    """Draw one question whose answer is a number: its kind, its text, its core (the question
    the model was taught) and the answer."""
    kind = rng.choice(sorted(NUMBER_KINDS))
    leads, question, units = NUMBER_KINDS[kind]
    if units:
        big, small, factor = rng.choice(units)
        n = rng.randrange(2, 13)
        core, answer = question.format(small=small, n=n, big=big), n * factor
    else:
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        core, answer = question.format(a=a, b=b), a + b
    text = f"{rng.choice(leads)} {core[0].lower()}{core[1:]}"
    return kind, text, core, str(answer)


def fitted_questions() -> set[str]:
    """Return the questions of the real fleet's fitted suites (realfleet/corpus.py)."""
    return {prompt.question for name in corpus.SUITES for prompt in corpus.suite(name)}


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
    `seed`, none a fitted question after a lead-in, as suite lines labelled with the answer
    (`expected`)."""
    rng = random.Random(f"numbers-{seed}")
    fitted = fitted_questions()
    seen: dict[str, tuple[str, str]] = {}
    cores: set[str] = set()
    while len(seen) < count:
        kind, text, core, answer = number_prompt(rng)
        if core not in fitted and core not in cores:
            cores.add(core)
            seen[text] = (kind, answer)
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
