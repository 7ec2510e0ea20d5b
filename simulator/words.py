"""The simulator's vocabulary: function words, and content words in pairs that mean the same.

Every word has at most six letters, so each is one token of simulator/tokenizer.py.

A pair is one concept. Where a model hesitates between the two words of a pair, either is a
fluent, equivalent continuation: that is what a benign precision flip produces. A different
concept is a different meaning. Embeddings are built from concepts (simulator/embeddings.py), so
a text and its synonym-for-synonym rewrite embed alike while a changed fact does not.
"""

from __future__ import annotations

_FUNCTION = """
    the of and to in is that for it as with was on be by this are or from at an which can has
    have not but its more other one all also may these some such than then each where two most
"""
FUNCTION_WORDS = tuple(_FUNCTION.split())
_PAIRS = """
    big large | small little | fast quick | slow lazy | begin start | end finish | show reveal
    find locate | make build | help aid | use apply | keep retain | give grant | need want
    get obtain | buy shop | choose pick | answer reply | idea notion | plan scheme | goal aim
    result effect | method manner | error fault | part piece | whole entire | cost charge
    rate pace | load burden | route path | road street | city town | river stream | market bazaar
    trade deal | paper essay | study survey | review audit | report memo | rule norm | law canon
    home house | school campus | office bureau | room hall | car auto | people folk
    person human | friend ally | family clan | stone rock | earth soil | fire flame
    light bright | heavy hefty | cold chilly | warm mild | late tardy | short brief | near close
    far remote | clear plain | good fine | great superb | simple easy | hard tough | new novel
    old aged | high lofty | data facts | system setup | value worth | memory recall
    device gadget | signal cue | number figure | state status | order series | point spot
    level tier | form shape | change alter | test trial | case matter | step stage | set group
    work labor | run launch | read scan | send ship | serve supply | queue line | batch bundle
    cache buffer | weight mass | table chart | field area | clock timer | cycle loop
    phase period | block chunk | card board | cell unit | noise static | range span | scale size
    limit cap | bound border | peak summit | mean middle | sum total | share slice | kind type
    name title | word term | page sheet | book volume | story tale | price fare | power energy
    chip die | graph plot | link bond | source origin | target object | event moment
"""
PAIRS = tuple(tuple(pair.split()) for pair in _PAIRS.replace("\n", "|").split("|") if pair.strip())
CONTENT_WORDS = tuple(word for pair in PAIRS for word in pair)
WORDS = FUNCTION_WORDS + CONTENT_WORDS
_CONCEPT = {word: index for index, pair in enumerate(PAIRS) for word in pair}
_SYNONYM = {a: b for a, b in PAIRS} | {b: a for a, b in PAIRS}


def concept(word: str) -> int | None:
    """Return the concept a content word stands for, or None for any other word."""
    return _CONCEPT.get(word.lower())


def synonym(word: str) -> str | None:
    """Return the other word of a content word's pair, or None."""
    return _SYNONYM.get(word.lower())


def restyle(piece: str, word: str) -> str:
    """Return `word` written as `piece` is: the same leading space and capitalisation."""
    bare = piece.lstrip()
    lead = piece[: len(piece) - len(bare)]
    return lead + (word.capitalize() if bare[:1].isupper() else word)
