"""The chat page against the openai agent and the fake OpenAI-compatible server."""

import pytest
from playwright.sync_api import expect

from chat.agents.openai import MAX_RETRIES
from tests.browser.helpers import log_in, screenshot
from tests.browser.test_chat_basics import ask, last_answer, new_session
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
    expect(card).to_contain_text("Deletes data")
    card.get_by_role("button", name="Approve").click()

    expect(last_answer(page)).to_contain_text("Annotation 21 is deleted.")
    expect(card.get_by_test_id("approval-outcome")).to_have_text("Approved")
    deleted = server.sql("SELECT deleted_at FROM annotations_annotation WHERE id = 21")
    assert deleted != [(None,)]
    tool_results = [m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_results] == ["call_del"]


def test_a_second_tab_sees_the_turn_and_a_send_while_it_runs_is_refused_keeping_the_text(
    openai_page, fake_llm
):
    _, context, page = openai_page
    new_session(page)
    other = context.new_page()
    other.goto(page.url)
    other.wait_for_function("window.geosenseSocketReady === true")
    fake_llm.reply(Text("Counting "), Pause(2.0), Text("the trees: many."))

    ask(page, "how many trees are there?")
    expect(other.locator(".message.streaming")).to_contain_text("Counting")
    ask(other, "and the houses?")

    expect(other.get_by_test_id("notice")).to_contain_text("a turn is already running")
    expect(other.get_by_label("Your message")).to_have_value("and the houses?")
    screenshot(other, "chat-refused-send")
    expect(last_answer(other)).to_contain_text("Counting the trees: many.")
    expect(last_answer(page)).to_contain_text("Counting the trees: many.")
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

    expect(page.get_by_test_id("notice")).to_contain_text("The assistant ran into a problem")
    expect(page.locator(".message.note")).to_have_count(1)
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    fake_llm.reply_text("Back again.")
    ask(page, "hello?")
    expect(last_answer(page)).to_contain_text("Back again.")
