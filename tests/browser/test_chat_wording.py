"""Words a person reads: cards and the activity log name tools and calls in words, never by code
names and raw arguments; notices and the user's own bubbles are sentences, not protocol text."""

import re

from playwright.sync_api import expect

from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.browser.test_chat_openai import openai_page  # noqa: F401 (the fixture)

CODE_WORDS = re.compile(
    r"spatial_relation|similarity_search|query_annotations|_m\b|order by|\bm2\b"
)
FIRST = (
    "SELECT id FROM annotations_annotation WHERE category = ? AND deleted_at IS NULL ORDER BY id"
)


def first_of(server, category):
    return server.sql(FIRST + " LIMIT 1", (category,))[0][0]


def test_cards_and_the_activity_log_say_what_a_call_does_in_words(
    logged_in_page, daphne_server, page_errors
):
    page = logged_in_page
    new_session(page)

    ask(page, "show trees within 20 m of a house")
    card = page.get_by_test_id("approval-card").last
    expect(card.locator(".card-title")).to_have_text("Find annotations near or overlapping others")
    expect(card.locator(".approval-summary")).to_have_text("Trees within 20 m of a house")
    expect(card).to_contain_text("First use of the server's tools in this conversation")
    expect(card).not_to_contain_text(CODE_WORDS)
    card.get_by_role("button", name="Approve").click()
    expect(last_answer(page)).to_contain_text("within")
    log = page.get_by_test_id("activity-log").last
    log.locator("summary").click()
    expect(log).to_contain_text(
        "Find annotations near or overlapping others — Trees within 20 m of a house — done"
    )
    expect(log).not_to_contain_text(CODE_WORDS)

    tree = first_of(daphne_server, "tree")
    ask(page, f"focus on annotation {tree}")
    expect(last_answer(page)).to_contain_text("The map now shows")
    log = page.get_by_test_id("activity-log").last
    log.locator("summary").click()
    expect(log).to_contain_text(f"Show annotations on the map — #{tree}")

    ask(page, "let me pick annotations")
    decision = page.get_by_test_id("decision-card").last
    expect(decision.locator(".card-title")).to_have_text("Pick annotations on the map")
    expect(decision).to_contain_text("Click the annotations you mean, then confirm.")
    assert page_errors == []


def test_the_users_bubble_of_a_find_similar_search_is_a_sentence(logged_in_page, daphne_server):
    page = logged_in_page
    new_session(page)
    pool = first_of(daphne_server, "pool")
    ask(page, f"find pools similar to {pool}")

    page.locator("[data-find-similar]").last.get_by_role("button", name="Find similar").click()

    expect(last_answer(page)).to_contain_text("The search located")
    bubble = page.locator(".message.user").last.locator(".message-body")
    expect(bubble).to_have_text(re.compile(r"^\s*Found \d+ similar pools\.\s*$"))
    block = page.locator("[data-find-similar]").last
    expect(block.locator(".find-similar-result")).to_have_text(re.compile(r"^Found \d+ similar"))
    page.reload()
    expect(page.locator(".message.user").last).not_to_contain_text("Find Similar located")


def test_a_credit_refusal_is_said_plainly(openai_page, fake_llm):  # noqa: F811
    server, _, page = openai_page
    server.shell(
        "from django.contrib.auth import get_user_model; "
        "from geosense.accounts.services import credit_set; "
        "credit_set(user=get_user_model().objects.get(username='demo'), balance=2)"
    )
    try:
        new_session(page)
        fake_llm.reply_tool_calls([("c1", "similarity_search", {"samples": [{"id": 3}]})])
        fake_llm.reply_text("You do not have enough credits for that search.")
        ask(page, "find things like 3")

        notice = page.get_by_test_id("notice").last
        expect(notice).to_contain_text("Not enough credits", timeout=20_000)
        expect(notice).not_to_contain_text("ran into a problem")
        expect(notice).not_to_contain_text("similarity_search")
        expect(notice).to_contain_text(
            "Not enough credits for “Search for similar annotations”: it costs 5 credits and "
            "you have 2 credits."
        )
        expect(last_answer(page)).to_contain_text("You do not have enough credits")
    finally:
        print("SERVERLOG", server.log()[-3000:])
        server.shell(
            "from django.contrib.auth import get_user_model; "
            "from geosense.accounts.services import credit_set; "
            "credit_set(user=get_user_model().objects.get(username='demo'), balance=100)"
        )
