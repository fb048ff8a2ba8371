"""location_get in the browser, through real turns (issue 8).

Every test asks the local agent "where am I?" (or "what is near me?") on the real chat page,
whose socket registers location_get, and then reads the result the model received from the
server's database (the stored tool message is exactly what the next agent step is fed).
The browser's permission state is set the way Chromium keeps it (NOTES.md, Playwright):
`permissions=["geolocation"]` + `geolocation=…` → granted, `grant_permissions([])` → denied,
nothing → prompt. `window.geoCalls` counts getCurrentPosition calls (an init-script wrapper).

"Two concurrent calls → one card, one browser request": the engine answers the calls of a
step one after another, so on one page calls overlap only when a call ends PENDING while its
browser request is still open and the next call arrives. That is tested through real turns
(the local agent's retry after PENDING, and two location_get calls in one step of the fake
OpenAI model) and, for calls made at the very same moment, on the page itself with the same
modules the page uses (two `get()` at once).
"""

import json
import time
import uuid
from datetime import datetime

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import log_in, screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.fakes.fake_openai import ToolCalls

BERLIN = {"latitude": 52.52, "longitude": 13.405, "accuracy": 25}
RESULTS = (
    "SELECT content, created FROM chat_message WHERE role = 'tool' AND tool_name = 'location_get'"
    " AND session_id = ? ORDER BY id"
)
CALLS = (
    "SELECT created FROM chat_message WHERE role = 'assistant' AND session_id = ?"
    " AND tool_calls LIKE '%location_get%' ORDER BY id"
)
COUNT_GEOLOCATION_CALLS = """
window.geoCalls = 0;
if (window.Geolocation) {
  const original = Geolocation.prototype.getCurrentPosition;
  Geolocation.prototype.getCurrentPosition = function (...args) {
    window.geoCalls += 1;
    return original.apply(this, args);
  };
}
"""
# A browser prompt nobody answers: the permission stays `prompt` and the position never comes.
PROMPT_NOBODY_ANSWERS = """
window.geoCalls = 0;
navigator.permissions.query = async () => ({ state: 'prompt' });
Geolocation.prototype.getCurrentPosition = function () { window.geoCalls += 1; };
"""


def results(server, session_id: str) -> list[dict]:
    rows = server.sql(RESULTS, (uuid.UUID(session_id).hex,))
    return [json.loads(content) for content, _ in rows]


def wait_for_results(server, session_id: str, count: int, timeout: float = 15) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = results(server, session_id)
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(
        f"{count} location_get result(s) expected, found {results(server, session_id)}"
    )


def every_call_answered_once(server, session_id: str) -> bool:
    """Each tool call id of the session is unique and has exactly one stored result."""
    key = (uuid.UUID(session_id).hex,)
    made = [
        call["id"]
        for (calls,) in server.sql(
            "SELECT tool_calls FROM chat_message WHERE role = 'assistant' AND session_id = ?", key
        )
        for call in json.loads(calls or "[]")
    ]
    answered = server.sql(
        "SELECT tool_call_id FROM chat_message WHERE role = 'tool' AND session_id = ?", key
    )
    return sorted(made) == sorted(row[0] for row in answered) and len(set(made)) == len(made)


def stored_at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def location_cards(page):
    return page.get_by_test_id("location-card")


def chat_page(context_for, server, *scripts: str, **options):
    context = context_for(server, **options)
    for script in (COUNT_GEOLOCATION_CALLS, *scripts):
        context.add_init_script(script)
    page = log_in(context.new_page())
    return context, page


def test_granted_answers_the_browser_coordinates(context_for, daphne_server, page_errors):
    _, page = chat_page(context_for, daphne_server, permissions=["geolocation"], geolocation=BERLIN)
    session_id = new_session(page)

    ask(page, "where am I?")

    expect(last_answer(page)).to_contain_text(
        "You are at about 52.5200° N, 13.4050° E (within about 25 m)."
    )
    (result,) = results(daphne_server, session_id)
    assert result["status"] == "GRANTED"
    assert (result["latitude"], result["longitude"], result["accuracy"]) == (52.52, 13.405, 25)
    assert isinstance(result["timestamp"], int | float)
    expect(location_cards(page).get_by_test_id("location-status")).to_have_text(
        "Location shared (within about 25 m)."
    )
    assert location_cards(page).locator("button").count() == 0  # a record; nothing asked
    assert page.evaluate("window.geoCalls") == 1
    assert page_errors == []


