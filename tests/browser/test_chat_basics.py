"""The chat page with the local agent: a session, a streamed answer, the second tab, the log."""

import re

from playwright.sync_api import expect

from tests.browser.helpers import screenshot

TREES = "SELECT COUNT(*) FROM annotations_annotation WHERE category = 'tree' AND deleted_at IS NULL"


def new_session(page):
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    page.wait_for_function("window.geosenseSocketReady === true")
    return page.url.rstrip("/").rsplit("/", 1)[1]


def ask(page, text):
    page.get_by_label("Your message").fill(text)
    page.get_by_role("button", name="Send").click()


def last_answer(page):
    return page.locator(".message.assistant[data-message-id]").last


def test_a_new_conversation_answers_how_many_trees(logged_in_page, daphne_server, page_errors):
    page = logged_in_page
    session_id = new_session(page)

    ask(page, "how many trees are there?")

    (trees,) = daphne_server.sql(TREES)[0]
    expect(last_answer(page)).to_contain_text(f"There are {trees} trees.")
    expect(page.get_by_label("Your message")).to_have_value("")
    expect(page.locator("#connection-state")).to_have_text("Connected")
    expect(page.locator(".session-list [aria-current=page]")).to_have_text(
        "how many trees are there?"
    )
    stored = daphne_server.sql(
        "SELECT role, content FROM chat_message WHERE session_id = ? ORDER BY id",
        (session_id.replace("-", ""),),
    )
    assert [role for role, _ in stored] == ["user", "assistant"]
    screenshot(page, "chat-answer")
    page.reload()
    expect(last_answer(page)).to_contain_text(f"There are {trees} trees.")
    assert page_errors == []
