"""What the local agent understands, phrased the many ways people write it.

One table of phrasings, each with what it must lead to. The agent is driven through its public
`stream` with the tools it would get in a turn; backend tools run for real on a seeded
neighbourhood, page tools answer from the table; every answer is checked against the
annotations services (counts, pairs, orderings, nearest hits), and every text against the
wording rules a person reads (no class ids with underscores, no "1 trees", no "with 268 m long").
"""

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from chat.agents import AgentContext, AttachedContext, TextDelta, ToolCallRequest, UserRequest
from chat.agents.local import LocalAgent
from chat.markup import FindSimilarBlock, HighlightBlock, QuestionBlock, parse_message
from geosense.annotations.selectors import (
    annotation_list,
    annotation_measures,
    annotation_overview,
    annotations_nearest,
    annotations_overlapping,
    annotations_similar_by_hint,
    annotations_within_distance,
)
from geosense.annotations.services import demo_seed
from geosense.fields import json_text
from tools.client import UNREACHABLE, WENT_AWAY
from tools.registry import ToolError, backend_tool, backend_tools

pytestmark = pytest.mark.django_db

PAGE_TOOLS = ("location_get", "map_focus", "map_get_view", "map_select")


# --- a conversation with the agent -----------------------------------------------------------


@dataclass
class Conversation:
    text: str
    calls: list[tuple[str, dict[str, Any]]]
    artifacts: dict[str, Any]
    pending: str | None = None  # a call the table did not answer (destructive, reader-answered)

    def blocks(self) -> list[Any]:
        return parse_message(self.text, artifacts=self.artifacts)

    def block(self, kind: type) -> Any:
        found = [b for b in self.blocks() if isinstance(b, kind)]
        assert found, f"no {kind.__name__} in {self.text!r}"
        return found[0]

    def prose(self) -> str:
        """The text as a person reads it: tags and placeholders out."""
        return re.sub(r"<[^>]*>|\$\{[^}]*\}", " ", self.text)


def _tool_specs() -> list[dict[str, Any]]:
    specs = [t.openai_spec() for t in backend_tools()]
    for name in PAGE_TOOLS:
        specs.append(
            {"type": "function", "function": {"name": name, "description": "", "parameters": {}}}
        )
    return specs


async def _stream(agent, history, tools, context) -> list[Any]:
    return [chunk async for chunk in agent.stream(history=history, tools=tools, context=context)]


def converse(
    text: str,
    *,
    contexts: tuple[AttachedContext, ...] = (),
    page: dict[str, list[dict[str, Any]]] | None = None,
) -> Conversation:
    """Run the agent on `text` until it answers in text or makes a call the table leaves
    open. `page` answers page tools in order (a list of results per tool name)."""
    overview = annotation_overview()
    page = {name: list(results) for name, results in (page or {}).items()}
    history: list[dict[str, Any]] = [{"role": "user", "content": text}]
    calls: list[tuple[str, dict[str, Any]]] = []
    artifacts: dict[str, Any] = {}

    def save(*, kind: str, data: Any, origin: str) -> str:
        artifact_id = f"{kind}-{len(artifacts) + 1}"
        artifacts[artifact_id] = json.loads(json_text(data))  # as stored (columns may be arrays)
        return artifact_id

    from tools.registry import ToolContext

    for _ in range(8):
        context = AgentContext(
            overview=overview.counts,
            shapes=overview.shapes,
            request=UserRequest(text=text, contexts=contexts),
        )
        chunks = asyncio.run(_stream(LocalAgent(), history, _tool_specs(), context))
        said = "".join(c.text for c in chunks if isinstance(c, TextDelta))
        call = next((c for c in chunks if isinstance(c, ToolCallRequest)), None)
        if call is None:
            return Conversation(said, calls, artifacts)
        arguments = json.loads(call.arguments)
        calls.append((call.name, arguments))
        tool = backend_tool(call.name)
        if tool is not None and not tool.destructive:
            try:
                result = tool.handler(ToolContext(artifact_save=save), arguments)
            except ToolError as exc:
                result = {"error": str(exc)}
        elif page.get(call.name):
            result = page[call.name].pop(0)
        else:
            return Conversation(said, calls, artifacts, pending=call.name)
        history.append(
            {
                "role": "assistant",
                "content": said or None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            }
        )
        history.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    raise AssertionError(f"{text!r}: no answer after 8 steps")


