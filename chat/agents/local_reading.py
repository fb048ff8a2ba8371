"""How the local agent reads a person's sentence: into one `Intent`, tolerant of wording.

People write "trees near houses", "count the trees", "which pool is the smallest?", "solar
panels on houses" or "find similar pools to 25". The sentence is cut into words (lower case,
"20m" → "20 m", "#25" → "25"), the classes are found in it (singular or plural, several words
for a class id like `solar_panel`, a few everyday synonyms such as "street" for `road`), and a
handful of cues decide what is asked: ids after a verb, a distance with its unit, a
superlative, a relation word between two classes. docs/local-agent.md lists what it reads.
"""

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from geosense.annotations.classes import word_forms

# --- what can be asked ------------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    category: str | None  # None: every class


@dataclass(frozen=True)
class Within:
    source: str
    target: str
    distance_m: float
    assumed: str | None = None  # the word taken to mean the default distance ("near")


@dataclass(frozen=True)
class Overlap:
    source: str
    target: str


Superlative = Literal["largest", "smallest", "longest", "shortest"]


@dataclass(frozen=True)
class Extreme:
    category: str
    which: Superlative
    n: int = 1


@dataclass(frozen=True)
class Similar:
    category: str | None
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Delete:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class DeleteWithoutIds:
    """ "delete all trees": the agent deletes by id only."""


@dataclass(frozen=True)
class Focus:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Measure:
    id: int


@dataclass(frozen=True)
class Location:
    nearest: bool  # then the annotations nearest to the position
    category: str | None = None


@dataclass(frozen=True)
class SeeView:
    """ "what can I see?": ask for the view as context."""


@dataclass(frozen=True)
class MapView:
    """ "what is the map view?": the map_get_view page tool."""


@dataclass(frozen=True)
class Select:
    """ "let me pick annotations": the reader-answered map_select."""


@dataclass(frozen=True)
class Ambiguous:
    """ "show me the big ones": which class and measure is not said."""


@dataclass(frozen=True)
class UnknownClass:
    word: str


@dataclass(frozen=True)
class Help:
    pass


@dataclass(frozen=True)
class Dismiss:
    """ "never mind", "no thanks"."""


@dataclass(frozen=True)
class NotUnderstood:
    pass


Intent = (
    Count
    | Within
    | Overlap
    | Extreme
    | Similar
    | Delete
    | DeleteWithoutIds
    | Focus
    | Measure
    | Location
    | SeeView
    | MapView
    | Select
    | Ambiguous
    | UnknownClass
    | Help
    | Dismiss
    | NotUnderstood
)

# --- words ------------------------------------------------------------------------------------

#: Everyday words for classes a dataset commonly has; used only when the class exists and the
#: word names no class of its own.
SYNONYMS: dict[str, tuple[str, ...]] = {
    "house": ("home", "residence", "dwelling"),
    "pool": ("swimming pool", "swimmingpool"),
    "road": ("street", "avenue", "boulevard", "roadway"),
    "solar_panel": ("solar", "solar array", "pv panel", "photovoltaic panel", "photovoltaic"),
    "garage": ("carport",),
    "shed": ("outbuilding",),
    "path": ("footpath", "walkway", "trail"),
    "park": ("green space",),
}
#: Words that mean every annotation ("how many things are there").
EVERYTHING = frozenset(
    "annotation annotations thing things object objects feature features shape shapes item "
    "items everything all class classes kind kinds type types category categories".split()
)
NUMBER_WORDS = {
    w: n
    for n, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve".split()
    )
}
UNITS = {
    "m": 1.0,
    "meter": 1.0,
    "meters": 1.0,
    "metre": 1.0,
    "metres": 1.0,
    "km": 1000.0,
    "kilometer": 1000.0,
    "kilometers": 1000.0,
    "kilometre": 1000.0,
    "kilometres": 1000.0,
    "ft": 0.3048,
    "foot": 0.3048,
    "feet": 0.3048,
    "yd": 0.9144,
    "yard": 0.9144,
    "yards": 0.9144,
    "mi": 1609.344,
    "mile": 1609.344,
    "miles": 1609.344,
}
SUPERLATIVES: dict[str, Superlative] = {
    "largest": "largest",
    "biggest": "largest",
    "greatest": "largest",
    "widest": "largest",
    "smallest": "smallest",
    "tiniest": "smallest",
    "littlest": "smallest",
    "longest": "longest",
    "shortest": "shortest",
}
#: Words that end a phrase naming a class ("how many unicorns ARE there").
STOP = frozenset(
    "a an the of all any are is do does we you i there here in on at to with have has that "
    "which who what near within from by around close closer than less next beside nearby "
    "me my map view please for and or it its".split()
)
#: Words that mean "within the default distance", as the answer quotes them.
NEAR_WORDS = {
    "near": "near",
    "nearby": "nearby",
    "close": "close to",
    "closer": "closer",
    "closest": "closest",
    "next": "next to",
    "around": "around",
    "beside": "beside",
    "by": "by",
}
DEFAULT_NEAR_M = 20.0
EXTREME_MAX = 20