def test_what_is_near_me_lists_the_annotations_nearest_to_the_coordinates(
    context_for, daphne_server
):
    ((house, lon, lat),) = daphne_server.sql(
        "SELECT id, (min_lon + max_lon) / 2, (min_lat + max_lat) / 2 FROM annotations_annotation"
        " WHERE category = 'house' AND deleted_at IS NULL ORDER BY id LIMIT 1"
    )
    here = {"latitude": lat, "longitude": lon, "accuracy": 10}
    _, page = chat_page(context_for, daphne_server, permissions=["geolocation"], geolocation=here)
    session_id = new_session(page)
    page.get_by_label("Allow backend tools").check()

    ask(page, "what is near me?")

    answer = last_answer(page)
    expect(answer).to_contain_text("Nearest:")
    assert answer.locator(f'[data-annotation-id="{house}"]').count() == 1
    assert results(daphne_server, session_id)[0]["status"] == "GRANTED"


def test_a_denied_origin_declines_at_once_without_a_card(context_for, daphne_server):
    context, page = chat_page(context_for, daphne_server)
    context.grant_permissions([], origin=daphne_server.url)
    session_id = new_session(page)

    ask(page, "where am I?")

    expect(last_answer(page)).to_contain_text("you chose not to share your location")
    (result,) = results(daphne_server, session_id)
    assert result["status"] == "DECLINED"
    assert "blocked" in result["message"]
    assert location_cards(page).locator("button").count() == 0  # a record; nothing asked
    assert page.evaluate("window.geoCalls") == 0


def test_a_browser_without_geolocation_is_unavailable(context_for, daphne_server):
    _, page = chat_page(context_for, daphne_server, "delete Navigator.prototype.geolocation;")
    session_id = new_session(page)

    ask(page, "where am I?")

    expect(last_answer(page)).to_contain_text("I can't get your location")
    (result,) = results(daphne_server, session_id)
    assert result["status"] == "UNAVAILABLE"
    assert "Do not retry" in result["message"]
    assert location_cards(page).locator("button").count() == 0  # a record; nothing asked


def test_not_now_on_the_card_declines(context_for, daphne_server):
    _, page = chat_page(context_for, daphne_server)
    session_id = new_session(page)

    ask(page, "where am I?")
    card = location_cards(page)
    expect(card).to_be_visible()
    card.get_by_role("button", name="Not now").click()

    expect(last_answer(page)).to_contain_text("you chose not to share your location")
    (result,) = results(daphne_server, session_id)
    assert result["status"] == "DECLINED"
    expect(card.get_by_test_id("location-status")).to_have_text("Location not shared.")
    assert card.get_by_role("button").count() == 0
    assert page.evaluate("window.geoCalls") == 0


def test_a_card_asked_after_its_turn_rendered_takes_the_stored_cards_place(
    context_for, daphne_server
):
    """The turn's render (the stored call, "waiting") can land before the socket's invoke:
    the page's card must then stand in for the stored one, not sit beside it (two cards for
    one call, seen once in CI). The invoke frame is held until the render is on screen, and
    the render (asked at `turn_start`) is held until the call is stored, i.e. until its invoke
    comes: left to race the model's answer, it was asked before the call existed and showed no
    card at all, two runs in three once turns got faster."""
    _, page = chat_page(context_for, daphne_server)
    held: list[str] = []
    invoked: list[str] = []
    renders: list = []
    page_side = []

    def invoke_held(frame) -> None:
        held.append(frame)
        invoked.append(frame)
        while renders:
            renders.pop().continue_()

    def route(ws) -> None:
        server = ws.connect_to_server()
        page_side.append(ws)
        ws.on_message(server.send)
        server.on_message(
            lambda frame: (
                invoke_held(frame) if '"client-tool-invoke"' in str(frame) else ws.send(frame)
            )
        )

    def render(request_route) -> None:
        if invoked:
            request_route.continue_()
        else:
            renders.append(request_route)

    page.route_web_socket("**/ws/chat/", route)
    page.route("**/chat/*/turns/*/", render)
    page.reload()
    session_id = new_session(page)

    ask(page, "where am I?")
    stored = page.locator('.location-card[data-status="waiting"]')
    expect(stored).to_be_visible(timeout=10_000)
    assert len(held) == 1
    page_side[-1].send(held.pop())

    card = location_cards(page)
    expect(card).to_have_count(1)
    expect(card).to_have_attribute("data-live", "true")
    card.get_by_role("button", name="Not now").click()
    expect(last_answer(page)).to_contain_text("you chose not to share your location")
    (result,) = results(daphne_server, session_id)
    assert result["status"] == "DECLINED"
    expect(card).to_have_count(1)


