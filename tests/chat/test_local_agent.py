"""The local agent: every documented request, answers checked against the annotations services."""

import asyncio
import json
import re

import pytest

from chat.markup import parse_message
from chat.models import Artifact, ClientToolRegistration
from chat.selectors import artifacts_map
from geosense.annotations.selectors import (
    annotation_counts,
    annotation_list,
    annotations_within_distance,
)
from tests.chat.helpers import post_stream

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

LOCATION_TOOL = {
    "kind": "blocking",
    "name": "location_get",
    "description": "The user's location.",
    "arguments": {"type": "object", "properties": {}, "additionalProperties": False},
    "result": {"type": "object"},
    "serve": False,  # answered through resume in these tests: no browser needed
}


async def ask(client, caller, text, **body):
    return await post_stream(
        client, caller.url("/message/stream"), {"text": text, **body}, token=caller.token
    )


async def answer_decision(client, caller, tool_call, result):
    return await post_stream(
        client,
        caller.url("/message/resume/stream"),
        {"tool_call": tool_call, "result": result},
        token=caller.token,
    )


async def test_counts_per_class_come_from_the_data(client, caller, neighbourhood):
    counts = await asyncio.to_thread(annotation_counts)
    for question, category in (
        ("How many trees are there?", "tree"),
        ("how many houses?", "house"),
    ):
        out = await ask(client, caller, question)
        assert re.search(rf"\b{counts[category]}\b", out.message["content"]), out.message["content"]
        assert len(out.of("text_delta")) > 3  # streamed in deltas, like an LLM
        assert "backend_tool_call" not in out.names()


async def test_an_unknown_class_is_answered_honestly(client, caller, neighbourhood):
    out = await ask(client, caller, "how many unicorns are there?")
    assert "any “unicorns”" in out.message["content"] and "houses" in out.message["content"]


async def test_trees_within_20_m_of_a_house_asks_then_highlights_the_services_answer(
    client, caller, neighbourhood
):
    out = await ask(client, caller, "Show trees within 20 m of a house")
    pending = out.message["pending_approval"]
    assert pending["tool"] == "spatial_relation" and pending["reasons"] == ["backend_access"]
    assert out.of("backend_thinking")
    resumed = await post_stream(
        client,
        caller.url("/message/resume/stream"),
        {"approval": pending["id"], "decision": "approve"},
        token=caller.token,
    )
    content = resumed.message["content"]
    expected = await asyncio.to_thread(
        annotations_within_distance, source="tree", target="house", distance_m=20
    )
    assert f"I found {len(expected)} trees" in content
    assert '<distance value="20" />' in content
    artifact = await Artifact.objects.aget(kind="highlight")
    assert artifact.data["ids"] == [p.source_id for p in expected]
    blocks = parse_message(
        content, artifacts=await asyncio.to_thread(artifacts_map, session_id=caller.session.pk)
    )
    highlight = next(b for b in blocks if type(b).__name__ == "HighlightBlock")
    assert highlight.data["ids"] == artifact.data["ids"]
    assert highlight.data["linkValues"][0] == pytest.approx(expected[0].distance_m, abs=0.01)


async def test_the_largest_house_is_the_one_with_the_largest_area(
    client, trusted_caller, neighbourhood
):
    out = await ask(client, trusted_caller, "Which is the largest house?")
    (largest,) = await asyncio.to_thread(
        annotation_list, category="house", order_by="-area_m2", limit=1
    )
    content = out.message["content"]
    assert f'<ref id="{largest.id}" />' in content
    area = float(re.search(r'<area value="([\d.]+)" />', content)[1])
    assert area == pytest.approx(largest.area_m2, abs=0.01)


async def test_the_longest_road_is_measured_by_length(client, trusted_caller, neighbourhood):
    out = await ask(client, trusted_caller, "show me the longest road")
    (longest,) = await asyncio.to_thread(
        annotation_list, category="road", order_by="-length_m", limit=1
    )
    assert f'<ref id="{longest.id}" />' in out.message["content"]


