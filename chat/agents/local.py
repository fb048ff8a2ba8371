"""The local agent: deterministic and offline, documented in docs/local-agent.md.

It decides every step from what the engine stores (the request the turn answers, with its
contexts and the dataset overview handed over as data, and the tool results after the request
in the history), so a turn paused for an approval resumes in any process. It reads the request
with `local_reading` (tolerant of wording), uses the same tools, blocks and approvals as an LLM
would, streams its text in small deltas, and words every answer for a person: class names as
words ("solar panels"), counts that agree ("1 tree"), and failures without the technical text
that the tool results carry for a model.
"""

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from chat.markup import Answer, Response, parse_message
from geosense.annotations.classes import class_label as label
from geosense.annotations.classes import class_noun as noun
from geosense.annotations.classes import class_plural as plural
from geosense.annotations.classes import with_article as a
from tools.client import UNREACHABLE, WENT_AWAY
from tools.wording import listing

from . import local_reading as reading
from .base import AgentChunk, AgentContext, TextDelta, Thinking, ToolCallRequest, UserRequest

SEE_QUESTION_ID = "q-view"
BIG_QUESTION_ID = "q-big"
MAX_LOCATION_ATTEMPTS = 2  # one retry after PENDING at most
CLARIFY_OPTIONS_MAX = 4
ASK_PLACE = "Which place should I use instead? Name a street or an annotation id."


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
    text: str  # what the user asks: an <answer>'s message, or the text as written
    request: UserRequest
    answer: Answer | None
    response: Response | None
    steps: list[Step]
    overview: Mapping[str, int]
    shapes: Mapping[str, str]
    tools: frozenset[str]
    call_seq: int

    def calls(self, name: str) -> list[Step]:
        return [s for s in self.steps if s.name == name]


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
    raw = context.request.text.strip()
    user_blocks = parse_message(raw, artifacts={}, role="user")
    answer = next((b for b in user_blocks if isinstance(b, Answer)), None)
    response = next((b for b in user_blocks if isinstance(b, Response)), None)
    return Situation(
        text=answer.message if answer is not None else raw,
        request=context.request,
        answer=answer,
        response=response,
        steps=steps,
        overview=dict(context.overview),
        shapes=dict(context.shapes),
        tools=names,
        # Every call of the session so far, so the next call id is new in the whole history.
        call_seq=sum(len(m.get("tool_calls") or []) for m in history),
    )


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


# --- words -----------------------------------------------------------------------------------


def counted(n: int, category: str) -> str:
    """ "1 tree", "1,204 solar panels"."""
    return f"{n:,} {noun(category, n)}"


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _refs(ids: Iterable[int]) -> str:
    return listing(f'<ref id="{i}" />' for i in ids)


def _it(n: int) -> str:
    return "it" if n == 1 else "them"


def _by_count(s: Situation) -> list[str]:
    return sorted(s.overview, key=lambda c: (-s.overview[c], c))


def _measurable(s: Situation) -> list[str]:
    """Classes with a size to compare (areas first, then lengths), most common first."""
    ranked = _by_count(s)
    return [c for c in ranked if s.shapes.get(c, "polygon") in ("polygon", "mixed")] + [
        c for c in ranked if s.shapes.get(c) == "line"
    ]


# --- deciding --------------------------------------------------------------------------------


def decide(s: Situation) -> Iterator[AgentChunk]:
    """The next step for this situation: text, or a thought and a tool call."""
    if s.answer is not None and s.answer.question_id == SEE_QUESTION_ID:
        yield from _see_answered(s)
        return
    if s.response is not None:
        yield from _similar_found(s)
        return
    intent = reading.read(s.text, s.overview)
    handler = _HANDLERS.get(type(intent))
    if handler is None:
        yield TextDelta(
            "I'm the built-in local assistant, so I only understand a fixed set of requests. "
            + _capabilities(s)
        )
        return
    yield from handler(s, intent)


