"""What was shared: after "Allow" on the local agent's "let me take a look" question, the user's
answer shows a chip per context the page sent (how many classes were visible, the map's zoom,
each in full in its tooltip), live and after a reload; an answer that shared nothing shows none. (A shared picture and its
thumbnail: test_chat_shared_picture.py.)"""

import re

from playwright.sync_api import expect

from tests.browser.test_chat_basics import ask, last_answer, new_session


def test_allowing_a_look_shows_what_was_shared_on_the_answer(logged_in_page, page_errors):
    page = logged_in_page
    new_session(page)
    with page.expect_response(lambda r: r.request.method == "PATCH" and r.ok):
        page.get_by_label("Allow backend tools").check()
    questions = page.locator(".markup-block.question[data-question-id='q-view']")
    ask(page, "what can I see?")
    questions.last.get_by_role("button", name="Deny").click()
    expect(last_answer(page)).to_contain_text("I won't look at your view")
    ask(page, "what can I see?")
    expect(questions).to_have_count(2)
    questions.last.get_by_role("button", name="Allow").click()
    expect(last_answer(page)).to_contain_text("Your view is centred on")

    classes = page.locator(".map-legend input[data-class]:checked").count()
    answers = page.locator(".message.user:has(.markup-block.answer)")
    for state in ("live", "reloaded"):
        expect(answers).to_have_count(2)
        denied, allowed = answers.nth(0), answers.nth(1)
        expect(denied.locator(".message-shared")).to_have_count(0)
        shared = allowed.locator(".message-shared")
        expect(shared).to_have_attribute("aria-label", "Shared with the assistant")
        chips = shared.locator(".shared-context")
        expect(chips).to_have_count(2)
        expect(chips.nth(0)).to_have_attribute("data-context", "visibility")
        expect(chips.nth(0)).to_have_text(f"Visible classes {classes}")
        expect(chips.nth(0)).to_have_attribute("title", re.compile(r"^Shown: \w+, \w+"))
        expect(chips.nth(1)).to_have_attribute("data-context", "position")
        expect(chips.nth(1)).to_have_text(re.compile(r"^Map position zoom \d+$"))
        expect(chips.nth(1)).to_have_attribute("title", re.compile(r"^Zoom [\d.]+, centre -?\d"))
        if state == "live":
            page.reload()
    assert page_errors == []