async def test_find_similar_answers_with_a_find_similar_block(client, caller, neighbourhood):
    out = await ask(client, caller, "find pools similar to 25")
    blocks = parse_message(out.message["content"], artifacts={})
    block = next(b for b in blocks if type(b).__name__ == "FindSimilarBlock")
    assert block.data == {"hint": "pool", "samples": [{"id": 25}]}
    assert "backend_tool_call" not in out.names()


async def test_a_find_similar_response_is_acknowledged_with_a_highlight(
    client, caller, neighbourhood
):
    text = '<response type="find_similar" class-id="pool" request="r1">Find Similar located 3 results belonging to class pool.</response>'
    out = await ask(
        client,
        caller,
        text,
        contexts=[{"type": "selection", "data": {"ids": [3, 4, 5], "class": "pool"}}],
    )
    content = out.message["content"]
    assert "located 3 similar pools" in content
    blocks = parse_message(
        content, artifacts=await asyncio.to_thread(artifacts_map, session_id=caller.session.pk)
    )
    assert next(b for b in blocks if type(b).__name__ == "HighlightBlock").data["ids"] == [3, 4, 5]


async def test_delete_goes_through_the_destructive_approval(client, trusted_caller, neighbourhood):
    (first,) = await asyncio.to_thread(annotation_list, category="tree", order_by="id", limit=1)
    out = await ask(client, trusted_caller, f"delete annotation {first.id}")
    pending = out.message["pending_approval"]
    assert pending["tool"] == "delete_annotations" and pending["reasons"] == ["destructive"]
    assert pending["arguments"] == {"ids": [first.id]}
    rejected = await post_stream(
        client,
        trusted_caller.url("/message/resume/stream"),
        {"approval": pending["id"], "decision": "reject"},
        token=trusted_caller.token,
    )
    assert "did not delete" in rejected.message["content"]


async def test_what_can_i_see_asks_for_the_view_then_counts_inside_it(
    client, trusted_caller, neighbourhood
):
    out = await ask(client, trusted_caller, "What can I see?")
    (question,) = [
        b
        for b in parse_message(out.message["content"], artifacts={})
        if type(b).__name__ == "QuestionBlock"
    ]
    assert question.options[0].context == ("visibility", "position")
    features = await asyncio.to_thread(annotation_list, category="house", order_by="id", limit=50)
    lons = [f.centroid_lon for f in features]
    lats = [f.centroid_lat for f in features]
    bounds = [min(lons), min(lats), max(lons), max(lats)]
    answer = f'<answer question="{question.id}" question-option-index="0">Here\'s the viewport data.</answer>'
    contexts = [
        {"type": "visibility", "data": {"classes": ["house"]}},
        {
            "type": "position",
            "data": {"center": {"lat": lats[0], "lon": lons[0]}, "zoom": 17, "bounds": bounds},
        },
    ]
    seen = await ask(client, trusted_caller, answer, contexts=contexts)
    inside = await asyncio.to_thread(annotation_counts, bbox=tuple(bounds))
    assert f"{inside['house']} houses" in seen.message["content"]
    assert "Hidden classes" in seen.message["content"]


async def test_an_ambiguous_request_gets_a_clarification_question(client, caller, neighbourhood):
    out = await ask(client, caller, "show me the big ones")
    (question,) = [
        b
        for b in parse_message(out.message["content"], artifacts={})
        if type(b).__name__ == "QuestionBlock"
    ]
    messages = [o.message for o in question.options]
    assert "Which is the largest house?" in messages
    (largest,) = await asyncio.to_thread(
        annotation_list, category="house", order_by="-area_m2", limit=1
    )
    pick = f'<answer question="{question.id}" question-option-index="0">Which is the largest house?</answer>'
    answered = await ask(client, caller, pick)
    approval = answered.message["pending_approval"]
    resumed = await post_stream(
        client,
        caller.url("/message/resume/stream"),
        {"approval": approval["id"], "decision": "approve"},
        token=caller.token,
    )
    assert f'<ref id="{largest.id}" />' in resumed.message["content"]


