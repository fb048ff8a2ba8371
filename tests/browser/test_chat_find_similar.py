"""A find-similar block never offers a button that fails: a hint alone searches its class, and a
block the search cannot run (a hint that names no class, too many samples) is an invalid chip."""

import json
import re

from playwright.sync_api import expect

from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.browser.test_chat_openai import openai_page  # noqa: F401 (the fixture)

CONTEXTS_OF_LAST = (
    "SELECT a.data FROM chat_artifact a JOIN chat_message m ON a.message_id = m.id "
    "WHERE m.role = 'user' ORDER BY m.id DESC LIMIT 1"
)


def test_a_hint_alone_searches_its_class_and_an_unusable_block_is_a_chip(
    openai_page,  # noqa: F811
    fake_llm,
    page_errors,
):
    server, _, page = openai_page
    pools = [
        row[0]
        for row in server.sql("SELECT id FROM annotations_annotation WHERE category = 'pool'")
    ]
    many = json.dumps({"samples": [{"id": i} for i in range(1, 22)]})
    new_session(page)
    fake_llm.reply_text(
        "Here are three searches.\n"
        '<tool type="find-similar" data=\'{"hint": "pools"}\'>Pools like the others</tool>\n'
        '<tool type="find-similar" data=\'{"hint": "unicorn"}\'>Unicorns</tool>\n'
        f"<tool type=\"find-similar\" data='{many}'>Twenty-one samples</tool>"
    )
    fake_llm.reply_text("Those are the most typical pools.")
    ask(page, "find typical pools")

    expect(last_answer(page)).to_contain_text("Here are three searches", timeout=20_000)
    blocks = last_answer(page).locator(".markup-block.find-similar")
    expect(blocks).to_have_count(3)
    by_hint, unknown, too_many = blocks.nth(0), blocks.nth(1), blocks.nth(2)
    for invalid, reason in ((unknown, "names no class"), (too_many, "at most 20 samples")):
        expect(invalid).to_have_class(re.compile(r"\binvalid\b"))
        expect(invalid.get_by_role("button")).to_have_count(0)
        assert reason in invalid.locator(".markup-error").get_attribute("title")

    by_hint.get_by_role("button", name="Find similar").click()

    expect(last_answer(page)).to_contain_text("Those are the most typical pools.")
    # The sentence is the bubble's text; what was shared follows it as chips.
    user = page.locator(".message.user").last
    expect(user.locator(".message-body")).to_have_text(
        re.compile(r"^\s*Found 20 similar pools\.\s*$")
    )
    expect(user.locator(".shared-context")).to_have_text(re.compile(r"Selected annotations\W+20"))
    expect(page.get_by_test_id("notice")).to_have_count(0)
    ((data,),) = server.sql(CONTEXTS_OF_LAST)
    selection = json.loads(data)
    assert selection["class"] == "pool" and len(selection["ids"]) == 20
    assert set(selection["ids"]) <= set(pools)
    page.wait_for_function("window.geosenseMap.highlightedIds().length > 0")
    assert page.evaluate("window.geosenseMap.highlightedIds()") == sorted(selection["ids"])
    assert page_errors == []
