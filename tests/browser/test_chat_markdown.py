"""Markdown answers in Chromium: a streamed answer with a table and a code block, and the
Markdown XSS payloads, through the real openai agent and the fake model server."""

import pytest
from playwright.sync_api import expect

from tests.browser.helpers import log_in, screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.chat.test_markup_security import MARKDOWN_XSS_PAYLOADS
from tests.fakes.fake_openai import Pause, Text

TABLE_AND_OPEN_FENCE = (
    "## Trees near houses\n\n"
    "| tree | house | distance |\n"
    "|---|---|--:|\n"
    '| <ref id="102"/> | <ref id="23"/> | <distance value="4.3"/> |\n'
    '| <ref id="103"/> | <ref id="23"/> | <distance value="5.6"/> |\n\n'
    "```python\n"
    "for tree in trees:\n"
)
REST = "    print(tree.id, tree.area)\n```\n\nThat is **all** for now."


@pytest.fixture
def openai_page(daphne_server_factory, fake_llm, context_for):
    server = daphne_server_factory(
        env={"GEOSENSE_LLM_BASE_URL": fake_llm.base_url, "GEOSENSE_LLM_MODEL": "fake-model"}
    )
    context = context_for(server)
    return server, context, log_in(context.new_page())


def test_a_streamed_markdown_answer_with_a_table_and_code_renders_while_and_after_it_streams(
    openai_page, fake_llm, page_errors
):
    _, _, page = openai_page
    new_session(page)
    fake_llm.reply(Text(TABLE_AND_OPEN_FENCE, 12), Pause(2.5), Text(REST, 4))

    ask(page, "which trees are near houses?")

    streaming = page.locator(".message.streaming")
    expect(streaming.locator("table th")).to_have_count(3)
    expect(streaming.locator("table td .chip.ref")).to_have_count(4)
    pending = streaming.locator(".markdown-pending")
    expect(pending).to_contain_text("```python")
    expect(pending).to_contain_text("for tree in trees:")
    expect(streaming.locator("pre")).to_have_count(0)
    screenshot(page, "chat-markdown-streaming")

    answer = last_answer(page)
    expect(answer.locator("pre code.language-python")).to_contain_text("print(tree.id, tree.area)")
    expect(page.locator(".message.streaming")).to_have_count(0)
    expect(answer.locator("h2")).to_have_text("Trees near houses")
    expect(answer.locator("table tbody tr")).to_have_count(2)
    expect(answer.locator("td.align-right .value.length").first).to_have_text("4.3 m")
    expect(answer.locator("strong")).to_have_text("all")
    expect(answer.locator(".markdown-pending")).to_have_count(0)
    screenshot(page, "chat-markdown")

    answer.locator(".chip.ref").first.click()  # a chip inside a table cell still focuses the map
    assert page_errors == []


def test_markdown_xss_payloads_hold_in_chromium_while_streaming_and_after(
    openai_page, fake_llm, page_errors
):
    _, _, page = openai_page
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.add_init_script("window.__xss = 0; window.alert = () => { window.__xss += 1; };")
    page.reload()
    new_session(page)
    payload = "\n\n".join(MARKDOWN_XSS_PAYLOADS)
    half = len(payload) // 2
    fake_llm.reply(Text(payload[:half], 20), Pause(1.5), Text(payload[half:], 20))

    ask(page, "show me everything")

    expect(page.locator(".message.streaming .markup-text").first).to_be_visible()
    _assert_inert(page)
    answer = last_answer(page)
    expect(answer).to_contain_text("[click](javascript:alert(1))")
    expect(page.locator(".message.streaming")).to_have_count(0)
    for link in answer.locator("a").all():
        link.hover()
    page.wait_for_timeout(300)
    _assert_inert(page)
    assert dialogs == [] and page.evaluate("window.__xss") == 0
    assert page_errors == []


def _assert_inert(page) -> None:
    """No element the model could have made runs anything or loads anything."""
    found = page.evaluate(
        """() => {
            const transcript = document.querySelector('#transcript');
            const bad = [];
            for (const el of transcript.querySelectorAll('*')) {
                const tag = el.tagName.toLowerCase();
                if (['script', 'img', 'iframe', 'svg', 'style', 'object', 'embed'].includes(tag)) {
                    bad.push(tag);
                }
                for (const attr of el.attributes) {
                    if (attr.name.startsWith('on') || attr.name === 'style' || attr.name === 'src') {
                        bad.push(`${tag}[${attr.name}]`);
                    }
                }
                if (tag === 'a') {
                    if (!/^https?:\\/\\//.test(el.getAttribute('href') || 'http://')) bad.push(el.href);
                    if (el.rel !== 'noopener noreferrer nofollow') bad.push(`rel=${el.rel}`);
                }
            }
            return bad;
        }"""
    )
    assert found == []
