"""Blocks and client tools on the chat page: questions, find-similar and a map_select decision."""

import json

from playwright.sync_api import expect

from tests.browser.helpers import map_click_annotation, screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session

USER_MESSAGES = (
    "SELECT id, content FROM chat_message WHERE session_id = ? AND role = 'user' ORDER BY id"
)
CONTEXTS_OF = "SELECT kind, data FROM chat_artifact WHERE message_id = ? ORDER BY id"


def user_messages(server, session_id):
    return server.sql(USER_MESSAGES, (session_id.replace("-", ""),))


def test_a_question_option_sends_its_answer_with_the_requested_contexts(
    logged_in_page, daphne_server, page_errors
):
    page = logged_in_page
    session_id = new_session(page)
    with page.expect_response(lambda r: r.request.method == "PATCH" and r.ok):
        page.get_by_label("Allow backend tools").check()
    expect(page.get_by_label("Allow backend tools")).to_be_checked()
    ask(page, "what can I see?")
    question = page.locator(".markup-block.question[data-question-id='q-view']")
    expect(question.get_by_role("button", name="Allow")).to_be_enabled()
    screenshot(page, "chat-question")

    question.get_by_role("button", name="Allow").click()

    expect(last_answer(page)).to_contain_text("Your view is centred on")
    asked_in = question.get_attribute("data-message-id")
    message_id, content = user_messages(daphne_server, session_id)[-1]
    assert content == (
        f'<answer question="q-view" question-option-index="0" asked-in="{asked_in}">'
        "Here's the viewport data.</answer>"
    )
    contexts = daphne_server.sql(CONTEXTS_OF, (message_id,))
    assert [kind for kind, _ in contexts] == ["visibility", "position"]
    assert set(json.loads(contexts[1][1])) >= {"center", "zoom", "bounds"}
    expect(question).to_have_class("markup-block question answered")
    expect(question.get_by_role("button", name="Allow")).to_have_attribute("aria-pressed", "true")
    expect(question.get_by_role("button", name="Deny")).to_be_disabled()
    (allowed,) = daphne_server.sql(
        "SELECT allow_backend_tools FROM chat_chatsession WHERE id = ?",
        (session_id.replace("-", ""),),
    )
    assert allowed == (1,)
    assert page_errors == []


def test_a_free_text_answer_is_sent_without_an_option_index(logged_in_page, daphne_server):
    page = logged_in_page
    session_id = new_session(page)
    ask(page, "show me the big ones")
    question = page.locator(".markup-block.question[data-question-id='q-big']")

    question.get_by_label("Answer in your own words").fill('the largest "pool" & <more>')
    question.get_by_role("button", name="Answer").click()

    expect(question).to_contain_text('Answered: the largest "pool" & <more>')
    _, content = user_messages(daphne_server, session_id)[-1]
    asked_in = question.get_attribute("data-message-id")
    assert content == (
        f'<answer question="q-big" asked-in="{asked_in}">'
        'the largest "pool" &amp; &lt;more&gt;</answer>'
    )


def test_a_find_similar_block_runs_highlights_and_reports_its_selection(
    logged_in_page, daphne_server
):
    page = logged_in_page
    session_id = new_session(page)
    ((pool,),) = daphne_server.sql(
        "SELECT id FROM annotations_annotation WHERE category = 'pool' AND deleted_at IS NULL"
        " ORDER BY id LIMIT 1"
    )
    ask(page, f"find pools similar to {pool}")
    block = page.locator("[data-find-similar]").last

    block.get_by_role("button", name="Find similar").click()

    expect(last_answer(page)).to_contain_text("The search located")
    message_id, content = user_messages(daphne_server, session_id)[-1]
    ((kind, data),) = daphne_server.sql(CONTEXTS_OF, (message_id,))
    selection = json.loads(data)
    request_id = block.get_attribute("data-request-id")
    count = len(selection["ids"])
    assert kind == "selection"
    assert selection["class"] == "pool" and selection["request"] == request_id
    assert content == (
        f'<response type="find_similar" class-id="pool" request="{request_id}">Find Similar'
        f" located {count} result{'' if count == 1 else 's'} belonging to class pool.</response>"
    )
    page.wait_for_function("window.geosenseMap.highlightedIds().length > 0")
    assert page.evaluate("window.geosenseMap.highlightedIds()") == sorted(selection["ids"])
    expect(block).to_have_class("markup-block tool find-similar done")
    screenshot(page, "chat-find-similar")


def test_a_map_select_decision_is_answered_by_picking_on_the_map(logged_in_page, daphne_server):
    page = logged_in_page
    new_session(page)
    page.wait_for_function("window.geosenseMap.count > 0")
    ask(page, "let me pick annotations")
    card = page.get_by_test_id("decision-card").last
    expect(card).to_have_attribute("data-status", "pending")

    card.get_by_role("button", name="Pick on map").click()
    bar = page.get_by_test_id("map-select-bar")
    expect(bar).to_be_visible()
    screenshot(page, "chat-map-select")
    ids = [
        row[0]
        for row in daphne_server.sql(
            "SELECT id FROM annotations_annotation WHERE category = 'tree'"
            " AND deleted_at IS NULL ORDER BY id LIMIT 2"
        )
    ]
    for annotation_id in ids:
        page.evaluate("(id) => window.geosenseMap.focus([id])", annotation_id)
        map_click_annotation(page, annotation_id)
    expect(page.get_by_test_id("map-select-count")).to_have_text("2 selected")
    bar.get_by_role("button", name="Confirm").click()

    expect(last_answer(page)).to_contain_text("You picked 2 annotations")
    expect(card.get_by_test_id("decision-outcome")).to_contain_text("Picked")
    page.reload()
    expect(page.get_by_test_id("decision-card").last).to_have_attribute("data-status", "answered")
