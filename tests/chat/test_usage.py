"""Model tokens per turn, as the server reports them; their price through the credit ledger; a
turn the balance cannot start is refused before anything is stored."""

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from chat.models import Message, TurnUsage
from chat.usage import CREDITS_RAN_OUT, LEDGER_NAME, usage_record
from geosense.accounts.models import CreditCharge
from geosense.accounts.services import credit_balance, credit_set
from tests.chat.conftest import make_caller
from tests.chat.costs import python_calls_of
from tests.chat.helpers import post_stream


async def say(client, caller, text: str = "hi"):
    return await post_stream(
        client, caller.url("/message/stream"), {"text": text}, token=caller.token
    )


@sync_to_async
def usages(session) -> list[tuple[int, int, int, int, int]]:
    return list(
        TurnUsage.objects.filter(session=session)
        .order_by("turn")
        .values_list("turn", "requests", "prompt_tokens", "completion_tokens", "credits")
    )


@sync_to_async
def ledger(user) -> list[tuple[int, str, str]]:
    return list(
        CreditCharge.objects.filter(user=user)
        .order_by("id")
        .values_list("amount", "tool_name", "tool_call_id")
    )


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_tokens_of_every_request_of_a_turn_are_recorded_on_the_turn(
    client, trusted_caller, openai_agent
):
    openai_agent.usage = (1200, 80)
    openai_agent.reply_tool_calls([("call_1", "list_classes", {})])
    openai_agent.reply_text("Nothing here.")

    await say(client, trusted_caller)
    await say(client, trusted_caller, "again")

    assert await usages(trusted_caller.session) == [(1, 2, 2400, 160, 0), (2, 1, 1200, 80, 0)]
    assert await ledger(trusted_caller.user) == []  # free by default


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_free_tokens_of_a_step_with_calls_are_recorded_when_the_turn_ends_otherwise(
    client, trusted_caller, openai_agent
):
    """A step with calls leaves its free tokens to the turn's next step (one statement for
    both): a turn whose next request fails still records them, at its end."""
    openai_agent.usage = (1200, 80)
    openai_agent.reply_tool_calls([("call_1", "list_classes", {})])
    openai_agent.fail(400)  # not retried

    out = await say(client, trusted_caller)

    assert out.names()[-1] == "turn_end" and "error" in out.names()
    assert await usages(trusted_caller.session) == [(1, 1, 1200, 80, 0)]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_tokens_the_turns_end_cannot_record_do_not_keep_the_session_running(
    client, trusted_caller, openai_agent, monkeypatch
):
    """Review 29-a H1: the held tokens' statement failing (any error, not only a locked
    database) skipped the release and `turn_end`: the session stayed running until its lease
    ran out. The end logs the tokens as lost and goes on."""

    def refused(**_kwargs):
        raise ValueError("the database refused the figures")

    monkeypatch.setattr("chat.usage.usage_record", refused)
    openai_agent.usage = (1200, 80)
    openai_agent.reply_tool_calls([("call_1", "list_classes", {})])
    openai_agent.fail(400)  # not retried: the end records the held tokens

    out = await say(client, trusted_caller)

    assert out.names()[-1] == "turn_end"
    state = await sync_to_async(
        lambda: type(trusted_caller.session).objects.get(pk=trusted_caller.session.pk).turn_state
    )()
    assert state == "idle"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_tokens_are_charged_through_the_ledger_at_the_price_per_1000(
    client, trusted_caller, openai_agent, settings
):
    settings.GEOSENSE_CREDITS_PER_1K_TOKENS = 2
    openai_agent.usage = (1500, 500)  # 2,000 tokens a request: 4 credits

    out = await say(client, trusted_caller)

    assert out.status == 200 and out.of("error") == []
    assert await usages(trusted_caller.session) == [(1, 1, 1500, 500, 4)]
    assert await ledger(trusted_caller.user) == [(4, LEDGER_NAME, "tokens:turn-1:request-1")]
    assert await sync_to_async(credit_balance)(user=trusted_caller.user) == 96