def test_an_unanswered_card_is_pending_ends_with_its_turn_and_a_grant_answers_the_next_call(
    context_for, daphne_server
):
    context, page = chat_page(context_for, daphne_server)
    session_id = new_session(page)

    ask(page, "where am I?")
    expect(last_answer(page)).to_contain_text("I still don't have your location", timeout=20_000)
    first, retry = results(daphne_server, session_id)
    invoked, _ = (
        stored_at(row[0]) for row in daphne_server.sql(CALLS, (uuid.UUID(session_id).hex,))
    )
    answered = stored_at(daphne_server.sql(RESULTS, (uuid.UUID(session_id).hex,))[0][1])
    cards_while_pending = location_cards(page).count()
    browser_requests_while_pending = page.evaluate("window.geoCalls")
    screenshot(page, "location-pending")

    # The turn ended: its card is final (what the model read), nothing more to press.
    stale = location_cards(page)
    expect(stale.get_by_test_id("location-status")).to_have_text(
        "Answered: PENDING, no answer yet."
    )
    expect(stale.locator("button:enabled")).to_have_count(0)
    context.grant_permissions(["geolocation"], origin=daphne_server.url)
    context.set_geolocation(BERLIN)
    ask(page, "where am I?")

    expect(last_answer(page)).to_contain_text("You are at about 52.5200° N, 13.4050° E")
    assert first["status"] == retry["status"] == "PENDING"
    assert "call location_get again" in first["message"]
    assert 4.9 <= (answered - invoked).total_seconds() < 5.5
    assert cards_while_pending == 1
    assert browser_requests_while_pending == 0
    granted = results(daphne_server, session_id)[2]
    assert (granted["status"], granted["latitude"], granted["longitude"]) == (
        "GRANTED",
        52.52,
        13.405,
    )
    # One card per turn that asked; the granted call raised none to press.
    expect(location_cards(page)).to_have_count(2)
    expect(location_cards(page).last.get_by_test_id("location-status")).to_have_text(
        "Location shared (within about 25 m)."
    )
    assert location_cards(page).locator("button").count() == 0
    assert every_call_answered_once(daphne_server, session_id)
    assert page.evaluate("window.geoCalls") == 1


def test_two_calls_at_once_on_the_page_share_one_card_and_one_browser_request(
    context_for, daphne_server
):
    context, page = chat_page(context_for, daphne_server)
    new_session(page)
    page.evaluate(
        """async () => {
          const { createLocationService } = await import('/static/geosense/location.js');
          const { createLocationCard } = await import('/static/geosense/location-card.js');
          const service = createLocationService({
            askPermission: createLocationCard({
              place: (card) => document.getElementById('transcript').append(card),
            }),
          });
          window.bothCalls = Promise.all([service.get(), service.get()]);
        }"""
    )
    expect(location_cards(page)).to_have_count(1)

    context.grant_permissions(["geolocation"], origin=daphne_server.url)
    context.set_geolocation(BERLIN)
    location_cards(page).get_by_role("button", name="Allow").click()
    first, second = page.evaluate("window.bothCalls")

    assert first == second
    assert (first["status"], first["latitude"], first["longitude"]) == ("GRANTED", 52.52, 13.405)
    assert location_cards(page).count() == 1
    assert page.evaluate("window.geoCalls") == 1


@pytest.fixture
def short_timeout_server(daphne_server_factory):
    return daphne_server_factory(env={"GEOSENSE_CLIENT_TOOL_TIMEOUT": "8"})


def test_a_reload_while_a_call_is_pending_still_answers_the_model_in_time(
    context_for, short_timeout_server
):
    server = short_timeout_server
    _, page = chat_page(context_for, server, PROMPT_NOBODY_ANSWERS)
    session_id = new_session(page)

    ask(page, "where am I?")
    location_cards(page).get_by_role("button", name="Allow").click()
    page.wait_for_function("window.geoCalls === 1")
    reloaded = time.monotonic()
    page.reload()
    (result,) = wait_for_results(server, session_id, 1, timeout=8)
    answered_after = time.monotonic() - reloaded

    page.wait_for_function("window.geosenseSocketReady === true")
    # The agent's next step may already run without this tab's tools: it answers either way.
    expect(last_answer(page)).to_contain_text("Which place should I use instead?")
    assert answered_after < 8
    assert "went away" in result["error"]


@pytest.fixture
def openai_server(daphne_server_factory, fake_llm):
    return daphne_server_factory(
        env={"GEOSENSE_LLM_BASE_URL": fake_llm.base_url, "GEOSENSE_LLM_MODEL": "fake-model"}
    )