def _capabilities(s: Situation) -> str:
    """What it can do, with examples from the classes of this dataset."""
    ranked = _by_count(s) or ["tree", "house"]
    first, second = ranked[0], (ranked[1] if len(ranked) > 1 else ranked[0])
    areas = [c for c in _measurable(s) if s.shapes.get(c, "polygon") != "line"] or ["house"]
    lines = [c for c in _measurable(s) if s.shapes.get(c) == "line"]
    extremes = f"“which is the largest {label(areas[0])}?”"
    if lines:
        extremes += f", “the longest {label(lines[0])}”"
    overlaps = (
        f"“{plural(areas[1])} overlapping {a(areas[0])}”"
        if len(areas) > 1
        else f"“{plural(first)} overlapping {a(second)}”"
    )
    return (
        "I can answer these about the annotations on the map:\n"
        f"- counts: “how many {plural(first)} are there?”\n"
        f"- distances: “{plural(first)} within 20 m of {a(second)}”, “{plural(first)} near "
        f"{plural(second)}”\n"
        f"- overlaps: {overlaps}\n"
        f"- sizes: {extremes}, “the 3 smallest {plural(areas[0])}”\n"
        f"- one annotation: “how big is annotation 12?”, “focus on annotation 12”\n"
        f"- similarity: “find {plural(areas[0])} similar to 25”\n"
        "- deletion: “delete annotation 12” (asks for your approval)\n"
        "- the map: “what can I see?”, “let me pick annotations”\n"
        "- your location: “where am I?”, “what is near me?”"
    )


def _declined(step: Step) -> bool:
    message = str(step.result.get("error", "")).lower()
    return "declined" in message or "set aside" in message


def _why(step: Step) -> str:
    """A failed call's reason as a person reads it (the result's text is the model's)."""
    error = str(step.result.get("error", ""))
    if error == WENT_AWAY:
        return "the page closed or reloaded before it answered"
    if error == UNREACHABLE:
        return "I could not reach your browser"
    if error.startswith("No answer from the client"):
        return "your browser did not answer in time"
    if error.startswith("The client refused"):
        return "your browser could not do it"
    if error.startswith("The client's answer"):
        return "your browser's answer did not make sense to me"
    if "already answered" in error:
        return "I already asked several times in this turn"
    if error.startswith(("Invalid arguments", "Refused before running")) or "internal error" in (
        error
    ):
        if "credits" in error.lower():
            return "there are not enough credits for it"
        return "something went wrong on my side"
    return error.rstrip(".") or "it did not work"


def _failed(step: Step, doing: str) -> str:
    if _declined(step):
        return f"Understood, I did not {doing}."
    return f"I could not {doing}: {_why(step)}."


def _unknown_class(s: Situation, intent: reading.UnknownClass) -> Iterator[AgentChunk]:
    known = listing(plural(c) for c in sorted(s.overview)) or "none yet"
    yield TextDelta(
        f"I don't see any “{intent.word}” here. The annotations on this map are {known}."
    )


# --- counts ----------------------------------------------------------------------------------


def _count(s: Situation, intent: reading.Count) -> Iterator[AgentChunk]:
    if intent.category is None:
        total = sum(s.overview.values())
        parts = listing(counted(n, c) for c, n in sorted(s.overview.items()))
        if total == 0:
            yield TextDelta("There are no annotations on the map yet.")
            return
        yield TextDelta(f"There are {total:,} annotations: {parts}.")
        return
    n = s.overview[intent.category]
    yield TextDelta(f"There {'is' if n == 1 else 'are'} {counted(n, intent.category)}.")


# --- spatial relations -----------------------------------------------------------------------


def _within(s: Situation, intent: reading.Within) -> Iterator[AgentChunk]:
    source, target, distance = intent.source, intent.target, intent.distance_m
    done = s.calls("spatial_relation")
    if not done:
        yield Thinking(f"Looking for {plural(source)} within {_num(distance)} m of {a(target)}.")
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
        yield TextDelta(_failed(step, f"look for {plural(source)} near {plural(target)}"))
        return
    artifact, count = step.result["artifact_id"], step.result["count"]
    length = f'<distance value="{_num(distance)}" />'
    assumed = f"I took “{intent.assumed}” to mean within {length}. " if intent.assumed else ""
    if count == 0:
        yield TextDelta(f"{assumed}No {label(source)} is within {length} of {a(target)}.")
        return
    yield TextDelta(
        f"{assumed}I found {counted(count, source)} within {length} of {a(target)}.\n"
        f'<tool type="highlight" data="${{{artifact}}}">{plural(source).capitalize()} within '
        f"{length} of {a(target)}</tool>\n"
        f'The closest is <ref id="${{{artifact}.ids.0}}" />, '
        f'<size value="${{{artifact}.linkValues.0}}" /> from <ref id="${{{artifact}.links.0}}" />.'
    )