async def test_anything_else_gets_an_honest_list_of_what_it_can_do(client, caller, neighbourhood):
    out = await ask(client, caller, "write me a poem about rivers")
    assert "only understand a fixed set" in out.message["content"]
    assert "how many trees" in out.message["content"]


# --- where am I (location_get through the same engine) ---------------------------------------


async def _register_location(caller):
    await ClientToolRegistration.objects.acreate(
        channel_name="test.location", session=caller.session, tools=[LOCATION_TOOL]
    )


async def test_where_am_i_without_a_location_tool_asks_for_a_place(client, caller, neighbourhood):
    out = await ask(client, caller, "where am I?")
    assert "can't share your location" in out.message["content"]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            {
                "status": "GRANTED",
                "latitude": 51.5,
                "longitude": -0.12,
                "accuracy": 35,
                "timestamp": 1,
            },
            "within about 35 m",
        ),
        ({"status": "DECLINED", "message": "no"}, "chose not to share"),
        ({"status": "UNAVAILABLE", "message": "no geolocation"}, "no geolocation"),
    ],
)
async def test_where_am_i_handles_terminal_statuses_without_retrying(
    client, caller, neighbourhood, result, expected
):
    await _register_location(caller)
    out = await ask(client, caller, "where am I?")
    decision = out.message["pending_decision"]
    assert decision["name"] == "location_get"
    final = await answer_decision(client, caller, decision["tool_call"], result)
    assert expected in final.message["content"]
    assert final.message["pending_decision"] is None  # no retry


async def test_where_am_i_retries_pending_once_then_asks_for_a_place(client, caller, neighbourhood):
    await _register_location(caller)
    pending = {"status": "PENDING", "message": "not answered yet"}
    out = await ask(client, caller, "where am I?")
    retry = await answer_decision(
        client, caller, out.message["pending_decision"]["tool_call"], pending
    )
    second = retry.message["pending_decision"]
    assert (
        second is not None and second["tool_call"] != out.message["pending_decision"]["tool_call"]
    )
    final = await answer_decision(client, caller, second["tool_call"], pending)
    assert final.message["pending_decision"] is None
    assert "Which place should I use" in final.message["content"]


async def test_granted_coordinates_are_reported_without_false_precision(
    client, caller, neighbourhood
):
    await _register_location(caller)
    out = await ask(client, caller, "where am I?")
    result = {
        "status": "GRANTED",
        "latitude": 51.123456789,
        "longitude": -0.987654321,
        "accuracy": 1500,
        "timestamp": 1,
    }
    final = await answer_decision(
        client, caller, out.message["pending_decision"]["tool_call"], result
    )
    assert "51.12° N, 0.99° W" in final.message["content"]
    assert "51.1234" not in final.message["content"]


async def test_what_is_near_me_uses_the_location_then_the_nearest_annotations(
    client, trusted_caller, neighbourhood
):
    await _register_location(trusted_caller)
    (house,) = await asyncio.to_thread(annotation_list, category="house", order_by="id", limit=1)
    out = await ask(client, trusted_caller, "what is near me?")
    result = {
        "status": "GRANTED",
        "latitude": house.centroid_lat,
        "longitude": house.centroid_lon,
        "accuracy": 10,
        "timestamp": 1,
    }
    final = await answer_decision(
        client, trusted_caller, out.message["pending_decision"]["tool_call"], result
    )
    assert f'<ref id="{house.id}" />' in final.message["content"]
    assert json.loads(json.dumps(final.of("backend_tool_call")))[0]["name"] == "nearest_annotations"


async def test_a_second_turn_calls_the_tool_again_with_a_new_call_id(client, caller, neighbourhood):
    await _register_location(caller)
    granted = {
        "status": "GRANTED",
        "latitude": 51.5,
        "longitude": -0.12,
        "accuracy": 35,
        "timestamp": 1,
    }
    ids = []
    for _ in range(2):
        out = await ask(client, caller, "where am I?")
        ids.append(out.message["pending_decision"]["tool_call"])
        await answer_decision(client, caller, ids[-1], granted)
    assert ids[0] != ids[1]