def tool_messages(request: dict) -> list[dict]:
    return [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]


def test_the_openai_model_receives_the_granted_coordinates(context_for, openai_server, fake_llm):
    _, page = chat_page(context_for, openai_server, permissions=["geolocation"], geolocation=BERLIN)
    new_session(page)
    fake_llm.reply_tool_calls([("call_where", "location_get", {})])
    fake_llm.reply_text("You are in Berlin.")

    ask(page, "where am I?")

    expect(last_answer(page)).to_contain_text("You are in Berlin.")
    (result,) = tool_messages(fake_llm.requests[-1])
    assert result["status"] == "GRANTED"
    assert (result["latitude"], result["longitude"], result["accuracy"]) == (52.52, 13.405, 25)
    tools = [t["function"]["name"] for t in fake_llm.requests[0]["tools"]]
    assert {"location_get", "map_get_view", "map_focus", "map_select"} <= set(tools)


def test_two_location_calls_in_one_model_step_raise_one_card_and_no_second_request(
    context_for, openai_server, fake_llm
):
    _, page = chat_page(context_for, openai_server)
    new_session(page)
    fake_llm.reply(ToolCalls((("call_a", "location_get", {}), ("call_b", "location_get", {}))))
    fake_llm.reply_text("I'll go without your location.")

    ask(page, "where am I?")

    expect(last_answer(page)).to_contain_text("I'll go without your location.", timeout=20_000)
    statuses = [r["status"] for r in tool_messages(fake_llm.requests[-1])]
    assert statuses == ["PENDING", "PENDING"]
    assert location_cards(page).count() == 1
    assert page.evaluate("window.geoCalls") == 0


@pytest.fixture
def impatient_server(daphne_server_factory):
    """The server stops waiting for a client tool after 2 s; the page's race takes 5 s."""
    return daphne_server_factory(env={"GEOSENSE_CLIENT_TOOL_TIMEOUT": "2"})


def test_a_call_the_server_withdraws_is_not_answered_late(context_for, impatient_server):
    server = impatient_server
    _, page = chat_page(context_for, server, PROMPT_NOBODY_ANSWERS)
    frames: dict[str, list[dict]] = {"sent": [], "received": []}

    def follow(ws) -> None:
        ws.on("framesent", lambda payload: frames["sent"].append(json.loads(payload)))
        ws.on("framereceived", lambda payload: frames["received"].append(json.loads(payload)))

    page.on("websocket", follow)
    session_id = new_session(page)

    ask(page, "where am I?")
    (result,) = wait_for_results(server, session_id, 1, timeout=10)
    assert result["error"] == "No answer from the client within 2 seconds."
    expect(last_answer(page)).to_contain_text("I can't get your location")
    (invoke,) = [f for f in frames["received"] if f["type"] == "client-tool-invoke"]
    cancelled = [f for f in frames["received"] if f["type"] == "client-tool-cancelled"]
    assert cancelled == [
        {"type": "client-tool-cancelled", "correlationId": invoke["correlationId"]}
    ]

    # Past the page's own 5-second race, which would have answered PENDING (waiting through
    # Playwright, so that the frames sent meanwhile are reported).
    page.wait_for_timeout(4000)

    results_sent = [f for f in frames["sent"] if f["type"] == "client-tool-result"]
    assert results_sent == []
    assert not [f for f in frames["received"] if f["type"] == "error"]


def test_a_card_asked_before_its_turn_arrives_is_replaced_by_its_stored_form(
    context_for, daphne_server
):
    """The invoke can reach the socket before the turn's stream says the turn started (the
    card then waits at the end of the transcript) and the reader can answer it before the
    turn's element is drawn: the turn's stored card must take the live card's place, not
    stand beside it. The stream is held until the card is answered to make that order sure."""
    _, page = chat_page(context_for, daphne_server)
    new_session(page)
    held = []

    def hold_stream(route):
        held.append((route, route.fetch()))  # the whole turn, sent to the page only later

    page.route("**/message/stream", hold_stream)
    ask(page, "where am I?")
    card = location_cards(page)
    expect(card).to_be_visible()
    card.get_by_role("button", name="Not now").click()
    deadline = time.monotonic() + 15
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(100)  # the turn ends on the server, its stream still held
    ((route, response),) = held
    route.fulfill(response=response)

    expect(last_answer(page)).to_contain_text("you chose not to share your location")
    expect(card).to_have_count(1)
    expect(card.get_by_test_id("location-status")).to_have_text("Location not shared.")
    page.wait_for_timeout(500)  # every render of the turn landed: still one card
    expect(card).to_have_count(1)
