"""The local agent: deterministic and offline, documented in docs/local-agent.md.

It decides every step from what the engine stores (the request the turn answers, with its
contexts and the dataset overview handed over as data, and the tool results after the request
in the history), so a turn paused for an approval resumes in any process. It uses the same
tools, blocks and approvals as an LLM would, and streams its text in small deltas.
"""

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from geosense.annotations.classes import class_match

from .base import AgentChunk, AgentContext, TextDelta, Thinking, ToolCallRequest, UserRequest

ANSWER_RE = re.compile(
    r'<answer\s+question="(?P<q>[^"]*)"(?:\s+question-option-index="(?P<i>\d+)")?\s*>(?P<msg>.*?)</answer>',
    re.S,
)
RESPONSE_RE = re.compile(r"<response\b(?P<attrs>[^>]*)>(?P<body>.*?)</response>", re.S)
ATTR_RE = re.compile(r'([\w-]+)\s*=\s*"([^"]*)"')
IDS_RE = r"(\d+(?:\s*(?:,|and|&)\s*\d+)*)"

WITHIN_RE = re.compile(
    r"(?P<src>[a-z]+)\s+(?:that\s+are\s+|which\s+are\s+|are\s+)?(?:within|closer\s+than|less\s+than)\s+"
    r"(?P<d>\d+(?:\.\d+)?)\s*(?P<u>m|meters?|metres?|km|kilometers?|kilometres?)\s+(?:of|from|to)\s+"
    r"(?:an?\s+|the\s+|any\s+)?(?P<tgt>[a-z]+)\b"
)
OVERLAP_RE = re.compile(
    r"(?P<src>[a-z]+)\s+(?:that\s+)?overlap(?:s|ping)?\s+(?:with\s+)?(?:an?\s+|the\s+|any\s+)?(?P<tgt>[a-z]+)\b"
)
EXTREME_RE = re.compile(
    r"\b(?P<which>largest|biggest|smallest|longest|shortest)\s+(?P<cls>[a-z]+)\b"
)
COUNT_RE = re.compile(r"\bhow\s+many\s+(?P<cls>[a-z]+)")
SIMILAR_RE = re.compile(
    r"\b(?P<cls>[a-z]+)\s+(?:that\s+are\s+|which\s+are\s+)?similar\s+to\s+(?:annotations?\s+)?"
    + IDS_RE
)
DELETE_RE = re.compile(r"\b(?:delete|remove)\s+(?:the\s+)?(?:annotations?\s+|ids?\s+)?" + IDS_RE)
FOCUS_RE = re.compile(
    r"\b(?:focus\s+on|zoom\s+to|go\s+to|show\s+me)\s+(?:the\s+)?annotations?\s+" + IDS_RE
)
WHERE_RE = re.compile(r"\bwhere\s+am\s+i\b|\bmy\s+(?:location|position)\b")
NEAR_ME_RE = re.compile(r"\b(?:near|close\s+to|around)\s+me\b|\bnearest\s+to\s+me\b")
SEE_RE = re.compile(
    r"\bwhat\s+(?:can|do)\s+i\s+see\b|\bwhat\s+am\s+i\s+looking\s+at\b|\bwhat(?:'s|\s+is)\s+(?:on|in)\s+(?:my\s+)?(?:view|screen|map)\b"
)
VIEW_RE = re.compile(r"\b(?:map\s+view|current\s+view|where\s+is\s+the\s+map)\b")
SELECT_RE = re.compile(
    r"\b(?:let\s+me\s+(?:pick|select|choose)|i\s+want\s+to\s+(?:pick|select|choose)|select\s+(?:some\s+)?annotations)\b"
)
AMBIGUOUS_RE = re.compile(
    r"\b(?:big|large|huge|small|tiny)\s+ones\b|\bthe\s+(?:big|large)\s+(?:one|ones)\b"
)
HELP_RE = re.compile(r"^\s*(?:help|hi|hello|hey|what\s+can\s+you\s+do)\b")

SEE_QUESTION_ID = "q-view"
BIG_QUESTION_ID = "q-big"
MAX_LOCATION_ATTEMPTS = 2  # one retry after PENDING at most

