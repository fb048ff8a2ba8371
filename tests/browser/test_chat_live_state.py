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