# --- what each phrasing must lead to --------------------------------------------------------


@dataclass(frozen=True)
class World:
    """Ids of the seeded neighbourhood that phrasings may name."""

    ids: dict[str, int] = field(default_factory=dict)


Check = Callable[[Conversation, World], None]


def _plural(n: int, singular: str, plural: str) -> str:
    return f"{n:,} {singular if n == 1 else plural}"


def count(category: str, singular: str, plural: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        n = annotation_overview().counts[category]
        assert not conv.calls, conv.calls
        assert _plural(n, singular, plural) in conv.prose(), conv.text

    return check


def count_all() -> Check:
    def check(conv: Conversation, world: World) -> None:
        counts = annotation_overview().counts
        assert not conv.calls, conv.calls
        assert f"{sum(counts.values()):,} annotations" in conv.text, conv.text
        assert _plural(counts["solar_panel"], "solar panel", "solar panels") in conv.text
        assert _plural(counts["house"], "house", "houses") in conv.text

    return check


def _highlighted(conv: Conversation) -> dict[str, Any]:
    return conv.block(HighlightBlock).data


def within(source: str, target: str, metres: float, noun: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        ((name, arguments),) = conv.calls
        assert name == "spatial_relation", conv.calls
        assert arguments["relation"] == "within_distance"
        assert (arguments["source"], arguments["target"]) == (source, target)
        assert arguments["distance_m"] == pytest.approx(metres, abs=0.01)
        pairs = annotations_within_distance(source=source, target=target, distance_m=metres)
        if len(pairs) == 0:
            assert "No " in conv.text, conv.text
            return
        assert f"{len(pairs):,} {noun}" in conv.prose(), conv.text
        assert _highlighted(conv)["ids"] == pairs.source_ids.tolist()

    return check


def overlap(source: str, target: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        ((name, arguments),) = conv.calls
        assert name == "spatial_relation" and arguments["relation"] == "overlap", conv.calls
        assert (arguments["source"], arguments["target"]) == (source, target)
        pairs = annotations_overlapping(source=source, target=target)
        if not pairs:
            assert conv.text.startswith("No "), conv.text
            return
        assert f"{len(pairs):,} " in conv.prose(), conv.text
        assert _highlighted(conv)["ids"] == [p.source_id for p in pairs]

    return check


def extreme(category: str, order_by: str, n: int = 1) -> Check:
    def check(conv: Conversation, world: World) -> None:
        ((name, arguments),) = conv.calls
        assert name == "query_annotations", conv.calls
        assert arguments == {"class": category, "order_by": order_by, "limit": n}
        rows = annotation_list(category=category, order_by=order_by, limit=n)
        for row in rows:
            assert f'<ref id="{row.id}" />' in conv.text, conv.text
        if n > 1:
            assert _highlighted(conv)["ids"] == [row.id for row in rows]
        measure = order_by.lstrip("-")
        value = getattr(rows[0], measure)
        element = "area" if measure == "area_m2" else "distance"
        shown = re.search(rf'<{element} value="([\d.]+)" />', conv.text)
        assert shown and float(shown[1]) == pytest.approx(value, abs=0.01), conv.text

    return check


def no_measure(plural: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert not conv.calls, conv.calls
        assert f"{plural.capitalize()} are drawn as points" in conv.text, conv.text

    return check


def similar(sample: str | list[str], hint: str | None) -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert not conv.calls, conv.calls
        names = [sample] if isinstance(sample, str) else sample
        ids = [world.ids[name] for name in names]
        block = conv.block(FindSimilarBlock)
        assert block.error is None, block.error
        assert [s["id"] for s in block.data["samples"]] == ids
        assert block.data.get("hint") == hint
        # The block is answerable: the page's search runs on it.
        search = annotations_similar_by_hint(
            samples=[(i, None) for i in ids], hint=block.data.get("hint"), k=5
        )
        assert search.hits

    return check


def delete(*names: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert conv.pending == "delete_annotations", conv
        assert conv.calls == [("delete_annotations", {"ids": [world.ids[n] for n in names]})]

    return check


def focus(name: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert conv.calls[0] == ("map_focus", {"ids": [world.ids[name]]}), conv.calls

    return check


def measure(name: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        annotation_id = world.ids[name]
        assert conv.calls == [("measure", {"id": annotation_id})], conv.calls
        m = annotation_measures(annotation_id=annotation_id)
        assert f'<ref id="{annotation_id}" />' in conv.text
        if m.area_m2:
            assert re.search(r'<area value="([\d.]+)" />', conv.text), conv.text
        if m.length_m:
            assert re.search(r'<distance value="([\d.]+)" />', conv.text), conv.text

    return check


def _granted(world: World) -> dict[str, Any]:
    (house,) = annotation_list(ids=[world.ids["house"]])
    return {
        "status": "GRANTED",
        "latitude": house.centroid_lat,
        "longitude": house.centroid_lon,
        "accuracy": 10,
        "timestamp": 1,
    }


def location(nearest: str | None = None, *, then_nearest: bool = False) -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert conv.calls[0] == ("location_get", {}), conv.calls
        if not then_nearest:
            assert len(conv.calls) == 1 and "You are at about" in conv.text, conv.text
            return
        granted = _granted(world)
        name, arguments = conv.calls[1]
        assert name == "nearest_annotations"
        assert arguments.get("class") == nearest
        hits = annotations_nearest(
            lat=granted["latitude"], lon=granted["longitude"], category=nearest, k=5
        )
        for hit in hits:
            assert f'<ref id="{hit.id}" />' in conv.text, conv.text

    return check


def asks_for_view() -> Check:
    def check(conv: Conversation, world: World) -> None:
        question = conv.block(QuestionBlock)
        assert "position" in question.options[0].context

    return check


def calls(tool: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert conv.calls and conv.calls[0][0] == tool, conv.calls

    return check


def clarifies() -> Check:
    def check(conv: Conversation, world: World) -> None:
        question = conv.block(QuestionBlock)
        shapes = annotation_overview().shapes
        offered = [o.message for o in question.options if o.message != "Never mind."]
        assert offered, question
        for message in offered:
            assert "tree" not in message, f"offers an unanswerable {message!r}"
            follow = converse(message)
            assert follow.calls and follow.calls[0][0] == "query_annotations", message
            category = follow.calls[0][1]["class"]
            measure = follow.calls[0][1]["order_by"].lstrip("-")
            assert (measure == "area_m2") == (shapes[category] == "polygon"), message

    return check


def unknown(word: str) -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert not conv.calls, conv.calls
        assert f"“{word}”" in conv.text and "solar panels" in conv.text, conv.text

    return check


def lists_what_it_can_do() -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert not conv.calls, conv.calls
        assert "how many" in conv.text and "within" in conv.text, conv.text

    return check


def acknowledges() -> Check:
    def check(conv: Conversation, world: World) -> None:
        assert not conv.calls and not conv.blocks()[1:], conv.text
        assert "fixed set" not in conv.text, conv.text

    return check


# The phrasings. `{pool}`, `{house}`, `{road}`, `{tree}`, `{garage}`: ids of the seeded data.
PHRASINGS: list[tuple[str, Check]] = [
    # counts
    ("How many trees are there?", count("tree", "tree", "trees")),
    ("count the trees", count("tree", "tree", "trees")),
    ("Count houses.", count("house", "house", "houses")),
    ("number of pools", count("pool", "pool", "pools")),
    ("how many houses do we have", count("house", "house", "houses")),
    ("what's the tree count?", count("tree", "tree", "trees")),
    ("how many solar panels are there?", count("solar_panel", "solar panel", "solar panels")),
    ("How many swimming pools?", count("pool", "pool", "pools")),
    ("how many homes are there", count("house", "house", "houses")),
    ("total number of garages", count("garage", "garage", "garages")),
    ("are there any sheds?", count("shed", "shed", "sheds")),
    ("how many streets?", count("road", "road", "roads")),
    ("how many annotations are there?", count_all()),
    ("how many things are on the map", count_all()),
    ("what classes are there?", count_all()),
    # within a distance
    ("Show trees within 20 m of a house", within("tree", "house", 20, "trees")),
    ("trees near houses", within("tree", "house", 20, "trees")),
    ("which trees are close to a house?", within("tree", "house", 20, "trees")),
    ("houses within 50 metres of a pool", within("house", "pool", 50, "houses")),
    ("pools less than 10m from a house", within("pool", "house", 10, "pools")),
    ("trees within 0.1 km of the road", within("tree", "road", 100, "trees")),
    ("garages within 15 meters from houses", within("garage", "house", 15, "garages")),
    ("how many trees are within 20 m of a house?", within("tree", "house", 20, "trees")),
    ("trees next to the road", within("tree", "road", 20, "trees")),
    ("solar panels within 40 m of a pool", within("solar_panel", "pool", 40, "solar panels")),
    ("find houses closer than 30 m to a road", within("house", "road", 30, "houses")),
    ("trees within 66 feet of a house", within("tree", "house", 20.1168, "trees")),
    ("sheds nearby pools", within("shed", "pool", 20, "sheds")),
    ("houses that have a pool within 30 m", within("house", "pool", 30, "houses")),
    # overlaps
    ("pools overlapping a house", overlap("pool", "house")),
    ("which garages overlap houses?", overlap("garage", "house")),
    ("solar panels that intersect a house", overlap("solar_panel", "house")),
    ("garages touching a house", overlap("garage", "house")),
    ("solar panels on houses", overlap("solar_panel", "house")),
    # extremes
    ("which is the largest house?", extreme("house", "-area_m2")),
    ("which pool is the smallest?", extreme("pool", "area_m2")),
    ("the biggest pool", extreme("pool", "-area_m2")),
    ("what is the longest road?", extreme("road", "-length_m")),
    ("shortest street", extreme("road", "length_m")),
    ("largest solar panel", extreme("solar_panel", "-area_m2")),
    ("the smallest of the garages", extreme("garage", "area_m2")),
    ("tiniest shed", extreme("shed", "area_m2")),
    ("largest road", extreme("road", "-length_m")),
    ("the 3 largest houses", extreme("house", "-area_m2", 3)),
    ("top five biggest pools", extreme("pool", "-area_m2", 5)),
    ("biggest swimming pool", extreme("pool", "-area_m2")),
    ("largest trees", no_measure("trees")),
    ("which tree is the smallest", no_measure("trees")),
    # similarity
    ("find pools similar to {pool}", similar("pool", "pool")),
    ("find similar pools to {pool}", similar("pool", "pool")),
    ("pools like #{pool}", similar("pool", "pool")),
    ("show me houses that look like {house} and {house2}", similar(["house", "house2"], "house")),
    ("anything similar to annotation {garage}", similar("garage", None)),
    # deletion (the table leaves the approval open)
    ("delete annotation {tree}", delete("tree")),
    ("remove annotations {tree}, {tree2} and {tree3}", delete("tree", "tree2", "tree3")),
    ("please delete #{tree}", delete("tree")),
    ("get rid of {tree} and {tree2}", delete("tree", "tree2")),
    # one annotation
    ("focus on annotation {house}", focus("house")),
    ("zoom to #{house}", focus("house")),
    ("show me annotation {pool} on the map", focus("pool")),
    ("where is annotation {road}?", focus("road")),
    ("how big is annotation {house}?", measure("house")),
    ("tell me about {road}", measure("road")),
    ("what is #{pool}", measure("pool")),
    # the user's location
    ("where am I?", location()),
    ("my location", location()),
    ("what is near me?", location(then_nearest=True)),
    ("what's around me", location(then_nearest=True)),
    ("trees near me", location("tree", then_nearest=True)),
    ("which pools are closest to me?", location("pool", then_nearest=True)),
    # the map
    ("What can I see?", asks_for_view()),
    ("what's on my screen", asks_for_view()),
    ("what is the map view?", calls("map_get_view")),
    ("let me pick annotations", calls("map_select")),
    ("I want to select some annotations on the map", calls("map_select")),
    ("show me the big ones", clarifies()),
    # what it does not know
    ("how many unicorns are there?", unknown("unicorns")),
    ("largest castle", unknown("castle")),
    ("help", lists_what_it_can_do()),
    ("tell me a joke", lists_what_it_can_do()),
    ("never mind", acknowledges()),
]


def _world() -> World:
    ids: dict[str, int] = {}
    for category in ("house", "pool", "road", "tree", "garage"):
        rows = annotation_list(category=category, order_by="id", limit=3)
        ids[category] = rows[0].id
        ids[f"{category}2"] = rows[1].id
        ids[f"{category}3"] = rows[2].id
    return World(ids=ids)


def _wording_problem(text: str) -> str | None:
    prose = re.sub(r"<[^>]*>|\$\{[^}]*\}|data='[^']*'", " ", text)
    if "_" in prose:
        return "a class id with an underscore in the prose"
    if re.search(r"\bwith [^.]* long\b", prose):
        return '"with … long"'
    if re.search(r"(?<![\d,.])1 (\w+s)\b(?! of)", prose) and not re.search(
        r"\b1 (is|was)\b", prose
    ):
        singular_miss = re.search(r"(?<![\d,.])1 (\w+s)\b", prose)
        if singular_miss and singular_miss[1] not in ("annotations", "results", "classes"):
            return f"“1 {singular_miss[1]}”"
    return None


def test_the_local_agent_understands_at_least_60_phrasings():
    assert len(PHRASINGS) >= 60
    demo_seed(annotations=400, seed=7)
    world = _world()
    page = {
        "location_get": [_granted(world)],
        "map_get_view": [{"center": {"lat": 34.15, "lon": -118.52}, "zoom": 17}],
    }
    failures = []
    for phrasing, check in PHRASINGS:
        text = phrasing.format(**world.ids)
        try:
            conv = converse(text, page=page | {"location_get": [_granted(world)]})
            check(conv, world)
            problem = _wording_problem(conv.text)
            assert problem is None, f"wording: {problem} in {conv.text!r}"
        except Exception as exc:  # every phrasing is tried; all failures are reported together
            failures.append(f"{text!r}: {type(exc).__name__}: {exc}"[:400])
    assert not failures, f"{len(failures)} of {len(PHRASINGS)} phrasings failed:\n" + "\n".join(
        failures
    )


@pytest.mark.parametrize(
    ("request_text", "answer", "said", "unsaid"),
    [
        ("where am I?", {"error": WENT_AWAY}, "the page closed or reloaded", "client"),
        ("where am I?", {"error": UNREACHABLE}, "I could not reach your browser", "client"),
        (
            "where am I?",
            {
                "status": "UNAVAILABLE",
                "message": "This browser cannot share a location. Do not retry.",
            },
            "This browser cannot share a location.",
            "retry",
        ),
        (
            "what is the map view?",
            {
                "error": "The client's answer does not match the result schema of map_get_view: 'zoom' is a required property"
            },
            "did not make sense",
            "schema",
        ),
        (
            "what is the map view?",
            {"error": "No answer from the client within 30 seconds."},
            "did not answer in time",
            "client",
        ),
    ],
)
def test_a_page_tool_that_failed_is_told_in_words_without_the_models_text(
    request_text, answer, said, unsaid
):
    name = "location_get" if "where" in request_text else "map_get_view"
    conv = converse(request_text, page={name: [answer]})
    assert said in conv.text and unsaid not in conv.text.lower(), conv.text