CAPABILITIES = (
    "I can answer these about the annotations on the map:\n"
    "- counts: “how many trees are there?”\n"
    "- distances: “show trees within 20 m of a house”\n"
    "- overlaps: “pools overlapping a house”\n"
    "- extremes: “which is the largest house?”, “the longest road”\n"
    "- similarity: “find pools similar to 25”\n"
    "- deletion: “delete annotation 12” (asks for your approval)\n"
    "- the map: “what can I see?”, “focus on annotation 12”, “let me pick annotations”\n"
    "- your location: “where am I?”, “what is near me?”"
)


@dataclass(frozen=True)
class Step:
    """A tool call made after the current user message, with its result."""

    name: str
    arguments: dict[str, Any]
    result: dict[str, Any]

    @property
    def ok(self) -> bool:
        return "error" not in self.result


@dataclass(frozen=True)
class Situation:
    text: str  # the user's request, lower-cased, markup reduced to its meaning
    raw: str
    request: UserRequest
    steps: list[Step]
    overview: dict[str, int]
    tools: frozenset[str]
    call_seq: int

    def calls(self, name: str) -> list[Step]:
        return [s for s in self.steps if s.name == name]


def _ids(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {"error": str(text)}
    return value if isinstance(value, dict) else {"value": value}


def situation_read(
    history: list[dict[str, Any]], tools: list[dict[str, Any]], context: AgentContext
) -> Situation:
    last_user = max((i for i, m in enumerate(history) if m.get("role") == "user"), default=-1)
    raw = context.request.text.strip()
    results = {
        m["tool_call_id"]: m.get("content")
        for m in history[last_user + 1 :]
        if m.get("role") == "tool"
    }
    steps: list[Step] = []
    for message in history[last_user + 1 :]:
        for call in message.get("tool_calls") or []:
            function = call["function"]
            if call["id"] in results:
                steps.append(
                    Step(
                        function["name"],
                        _json(function.get("arguments") or "{}"),
                        _json(results[call["id"]]),
                    )
                )
    names = frozenset(t["function"]["name"] for t in tools if t.get("type") == "function")
    return Situation(
        text=_meaning(raw).lower(),
        raw=raw,
        request=context.request,
        steps=steps,
        overview=dict(context.overview),
        tools=names,
        # Every call of the session so far, so the next call id is new in the whole history.
        call_seq=sum(len(m.get("tool_calls") or []) for m in history),
    )


def _meaning(raw: str) -> str:
    """An <answer> means its message; anything else is taken as written."""
    answer = ANSWER_RE.search(raw)
    if answer:
        return answer["msg"].strip()
    return raw


def _class_of(word: str, overview: dict[str, int]) -> str | None:
    return class_match(word, overview)


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


class LocalAgent:
    """See the module docstring; every answer is built from the tools' results."""

    async def stream(
        self,
        *,
        history: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        context: AgentContext,
    ) -> AsyncIterator[AgentChunk]:
        situation = situation_read(history, tools, context)
        for chunk in decide(situation):
            if isinstance(chunk, TextDelta):
                for piece in re.findall(r"\S+\s*|\s+", chunk.text):
                    yield TextDelta(piece)
                    await asyncio.sleep(0)
            else:
                yield chunk


def _call(s: Situation, name: str, arguments: dict[str, Any]) -> ToolCallRequest:
    return ToolCallRequest(
        id=f"local_{s.call_seq + 1}_{name}", name=name, arguments=json.dumps(arguments)
    )


def decide(s: Situation) -> Iterator[AgentChunk]:
    """The next step for this situation: text, or a thought and a tool call."""
    answer = ANSWER_RE.search(s.raw)
    if answer and answer["q"] == SEE_QUESTION_ID:
        yield from _see_answered(s, answer["i"])
        return
    response = RESPONSE_RE.search(s.raw)
    if response:
        yield from _similar_found(s, dict(ATTR_RE.findall(response["attrs"])))
        return
    text = s.text
    for pattern, handler in (
        (WITHIN_RE, _within),
        (OVERLAP_RE, _overlap),
        (SIMILAR_RE, _similar),
        (DELETE_RE, _delete),
        (FOCUS_RE, _focus),
        (EXTREME_RE, _extreme),
        (COUNT_RE, _count),
    ):
        match = pattern.search(text)
        if match:
            yield from handler(s, match)
            return
    if NEAR_ME_RE.search(text):
        yield from _location(s, then_nearest=True)
    elif WHERE_RE.search(text):
        yield from _location(s, then_nearest=False)
    elif SEE_RE.search(text):
        yield TextDelta(
            f'<question id="{SEE_QUESTION_ID}">\n'
            "  <header>I'm not sure what you can see, let me take a look</header>\n"
            '  <option message="Here\'s the viewport data." context="visibility position">Allow</option>\n'
            '  <option message="No, I don\'t want to do that.">Deny</option>\n'
            "</question>"
        )
    elif VIEW_RE.search(text):
        yield from _map_view(s)
    elif SELECT_RE.search(text):
        yield from _select(s)
    elif AMBIGUOUS_RE.search(text):
        yield from _clarify(s)
    elif HELP_RE.search(text):
        yield TextDelta(CAPABILITIES)
    else:
        yield TextDelta(
            "I'm the built-in local assistant, so I only understand a fixed set of requests. "
            + CAPABILITIES
        )


def _declined(step: Step) -> bool:
    message = str(step.result.get("error", "")).lower()
    return "declined" in message or "set aside" in message


def _failed(step: Step, doing: str) -> Iterator[AgentChunk]:
    if _declined(step):
        yield TextDelta(f"Understood, I did not {doing}.")
    else:
        yield TextDelta(f"I could not {doing}: {step.result.get('error')}")


def _unknown_class(s: Situation, word: str) -> Iterator[AgentChunk]:
    known = ", ".join(sorted(s.overview)) or "none"
    yield TextDelta(f"There are no “{word}” annotations here. The classes are: {known}.")


# --- counts ----------------------------------------------------------------------------------


def _count(s: Situation, match: re.Match[str]) -> Iterator[AgentChunk]:
    word = match["cls"]
    if word in {"annotations", "annotation", "things", "objects", "features", "shapes"}:
        total = sum(s.overview.values())
        parts = ", ".join(f"{n} {c}" for c, n in sorted(s.overview.items()))
        yield TextDelta(f"There are {total} annotations: {parts}.")
        return
    category = _class_of(word, s.overview)
    if category is None:
        yield from _unknown_class(s, word)
        return
    count = s.overview[category]
    noun = category if count == 1 else _plural(category)
    yield TextDelta(f"There {'is' if count == 1 else 'are'} {count} {noun}.")


def _plural(word: str) -> str:
    return word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s")


# --- spatial relations -----------------------------------------------------------------------


def _metres(value: str, unit: str) -> float:
    return float(value) * (1000.0 if unit.startswith("k") else 1.0)


def _within(s: Situation, match: re.Match[str]) -> Iterator[AgentChunk]:
    source, target = _class_of(match["src"], s.overview), _class_of(match["tgt"], s.overview)
    if source is None or target is None:
        yield from _unknown_class(s, match["src"] if source is None else match["tgt"])
        return
    distance = _metres(match["d"], match["u"])
    done = s.calls("spatial_relation")
    if not done:
        yield Thinking(f"Looking for {_plural(source)} within {_num(distance)} m of a {target}.")
        yield _call(
            s,
            "spatial_relation",
            {
                "relation": "within_distance",
                "source": source,
                "target": target,
                "distance_m": distance,
            },
        )
        return
    step = done[-1]
    if not step.ok:
        yield from _failed(step, f"look for {_plural(source)} near {_plural(target)}")
        return
    artifact, count = step.result["artifact_id"], step.result["count"]
    if count == 0:
        yield TextDelta(
            f'No {source} is within <distance value="{_num(distance)}" /> of a {target}.'
        )
        return
    yield TextDelta(
        f'I found {count} {source if count == 1 else _plural(source)} within <distance value="{_num(distance)}" /> of a {target}.\n'
        f'<tool type="highlight" data="${{{artifact}}}">{_plural(source).capitalize()} within <distance value="{_num(distance)}" /> of a {target}</tool>\n'
        f'The closest is <ref id="${{{artifact}.ids.0}}" />, <size value="${{{artifact}.linkValues.0}}" /> from '
        f'<ref id="${{{artifact}.links.0}}" />.'
    )


def _overlap(s: Situation, match: re.Match[str]) -> Iterator[AgentChunk]:
    source, target = _class_of(match["src"], s.overview), _class_of(match["tgt"], s.overview)
    if source is None or target is None:
        yield from _unknown_class(s, match["src"] if source is None else match["tgt"])
        return
    done = s.calls("spatial_relation")
    if not done:
        yield Thinking(f"Looking for {_plural(source)} that overlap a {target}.")
        yield _call(
            s, "spatial_relation", {"relation": "overlap", "source": source, "target": target}
        )
        return
    step = done[-1]
    if not step.ok:
        yield from _failed(step, f"look for overlapping {_plural(source)}")
        return
    artifact, count = step.result["artifact_id"], step.result["count"]
    if count == 0:
        yield TextDelta(f"No {source} overlaps a {target}.")
        return
    yield TextDelta(
        f"{count} {source if count == 1 else _plural(source)} overlap a {target}.\n"
        f'<tool type="highlight" data="${{{artifact}}}">{_plural(source).capitalize()} overlapping a {target}</tool>'
    )


# --- extremes --------------------------------------------------------------------------------


def _extreme(s: Situation, match: re.Match[str]) -> Iterator[AgentChunk]:
    which, word = match["which"], match["cls"]
    category = _class_of(word, s.overview)
    if category is None:
        yield from _unknown_class(s, word)
        return
    by_length = which in {"longest", "shortest"}
    measure = "length_m" if by_length else "area_m2"
    descending = which in {"largest", "biggest", "longest"}
    done = s.calls("query_annotations")
    if not done:
        yield Thinking(f"Finding the {which} {category}.")
        yield _call(
            s,
            "query_annotations",
            {"class": category, "order_by": ("-" if descending else "") + measure, "limit": 1},
        )
        return
    step = done[-1]
    if not step.ok:
        yield from _failed(step, f"find the {which} {category}")
        return
    rows = step.result.get("annotations") or []
    if not rows:
        yield TextDelta(f"There is no {category} to compare.")
        return
    row = rows[0]
    value = (
        f'<distance value="{_num(row["length_m"])}" /> long'
        if by_length
        else f'an area of <area value="{_num(row["area_m2"])}" />'
    )
    yield TextDelta(f'The {which} {category} is <ref id="{row["id"]}" />, with {value}.')


def _clarify(s: Situation) -> Iterator[AgentChunk]:
    options = []
    for category, noun in (
        ("house", "houses"),
        ("pool", "pools"),
        ("road", "roads"),
        ("tree", "trees"),
    ):
        if category in s.overview:
            measure = "longest" if category == "road" else "largest"
            options.append(
                f'  <option message="Which is the {measure} {category}?">The {measure} {noun}</option>'
            )
    options.append('  <option message="Never mind.">Neither</option>')
    yield TextDelta(
        f'<question id="{BIG_QUESTION_ID}">\n  <header>Please clarify, which big ones do you mean?</header>\n'
        + "\n".join(options)
        + "\n</question>"
    )


# --- similarity ------------------------------------------------------------------------------


def _similar(s: Situation, match: re.Match[str]) -> Iterator[AgentChunk]:
    category = _class_of(match["cls"], s.overview)
    ids = _ids(match[2])
    samples = [{"id": i} for i in ids]
    data = json.dumps({"hint": category or match["cls"], "samples": samples})
    chips = " and ".join(f"<id>{i}</id>" for i in ids)
    noun = _plural(category) if category else "annotations"
    yield TextDelta(
        f"Here is a similarity search for {noun} like {chips}.\n"
        f"<tool type=\"find-similar\" data='{data}'>Find other {noun} similar to {chips}.</tool>"
    )


def _similar_found(s: Situation, attrs: dict[str, str]) -> Iterator[AgentChunk]:
    selection = s.request.context("selection")
    data = selection.data if selection is not None else None
    found = data.get("ids", []) if isinstance(data, dict) else []
    category = attrs.get("class-id", "annotation")
    if not found or selection is None:
        yield TextDelta(f"The similarity search found no other {_plural(category)}.")
        return
    artifact = selection.artifact_id
    refs = ", ".join(f'<ref id="{i}" />' for i in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    yield TextDelta(
        f"The search located {len(found)} similar {category if len(found) == 1 else _plural(category)}: {refs}{more}.\n"
        f'<tool type="highlight" data="${{{artifact}}}">Similar {_plural(category)}</tool>'
    )


# --- deletion --------------------------------------------------------------------------------


def _delete(s: Situation, match: re.Match[str]) -> Iterator[AgentChunk]:
    ids = _ids(match[1])
    label = ", ".join(str(i) for i in ids)
    noun = "annotation" if len(ids) == 1 else "annotations"
    done = s.calls("delete_annotations")
    if not done:
        yield Thinking(f"Deleting {noun} {label}; this needs your approval.")
        yield _call(s, "delete_annotations", {"ids": ids})
        return
    step = done[-1]
    if not step.ok:
        yield from _failed(step, f"delete {noun} {label}")
        return
    deleted = step.result.get("deleted", [])
    refs = ", ".join(f"<id>{i}</id>" for i in deleted)
    text = f"Deleted {refs}. An administrator can restore {'it' if len(deleted) == 1 else 'them'}."
    if step.result.get("not_found"):
        text += " Not found: " + ", ".join(str(i) for i in step.result["not_found"]) + "."
    yield TextDelta(text)


# --- the map's client tools ------------------------------------------------------------------


def _focus(s: Situation, match: re.Match[str]) -> Iterator[AgentChunk]:
    ids = _ids(match[1])
    chips = ", ".join(f'<ref id="{i}" />' for i in ids)
    if "map_focus" not in s.tools:
        yield TextDelta(f"Click {chips} to see {'it' if len(ids) == 1 else 'them'} on the map.")
        return
    if not s.calls("map_focus"):
        yield _call(s, "map_focus", {"ids": ids})
        return
    yield TextDelta(f"The map now shows {chips}.")


def _map_view(s: Situation) -> Iterator[AgentChunk]:
    if "map_get_view" not in s.tools:
        yield TextDelta("I can't read the map's view from this client.")
        return
    done = s.calls("map_get_view")
    if not done:
        yield _call(s, "map_get_view", {})
        return
    view = done[-1].result
    if "error" in view:
        yield TextDelta(f"I could not read the map's view: {view['error']}")
        return
    center = view.get("center") or {}
    classes = ", ".join(view.get("visible_classes") or []) or "none"
    yield TextDelta(
        f"The map is centred on {_latlon(center.get('lat'), center.get('lon'), 50)} at zoom "
        f"{view.get('zoom')}; visible classes: {classes}."
    )


def _select(s: Situation) -> Iterator[AgentChunk]:
    if "map_select" not in s.tools:
        yield TextDelta("Picking annotations on the map needs the GeoSense page.")
        return
    done = s.calls("map_select")
    if not done:
        yield _call(s, "map_select", {"prompt": "Click the annotations you mean, then confirm."})
        return
    result = done[-1].result
    ids = result.get("ids") if isinstance(result, dict) else None
    if not ids:
        yield TextDelta(
            "You did not pick any annotation."
            if "error" not in result
            else f"No selection: {result['error']}"
        )
        return
    refs = ", ".join(f'<ref id="{i}" />' for i in ids)
    yield TextDelta(f"You picked {len(ids)} annotation{'s' if len(ids) != 1 else ''}: {refs}.")


def _context_data(s: Situation, kind: str) -> dict[str, Any]:
    attached = s.request.context(kind)
    return attached.data if attached is not None and isinstance(attached.data, dict) else {}


def _see_answered(s: Situation, index: str | None) -> Iterator[AgentChunk]:
    position = _context_data(s, "position")
    visibility = _context_data(s, "visibility")
    if index != "0" or not position:
        yield TextDelta("No problem, I won't look at your view.")
        return
    bounds = position.get("bounds")
    done = s.calls("list_classes")
    if not done and bounds:
        yield Thinking("Counting what is inside your view.")
        yield _call(s, "list_classes", {"bbox": bounds})
        return
    visible = set(visibility.get("classes") or s.overview)
    center = position.get("center") or {}
    where = f"Your view is centred on {_latlon(center.get('lat'), center.get('lon'), 50)} at zoom {position.get('zoom')}."
    if not done or not done[-1].ok:
        yield TextDelta(
            where
            + (f" I could not count what is in it: {done[-1].result.get('error')}" if done else "")
        )
        return
    counts = {c: n for c, n in done[-1].result.get("counts", {}).items() if c in visible}
    hidden = sorted(set(done[-1].result.get("counts", {})) - visible)
    listing = (
        ", ".join(f"{n} {c if n == 1 else _plural(c)}" for c, n in sorted(counts.items()))
        or "nothing"
    )
    text = f"{where} In it you can see {listing}."
    if hidden:
        text += " Hidden classes: " + ", ".join(hidden) + "."
    yield TextDelta(text)


# --- location --------------------------------------------------------------------------------

ASK_PLACE = "Which place should I use instead? Name a street or an annotation id."


def _latlon(lat: Any, lon: Any, accuracy: float) -> str:
    if not isinstance(lat, int | float) or not isinstance(lon, int | float):
        return "an unknown place"
    # No false precision: ~1 decimal of a degree is 11 km, 4 decimals about 11 m.
    decimals = 5 if accuracy < 10 else 4 if accuracy < 100 else 3 if accuracy < 1000 else 2
    return f"{abs(lat):.{decimals}f}° {'N' if lat >= 0 else 'S'}, {abs(lon):.{decimals}f}° {'E' if lon >= 0 else 'W'}"


def _location(s: Situation, *, then_nearest: bool) -> Iterator[AgentChunk]:
    if "location_get" not in s.tools:
        yield TextDelta("This client can't share your location with me. " + ASK_PLACE)
        return
    attempts = s.calls("location_get")
    if not attempts:
        yield Thinking("Asking your browser for your location.")
        yield _call(s, "location_get", {})
        return
    result = attempts[-1].result
    status = result.get("status")
    if status == "PENDING":
        if len(attempts) < MAX_LOCATION_ATTEMPTS:
            yield Thinking("The location permission is still open; asking once more.")
            yield _call(s, "location_get", {})
            return
        yield TextDelta(
            "I still don't have your location: the permission request hasn't been answered. "
            + ASK_PLACE
        )
        return
    if status == "DECLINED":
        yield TextDelta("No problem, you chose not to share your location. " + ASK_PLACE)
        return
    if status != "GRANTED":
        reason = result.get("message") or result.get("error") or "it is not available"
        yield TextDelta(f"I can't get your location ({reason}). {ASK_PLACE}")
        return
    lat, lon, accuracy = (
        result.get("latitude"),
        result.get("longitude"),
        float(result.get("accuracy") or 0),
    )
    where = f"You are at about {_latlon(lat, lon, accuracy)} (within about {accuracy:.0f} m)."
    if not then_nearest:
        yield TextDelta(where)
        return
    done = s.calls("nearest_annotations")
    if not done:
        yield Thinking("Looking up the annotations nearest to you.")
        yield _call(s, "nearest_annotations", {"lat": lat, "lon": lon, "k": 5})
        return
    if not done[-1].ok:
        yield TextDelta(
            where + " " + next(iter(_failed(done[-1], "look up what is near you"))).text
        )
        return
    hits = done[-1].result.get("nearest", [])
    listing = "; ".join(
        f'{h["class"]} <ref id="{h["id"]}" /> at <distance value="{_num(h["distance_m"])}" />'
        for h in hits
    )
    yield TextDelta(f"{where} Nearest: {listing or 'nothing'}.")
