"""The chat page against the openai agent and the fake OpenAI-compatible server, Markdown
answers included (a streamed table and code block, the Markdown XSS payloads in Chromium)."""

import pytest
from playwright.sync_api import expect

from chat.agents.openai import MAX_RETRIES
from tests.browser.helpers import log_in, screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session
from tests.chat.test_markup_security import MARKDOWN_XSS_PAYLOADS
from tests.fakes.fake_openai import Pause, Text


@pytest.fixture
def openai_page(daphne_server_factory, fake_llm, context_for):
    server = daphne_server_factory(
        env={"GEOSENSE_LLM_BASE_URL": fake_llm.base_url, "GEOSENSE_LLM_MODEL": "fake-model"}
    )
    context = context_for(server)
    return server, context, log_in(context.new_page())


def test_the_answer_streams_in_and_is_swapped_for_the_stored_message(openai_page, fake_llm):
    _, _, page = openai_page
    new_session(page)
    fake_llm.reply(Text("There are many "), Pause(1.5), Text("<b>trees</b> here."))

    ask(page, "how many trees are there?")

    expect(page.locator(".message.streaming")).to_contain_text("There are many")
    screenshot(page, "chat-streaming")
    expect(last_answer(page)).to_contain_text("There are many trees here.")
    expect(last_answer(page).locator("b")).to_have_text("trees")
    expect(page.locator(".message.streaming")).to_have_count(0)


def test_an_approved_deletion_runs_and_the_model_reads_its_result(openai_page, fake_llm):
    server, _, page = openai_page
    new_session(page)
    fake_llm.reply_tool_calls([("call_del", "delete_annotations", {"ids": [21]})])
    fake_llm.reply_text("Annotation 21 is deleted.")

    ask(page, "delete annotation 21")
    card = page.get_by_test_id("approval-card").last
    expect(card).to_contain_text("Deletes annotations")
    card.get_by_role("button", name="Approve").click()

    expect(last_answer(page)).to_contain_text("Annotation 21 is deleted.")
    expect(card.get_by_test_id("approval-outcome")).to_have_text("Approved")
    deleted = server.sql("SELECT deleted_at FROM annotations_annotation WHERE id = 21")
    assert deleted != [(None,)]
    tool_results = [m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_results] == ["call_del"]


def test_a_second_tab_sees_the_turn_and_cannot_send_while_it_runs_keeping_the_text(
    openai_page, fake_llm
):
    """Another tab follows the running turn, and its Send waits for the turn's end (the
    server would refuse a second turn with 409): what was typed stays in the box."""
    _, context, page = openai_page
    new_session(page)
    other = context.new_page()
    other.goto(page.url)
    other.wait_for_function("window.geosenseSocketReady === true")
    fake_llm.reply(Text("Counting "), Pause(2.0), Text("the trees: many."))

    ask(page, "how many trees are there?")
    expect(other.locator(".message.streaming")).to_contain_text("Counting")
    other.get_by_label("Your message").fill("and the houses?")

    expect(other.get_by_role("button", name="Send")).to_be_disabled()
    screenshot(other, "chat-send-waits")
    expect(last_answer(other)).to_contain_text("Counting the trees: many.")
    expect(last_answer(page)).to_contain_text("Counting the trees: many.")
    expect(other.get_by_role("button", name="Send")).to_be_enabled()
    expect(other.get_by_label("Your message")).to_have_value("and the houses?")
    shown = "els => els.map(e => e.dataset.messageId)"
    assert page.eval_on_selector_all(".message[data-message-id]", shown) == (
        other.eval_on_selector_all(".message[data-message-id]", shown)
    )


def test_a_failing_model_is_shown_in_the_chat_and_the_page_stays_usable(openai_page, fake_llm):
    _, _, page = openai_page
    new_session(page)
    for _ in range(MAX_RETRIES + 1):
        fake_llm.fail(500)

    ask(page, "how many trees are there?")

    expect(page.get_by_test_id("notice")).to_contain_text("The assistant could not answer.")
    expect(page.locator(".message.note")).to_have_count(1)
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    fake_llm.reply_text("Back again.")
    ask(page, "hello?")
    expect(last_answer(page)).to_contain_text("Back again.")


# --- Markdown answers -----------------------------------------------------------------------
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