# Cues, matched on the normalised text (lower case, words separated by single spaces).
_DELETE = re.compile(r"\b(?:delete|remove|erase|get rid of|drop)\b")
_SIMILAR = re.compile(
    r"\b(?:similar|alike|resembl\w*|looks? like|looking like)\b|\blike(?= (?:annotations? |ids? |number )?\d)"
)
_NEAR_ME = re.compile(
    r"\b(?:near|nearby|close to|closest to|nearest to|nearest|closest|around|next to|by) me\b"
    r"|\bnear(?:by)? my (?:location|position)\b|\baround here\b"
)
_WHERE_AM_I = re.compile(
    r"\bwhere am i\b|\bmy (?:location|position)\b|\blocate me\b|\bwhere i am\b"
)
_MEASURE = re.compile(
    r"\b(?:how (?:big|large|long|wide)|size of|area of|length of|measure|tell me about|"
    r"what is|whats|describe|details of|info on|information on)\b"
)
_FOCUS = re.compile(
    r"\b(?:focus|zoom|go to|goto|take me to|centre|center|pan to|show|where is|wheres|locate|"
    r"find|display|highlight)\b"
)
_OVERLAP = re.compile(r"\b(?:overlap\w*|intersect\w*|touch\w*|on top of|inside|covering|covers?)\b")
_RELATION = re.compile(
    r"\b(?:within|near|nearby|close|closer|closest|next to|around|beside|less than|under|"
    r"at most|no more than|up to|from|of)\b"
)
_COUNT = re.compile(
    r"\b(?:how many|count|number of|total|tally|amount of|are there any|is there an?y?|"
    r"how much)\b"
)
_CLASSES = re.compile(
    r"\b(?:what|which|list|show)\b.*\b(?:classes|kinds|types|categories)\b"
    r"|\bwhat(?:s| is) (?:on|in) the (?:data|dataset)\b"
)
_SEE = re.compile(
    r"\bwhat (?:can|do) i see\b|\bwhat am i looking at\b|\bwhat(?:s| is) (?:on|in) (?:my |the )?"
    r"(?:view|screen)\b|\bwhat(?:s| is) visible\b|\bwhat(?:s| is) in view\b|\bdescribe (?:my |the )?view\b"
)
_MAP_VIEW = re.compile(
    r"\b(?:map view|current view|map s view|maps view|where is the map|map centre|map center|"
    r"zoom level)\b"
)
_SELECT = re.compile(
    r"\b(?:let me|i want to|i d like to|id like to|can i|i will) (?:pick|select|choose)\b"
    r"|\b(?:select|pick|choose) (?:some |a few )?annotations\b|\bpick on the map\b"
)
_AMBIGUOUS = re.compile(
    r"\b(?:big|large|huge|small|tiny|long|short)(?:gest|est)? ones?\b|\bthe (?:biggest|largest|smallest) ones?\b"
)
_HELP = re.compile(
    r"^(?:help|hi|hello|hey|what can you do|what do you understand|what can i ask|commands)\b"
)
_DISMISS = re.compile(
    r"^(?:never ?mind|no thanks?|nothing|forget it|cancel|no|nope|that s all|thats all|ok|okay|thanks|thank you)$"
)


def words(text: str) -> list[str]:
    """The sentence as words: lower case, units apart from numbers, ids without "#"."""
    text = text.lower().replace("’", "'").replace("'", "")
    text = re.sub(r"(?<=\d)(?=[^\W\d_])", " ", text)
    return re.findall(r"\d+(?:\.\d+)?|[^\W\d_]+", text)


@dataclass(frozen=True)
class Mention:
    category: str
    start: int  # word positions [start, end)
    end: int


class Vocabulary:
    """The phrases that name each class of a dataset."""

    def __init__(self, classes: Collection[str]) -> None:
        phrases: dict[tuple[str, ...], str] = {}
        heads: dict[str, set[str]] = {}
        for category in sorted(classes):
            phrase = tuple(words(category))
            if phrase:
                phrases[phrase] = category
                if len(phrase) > 1:
                    heads.setdefault(phrase[-1], set()).add(category)
                    phrases.setdefault(("".join(phrase),), category)
        for head, owners in heads.items():  # "panels" for solar_panel when no other class ends so
            if len(owners) == 1:
                phrases.setdefault((head,), next(iter(owners)))
        for category, synonyms in SYNONYMS.items():
            if category in classes:
                for synonym in synonyms:
                    phrases.setdefault(tuple(synonym.split()), category)
        self.phrases = phrases
        self.longest = max((len(p) for p in phrases), default=1)

    def mentions(self, tokens: list[str]) -> list[Mention]:
        """The classes named in `tokens`, left to right, longest phrase first."""
        found: list[Mention] = []
        i = 0
        while i < len(tokens):
            hit = self._match(tokens, i)
            if hit is None:
                i += 1
                continue
            category, length = hit
            found.append(Mention(category, i, i + length))
            i += length
        return found

    def _match(self, tokens: list[str], i: int) -> tuple[str, int] | None:
        for length in range(min(self.longest, len(tokens) - i), 0, -1):
            *head, last = tokens[i : i + length]
            for form in word_forms(last):
                category = self.phrases.get((*head, form))
                if category is not None:
                    return category, length
        return None


