"""Load the tokenizer a model's `tokenizer` names (gateway/routing/tokens.py says what one is)."""

from __future__ import annotations

import logging
from functools import cache
from importlib import import_module
from typing import cast

from gateway.routing.tokens import Tokenizer

log = logging.getLogger(__name__)


class TokenizerError(ValueError):
    """A model's `tokenizer` names no class that can be loaded."""


@cache
def load_tokenizer(path: str) -> Tokenizer:
    """Return an instance of the tokenizer class at import path `module:Class` (one per
    process)."""
    module, _, name = path.partition(":")
    try:
        found = getattr(import_module(module), name) if module and name else None
    except ImportError as exc:
        raise TokenizerError(f"tokenizer {path!r}: cannot import {module!r} ({exc})") from exc
    if not callable(found):
        raise TokenizerError(
            f"tokenizer {path!r} names no class: write it as module:Class, e.g. "
            "simulator.schema:EngineTokenizer"
        )
    return cast(Tokenizer, found())


@cache
def tokenizer_or_none(path: str) -> Tokenizer | None:
    """Return the tokenizer at `path`, or None (said once) where it cannot be loaded: the
    model's prompts are then keyed by their text, and its engines' events match nothing."""
    try:
        return load_tokenizer(path)
    except TokenizerError as exc:
        log.error("%s; prompts of the models naming it are keyed by their text", exc)
        return None