def _overlap(s: Situation, intent: reading.Overlap) -> Iterator[AgentChunk]:
    source, target = intent.source, intent.target
    done = s.calls("spatial_relation")
    if not done:
        yield Thinking(f"Looking for {plural(source)} that overlap {a(target)}.")
        yield _call(
            s, "spatial_relation", {"relation": "overlap", "source": source, "target": target}
        )
        return
    step = done[-1]
    if not step.ok:
        yield TextDelta(_failed(step, f"look for {plural(source)} overlapping {plural(target)}"))
        return
    artifact, count = step.result["artifact_id"], step.result["count"]
    if count == 0:
        yield TextDelta(f"No {label(source)} overlaps {a(target)}.")
        return
    verb = "overlaps" if count == 1 else "overlap"
    yield TextDelta(
        f"{counted(count, source)} {verb} {a(target)}.\n"
        f'<tool type="highlight" data="${{{artifact}}}">{plural(source).capitalize()} '
        f"overlapping {a(target)}</tool>"
    )


# --- sizes -----------------------------------------------------------------------------------


def _extreme(s: Situation, intent: reading.Extreme) -> Iterator[AgentChunk]:
    category, which, n = intent.category, intent.which, intent.n
    shape = s.shapes.get(category, "polygon")
    if shape == "point":
        others = [c for c in _measurable(s) if c != category]
        hint = f", or ask for the largest {label(others[0])}" if others else ""
        yield TextDelta(
            f"{plural(category).capitalize()} are drawn as points, so they have no area or "
            f"length to compare. I can count them or find them near other annotations "
            f"(“{plural(category)} within 20 m of {a(others[0] if others else category)}”){hint}."
        )
        return
    by_length = which in ("longest", "shortest") or shape == "line"
    descending = which in ("largest", "longest")
    measure = "length_m" if by_length else "area_m2"
    done = s.calls("query_annotations")
    if not done:
        yield Thinking(f"Finding the {_superlative(which, shape, n)} {noun(category, n)}.")
        yield _call(
            s,
            "query_annotations",
            {"class": category, "order_by": ("-" if descending else "") + measure, "limit": n},
        )
        return
    step = done[-1]
    if not step.ok:
        yield TextDelta(_failed(step, f"compare the {plural(category)}"))
        return
    rows = step.result.get("annotations") or []
    if not rows:
        yield TextDelta(f"There is no {label(category)} to compare.")
        return
    yield TextDelta(_extreme_text(category, which, shape, rows))


def _superlative(which: str, shape: str, n: int) -> str:
    if shape == "line" and which in ("largest", "smallest"):
        which = "longest" if which == "largest" else "shortest"
    return which if n == 1 else f"{n} {which}"


def _value(row: dict[str, Any], *, by_length: bool, perimeter: bool) -> str:
    if not by_length:
        return f'<area value="{_num(row["area_m2"])}" />'
    length = f'<distance value="{_num(row["length_m"])}" />'
    return f"{length} around" if perimeter else f"{length} long"


def _extreme_text(category: str, which: str, shape: str, rows: list[dict[str, Any]]) -> str:
    lines = shape == "line"
    by_length = which in ("longest", "shortest") or lines
    perimeter = by_length and not lines
    word = _superlative(which, shape, 1)
    note = ""
    if lines and which in ("largest", "smallest"):
        note = f"{plural(category).capitalize()} are lines, so I compared their lengths. "
    elif perimeter:
        note = f"{plural(category).capitalize()} are areas, so I compared their outlines. "
    if len(rows) == 1:
        row = rows[0]
        ref = f'<ref id="{row["id"]}" />'
        if not by_length:
            return f"{note}The {word} {label(category)} is {ref}, with an area of {_value(row, by_length=False, perimeter=False)}."
        if perimeter:
            return f"{note}The {label(category)} with the {word} outline is {ref}, {_value(row, by_length=True, perimeter=True)}."
        return f"{note}The {word} {label(category)} is {ref}, {_value(row, by_length=True, perimeter=False)}."
    items = listing(
        f'<ref id="{r["id"]}" /> ({_value(r, by_length=by_length, perimeter=perimeter)})'
        for r in rows
    )
    ids = json.dumps({"ids": [r["id"] for r in rows]})
    heading = f"The {_superlative(which, shape, len(rows))} {plural(category)}"
    return f"{note}{heading}: {items}.\n<tool type=\"highlight\" data='{ids}'>{heading}</tool>"


