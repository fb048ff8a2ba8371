"""Live state on the chat page (issue 16): cards that end update at once in every tab, the
text beside a paused call shows once, and a turn ending in a conversation the reader left
never moves the header or the selection."""

import time
import uuid

from playwright.sync_api import expect

from tests.browser.helpers import log_in
from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.browser.test_chat_openai import openai_page  # noqa: F401 (the fixture)
from tests.fakes.fake_openai import Pause, Text

ANSWERS = "SELECT COUNT(*) FROM chat_message WHERE session_id = ? AND role = 'assistant'"


def wait_for_answers(server, session_id: str, count: int, timeout: float = 20) -> None:
    key = (uuid.UUID(session_id).hex,)
    deadline = time.monotonic() + timeout
    while server.sql(ANSWERS, key)[0][0] < count:
        assert time.monotonic() < deadline, f"no {count} answer(s) in {session_id}"
        time.sleep(0.1)


def open_tab(context, url: str):
    tab = context.new_page()
    tab.goto(url)
    tab.wait_for_function("window.geosenseSocketReady === true")
    return tab


def test_an_approval_set_aside_by_a_new_message_ends_at_once_in_every_tab(
    context_for, daphne_server
):
    context = context_for(daphne_server)
    page = log_in(context.new_page())
    new_session(page)
    ask(page, "delete annotation 12")
    expect(
        page.get_by_test_id("approval-card").last.get_by_role("button", name="Approve")
    ).to_be_enabled()
    other = open_tab(context, page.url)
    expect(other.get_by_test_id("approval-card").last).to_have_attribute("data-status", "pending")

    ask(page, "how many trees are there?")

    expect(last_answer(page)).to_contain_text("trees")
    for tab in (page, other):
        card = tab.get_by_test_id("approval-card").last
        expect(card.get_by_test_id("approval-outcome")).to_contain_text("Set aside")
        expect(card.locator("button:enabled")).to_have_count(0)


def test_text_beside_a_call_that_needs_approval_shows_once(openai_page, fake_llm):  # noqa: F811
    _, _, page = openai_page
    new_session(page)
    said = "I will delete annotation 21 for you once you approve."
    fake_llm.reply_tool_calls([("call_del", "delete_annotations", {"ids": [21]})], text=said)

    ask(page, "delete annotation 21")

    card = page.get_by_test_id("approval-card").last
    expect(card.get_by_role("button", name="Approve")).to_be_enabled()
    expect(card.locator("xpath=..")).to_contain_text(said)
    expect(page.get_by_text(said)).to_have_count(1)
    expect(page.locator(".activity-log")).to_have_count(0)  # it held only that text
    page.reload()
    expect(page.get_by_text(said)).to_have_count(1)


def test_a_turn_ending_in_a_conversation_left_marks_it_and_keeps_the_header(
    openai_page,  # noqa: F811
    fake_llm,
):
    server, _, page = openai_page
    stay = new_session(page)
    left = new_session(page)
    fake_llm.reply(Text("Counting "), Pause(3.0), Text("the trees: many."))
    ask(page, "count the trees slowly")
    expect(page.locator(".message.streaming")).to_contain_text("Counting")

    page.locator(f".session-list a[data-session-id='{stay}']").click()
    page.wait_for_url(f"**/chat/{stay}/")
    wait_for_answers(server, left, 1)
    page.wait_for_timeout(1500)  # the left turn's end reaches this tab's stream

    expect(page.locator("#page-title")).to_have_text("New conversation")
    current = page.locator(".session-list [aria-current=page]")
    expect(current).to_have_attribute("data-session-id", stay)
    entry = page.locator(f".session-list a[data-session-id='{left}']")
    expect(entry).to_have_attribute("data-new-answer", "true")
    expect(entry).to_contain_text("count the trees slowly")
    assert page.url.endswith(f"/chat/{stay}/")

    entry.click()
    page.wait_for_url(f"**/chat/{left}/")
    expect(last_answer(page)).to_contain_text("Counting the trees: many.")
    expect(page.locator(f".session-list a[data-session-id='{left}']")).not_to_have_attribute(
        "data-new-answer", "true"
    )


# --- client-tool calls in the activity log (item 5) -------------------------------------------


def open_log(page):
    log = page.get_by_test_id("activity-log").last
    if log.get_attribute("open") is None:
        log.locator("summary").click()
    return log


