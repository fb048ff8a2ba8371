"""The Stop button (issue 15, item 7): shown while this tab's answer is written; a click ends
the turn at once, the words already written stay (marked cut off) with a note, and the page is
ready for the next message."""

from playwright.sync_api import expect

from tests.browser.helpers import screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.browser.test_chat_openai import openai_page  # noqa: F401 - the fixture
from tests.fakes.fake_openai import Pause, Text


def test_stop_ends_the_answer_keeping_what_was_written(openai_page, fake_llm):  # noqa: F811
    server, _, page = openai_page
    session = new_session(page)
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_hidden()
    fake_llm.reply(Text("Counting the trees", 1), Pause(60), Text(": twelve."))

    ask(page, "how many trees are there?")
    # Generous waits: the walk runs on a shared, loaded machine (no time is asserted).
    expect(page.locator(".message.streaming")).to_contain_text("Counting the trees", timeout=30_000)
    expect(stop).to_be_visible()
    screenshot(page, "chat-stop-visible")
    stop.click()

    answer = last_answer(page)
    expect(answer).to_contain_text("Counting the trees", timeout=30_000)
    expect(answer).to_contain_text("The answer was cut off here.")
    expect(page.get_by_text("You stopped this answer.")).to_be_visible()
    expect(page.locator(".message.streaming")).to_have_count(0)
    expect(stop).to_be_hidden()
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    screenshot(page, "chat-stopped")
    query = "SELECT turn_state FROM chat_chatsession WHERE id = ?"
    assert server.sql(query, (session.replace("-", ""),)) == [("idle",)]

    fake_llm.reply_text("There are twelve trees.")
    ask(page, "and now?")
    expect(last_answer(page)).to_contain_text("There are twelve trees.", timeout=30_000)
