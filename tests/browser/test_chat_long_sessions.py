"""A long conversation opens with its latest turns and loads earlier ones as the reader scrolls
up (issue 15, item 9); a conversation whose turn is running when the page opens (a reload, a
switch back) shows the turn so far and follows it to its end (issue 16, item 9)."""

import re

import pytest
from playwright.sync_api import expect

from chat.pages import PAGE_TURNS
from tests.browser.helpers import log_in, screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.fakes.fake_openai import Pause, Text

TURNS = 45
# A loaded machine may take seconds to start a turn: waits are generous, never timed.
WAIT = {"timeout": 30_000}


def _long_session(server) -> str:
    """A session of the demo user with TURNS turns, written by the server's own models; turn 2
    asks a question that the last turn answers."""
    return (
        server.shell(
            f"""
from django.contrib.auth import get_user_model
from chat.models import ChatSession, Message
user = get_user_model().objects.get(username="demo")
session = ChatSession.objects.create(user=user, title="A long conversation")
for turn in range(1, {TURNS} + 1):
    Message.objects.create(session=session, turn=turn, role="user", content=f"question {{turn}}")
    content = f"answer {{turn}}"
    if turn == 2:
        content += (
            '<question id="q-size"><header>Which size?</header>'
            '<option message="Small">Small</option><option message="Big">Big</option></question>'
        )
    asker = Message.objects.create(session=session, turn=turn, role="assistant", content=content)
    if turn == 2:
        asked_in = asker.pk
Message.objects.create(
    session=session, turn={TURNS}, role="user",
    content=f'<answer question="q-size" question-option-index="1" asked-in="{{asked_in}}">Big</answer>',
)
session.turn_count = {TURNS}
session.save()
print(session.pk)
"""
        )
        .strip()
        .splitlines()[-1]
    )


def _shown_turns(page) -> list[int]:
    return page.eval_on_selector_all(
        "#transcript .turn[data-turn]", "els => els.map(e => Number(e.dataset.turn))"
    )


def test_a_long_conversation_opens_with_its_latest_turns_and_loads_earlier_ones_on_scroll_up(
    logged_in_page, daphne_server, page_errors
):
    page = logged_in_page
    session_id = _long_session(daphne_server)

    page.goto(f"/chat/{session_id}/")
    page.wait_for_function("window.geosenseSocketReady === true")

    assert _shown_turns(page) == list(range(TURNS - PAGE_TURNS + 1, TURNS + 1))
    expect(page.locator(".transcript-earlier")).to_have_count(1)
    # The answer on the latest page shows the question it picks, asked on an earlier page.
    expect(last_answer(page).locator("xpath=..").locator(".message.user").last).to_contain_text(
        "Which size?"
    )

    first_shown = page.locator(f'.turn[data-turn="{TURNS - PAGE_TURNS + 1}"]')
    while page.locator(".transcript-earlier").count():
        before = len(_shown_turns(page))
        page.locator("#transcript").evaluate("t => { t.scrollTop = 0; }")
        page.wait_for_function(
            f"document.querySelectorAll('#transcript .turn[data-turn]').length > {before}"
        )
        # The reader keeps their place: what was at the top is still in view, not pushed away.
        assert page.locator("#transcript").evaluate("t => t.scrollTop") > 0

    assert _shown_turns(page) == list(range(1, TURNS + 1))
    expect(first_shown).to_have_count(1)
    question = page.locator(".markup-block.question").first
    expect(question).to_contain_text("Which size?", **WAIT)
    # Answered on a later page: shown answered, its buttons not offered again.
    expect(question.get_by_role("button", name="Big")).to_have_attribute("aria-pressed", "true")
    screenshot(page, "chat-long-session-top")
    assert page_errors == []


@pytest.fixture
def openai_page(daphne_server_factory, fake_llm, context_for):
    server = daphne_server_factory(
        env={"GEOSENSE_LLM_BASE_URL": fake_llm.base_url, "GEOSENSE_LLM_MODEL": "fake-model"}
    )
    context = context_for(server)
    return server, context, log_in(context.new_page())


def _text_count(page, text: str) -> int:
    return page.locator("#transcript").evaluate(
        "(t, text) => t.innerText.split(text).length - 1", text
    )


def test_a_reload_mid_answer_shows_the_running_turn_and_follows_it_to_its_end(
    openai_page, fake_llm, page_errors
):
    _, _, page = openai_page
    new_session(page)
    fake_llm.reply(Text("Counting the "), Pause(8.0), Text("trees: there are many."))
    ask(page, "how many trees are there?")
    expect(page.locator(".message.streaming")).to_contain_text("Counting the", **WAIT)

    page.reload()
    page.wait_for_function("window.geosenseSocketReady === true")

    writing = page.locator(".message.streaming")
    expect(writing).to_contain_text("Counting the", **WAIT)
    expect(writing).to_have_attribute("aria-label", "GeoSense is writing")
    expect(page.get_by_role("button", name="Send")).to_be_disabled(**WAIT)
    screenshot(page, "chat-reload-mid-answer")

    expect(last_answer(page)).to_contain_text("Counting the trees: there are many.", **WAIT)
    expect(page.locator(".message.streaming")).to_have_count(0, **WAIT)
    expect(page.get_by_role("button", name="Send")).to_be_enabled(**WAIT)
    assert _text_count(page, "Counting the") == 1
    assert _text_count(page, "how many trees are there?") == 1
    assert page_errors == []


def test_switching_back_to_a_conversation_whose_turn_runs_shows_it_in_progress(
    openai_page, fake_llm, page_errors
):
    _, _, page = openai_page
    new_session(page)
    ask(page, "hello")  # the fake answers "…" when it has nothing scripted
    expect(page.get_by_role("button", name="Send")).to_be_enabled(**WAIT)
    second = new_session(page)
    fake_llm.reply(Text("Looking at "), Pause(8.0), Text("the map now."))
    ask(page, "what is on the map?")
    expect(page.locator(".message.streaming")).to_contain_text("Looking at", **WAIT)

    page.locator(".session-list a").nth(1).click()  # the older conversation
    page.wait_for_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    expect(page.locator(".message.streaming")).to_have_count(0, **WAIT)
    page.locator(f'.session-list a[data-session-id="{second}"]').click()

    expect(page.locator(".message.streaming")).to_contain_text("Looking at", **WAIT)
    expect(page.get_by_role("button", name="Send")).to_be_disabled(**WAIT)
    expect(last_answer(page)).to_contain_text("Looking at the map now.", **WAIT)
    expect(page.get_by_role("button", name="Send")).to_be_enabled(**WAIT)
    assert _text_count(page, "Looking at") == 1
    assert page_errors == []
