"""Model tokens priced in credits (GEOSENSE_CREDITS_PER_1K_TOKENS): the page shows the balance a
turn leaves, and a message the balance cannot start is refused in a sentence, its text kept."""

from playwright.sync_api import expect

from tests.browser.helpers import log_in
from tests.browser.test_chat_basics import ask, last_answer, new_session


def priced_page(daphne_server_factory, fake_llm, context_for, price: str):
    server = daphne_server_factory(
        env={
            "GEOSENSE_LLM_BASE_URL": fake_llm.base_url,
            "GEOSENSE_LLM_MODEL": "fake-model",
            "GEOSENSE_CREDITS_PER_1K_TOKENS": price,
        }
    )
    return server, log_in(context_for(server).new_page())


def test_a_turn_is_charged_for_its_tokens_and_the_balance_shown_follows(
    daphne_server_factory, fake_llm, context_for, page_errors
):
    server, page = priced_page(daphne_server_factory, fake_llm, context_for, "1")
    new_session(page)
    credits = page.get_by_test_id("credits")
    before = int(credits.inner_text())
    fake_llm.usage = (1500, 500)  # 2,000 tokens: 2 credits
    fake_llm.reply_text("Two thousand tokens later.")

    ask(page, "how many trees are there?")

    expect(last_answer(page)).to_contain_text("Two thousand tokens later.")
    expect(credits).to_have_text(str(before - 2))
    stored = server.sql(
        "SELECT prompt_tokens, completion_tokens, credits FROM chat_turnusage"
        " ORDER BY id DESC LIMIT 1"
    )
    assert stored == [(1500, 500, 2)]
    assert page_errors == []


def test_a_balance_that_cannot_start_an_answer_is_refused_and_the_text_kept(
    daphne_server_factory, fake_llm, context_for
):
    _, page = priced_page(daphne_server_factory, fake_llm, context_for, "5000")
    new_session(page)

    ask(page, "how many trees are there?")

    notice = page.get_by_test_id("notice").last
    expect(notice).to_contain_text("Not sent: your balance of")
    expect(notice).to_contain_text("the assistant costs 5000 credits per 1,000 tokens")
    expect(page.get_by_label("Your message")).to_have_value("how many trees are there?")
    assert fake_llm.requests == []