def _clarify(s: Situation, intent: reading.Ambiguous) -> Iterator[AgentChunk]:
    """Options only for what can be answered: the largest of a class with areas, the longest
    of a class of lines (one of them at least, when there is one); never a class of points."""
    measurable = _measurable(s)
    lines = [c for c in measurable if s.shapes.get(c) == "line"][:1]
    areas = [c for c in measurable if c not in lines][: CLARIFY_OPTIONS_MAX - len(lines)]
    options = []
    for category in areas + lines:
        which = "longest" if category in lines else "largest"
        options.append(
            f'  <option message="Which is the {which} {label(category)}?">'
            f"The {which} {label(category)}</option>"
        )
    if not options:
        yield TextDelta(
            "The annotations here are all points, so none is bigger than another. "
            + _capabilities(s)
        )
        return
    options.append('  <option message="Never mind.">Neither</option>')
    yield TextDelta(
        f'<question id="{BIG_QUESTION_ID}">\n'
        "  <header>Which big ones do you mean?</header>\n" + "\n".join(options) + "\n</question>"
    )


# --- one annotation --------------------------------------------------------------------------


def _measure(s: Situation, intent: reading.Measure) -> Iterator[AgentChunk]:
    done = s.calls("measure")
    if not done:
        yield Thinking(f"Measuring annotation {intent.id}.")
        yield _call(s, "measure", {"id": intent.id})
        return
    step = done[-1]
    if not step.ok:
        yield TextDelta(_failed(step, f"measure annotation {intent.id}"))
        return
    m = step.result
    ref, what = f'<ref id="{m["id"]}" />', a(str(m.get("class", "annotation")))
    if m.get("area_m2"):
        size = (
            f'It has an area of <area value="{_num(m["area_m2"])}" /> and its outline is '
            f'<distance value="{_num(m.get("perimeter_m") or m.get("length_m") or 0)}" /> long.'
        )
    elif m.get("length_m"):
        size = f'It is <distance value="{_num(m["length_m"])}" /> long.'
    else:
        size = "It is a point, so it has no area or length."
    centre = m.get("centroid") or {}
    where = _latlon(centre.get("lat"), centre.get("lon"), 50)
    yield TextDelta(f"{ref} is {what} at about {where}. {size}")


# --- similarity ------------------------------------------------------------------------------


def _similar(s: Situation, intent: reading.Similar) -> Iterator[AgentChunk]:
    data: dict[str, Any] = {"samples": [{"id": i} for i in intent.ids]}
    if intent.category is not None:
        data = {"hint": intent.category, **data}
    chips = listing(f"<id>{i}</id>" for i in intent.ids)
    things = plural(intent.category) if intent.category else "annotations"
    yield TextDelta(
        f"Here is a similarity search for {things} like {chips}.\n"
        f"<tool type=\"find-similar\" data='{json.dumps(data)}'>Find other {things} similar to "
        f"{chips}.</tool>"
    )