def test_every_client_call_is_in_the_activity_log_live_and_after_a_reload(
    logged_in_page, daphne_server
):
    page = logged_in_page
    new_session(page)
    ((tree,),) = daphne_server.sql(
        "SELECT id FROM annotations_annotation WHERE category = 'tree' AND deleted_at IS NULL"
        " ORDER BY id LIMIT 1"
    )
    focused = f"Show annotations on the map — #{tree} — Done."
    viewed = "Read the map's view — Where your map is, its zoom and the classes it shows — Done."

    ask(page, f"focus on annotation {tree}")
    expect(last_answer(page)).to_contain_text("The map now shows")
    expect(open_log(page)).to_contain_text(focused)
    ask(page, "what is the map view?")
    expect(last_answer(page)).to_contain_text("The map is centred on")
    expect(open_log(page)).to_contain_text(viewed)

    page.reload()
    logs = page.get_by_test_id("activity-log")
    expect(logs).to_have_count(2)
    for log, said in zip(logs.all(), (focused, viewed), strict=True):
        log.locator("summary").click()
        expect(log).to_contain_text(said)
        expect(log.locator("li")).to_have_count(1)


# --- the location card: settled by a switch (item 3) and by its turn's end (item 8) -----------

from tests.browser.test_location_get import (  # noqa: E402
    BERLIN,
    chat_page,
    every_call_answered_once,
    location_cards,
)

SETTLED = "Answered: PENDING, no answer yet."


def test_switching_conversation_with_the_location_card_open_settles_it(context_for, daphne_server):
    context, page = chat_page(context_for, daphne_server)
    second = new_session(page)
    first = new_session(page)
    ask(page, "where am I?")
    expect(location_cards(page).get_by_role("button", name="Allow")).to_be_visible()

    page.locator(f".session-list a[data-session-id='{second}']").click()
    page.wait_for_url(f"**/chat/{second}/")
    page.wait_for_function("window.geosenseSocketReady === true")
    wait_for_answers(daphne_server, first, 2)  # the first turn ends without the card
    context.grant_permissions(["geolocation"], origin=daphne_server.url)
    context.set_geolocation(BERLIN)
    ask(page, "where am I?")

    expect(last_answer(page)).to_contain_text("You are at about 52.5200° N, 13.4050° E")
    page.locator(f".session-list a[data-session-id='{first}']").click()
    page.wait_for_url(f"**/chat/{first}/")
    card = location_cards(page)
    expect(card).to_have_count(1)
    expect(card.locator("button:enabled")).to_have_count(0)
    assert every_call_answered_once(daphne_server, first)
    assert every_call_answered_once(daphne_server, second)


def test_a_location_card_whose_turn_ended_is_final_in_every_tab_and_after_a_reload(
    context_for, daphne_server
):
    context, page = chat_page(context_for, daphne_server)
    session_id = new_session(page)
    other = open_tab(context, page.url)
    page.reload()  # this tab registers last: it is the one the server asks
    page.wait_for_function("window.geosenseSocketReady === true")

    ask(page, "where am I?")
    expect(location_cards(page).get_by_role("button", name="Allow")).to_be_visible()
    expect(last_answer(page)).to_contain_text("I still don't have your location", timeout=20_000)

    for tab in (page, other):
        card = location_cards(tab)
        expect(card).to_have_count(1)
        expect(card.get_by_test_id("location-status")).to_have_text(SETTLED)
        expect(card.locator("button:enabled")).to_have_count(0)
        log = open_log(tab)
        expect(log).to_contain_text(
            f"Share your location — Your position, as your browser knows it — {SETTLED}"
        )
    page.reload()
    expect(location_cards(page).get_by_test_id("location-status")).to_have_text(SETTLED)

    # Nothing of that request stays open: the next call asks afresh, and Allow answers it.
    ask(page, "where am I?")
    fresh = location_cards(page).last
    expect(fresh.get_by_role("button", name="Allow")).to_be_enabled()
    context.grant_permissions(["geolocation"], origin=daphne_server.url)
    context.set_geolocation(BERLIN)
    fresh.get_by_role("button", name="Allow").click()
    expect(last_answer(page)).to_contain_text("You are at about 52.5200° N, 13.4050° E")
    expect(location_cards(page).last.get_by_test_id("location-status")).to_have_text(
        "Location shared (within about 25 m)."
    )
    expect(location_cards(page)).to_have_count(2)
    assert every_call_answered_once(daphne_server, session_id)
