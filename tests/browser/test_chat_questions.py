"""A question is known by the message that asked it: the same id asked twice is two questions."""

import re

from playwright.sync_api import expect

from tests.browser.test_chat_basics import ask, last_answer, new_session

USER_MESSAGES = (
    "SELECT id, content FROM chat_message WHERE session_id = ? AND role = 'user' ORDER BY id"
)


def test_a_question_asked_again_is_answered_again(logged_in_page, daphne_server, page_errors):
    page = logged_in_page
    session_id = new_session(page)
    with page.expect_response(lambda r: r.request.method == "PATCH" and r.ok):
        page.get_by_label("Allow backend tools").check()
    questions = page.locator(".markup-block.question[data-question-id='q-view']")
    ask(page, "what can I see?")
    questions.first.get_by_role("button", name="Deny").click()
    expect(last_answer(page)).to_contain_text("I won't look at your view")

    ask(page, "what can I see?")
    expect(questions).to_have_count(2)
    second = questions.nth(1)
    expect(second).not_to_have_class(re.compile(r"\banswered\b"))
    expect(second.get_by_role("button", name="Allow")).to_be_enabled()
    expect(second.get_by_label("Answer in your own words")).to_be_visible()
    second.get_by_role("button", name="Allow").click()

    expect(last_answer(page)).to_contain_text("Your view is centred on")
    for page_state in ("live", "reloaded"):
        first, second = questions.nth(0), questions.nth(1)
        expect(first.get_by_role("button", name="Deny")).to_have_attribute("aria-pressed", "true")
        expect(first.get_by_role("button", name="Allow")).to_have_attribute("aria-pressed", "false")
        expect(second.get_by_role("button", name="Allow")).to_have_attribute("aria-pressed", "true")
        expect(second.get_by_role("button", name="Deny")).to_be_disabled()
        answers = page.locator(".message.user .markup-block.answer")
        expect(answers.nth(0)).to_contain_text("Deny")
        expect(answers.nth(1)).to_contain_text("Allow")
        if page_state == "live":
            page.reload()
    stored = [
        content for _, content in daphne_server.sql(USER_MESSAGES, (session_id.replace("-", ""),))
    ]
    asked = page.locator(".message[data-message-id]:has(.markup-block.question)")
    first_id, second_id = (asked.nth(i).get_attribute("data-message-id") for i in (0, 1))
    assert f'asked-in="{first_id}"' in stored[1] and f'asked-in="{second_id}"' in stored[3]
    assert page_errors == []