def _similar_found(s: Situation) -> Iterator[AgentChunk]:
    selection = s.request.context("selection")
    data = selection.data if selection is not None else None
    found = data.get("ids", []) if isinstance(data, dict) else []
    response = s.response
    category = (response.class_id if response is not None else "") or "annotation"
    if not found or selection is None:
        yield TextDelta(f"The similarity search found no other {plural(category)}.")
        return
    refs = ", ".join(f'<ref id="{i}" />' for i in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    yield TextDelta(
        f"The search located {len(found):,} similar {noun(category, len(found))}: {refs}{more}.\n"
        f'<tool type="highlight" data="${{{selection.artifact_id}}}">Similar '
        f"{plural(category)}</tool>"
    )


# --- deletion --------------------------------------------------------------------------------


def _delete(s: Situation, intent: reading.Delete) -> Iterator[AgentChunk]:
    ids = list(intent.ids)
    what = f"annotation {ids[0]}" if len(ids) == 1 else f"annotations {listing(map(str, ids))}"
    done = s.calls("delete_annotations")
    if not done:
        yield Thinking(f"Deleting {what}; this needs your approval.")
        yield _call(s, "delete_annotations", {"ids": ids})
        return
    step = done[-1]
    if not step.ok:
        yield TextDelta(_failed(step, f"delete {what}"))
        return
    deleted = step.result.get("deleted", [])
    text = f"Deleted {_refs(deleted)}. An administrator can restore {_it(len(deleted))}."
    missing = step.result.get("not_found") or []
    if missing:
        text += f" {listing(f'#{i}' for i in missing)} {'was' if len(missing) == 1 else 'were'} not found."
    yield TextDelta(text)


def _delete_without_ids(s: Situation, intent: reading.DeleteWithoutIds) -> Iterator[AgentChunk]:
    yield TextDelta(
        "I only delete annotations by their ids, so that nothing goes by mistake. Name them, "
        "for example “delete annotation 12” or “delete annotations 3, 4 and 5”."
    )


# --- the map's page tools --------------------------------------------------------------------


def _focus(s: Situation, intent: reading.Focus) -> Iterator[AgentChunk]:
    ids = list(intent.ids)
    if "map_focus" not in s.tools:
        yield TextDelta(f"Click {_refs(ids)} to see {_it(len(ids))} on the map.")
        return
    if not s.calls("map_focus"):
        yield _call(s, "map_focus", {"ids": ids})
        return
    yield TextDelta(f"The map now shows {_refs(ids)}.")


def _map_view(s: Situation, intent: reading.MapView) -> Iterator[AgentChunk]:
    if "map_get_view" not in s.tools:
        yield TextDelta("I can't read the map's view from this client.")
        return
    done = s.calls("map_get_view")
    if not done:
        yield _call(s, "map_get_view", {})
        return
    if not done[-1].ok:
        yield TextDelta(_failed(done[-1], "read the map's view"))
        return
    view = done[-1].result
    center = view.get("center") or {}
    text = (
        f"The map is centred on {_latlon(center.get('lat'), center.get('lon'), 50)} at zoom "
        f"{_num(float(view.get('zoom') or 0))}"
    )
    visible = view.get("visible_classes")
    if isinstance(visible, list):
        shown = listing(plural(str(c)) for c in visible)
        text += f"; it shows {shown}" if shown else "; every class is hidden"
    yield TextDelta(text + ".")


def _select(s: Situation, intent: reading.Select) -> Iterator[AgentChunk]:
    if "map_select" not in s.tools:
        yield TextDelta("Picking annotations on the map needs the GeoSense page.")
        return
    done = s.calls("map_select")
    if not done:
        yield _call(s, "map_select", {"prompt": "Click the annotations you mean, then confirm."})
        return
    if not done[-1].ok:
        yield TextDelta(_failed(done[-1], "take your selection"))
        return
    ids = done[-1].result.get("ids")
    if not ids:
        yield TextDelta("You did not pick any annotation.")
        return
    yield TextDelta(
        f"You picked {len(ids)} annotation{'' if len(ids) == 1 else 's'}: {_refs(ids)}."
    )


def _see_view(s: Situation, intent: reading.SeeView) -> Iterator[AgentChunk]:
    yield TextDelta(
        f'<question id="{SEE_QUESTION_ID}">\n'
        "  <header>I'm not sure what you can see, let me take a look</header>\n"
        '  <option message="Here\'s the viewport data." context="visibility position">Allow</option>\n'
        '  <option message="No, I don\'t want to do that.">Deny</option>\n'
        "</question>"
    )


def _context_data(s: Situation, kind: str) -> dict[str, Any]:
    attached = s.request.context(kind)
    return attached.data if attached is not None and isinstance(attached.data, dict) else {}


def _see_answered(s: Situation) -> Iterator[AgentChunk]:
    position = _context_data(s, "position")
    visibility = _context_data(s, "visibility")
    if s.answer is None or s.answer.option_index != 0 or not position:
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
    where = (
        f"Your view is centred on {_latlon(center.get('lat'), center.get('lon'), 50)} "
        f"at zoom {_num(float(position.get('zoom') or 0))}."
    )
    if not done:
        yield TextDelta(where)
        return
    if not done[-1].ok:
        yield TextDelta(f"{where} {_failed(done[-1], 'count what is in it')}")
        return
    counts = {c: n for c, n in done[-1].result.get("counts", {}).items() if c in visible}
    hidden = sorted(set(done[-1].result.get("counts", {})) - visible)
    seen = listing(counted(n, c) for c, n in sorted(counts.items())) or "nothing"
    text = f"{where} In it you can see {seen}."
    if hidden:
        text += f" Hidden classes: {listing(plural(c) for c in hidden)}."
    yield TextDelta(text)


# --- location --------------------------------------------------------------------------------


def _latlon(lat: Any, lon: Any, accuracy: float) -> str:
    if not isinstance(lat, int | float) or not isinstance(lon, int | float):
        return "an unknown place"
    # No false precision: ~1 decimal of a degree is 11 km, 4 decimals about 11 m.
    decimals = 5 if accuracy < 10 else 4 if accuracy < 100 else 3 if accuracy < 1000 else 2
    return f"{abs(lat):.{decimals}f}° {'N' if lat >= 0 else 'S'}, {abs(lon):.{decimals}f}° {'E' if lon >= 0 else 'W'}"


def _location(s: Situation, intent: reading.Location) -> Iterator[AgentChunk]:
    if "location_get" not in s.tools:
        yield TextDelta("This client can't share your location with me. " + ASK_PLACE)
        return
    attempts = s.calls("location_get")
    if not attempts:
        yield Thinking("Asking your browser for your location.")
        yield _call(s, "location_get", {})
        return
    last = attempts[-1]
    status = last.result.get("status")
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
        # The page's message is written for a model ("… Do not retry."): its first sentence
        # says what happened.
        message = str(last.result.get("message") or "") if status else ""
        reason = re.split(r"(?<=[.!?])\s", message.strip())[0].rstrip(".") if message else ""
        yield TextDelta(f"I can't get your location: {reason or _why(last)}. {ASK_PLACE}")
        return
    lat, lon = last.result.get("latitude"), last.result.get("longitude")
    accuracy = float(last.result.get("accuracy") or 0)
    where = f"You are at about {_latlon(lat, lon, accuracy)} (within about {accuracy:.0f} m)."
    if not intent.nearest:
        yield TextDelta(where)
        return
    done = s.calls("nearest_annotations")
    if not done:
        yield Thinking(
            f"Looking up the {plural(intent.category) if intent.category else 'annotations'} "
            "nearest to you."
        )
        arguments: dict[str, Any] = {"lat": lat, "lon": lon, "k": 5}
        if intent.category is not None:
            arguments["class"] = intent.category
        yield _call(s, "nearest_annotations", arguments)
        return
    if not done[-1].ok:
        yield TextDelta(f"{where} {_failed(done[-1], 'look up what is near you')}")
        return
    hits = done[-1].result.get("nearest", [])
    nearest = "; ".join(
        f'{label(h["class"])} <ref id="{h["id"]}" /> at <distance value="{_num(h["distance_m"])}" />'
        for h in hits
    )
    yield TextDelta(f"{where} Nearest: {nearest or 'nothing'}.")


# --- the rest --------------------------------------------------------------------------------


def _help(s: Situation, intent: reading.Help) -> Iterator[AgentChunk]:
    yield TextDelta(_capabilities(s))


def _dismiss(s: Situation, intent: reading.Dismiss) -> Iterator[AgentChunk]:
    yield TextDelta("All right. Ask me whenever you like.")


_HANDLERS: dict[type, Any] = {
    reading.Count: _count,
    reading.Within: _within,
    reading.Overlap: _overlap,
    reading.Extreme: _extreme,
    reading.Similar: _similar,
    reading.Delete: _delete,
    reading.DeleteWithoutIds: _delete_without_ids,
    reading.Focus: _focus,
    reading.Measure: _measure,
    reading.Location: _location,
    reading.SeeView: _see_view,
    reading.MapView: _map_view,
    reading.Select: _select,
    reading.Ambiguous: _clarify,
    reading.UnknownClass: _unknown_class,
    reading.Help: _help,
    reading.Dismiss: _dismiss,
}
