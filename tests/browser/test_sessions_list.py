"""Conversations and notices as a person meets them: "New conversation" saves nothing until the
first message, the list groups conversations by day with their time, notices stack at most
three and a turn's error fades from the notices but stays in the transcript."""

import json
import re

from playwright.sync_api import expect

from tests.browser.helpers import open_new_conversation
from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.browser.test_chat_openai import openai_page  # noqa: F401 (the fixture)

SESSIONS = (
    "SELECT COUNT(*) FROM chat_chatsession WHERE user_id = "
    "(SELECT id FROM auth_user WHERE username = 'demo')"
)
UUID_URL = re.compile(r"/chat/[0-9a-f-]{36}/$")


def session_count(server) -> int:
    return server.sql(SESSIONS)[0][0]


def test_new_conversation_saves_nothing_until_the_first_message(
    logged_in_page, daphne_server, page_errors
):
    page = logged_in_page
    page.wait_for_load_state("networkidle")
    before = session_count(daphne_server)
    for _ in range(3):
        open_new_conversation(page)
        page.wait_for_url(re.compile(r"/chat/$"))
        expect(page.locator("#chat-panel")).to_have_attribute("data-session-id", "")
        expect(page.locator("#page-title")).to_have_text("New conversation")

    page.get_by_label("Allow backend tools").check()  # a wish, kept until the first message
    assert session_count(daphne_server) == before
    ask(page, "how many trees are there?")

    expect(last_answer(page)).to_contain_text("trees")
    page.wait_for_url(UUID_URL)
    assert session_count(daphne_server) == before + 1
    current = page.locator(".session-list [aria-current=page]")
    expect(current).to_have_text("how many trees are there?")
    session_id = page.url.rstrip("/").rsplit("/", 1)[1]
    expect(current).to_have_attribute("data-session-id", session_id)
    entry = current.locator("xpath=..")
    expect(entry.locator("time")).to_have_text(re.compile(r"^(just now|\d+ min ago)$"))
    expect(page.locator(".session-list .session-day").first).to_have_text("Today")
    allowed = daphne_server.sql(
        "SELECT allow_backend_tools FROM chat_chatsession WHERE id = ?",
        (session_id.replace("-", ""),),
    )
    assert allowed == [(1,)]
    page.reload()
    expect(page.get_by_label("Allow backend tools")).to_be_checked()
    assert page_errors == []


def test_the_list_groups_conversations_by_day_and_says_when(logged_in_page, daphne_server):
    page = logged_in_page
    ids = json.loads(
        daphne_server.shell(
            "import json; from datetime import timedelta; "
            "from django.utils import timezone; "
            "from django.contrib.auth import get_user_model; "
            "from chat.models import ChatSession; "
            "user = get_user_model().objects.get(username='demo'); "
            "made = [ChatSession.objects.create(user=user, title=t) for t in "
            "('Day-old talk', 'Old talk')]; "
            "now = timezone.now(); "
            "ChatSession.objects.filter(pk=made[0].pk).update(created=now - timedelta(days=1)); "
            "ChatSession.objects.filter(pk=made[1].pk).update(created=now - timedelta(days=40)); "
            "print(json.dumps([str(s.pk) for s in made]))"
        ).strip()
    )
    page.reload()

    days = page.locator(".session-list .session-day")
    expect(days.first).to_have_text("Today")
    labels = days.all_text_contents()
    assert labels.index("Today") < labels.index("Yesterday") < len(labels) - 1
    assert re.fullmatch(r"\d{1,2} [A-Z][a-z]{2}( \d{4})?", labels[-1])
    for session_id in ids:
        time = page.locator(f".session-list a[data-session-id='{session_id}'] + time")
        expect(time).to_have_text(re.compile(r"^\d{2}:\d{2}$"))
    # Each entry sits under its own day's heading.
    day_of = page.evaluate(
        """(id) => {
          let item = document.querySelector(`a[data-session-id='${id}']`).closest('li');
          while (item && !item.classList.contains('session-day')) item = item.previousElementSibling;
          return item && item.textContent;
        }""",
        ids[0],
    )
    assert day_of == "Yesterday"


def test_notices_stack_at_most_three_and_errors_stay_until_dismissed(logged_in_page):
    page = logged_in_page
    new_session(page)
    refusals = iter(range(1, 100))
    page.route(
        "**/message/stream",
        lambda route: route.fulfill(
            status=400,
            content_type="application/json",
            body=json.dumps({"error": f"refusal number {next(refusals)}"}),
        ),
    )

    for n in range(1, 6):
        ask(page, f"message {n}")
        expect(page.get_by_test_id("notice").last).to_contain_text(f"refusal number {n}")

    notices = page.get_by_test_id("notice")
    expect(notices).to_have_count(3)
    expect(notices.first).to_contain_text("refusal number 3")
    assert notices.evaluate_all("els => els.map(e => e.dataset.stays)") == ["true"] * 3
    notices.first.get_by_role("button", name="Dismiss this notice").click()
    expect(notices).to_have_count(2)
    expect(notices.first).to_contain_text("refusal number 4")


def test_a_credit_refusal_fades_from_the_notices_and_stays_in_the_transcript(
    openai_page,  # noqa: F811
    fake_llm,
):
    server, _, page = openai_page
    set_credits = (
        "from django.contrib.auth import get_user_model; "
        "from geosense.accounts.services import credit_set; "
        "credit_set(user=get_user_model().objects.get(username='demo'), balance={})"
    )
    refusal = (
        "Not enough credits for “Search for similar annotations”: it costs 5 credits and you "
        "have 2 credits."
    )
    server.shell(set_credits.format(2))
    try:
        new_session(page)
        fake_llm.reply_tool_calls([("c1", "similarity_search", {"samples": [{"id": 3}]})])
        fake_llm.reply_text("You do not have enough credits for that search.")
        ask(page, "find things like 3")

        notice = page.get_by_test_id("notice")
        expect(notice).to_contain_text(refusal, timeout=20_000)
        expect(notice).to_have_attribute("data-stays", "false")
        expect(last_answer(page)).to_contain_text("You do not have enough credits")
        note = page.locator(".message.note")
        expect(note).to_have_text(refusal)
        expect(notice).to_have_count(0, timeout=20_000)  # it fades; the note stays
        expect(note).to_have_text(refusal)

        page.reload()
        expect(page.locator(".message.note")).to_have_text(refusal)
        expect(last_answer(page)).to_contain_text("You do not have enough credits")
    finally:
        server.shell(set_credits.format(100))
