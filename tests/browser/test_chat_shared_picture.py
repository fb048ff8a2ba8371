"""A picture of the map shared by answering a question: the model gets it as an image part and
the person sees a thumbnail of what was shared on their answer, live and after a reload."""

from playwright.sync_api import expect

from tests.browser.helpers import screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.browser.test_chat_openai import openai_page  # noqa: F401 (a fixture)

QUESTION = (
    '<question id="q-look">\n  <header>May I look at your map?</header>\n'
    '  <option message="Here is my map." context="position image">Share the map</option>\n'
    '  <option message="No.">No</option>\n</question>'
)


def test_a_shared_picture_reaches_the_model_as_an_image_and_shows_as_a_thumbnail(
    openai_page,  # noqa: F811
    fake_llm,
    page_errors,
):
    _, _, page = openai_page
    new_session(page)
    fake_llm.reply_text(QUESTION)
    fake_llm.reply_text("I see your map.")

    ask(page, "what do you make of my map?")
    page.get_by_role("button", name="Share the map").click()
    expect(last_answer(page)).to_contain_text("I see your map.")

    content = fake_llm.requests[-1]["messages"][-1]["content"]
    assert content[0]["type"] == "text" and "Here is my map.</answer>" in content[0]["text"]
    assert "base64" not in content[0]["text"]
    assert content[1]["image_url"]["url"].startswith("data:image/png;base64,")
    for state in ("live", "reloaded"):
        shared = page.locator(".message.user .message-shared").last
        expect(shared.locator('[data-context="position"]')).to_contain_text("Map position")
        thumbnail = shared.locator('[data-context="image"] img')
        expect(thumbnail).to_be_visible()
        thumbnail.evaluate("img => img.decode()")
        assert thumbnail.evaluate("img => img.naturalWidth") > 0
        box = thumbnail.bounding_box()
        assert box is not None and box["width"] <= 96 and box["height"] <= 72
        assert max(box["width"], box["height"] * 4 / 3) > 90  # fills the 96 x 72 box on one side
        if state == "live":
            screenshot(page, "chat-shared-picture")
            page.reload()
    assert page_errors == []
