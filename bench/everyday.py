"""Everyday prompts the shipped suites do not hold: held-out suites for calibration.

    python -m bench.everyday --seed 1 --out everyday-1.jsonl

A precision check's thresholds are fitted on the shipped suites (suites/*.jsonl: facts, stories,
explanations, JSON extraction, tool calls); they are reported on suites of other kinds, written
here from a seed: recipes, travel plans, email drafts, short how-tos, packing and shopping
lists, notes for occasions, and household advice. Each suite is `PROMPTS` different prompts of
the real fleet's model, unlabelled (no one right answer), each allowing the 64 tokens a go-live
suite asks for. Nothing fitted reads this module or its output (bench/near_tie.py keeps them
apart).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from realfleet import corpus

PROMPTS = 240
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


def write(path: Path, seed: int, count: int = PROMPTS) -> Path:
    """Write a held-out suite to `path`; return it."""
    path.write_text("".join(json.dumps(line) + "\n" for line in suite(seed, count)))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.everyday", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, default=PROMPTS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    write(args.out, args.seed, args.count)


if __name__ == "__main__":
    main()