def test_a_turn_pays_for_its_running_total_rounded_up_once(transactional_db, settings):
    settings.GEOSENSE_AGENT = "openai"
    settings.GEOSENSE_CREDITS_PER_1K_TOKENS = 1
    caller = make_caller("rita", credits=10)

    for _ in range(3):  # 300 tokens each: 0.3, 0.6, 0.9 credits
        usage = usage_record(
            session_id=caller.session.pk, turn=1, prompt_tokens=250, completion_tokens=50
        )

    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (3, 750, 150)
    assert usage.credits == 1
    assert credit_balance(user=caller.user) == 9
    usage = usage_record(
        session_id=caller.session.pk, turn=1, prompt_tokens=200, completion_tokens=0
    )
    assert usage.credits == 2 and credit_balance(user=caller.user) == 8


@pytest.mark.parametrize("returning", [True, False], ids=["upsert", "sqlite-before-3.35"])
def test_a_free_request_s_tokens_are_added_to_its_turn_in_one_statement(
    transactional_db, settings, monkeypatch, returning
):
    """Every model step records its usage: on a database that returns what it upserts, the
    turn's row is inserted or added to by one statement, no transaction; an SQLite without
    `RETURNING` gets the same totals through the ORM."""
    settings.GEOSENSE_AGENT = "openai"
    caller = make_caller("sam", credits=10)
    monkeypatch.setattr(connection.features, "can_return_columns_from_insert", returning)
    statements = []

    def counted(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        first = usage_record(
            session_id=caller.session.pk, turn=1, prompt_tokens=100, completion_tokens=20
        )
        second = usage_record(
            session_id=caller.session.pk,
            turn=1,
            prompt_tokens=50,
            completion_tokens=-1,  # a server's nonsense counts nothing
            user_id=caller.user.pk,
        )
    usage_record(session_id=caller.session.pk, turn=2, prompt_tokens=7, completion_tokens=3)

    assert (first.requests, first.prompt_tokens, first.completion_tokens) == (1, 100, 20)
    assert (second.pk, second.requests, second.prompt_tokens) == (first.pk, 2, 150)
    assert (second.user_id, second.credits) == (caller.user.pk, 0)
    rows = TurnUsage.objects.filter(session=caller.session).order_by("turn")
    assert [
        (u.turn, u.user_id, u.requests, u.prompt_tokens, u.completion_tokens) for u in rows
    ] == [
        (1, caller.user.pk, 2, 150, 20),
        (2, caller.user.pk, 1, 7, 3),
    ]
    if returning:
        assert len(statements) == 2, statements


def test_a_free_request_s_tokens_cost_few_python_calls(transactional_db, settings):
    """Every step records its usage on the engine's one database thread (issue 15): the
    statement ran under a context manager that marks a transaction for rollback (there is
    none: a free turn's upsert is one statement), through Django's wrappers, and its row was
    made from keywords. 58 Python calls before, 39 after."""
    settings.GEOSENSE_AGENT = "openai"
    caller = make_caller("sam")
    usage_record(session_id=caller.session.pk, turn=1, prompt_tokens=1, completion_tokens=1)
    calls = python_calls_of(
        usage_record,
        session_id=caller.session.pk,
        turn=1,
        prompt_tokens=100,
        completion_tokens=20,
        user_id=caller.user.pk,
    )
    assert calls <= 45, calls


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_balance_that_cannot_start_a_turn_is_refused_in_a_sentence_and_nothing_is_stored(
    client, openai_agent, settings
):
    settings.GEOSENSE_CREDITS_PER_1K_TOKENS = 2.5
    caller = await sync_to_async(make_caller)("poor", credits=2)

    out = await say(client, caller)

    assert out.status == 402
    assert out.body == {
        "error": "your balance of 2 credits cannot start an answer: the assistant costs 2.5 "
        "credits per 1,000 tokens and an answer needs at least 3 on the balance"
    }
    assert openai_agent.requests == []
    assert not await sync_to_async(Message.objects.filter(session=caller.session).exists)()
    assert await usages(caller.session) == []


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_turn_whose_credits_run_out_stops_before_its_next_request(
    client, openai_agent, settings
):
    settings.GEOSENSE_CREDITS_PER_1K_TOKENS = 2
    caller = await sync_to_async(make_caller)("spender", credits=3, allow_backend_tools=True)
    openai_agent.usage = (1800, 200)  # 4 credits owed, 3 on the balance
    openai_agent.reply_tool_calls([("call_1", "list_classes", {})])

    out = await say(client, caller)

    assert len(openai_agent.requests) == 1
    assert out.of("error") == [{"message": CREDITS_RAN_OUT}]
    assert await usages(caller.session) == [(1, 1, 1800, 200, 3)]
    assert await sync_to_async(credit_balance)(user=caller.user) == 0
    roles = await sync_to_async(list)(
        Message.objects.filter(session=caller.session).values_list("role", "content")
    )
    assert roles[-1] == ("note", CREDITS_RAN_OUT)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_local_agent_is_free_whatever_the_price(client, settings):
    settings.GEOSENSE_AGENT = "local"
    settings.GEOSENSE_CREDITS_PER_1K_TOKENS = 5
    caller = await sync_to_async(make_caller)("local", credits=0)

    out = await say(client, caller, "what classes are there?")

    assert out.status == 200 and out.of("error") == []


def test_the_admin_shows_tokens_per_turn_per_session_and_per_user(transactional_db, settings):
    settings.GEOSENSE_AGENT = "openai"
    settings.GEOSENSE_CREDITS_PER_1K_TOKENS = 1
    caller = make_caller("ursula", credits=50)
    other = make_caller("victor", credits=50)
    usage_record(session_id=caller.session.pk, turn=1, prompt_tokens=1234, completion_tokens=56)
    usage_record(session_id=caller.session.pk, turn=2, prompt_tokens=2000, completion_tokens=44)
    usage_record(session_id=other.session.pk, turn=1, prompt_tokens=7, completion_tokens=3)
    get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    admin = Client()
    admin.login(username="root", password="pw")

    sessions = admin.get("/admin/chat/chatsession/").content.decode()
    session_page = admin.get(
        f"/admin/chat/chatsession/{caller.session.pk}/change/"
    ).content.decode()
    users = admin.get("/admin/chat/usermodelusage/").content.decode()

    for page in (sessions, users):
        assert '<td class="field-prompt_tokens">3234</td>' in page
        assert '<td class="field-completion_tokens">100</td>' in page
        assert '<td class="field-token_credits">5</td>' in page
        assert '<td class="field-prompt_tokens">7</td>' in page
    assert '<td class="field-turns">2</td>' in users
    assert "1234" in session_page and "2000" in session_page
    assert credit_balance(user=caller.user) == 45
    credit_set(user=caller.user, balance=0)
    assert admin.get("/admin/chat/turnusage/").status_code == 200


def test_whether_tokens_are_priced_is_read_from_the_settings_once(settings):
    """Asked by every step and every usage record, on the loop and the database thread: the
    price is kept, not read through Django's lazy settings each time (two Python calls a
    setting: 4 calls before, 2 now), and a setting changed is read again."""
    from chat import usage

    settings.GEOSENSE_AGENT = "openai"
    settings.GEOSENSE_CREDITS_PER_1K_TOKENS = 0
    assert not usage.tokens_priced()
    assert python_calls_of(usage.tokens_priced) == 2
    settings.GEOSENSE_CREDITS_PER_1K_TOKENS = 3
    assert usage.tokens_priced() and usage.turn_minimum_credits() == 3
    settings.GEOSENSE_AGENT = "local"
    assert not usage.tokens_priced()