# --- reading ----------------------------------------------------------------------------------


def _number(token: str) -> float | None:
    if token in NUMBER_WORDS:
        return float(NUMBER_WORDS[token])
    try:
        return float(token)
    except ValueError:
        return None


def _distance(tokens: list[str]) -> float | None:
    """The first "<number> <unit>" in metres; a bare number after "within" is metres too."""
    for i, token in enumerate(tokens):
        value = _number(token)
        if value is None:
            continue
        unit = tokens[i + 1] if i + 1 < len(tokens) else ""
        if unit in UNITS:
            return value * UNITS[unit]
        if i > 0 and tokens[i - 1] in ("within", "than", "under") and not unit.isdigit():
            return value
    return None


def _ids(tokens: list[str], start: int = 0) -> tuple[int, ...]:
    """Integers after position `start` that are not a measure (not followed by a unit)."""
    found = []
    for i in range(start, len(tokens)):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token.isdigit() and following not in UNITS:
            found.append(int(token))
    return tuple(dict.fromkeys(found))


def _position(text: str, match: re.Match[str]) -> int:
    """The word position just after a cue matched in the joined text."""
    return len(text[: match.end()].split())


def _slot_word(tokens: list[str], start: int) -> str | None:
    """The words naming a class after a cue ("how many | unicorns are there" → "unicorns")."""
    picked: list[str] = []
    for token in tokens[start:]:
        if token in STOP or token.isdigit() or token in SUPERLATIVES:
            if picked:
                break
            continue
        picked.append(token)
        if len(picked) == 2:
            break
    return " ".join(picked) or None


def _extreme_count(tokens: list[str], at: int) -> int:
    """N of "the 3 largest", "top five biggest", "5 smallest"; 1 without one."""
    for i in range(at - 1, max(at - 3, -1), -1):
        value = _number(tokens[i])
        if value is not None and value == int(value):
            return max(1, min(int(value), EXTREME_MAX))
    return 1


def read(text: str, classes: Collection[str]) -> Intent:
    """What `text` asks, given the dataset's classes."""
    tokens = words(text)
    joined = " ".join(tokens)
    if not tokens:
        return NotUnderstood()
    mentions = Vocabulary(classes).mentions(tokens)
    first = mentions[0].category if mentions else None

    if _DISMISS.match(joined):
        return Dismiss()
    if match := _DELETE.search(joined):
        ids = _ids(tokens, _position(joined, match))
        return Delete(ids) if ids else DeleteWithoutIds()
    if match := _SIMILAR.search(joined):
        ids = _ids(tokens, _position(joined, match))
        if ids:
            return Similar(first, ids)
    if _NEAR_ME.search(joined):
        return Location(nearest=True, category=first)
    if _WHERE_AM_I.search(joined):
        return Location(nearest=False)
    if (match := _MEASURE.search(joined)) and (ids := _ids(tokens, _position(joined, match))):
        return Measure(ids[0])
    if (match := _FOCUS.search(joined)) and (ids := _ids(tokens, _position(joined, match))):
        return Focus(ids)
    relation = _relation(tokens, joined, mentions)
    if relation is not None:
        return relation
    superlative = next((i for i, t in enumerate(tokens) if t in SUPERLATIVES), None)
    if superlative is not None and not _AMBIGUOUS.search(joined):
        which = SUPERLATIVES[tokens[superlative]]
        if first is not None:
            return Extreme(first, which, _extreme_count(tokens, superlative))
        word = _slot_word(tokens, superlative + 1)
        return UnknownClass(word) if word and word not in EVERYTHING else Ambiguous()
    if match := _COUNT.search(joined):
        if first is not None:
            return Count(first)
        word = _slot_word(tokens, _position(joined, match))
        if word is None or set(word.split()) & EVERYTHING:
            return Count(None)
        return UnknownClass(word)
    if re.search(r"\b\w+ count\b", joined) and first is not None:
        return Count(first)
    if _CLASSES.search(joined):
        return Count(None)
    if _SEE.search(joined):
        return SeeView()
    if _MAP_VIEW.search(joined):
        return MapView()
    if _SELECT.search(joined):
        return Select()
    if _AMBIGUOUS.search(joined):
        return Ambiguous()
    if _HELP.search(joined):
        return Help()
    return NotUnderstood()


def _relation(tokens: list[str], joined: str, mentions: list[Mention]) -> Intent | None:
    """Two classes with a relation between them: an overlap, or a distance."""
    if len(mentions) < 2:
        return None
    source, target = mentions[0], mentions[1]
    between = tokens[source.end : target.start]
    if _OVERLAP.search(joined) or between in (["on"], ["on", "a"], ["on", "the"], ["on", "top"]):
        return Overlap(source.category, target.category)
    distance = _distance(tokens)
    if distance is not None and _RELATION.search(joined):
        return Within(source.category, target.category, distance)
    near = next((NEAR_WORDS[w] for w in tokens if w in NEAR_WORDS), None)
    if near is not None:
        return Within(source.category, target.category, DEFAULT_NEAR_M, assumed=near)
    return None
